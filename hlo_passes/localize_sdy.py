"""The `sdy` ops of a Shardy-partitioned program, localized (passes/localize.py).

`SdyOps` is a mixin of the localizer (`passes.localize._Localizer`): one `_sdy_<op>`
method per `sdy` op, each replacing the op's result (through `self.mapping`) by
per-device code built with the localizer's collective helpers (`_all_gather`,
`_slice_to`, `_new`, `_combiner`, ...) and keeping its value tables (`shardings`,
`complete`) up to date. What each op becomes is tabled in localize.py's docstring.
"""
from __future__ import annotations

import math

import numpy as np

from hlo_passes import ir
from hlo_passes.errors import VerifyError
from hlo_passes.sharding import (TensorSharding, block_offsets, join_axes,
                                 parse_all_to_all_params,
                                 parse_axes, parse_axis_list, parse_axis_lists,
                                 parse_per_value)


class SdyOps:
    """`_sdy_<op>(op)` handlers; `_Localizer._op` dispatches `sdy.<op>` to them."""

    def _replace(self, op: ir.Op, new: ir.Value) -> None:
        self.mapping[op.result] = new

    def _out(self, op: ir.Op) -> TensorSharding | None:
        return self._parse(op.attrs.get("out_sharding"))

    def _sdy_constant(self, op: ir.Op) -> None:
        """A constant with a sharding of its own (Shardy gives constants the sharding
        of their users, e.g. chlo.erf_inv's coefficient tensors next to an
        Explicit-axis operand): a splat becomes the local constant, any other value
        the global constant sliced per device."""
        shardings = parse_per_value(op.attrs.get("sdy.sharding")) or [None]
        s = self._ours(shardings[0])
        value = np.asarray(op.attrs["value"]).astype(ir.np_dtype(op.result.dtype))
        value = np.broadcast_to(value, op.result.shape)
        op.kind, op.attrs = "constant", {"value": value.copy()}
        if s is not None and not s.is_replicated and _splat(value):
            op.attrs["value"] = np.full(self._local_type(op.result.type, s).shape,
                                        value.reshape(-1)[0], value.dtype)
        elif s is not None and not s.is_replicated:
            return self._replicated(op, [s])
        self._localize_value(op.result, s)
        self._emit(op)
        if s is not None and s.unreduced:          # a partial sum: the value once
            self.mapping[op.result] = self._first_only(op.result, s.unreduced, op)

    def _sdy_sharding_constraint(self, op: ir.Op) -> None:
        x = op.operands[0]
        want = self._parse(op.attrs.get("sharding"))
        if self._local_type(ir.TensorType(op.result.shape, x.dtype), want) != x.type:
            raise VerifyError(f"sharding constraint {want} left without its reshard "
                              f"({op.describe()})")
        self._replace(op, x)

    def _sdy_all_gather(self, op: ir.Op) -> None:
        v = op.operands[0]
        if self._padded(v) or self._padded(op.result, self._out(op)):
            return self._settle(op, self._reshard(v, self._out(op), op))
        lists = parse_axis_lists(op.attrs["gathering_axes"])
        for d, axes in enumerate(lists):
            if axes:
                v = self._all_gather(v, d, axes, op)
        self._settle(op, v)

    def _sdy_all_slice(self, op: ir.Op) -> None:
        self._settle(op, self._slice_to(op.operands[0], self._out(op)
                                        or _replicated_like(op.result), op))

    def _sdy_all_reduce(self, op: ir.Op) -> None:
        """An all_reduce with the partial values' combiner. Of an unreduced value it
        leaves a complete one when no unreduced axis remains. Shardy may reduce a value
        again over axes it was just reduced over: that all_reduce is the value
        (`summed`: the axes an all_reduce result was summed over)."""
        v = op.operands[0]
        axes = parse_axis_list(op.attrs["reduction_axes"])
        done = self.summed.get(id(v), frozenset())
        kind = None if {a.name for a in axes} <= done else self._combiner(v, op)
        if kind is not None:
            s = self.shardings.get(id(v))
            r = self._new("all_reduce", [v], [v.type],
                          {"replica_groups": self._groups(axes),
                           "use_global_device_ids": True},
                          [self._reducer(kind, v.dtype)], like=op).result
            v = self._track(r, s, self._global(v))
            self.summed[id(v)] = done | {a.name for a in axes}
            want = self._out(op)
            if s is not None and s.unreduced and not (want and want.unreduced):
                self.complete.add(id(v))
        self._settle(op, v)

    def _sdy_reduce_scatter(self, op: ir.Op) -> None:
        v = op.operands[0]
        kind = self._combiner(v, op) or "add"
        if self._padded(op.result, self._out(op)) and id(v) not in self.complete:
            return self._settle(op, self._reduce_scatter_padded(v, kind, op))
        for d, axes in enumerate(parse_axis_lists(op.attrs["reduce_scatter_axes"])):
            if not axes:
                continue
            n = math.prod(self.mesh.axis_size(a) for a in axes)
            shape = list(v.shape)
            shape[d] //= n
            if id(v) in self.complete:
                s = self.shardings.get(id(v))
                dims = list(s.dims if s else ((),) * len(shape))
                dims[d] = join_axes(self.mesh, dims[d], tuple(axes))
                v = self._slice_to(v, TensorSharding(self.mesh.name, tuple(dims)), op)
                continue
            r = self._new("reduce_scatter", [v], [ir.TensorType(tuple(shape), v.dtype)],
                          {"scatter_dimension": d, "replica_groups": self._groups(axes),
                           "use_global_device_ids": True},
                          [self._reducer(kind, v.dtype)], like=op).result
            v = r
        self._settle(op, v)

    def _sdy_all_to_all(self, op: ir.Op) -> None:
        v = op.operands[0]
        if self._padded(v) or self._padded(op.result, self._out(op)):
            return self._settle(op, self._reshard(v, self._out(op), op))
        for p in parse_all_to_all_params(op.attrs["params"]):
            n = math.prod(self.mesh.axis_size(a) for a in p.axes)
            shape = list(v.shape)
            shape[p.src_dim] *= n
            shape[p.tgt_dim] //= n
            v = self._new("all_to_all", [v], [ir.TensorType(tuple(shape), v.dtype)],
                          {"split_dimension": p.tgt_dim, "concat_dimension": p.src_dim,
                           "split_count": n, "replica_groups": self._groups(p.axes)},
                          like=op).result
        self._settle(op, v)

    def _sdy_collective_permute(self, op: ir.Op) -> None:
        v = op.operands[0]
        src = self.shardings.get(id(v)) or _replicated_like(v)
        dst = self._out(op)
        if self._local_type(op.result.type, dst) != v.type:
            # blocks of other sizes (uneven shardings): no permutation moves them
            return self._settle(op, self._reshard(v, dst, op))
        parts = self.mesh.partitions()
        pairs = []
        for t in range(self.mesh.size):
            want = tuple(self.mesh.block_index(t, axes) for axes in dst.dims)
            cands = [s for s in range(self.mesh.size)
                     if tuple(self.mesh.block_index(s, axes) for axes in src.dims) == want]
            if not cands:
                raise VerifyError(f"no device holds the block device {parts[t]} needs "
                                  f"({op.describe()})")
            s = t if t in cands else cands[0]
            pairs.append((parts[s], parts[t]))
        rounds: list[list[tuple[int, int]]] = []
        for p in pairs:
            for r in rounds:
                if all(q[0] != p[0] for q in r):
                    r.append(p)
                    break
            else:
                rounds.append([p])
        out = None
        for r in rounds:
            moved = self._new("collective_permute", [v], [v.type],
                              {"source_target_pairs": tuple(r)}, like=op).result
            out = moved if out is None else self._new(
                    "add" if v.dtype != "bool" else "or", [out, moved], [v.type],
                    like=op).result
        self._settle(op, out)

    # --- unreduced values: partial sums, added up by a later all_reduce ------------------

    def _sdy_replicated_to_unreduced(self, op: ir.Op) -> None:
        """A complete value made unreduced over `axes`: the devices at coordinate 0 on
        those axes keep it, the others hold zeros (their sum is the value, as XLA does)."""
        v = op.operands[0]
        self._settle_partial(op, self._first_only(v, parse_axes(op.attrs["axes"]), op))

    def _sdy_sharded_to_unreduced(self, op: ir.Op) -> None:
        """A value sharded over `axes` made unreduced over them: each device's block at
        its place in zeros of the unsharded extent (the blocks sum to the whole)."""
        v = op.operands[0]
        out_t = self._local_type(op.result.type, self._out(op))
        lists = parse_axis_lists(op.attrs["axes"])
        rel = TensorSharding(self.mesh.name, tuple(tuple(a) for a in lists))
        starts = self._offsets(block_offsets(out_t.shape, rel, self.mesh), op)
        out = self._new("dynamic_update_slice", [self._zeros(out_t, op), v, *starts],
                        [out_t], like=op)
        self._settle_partial(op, out.result)

    def _unreduced_from_replicated(self, op: ir.Op, shardings) -> list[tuple]:
        """JAX's unreduced values are partial sums: an operand that does not vary along
        an unreduced axis of the result (replicated there) would be counted once per
        device. As XLA's partitioner does, such a value is kept on the devices at
        coordinate 0 of those axes only: the result, when no data operand varies
        along them (a broadcast constant made unreduced for a gradient); the operand,
        in an additive op mixing it with partial values (add, select, pad, ...).
        Returns, per result, the axes to keep on the first devices only."""
        out = []
        for s in shardings:
            unreduced = tuple(s.unreduced) if s is not None else ()
            data = _data_operands(op)
            missing = [self._replicated_along(op.operands[i], unreduced) for i in data]
            if unreduced and all(len(m) == len(unreduced) for m in missing):
                out.append(unreduced)
                continue
            out.append(())
            if unreduced and op.kind in ADDITIVE:
                for i, m in zip(data, missing):
                    if m:
                        op.operands[i] = self._first_only(op.operands[i], m, op)
        return out

    def _replicated_along(self, v: ir.Value, axes) -> tuple:
        s = self.shardings.get(id(v))
        varies = set() if s is None else (
                {a.name for d in s.dims for a in d} | {a.name for a in s.unreduced})
        return tuple(a for a in axes if a.name not in varies)

    def _first_only(self, v: ir.Value, axes, like: ir.Op) -> ir.Value:
        keep = np.zeros((self.mesh.size, 1), np.int32)
        for pos, pid in enumerate(self.mesh.partitions()):
            keep[pid, 0] = all(self.mesh.coordinate(pos, a) == 0 for a in axes)
        flag, = self._offsets(keep, like)
        zero = self._const(np.zeros((), np.int32), like)
        first = self._new("compare", [flag, zero], [ir.TensorType((), "bool")],
                          {"comparison_direction": "NE", "compare_type": "SIGNED"},
                          like=like).result
        pred = self._new("broadcast_in_dim", [first], [ir.TensorType(v.shape, "bool")],
                         {"broadcast_dimensions": ()}, like=like).result
        zeros = self._new("broadcast_in_dim", [self._const(np.zeros((), ir.np_dtype(
                v.dtype)), like)], [v.type], {"broadcast_dimensions": ()}, like=like).result
        out = self._new("select", [pred, v, zeros], [v.type], like=like).result
        return self._track(out, self.shardings.get(id(v)), self._global(v))

    def _as_unreduced(self, v: ir.Value, s: TensorSharding | None) -> ir.Value:
        """`v` where `s` wants it unreduced: a value that does not vary along those axes
        kept on the devices at coordinate 0 only (a shard_map body that sums its
        unreduced input would otherwise count it once per device)."""
        if s is None or not s.unreduced:
            return v
        axes = self._replicated_along(v, s.unreduced)
        return self._first_only(v, axes, None) if axes else v

    def _zeros(self, t: ir.TensorType, like: ir.Op) -> ir.Value:
        zero = self._const(np.zeros((), ir.np_dtype(t.dtype)), like)
        return self._new("broadcast_in_dim", [zero], [t], {"broadcast_dimensions": ()},
                         like=like).result

    def _settle_partial(self, op: ir.Op, v: ir.Value) -> None:
        """Like `_settle`, for a result that holds partial sums (never complete)."""
        want = self._out(op)
        if v.type != self._local_type(op.result.type, want):
            raise VerifyError(f"localized {op.kind} gives {v.type} ({op.describe()})")
        self._track(v, want, op.result.shape)
        self.complete.discard(id(v))
        self.mapping[op.result] = v

    def _sdy_manual_computation(self, op: ir.Op) -> None:
        """A shard_map body, inlined. Inside it values are per-device along the manual
        axes: an operand the body reads is seen with its sharding over the free axes
        only (none when every axis is manual) and with the body's shape as its global
        shape (what a padded free axis is cut from); its outer view is restored after
        the body; the results take the op's out_shardings."""
        body = op.regions[0].block
        ins = parse_per_value(op.attrs.get("in_shardings")) or []
        outs = parse_per_value(op.attrs.get("out_shardings")) or []
        manual = {a.name for a in parse_axes(op.attrs.get("manual_axes", ""))}
        outer: dict[int, tuple] = {}
        op.operands = [self._as_unreduced(v, self._ours(s)) for v, s in
                       zip(op.operands, ins + [None] * len(op.operands))]
        for arg, operand, s in zip(body.args, op.operands, ins + [None] * len(body.args)):
            free = _restrict(s, manual) if s and self.mesh else None
            inside = arg.shape
            self._localize_value(arg, free)
            if arg.type != operand.type:
                raise VerifyError(f"shard_map argument of per-device type {arg.type} "
                                  f"receives {operand.type} ({op.describe()})")
            outer.setdefault(id(operand), self._outer_view(operand))
            self.whole.pop(id(operand), None)
            self._track(operand, free, inside)
            self.mapping[arg] = operand
        for inner in body.ops[:-1]:
            inner.operands = [self.mapping.get(v, v) for v in inner.operands]
            self._op(inner)
        for key, (sharding, shape, whole) in outer.items():
            self.shardings[key], self.global_shape[key] = sharding, shape
            if whole is not None:
                self.whole[key] = whole
        ret = body.terminator
        for i, (r, v) in enumerate(zip(op.results, ret.operands)):
            v = self.mapping.get(v, v)
            if id(v) not in outer:
                self._track(v, self._ours(outs[i] if i < len(outs) else None), r.shape)
            self.mapping[r] = v

    def _outer_view(self, v: ir.Value) -> tuple:
        """What the localizer knows of `v` outside a shard_map body (its sharding,
        global shape and whole value), to restore after the body."""
        return self.shardings.get(id(v)), self._global(v), self.whole.get(id(v))

    def _reduce_scatter_padded(self, v: ir.Value, kind: str, op: ir.Op) -> ir.Value:
        """A reduce_scatter onto padded blocks: a dim not sharded yet is padded with
        zeros to whole blocks and reduce-scattered; otherwise the partial values are
        all-reduced over the op's axes and the blocks sliced out."""
        want = self._out(op)
        lists = parse_axis_lists(op.attrs["reduce_scatter_axes"])
        have = self.shardings.get(id(v))
        if len([a for a in lists if a]) != 1 or (have is not None and any(
                have.dims[d] for d, a in enumerate(lists) if a)):
            axes = tuple(a for d in lists for a in d)
            r = self._new("all_reduce", [v], [v.type],
                          {"replica_groups": self._groups(axes), "use_global_device_ids": True},
                          [self._reducer(kind, v.dtype)], like=op).result
            return self._slice_to(self._track(r, have, self._global(v)), want, op)
        (d, axes), = [(d, a) for d, a in enumerate(lists) if a]
        n = math.prod(self.mesh.axis_size(a) for a in axes)
        local = self._local_type(op.result.type, want).shape
        v = self._pad_dims(v, {d: local[d] * n}, op)
        return self._new("reduce_scatter", [v], [ir.TensorType(local, v.dtype)],
                         {"scatter_dimension": d, "replica_groups": self._groups(axes),
                          "use_global_device_ids": True},
                         [self._reducer(kind, v.dtype)], like=op).result

    def _settle(self, op: ir.Op, v: ir.Value) -> None:
        """`v` replaces the sdy op's result; checks it has the expected local type."""
        want = self._out(op)
        t = self._local_type(ir.TensorType(op.result.shape, op.result.dtype), want)
        if v.type != t:
            raise VerifyError(f"localized {op.kind} gives {v.type}, expected {t}")
        self._track(v, want, op.result.shape)
        if id(op.operands[0]) in self.complete:
            self.complete.add(id(v))
        self.mapping[op.result] = v


# Ops that add their data operands (or place them side by side): an unreduced result
# needs every data operand unreduced; data operand indices, all when not listed.
ADDITIVE = frozenset({"add", "subtract", "select", "concatenate", "pad",
                      "dynamic_update_slice", "scatter"})
_DATA = {"select": (1, 2), "pad": (0, 1), "dynamic_update_slice": (0, 1), "scatter": (0, 2),
         "dynamic_slice": (0,), "gather": (0,)}


def _data_operands(op: ir.Op) -> tuple[int, ...]:
    return _DATA.get(op.kind, tuple(range(len(op.operands))))


def _splat(value: np.ndarray) -> bool:
    """Every element the same (and at least one)."""
    flat = value.reshape(-1)
    return flat.size > 0 and bool((flat == flat[0]).all() or np.isnan(flat).all())


def _replicated_like(v: ir.Value) -> TensorSharding:
    return TensorSharding("", ((),) * len(v.shape))


def _restrict(s: TensorSharding, manual: set[str]) -> TensorSharding:
    """The part of `s` over the free (non-manual) axes."""
    return TensorSharding(s.mesh, tuple(tuple(a for a in d if a.name not in manual)
                                        for d in s.dims))
