"""Which ops may be removed or merged: side effects, conservatively."""
from __future__ import annotations

from hlo_passes.ir import Op, walk

# StableHLO ops with effects (I/O, communication, randomness with state).
SIDE_EFFECT_KINDS = frozenset({
        "after_all", "all_gather", "all_reduce", "all_to_all", "collective_broadcast",
        "collective_permute", "infeed", "outfeed", "recv", "reduce_scatter", "send",
        "rng", "optimization_barrier", "func.call", "host_callback",
})
# Ops of other dialects that are known to be pure.
PURE_FOREIGN_KINDS = frozenset({"sdy.sharding_constraint", "sdy.reshard", "trn.view"})
TERMINATORS = frozenset({"return", "func.return", "sdy.return"})


def has_side_effects(op: Op) -> bool:
    """True if `op` (or anything nested in it) must not be removed or merged."""
    if _own_effects(op):
        return True
    return any(_own_effects(inner) for region in op.regions
               for block in region.blocks for inner in walk(block))


def _own_effects(op: Op) -> bool:
    if op.kind in SIDE_EFFECT_KINDS:
        return True
    if op.kind == "custom_call":
        return bool(op.attrs.get("has_side_effect", False))
    if "." in op.kind:
        return op.kind not in PURE_FOREIGN_KINDS and op.kind not in TERMINATORS
    return False
