"""mx_matmul: JAX's block-scaled `scaled_matmul` (jax_trn/jax_mx.py) as `nc_matmul_mx`.

    out[b, m, n] = sum_k lhs[b, m, k] s_l[b, m, k // 32] rhs[b, n, k] s_r[b, n, k // 32]

lhs [B, M, K] and rhs [B, N, K] are MXFP8 (float8_e4m3fn / float8_e5m2), the scales
E8M0 (float8_e8m0fnu), FP32 accumulation, the result rounded once to its type.

On NeuronCore-v4 (`Target.mx_matmul`, §2.2) the op runs as `nc_matmul_mx` at 4x the
BF16 rate: K = 512 per matmul, 128 partitions x 4 values packed in one 32-bit element.
Both operands keep K contiguous in HBM, so four consecutive K values of a row are one
32-bit word, i.e. one `float8_*_x4` element: a 4-byte `dma_transpose` (§3.4) of the
[F, K/4] words gives the [K/4, F] tile the matmul reads, bit for bit. The scale tile
of a k-tile holds group g (rows 32g..32g+31 of K) in partition 32 (g // 4) + g % 4
(hw/mx.py); those are rows of the transposed scales [G, F] (G = K/32), so the scales
are transposed once first (`_transpose_scales`: bytes widened to 16 bits,
`dma_transpose`, narrowed; 1/32 of the data) and each scale tile is 4 row-DMAs.

Loop nest: per batch, a block of lhs row tiles stays resident (as many as fit SBUF
next to two rhs column groups of 512), every rhs column group streams past it
(double-buffered), and each (row tile, column group) accumulates its K/512 matmuls in
one PSUM bank, is copied out in the result type and stored.

Elsewhere (no MX: Trn1 / Trn2), for K not a multiple of 128, or an odd M, the op runs
as dequantize + BF16 matmul (mx_dequant.py), whose kernels say so in their names.
"""
from __future__ import annotations

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
SBUF_SHARE = 0.9                # of the kernel's free SBUF the operands may take


@register_lowering("mx_matmul")
def _mx_matmul_lower(ctx: LowerCtx, lhs: DramTensor, rhs: DramTensor, ls: DramTensor,
                     rs: DramTensor) -> None:
    out = ctx.outs[0]
    (b, m, k), n = lhs.shape, rhs.shape[1]
    ctx.kb.flops += 2 * b * m * n * k
    if not native(ctx.target, lhs, rhs):
        return mx_dequant.lower(ctx, lhs, rhs, ls, rs, out)
    lst, rst = (_transpose_scales(ctx, s) for s in (ls, rs))
    ctx.next_kernel("mx_matmul")
    MxEmitter(ctx.kb, (lhs, lst), (rhs, rst), out).run()


def native(target, lhs: DramTensor, rhs: DramTensor) -> bool:
    """Runs as nc_matmul_mx: an MX core, MXFP8 data, whole 128-row k-tiles (32
    partitions, §6.2) and even row tiles (stationary free size, §6.2)."""
    k, m = lhs.shape[2], lhs.shape[1]
    return (target.mx_matmul and lhs.dtype in PACKED and rhs.dtype in PACKED
            and k % (WORDS * 32) == 0 and m % 2 == 0)


# --- the scales, transposed once -----------------------------------------------------------

def _transpose_scales(ctx: LowerCtx, s: DramTensor) -> DramTensor:
    """E8M0 scales [B, F, G] -> [B, G, F] in HBM: rows of F tiles naturally, widened
    to 16 bits (VectorE; dma_transpose is 2-/4-byte only, §3.4), transposed by an
    SBUF->SBUF dma_transpose, narrowed back, stored."""
    kb, (b, f, g) = ctx.kb, s.shape
    st = ctx.temp((b, g, f), "uint8")
    pmax = kb.target.partitions
    raw, wide = kb.ring(2, g, s.dtype), kb.ring(2, g, "uint16")
    twide, tnarrow = kb.ring(2, pmax, "uint16"), kb.ring(2, pmax, "uint8")
    for bi in range(b):
        for f0, ft in tiles(f, pmax):
            r, w = sub(raw.next(), ft, g), sub(wide.next(), ft, g)
            kb.dma(r, kb.ap(s, (bi * f + f0) * g, ((g, ft), (1, g))))     # bit copy
            kb.emit(isa.TensorCopy, dst=w, src=r.with_(dtype="uint8"))     # the bytes
            for g0, gc in tiles(g, pmax):
                t = sub(twide.next(), gc, ft)
                kb.emit(isa.DmaTranspose, dst=t, src=sub(w, ft, gc, at=g0),
                        dma_queue=kb.next_queue())
                t8 = sub(tnarrow.next(), gc, ft)
                kb.emit(isa.TensorCopy, dst=t8, src=t)
                kb.dma(kb.ap(st, (bi * g + g0) * f + f0, ((f, gc), (1, ft))), t8)
    kb.release(raw, wide, twide, tnarrow)
    return st


