"""SPMD localization: a Shardy-partitioned program -> the per-device program.

Input: the entry function after the Shardy passes (`mlir_passes.run_shardy`:
propagation, explicit reshards, reshard-to-collectives) and inlining. Every value has a
global type and a sharding (`sdy.sharding` on function arguments/results and op results;
no annotation = replicated); resharding is explicit as `sdy.*` collectives.

Output: the same function on per-device types, run by every partition (SPMD), with
collectives as the ops shard_map bodies use (`all_reduce`, `all_gather`,
`reduce_scatter`, `all_to_all`, `collective_permute` with `replica_groups` /
`source_target_pairs` in partition ids) and `partition_id` where a device needs its own
position. `module.attrs["trn.spmd"]` (an `Spmd`) records the mesh and the global types
and shardings of the parameters and results for the runtime.

The sdy ops (hlo_passes/localize_sdy.py, one handler each):

    sdy op              becomes
    ------------------  -----------------------------------------------------------------
    all_gather          one all_gather per gathered dimension (groups over its axes)
    all_slice           dynamic_slice at this partition's offset (a constant table
                        indexed by partition_id)
    all_reduce          all_reduce; its combiner is the producer's: a reduce's body op
                        (add/max/min/mul/and/or; on bool, or/and are max/min), + after
                        dot_general / convolution
    reduce_scatter      one reduce_scatter (+) per scattered dimension
    all_to_all          one all_to_all per parameter (split = target dim, concat = source)
    collective_permute  collective_permute(s) moving each block to where it belongs
    sharding_constraint the operand (the reshards are already explicit)
    manual_computation  its body, inlined (shard_map: already per-device code)
    replicated_to_      unreduced (partial sums, JAX's `unreduced` axes): the value on
      unreduced         the devices at coordinate 0 of the axes, zeros elsewhere
    sharded_to_         unreduced: each block at its place in zeros of the whole extent;
      unreduced         an all_reduce of an unreduced value adds
    constant            constant: the local block of a sharded splat, a sharded
                        non-splat value sliced per device

Ops whose result depends on the global position of a sharded dimension (iota, slice,
pad, reverse, concatenate, dynamic_slice, sort, reduce_window, gather, scatter, a
convolution's spatial dims, a variadic reduce over a sharded dim, ...) are *replicated*
on those inputs: the operands are all-gathered, the op runs on global shapes, and each
device slices its block of the result. This is what a partitioner does when it has no
specialized rule (XLA's SPMD partitioner has halo exchanges for some of these);
`Spmd.notes` lists each such op.

Uneven shardings (a dimension that does not divide into its shards) are padded as XLA
pads them: ceil(d / n) per device, the padding masked where it would be summed up and
sliced off where values are gathered (hlo_passes/localize_pad.py, which also says why
the padding never leaves the program: the parameters and results keep the axes that
divide, `Spmd.arg_shardings` / `result_shardings` are those, `Spmd.notes` says so).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hlo_passes import inspect_sharding, ir
from hlo_passes.errors import VerifyError
from hlo_passes.localize_pad import PaddingOps
from hlo_passes.localize_sdy import SdyOps
from hlo_passes.sharding import (Mesh, ShardingError, TensorSharding, axes_after,
                                 axes_before, block_offsets, local_shape, padded_dims,
                                 parse_per_value, parse_sharding)

name = "localize"

# Reducer body op kinds -> the all_reduce combiner.
COMBINERS = ("add", "maximum", "minimum", "multiply", "and", "or")
# On bool, or / and are maximum / minimum (StableHLO orders false < true).
BOOL_COMBINERS = {"or": "maximum", "and": "minimum"}
# Ops that make partial sums along a sharded contracting dimension (mx_matmul: K).
SUMMING = ("dot_general", "convolution", "mx_matmul")
# Ops computed per device as they are on local shapes: elementwise maps, layout ops
# whose sharded dims pass through, dot_general, reduce (followed by sdy.all_reduce).
# The rules see global shapes (`g(value)`).
POSITIONAL = {
    "iota": lambda op, g: {op.attrs["iota_dimension"]},
    "slice": lambda op, g: {i for i, (s, e, st) in enumerate(zip(
        op.attrs["start_indices"], op.attrs["limit_indices"], op.attrs["strides"]))
        if (s, e, st) != (0, g(op.operands[0])[i], 1)},
    "pad": lambda op, g: {i for i, t in enumerate(zip(op.attrs["edge_padding_low"],
                          op.attrs["edge_padding_high"], op.attrs["interior_padding"]))
                          if any(t)},
    "reverse": lambda op, g: set(op.attrs["dimensions"]),
    "concatenate": lambda op, g: {op.attrs["dimension"]},
    "dynamic_slice": lambda op, g: {i for i, s in enumerate(op.attrs["slice_sizes"])
                                    if s != g(op.operands[0])[i]},
    "dynamic_update_slice": lambda op, g: {i for i, (a, b) in enumerate(zip(
        g(op.operands[0]), g(op.operands[1]))) if a != b},
    "sort": lambda op, g: {op.attrs["dimension"]},
    "reduce_window": lambda op, g: {i for i, w in enumerate(op.attrs["window_dimensions"])
                                    if (w, op.attrs["window_strides"][i],
                                        tuple(op.attrs["padding"][i])) != (1, 1, (0, 0))},
}
# Identity of each combiner: a reduce over a sharded dim may run per device only when
# its init is the identity (each device would otherwise add it once).
IDENTITY = {"add": lambda dt: 0, "or": lambda dt: False, "and": lambda dt: True,
            "multiply": lambda dt: 1,
            "maximum": lambda dt: -np.inf if ir.is_float(dt) else np.iinfo(ir.np_dtype(dt)).min,
            "minimum": lambda dt: np.inf if ir.is_float(dt) else np.iinfo(ir.np_dtype(dt)).max}
# Ops whose every sharded dimension is positional (no per-dimension rule yet).
WHOLE = frozenset({"gather", "scatter", "convolution", "select_and_scatter", "fft",
                   "rng_bit_generator", "custom_call", "cholesky", "triangular_solve",
                   "rng", "reduce_precision_window"})


@dataclass
class Spmd:
    """What the runtime needs to run the localized program on `num_partitions` devices."""
    mesh: Mesh | None
    num_partitions: int
    arg_types: list[ir.TensorType]                    # global
    result_types: list[ir.TensorType]                 # global
    arg_shardings: list[TensorSharding | None]
    result_shardings: list[TensorSharding | None]
    notes: list[str] = field(default_factory=list)


def run(module: ir.Module) -> bool:
    meshes = {n: axes for n, axes in module.attrs.get("sdy.meshes", {}).items()}
    n = int(module.attrs.get("mhlo.num_partitions", 1))
    fn = module.main
    if _gspmd(fn):
        raise VerifyError("this program uses GSPMD shardings (mhlo.sharding); trn "
                          "partitions with Shardy: keep jax_use_shardy_partitioner=True "
                          "(the default)")
    if n <= 1 or "trn.spmd" in module.attrs:
        return False
    mesh = _mesh(meshes, module.attrs.get("sdy.mesh_device_ids", {}), n)
    _Localizer(mesh, module, n).run(fn)
    return True


def _gspmd(fn: ir.Function) -> bool:
    return any("mhlo.sharding" in a and "sdy.sharding" not in a
               for a in (*fn.arg_attrs, *fn.result_attrs))


def _mesh(meshes: dict, device_ids: dict, n: int) -> Mesh | None:
    real = {k: v for k, v in meshes.items() if math.prod(s for _, s in v) > 1}
    if not real:
        return None
    if len(real) > 1:
        raise VerifyError(f"programs over several meshes are not supported ({sorted(real)})")
    (mname, axes), = real.items()
    mesh = Mesh(mname, tuple(axes), device_ids.get(mname))
    if mesh.size != n:
        raise VerifyError(f"mesh @{mname} has {mesh.size} devices but the program has "
                          f"{n} partitions")
    return mesh


class _Localizer(SdyOps, PaddingOps):
    """Walks the entry function once, rewriting each op to per-device types; the sdy
    ops are handled by `SdyOps` (hlo_passes/localize_sdy.py), padded blocks of uneven
    shardings with `PaddingOps` (hlo_passes/localize_pad.py)."""

    def __init__(self, mesh: Mesh | None, module: ir.Module, n: int):
        self.mesh, self.module, self.n = mesh, module, n
        self.shardings: dict[int, TensorSharding | None] = {}
        self.complete: set[int] = set()     # values already fully reduced
        self.summed: dict[int, frozenset] = {}   # all_reduce results: axes summed over
        self.producer: dict[int, ir.Op] = {}
        self.global_shape: dict[int, tuple[int, ...]] = {}
        self.whole: dict[int, ir.Value] = {}   # local value -> the global value it slices
        self.ops: list[ir.Op] = []
        self.mapping: dict[ir.Value, ir.Value] = {}
        self.notes: list[str] = []

    # --- entry ------------------------------------------------------------------------

    def run(self, fn: ir.Function) -> None:
        arg_sh = [self._parse(a.get("sdy.sharding")) for a in _attrs(fn.arg_attrs, fn.args)]
        res_sh = [self._parse(a.get("sdy.sharding"))
                  for a in _attrs(fn.result_attrs, fn.result_types)]
        arg_out = self._boundary([a.type for a in fn.args], arg_sh)
        res_out = self._boundary(fn.result_types, res_sh)
        spmd = Spmd(self.mesh, self.n, [a.type for a in fn.args], list(fn.result_types),
                    arg_out, res_out)
        for a, s in zip(fn.args, arg_out):
            self._localize_value(a, s)
        self._block(fn.body, lambda: self._enter(fn.args, arg_sh, arg_out))
        self._exit(fn, res_sh, res_out)
        ret = fn.body.terminator
        fn.result_types = [self._local_type(t, s) for t, s in zip(fn.result_types, res_out)]
        for v, t in zip(ret.operands, fn.result_types):
            if v.type != t:
                raise VerifyError(f"result of per-device type {v.type} where the result "
                                  f"sharding gives {t}")
        spmd.notes = self.notes
        self.module.attrs["trn.spmd"] = spmd

    def _parse(self, text):
        return self._ours(parse_sharding(text) if text else None)

    def _ours(self, s: TensorSharding | None) -> TensorSharding | None:
        """`s` if it is over this program's mesh (else the value is replicated)."""
        return s if self.mesh and s is not None and s.mesh == self.mesh.name else None

    def _local_type(self, t: ir.TensorType, s: TensorSharding | None) -> ir.TensorType:
        try:
            return ir.TensorType(local_shape(t.shape, s, self.mesh), t.dtype)
        except ShardingError as e:
            raise VerifyError(f"cannot shard {t}: {e}") from None

    def _localize_value(self, v: ir.Value, s: TensorSharding | None) -> None:
        self.shardings[id(v)] = s
        self.global_shape[id(v)] = v.shape
        if v.type != ir.TOKEN:
            v.type = self._local_type(v.type, s)

    # --- blocks -----------------------------------------------------------------------

    def _block(self, block: ir.Block, prologue=None) -> None:
        outer, self.ops = self.ops, []
        if prologue is not None:
            prologue()
        for op in block.ops:
            op.operands = [self.mapping.get(v, v) for v in op.operands]
            self._op(op)
        block.ops, self.ops = self.ops, outer

    def _emit(self, op: ir.Op) -> ir.Op:
        self.ops.append(op)
        for r in op.results:
            self.producer[id(r)] = op
        return op

    def _op(self, op: ir.Op) -> None:
        _remap_nested(op, self.mapping)
        kind = op.kind
        handler = getattr(self, "_sdy_" + kind[4:], None) if kind.startswith("sdy.") else None
        if handler is not None:
            return handler(op)
        if kind.startswith("sdy.") and kind not in ("sdy.return",):
            raise VerifyError(f"{kind} is not supported by the SPMD localization "
                              f"({op.describe()})")
        if kind == "custom_call" and op.attrs.get("call_target_name") == inspect_sharding.TARGET:
            return self._inspect_sharding(op)
        shardings = parse_per_value(op.attrs.pop("sdy.sharding", None)) or [None] * len(op.results)
        shardings = [self._ours(s) for s in shardings]
        if op.kind in ("while", "case"):
            return self._control(op, shardings)
        if self._positional(op, shardings) or self._moves_padding(op, shardings):
            return self._replicated(op, shardings)
        zero_on = self._unreduced_from_replicated(op, shardings)
        for r, s in zip(op.results, shardings):
            self._localize_value(r, s)
        self._local_attrs(op)
        self._mask_inputs(op)
        self._emit(op)
        for r, axes in zip(op.results, zero_on):
            if axes:
                self.mapping[r] = self._first_only(r, axes, op)

    def _inspect_sharding(self, op: ir.Op) -> None:
        """jax.debug.inspect_array_sharding: the callback gets the operand's sharding
        (hlo_passes/inspect_sharding.py); the op computes nothing and goes."""
        v = op.operands[0]
        inspect_sharding.call(op.attrs.get("backend_config"), self.shardings.get(id(v)),
                              self.mesh, len(self.global_shape.get(id(v), v.shape)))
        for r in op.results:
            self.mapping[r] = v

    def _local_attrs(self, op: ir.Op) -> None:
        """Sizes in attributes made per-device: the sharded dims a slice or dynamic_slice
        keeps whole (the sliced ones made the op positional)."""
        if op.kind == "dynamic_slice":
            op.attrs["slice_sizes"] = tuple(op.result.shape)
        elif op.kind == "slice":
            s = self.shardings.get(id(op.operands[0]))
            if s is not None and not s.is_replicated:
                op.attrs["limit_indices"] = tuple(
                        n if axes else limit for n, axes, limit in
                        zip(op.operands[0].shape, s.dims, op.attrs["limit_indices"]))

    # --- position-dependent ops -------------------------------------------------------

    def _positional(self, op: ir.Op, shardings) -> bool:
        """Does `op` depend on where its sharded dims sit in the global tensor?"""
        vals = [*((v, self.shardings.get(id(v))) for v in op.operands),
                *zip(op.results, shardings)]
        sharded = [s for _, s in vals if s is not None and not s.is_replicated]
        if not sharded:
            return False
        if op.kind in WHOLE:
            return True
        if op.kind == "host_callback":     # one device calling for all sees whole arrays
            return op.attrs.get("device") is not None
        if op.kind == "reduce":
            s = self.shardings.get(id(op.operands[0]))
            if s is None or not any(s.dims[d] for d in op.attrs["dimensions"]):
                return False
            return len(op.results) > 1 or not self._identity_init(op)
        rule = POSITIONAL.get(op.kind)
        if rule is None:
            return False
        dims = rule(op, lambda v: self.global_shape.get(id(v), v.shape))
        return any(s.dims[d] for s in sharded for d in dims if d < len(s.dims))

    def _identity_init(self, op: ir.Op) -> bool:
        body = [o for o in op.regions[0].block.ops[:-1]]
        init = self.producer.get(id(op.operands[1]))
        if len(body) != 1 or body[0].kind not in IDENTITY or init is None:
            return False
        if init.kind != "constant":
            return False
        value = np.asarray(init.attrs["value"])
        return bool(value.size == 1 and value.reshape(()) == IDENTITY[body[0].kind](
                op.operands[1].dtype))

    def _replicated(self, op: ir.Op, shardings) -> None:
        """All-gather the operands, run `op` on global shapes, slice each result."""
        op.operands = [self._gather_all(v) for v in op.operands]
        results = []
        for r, s in zip(op.results, shardings):
            self.shardings[id(r)] = None
            self.complete.add(id(r))
            results.append(r)
        self.notes.append(f"{op.describe()}: replicated (sharded inputs all-gathered, "
                          "result sliced per device)")
        self._emit(op)
        for r, s in zip(results, shardings):
            if s is not None and not s.is_replicated:
                local = self._slice_to(r, s)
                self.mapping[r] = local
                self.complete.add(id(local))
                self.whole[id(local)] = r
            if s is not None and s.unreduced:    # the whole value, counted once
                u = self._first_only(self.mapping.get(r, r), tuple(s.unreduced), op)
                self.shardings[id(u)] = s
                self.mapping[r] = u

    def _gather_all(self, v: ir.Value) -> ir.Value:
        s = self.shardings.get(id(v))
        if s is None or s.is_replicated:
            return v
        if id(v) in self.whole:
            return self.whole[id(v)]
        for d, axes in enumerate(s.dims):
            if axes:
                v = self._gather_dim(v, d, self.producer.get(id(v)))
        return v

    # --- collectives ------------------------------------------------------------------

    def _groups(self, axes) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(g) for g in self.mesh.groups(tuple(axes)))

    def _new(self, kind, operands, types, attrs=None, regions=None, like=None) -> ir.Op:
        op = ir.Op(kind, operands, [ir.Value(t) for t in types], attrs or {}, regions or [],
                   loc=like.loc if like else "", name=like.name if like else "")
        return self._emit(op)

    def _all_gather(self, v: ir.Value, dim: int, axes, like) -> ir.Value:
        n = math.prod(self.mesh.axis_size(a) for a in axes)
        shape = list(v.shape)
        shape[dim] *= n
        op = self._new("all_gather", [v], [ir.TensorType(tuple(shape), v.dtype)],
                       {"all_gather_dim": dim, "replica_groups": self._groups(axes),
                        "use_global_device_ids": True}, like=like)
        s = self.shardings.get(id(v))
        if s is not None:
            dims = list(s.dims)
            kept = axes_before(self.mesh, dims[dim], tuple(axes))
            if kept is None:
                raise VerifyError(f"all_gather of {[str(a) for a in axes]} on dimension "
                                  f"{dim} of a tensor sharded {s}: only the minor axes of "
                                  "a dimension can be gathered")
            dims[dim] = kept
            s = TensorSharding(s.mesh, tuple(dims))
        return self._track(op.result, s, self._global(v))

    def _slice_to(self, v: ir.Value, target: TensorSharding, like=None) -> ir.Value:
        """This partition's block of `v` (replicated, or sharded on a prefix of
        `target`'s axes per dim) under `target`. A dim whose target blocks are padded is
        gathered whole first (unless replicated) and padded with zeros to a whole number
        of blocks, so that every device cuts its block at the same size."""
        g, extra = self._global(v), self._extra_axes(v, target)
        if not any(extra):
            return v
        out_shape = local_shape(g, target, self.mesh)
        prod = self.producer.get(id(v))
        if prod is not None and prod.kind == "broadcast_in_dim" and not prod.operands[0].shape:
            # A broadcast scalar: every block is the same; broadcast locally instead.
            op = self._new("broadcast_in_dim", [prod.operands[0]],
                           [ir.TensorType(out_shape, v.dtype)],
                           {"broadcast_dimensions": ()}, like=prod)
            return self._track(op.result, target, g)
        v = self._padded_whole(v, target, extra, like)
        rel = TensorSharding(target.mesh, tuple(self._extra_axes(v, target)))
        table = block_offsets(v.shape, rel, self.mesh)
        starts = self._offsets(table, like)
        op = self._new("dynamic_slice", [v, *starts], [ir.TensorType(out_shape, v.dtype)],
                       {"slice_sizes": out_shape}, like=like)
        return self._track(op.result, target, g)

    def _extra_axes(self, v: ir.Value, target: TensorSharding) -> list[tuple]:
        """Per dim, the axes `target` adds to `v`'s sharding (which must be a prefix)."""
        src = self.shardings.get(id(v))
        src_dims = src.dims if src is not None else ((),) * len(v.shape)
        extra = []
        for have, want in zip(src_dims, target.dims):
            more = axes_after(self.mesh, want, have)
            if more is None:
                raise VerifyError(f"cannot slice a tensor sharded {src} to {target}")
            extra.append(more)
        return extra

    def _offsets(self, table: np.ndarray, like) -> list[ir.Value]:
        """Scalar int32 values: row `partition_id` of the [partitions, rank] table."""
        rank = table.shape[1]
        if not table.any():
            zero = self._const(np.zeros((), np.int32), like)
            return [zero] * rank
        pid = self._partition_id(like)
        tab = self._const(table, like)
        zero = self._const(np.zeros((), np.int32), like)
        row = self._new("dynamic_slice", [tab, pid, zero],
                        [ir.TensorType((1, rank), "int32")], {"slice_sizes": (1, rank)},
                        like=like).result
        out = []
        for d in range(rank):
            col = self._new("slice", [row], [ir.TensorType((1, 1), "int32")],
                            {"start_indices": (0, d), "limit_indices": (1, d + 1),
                             "strides": (1, 1)}, like=like).result
            out.append(self._new("reshape", [col], [ir.TensorType((), "int32")],
                                 like=like).result)
        return out

    def _partition_id(self, like) -> ir.Value:
        pid = self._new("partition_id", [], [ir.TensorType((), "uint32")], like=like).result
        return self._new("convert", [pid], [ir.TensorType((), "int32")], like=like).result

    def _const(self, value: np.ndarray, like) -> ir.Value:
        t = ir.TensorType(tuple(value.shape), str(value.dtype))
        return self._new("constant", [], [t], {"value": value}, like=like).result

    def _reducer(self, kind: str, dtype: str) -> ir.Region:
        """The one-op combiner body; on bool, or/and are written maximum/minimum
        (false < true), the combiners collectives compute."""
        kind = BOOL_COMBINERS.get(kind, kind) if dtype == "bool" else kind
        a, b = ir.Value(ir.TensorType((), dtype)), ir.Value(ir.TensorType((), dtype))
        r = ir.Value(ir.TensorType((), dtype))
        body = ir.Block([a, b], [ir.Op(kind, [a, b], [r]), ir.Op("return", [r], [])])
        return ir.Region([body])

    def _combiner(self, v: ir.Value, op: ir.Op) -> str | None:
        """How the partial values of `v` combine; None when `v` is already complete."""
        if id(v) in self.complete:
            return None
        s = self.shardings.get(id(v))
        if s is not None and s.unreduced:       # partial sums (JAX's unreduced axes)
            return "add"
        prod = self.producer.get(id(v))
        if prod is not None and prod.kind in SUMMING:
            return "add"
        if prod is not None and prod.kind == "reduce" and len(prod.results) == 1:
            body = prod.regions[0].block
            inner = [o for o in body.ops[:-1]]
            if len(inner) == 1 and inner[0].kind in COMBINERS:
                return inner[0].kind
        raise VerifyError(f"cannot tell how to combine the partial results of "
                          f"{prod.describe() if prod else 'an argument'} for "
                          f"{op.describe()}")

    # --- control flow -------------------------------------------------------------------

    def _control(self, op: ir.Op, shardings) -> None:
        for r, s in zip(op.results, shardings):
            self._localize_value(r, s)
        for region in op.regions:
            for block in region.blocks:
                for a, s in zip(block.args, shardings if op.kind == "while" else []):
                    self._localize_value(a, s)
                self._block(block)
        self._emit(op)


def _attrs(attrs: list[dict], values) -> list[dict]:
    return attrs if attrs else [{} for _ in values]


def _remap_nested(op: ir.Op, mapping: dict) -> None:
    """Uses of remapped outer values inside `op`'s regions (hoisted constants)."""
    if not mapping:
        return
    for region in op.regions:
        for block in region.blocks:
            for inner in ir.walk(block):
                if any(v in mapping for v in inner.operands):
                    inner.operands = [mapping.get(v, v) for v in inner.operands]
