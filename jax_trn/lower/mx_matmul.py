"""mx_matmul: JAX's block-scaled `scaled_matmul` (jax_trn/jax_mx.py) as `nc_matmul_mx`.

    out[b, m, n] = sum_k lhs[b, m, k] s_l[b, m, k // 32] rhs[b, n, k] s_r[b, n, k // 32]

lhs [B, M, K] and rhs [B, N, K] are MXFP8 (float8_e4m3fn / float8_e5m2), the scales
E8M0 (float8_e8m0fnu), FP32 accumulation, the result rounded once to its type.

On NeuronCore-v4 (`Target.mx_matmul`, §2.2) the op runs as `nc_matmul_mx` at 4x the
BF16 rate: K = 512 per matmul, 128 partitions x 4 values packed in one 32-bit element.
Both operands keep K contiguous in HBM, so four consecutive K values of a row are one
32-bit word, i.e. one `float8_*_x4` element: a 4-byte `dma_transpose` (§3.4) of the
[F, K/4] words gives the [K/4, F] tile the matmul reads, bit for bit. The scale tile
of a k-tile holds group g (K rows 32g..32g+31) in partition 32 (g // 4) + g % 4
(hw/mx.py). The scales [F, G] (G = K/32) are loaded as rows, widened to 16 bits with
group 16 j + 4 q + r of k-tile j in column 128 j + 32 q + r (one VectorE copy), and
each k-tile's [F, 128] block is turned by an SBUF->SBUF 16-bit `dma_transpose` (§3.4;
there is none for bytes) into [128, F]: column 32 q + r becomes that partition. The
matmul reads the low bytes of those words (a stride-2 pattern, §3.1).

Loop nest: per batch, a block of lhs row tiles stays resident (as many as fit SBUF
next to two rhs column groups of 512), every rhs column group streams past it
(double-buffered), and each (row tile, column group) accumulates its K/512 matmuls in
one PSUM bank, is copied out in the result type and stored.

Elsewhere (no MX: Trn1 / Trn2), for K not a multiple of 128, or an odd M, the op runs
as dequantize + BF16 matmul (mx_dequant.py), whose kernels say so in their names.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from jax_trn.hw import isa
from jax_trn.hw import mx as hw_mx
from jax_trn.hw.program import DramTensor

from . import mx_dequant
from .builder import KernelBuilder, sub
from .layout import tiles
from .registry import LowerCtx, register_lowering

PACKED = {"float8_e4m3fn": "float8_e4m3fn_x4", "float8_e5m2": "float8_e5m2_x4"}
WORDS = 4                       # K values per packed element (§2.2)
GROUP = 32                      # K values per E8M0 scale (§4)
NT = 512                        # moving free size of an FP32-dst MX matmul (§2.2)
SBUF_SHARE = 0.95               # of the kernel's free SBUF the operands may take
STORE_QUEUES = 4                # of the DMA queues (16), for result stores only: a store
                                # never waits behind a load (FIFO queues, §3.4), and a
OUT_BUFFERS = 4                 # result buffer is free again soon after its matmuls
SPREAD = "gpsimd"               # the engine spreading scale rows: idle otherwise, so a
                                # spread waiting for its rows never holds up the PSUM
                                # evacuations (VectorE / ScalarE) in its queue


@register_lowering("mx_matmul")
def _mx_matmul_lower(ctx: LowerCtx, lhs: DramTensor, rhs: DramTensor, ls: DramTensor,
                     rs: DramTensor) -> None:
    out = ctx.outs[0]
    (b, m, k), n = lhs.shape, rhs.shape[1]
    ctx.kb.flops += 2 * b * m * n * k
    if not native(ctx.target, lhs, rhs):
        return mx_dequant.lower(ctx, lhs, rhs, ls, rs, out)
    MxEmitter(ctx.kb, (lhs, ls), (rhs, rs), out).run()


def native(target, lhs: DramTensor, rhs: DramTensor) -> bool:
    """Runs as nc_matmul_mx: an MX core, MXFP8 data, whole 128-row k-tiles (32
    partitions, §6.2) and even row tiles (stationary free size, §6.2)."""
    k, m = lhs.shape[2], lhs.shape[1]
    return (target.mx_matmul and lhs.dtype in PACKED and rhs.dtype in PACKED
            and k % (WORDS * 32) == 0 and m % 2 == 0)


# --- the MX loop nest -------------------------------------------------------------------------

@dataclass
class Strip:
    """The k-tiles of one operand's F columns, k-tile j at free offset j * width: x4
    data [K/4, F]; scales as 32-bit words, byte j % 4 of word column (j // 4) * width
    + f belonging to k-tile j (read through a stride-4 byte pattern, §3.1)."""
    data: isa.Tile              # uint32, [128, nk * width]
    scale: isa.Tile             # uint32, [128, ceil(nk / 4) * width]
    width: int

    def scale_tile(self, j: int, rows: int, width: int) -> isa.Tile:
        offset = self.scale.offset + (j // 4) * self.width * 4 + j % 4
        return self.scale.with_(dtype="uint8", num_partitions=rows, offset=offset,
                                free=(width,), strides=(4,))


class MxEmitter:
    """Emits the MX loop nest (module docstring) for out[B, M, N]."""

    def __init__(self, kb: KernelBuilder, lhs, rhs, out: DramTensor):
        self.kb, self.lhs, self.rhs, self.out = kb, lhs, rhs, out
        (self.b, self.m, self.k), self.n = lhs[0].shape, rhs[0].shape[1]
        self.words, self.pmax = self.k // WORDS, kb.target.partitions
        self.nk = -(-self.words // self.pmax)
        self.nt = min(NT, self.n)
        self.g = self.k // GROUP
        spreads = -(-min(NT, self.n) // self.pmax)        # one rhs load's worth
        self.raw = kb.ring(spreads, self.g, lhs[1].dtype)
        self.nw = -(-self.nk // 4)                        # scale words per column
        self.spread = kb.ring(spreads, self.nw * self.pmax, "uint32")
        per_row_tile = self.nk * self.pmax * 5           # 4 data bytes + 1 scale byte
        budget = int(_free_sbuf(kb) * SBUF_SHARE) - 2 * self.nk * self.nt * 5 \
            - 2 * self.nt * 4
        rows = -(-self.m // self.pmax)
        fit = max(1, min(rows, budget // per_row_tile))
        self.mtiles = -(-rows // -(-rows // fit))       # balanced blocks of row tiles
        self.strips = [self._strip(self.pmax) for _ in range(self.mtiles)]
        self.groups = [self._strip(self.nt) for _ in range(2)]
        self.acc = kb.ring(kb.target.psum_banks, self.nt, "float32", mem="psum")
        self.obuf = kb.ring(OUT_BUFFERS, self.nt, out.dtype)
        nq = kb.target.dma_queues
        self.load_q = itertools.cycle(range(nq - STORE_QUEUES))
        self.store_q = itertools.cycle(range(nq - STORE_QUEUES, nq))

    def _strip(self, width: int) -> Strip:
        return Strip(self.kb.tile(self.nk * width, "uint32"),
                     self.kb.tile(self.nw * width, "uint32"), width)

    def run(self) -> None:
        """Steps (batch, row block, column group) in order; DMAs in the order they are
        needed (each queue is FIFO, §3.4): the next step's rhs group as a step starts
        (double-buffered; in the first step after its lhs strips), the next block's
        lhs strip i right after the last step of a block has used strip i."""
        block = self.mtiles * self.pmax
        steps = [(bi, blk, grp) for bi in range(self.b) for blk in tiles(self.m, block)
                 for grp in tiles(self.n, self.nt)]
        self._load(self.rhs, steps[0][0], *steps[0][2], self.groups[0])
        for (m0, mt), strip in self._rows(steps[0][1]):
            self._load(self.lhs, steps[0][0], m0, mt, strip)
        for si, (bi, blk, (n0, nt)) in enumerate(steps):
            nxt = steps[si + 1] if si + 1 < len(steps) else None
            rows = self._rows(blk)
            new_rows = self._rows(nxt[1]) if nxt and nxt[:2] != (bi, blk) else []
            ahead = len(rows) - 1 if si == 0 else 0     # step 0: after the strips
            for i, ((m0, mt), strip) in enumerate(rows):
                if i == ahead and nxt:
                    self._load(self.rhs, nxt[0], *nxt[2], self.groups[(si + 1) % 2])
                self._tile(bi, strip, mt, self.groups[si % 2], nt, m0, n0)
                if i < len(new_rows):
                    self._load(self.lhs, nxt[0], *new_rows[i][0], strip)
        self.kb.release(self.acc, self.obuf, self.raw, self.spread,
                        *(t for s in self.strips + self.groups for t in (s.data, s.scale)))

    def _rows(self, blk: tuple[int, int]) -> list[tuple[tuple[int, int], Strip]]:
        """The row tiles (m0, mt) of block `blk` with their strips."""
        mb0, mbn = blk
        return list(zip([(mb0 + m0, mt) for m0, mt in tiles(mbn, self.pmax)], self.strips))

    def _tile(self, bi, strip: Strip, mt: int, group: Strip, nt: int, m0: int, n0: int):
        acc = sub(self.acc.next(), mt, nt)
        for j, (_, kw) in enumerate(tiles(self.words, self.pmax)):
            s_data, s_scale = self._ktile(strip, j, kw, mt, self.lhs[0].dtype)
            m_data, m_scale = self._ktile(group, j, kw, nt, self.rhs[0].dtype)
            self.kb.emit(isa.NcMatmulMx, dst=acc, stationary=s_data, moving=m_data,
                         stationary_scale=s_scale, moving_scale=m_scale, accumulate=j > 0)
        otile = sub(self.obuf.next(), mt, nt)
        self.kb.emit(isa.TensorCopy, dst=otile, src=acc, engine=self.kb.evac_engine())
        base = (bi * self.m + m0) * self.n + n0
        self.kb.emit(isa.DmaCopy, dst=self.kb.ap(self.out, base, ((self.n, mt), (1, nt))),
                     src=otile, dma_queue=next(self.store_q))

    def _ktile(self, strip: Strip, j: int, kw: int, width: int, dtype: str):
        data = sub(strip.data, kw, width, at=j * strip.width)
        scale = strip.scale_tile(j, hw_mx.scale_partitions(kw), width)
        return data.with_(dtype=PACKED[dtype]), scale

    def _load(self, operand, bi: int, f0: int, width: int, strip: Strip) -> None:
        """Data k-tiles by 4-byte dma_transpose from HBM; the scales of each 128
        columns loaded as rows, spread into words (`_spread`), and transposed four
        k-tiles at a time by an SBUF->SBUF 4-byte dma_transpose, which lands group g of
        k-tile j in partition 32 (g // 4) + g % 4 (hw/mx.py), byte j % 4."""
        data, scales = operand
        f = data.shape[1]
        # scale rows first: the spread is done by the time the scale transposes,
        # queued after the data's, reach the head of their (FIFO) queues
        spreads = [(c0, ct, self._spread(scales, bi, f0 + c0, ct))
                   for c0, ct in tiles(width, self.pmax)]
        for j, (w0, kw) in enumerate(tiles(self.words, self.pmax)):
            src = self.kb.ap(data, (bi * f + f0) * self.words + w0,
                             ((self.words, width), (1, kw)), view="uint32")
            dst = sub(strip.data, kw, width, at=j * strip.width)
            self.kb.emit(isa.DmaTranspose, dst=dst, src=src, dma_queue=next(self.load_q))
        for c0, ct, spread in spreads:
            for jj in range(self.nw):
                self.kb.emit(isa.DmaTranspose,
                             dst=sub(strip.scale, self.pmax, ct, at=jj * strip.width + c0),
                             src=sub(spread, ct, self.pmax, at=jj * self.pmax),
                             dma_queue=next(self.load_q))

    def _spread(self, scales: DramTensor, bi: int, f0: int, ft: int) -> isa.Tile:
        """Scale rows f0.. [ft, G] -> words [ft, nw, 128]: group 16 j + 4 q + r in
        word column 128 (j // 4) + 32 q + r, byte j % 4 (the partition and byte the
        transpose and the matmul want). One GpSimd copy per run of k-tiles."""
        raw = sub(self.raw.next(), ft, self.g)
        f = scales.shape[1]
        src = self.kb.ap(scales, (bi * f + f0) * self.g, ((self.g, ft), (1, self.g)))
        self.kb.emit(isa.DmaCopy, dst=raw, src=src, dma_queue=next(self.load_q))
        raw = raw.with_(dtype="uint8")                  # the E8M0 bytes as integers
        spread = sub(self.spread.next(), ft, self.nw * self.pmax)
        out = spread.with_(dtype="uint8", free=(self.nw * self.pmax * 4,))
        full, last = divmod(self.g, 16)                 # whole k-tiles, groups of the last
        quads, rest = divmod(full, 4)
        runs = [((quads, 4, 4, 4), (512, 1, 128, 4), 0, 0)] if quads else []
        if rest:
            runs.append(((rest, 4, 4), (1, 128, 4), quads * 64, quads * 512))
        if last:
            runs.append(((last // 4, 4), (128, 4), full * 16, quads * 512 + rest))
        for shape, strides, s0, d0 in runs:
            self.kb.emit(isa.TensorCopy, src=sub(raw, ft, shape, at=s0), engine=SPREAD,
                         dst=sub(out, ft, 1, at=d0).with_(free=shape, strides=strides))
        return spread


def _free_sbuf(kb: KernelBuilder) -> int:
    top = max((off + size for off, size in kb.sbuf.live.items()), default=0)
    return kb.sbuf.capacity - top