# --- the MX loop nest -------------------------------------------------------------------------

@dataclass
class Strip:
    """The k-tiles of one operand's F columns: x4 data [K/4, F] and scales, both in
    one SBUF block each, k-tile j at free offset j * width."""
    data: isa.Tile              # uint32 words, [128, nk * width]
    scale: isa.Tile             # uint8, [128, nk * width]
    width: int


class MxEmitter:
    """Emits the MX loop nest (module docstring) for out[B, M, N]."""

    def __init__(self, kb: KernelBuilder, lhs, rhs, out: DramTensor):
        self.kb, self.lhs, self.rhs, self.out = kb, lhs, rhs, out
        (self.b, self.m, self.k), self.n = lhs[0].shape, rhs[0].shape[1]
        self.words, self.pmax = self.k // WORDS, kb.target.partitions
        self.nk = -(-self.words // self.pmax)
        self.nt = min(NT, self.n)
        per_row_tile = self.nk * self.pmax * 5           # 4 data bytes + 1 scale byte
        budget = int(_free_sbuf(kb) * SBUF_SHARE) - 2 * self.nk * self.nt * 5 \
            - 2 * self.nt * 4
        self.mtiles = max(1, min(-(-self.m // self.pmax), budget // per_row_tile))
        self.strips = [self._strip(self.pmax) for _ in range(self.mtiles)]
        self.groups = [self._strip(self.nt) for _ in range(2)]
        self.acc = kb.ring(kb.target.psum_banks, self.nt, "float32", mem="psum")
        self.obuf = kb.ring(2, self.nt, out.dtype)

    def _strip(self, width: int) -> Strip:
        return Strip(self.kb.tile(self.nk * width, "uint32"),
                     self.kb.tile(self.nk * width, "uint8"), width)

    def run(self) -> None:
        block = self.mtiles * self.pmax
        for bi in range(self.b):
            for mb0, mbn in tiles(self.m, block):
                self._block(bi, mb0, mbn)
        self.kb.release(self.acc, self.obuf, *(t for s in self.strips + self.groups
                                                for t in (s.data, s.scale)))

    def _block(self, bi: int, mb0: int, mbn: int) -> None:
        mtiles = [(mb0 + m0, mt) for m0, mt in tiles(mbn, self.pmax)]
        for (m0, mt), strip in zip(mtiles, self.strips):
            self._load(self.lhs, bi, m0, mt, strip)
        for gi, (n0, nt) in enumerate(tiles(self.n, self.nt)):
            group = self.groups[gi % 2]
            self._load(self.rhs, bi, n0, nt, group)
            for (m0, mt), strip in zip(mtiles, self.strips):
                self._tile(bi, strip, mt, group, nt, m0, n0)

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
        self.kb.dma(self.kb.ap(self.out, base, ((self.n, mt), (1, nt))), otile)

    def _ktile(self, strip: Strip, j: int, kw: int, width: int, dtype: str):
        data = sub(strip.data, kw, width, at=j * strip.width)
        rows = hw_mx.scale_partitions(kw)
        scale = sub(strip.scale, rows, width, at=j * strip.width)
        return data.with_(dtype=PACKED[dtype]), scale

    def _load(self, operand, bi: int, f0: int, width: int, strip: Strip) -> None:
        """Data k-tiles by 4-byte dma_transpose; per k-tile and quadrant, the scale rows
        of its (up to) 4 groups into the quadrant's first partitions (hw/mx.py)."""
        data, scales = operand
        f, g = data.shape[1], scales.shape[1]
        for j, (w0, kw) in enumerate(tiles(self.words, self.pmax)):
            src = self.kb.ap(data, (bi * f + f0) * self.words + w0,
                             ((self.words, width), (1, kw)), view="uint32")
            dst = sub(strip.data, kw, width, at=j * strip.width)
            self.kb.emit(isa.DmaTranspose, dst=dst, src=src, dma_queue=self.kb.next_queue())
            groups = kw * WORDS // GROUP
            for q, (g0, gn) in enumerate(tiles(groups, 4)):
                rows = sub(strip.scale, gn, width, at=j * strip.width).with_(
                    start_partition=32 * q)
                first = (bi * g + j * self.pmax * WORDS // GROUP + g0) * f + f0
                self.kb.dma(rows, self.kb.ap(scales, first, ((f, gn), (1, width))))


def _free_sbuf(kb: KernelBuilder) -> int:
    top = max((off + size for off, size in kb.sbuf.live.items()), default=0)
    return kb.sbuf.capacity - top
