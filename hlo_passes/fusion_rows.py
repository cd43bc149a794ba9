"""Row fusion: reductions along the trailing axes fused with what uses them.

A LayerNorm, an RMSNorm or a softmax reduces each row of its input and uses the
row's statistic on the same row again: `x - mean(x)`, `x * rsqrt(var + eps)`,
`exp(x - max) / sum`. Fused op by op, every reduction ends a kernel and every
broadcast of its result starts one that reads the rows again from HBM (a transformer
block's two LayerNorms, forward and backward, were 25 kernels and 0.8 ms of 2.9).
When a row fits on chip, one kernel can hold whole rows in SBUF, one row per
partition, and do it all: the reduction along the free axis gives one value per
partition, which the following ops use as their per-partition operand.

The fusion policy (fusion_policy.py) asks these rules when a region's producer is a
reduce, a value of row shape, or a view between the two:

    region shape S, k trailing row axes      rows of 1 < L = prod(S[-k:]) <= max_row
    row shapes                               S[:-k] and S[:-k] + (1,) * k
    reduce of an S-shaped value over the     fused: a row reduction (one value per
      last k axes, float, one combiner         partition of the row tile)
    elementwise op of a row shape            fused: computed on [P, 1]
    broadcast_in_dim of a row shape to S or  fused: the value is already one per
      a row shape, leading axes kept; a        partition, nothing moves
      reshape between row shapes
    a member used outside the region         fused and also written out when every
                                             outside user comes after the region

The first row op fixes k for the region (`FusionDecision.rows`); the fusion pass then
makes the region a fusion of kind "rows", which jax_trn.lower tiles by rows. Only a
region rooted at an elementwise op (kind "loop") grows rows: a reduction or matmul
region reads row values from memory as before.
"""
from __future__ import annotations

import math

from hlo_passes import ir

# Elements of one row a fusion holds on chip by default: a few FP32 copies of an
# 8192-wide row (32 KiB each) fit a partition's SBUF (trainium-hardware.md §3.1).
MAX_ROW = 8192


def row_axes(shape: tuple[int, ...], region_shape: tuple[int, ...], rows: int,
             max_row: int) -> int:
    """k if `shape` is a row shape of `region_shape` with k trailing row axes (k =
    `rows` when the region has fixed it, else the smallest that fits), else 0."""
    n = len(region_shape)
    for k in ([rows] if rows else range(1, n)):
        if not 0 < k < n or not 1 < math.prod(region_shape[n - k:]) <= max_row:
            continue
        lead = tuple(region_shape[:n - k])
        if tuple(shape) in (lead, lead + (1,) * k):
            return k
    return 0


def reduce_rows(op: ir.Op, region_shape: tuple[int, ...], rows: int, max_row: int) -> int:
    """k if `op` (a fusible reduce) reduces an S-shaped float value over S's last k
    axes with rows of at most `max_row` elements, else 0."""
    x = op.operands[0]
    n = len(region_shape)
    if tuple(x.shape) != tuple(region_shape) or not ir.is_float(x.dtype):
        return 0
    dims = tuple(sorted(op.attrs["dimensions"]))
    k = len(dims)
    if not dims or dims != tuple(range(n - k, n)) or (rows and k != rows):
        return 0
    return k if 0 < k < n and 1 < math.prod(region_shape[n - k:]) <= max_row else 0


def row_view(op: ir.Op, region_shape: tuple[int, ...], rows: int, max_row: int) -> int:
    """k if `op` is a view that keeps a row value one per row: a broadcast_in_dim of a
    row shape to the region's shape or a row shape, leading axes mapped to themselves,
    or a reshape between row shapes."""
    src, out = tuple(op.operands[0].shape), tuple(op.result.shape)
    k = row_axes(src, region_shape, rows, max_row)
    if not k:
        return 0
    lead = len(region_shape) - k
    if op.kind == "reshape":
        return k if row_axes(out, region_shape, k, max_row) else 0
    if out != tuple(region_shape) and not row_axes(out, region_shape, k, max_row):
        return 0
    dims = tuple(op.attrs["broadcast_dimensions"])
    return k if dims[:lead] == tuple(range(lead)) else 0
