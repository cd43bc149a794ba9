"""MLIR-level passes, run on the deserialized module before import.

PJRT serializes with XLA's `Serialize(module, min(plugin, framework version))`. For
targets >= 1.11.0 (ours reports jaxlib's current version) that is *mixed* serialization:
StableHLO as VHLO plus `sdy` ops as they are, so Shardy ops arrive intact. Older targets
(and `jax._src.lib._jax.mlir.serialize_portable_artifact`) run the Shardy *round-trip
export* first: `sdy.mesh` ops, `sdy.sharding` attributes and `sdy.sharding_constraint`
ops become `mhlo.frontend_attributes = {xla.sdy.* = "..."}` strings and
`stablehlo.custom_call @Sharding`. We undo that here so that a later Shardy stage always
sees real `sdy` ops:

1. `xla-sdy-round-trip-import-shardy-attrs` (jaxlib registers it): frontend attributes
   -> `sdy.mesh` ops and `sdy.sharding` attributes.
2. `custom_call @Sharding {sdy.sharding}` -> `sdy.sharding_constraint` (in Python; the
   XLA pass that does this is not registered in jaxlib).
3. `chlo.top_k` -> `custom_call @trn.top_k` (backend_config: k in decimal), which the
   importer turns into a `top_k` op of our IR (jax_trn/lower/topk.py lowers it with
   max8 / find_index8 / match_replace8), for the operand types and lengths that rule
   takes (`TOP_K_TYPES`, last axis <= `TOP_K_MAX_LEN`, k <= `TOP_K_MAX_K`) in
   single-device programs (Shardy and localization have no rule for our custom_call,
   so multi-device programs keep the sort). Every other top_k is
   legalized below into a sort + slice, as before. JAX serializes lax.top_k as
   `stablehlo.composite "chlo.top_k"` (composite_attributes {k}) whose decomposition
   is that sort + slice; such composites are replaced the same way (the decomposition
   function is left unused), the others are inlined as before (passes/inline_calls.py).
   `lax.approx_max_k` (`custom_call @ApproxTopK`, the fallback form JAX emits off TPU:
   aggregate_to_topk, along the last axis of an iota-indexed operand, GT comparator)
   becomes the same exact top_k: a valid result for any recall target; among equal
   values, NaN and -0 it follows lax.top_k's order (approx_max_k promises none).
4. `chlo-legalize-to-stablehlo` for programs given as text with chlo ops.
5. Shardy, for programs over a mesh of more than one device (`_partitioned`):
   composites become calls of their decomposition first
   (`stablehlo-legalize-composite-to-call`: Shardy would shard a composite's results
   without looking into its body, which inline-calls later puts in place with no
   shardings), then `sdy-propagation-pipeline`, then per function
   `sdy-insert-explicit-reshards{enable-full-version=true}` and
   `sdy-reshard-to-collectives`. Afterwards every value's sharding is explicit and
   every reshard is an `sdy.*` collective; `passes/localize.py` turns that into the
   per-device program.

shard_map bodies (`call @xla.sdy.manual_computation_body` between
`custom_call @xla.sdy.GlobalToLocalShape/LocalToGlobalShape`) are left as they are: the
XLA pass that rebuilds `sdy.manual_computation` is not registered in jaxlib.

Not used: MLIR's `inline` pass is registered but inlines nothing here (jaxlib does not
register the func dialect's inliner interface), so calls are inlined on our IR
(passes/inline_calls.py). `canonicalize` is skipped: it may fold broadcasts into large
constants, and our own simplifier does the cheap, safe rewrites.
"""
from __future__ import annotations

from jaxlib.mlir import ir as mlir_ir
from jaxlib.mlir import passmanager
from jaxlib.mlir.dialects import sdy
from jaxlib.mlir.dialects import stablehlo as shlo

from hlo_passes.errors import HloImportError

