"""slice, concatenate and pad: copies between views of DRAM tensors (`relayout`).

A slice reads its operand through an offset, strided view; concatenate writes each
operand into its window of the result; pad fills the result with the padding value
and then writes the operand through a view with interior-padding strides.
"""
from __future__ import annotations

import numpy as np

from jax_trn.hw.program import DramTensor

from .errors import LoweringError
from .layout import View, row_major
from .movement import fill
from .registry import LowerCtx, register_lowering
from .relayout import relayout


@register_lowering("slice")
def _slice_lower(ctx: LowerCtx, x: DramTensor, *, start_indices, limit_indices,
                 strides) -> None:
    axes, out = row_major(x.shape), ctx.outs[0]
    src = tuple((st * k, n) for (st, _), k, n in zip(axes, strides, out.shape))
    offset = sum(st * s0 for (st, _), s0 in zip(axes, start_indices))
    relayout(ctx.kb, View.of(out), View(x, src, offset))


@register_lowering("concatenate")
def _concatenate_lower(ctx: LowerCtx, *xs: DramTensor, dimension) -> None:
    out = ctx.outs[0]
    axes, at = row_major(out.shape), 0
    for x in xs:
        window = tuple((st, n) for (st, _), n in zip(axes, x.shape))
        relayout(ctx.kb, View(out, window, at * axes[dimension][0]), View.of(x))
        at += x.shape[dimension]


def _pad_dim(lo: int, hi: int, interior: int, n: int) -> tuple[int, int, int]:
    """(first source index, source count, first result index) of one padded dim.

    >>> _pad_dim(2, 1, 0, 5), _pad_dim(-2, -1, 0, 5), _pad_dim(1, 0, 1, 3)
    ((0, 5, 2), (2, 2, 0), (0, 3, 1))
    """
    if interior and (lo < 0 or hi < 0):
        raise LoweringError("negative edge padding with interior padding is not supported")
    first = max(0, -lo)
    return first, max(0, n - first - max(0, -hi)), max(0, lo)


@register_lowering("pad")
def _pad_lower(ctx: LowerCtx, x: DramTensor, value: DramTensor, *, edge_padding_low,
               edge_padding_high, interior_padding) -> None:
    out = ctx.outs[0]
    known = ctx.constant(value)
    if known is not None:
        fill(ctx.kb, out, np.asarray(known).reshape(-1)[0])
    else:
        relayout(ctx.kb, View.of(out), View(value, tuple((0, n) for n in out.shape)))
    dims = [_pad_dim(*p, n) for *p, n in zip(edge_padding_low, edge_padding_high,
                                             interior_padding, x.shape)]
    oax, xax = row_major(out.shape), row_major(x.shape)
    dst = tuple((st * (i + 1), c) for (st, _), i, (_, c, _) in zip(oax, interior_padding, dims))
    relayout(ctx.kb, View(out, dst, sum(st * d0 for (st, _), (_, _, d0) in zip(oax, dims))),
             View(x, tuple((st, c) for (st, _), (_, c, _) in zip(xax, dims)),
                  sum(st * s0 for (st, _), (s0, _, _) in zip(xax, dims))))
