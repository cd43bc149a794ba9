"""Elementwise math with no single instruction: short instruction sequences on tiles.

Each rule here is a `TILE_OPS` entry (tileops/__init__.py) whose `scratch` extra
[parts, free] scratch tiles come after its operands (the Evaluator appends them,
regions.py): FP32 for float ops, so a bf16 op rounds once on its last instruction, the
operand's type for integer ops. Everything runs on the engines; nothing is precomputed on the
host. Costs are per element tile (V = VectorE, S = ScalarE, G = GpSimd instructions).

Rounding (floor, ceil, round_nearest_even, round_nearest_afz): the ALU has no round
op (§6.2), so `_round_mag` uses the FP32 "magic number": for 0 <= a <= 2**23,
(a + 2**23) - 2**23 is a rounded to the nearest integer, ties to even, because the sum
has unit ulp; it rounds m = min(|x|, 2**23) and adds the step rne(m) - m (exact) to
|x|, so |x| >= 2**23 (already integral) comes back exactly.
The sign comes back as mag * (1 - 2 * (x + 1/x < 0)), which keeps -0 (ScalarE `sign`
would map -0 to +0 and cost an engine hop). floor / ceil then correct by one where the
rounded value overshoots (ceil as -floor(-x), so that ceil(-0.7) is -0). 7-10 VectorE
instructions.

exponential_minus_one: exp(x) - 1 loses all relative precision for small |x|, so for
|x| < 0.5 it is 2t / (1 - t) with t = tanh(x / 2) (ScalarE tanh has no range limit); a
VectorE `select` picks the branch. 5 V + 2 S. (log1p, log, sqrt, rsqrt: ranged.py; sin,
cos, tan: trig.py.)

cbrt: |x| ** C1 * |x| ** C2 with x's sign, the powers on GpSimd (the only engine with
`power`, §6.2), C1 the float32 just below 1/3 and C2 = float32(1/3 - C1) ~ 2e-8: one
power of 1/3 rounded to float32 is off by |ln x| * 1e-8 relatively (17 ulps at 1e-38),
the second factor, within 2e-6 of 1, puts that back. <= 2 ulps. 2 G + 4 V.

atan2(y, x): ScalarE `arctan` is valid on [-pi/2, pi/2], so it takes
min(|x|, |y|) / max(|x|, |y|) in [0, 1] (a finite value over an infinity is 0; inf / inf
is made 1 by a select: pi/4 and its octants); the octant fix-ups (pi/2 - a, pi - a, the
sign of y) are compares and selects on VectorE, "negative" meaning v + 1/v < 0 so that
-0 counts (IEEE atan2(+-0, -0) = +-pi). 17 V + 1 S.

is_finite: x * 0 == 0 (0 for finite x, NaN for inf / NaN) in one VectorE tensor_scalar.

popcnt / count_leading_zeros (32-bit integers): the SWAR bit count on GpSimd
(shift_right_logical / bitwise_and / add, then a multiply by 0x01010101 whose top byte
is the count). clz smears the highest set bit right (5 shift+or pairs) and returns
32 - popcnt. 9 G (popcnt), 19 G (clz). No ALU bit-count op exists (§6.2). 8/16-bit
operands are zero-extended to 32 bits first (clz then subtracts the extension), 64-bit
ones are counted as two 32-bit words (popcnt: the sum; clz: clz(high), plus clz(low)
where high is 0).

sign of an integer: clamp(x, -1, 1), one GpSimd tensor_scalar. Of a float: ScalarE
`sign`, then x itself where x == 0 (ScalarE maps -0 to +0, XLA keeps it). 1 S + 2 V.

reduce_precision(x, exponent_bits=e, mantissa_bits=m): XLA's bit algorithm on the
operand's own bits (f32 / bf16 / f16 seen as uint32 / uint16, SBUF is untyped §3.1) in
GpSimd integer lanes: round the mantissa to m bits, ties to even (add the bit above
the cut plus 2**(cut-1) - 1, clear the cut bits); then exponents above e's range
become +-inf and those at or below its smallest normal +-0 (no denormals, as XLA);
NaN inputs come back unchanged. A stage the type already satisfies is skipped.
<= 11 G.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from hlo_passes import ir
from jax_trn.hw import isa

from ..errors import LoweringError
from .core import ACTIVATION, TileRule, act, engine_for, select, stt, tiles, ts, tt

_F32 = np.float32
TWO23 = 8388608.0
PI = float(_F32(np.pi))
HALF_PI = float(_F32(np.pi / 2))
TINY = 1e-30
NORMAL_MIN = float(np.finfo(np.float32).tiny)     # a subnormal immediate is flushed
CBRT_C1 = 0.3333333134651184                    # the float32 just below 1/3
CBRT_C2 = 1.9868215517249155e-08                # float32(1/3 - CBRT_C1)


# --- rounding --------------------------------------------------------------------------

def _round_mag(kb, t, x, d):
    """t = |x| rounded to the nearest integer, ties to even (d: scratch).

    m = min(|x|, 2**23) is rounded with the magic number, and the rounding step
    rne(m) - m (exact: the two are within 0.5 of each other) is added to |x|: below
    2**23 that gives rne(|x|), from 2**23 on (|x| already integral) |x| + 0 exactly."""
    ts(kb, d, x, "abs_max", 0.0, "min", TWO23)
    ts(kb, t, d, "add", TWO23, "subtract", TWO23)
    tt(kb, t, t, d, "subtract")
    stt(kb, t, x, "abs_max", 0.0, "add", t)


def _with_sign(kb, dst, mag, x, s):
    """dst = mag with x's sign, -0 included: mag * (1 - 2 * negative(x))."""
    _negative(kb, s, x, -2.0)
    stt(kb, dst, s, "add", 1.0, "multiply", mag)