SDY_IMPORT = "builtin.module(xla-sdy-round-trip-import-shardy-attrs)"
CHLO_LEGALIZE = "builtin.module(func.func(chlo-legalize-to-stablehlo))"
# XLA's Serialize runs this (greedy: it also folds and hoists constants to the entry of
# each function) on what it hands a plugin; programs not serialized by it get it here.
COMPATIBILITY_EXPANDER = "builtin.module(stablehlo-compatibility-expander{{target={}}})"
# Shardy gives a composite op shardings of its own but never looks into its
# decomposition; as calls, they are partitioned like the rest of the program.
COMPOSITES_TO_CALLS = "builtin.module(func.func(stablehlo-legalize-composite-to-call))"
SHARDY = ("builtin.module(sdy-propagation-pipeline,"
          "func.func(sdy-insert-explicit-reshards{enable-full-version=true}),"
          "func.func(sdy-reshard-to-collectives))")
# Programs with a custom_call carrying its own `sdy.sharding_rule` (jax_trn/jax_mx.py's
# mx_matmul) run it in two parts: the propagation pipeline drops such rules when it
# ends, and the explicit-reshards pass, finding none, partitioned the op along every
# factor (with K sharded: partial sums, never reduced). `_shardy_keeping_rules` puts the
# rules back in between, and drops them after the reshards (an all_reduce over a
# sharded reduction factor) are in.
SHARDY_PROPAGATE = "builtin.module(sdy-propagation-pipeline)"
SHARDY_RESHARDS = ("builtin.module(func.func(sdy-insert-explicit-reshards{enable-full-version=true}),"
                   "func.func(sdy-reshard-to-collectives),func.func(sdy-drop-sharding-rules))")
KEPT_RULE = "trn.sdy_sharding_rule"      # a custom_call's rule while Shardy propagates

_registered = False


def register_passes() -> None:
    """Registers the stablehlo passes (chlo legalization) once per process."""
    global _registered
    if not _registered:
        shlo.register_stablehlo_passes()
        _registered = True


def run_mlir_passes(module: mlir_ir.Module, *, as_serialized: bool = False) -> None:
    """Restores Shardy ops and legalizes chlo, in place. `as_serialized`: the module
    did not come through PJRT's serialization (plain bytecode or text, e.g. from
    `jax_trn.compare` / `estimate`), so chlo legalization runs whatever its dialects, as
    XLA's `Serialize` runs it, with the compatibility expander, on every program it
    hands a plugin: their greedy rewrite also hoists constants to the function's
    entry, and the same program must compile to the same kernels both ways."""
    register_passes()
    with module.context:
        if _has_sdy_round_trip_attrs(module):
            _run(module, SDY_IMPORT)
            sharding_custom_calls_to_constraints(module)
        if KEEP_TOP_K and not _multi_device(module):
            top_k_to_custom_calls(module)
        if as_serialized:
            _run(module, COMPATIBILITY_EXPANDER.format(shlo.get_current_version()))
        if as_serialized or _has_dialect(module, "chlo."):
            _run(module, CHLO_LEGALIZE)
        if _partitioned(module):
            _run(module, COMPOSITES_TO_CALLS)
            if _custom_rules(module):
                _shardy_keeping_rules(module)
            else:
                _run(module, SHARDY)


def _partitioned(module: mlir_ir.Module) -> bool:
    """A program for several partitions over a mesh of more than one device."""
    attrs = module.operation.attributes
    if "mhlo.num_partitions" not in attrs or mlir_ir.IntegerAttr(
            attrs["mhlo.num_partitions"]).value <= 1:
        return False
    for op in module.body.operations:
        if op.operation.name == "sdy.mesh":
            mesh = sdy.MeshAttr(op.operation.attributes["mesh"])
            if any(sdy.MeshAxisAttr(a).size > 1 for a in mesh.axes):
                return True
    return False


