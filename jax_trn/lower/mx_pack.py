"""mx-pack-fp4: float4_e2m1fn data [B, F, K] -> float4_e2m1fn_x4 words [B, F, K/4] in HBM.

`nc_matmul_mx` reads FP4 as `float4_e2m1fn_x4`: 16-bit elements holding four E2M1
codes, value i in nibble i (§2.2, §4; hw/dtypes.py). Our HBM holds a float4_e2m1fn
tensor one value per byte (as JAX hands it over, hw/dtypes.py), so before the MX loop
nest each FP4 operand is packed once into an HBM temporary of K/4 words, which the loop
nest then loads at 0.5 byte per value by 2-byte `dma_transpose` (mx_matmul.py). On real
hardware FP4 weights would sit in HBM packed already; this kernel is the price of our
byte-per-value storage, and it is named for it in the profile.

A 32-bit word w of four consecutive codes b0..b3 (one per byte, high nibbles 0, the
canonical codes every cast writes) becomes the 16-bit word b0 | b1 << 4 | b2 << 8 |
b3 << 12 in five integer ALU instructions (§2.3, §2.5: bitwise ops run natively on
integer tiles):

    u  = w | (w >> 4)              byte 0: b0 | b1 << 4, byte 2: b2 | b3 << 4
    lo = u & 0xFF
    hi = (u >> 8) & 0xFF00
    x4 = lo | hi                   written as uint16 (the low half)

Tiles alternate between VectorE and GpSimdE; loads and stores are 4 KiB / 2 KiB per
partition.
"""
from __future__ import annotations

from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .layout import tiles
from .builder import sub
from .registry import LowerCtx

WORDS = 1024                    # 32-bit words (4 codes each) per partition per tile:
                                # 4 KiB loads, 2 KiB stores (§3.4)
ENGINES = ("vector", "gpsimd", "vector", "gpsimd", "vector")  # the integer ALUs, 3:2
                                # (GpSimdE takes ~1.4x as long per tile, measured)
BUFFERS = 3                     # tiles in flight: load, compute, store overlap


def pack(ctx: LowerCtx, x: DramTensor) -> DramTensor:
    """A uint16 HBM temporary [B, F, K/4] of `x`'s float4_e2m1fn_x4 words."""
    kb = ctx.next_kernel("mx-pack-fp4")
    out = ctx.temp((*x.shape[:-1], x.shape[-1] // 4), "uint16")
    words = x.size // 4
    pmax = kb.target.partitions
    c = _columns(words, pmax)
    rings = {name: kb.ring(BUFFERS, c, dt) for name, dt in
             (("w", "uint32"), ("t", "uint32"), ("lo", "uint32"), ("hi", "uint32"),
              ("x4", "uint16"))}
    for i, (r0, rn) in enumerate(tiles(words // c, pmax)):
        t = {name: sub(ring.next(), rn, c) for name, ring in rings.items()}
        pattern = ((c, rn), (1, c))
        kb.dma(t["w"], kb.ap(x, r0 * c, pattern, view="uint32"))
        _pack_tile(kb, t, ENGINES[i % len(ENGINES)])
        kb.dma(kb.ap(out, r0 * c, pattern), t["x4"])
    kb.release(*rings.values())
    return out


def _pack_tile(kb, t: dict, engine: str) -> None:
    """The five instructions of the module docstring on one tile."""
    ts, tt = isa.TensorScalar, isa.TensorTensor
    kb.emit(ts, dst=t["t"], data=t["w"], op0="shift_right_logical", operand0=4, engine=engine)
    kb.emit(tt, dst=t["t"], data1=t["w"], data2=t["t"], op="bitwise_or", engine=engine)
    kb.emit(ts, dst=t["lo"], data=t["t"], op0="bitwise_and", operand0=0xFF, engine=engine)
    kb.emit(ts, dst=t["hi"], data=t["t"], op0="shift_right_logical", operand0=8,
            op1="bitwise_and", operand1=0xFF00, engine=engine)
    kb.emit(tt, dst=t["x4"], data1=t["lo"], data2=t["hi"], op="bitwise_or", engine=engine)


def _columns(words: int, pmax: int) -> int:
    """Words per partition of a tile: up to WORDS, a divisor of `words`, filling all
    partitions where the tensor is large enough."""
    for c in (WORDS, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1):
        if words % c == 0 and (words // c >= pmax or c == 1):
            return c
    return 1