def _negative(kb, p, v, scale=1.0):
    """p = scale where v < 0 or v is -0, else 0: v + 1/v < 0 (1/-0 = -inf)."""
    kb.emit(isa.ScalarTensorTensor, dst=p, data=v, op0="divide", operand0=1.0,
            reverse0=True, op1="add", operand1=v)
    ts(kb, p, p, "is_lt", 0.0, "multiply", scale)


def _round_even(kb, dst, srcs, step):
    (x,), (t, s) = tiles(srcs, 1)
    _round_mag(kb, t, x, s)
    _with_sign(kb, dst, t, x, s)


def _round_afz(kb, dst, srcs, step):
    """Ties away from zero: rne(|x|) + 1 where |x| - rne(|x|) is exactly 0.5."""
    (x,), (t, s) = tiles(srcs, 1)
    _round_mag(kb, t, x, s)
    stt(kb, s, x, "abs_max", 0.0, "subtract", t)
    ts(kb, s, s, "is_equal", 0.5)
    tt(kb, t, t, s, "add")
    _with_sign(kb, dst, t, x, s)


def _floor_ceil(kb, dst, srcs, step):
    """floor: rne(x), minus one where it is above x. ceil(x) = -floor(-x), negated
    exactly at the end: rne(x) + (rne(x) < x) would give +0 for x in (-1, -0.5]."""
    (x,), (t, s) = tiles(srcs, 1)
    _round_mag(kb, t, x, s)
    if step.kind == "floor":
        _with_sign(kb, t, t, x, s)
        tt(kb, s, t, x, "is_gt")
        return tt(kb, dst, t, s, "subtract")
    _negative(kb, s, x, 2.0)
    stt(kb, t, s, "subtract", 1.0, "multiply", t)  # rne(-x): the magnitude, -x's sign
    stt(kb, s, t, "multiply", -1.0, "is_lt", x)    # rne(-x) > -x
    tt(kb, t, t, s, "subtract")                    # floor(-x)
    return ts(kb, dst, t, "multiply", -1.0)


# --- logs and exponentials ---------------------------------------------------------------

def _small(kb, p, x):
    """p = |x| < 0.5."""
    ts(kb, p, x, "abs_max", 0.0, "is_lt", 0.5)


def _exponential_minus_one(kb, dst, srcs, step):
    (x,), (t, e, p) = tiles(srcs, 1)
    act(kb, t, x, "tanh", scale=0.5)
    ts(kb, e, t, "subtract", 1.0, rev0=True)
    stt(kb, t, t, "multiply", 2.0, "divide", e)
    act(kb, e, x, "exp")
    ts(kb, e, e, "subtract", 1.0)
    _small(kb, p, x)
    select(kb, dst, p, t, e)


def _cbrt(kb, dst, srcs, step):
    (x,), (t, s) = tiles(srcs, 1)
    ts(kb, t, x, "abs_max", 0.0, "pow", CBRT_C1, engine="gpsimd")
    ts(kb, s, x, "abs_max", 0.0, "pow", CBRT_C2, engine="gpsimd")
    tt(kb, t, t, s, "multiply")
    _with_sign(kb, dst, t, x, s)


