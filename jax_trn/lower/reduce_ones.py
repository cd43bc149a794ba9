"""Column sums of 16-bit floats on TensorE: the columns tiling of reduce.py as a
ones-vector matmul (trainium-hardware.md §2.2, §3.2).

A bias gradient sums a [rows, cols] BF16 tensor over its rows: the columns tiling loads
[P rows, F cols] tiles, and VectorE adds each into an FP32 [P, F] accumulator (a mixed
BF16 / FP32 tensor_tensor: 2N cycles, §6.3), then transposes its partitions away. As a
matmul, ones[K, 1] stationary (loaded once) against the tile's [K, n <= 512] column
slices as moving data, accumulating in a PSUM bank over the row tiles, gives the [1, n]
column sums directly: n cycles on TensorE's faster clock (§1.2, §6.3) and no
transposes. The products x * 1.0 are exact and TensorE accumulates in FP32 (§2.2), as
the VectorE accumulator does, in another order: within FP32 rounding of it. One
TensorCopy per 512 columns moves the sums out of PSUM, rounded to the result type.
"""
from __future__ import annotations

import math

from jax_trn.hw import isa

from .builder import sub
from .layout import box_offset, box_pattern, line_tiles

_HALF = ("bfloat16", "float16")


def applies(r) -> bool:
    """Whether `r` (reduce.py `_Reducer`) sums 16-bit floats with no init value: its
    source's own, or a 16-bit input the region only widens to FP32 (a LayerNorm bias's
    gradient, `folding_reduce.WidenSumSource`: the widening is exact, TensorE reads the
    16-bit values)."""
    return r.alu == "add" and r.init is None and _half(r.source) is not None


def _half(source) -> str | None:
    """The 16-bit type the sum reads, or None."""
    if source.dtype in _HALF:
        return source.dtype
    x = getattr(source, "x", None)
    if x is None or not hasattr(source, "base"):
        return None
    dtype = source.base.region.inputs[x].dtype
    return dtype if dtype in _HALF else None


def _load(r, boxes) -> isa.Tile:
    """The box's 16-bit values: loaded, or the widened input's tile before widening."""
    if r.source.dtype in _HALF:
        return r.load(boxes)
    parts, free = boxes[0][1][0][1], math.prod(n for _, n in boxes[0][1][1:])
    return sub(r.source.base.ev.load(boxes[1:])[r.source.x].tile, parts, free)


def ones_columns(r, kept, outs, red, boxes_of, width: int) -> None:
    """The columns tiling (reduce.py `_columns`) with TensorE column sums."""
    kb = r.kb
    last = outs[-1][0] if outs else 1
    ones = kb.tile(1, _half(r.source))
    kb.emit(isa.Memset, dst=ones, value=1.0)
    bank = kb.target.psum_bank_fp32          # one matmul, one bank (§2.2, §3.2)
    psum = kb.ring(2 * -(-width // bank), bank, "float32", mem="psum")
    rows = kb.ring(2, bank, r.out.dtype)
    for kbox in line_tiles([n for _, n in kept[0]], width):
        fc = box_pattern(kept[0], kbox)[-1][1]
        sums = [(c0, min(bank, fc - c0), psum.next()) for c0 in range(0, fc, bank)]
        for i, rbox in enumerate(line_tiles([n for _, n in red[0]], r.pmax)):
            tile = _load(r, boxes_of(kbox, rbox))
            k = tile.num_partitions
            for c0, n, acc in sums:
                kb.emit(isa.NcMatmul, dst=sub(acc, 1, n), stationary=sub(ones, k, 1),
                        moving=sub(tile, k, n, at=c0), accumulate=i > 0)
        base = box_offset(outs, kbox)
        for c0, n, acc in sums:
            row = sub(rows.next(), 1, n)
            kb.emit(isa.TensorCopy, dst=row, src=sub(acc, 1, n), engine=kb.evac_engine())
            kb.dma(kb.ap(r.out, base + c0 * last, ((1, 1), (last, n))), row)
    kb.release(ones, psum, rows)
