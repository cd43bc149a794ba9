"""mx_matmul: JAX's block-scaled `scaled_matmul` (jax_trn/jax_mx.py) as `nc_matmul_mx`.

    out[b, m, n] = sum_k lhs[b, m, k] s_l[b, m, k // 32] rhs[b, n, k] s_r[b, n, k // 32]

lhs [B, M, K] and rhs [B, N, K] are MXFP8 (float8_e4m3fn / float8_e5m2) or MXFP4
(float4_e2m1fn; the two may mix, §2.2), the scales E8M0 (float8_e8m0fnu), FP32
accumulation, the result rounded once to its type.

On NeuronCore-v4 (`Target.mx_matmul`, §2.2) the op runs as `nc_matmul_mx` at 4x the
BF16 rate: K = 512 per matmul, 128 partitions x 4 values packed in one 32-bit element.
Both operands keep K contiguous in HBM, so four consecutive K values of a row are one
32-bit word, i.e. one `float8_*_x4` element: a 4-byte `dma_transpose` (§3.4) of the
[F, K/4] words gives the [K/4, F] tile the matmul reads, bit for bit. The scale tile
of a k-tile holds group g (K rows 32g..32g+31) in partition 32 (g // 4) + g % 4
(hw/mx.py). There is no byte transpose (§3.4), so the scales [F, G] (G = K/32) are
loaded as rows (RAW_ROWS consecutive rows per partition: longer descriptors), spread
by GpSimd copies into 32-bit words -- group 16 j + 4 q + r of
k-tile j to word column 128 (j // 4) + 32 q + r, byte j % 4 -- and each [F, 128] block
of words is turned by an SBUF->SBUF 4-byte `dma_transpose` into [128, F]: word column
32 q + r becomes that partition, holding the scales of four k-tiles; the matmul reads
byte j % 4 through a stride-4 pattern (§3.1).

Loop nest: per batch, a block of lhs strips (two row tiles each) stays resident, as
many as fit SBUF next to two rhs column groups of 1024; each group streams past the
block (double-buffered); each (row tile, group) accumulates K/512 matmuls per 512
columns in a PSUM bank, is copied out in the result type and stored (2 KiB rows). DMAs
are issued in the order they are needed, as DMA queues are FIFO (`run`); the first
step loads the first PSUM bank's rhs columns, then the first strip, then the rest.

Measured (benchmarks/mx.py, 4096^3, one trn3 core): 461.5 us against 1759.9 us for
BF16 (3.81x): 438.2 us of matmuls (2048 x 213 ns, the first few slower while TensorE
ramps up, §2.2), 16.5 us before the first, 4.4 us of DMA waits, 2.4 us for the last
store. It was 463.8 us (3.79x): the first step loaded the whole rhs group before
the first strip, and the scale rows went one 128-byte row per partition (5% of the
DMA rate, §3.4), so DMA bandwidth, not TensorE, paced the first ~80 us.

MXFP4: HBM holds FP4 one value per byte, so each FP4 operand is first packed into
[B, F, K/4] `float4_e2m1fn_x4` words (16-bit: four nibbles) by an mx-pack-fp4 kernel
(mx_pack.py); the loop nest then loads them by 2-byte `dma_transpose`s, 0.5 byte per
value. 4096^3 MXFP4 (benchmarks/mx.py): 455.0 us for this kernel (its data loads are
half MXFP8's) + 2 x 114.9 us packing = 684.9 us, 2.57x BF16.

Elsewhere (no MX: Trn1 / Trn2), for other block scales (nvfp4: E4M3 per 16), K not a
multiple of 128, or an odd M, the op runs as dequantize + BF16 matmul (mx_dequant.py),
whose kernels say so in their names and why in their notes (`not_native`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from jax_trn.hw import isa
from jax_trn.hw import mx as hw_mx
from jax_trn.hw.dtypes import itemsize
from jax_trn.hw.program import DramTensor

from . import mx_dequant, mx_pack, mx_quantize  # noqa: F401 (mx_quantize: registers
                                                # its lowering)
from .mx_dequant import free_sbuf
from .builder import KernelBuilder, sub
from .layout import tiles
from .registry import LowerCtx, register_lowering

PACKED = {"float8_e4m3fn": "float8_e4m3fn_x4", "float8_e5m2": "float8_e5m2_x4",
          "float4_e2m1fn": "float4_e2m1fn_x4"}
WORD = {"float8_e4m3fn": "uint32", "float8_e5m2": "uint32",   # SBUF container of one
        "float4_e2m1fn": "uint16"}                            # x4 element (hw/dtypes.py)
WORDS = 4                       # K values per packed element (§2.2)
GROUP = 32                      # K values per E8M0 scale (§4)
NT = 512                        # moving free size of an FP32-dst MX matmul (§2.2)
GROUP_COLS = 1024               # rhs columns streamed together: result rows stored 2 KiB
                                # at a time (bf16; §3.4: ~80% DMA efficiency, 1 KiB ~40%)
SBUF_SHARE = 0.95               # of the kernel's free SBUF the operands may take
STORE_QUEUES = 4                # of the DMA queues (16), for result stores only: a store
                                # never waits behind a load (FIFO queues, §3.4), and a
OUT_BUFFERS = 4                 # result buffer is free again soon after its matmuls
STRIP_TILES = 2                 # row tiles per lhs strip: one dma_transpose loads both
                                # (half the DMAs, each paying the fixed cost, §2.6)
RAW_ROWS = 2                    # scale rows per partition in a raw load: 2 G bytes per
                                # descriptor (§3.4: 128 B ones reach 5% of the DMA rate).
                                # 4 measured slower: more DMA-fixed-cost-bound spreads
                                # and a longer first load
SPREAD = "gpsimd"               # the engine spreading scale rows: idle otherwise, so a
                                # spread waiting for its rows never holds up the PSUM
                                # evacuations (VectorE / ScalarE) in its queue


@register_lowering("mx_matmul")
def _mx_matmul_lower(ctx: LowerCtx, lhs: DramTensor, rhs: DramTensor, ls: DramTensor,
                     rs: DramTensor) -> None:
    out = ctx.outs[0]
    (b, m, k), n = lhs.shape, rhs.shape[1]
    ctx.kb.flops += 2 * b * m * n * k
    why = not_native(ctx.target, lhs, rhs, ls, rs)
    if why:
        return mx_dequant.lower(ctx, lhs, rhs, ls, rs, out, why)
    lw, rw = (mx_pack.pack(ctx, x) if x.dtype == "float4_e2m1fn" else x for x in (lhs, rhs))
    if (lw, rw) != (lhs, rhs):                  # after the pack kernel(s)
        ctx.next_kernel("mx-matmul")
    MxEmitter(ctx.kb, (lw, ls, lhs.dtype), (rw, rs, rhs.dtype), out).run()


def not_native(target, lhs: DramTensor, rhs: DramTensor, ls: DramTensor, rs: DramTensor
               ) -> str:
    """Why the op cannot run as nc_matmul_mx ("" if it can): it needs an MX core,
    MXFP8 / MXFP4 data with E8M0 scales per 32 values along K (§2.2, §4), whole
    128-row k-tiles (32 partitions, §6.2) and even row tiles (stationary free size)."""
    k, m = lhs.shape[2], lhs.shape[1]
    block = k // ls.shape[2]
    if block != GROUP or {ls.dtype, rs.dtype} != {"float8_e8m0fnu"}:
        return (f"block {block} with {ls.dtype} scales: nc_matmul_mx takes E8M0 scales "
                f"per {GROUP} values (§2.2, §4)")
    if not target.mx_matmul:
        return f"{target.name} has no nc_matmul_mx (MX matmuls are NeuronCore-v4's, §2.2)"
    if lhs.dtype not in PACKED or rhs.dtype not in PACKED:
        return f"{lhs.dtype} x {rhs.dtype} data is not MXFP8 / MXFP4 (§2.2)"
    if k % (WORDS * 32) or m % 2:
        return f"K = {k} not a multiple of 128 or M = {m} odd (§6.2)"
    return ""


# --- the MX loop nest -------------------------------------------------------------------------

@dataclass
class Strip:
    """The k-tiles of one operand's F columns, k-tile j at free offset j * width: x4
    data [K/4, F]; scales as 32-bit words, byte j % 4 of word column (j // 4) * width
    + f belonging to k-tile j (read through a stride-4 byte pattern, §3.1)."""
    data: isa.Tile              # uint32 (FP8) / uint16 (FP4), [128, nk * width]
    scale: isa.Tile             # uint32, [128, ceil(nk / 4) * width]
    width: int

    def scale_tile(self, j: int, rows: int, width: int, at: int = 0) -> isa.Tile:
        offset = self.scale.offset + ((j // 4) * self.width + at) * 4 + j % 4
        return self.scale.with_(dtype="uint8", num_partitions=rows, offset=offset,
                                free=(width,), strides=(4,))


class MxEmitter:
    """Emits the MX loop nest (module docstring) for out[B, M, N]. `lhs` / `rhs` are
    (data, scales, element type); FP4 data is the packed [B, F, K/4] words (mx_pack.py)."""

    def __init__(self, kb: KernelBuilder, lhs, rhs, out: DramTensor):
        self.kb, self.lhs, self.rhs, self.out = kb, lhs, rhs, out
        (self.b, self.m, _), self.n = lhs[0].shape, rhs[0].shape[1]
        self.k = lhs[1].shape[2] * GROUP                # (FP4 data comes packed: K / 4)
        self.words, self.pmax = self.k // WORDS, kb.target.partitions
        self.nk = -(-self.words // self.pmax)
        self.nt = min(GROUP_COLS, self.n)
        self.g = self.k // GROUP
        self.sw = self.pmax * min(STRIP_TILES, -(-self.m // self.pmax))   # strip width
        # one load's scale chunks: all are spread before the first is transposed
        spreads = max(len(self._scale_chunks(w)) for w in (self.nt, self.sw))
        self.raw = kb.ring(spreads, RAW_ROWS * self.g, lhs[1].dtype)
        self.nw = -(-self.nk // 4)                        # scale words per column
        self.spread = kb.ring(spreads, RAW_ROWS * self.nw * self.pmax, "uint32")
        lb, rb = (itemsize(WORD[op[2]]) + 1 for op in (lhs, rhs))  # word + scale byte
        per_strip = self.nk * self.sw * lb
        budget = int(free_sbuf(kb) * SBUF_SHARE) - 2 * self.nk * self.nt * rb \
            - OUT_BUFFERS * self.nt * 4
        strips = -(-self.m // self.sw)
        fit = max(1, min(strips, budget // per_strip))
        self.nstrips = -(-strips // -(-strips // fit))  # balanced blocks of strips
        self.strips = [self._strip(self.sw, WORD[lhs[2]]) for _ in range(self.nstrips)]
        self.groups = [self._strip(self.nt, WORD[rhs[2]]) for _ in range(2)]
        self.acc = kb.ring(kb.target.psum_banks, min(NT, self.nt), "float32", mem="psum")
        self.obuf = kb.ring(OUT_BUFFERS, self.nt, out.dtype)
        nq = kb.target.dma_queues
        self.load_q = itertools.cycle(range(nq - STORE_QUEUES))
        self.store_q = itertools.cycle(range(nq - STORE_QUEUES, nq))

    def _strip(self, width: int, word: str) -> Strip:
        return Strip(self.kb.tile(self.nk * width, word),
                     self.kb.tile(self.nw * width, "uint32"), width)

    def run(self) -> None:
        """Steps (batch, row block, column group) in order; DMAs in the order they are
        needed (each queue is FIFO, §3.4): the next step's rhs group as a step starts
        (double-buffered; in the first step after its lhs strips), the next block's
        lhs strip s right after the last step of a block has used strip s."""
        steps = [(bi, blk, grp) for bi in range(self.b)
                 for blk in tiles(self.m, self.nstrips * self.sw)
                 for grp in tiles(self.n, self.nt)]
        self._first_loads(steps[0])
        for si, (bi, blk, (n0, nt)) in enumerate(steps):
            nxt = steps[si + 1] if si + 1 < len(steps) else None
            strips = self._strips(blk)
            new = self._strips(nxt[1]) if nxt and nxt[:2] != (bi, blk) else []
            ahead = len(strips) - 1 if si == 0 else 0   # step 0: after the strips
            for i, (f0, fw, strip) in enumerate(strips):
                if i == ahead and nxt:
                    self._load(self.rhs, nxt[0], *nxt[2], self.groups[(si + 1) % 2])
                for c0, mt in tiles(fw, self.pmax):
                    self._tile(bi, strip, c0, mt, self.groups[si % 2], nt, f0 + c0, n0)
                if i < len(new):
                    self._load(self.lhs, nxt[0], new[i][0], new[i][1], strip)
        self.kb.release(self.acc, self.obuf, self.raw, self.spread,
                        *(t for s in self.strips + self.groups for t in (s.data, s.scale)))

    def _first_loads(self, step) -> None:
        """The first step's operands, in the order its matmuls use them: the rhs
        columns of the first PSUM bank (NT), the first lhs strip, the group's other
        columns, the other strips. Loading the whole group before the strips kept
        TensorE idle until nearly all of it had arrived (DMA engines are shared, §3.4)."""
        bi, blk, (n0, nt) = step
        first = min(NT, nt)
        (f0, fw, strip), *rest = self._strips(blk)
        self._load(self.rhs, bi, n0, first, self.groups[0])
        self._load(self.lhs, bi, f0, fw, strip)
        if nt > first:
            self._load(self.rhs, bi, n0 + first, nt - first, self.groups[0], at=first)
        for f0, fw, strip in rest:
            self._load(self.lhs, bi, f0, fw, strip)

    def _strips(self, blk: tuple[int, int]) -> list[tuple[int, int, Strip]]:
        """The strips (f0, width, strip) of row block `blk`."""
        mb0, mbn = blk
        return [(mb0 + f0, fw, strip) for (f0, fw), strip in
                zip(tiles(mbn, self.sw), self.strips)]

    def _tile(self, bi, strip: Strip, c0: int, mt: int, group: Strip, nt: int, m0: int,
              n0: int) -> None:
        """out[m0:m0+mt, n0:n0+nt]: per 512 columns a PSUM bank accumulating the K/512
        MX matmuls of row tile c0.. of `strip`, copied out in the result type; one
        store of the tile."""
        otile = sub(self.obuf.next(), mt, nt)
        base = (bi * self.m + m0) * self.n + n0
        for b0, bn in tiles(nt, NT):
            acc = sub(self.acc.next(), mt, bn)
            for j, (_, kw) in enumerate(tiles(self.words, self.pmax)):
                s_data, s_scale = self._ktile(strip, j, kw, mt, self.lhs[2], c0)
                m_data, m_scale = self._ktile(group, j, kw, bn, self.rhs[2], b0)
                self.kb.emit(isa.NcMatmulMx, dst=acc, stationary=s_data, moving=m_data,
                             stationary_scale=s_scale, moving_scale=m_scale,
                             accumulate=j > 0)
            self.kb.emit(isa.TensorCopy, dst=sub(otile, mt, bn, at=b0), src=acc,
                         engine=self.kb.evac_engine())
        self._store(otile, base, mt, nt)

    def _store(self, tile: isa.Tile, at: int, rows: int, cols: int) -> None:
        self.kb.emit(isa.DmaCopy, dst=self.kb.ap(self.out, at, ((self.n, rows), (1, cols))),
                     src=tile, dma_queue=next(self.store_q))

    def _ktile(self, strip: Strip, j: int, kw: int, width: int, dtype: str, at: int = 0):
        data = sub(strip.data, kw, width, at=j * strip.width + at)
        scale = strip.scale_tile(j, hw_mx.scale_partitions(kw), width, at)
        return data.with_(dtype=PACKED[dtype]), scale

    def _load(self, operand, bi: int, f0: int, width: int, strip: Strip,
              at: int = 0) -> None:
        """Data k-tiles by 4-byte dma_transpose from HBM; the scales of up to 128 c
        columns loaded as rows (c per partition), spread into words (`_spread`), and
        transposed four k-tiles at a time by SBUF->SBUF 4-byte dma_transposes (one per
        row of a partition, written with column stride c), which land group g of
        k-tile j in partition 32 (g // 4) + g % 4 (hw/mx.py), byte j % 4. Columns
        f0.. land at strip column `at`."""
        data, scales, elem = operand
        f = data.shape[1]
        # scale rows first: the spread is done by the time the scale transposes,
        # queued after the data's, reach the head of their (FIFO) queues
        spreads = [(c0, ct, c, self._spread(scales, bi, f0 + c0, ct, c))
                   for c0, ct, c in self._scale_chunks(width)]
        for j, (w0, kw) in enumerate(tiles(self.words, self.pmax)):
            src = self.kb.ap(data, (bi * f + f0) * self.words + w0,
                             ((self.words, width), (1, kw)), view=WORD[elem])
            self.kb.emit(isa.DmaTranspose,
                         dst=sub(strip.data, kw, width, at=j * strip.width + at),
                         src=src, dma_queue=next(self.load_q))
        for c0, ct, c, spread in spreads:
            pn = ct // c
            for i, jj in itertools.product(range(c), range(self.nw)):
                dst = sub(strip.scale, self.pmax, pn, at=jj * strip.width + at + c0 + i)
                self.kb.emit(isa.DmaTranspose,
                             src=sub(spread, pn, self.pmax, at=(i * self.nw + jj) * self.pmax),
                             dst=dst.with_(strides=(c,) if c > 1 else None),
                             dma_queue=next(self.load_q))

    def _scale_chunks(self, width: int) -> list[tuple[int, int, int]]:
        """(c0, columns, rows per partition c) of a load's scale rows: RAW_ROWS rows
        per partition where they divide the chunk, else one."""
        out = []
        for c0, ct in tiles(width, self.pmax * RAW_ROWS):
            if ct % RAW_ROWS == 0:
                out.append((c0, ct, RAW_ROWS))
            else:
                out += [(c0 + t0, tn, 1) for t0, tn in tiles(ct, self.pmax)]
        return out

    def _spread(self, scales: DramTensor, bi: int, f0: int, ft: int, c: int) -> isa.Tile:
        """Scale rows f0.. [ft, G], loaded c consecutive rows per partition -> words
        [ft / c, c, nw, 128]: group 16 j + 4 q + r of a row in word column 128 (j // 4)
        + 32 q + r, byte j % 4 (the partition and byte the transpose and the matmul
        want). One GpSimd copy per row and run of k-tiles."""
        pn, row = ft // c, self.nw * self.pmax * 4        # partitions, spread bytes per row
        raw = sub(self.raw.next(), pn, c * self.g)
        f = scales.shape[1]
        src = self.kb.ap(scales, (bi * f + f0) * self.g, ((c * self.g, pn), (1, c * self.g)))
        self.kb.emit(isa.DmaCopy, dst=raw, src=src, dma_queue=next(self.load_q))
        raw = raw.with_(dtype="uint8")                  # the E8M0 bytes as integers
        spread = sub(self.spread.next(), pn, c * self.nw * self.pmax)
        out = spread.with_(dtype="uint8", free=(c * row,))
        full, last = divmod(self.g, 16)                 # whole k-tiles, groups of the last
        quads, rest = divmod(full, 4)
        runs = [((quads, 4, 4, 4), (512, 1, 128, 4), 0, 0)] if quads else []
        if rest:
            runs.append(((rest, 4, 4), (1, 128, 4), quads * 64, quads * 512))
        if last:
            runs.append(((last // 4, 4), (128, 4), full * 16, quads * 512 + rest))
        for i, (shape, strides, s0, d0) in itertools.product(range(c), runs):
            self.kb.emit(isa.TensorCopy, src=sub(raw, pn, shape, at=i * self.g + s0),
                         dst=sub(out, pn, 1, at=i * row + d0).with_(free=shape, strides=strides),
                         engine=SPREAD)
        return spread
