"""mx_matmul without MX hardware: dequantize each operand to BF16, then a BF16 matmul.

Used on cores without `nc_matmul_mx` (Trn1 / Trn2, §2.2), for block scales it does
not take (nvfp4: 16 values per float8_e4m3fn scale; the MX mode takes E8M0 per 32,
§2.2, §4) and for shapes it does not take (mx_matmul.py). It costs what it says: a
`mx-dequantize` kernel per operand (VectorE / ScalarE) and a BF16 matmul at the BF16
rate; the kernel names in the profile read "mx-dequantize" and "mx-bf16-matmul", and
each kernel's notes say why the op is not an nc_matmul_mx ("mx_matmul: dequantize +
BF16 matmul: <reason>").

The result equals the MX one: an FP8 or FP4 value times a power of two is exact in
BF16 (7 fraction bits >= E4M3's 3 / E5M2's 2 / E2M1's 1) while it is a BF16 normal
(|v| >= 2**-126: scales far below 2**-110 round into BF16 subnormals; nc_matmul_mx
keeps them), and TensorE accumulates the exact products in FP32 as nc_matmul_mx does.
An E2M1 value times an E4M3 scale (nvfp4) has at most 2 + 4 significant bits: exact
in BF16's 8 as well (the product of the smallest, 0.5 * 2**-9, is a BF16 normal).

Dequantize: the data viewed as rows of `block` values (one scale each), `c` rows per
partition; an E8M0 byte becomes its FP32 scale by `bits << 23` (in int32) read as FP32
(byte 0, 2**-127, is FP32 subnormal: a max with 2**-127 sets it), an E4M3 scale by a
copy (the ALU widens it exactly, §4); each row is multiplied by its partition's scale
(`TensorScalar`, engines alternating).

Measured (4096^3 on one Trn2 core, tests/lower/test_mx_matmul.py): each dequantize
kernel takes 171 us for its 16 MiB in and 32 MiB out (DMA-bound: 137 us at 368 GB/s;
VectorE 143 us, ScalarE 109 us busy), the whole op 2103 us against 1760 us for the BF16
matmul alone. One instruction per tile instead of one per 32 values would need the
scales broadcast along the free axis, i.e. a stride-0 access pattern, which the model
refuses (hw/operands.py); and at the published costs (§6.3) a tensor_tensor of FP8
data and broadcast scales costs 2N cycles, what the TensorScalars cost now.
"""
from __future__ import annotations

from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .layout import tiles
from .matmul import MatmulEmitter
from .matmul_plan import Operand, make_plan, with_dma_transpose
from .registry import LowerCtx

ROWS = (128, 64, 32, 16, 8, 4, 2, 1)  # scale rows per partition (`_rows`): 128 rows of 32
                                # FP8 values load 4 KiB per partition per DMA and store
                                # 8 KiB, near the full DMA rate (§3.4; 512 B, the old
                                # widest, reached 21%: the kernel was DMA-bound)
E8M0_MIN = 2.0 ** -127          # E8M0 byte 0


def lower(ctx: LowerCtx, lhs: DramTensor, rhs: DramTensor, ls: DramTensor, rs: DramTensor,
          out: DramTensor, why: str = "") -> None:
    """`why`: the reason the op is not an nc_matmul_mx, noted on each kernel."""
    (b, m, k), n = lhs.shape, rhs.shape[1]
    note = f"mx_matmul: dequantize + BF16 matmul: {why}" if why else ""
    dl, dr = (_dequantize(ctx, x, s, note) for x, s in ((lhs, ls), (rhs, rs)))
    kb = ctx.next_kernel("mx-bf16-matmul")
    kb.notes.extend([note] if note else [])
    lop = Operand(dl, ((m * k, b),), (1, k), (k, m), "bfloat16", True)
    rop = Operand(dr, ((n * k, b),), (1, k), (k, n), "bfloat16", True)
    lop, rop = with_dma_transpose(lop, kb.target), with_dma_transpose(rop, kb.target)
    plan = make_plan(lop, rop, out.dtype, free_sbuf(kb), kb.target)
    MatmulEmitter(kb, lop, rop, out, plan).run()


def _dequantize(ctx: LowerCtx, x: DramTensor, s: DramTensor, note: str) -> DramTensor:
    """x [B, F, K] * its scales [B, F, K/block] -> a BF16 temporary [B, F, K]."""
    kb = ctx.next_kernel("mx-dequantize")
    kb.notes.extend([note] if note else [])
    d = ctx.temp(x.shape, "bfloat16")
    rows, block = s.size, x.shape[-1] // s.shape[-1]
    c = _rows(rows, kb.target.partitions)
    ins, outs = kb.ring(2, c * block, x.dtype), kb.ring(2, c * block, "bfloat16")
    rings = (kb.ring(2, c, s.dtype), kb.ring(2, c, "int32"))
    for p0, pn in tiles(rows // c, kb.target.partitions):
        xin, y = sub(ins.next(), pn, c * block), sub(outs.next(), pn, c * block)
        pattern = ((c * block, pn), (1, c * block))
        kb.dma(xin, kb.ap(x, p0 * c * block, pattern))
        sc = _scales(kb, s, p0, pn, c, rings)
        for r in range(c):
            kb.emit(isa.TensorScalar, dst=sub(y, pn, block, at=r * block),
                    data=sub(xin, pn, block, at=r * block), op0="multiply",
                    operand0=sub(sc, pn, 1, at=r), engine=kb.evac_engine())
        kb.dma(kb.ap(d, p0 * c * block, pattern), y)
    kb.release(ins, outs, *rings)
    return d


def _rows(rows: int, pmax: int) -> int:
    """Scale rows per partition: the widest that divides `rows` and still fills all
    partitions; below that, the widest up to 16 that divides."""
    fits = [r for r in ROWS if rows % r == 0]
    return next((r for r in fits if rows // r >= pmax), next(r for r in fits if r <= 16))


def _scales(kb: KernelBuilder, s: DramTensor, p0: int, pn: int, c: int, rings) -> isa.Tile:
    """FP32 scales [pn, c] of scale rows p0 * c ..: E8M0 bytes widened to int32,
    shifted into the FP32 exponent field, read as FP32, floored at 2**-127 (byte 0);
    E4M3 scales widened by a copy."""
    raw, word = sub(rings[0].next(), pn, c), sub(rings[1].next(), pn, c)
    kb.dma(raw, kb.ap(s, p0 * c, ((c, pn), (1, c))))                 # bit copy
    if s.dtype == "float8_e4m3fn":
        sc = word.with_(dtype="float32")
        kb.emit(isa.TensorCopy, dst=sc, src=raw)
        return sc
    kb.emit(isa.TensorCopy, dst=word, src=raw.with_(dtype="uint8"))  # shifts wrap at
    kb.emit(isa.TensorScalar, dst=word, data=word, op0="shift_left", operand0=23)  # 8 bits
    sc = word.with_(dtype="float32")
    kb.emit(isa.TensorScalar, dst=sc, data=sc, op0="max", operand0=E8M0_MIN)
    return sc


def free_sbuf(kb: KernelBuilder) -> int:
    """SBUF bytes per partition above the kernel's live allocations."""
    top = max((off + size for off, size in kb.sbuf.live.items()), default=0)
    return kb.sbuf.capacity - top
