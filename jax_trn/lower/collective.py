"""Collectives: all_reduce, all_gather, reduce_scatter, all_to_all, collective_permute.

A collective is not a kernel: it becomes a `hw.program.Collective` step in the program's
step list (beside kernels, loops and conditionals), which the runtime executes across
the devices of the call (`jax_trn.runtime.spmd`) with the system topology's algorithm
(`jax_trn.hw.collectives`). Replica groups and permute pairs are kept as partition ids
(the SPMD programs of Shardy and shard_map use global device ids = partition ids).
The combiner of all_reduce / reduce_scatter is the op of its one-op body: add, maximum
or minimum (what the collective engine computes, §5); anything else is a compile error.
"""
from __future__ import annotations

from hlo_passes import ir
from jax_trn.hw.dtypes import DEVICE_TYPES
from jax_trn.hw.program import Collective, DramTensor

from .driver import StepCtx
from .errors import LoweringError
from .registry import register_step
from .registry import op_label as _label

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")
COMBINERS = ("add", "maximum", "minimum")


def _groups(op: ir.Op) -> tuple[tuple[int, ...], ...]:
    groups = op.attrs.get("replica_groups", ())
    out = tuple(tuple(int(d) for d in g if int(d) >= 0) for g in groups)
    return tuple(g for g in out if g)


def _combiner(op: ir.Op) -> str:
    body = op.regions[0].block if op.regions else None
    inner = [o for o in body.ops[:-1]] if body is not None else []
    if len(inner) != 1 or inner[0].kind not in COMBINERS:
        kinds = [o.kind for o in inner]
        raise LoweringError(f"the collective engine combines with add, maximum or minimum; "
                            f"this {op.kind} combines with {kinds} ({op.describe()})")
    return inner[0].kind


@register_step(*KINDS)
def lower_collective(ctx: StepCtx, op: ir.Op, claims: dict[int, DramTensor]) -> None:
    """A `Collective` step (not a kernel): the runtime runs it across the devices."""
    ins = [ctx.operand(v) for v in op.operands]
    outs = [ctx.result(r, claims) for r in op.results]
    a = op.attrs
    step = Collective(ctx.name(op.kind), op.kind, ins, outs, _groups(op), ops=[_label(op)])
    if op.kind in ("all_reduce", "reduce_scatter"):
        step.op = _combiner(op)
    if op.kind == "all_gather":
        step.dim = int(a["all_gather_dim"])
    elif op.kind == "reduce_scatter":
        step.dim = int(a["scatter_dimension"])
    elif op.kind == "all_to_all":
        step.split_dim, step.concat_dim = int(a["split_dimension"]), int(a["concat_dimension"])
    elif op.kind == "collective_permute":
        step.pairs = tuple((int(s), int(t)) for s, t in a["source_target_pairs"])
    for t in (*ins, *outs):
        if t.dtype not in DEVICE_TYPES:
            raise LoweringError(f"{t.dtype} in a collective ({op.describe()})")
    ctx.append(step)