def _atan2(kb, dst, srcs, step):
    """The ratio of the magnitudes (1 where both are infinite: dst holds that predicate
    meanwhile), its arctan, then the octant."""
    (y, x), (ay, ax, a, p) = tiles(srcs, 2)
    ts(kb, ay, y, "abs_max", 0.0)
    ts(kb, ax, x, "abs_max", 0.0)
    tt(kb, a, ay, ax, "min")
    ts(kb, dst, a, "is_equal", float("inf"))
    stt(kb, p, ax, "max", NORMAL_MIN, "max", ay)  # max(ax, ay), 0/0 -> 0 (not 1e-30:
                                                  # that ruined parts below it)
    tt(kb, a, a, p, "divide")
    select(kb, a, dst, dst, a)
    act(kb, a, a, "arctan")                      # in [0, pi/4]
    tt(kb, p, ay, ax, "is_gt")
    ts(kb, ay, a, "subtract", HALF_PI, rev0=True)
    select(kb, a, p, ay, a)                      # [0, pi/2]
    _negative(kb, p, x)
    ts(kb, ay, a, "subtract", PI, rev0=True)
    select(kb, a, p, ay, a)                      # [0, pi]
    _negative(kb, p, y, -2.0)
    stt(kb, dst, p, "add", 1.0, "multiply", a)


def _is_finite(kb, dst, srcs, step):
    return ts(kb, dst, srcs[0].tile, "multiply", 0.0, "is_equal", 0.0)


# --- integers --------------------------------------------------------------------------------

def _words(kb, x, c, d, kind: str):
    """(bit width of integer x, its low 32-bit word): x itself for 32-bit types, else
    c = x zero-extended (the low word; d = the high word of 64-bit x)."""
    if not ir.is_int(x.dtype):
        raise LoweringError(f"{kind} needs an integer operand, not {x.dtype}")
    width = 8 * ir.np_dtype(x.dtype).itemsize
    if width == 32:
        return width, x
    ts(kb, c, x, "bitwise_and", (1 << min(width, 32)) - 1, engine="gpsimd")
    if width == 64:
        ts(kb, d, x, "shift_right_logical", 32, engine="gpsimd")
    return width, c


def _popcnt_into(kb, dst, x, a, b, clz=False):
    """SWAR bit count of x (a, b: scratch; x may be a); clz: 32 - count."""
    g = "gpsimd"
    ts(kb, b, x, "shift_right_logical", 1, "bitwise_and", 0x55555555, engine=g)
    tt(kb, a, x, b, "subtract", engine=g)
    ts(kb, b, a, "shift_right_logical", 2, "bitwise_and", 0x33333333, engine=g)
    ts(kb, a, a, "bitwise_and", 0x33333333, engine=g)
    tt(kb, a, a, b, "add", engine=g)
    ts(kb, b, a, "shift_right_logical", 4, engine=g)
    tt(kb, a, a, b, "add", engine=g)
    ts(kb, a, a, "bitwise_and", 0x0F0F0F0F, "multiply", 0x01010101, engine=g)
    if clz:
        ts(kb, dst, a, "shift_right_logical", 24, "subtract", 32, rev1=True, engine=g)
    else:
        ts(kb, dst, a, "shift_right_logical", 24, engine=g)


def _scratch32(srcs):
    """The operand and four scratch tiles seen as uint32 (4 bytes each, regions.py)."""
    (x,), scratch = tiles(srcs, 1)
    return x, [t.with_(dtype="uint32") for t in scratch]


def _popcnt(kb, dst, srcs, step):
    """32-bit words: narrower types zero-extended, 64-bit ones as two words."""
    x, (a, b, c, d) = _scratch32(srcs)
    width, low = _words(kb, x, c, d, "popcnt")
    if width < 64:
        return _popcnt_into(kb, dst, low, a, b)
    _popcnt_into(kb, c, c, a, b)
    _popcnt_into(kb, d, d, a, b)
    tt(kb, dst, c, d, "add", engine="gpsimd")


def _clz32(kb, dst, x, a, b):
    """Smear the top set bit into every lower bit, then 32 - popcnt (x may be dst)."""
    src = x
    for k in (1, 2, 4, 8, 16):
        ts(kb, b, src, "shift_right_logical", k, engine="gpsimd")
        tt(kb, a, src, b, "bitwise_or", engine="gpsimd")
        src = a
    _popcnt_into(kb, dst, a, a, b, clz=True)


