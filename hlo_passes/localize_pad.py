"""Uneven shardings in the SPMD localization (passes/localize.py): padded blocks.

A dimension of size d sharded into n blocks that does not divide is localized as XLA's
SPMD partitioner does it: every device holds ceil(d / n) elements, the first blocks are
full, the block holding element d - 1 ends in padding and any later block is padding
only (d < n: size 1 over 4 leaves three devices with one padding element each).

Where the padding lives, and why: only inside the program. JAX 0.10.2 never hands a
plugin an uneven shard: `device_put`, `in_shardings` and `out_shardings` refuse a
sharding that does not divide (`IndivisibleError`, checked in jax/_src/sharding.py
`_common_shard_shape` for every NamedSharding); a parameter or result whose sharding
propagation chose one is given, by XLA's CPU backend, the longest prefix of the
dimension's axes that divides (often none), and JAX then builds its Array from the
shardings the executable reports (pxla.py `get_out_shardings_from_executable`;
reporting an uneven one would make JAX raise). So this localizer does the same
(`sharding.even_prefix`): the program's parameters and results have the even
sharding the executable reports (`Spmd.arg_shardings` / `result_shardings`), the
parameter is resliced to its padded sharding on entry and the result gathered back on
exit. Buffers, the runtime and the plugin never see padding.

Inside the program the padding's contents are whatever the ops compute from it (zeros
where a block is cut out of a replicated value: `_pad_dims` pads with zeros first), and
never leak into results:

    where                         what is done
    ----------------------------  ------------------------------------------------------
    reduce over a padded dim      operands masked with the init value (the identity)
    dot_general contracting over  both operands masked with zeros (garbage * garbage,
      a padded dim                  or 0 * inf, must not reach the sum)
    all-gather of a padded dim    gathered whole, then sliced to its size (`_gather_dim`);
                                  blocks of a coarser sharding are cut out of that
    replicated -> padded          padded with zeros to n * ceil(d / n), then sliced
    reduce_scatter onto a padded  the partial sums padded with zeros first; over a dim
      dim                           already sharded: all_reduce, then sliced
    all_to_all / permute / slice  gathered whole along the dims that change, then sliced
    reshape, broadcast_in_dim     run on global shapes (replicated) when they would move
      moving a padded dim           padding into data (`_moves_padding`)
    position-dependent ops        as before: replicated, which gathers (and so strips)
      (sort, roll, cumsum, ...)     the padding, and slices the result again
    a sub-axis ({"x":(1)2}: the   compared with whole axes as pieces of the axis
      part of x Shardy finds to     (sharding.axes_after / axes_before): {"x"} refines
      divide a dim) and its         it; padded blocks of {"x"} do not nest in its blocks,
      refinement {"x"}              so the dim is gathered whole first (`_padded_whole`)

Everything here runs only for padded values: programs whose shardings all divide get
exactly the ops they got before.
"""
from __future__ import annotations

import numpy as np

from hlo_passes import ir
from hlo_passes.sharding import (TensorSharding, axes_after, even_prefix, local_shape,
                                 padded_dims, shard_count, valid_counts)


