"""The `fusion` rule: one kernel per fusion op (hlo_passes/passes/fusion.py).

    loop             the region tiled like one elementwise op (elementwise.emit_loop):
                     each input read once, intermediates only in SBUF; immediate
                     scale/bias folded into ScalarE activations (folding.py)
    reduction        the reduce's tilings (reduce.py) with the region evaluated per box
                     as the reduce's source (input fusion), extra outputs stored per box
    matmul_epilogue  the matmul loop nest (dot.py / matmul.py) with the region applied
                     to each output tile as it leaves PSUM (epilogue.py)
    attention        softmax(mask(q @ k^T * scale)) @ v, flash-attention style, the
                     scores never leaving the chip (attention.py)
    attention_bwd    dq, dk, dv of that attention, flash-attention backward style
                     (attention_bwd.py)
    rows             reductions along the trailing axes with the ops that use them
                     (a LayerNorm, a softmax): P whole rows per tile in SBUF (rows.py)

The kernel's `ops` are the fused ops, the one doing the most work first
(`dominant_first`: the profiler names a kernel's source by its first op); its `notes`
the fusion kind, the pass's decisions and how the lowering applied them. A region this
lowering cannot emit raises `Unsupported` (translate.py); the driver then lowers its
ops one by one.
"""
from __future__ import annotations

from jax_trn.hw.program import DramTensor

from .dot import lower_dot
from .elementwise import emit_loop, free_size
from .epilogue import Epilogue
from .folding import fold
from .folding_reduce import sums_exp
from .reduce import RegionSource, emit_reduce, is_identity
from .regions import FMAX
from .registry import LowerCtx, register_lowering
from .rows import emit_rows
from .translate import FusionPlan, Unsupported, translate

__all__ = ["Unsupported", "fusion_notes", "dominant_first"]

# Ops that move or reinterpret data and do no arithmetic of their own in a fusion.
_MOVEMENT = frozenset({"broadcast_in_dim", "reshape", "convert", "bitcast_convert",
                       "transpose", "slice", "dynamic_slice", "concatenate", "pad",
                       "reverse", "iota", "constant", "copy"})
# Ties in work go to the op kind that names the fusion (its hero): matmuls, then reduces.
_RANK = {"dot_general": 3, "convolution": 3, "reduce": 2, "reduce_window": 2}


def fusion_notes(op) -> list[str]:
    """The notes every kernel of a fusion carries: its kind and the pass's decisions."""
    return [f"fusion_kind: {op.attrs.get('fusion_kind', '?')}",
            *(f"decision: {d}" for d in op.attrs.get("decisions", ()))]


def dominant_first(ops: list) -> list:
    """The fused ops (`hlo_passes.ir.Op`) ordered by the work each does, largest first,
    program order among equals: a dot_general's 2*M*N*K FLOPs, one per element of the
    largest operand or result for the other computing ops, none for data movement.
    A BatchNorm reduction fused behind a dropout multiply is then attributed to the
    reduction, not to the first op in program order."""
    return sorted(ops, key=lambda o: tuple(-w for w in _work(o)))


def _work(op) -> tuple[int, int]:
    if op.kind in _MOVEMENT:
        return 0, 0
    n = max((v.type.size for v in (*op.operands, *op.results)), default=0)
    if op.kind == "dot_general":
        lhs = op.operands[0].shape
        k = 1
        for d in op.attrs.get("lhs_contracting_dimensions", ()):
            k *= lhs[d]
        n = 2 * op.results[0].type.size * k
    return n, _RANK.get(op.kind, 1)


@register_lowering("fusion")
def _fusion_lower(ctx: LowerCtx, *ins: DramTensor, fusion_kind: str = "loop",
                  decisions=(), attention_scale: float = 1.0,
                  attention_mask: bool = False, **attention) -> None:
    if fusion_kind == "attention":
        from .attention import lower_attention
        return lower_attention(ctx, list(ins), attention_scale, attention_mask,
                               **{k.removeprefix("attention_"): v for k, v in attention.items()})
    if fusion_kind == "attention_bwd":
        from .attention_bwd import lower_attention_bwd
        return lower_attention_bwd(ctx, list(ins), attention_scale, attention_mask,
                                   attention.get("attention_layout"),
                                   attention.get("attention_offsets", ()),
                                   attention.get("attention_dropout"))
    plan = translate(ctx.op, list(ins), ctx.outs)
    root = plan.reduce if fusion_kind == "reduction" else None
    if root is None or not sums_exp(plan.region, root.vid, root.alu):
        plan.region = fold(plan.region)     # (a summed exp(x - m): folding_reduce.py's)
    if fusion_kind == "reduction":
        _reduction(ctx, plan)
    elif fusion_kind == "matmul_epilogue":
        _epilogue(ctx, plan)
    elif fusion_kind == "rows":
        ctx.kb.flops += emit_rows(ctx.kb, plan.region, ctx.op.attrs["row_axes"])
    else:
        ctx.kb.flops += emit_loop(ctx.kb, plan.region)


def _reduction(ctx: LowerCtx, plan: FusionPlan) -> None:
    region, root = plan.region, plan.reduce
    out = ctx.outs[0]
    dtype = region.dtype(root.vid)
    ctx.kb.flops += region.size * (1 + sum(s.kind != "constant" for s in region.steps))
    if region.size == 0 or out.size == 0:
        raise Unsupported("an empty reduction")
    init = None if is_identity(_value(root.init), root.alu, dtype) else root.init
    chunk = min(FMAX, free_size(ctx.kb, region, 4 * FMAX * ctx.target.partitions))
    source = RegionSource(ctx.kb, region, root.vid, chunk)
    emit_reduce(ctx.kb, source, region.shape, out, root.alu, init, root.dimensions)


def _value(init):
    return None if isinstance(init, DramTensor) else init


def _epilogue(ctx: LowerCtx, plan: FusionPlan) -> None:
    dot = plan.dot
    attrs = dot.op.attrs
    nb = len(attrs.get("lhs_batching_dimensions", ()))
    nm = len(dot.lhs.shape) - nb - len(attrs.get("lhs_contracting_dimensions", ()))
    epilogue = Epilogue(plan, nb, nm)
    ctx.kb.notes.extend(epilogue.notes)
    ctx.kb.flops += plan.region.size * sum(s.kind != "constant" for s in plan.region.steps)
    value = DramTensor("dot", tuple(plan.region.shape), plan.region.dtype(dot.vid))
    lower_dot(ctx, dot.lhs, dot.rhs, value, attrs, epilogue)