def _custom_rules(module: mlir_ir.Module, attr: str = "sdy.sharding_rule") -> list:
    """The custom_calls with a Shardy sharding rule of their own (in `attr`)."""
    found = []
    _walk(module.operation, lambda op: found.append(op) if (
        op.name == "stablehlo.custom_call" and attr in op.attributes) else None)
    return found


def _shardy_keeping_rules(module: mlir_ir.Module) -> None:
    """SHARDY, with the custom_calls' rules kept for the explicit reshards (the ops
    are looked up again after propagation, which may rebuild them)."""
    for op in _custom_rules(module):
        op.attributes[KEPT_RULE] = op.attributes["sdy.sharding_rule"]
    _run(module, SHARDY_PROPAGATE)
    for op in _custom_rules(module, KEPT_RULE):
        op.attributes["sdy.sharding_rule"] = op.attributes[KEPT_RULE]
        del op.attributes[KEPT_RULE]
    _run(module, SHARDY_RESHARDS)


def _multi_device(module: mlir_ir.Module) -> bool:
    """A program for more than one partition or replica (whatever its mesh)."""
    attrs = module.operation.attributes
    return any(name in attrs and mlir_ir.IntegerAttr(attrs[name]).value > 1
               for name in ("mhlo.num_partitions", "mhlo.num_replicas"))


def _run(module: mlir_ir.Module, pipeline: str) -> None:
    try:
        passmanager.PassManager.parse(pipeline).run(module.operation)
    except mlir_ir.MLIRError as e:
        raise HloImportError(f"MLIR pipeline {pipeline} failed: {e}") from e


def _has_sdy_round_trip_attrs(module: mlir_ir.Module) -> bool:
    """Round-trip export always records the meshes on the module."""
    attrs = module.operation.attributes
    if "mhlo.frontend_attributes" not in attrs:
        return False
    frontend = attrs["mhlo.frontend_attributes"]
    return any(frontend[i].name == "xla.sdy.meshes" for i in range(len(frontend)))


def _has_dialect(module: mlir_ir.Module, prefix: str) -> bool:
    found = []
    _walk(module.operation, lambda op: found.append(op) if op.name.startswith(prefix)
          else None)
    return bool(found)


def _walk(op: mlir_ir.Operation, fn) -> None:
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                fn(inner.operation)
                _walk(inner.operation, fn)


def sharding_custom_calls_to_constraints(module: mlir_ir.Module) -> int:
    """`custom_call @Sharding {sdy.sharding}` -> `sdy.sharding_constraint`; returns count."""
    calls = []
    _walk(module.operation, lambda op: calls.append(op) if _is_sharding_call(op) else None)
    for op in calls:
        sharding = sdy.TensorShardingPerValueAttr(op.attributes["sdy.sharding"])
        new = sdy.ShardingConstraintOp(op.operands[0], sharding.shardings[0],
                                       loc=op.location, ip=mlir_ir.InsertionPoint(op))
        op.results[0].replace_all_uses_with(new.result)
        op.erase()
    return len(calls)


def _is_sharding_call(op: mlir_ir.Operation) -> bool:
    return (op.name == "stablehlo.custom_call"
            and op.attributes["call_target_name"].value == "Sharding"
            and "sdy.sharding" in op.attributes
            and len(op.operands) == 1 and len(op.results) == 1)


# --- chlo.top_k kept as one op -------------------------------------------------------

KEEP_TOP_K = True                # False: every top_k a sort + slice (for comparisons)
TOP_K_TARGET = "trn.top_k"
TOP_K_TYPES = ("f32", "bf16", "f16", "i8", "i16", "i32", "ui8", "ui16", "ui32")
TOP_K_MAX_LEN = 8192             # three FP32 [128, N] tiles in SBUF (max8 reads <= 16K)
TOP_K_MAX_K = 64                 # the 32-bit keys' rank costs k passes over the line


