"""mx_quantize: JAX's MX quantization of one operand (hlo_passes/passes/mx_quantize.py
gives the definition) as one kernel, bit-exact with JAX's jnp ops.

    x [rows, K] (f32 / bf16) -> q [rows, K] (float8_e4m3fn / e5m2 / float4_e2m1fn),
                                s [rows, K/32] (E8M0)

Rows on partitions, K in chunks of up to CHUNK values along the free axis. Per chunk:

1. `tensor_reduce` abs_max over each block of 32 (§6.2) -> amax [P, G];
2. d = amax / MAX rounded to x's type (VectorE computes in FP32 and rounds on output,
   §2.3, as XLA does for a bf16 divide); its FP32 bits b;
3. the E8M0 byte with JAX's round-up, on 32-bit integers (exact on VectorE's integer
   path): e = b >> 23, m = b & 0x7FFFFF, e + (m > 0)(e != 254)(1 - (e == 0)(m <= 2**22)),
   & 0xFF (JAX's uint8 cast wraps);
4. the scale 2**(byte - 127) as FP32 bits (byte << 23; byte 0 is 2**-127, a max with it)
   and its reciprocal, exact for powers of two;
5. per block, q' = x * (1 / scale) (`TensorScalar` with the block's [P, 1] reciprocal,
   VectorE and ScalarE alternating): exactly x / scale, which JAX computes in x's type
   (exact there too, except results below x's normal range, which round to +-0 in FP8
   either way);
6. one `TensorScalar` clips to [-MAX, MAX] and rounds to FP8 on output (RNE, §4).

NeuronCore-v4's `quantize_mx` (§2.3, §4) is not used: it picks the scale 2x the OCP
value (2**(floor(log2 amax) - emax + 1)), where JAX picks 2**ceil(log2(amax / MAX)),
half of it for most blocks, so its FP8 values differ from the CPU's.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .layout import tiles
from .registry import LowerCtx, register_lowering

BLOCK = 32                      # values per E8M0 scale (§4)
NV_BLOCK = 16                   # nvfp4: values per E4M3 scale
CHUNK = 2048                    # K values per partition per step: 2 KiB+ DMAs (§3.4)
E8M0_MIN = 2.0 ** -127          # the scale of byte 0
MANT, EXP_MAX, HALF = 0x7FFFFF, 254, 0x400000


@register_lowering("mx_quantize")
def _mx_quantize_lower(ctx: LowerCtx, x: DramTensor, *, block: int,
                       global_scale: float | None = None) -> None:
    if global_scale is not None:                # nvfp4 (mx_quantize_nv.py)
        return NvQuantizeEmitter(ctx.kb, x, *ctx.outs, global_scale).run()
    assert block == BLOCK, block
    QuantizeEmitter(ctx.kb, x, *ctx.outs).run()


class QuantizeEmitter:
    """Emits the kernel (module docstring) for x [..., K] -> q [..., K], s [..., K/32]."""

    def __init__(self, kb: KernelBuilder, x: DramTensor, q: DramTensor, s: DramTensor):
        self.kb, self.x, self.q, self.s = kb, x, q, s
        self.k = x.shape[-1]
        self.rows = x.size // self.k
        self.top = float(ml_dtypes.finfo(getattr(ml_dtypes, q.dtype)).max)
        self.kc = min(CHUNK, self.k)
        gc = self.kc // BLOCK
        self.xs, self.ys = kb.ring(2, self.kc, x.dtype), kb.ring(2, self.kc, "float32")
        self.qs = kb.ring(2, self.kc, q.dtype)
        self.small = {n: kb.ring(2, gc, dt) for n, dt in (
            ("amax", "float32"), ("d", x.dtype), ("bits", "float32"), ("e", "uint32"),
            ("m", "uint32"), ("a", "uint32"), ("b", "uint32"), ("byte", "uint8"),
            ("scale", "int32"), ("rcp", "float32"))}

    def run(self) -> None:
        for p0, pn in tiles(self.rows, self.kb.target.partitions):
            for k0, kn in tiles(self.k, self.kc):
                self._chunk(p0, pn, k0, kn)
        self.kb.release(self.xs, self.ys, self.qs, *self.small.values())

    def _chunk(self, p0: int, pn: int, k0: int, kn: int) -> None:
        kb, g, g0 = self.kb, kn // BLOCK, k0 // BLOCK
        t = {n: sub(r.next(), pn, g) for n, r in self.small.items()}
        xt = sub(self.xs.next(), pn, kn)
        kb.dma(xt, kb.ap(self.x, p0 * self.k + k0, ((self.k, pn), (1, kn))))
        kb.emit(isa.TensorReduce, dst=t["amax"], data=xt.with_(free=(g, BLOCK)),
                op="abs_max")
        kb.emit(isa.TensorScalar, dst=t["d"], data=t["amax"], op0="divide", operand0=self.top)
        bits = t["d"]
        if self.x.dtype != "float32":
            kb.emit(isa.TensorCopy, dst=t["bits"], src=t["d"])       # exact widening
            bits = t["bits"]
        self._scale_byte(t, bits.with_(dtype="uint32"))
        self._reciprocal(t)
        y = sub(self.ys.next(), pn, kn)
        for j in range(g):
            kb.emit(isa.TensorScalar, dst=sub(y, pn, BLOCK, at=j * BLOCK),
                    data=sub(xt, pn, BLOCK, at=j * BLOCK), op0="multiply",
                    operand0=sub(t["rcp"], pn, 1, at=j), engine=kb.evac_engine())
        qt = sub(self.qs.next(), pn, kn)
        kb.emit(isa.TensorScalar, dst=qt, data=y, op0="max", operand0=-self.top,
                op1="min", operand1=self.top)
        kb.dma(kb.ap(self.q, p0 * self.k + k0, ((self.k, pn), (1, kn))), qt)
        g_all = self.k // BLOCK
        kb.dma(kb.ap(self.s, p0 * g_all + g0, ((g_all, pn), (1, g))),
               t["byte"].with_(dtype=self.s.dtype))

    def _scale_byte(self, t: dict, b: isa.Tile) -> None:
        """t["byte"] = uint8(e + round_up) of FP32 bits b (JAX's round-up to E8M0)."""
        ts = self._ts
        ts(t["e"], b, "shift_right_logical", 23)
        ts(t["m"], b, "bitwise_and", MANT)
        ts(t["a"], t["m"], "is_gt", 0)
        ts(t["b"], t["e"], "not_equal", EXP_MAX)
        self._tt(t["a"], t["a"], t["b"], "multiply")          # m > 0 and e != 254
        ts(t["b"], t["e"], "is_equal", 0)
        ts(t["m"], t["m"], "is_le", HALF)
        self._tt(t["b"], t["b"], t["m"], "multiply")          # e == 0 and m <= 2**22
        self.kb.emit(isa.TensorScalar, dst=t["b"], data=t["b"], op0="subtract",
                     operand0=1, reverse0=True)               # not that
        self._tt(t["a"], t["a"], t["b"], "multiply")
        self._tt(t["e"], t["e"], t["a"], "add")
        ts(t["byte"], t["e"], "bitwise_and", 0xFF)            # uint8(): wraps

    def _reciprocal(self, t: dict) -> None:
        """t["rcp"] = 1 / 2**(byte - 127) (byte 0: 1 / 2**-127), exact."""
        self.kb.emit(isa.TensorCopy, dst=t["scale"], src=t["byte"])   # widen: shifts wrap
        self._ts(t["scale"], t["scale"], "shift_left", 23)           # at the type's width
        sc = t["scale"].with_(dtype="float32")
        self._ts(sc, sc, "max", E8M0_MIN)
        self.kb.emit(isa.TensorScalar, dst=t["rcp"], data=sc, op0="divide", operand0=1.0,
                     reverse0=True)

    def _ts(self, dst: isa.Tile, data: isa.Tile, op: str, operand) -> None:
        self.kb.emit(isa.TensorScalar, dst=dst, data=data, op0=op, operand0=operand)

    def _tt(self, dst: isa.Tile, a: isa.Tile, b: isa.Tile, op: str) -> None:
        self.kb.emit(isa.TensorTensor, dst=dst, data1=a, data2=b, op=op)


class NvQuantizeEmitter(QuantizeEmitter):
    """nvfp4 (hlo_passes/passes/mx_quantize_nv.py gives the definition). XLA divides by
    a broadcast as a multiply by the FP32 reciprocal (measured on the CPU backend: an
    exact division differs on ties of the FP4 rounding), folding the two constants of
    q' = x / g / s into one (x * ((1 / g) * (1 / s)), measured the same way), and so
    does this kernel: per chunk r = x * (1 / g), amax per 16 (`tensor_reduce`),
    s = E4M3(clip(amax * (1 / 6), 0, 448)) rounded on output (RNE, §4), c = (1 / s) *
    (1 / g) in FP32, per block q' = x * c (`TensorScalar` with the block's [P, 1] c,
    VectorE and ScalarE alternating), one clip to [-6, 6] rounding to FP4 on output."""

    def __init__(self, kb, x, q, s, global_scale: float):
        self.kb, self.x, self.q, self.s = kb, x, q, s
        self.rcp_gs = float(np.float32(1) / np.float32(global_scale))
        self.k = x.shape[-1]
        self.rows = x.size // self.k
        self.top = float(ml_dtypes.finfo(getattr(ml_dtypes, q.dtype)).max)
        self.scale_top = float(ml_dtypes.finfo(getattr(ml_dtypes, s.dtype)).max)
        self.kc = min(CHUNK, self.k)
        gc = self.kc // NV_BLOCK
        self.xs, self.ys = kb.ring(2, self.kc, x.dtype), kb.ring(2, self.kc, "float32")
        self.rs, self.qs = kb.ring(2, self.kc, "float32"), kb.ring(2, self.kc, q.dtype)
        self.small = {n: kb.ring(2, gc, dt) for n, dt in (
            ("amax", "float32"), ("d", "float32"), ("s", s.dtype), ("rcp", "float32"))}

    def run(self) -> None:
        super().run()
        self.kb.release(self.rs)

    def _chunk(self, p0: int, pn: int, k0: int, kn: int) -> None:
        kb, b = self.kb, NV_BLOCK
        g, g0 = kn // b, k0 // b
        t = {n: sub(r.next(), pn, g) for n, r in self.small.items()}
        xt, r = sub(self.xs.next(), pn, kn), sub(self.rs.next(), pn, kn)
        kb.dma(xt, kb.ap(self.x, p0 * self.k + k0, ((self.k, pn), (1, kn))))
        self._ts(r, xt, "multiply", self.rcp_gs)
        kb.emit(isa.TensorReduce, dst=t["amax"], data=r.with_(free=(g, b)), op="abs_max")
        self._ts(t["d"], t["amax"], "multiply", float(np.float32(1) / np.float32(self.top)))
        kb.emit(isa.TensorScalar, dst=t["s"], data=t["d"], op0="max", operand0=0.0,
                op1="min", operand1=self.scale_top)
        kb.emit(isa.TensorScalar, dst=t["rcp"], data=t["s"], op0="divide", operand0=1.0,
                reverse0=True)                                  # FP32 1 / s (s widens)
        self._ts(t["rcp"], t["rcp"], "multiply", self.rcp_gs)    # XLA's folded constant
        y = sub(self.ys.next(), pn, kn)
        for j in range(g):
            kb.emit(isa.TensorScalar, dst=sub(y, pn, b, at=j * b),
                    data=sub(xt, pn, b, at=j * b), op0="multiply",
                    operand0=sub(t["rcp"], pn, 1, at=j), engine=kb.evac_engine())
        qt = sub(self.qs.next(), pn, kn)
        kb.emit(isa.TensorScalar, dst=qt, data=y, op0="max", operand0=-self.top,
                op1="min", operand1=self.top)
        kb.dma(kb.ap(self.q, p0 * self.k + k0, ((self.k, pn), (1, kn))), qt)
        g_all = self.k // b
        kb.dma(kb.ap(self.s, p0 * g_all + g0, ((g_all, pn), (1, g))), t["s"])