class PaddingOps:
    """Mixin of `passes.localize._Localizer`: the helpers for padded blocks. Uses the
    localizer's tables (`shardings`, `global_shape`) and builders (`_new`, `_const`,
    `_offsets`, `_all_gather`, `_slice_to`)."""

    # --- what is padded ---------------------------------------------------------------

    def _global(self, v: ir.Value) -> tuple[int, ...]:
        return self.global_shape.get(id(v), v.shape)

    def _track(self, v: ir.Value, s: TensorSharding | None, shape) -> ir.Value:
        """Records the sharding and global shape of a value built here."""
        self.shardings[id(v)] = s
        self.global_shape[id(v)] = tuple(shape)
        return v

    def _padded(self, v: ir.Value, s: TensorSharding | None = None) -> list[int]:
        """Dims of `v` (under its sharding, or `s`) whose blocks carry padding."""
        s = self.shardings.get(id(v)) if s is None else s
        return padded_dims(self._global(v), s, self.mesh)

    # --- building blocks ---------------------------------------------------------------

    def _gather_dim(self, v: ir.Value, d: int, like) -> ir.Value:
        """`v` gathered whole along dim `d` (every axis it is sharded on there), the
        padding sliced off."""
        s = self.shardings.get(id(v))
        g = self._global(v)
        v = self._all_gather(v, d, s.dims[d], like)
        out = self.shardings.get(id(v))
        if v.shape[d] != g[d]:
            limit = tuple(g[d] if i == d else n for i, n in enumerate(v.shape))
            v = self._new("slice", [v], [ir.TensorType(limit, v.dtype)],
                          {"start_indices": (0,) * len(limit), "limit_indices": limit,
                           "strides": (1,) * len(limit)}, like=like).result
        return self._track(v, out, g)

    def _pad_dims(self, v: ir.Value, sizes: dict[int, int], like) -> ir.Value:
        """`v` (unsharded on the dims of `sizes`) padded with zeros up to those sizes."""
        s, g = self.shardings.get(id(v)), self._global(v)
        high = tuple(sizes.get(d, n) - n for d, n in enumerate(v.shape))
        shape = tuple(n + h for n, h in zip(v.shape, high))
        zero = self._const(np.zeros((), ir.np_dtype(v.dtype)), like)
        v = self._new("pad", [v, zero], [ir.TensorType(shape, v.dtype)],
                      {"edge_padding_low": (0,) * len(shape), "edge_padding_high": high,
                       "interior_padding": (0,) * len(shape)}, like=like).result
        return self._track(v, s, g)

    def _reshard(self, v: ir.Value, target: TensorSharding | None, like) -> ir.Value:
        """`v` under `target`, the slow, always-right way: each dim whose axes change
        other than by adding minor axes is gathered whole, then `_slice_to` cuts the
        target's blocks."""
        s = self.shardings.get(id(v))
        want = target.dims if target is not None else ((),) * len(v.shape)
        for d, axes in enumerate(want):
            have = s.dims[d] if s is not None else ()
            if have and axes_after(self.mesh, axes, have) is None:
                v = self._gather_dim(v, d, like)
                s = self.shardings.get(id(v))
        if target is None or target.is_replicated:
            return v
        return self._slice_to(v, target, like)

    def _padded_whole(self, v: ir.Value, target: TensorSharding, extra, like) -> ir.Value:
        """Before `_slice_to` cuts `target`'s blocks out of `v`: each dim the target
        pads (and adds axes to) gathered whole and padded with zeros to a whole number
        of blocks."""
        g = self._global(v)
        padded = [d for d in padded_dims(g, target, self.mesh) if extra[d]]
        if not padded:
            return v
        for d in padded:
            s = self.shardings.get(id(v))
            if s is not None and s.dims[d]:
                v = self._gather_dim(v, d, like)
        local = local_shape(g, target, self.mesh)
        return self._pad_dims(v, {d: local[d] * shard_count(self.mesh, target.dims[d])
                                  for d in padded}, like)

    # --- masks ----------------------------------------------------------------------------

    def _valid(self, v: ir.Value, dims: list[int], like) -> ir.Value:
        """bool[local shape]: true where `v`'s block holds data along `dims`."""
        s = self.shardings.get(id(v))
        counts = self._offsets(valid_counts(self._global(v), s, self.mesh), like)
        mask = None
        for d in dims:
            index = self._new("iota", [], [ir.TensorType(v.shape, "int32")],
                              {"iota_dimension": d}, like=like).result
            count = self._new("broadcast_in_dim", [counts[d]],
                              [ir.TensorType(v.shape, "int32")],
                              {"broadcast_dimensions": ()}, like=like).result
            inside = self._new("compare", [index, count], [ir.TensorType(v.shape, "bool")],
                               {"comparison_direction": "LT", "compare_type": "SIGNED"},
                               like=like).result
            mask = inside if mask is None else self._new(
                    "and", [mask, inside], [inside.type], like=like).result
        return mask

    def _masked(self, v: ir.Value, dims: list[int], fill: ir.Value, like) -> ir.Value:
        """`v` with its padding along `dims` replaced by the scalar `fill`."""
        fills = self._new("broadcast_in_dim", [fill], [v.type], {"broadcast_dimensions": ()},
                          like=like).result
        out = self._new("select", [self._valid(v, dims, like), v, fills], [v.type],
                        like=like).result
        return self._track(out, self.shardings.get(id(v)), self._global(v))

    def _mask_inputs(self, op: ir.Op) -> None:
        """Padding out of what `op` sums up: a reduce's inputs (its inits are the
        identity, else it was replicated) and a dot_general's contracting dims."""
        if op.kind == "reduce":
            n = len(op.operands) // 2
            dims = [d for d in self._padded(op.operands[0]) if d in op.attrs["dimensions"]]
            if dims:
                op.operands = [self._masked(x, dims, init, op) for x, init in
                               zip(op.operands[:n], op.operands[n:])] + op.operands[n:]
        elif op.kind == "dot_general":
            self._mask_contracting(op)

    def _mask_contracting(self, op: ir.Op) -> None:
        dims = (op.attrs["lhs_contracting_dimensions"], op.attrs["rhs_contracting_dimensions"])
        out = []
        for x, contracting in zip(op.operands, dims):
            hit = [d for d in self._padded(x) if d in contracting]
            zero = self._const(np.zeros((), ir.np_dtype(x.dtype)), op) if hit else None
            out.append(self._masked(x, hit, zero, op) if hit else x)
        op.operands = out

    # --- ops that would move padding into data ----------------------------------------

    def _moves_padding(self, op: ir.Op, shardings) -> bool:
        """A reshape or broadcast_in_dim that is wrong on padded blocks: a reshape that
        does more than add or drop unsharded unit dims around padded ones, a broadcast
        that stretches a padded dim."""
        x = op.operands[0] if op.operands else None
        if op.kind not in ("reshape", "broadcast_in_dim") or x is None:
            return False
        s_in, s_out = self.shardings.get(id(x)), shardings[0]
        g_in, g_out = self._global(x), op.result.shape
        if not (padded_dims(g_in, s_in, self.mesh) or padded_dims(g_out, s_out, self.mesh)):
            return False
        if op.kind == "broadcast_in_dim":
            return any(g_in[i] != g_out[d] for i, d in enumerate(op.attrs["broadcast_dimensions"])
                       if i in padded_dims(g_in, s_in, self.mesh))
        core_in, core_out = _core(g_in, s_in), _core(g_out, s_out)
        return core_in is None or core_in != core_out

    # --- the program's boundary -------------------------------------------------------

    def _boundary(self, types, shardings) -> list[TensorSharding | None]:
        """The shardings the executable reports: each cut to what divides evenly."""
        out = []
        for t, s in zip(types, shardings):
            even = even_prefix(t.shape, s, self.mesh)
            if even is not s:
                self.notes.append(f"{t} sharded {s}: does not divide, passed as {even}")
            out.append(even)
        return out

    def _enter(self, args: list[ir.Value], inner: list, boundary: list) -> None:
        """Parameters passed under an even sharding, resliced to their padded one."""
        for a, want, have in zip(args, inner, boundary):
            if want is not have:
                self.mapping[a] = self._reshard(a, want, None)

    def _exit(self, fn: ir.Function, inner: list, boundary: list) -> None:
        """Results gathered to the even sharding the executable reports."""
        ret = fn.body.ops.pop()
        outer, self.ops = self.ops, fn.body.ops
        ret.operands = [v if have is want else self._reshard(v, want, ret)
                        for v, have, want in zip(ret.operands, inner, boundary)]
        fn.body.ops.append(ret)
        self.ops = outer


def _core(shape, s: TensorSharding | None) -> tuple | None:
    """The non-unit dims with their axes; None if a unit dim is sharded."""
    dims = s.dims if s is not None else ((),) * len(shape)
    if any(n == 1 and axes for n, axes in zip(shape, dims)):
        return None
    return tuple((n, axes) for n, axes in zip(shape, dims) if n != 1)