def top_k_to_custom_calls(module: mlir_ir.Module) -> int:
    """`chlo.top_k` the trn rule takes -> `custom_call @trn.top_k`; returns count."""
    calls = []
    _walk(module.operation, lambda op: calls.append(op) if _keeps_top_k(op) else None)
    for op in calls:
        k = _top_k_k(op)
        new = shlo.CustomCallOp([r.type for r in op.results], [op.operands[0]],
                                TOP_K_TARGET, backend_config=mlir_ir.StringAttr.get(str(k)),
                                loc=op.location, ip=mlir_ir.InsertionPoint(op))
        for old, res in zip(op.results, new.results):
            old.replace_all_uses_with(res)
        op.erase()
    return len(calls)


def _top_k_k(op: mlir_ir.Operation) -> int | None:
    """k of a `chlo.top_k` op, a `chlo.top_k` composite or an approx_max_k custom_call
    that is an exact top_k; None for other ops."""
    if op.name == "chlo.top_k":
        return mlir_ir.IntegerAttr(op.attributes["k"]).value
    if op.name == "stablehlo.custom_call":
        return _approx_max_k(op)
    if (op.name == "stablehlo.composite" and "name" in op.attributes
            and mlir_ir.StringAttr(op.attributes["name"]).value == "chlo.top_k"
            and len(op.operands) == 1 and len(op.results) == 2):
        attrs = mlir_ir.DictAttr(op.attributes["composite_attributes"])
        return mlir_ir.IntegerAttr(attrs["k"]).value if "k" in attrs else None
    return None


def _approx_max_k(op: mlir_ir.Operation) -> int | None:
    if (op.attributes["call_target_name"].value != "ApproxTopK"
            or "mhlo.backend_config" not in op.attributes or len(op.operands) != 4
            or len(op.results) != 2):
        return None
    config = mlir_ir.DictAttr(op.attributes["mhlo.backend_config"])
    rank = mlir_ir.RankedTensorType(op.operands[0].type).rank

    def value(name):
        return config[name].value if name in config else None
    iota = op.operands[1].owner
    if (value("aggregate_to_topk") is not True or value("reduction_dim") != rank - 1
            or value("reduction_input_size_override") not in (None, -1)
            or value("top_k") is None or not isinstance(iota, mlir_ir.OpView)
            or iota.operation.name != "stablehlo.iota"
            or mlir_ir.IntegerAttr(iota.operation.attributes["iota_dimension"]).value
            != rank - 1 or _comparator(op) != "GT"):
        return None
    return value("top_k")


def _comparator(op: mlir_ir.Operation) -> str | None:
    """The direction of a one-compare comparator of (arg0, arg1), else None."""
    calls = op.attributes["called_computations"] if "called_computations" in \
        op.attributes else []
    if len(calls) != 1:
        return None
    name = mlir_ir.FlatSymbolRefAttr(calls[0]).value
    module = op
    while module.parent is not None:
        module = module.parent
    fns = [f for f in module.regions[0].blocks[0].operations
           if f.operation.name == "func.func" and f.operation.attributes["sym_name"].value == name]
    if len(fns) != 1:
        return None
    block = fns[0].operation.regions[0].blocks[0]
    ops = [o.operation for o in block.operations]
    if len(ops) != 2 or ops[0].name != "stablehlo.compare":
        return None
    args = list(block.arguments)
    if list(ops[0].operands) != args[:2] or list(ops[1].operands) != list(ops[0].results):
        return None
    return shlo.ComparisonDirectionAttr(ops[0].attributes["comparison_direction"]).value


def _keeps_top_k(op: mlir_ir.Operation) -> bool:
    k = _top_k_k(op)
    if k is None:
        return False
    t = mlir_ir.RankedTensorType(op.operands[0].type)
    return (t.has_static_shape and 1 <= k <= TOP_K_MAX_K and t.rank >= 1
            and 1 <= t.shape[-1] <= TOP_K_MAX_LEN
            and str(t.element_type) in TOP_K_TYPES)