def _clz(kb, dst, srcs, step):
    """clz32 of the zero-extended value minus the extension; 64-bit: clz(high), plus
    clz(low) where the high word is 0."""
    x, (a, b, c, d) = _scratch32(srcs)
    width, low = _words(kb, x, c, d, "count_leading_zeros")
    if width == 32:
        return _clz32(kb, dst, low, a, b)
    if width < 32:
        _clz32(kb, c, c, a, b)
        return ts(kb, dst, c, "subtract", 32 - width, engine="gpsimd")
    _clz32(kb, d, d, a, b)
    _clz32(kb, c, c, a, b)
    ts(kb, a, d, "is_equal", 32, engine="gpsimd")
    tt(kb, a, a, c, "multiply", engine="gpsimd")
    tt(kb, dst, d, a, "add", engine="gpsimd")


def _sign(kb, dst, srcs, step):
    x = srcs[0].tile
    if ir.is_int(x.dtype):
        return ts(kb, dst, x, "max", -1, "min", 1, engine=engine_for(x.dtype))
    (p,) = tiles(srcs, 1)[1]
    kb.emit(isa.Activation, dst=dst, data=x, func=ACTIVATION["sign"])
    ts(kb, p, x, "is_equal", 0.0)                      # +-0 keeps its sign (XLA)
    return select(kb, dst, p, x, dst)


def _reduce_precision(kb, dst, srcs, step):
    """XLA's ReducePrecision on the bits of x (see the module docstring)."""
    (x,), (t, p, s) = tiles(srcs, 1)
    e, m = step.attrs["exponent_bits"], step.attrs["mantissa_bits"]
    if x.dtype not in ("float32", "bfloat16", "float16"):
        raise LoweringError(f"reduce_precision is lowered for float32 / bfloat16 / float16, "
                            f"not {x.dtype}")
    fi = ml_dtypes.finfo(ir.np_dtype(x.dtype))
    width, sm = 8 * fi.dtype.itemsize, int(fi.nmant)
    se, ut = width - 1 - sm, f"uint{width}"
    u, t, p, s = (v.with_(dtype=ut) for v in (x, t, p, s))
    g = "gpsimd"
    cur = u
    if m < sm:
        cut = sm - m
        keep = ~((1 << cut) - 1) & ((1 << width) - 1)
        ts(kb, t, u, "shift_right_logical", cut, "bitwise_and", 1, engine=g)
        tt(kb, t, t, u, "add", engine=g)
        ts(kb, t, t, "add", (1 << (cut - 1)) - 1, "bitwise_and", keep, engine=g)
        cur = t
    exp_mask, sign = ((1 << se) - 1) << sm, 1 << (width - 1)
    if e < se:
        bias, reduced = (1 << (se - 1)) - 1, (1 << (e - 1)) - 1
        ts(kb, p, cur, "bitwise_and", exp_mask, "is_gt", (bias + reduced) << sm, engine=g)
        ts(kb, s, cur, "bitwise_and", sign, "bitwise_or", exp_mask, engine=g)
        kb.emit(isa.Select, dst=t, pred=p, on_true=s, on_false=cur, engine=g)
        ts(kb, p, t, "bitwise_and", exp_mask, "is_le", (bias - reduced) << sm, engine=g)
        ts(kb, s, t, "bitwise_and", sign, engine=g)
        kb.emit(isa.Select, dst=t, pred=p, on_true=s, on_false=t, engine=g)
        cur = t
    if cur is u:
        return kb.emit(isa.TensorCopy, dst=dst.with_(dtype=ut), src=u, engine=g)
    ts(kb, p, u, "bitwise_and", sign - 1, "is_gt", exp_mask, engine=g)       # NaN
    return kb.emit(isa.Select, dst=dst.with_(dtype=ut), pred=p, on_true=u, on_false=cur,
                   engine=g)


# Per op: its emitter and the scratch tiles it takes after its operands.
RULES: dict[str, TileRule] = {
    "round_nearest_even": TileRule(_round_even, 2), "round_nearest_afz": TileRule(_round_afz, 2),
    "floor": TileRule(_floor_ceil, 2), "ceil": TileRule(_floor_ceil, 2),
    "exponential_minus_one": TileRule(_exponential_minus_one, 3),
    "cbrt": TileRule(_cbrt, 2), "atan2": TileRule(_atan2, 4), "is_finite": TileRule(_is_finite),
    "popcnt": TileRule(_popcnt, 4), "count_leading_zeros": TileRule(_clz, 4),
    "sign": TileRule(_sign, 1), "reduce_precision": TileRule(_reduce_precision, 3),
}
