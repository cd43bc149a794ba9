"""Transposed loads for the attention kernels: rows [rows, width] of a DRAM tensor (or
the partitions of an SBUF tile) into an SBUF tile as [width, rows], width <= 128.

NC-v3+ has `dma_transpose` (§3.4): one DMA. NC-v2 (Trn1) has none, so the rows are
DMAed as they are into a staging tile (rows on partitions, descriptors of `width`
contiguous elements), transposed on TensorE (an identity matmul into PSUM, 128 x 128
at most, §2.2) and copied out of PSUM by VectorE / ScalarE in turn, optionally times a
scale (the copy computes FP32 x scale and rounds to the destination's type, as the
GpSimd multiply after a dma_transpose does). TensorE pays ~128 cycles per 128 rows, a
flash-attention kernel a few per q-tile: what Trn1 kernels do without DMA transposes.
"""
from __future__ import annotations

from jax_trn.hw import isa

from .builder import sub
from .layout import tiles

STAGE_DEPTH = 4         # staging tiles of rows in flight (DMA -> TensorE)


class Transposer:
    """`load` / `load_tile` for one kernel: `dma(dst, src, cls)` issues a DMA on the
    kernel's queues; `psum()` gives a fresh FP32 PSUM tile of at least [128, 128] (the
    kernel's transpose ring); `engines` an iterator of copy engines."""

    def __init__(self, kb, dma, psum, engines):
        self.kb, self.dma, self.psum, self.engines = kb, dma, psum, engines
        self.on_dma = kb.target.dma_transpose
        self.p = kb.target.partitions
        self.stages: dict = {}

    def load(self, dst: isa.Tile, src: isa.DramAP, scale: float | None = None) -> None:
        """dst [width, rows] = src^T, src a pattern ((row stride, rows), (1, width));
        with `scale`, times it (on GpSimd after a dma_transpose)."""
        if self.on_dma:
            self.dma(dst, src, isa.DmaTranspose)
            if scale is not None:
                self.kb.emit(isa.TensorScalar, dst=dst, data=dst, op0="multiply",
                             operand0=scale, engine="gpsimd")
            return
        (rs, rows), (_, width) = src.pattern
        for r0, rc in tiles(rows, self.p):
            stage = sub(self._stage(src.dtype, width).next(), rc, width)
            self.dma(stage, isa.DramAP(src.tensor, src.offset + r0 * rs,
                                       ((rs, rc), (1, width)), src.dtype))
            self._on_pe(sub(dst, width, rc, at=r0), stage, scale)

    def load_heads(self, dsts: list[isa.Tile], src: isa.DramAP,
                   scale: float | None = None) -> None:
        """TensorE only: dsts[h] [width, rows] = the h-th `width` columns of src's rows
        transposed, src a pattern ((row stride, rows), (1, len(dsts) x width)): one
        DMA per 128 rows for all of them (descriptors len(dsts) times longer)."""
        (rs, rows), (_, total) = src.pattern
        width = total // len(dsts)
        for r0, rc in tiles(rows, self.p):
            stage = sub(self._stage(src.dtype, total).next(), rc, total)
            self.dma(stage, isa.DramAP(src.tensor, src.offset + r0 * rs,
                                       ((rs, rc), (1, total)), src.dtype))
            for h, dst in enumerate(dsts):
                self._on_pe(sub(dst, width, rc, at=r0), sub(stage, rc, width, at=h * width),
                            scale)

    def load_tile(self, dst: isa.Tile, src: isa.Tile) -> None:
        """dst [n, P] = src [P, n]^T, both in SBUF (n <= 128 on TensorE)."""
        if self.on_dma:
            self.dma(dst, src, isa.DmaTranspose)
            return
        self._on_pe(dst, src, None)

    def _on_pe(self, dst: isa.Tile, data: isa.Tile, scale: float | None) -> None:
        width, rows = data.free_size, data.num_partitions
        ps = sub(self.psum(), width, rows)
        self.kb.emit(isa.NcTranspose, dst=ps, data=data)
        if scale is None:
            self.kb.emit(isa.TensorCopy, dst=dst, src=ps, engine=next(self.engines))
        else:
            self.kb.emit(isa.TensorScalar, dst=dst, data=ps, op0="multiply",
                         operand0=scale, engine=next(self.engines))

    def _stage(self, dtype: str, width: int):
        """The staging ring for rows of `width` elements (one per dtype, as wide as the
        widest asked for first: callers ask for their widest first or all alike)."""
        ring = self.stages.get(dtype)
        if ring is None or ring.tiles[0].free_size < width:
            ring = self.stages[dtype] = self.kb.ring(STAGE_DEPTH, max(width, self.p), dtype)
        return ring
