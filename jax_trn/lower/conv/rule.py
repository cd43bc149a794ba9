"""The `convolution` rule: the weight-gradient path (wgrad.py) or the tap loop (kernel.py)."""
from __future__ import annotations

from jax_trn.hw.program import DramTensor

from ..dot import matmul_types
from ..errors import LoweringError
from ..layout import View, row_major
from ..movement import fill
from ..registry import LowerCtx, register_lowering
from ..relayout import relayout
from . import wgrad
from .geometry import Staged, conv_of, packing, weight_units
from .kernel import ConvEmitter
from .plan import make_plan
from .staging import (channel_major_input, channel_major_output, input_source, sized,
                      stage_weights, weight_source)


@register_lowering("convolution")
def _convolution_lower(ctx: LowerCtx, x: DramTensor, w: DramTensor, **attrs) -> None:
    out = ctx.outs[0]
    cv = conv_of(x, w, out, attrs, ctx.target)
    flops = 2 * out.size * (w.size // max(1, cv.o_features))
    if out.size == 0:
        return
    if x.size == 0 or w.size == 0:
        ctx.kb.flops += flops
        return fill(ctx.kb, out, 0)
    if len(cv.dims) > 3:
        raise LoweringError(f"convolution with {len(cv.dims)} spatial dims (1-3 supported): "
                            f"{ctx.op.describe()}")
    ldt, rdt, precision = matmul_types(x.dtype, w.dtype, attrs.get("precision_config", ()),
                                       ctx.matmul_precision)
    if (images := wgrad.plan(ctx, cv, x, w, ldt, rdt)) is not None:
        ctx.kb.flops += flops
        return wgrad.lower(ctx, cv, *images, out, precision, ldt)
    units, x_in = weight_units(cv), x
    x, cv = channel_major_input(ctx, x, cv, ldt)
    staged = input_source(ctx, x, cv, ldt)
    pk = packing(cv)
    plan = make_plan(cv, units, staged, pk, ldt, rdt, out.dtype, ctx.target.sbuf_bytes,
                     ctx.op.describe())
    wsrc = weight_source(ctx, w, cv, rdt)
    wt = stage_weights(ctx, w, cv, units, rdt) if wsrc == "staged" else w
    if wsrc == "staged" or isinstance(staged, Staged) or x is not x_in:
        ctx.next_kernel("conv")
    dst, cv_out = channel_major_output(ctx, out, cv)
    ctx.kb.flops += flops                   # the model FLOPs go to the tap loop's kernel
    ConvEmitter(ctx.kb, cv_out, plan, pk, staged, (wsrc, wt), units, dst, precision, ldt,
                rdt).run()
    if dst is not out:
        ctx.next_kernel("relayout")
        # (batch, spatial..., feature): the feature axis is the output's contiguous one
        # and the temporary's pixels are, so relayout swaps them on TensorE.
        sizes = (cv.n_out, *(n for _, n in cv.o[2]), cv.o_features)
        tmp = row_major(dst.shape)
        relayout(ctx.kb, View(out, sized(((cv.o[0], 0), *cv.o[2], (cv.o[1], 0)), sizes)),
                 View(dst, sized((tmp[0], *tmp[2:], tmp[1]), sizes)))

