"""sine, cosine, tan of any float32 argument: ScalarE `sin` fed only [-pi/2, pi/2].

ScalarE's `sin` is valid on [-pi, pi] and does no range reduction (§2.4 [NKI-SHARED]).
So x is reduced to r = x - n pi/2 (|r| <= pi/4, or |r| < 1 for |x| < 1) and a quadrant
q = n mod 4, and the function is taken of r: sin(x) = [sin r, cos r, -sin r, -cos r][q],
cos(x) the same at q + 1, tan(x) = sin r / cos r for even q, -cos r / sin r for odd q,
with cos r = sin(pi/2 - |r|) (ScalarE has no published cos; the argument stays in
[pi/2 - 1, pi/2] and, for sin and cos, is pi/2 - |r| rounded once (_half_pi_minus);
tan keeps float32(pi/2) - |r|) and the negation inside the argument (sin is odd), so a sin / cos tile's last instruction is
the Activation: VectorE, which runs a tile's instructions in order, never waits for
ScalarE. Operands of other float types are widened to float32 first (exact).

|x| < 1: r = x, q = 0 (relative precision kept down to the smallest denormal).

|x| >= 1, finite: Payne-Hanek on GpSimd's 64-bit integer lanes (§2.5; §4 "native
INT64"). With x = m 2**(e-23) (m the signed 24-bit significand, e >= 0), y = x * 2/pi
mod 4 in units of 2**-62 is m * W1 + (m * W2) >> 24 (mod 2**64): W1 the 64 bits of 2/pi
from bit e - 24 on (the bits before contribute multiples of 4), W2 the next 24 (the
bits after them less than m * 2**-24 units, so |error of r| < 2**-62 * pi/2 ~ 3e-19).
W1, W2 are cut from a 256-bit copy of 2/pi (words Q0..Q3, from bit -24 on) by shifting
with the per-element amount s = e in [0, 127]:
W = Q[i] << s | Q[i+1] >> (64 - s) | Q[i+1] << (s - 64) | Q[i+2] >> (128 - s), shifts
by >= 64 or < 0 giving 0 (XLA's rule, hw/alu.py). Then n = (y + 2**61) >> 62 and the
centred remainder f = (y << 2) >> 2 (arithmetic), r = f * pi/2 * 2**-62 after the
int64 -> float32 conversion (relative precision kept, also next to a multiple of pi/2:
cos(float32(pi/2)) = -4.37e-8 to the ulp). 22 GpSimd instructions (14 tensor_scalar,
8 tensor_tensor), 4 VectorE (the last 24 bits' term and r in FP32; "1 <= |x| < inf"
from the bits). inf and NaN take the |x| < 1 path: ScalarE's sin of them is NaN (IEEE
special inputs, hw/alu.py).

Per tile: sin 14 V + 22 G + 1 S, cos 15 V + 22 G + 1 S, tan 12 V + 22 G + 2 S (before:
6-8 V + 1-2 S, 2e-7 off at |x| ~ 1e3, NaN under strict ranges from |x| ~ 1e7 on).
Error: <= 2 ulps from the correctly rounded result (sin, cos; the CPU backend's is <= 1),
<= 4 (tan). GpSimd is the busier engine: a float32 sin of 2048 x 4096 takes ~2.6x the
time of the old, wrong one.
"""
from __future__ import annotations

from jax_trn.hw import isa

from .core import TileRule, act, select, stt, tiles, ts, tt

HALF_PI = 1.5707963705062866                     # float32(pi / 2)
PI2_LO = -4.371139006309477e-08                  # pi / 2 - HALF_PI
# 2/pi from bit -24 on (bit k has weight 2**-k; bits k <= 0 are 0), 4 x 64 bits, signed.
Q = (349985421095, 2452936766029293818, -7318665582699950946, 2434231878865245679)
F_TO_R = 3.4061216748705226e-19                  # float32(pi/2 * 2**-62)
EXT_TO_R = 2.0302067249241606e-26                # float32(pi/2 * 2**-62 * 2**-24)
ONE_BITS = 127 << 23                             # float32 bits of 1.0: big from here on
INF_BITS = 255 << 23                             # float32 bits of inf: up to here
G = "gpsimd"


def _window(kb, w, t, e, word: int):
    """w = 64 bits of 2/pi from bit (e - 127) - 24 + 64 * word on, e the biased exponent
    (int64, s = e - 127 in [0, 127] where it matters); t: scratch."""
    ts(kb, w, e, "subtract", 127, "shift_left", Q[word], rev1=True, engine=G)
    for q, at, op in ((Q[word + 1], 127 + 64, "shift_right_logical"),
                      (Q[word + 1], 127 + 64, "shift_left"),
                      (Q[word + 2], 127 + 128, "shift_right_logical")):
        rev = op == "shift_right_logical"          # Q >> (at - e); Q << (e - at)
        ts(kb, t, e, "subtract", at, op, q, rev0=rev, rev1=True, engine=G)
        tt(kb, w, w, t, "bitwise_or", engine=G)


