"""What the conv kernel reads: the input in place or staged (padded / phased / an HBM
layout), the weights direct, by dma_transpose or staged, channel-major copies."""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw.program import DramTensor

from ..layout import Axes, View, row_major
from ..movement import fill
from ..registry import LowerCtx
from ..relayout import relayout
from .geometry import Conv, Padded, Phased, Staged, is_phased, is_unit


def input_source(ctx: LowerCtx, x: DramTensor, cv: Conv, dtype: str) -> Staged | Padded:
    """How the kernel reads the input: in place (padded or phased in SBUF), else from
    a staged HBM layout written by a DMA kernel first."""
    ns, cs, sp = cv.x
    rows = sp[-1][0] == 1
    if rows or _transposable(ctx, x, cv, dtype):
        kind = Padded if is_unit(cv) else Phased if is_phased(cv) else None
        if kind is not None:
            return kind(x, ns, cs, tuple(st for st, _ in sp), transposed=not rows)
    return _stage_input(ctx, x, cv, dtype)


def _transposable(ctx: LowerCtx, x: DramTensor, cv: Conv, dtype: str) -> bool:
    """Channel-minor input rows (NHWC) that dma_transpose (v3+, bit-exact, no cast,
    §3.4) can load as [channels, pixels] for the in-place paths."""
    _ns, cs, sp = cv.x
    return (ctx.target.dma_transpose and x.dtype == dtype
            and hw_dtypes.itemsize(dtype) in (2, 4) and cs == 1
            and sp[-2][0] == sp[-1][0] * sp[-1][1] and (is_unit(cv) or is_phased(cv)))


def _stage_input(ctx: LowerCtx, x: DramTensor, cv: Conv, dtype: str) -> Staged:
    ns, cs, sp = cv.x
    dims = cv.dims
    shape = (cv.n_in, cv.c, *(len(d.phases) for d in dims),
             *(d.q for d in dims))
    xp = ctx.temp(shape, dtype)
    axes = row_major(shape)
    k = len(dims)
    if any(d.lo > 0 or d.hi > 0 or d.ld > 1 or d.stride > 1 for d in dims):
        fill(ctx.kb, xp, 0)
    for combo in itertools.product(*(d.phases for d in dims)):
        parts = [d.interior(a) for d, a in zip(dims, combo)]
        if any(p is None for p in parts):
            continue
        doff = sum(dims[j].phases.index(a) * axes[2 + j][0] for j, a in enumerate(combo))
        doff += sum(p[3] * axes[2 + k + j][0] for j, p in enumerate(parts))
        soff = sum(p[0] * st for p, (st, _) in zip(parts, sp))
        n, cc = shape[0], shape[1]
        # (n, outer spatial..., h, c, w): a channel-minor input is a TensorE swap of
        # the last two axes (relayout.py), a channel-major one plain row copies.
        dst = [(axes[0][0], n)] + [(axes[2 + k + j][0] * p[4], p[1])
                                   for j, p in enumerate(parts)]
        src = [(ns, n)] + [(st * p[2], p[1]) for p, (st, _) in zip(parts, sp)]
        dst.insert(len(dst) - 1, (axes[1][0], cc))
        src.insert(len(src) - 1, (cs, cc))
        relayout(ctx.kb, View(xp, tuple(dst), doff), View(x, tuple(src), soff))
    return Staged(xp, 0, axes[0][0], axes[1][0], tuple(a[0] for a in axes[2:2 + k]),
                  tuple(a[0] for a in axes[2 + k:]))




def stage_weights(ctx: LowerCtx, w: DramTensor, cv: Conv, units, dtype: str) -> DramTensor:
    """Copies the kernel into [ci, taps, co] blocks (block-diagonal for packed groups)."""
    total = sum(u.ct * cv.taps * u.cot for us in units for u in us)
    wt = ctx.temp((total,), dtype)
    os_, is_, sp = cv.w
    taps = tuple((st * u, n) for (st, n), u in zip(
        row_major([d.kernel for d in cv.dims]), [1] * len(cv.dims)))
    if any(b.groups > 1 for b in cv.blocks):
        fill(ctx.kb, wt, 0)
    for b, us in zip(cv.blocks, units):
        for u in us:
            tap_d = tuple((st * u.cot, n) for st, n in taps)
            if b.groups > 1:
                dst = ((b.cg * cv.taps * u.cot + b.og, b.groups), (cv.taps * u.cot, b.cg),
                       *tap_d, (1, b.og))
                src = ((b.og * os_, b.groups), (is_, b.cg), *sp, (os_, b.og))
                soff = b.o0 * os_
            else:
                dst = ((cv.taps * u.cot, u.ct), *tap_d, (1, u.cot))
                src = ((is_, u.ct), *sp, (os_, u.cot))
                soff = u.ci0 * is_ + (b.o0 + u.co0) * os_
            relayout(ctx.kb, View(wt, dst, u.offset), View(w, src, soff))
    return wt


def weight_source(ctx: LowerCtx, w: DramTensor, cv: Conv, dtype: str) -> str:
    """How the conv kernel reads weights: "direct" (output features contiguous, HWIO:
    DMA rows of co), "transpose" (dma_transpose of [co, ci] per tap, no cast, §3.4) or
    "staged" (block-diagonal groups, or a cast of a co-strided kernel: a DMA kernel
    first copies them to [ci, taps, co] blocks)."""
    if any(b.groups > 1 for b in cv.blocks):
        return "staged"
    if cv.w[0] == 1:
        return "direct"
    if (ctx.target.dma_transpose and w.dtype == dtype
            and hw_dtypes.itemsize(dtype) in (2, 4)):
        return "transpose"
    return "staged"


def channel_major_input(ctx: LowerCtx, x: DramTensor, cv: Conv, dtype: str
                        ) -> tuple[DramTensor, Conv]:
    """A conv read in place whose input rows are not contiguous (channel-minor, NHWC)
    and that dma_transpose cannot load reads a channel-major copy, made by TensorE
    transposes of [pixels, channels] blocks (relayout.py), so its bands load with long
    DMA rows."""
    ns, cs, sp = cv.x
    if sp[-1][0] == 1 or not (is_unit(cv) or is_phased(cv)) or _transposable(ctx, x, cv, dtype):
        return x, cv
    shape = (cv.n_in, cv.c, *(d.size for d in cv.dims))
    xt = ctx.temp(shape, x.dtype)
    axes = row_major(shape)
    relayout(ctx.kb, View(xt, sized(axes, shape)),
             View(x, sized(((ns, 0), (cs, 0), *sp), shape)))
    return xt, replace(cv, x=(axes[0][0], axes[1][0], axes[2:]))


def channel_major_output(ctx: LowerCtx, out: DramTensor, cv: Conv
                         ) -> tuple[DramTensor, Conv]:
    """A channel-minor output (NHWC) is written channel-major to a temporary (rows of
    pixels per output channel: long DMA runs) and transposed into place afterwards."""
    _ns, os_, sp = cv.o
    pixels = math.prod(n for _, n in sp)
    if os_ != 1 or pixels == 1 or cv.o_features == 1:
        return out, cv
    shape = (cv.n_out, cv.o_features, *(n for _, n in sp))
    t = ctx.temp(shape, out.dtype)
    axes = row_major(shape)
    return t, replace(cv, o=(axes[0][0], axes[1][0], axes[2:]))


def sized(axes: Axes, shape) -> Axes:
    return tuple((st, n) for (st, _), n in zip(axes, shape))