def _payne_hanek(kb, x, s):
    """(r, n) float32 for 1 <= |x| < inf (garbage elsewhere), x float32; s: five 64-bit
    scratch tiles; r, n come back in s[4], s[1]."""
    u = x.with_(dtype="int32")
    e, m, w, t, w2 = (v.with_(dtype="int64") for v in s)
    ts(kb, e, u, "shift_right_logical", 23, "bitwise_and", 0xFF, engine=G)
    ts(kb, m, u, "bitwise_and", 0x7FFFFF, "bitwise_or", 0x800000, engine=G)
    ts(kb, w, u, "shift_right_arithmetic", 31, "bitwise_or", 1, engine=G)    # sign: +-1
    tt(kb, m, m, w, "multiply", engine=G)                 # the signed significand
    _window(kb, w, t, e, 0)
    _window(kb, w2, t, e, 1)
    tt(kb, w, w, m, "multiply", engine=G)                 # y * 2**62 mod 2**64
    ts(kb, w2, w2, "shift_right_logical", 40, engine=G)   # the next 24 bits of 2/pi
    ext = t.with_(dtype="float32")                        # their m * w2 * 2**-24, in r
    stt(kb, ext, w2, "multiply", EXT_TO_R, "multiply", m)
    n = s[1].with_(dtype="float32")
    ts(kb, n, w, "add", 1 << 61, "shift_right_logical", 62, engine=G)
    ts(kb, w, w, "shift_left", 2, "shift_right_arithmetic", 2, engine=G)
    r = s[4].with_(dtype="float32")
    stt(kb, r, w, "multiply", F_TO_R, "add", ext)
    return r, n


def reduce(kb, r, q, x, s):
    """r, q (float32) with x = r + (q + 4j) pi/2 and q in [0, 3], for every float32 x (r
    is x itself for |x| < 1, inf and NaN); s: five 64-bit-wide scratch tiles."""
    r2, n = _payne_hanek(kb, x, s)
    big = s[0].with_(dtype="uint32")       # 1 <= |x| < inf: (bits & ~sign) - bits(1.0),
    ts(kb, big, x.with_(dtype="uint32"), "bitwise_and", 0x7FFFFFFF, "subtract", ONE_BITS)
    ts(kb, big, big, "is_lt", INF_BITS - ONE_BITS)        # wrapped to uint32, < bits(inf)
    select(kb, r, big, r2, x)
    stt(kb, q, big, "multiply", 1.0, "multiply", n)


def _quadrant(kb, q, period: int, shift: int = 0):
    """q = (q + shift) mod `period` (q in [0, 3])."""
    ts(kb, q, q, "add", float(shift), "remainder", float(period))


def _half_pi_minus(kb, a, r, t):
    """a = pi/2 - |r| rounded once (|r| <= pi/4, or < 1), so cos r = sin a is as close
    as sin is: float32(pi/2) - |r| rounds to a_hi, whose error (pi/2_f - a_hi) - |r|
    is exact (Fast2Sum, pi/2_f >= |r|) and joins pi/2's own (PI2_LO) in one last
    subtraction. Without them cos of |x| < 1 was biased by ~0.35 ulp on average (up to
    1.7 ulps), enough to push second-order finite differences of JAX's scan tests out
    of tolerance."""
    ts(kb, a, r, "abs_max", 0.0, "subtract", HALF_PI, rev1=True)      # a_hi
    ts(kb, t, a, "subtract", HALF_PI)                                  # exact
    stt(kb, t, r, "abs_max", 0.0, "add", t)                            # -(a_hi's error)
    stt(kb, a, t, "subtract", PI2_LO, "subtract", a, rev1=True)


def _sin_quadrant(kb, dst, r, q, t1, t2, t3):
    """sin(r + q pi/2), q in [0, 3]: sin(+-r) or sin(+-(pi/2 - |r|)) (cos r), negated
    (inside the argument) in quadrants 2 and 3."""
    ts(kb, t1, q, "remainder", 2.0)                        # odd: cos r
    _half_pi_minus(kb, t2, r, t3)
    select(kb, t2, t1, t2, r)
    ts(kb, t1, q, "is_ge", 2.0, "multiply", -2.0)
    stt(kb, t2, t1, "add", 1.0, "multiply", t2)
    return act(kb, dst, t2, "sin")


def _f32(kb, x, spare):
    """x as float32: itself, or widened into `spare` (exact for float16 / bfloat16)."""
    if x.dtype == "float32":
        return x
    f = spare.with_(dtype="float32")
    kb.emit(isa.TensorCopy, dst=f, src=x)
    return f


def _sine_cosine(kb, dst, srcs, step):
    """sin(x) = sin(r + q pi/2); cos(x) = sin(r + (q + 1) pi/2)."""
    (x,), s = tiles(srcs, 1)
    x = _f32(kb, x, s[7])
    r, q = (v.with_(dtype="float32") for v in s[:2])
    reduce(kb, r, q, x, s[2:7])
    if step.kind == "cosine":
        _quadrant(kb, q, 4, 1)
    t1, t2, t3 = (v.with_(dtype="float32") for v in s[2:5])
    return _sin_quadrant(kb, dst, r, q, t1, t2, t3)


def _tan(kb, dst, srcs, step):
    """sin r / cos r, or -cos r / sin r in odd quadrants, as sin(a) / sin(b) with
    a, b in [-pi/2, pi/2] chosen before the Activations; VectorE divides (GpSimd, the
    busier engine here, would take longer than VectorE's wait)."""
    (x,), s = tiles(srcs, 1)
    x = _f32(kb, x, s[7])
    r, q, hh, nh = (v.with_(dtype="float32") for v in s[:4])
    reduce(kb, r, q, x, s[2:7])
    _quadrant(kb, q, 2)
    ts(kb, hh, r, "abs_max", 0.0, "subtract", HALF_PI, rev1=True)     # pi/2 - |r|
    ts(kb, nh, hh, "multiply", -1.0)
    select(kb, nh, q, nh, r)                       # numerator: -cos r or sin r
    select(kb, hh, q, r, hh)                       # denominator: sin r or cos r
    act(kb, nh, nh, "sin")
    act(kb, hh, hh, "sin")
    return tt(kb, dst, nh, hh, "divide")


RULES: dict[str, TileRule] = {
    "sine": TileRule(_sine_cosine, 8, width=8), "cosine": TileRule(_sine_cosine, 8, width=8),
    "tan": TileRule(_tan, 8, width=8),
}
