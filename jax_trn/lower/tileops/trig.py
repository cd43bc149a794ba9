"""sine, cosine, tan of any float32 argument: ScalarE `sin` fed only [-pi/2, pi/2].

ScalarE's `sin` is valid on [-pi, pi] and does no range reduction (§2.4 [NKI-SHARED]).
So x is reduced to r = x - n pi/2 in [-pi/4, pi/4] (about) and a quadrant q = n mod 4,
and the function is taken of r: sin(x) = [sin r, cos r, -sin r, -cos r][q], cos(x) the
same at q + 1, tan(x) = sin r / cos r for even q, -cos r / sin r for odd q, with
cos r = sin(pi/2 - |r|) (ScalarE has no published cos; its argument stays in
[pi/4, pi/2], where the rounding of pi/2 - |r| costs < 1 ulp of cos r). Operands of
other float types are widened to float32 first (exact). Two reductions run side by side
and a select picks one per element:

- Cody-Waite (VectorE), |x| < 2**12: n = rne(x * 2/pi) with the 1.5 * 2**23 magic
  number, r = x - n P1 - n P2 - n P3 - n P4, pi/2 = P1 + P2 + P3 + P4 to 2e-21, the
  first three with 12 significant bits so that n Pi is exact for |n| < 2**12. r keeps
  its relative precision next to multiples of pi/2 (cos(float32(pi/2)) = -4.37e-8), and
  r = x exactly for |x| < pi/4. 2 tensor_scalar + 4 scalar_tensor_tensor.
- Payne-Hanek (GpSimd, 64-bit integer lanes, §2.5, §4 "native INT64"), |x| >= 2**12,
  finite: with x = m 2**(e-23) (m the 24-bit significand), y = x * 2/pi mod 4 is
  m * W mod 2**64 in units of 2**-62, W the 64 bits of 2/pi from bit e - 24 on: the bits
  above contribute multiples of 4, the bits below less than m units. W is cut from a
  192-bit copy of 2/pi (words Q0..Q2) by shifting with the per-element amount s = e - 12
  (in [0, 115]): Q0 << s | Q1 >> (64 - s) | Q1 << (s - 64) | Q2 >> (128 - s), shifts by
  >= 64 or < 0 giving 0 (XLA's rule, hw/alu.py). Then n = (y + 2**61) >> 62 and the
  centred remainder f = (y << 2) >> 2 (arithmetic), r = f * pi/2 * 2**-62 after the
  int64 -> float32 conversion (relative precision kept). The sign of x multiplies m.
  The dropped bits of 2/pi leave |error of r| < 2**24 * 2**-62 * pi/2 ~ 6e-12: a few ulps
  unless x lies within ~1e-4 (relative to pi/2) of a multiple of pi/2, then more (the
  CPU backend rounds correctly there). 13 GpSimd instructions (9 tensor_scalar, 4
  tensor_tensor) + 1 VectorE conversion.

inf and NaN take the Cody-Waite path (NaN there), so the select's predicate is "finite
and |x| >= 2**12", read from the exponent bits on GpSimd. Costs per tile: sin / cos
16 V + 15 G + 1 S, tan 17 V + 15 G + 2 S (before: 6-8 V + 1-2 S, wrong beyond ~1e3).
"""
from __future__ import annotations

from jax_trn.hw import isa

from .core import TileRule, act, select, stt, tiles, ts, tt

MAGIC = 12582912.0                               # 1.5 * 2**23: (v + MAGIC) - MAGIC = rne(v)
TWO_OVER_PI = 0.6366197723675814                 # float32(2 / pi)
HALF_PI = 1.5707963705062866                     # float32(pi / 2)
# pi/2 = P1 + P2 + P3 + P4 (to 2e-21); P1..P3 have 12 significant bits.
PIO2 = (1.57080078125, -4.453584551811218e-06, -8.706138032721356e-10,
        6.223371969669989e-14)
CW_LIMIT_EXP = 12                                # Cody-Waite below 2**12 (|n| < 2**12)
# 2/pi from bit -11 on (bit k has weight 2**-k; bits k <= 0 are 0), 4 x 64 bits, signed.
Q = (1433540284805664, -6246526515718149722, -1295106960977698276, -9074768044821121570)
F_TO_R = 3.4061216748705226e-19                  # float32(pi/2 * 2**-62)
EXT_TO_R = 2.0302067249241606e-26                # float32(pi/2 * 2**-62 * 2**-24)
G = "gpsimd"


def _cody_waite(kb, r, k, x):
    """r = x - k pi/2, k = rne(x 2/pi) (float), exact products (|k| < 2**12)."""
    ts(kb, k, x, "multiply", TWO_OVER_PI, "add", MAGIC)
    ts(kb, k, k, "subtract", MAGIC)
    stt(kb, r, k, "multiply", -PIO2[0], "add", x)
    for p in PIO2[1:]:
        stt(kb, r, k, "multiply", -p, "add", r)


def _window(kb, w, t, e, word: int):
    """w = 64 bits of 2/pi, from bit (e - 127) - 24 + 64 * word on, e the biased exponent
    (int64): Q[word] << s | Q[word+1] >> (64 - s) | Q[word+1] << (s - 64) |
    Q[word+2] >> (128 - s), s = e - 139 in [0, 115]; t: scratch."""
    base = 127 + CW_LIMIT_EXP
    ts(kb, w, e, "subtract", base, "shift_left", Q[word], rev1=True, engine=G)
    for q, at, op in ((Q[word + 1], base + 64, "shift_right_logical"),
                      (Q[word + 1], base + 64, "shift_left"),
                      (Q[word + 2], base + 128, "shift_right_logical")):
        rev = op == "shift_right_logical"          # Q >> (at - e); Q << (e - at)
        ts(kb, t, e, "subtract", at, op, q, rev0=rev, rev1=True, engine=G)
        tt(kb, w, w, t, "bitwise_or", engine=G)


def _payne_hanek(kb, x, s):
    """(r, n, big) for finite |x| >= 2**12, x float32: r, n float32 (n in [0, 3]), big
    int64 1 there, else 0 (r, n then garbage). s: five 64-bit scratch tiles, which hold
    the three results (s[4], s[1], s[0])."""
    u = x.with_(dtype="int32")
    e, m, w, t, w2 = (v.with_(dtype="int64") for v in s)
    ts(kb, e, u, "shift_right_logical", 23, "bitwise_and", 0xFF, engine=G)
    ts(kb, m, u, "bitwise_and", 0x7FFFFF, "bitwise_or", 0x800000, engine=G)
    ts(kb, w, u, "shift_right_arithmetic", 31, "bitwise_or", 1, engine=G)    # sign: +-1
    tt(kb, m, m, w, "multiply", engine=G)                 # the signed significand
    _window(kb, w, t, e, 0)
    _window(kb, w2, t, e, 1)
    # big: the biased exponent in [127 + 12, 254]: (e + 117) & 255 < 116
    ts(kb, e, e, "add", 256 - (127 + CW_LIMIT_EXP), "bitwise_and", 0xFF, engine=G)
    ts(kb, e, e, "is_lt", 254 - (127 + CW_LIMIT_EXP) + 1, engine=G)
    tt(kb, w, w, m, "multiply", engine=G)                 # y * 2**62 mod 2**64
    ts(kb, w2, w2, "shift_right_logical", 40, engine=G)   # the next 24 bits of 2/pi
    ext = t.with_(dtype="float32")                        # their m * w2 * 2**-24, in r
    stt(kb, ext, w2, "multiply", EXT_TO_R, "multiply", m)
    n = s[1].with_(dtype="float32")
    ts(kb, n, w, "add", 1 << 61, "shift_right_logical", 62, engine=G)
    ts(kb, w, w, "shift_left", 2, "shift_right_arithmetic", 2, engine=G)
    r = s[4].with_(dtype="float32")
    stt(kb, r, w, "multiply", F_TO_R, "add", ext)
    return r, n, e


def reduce(kb, r, q, x, s):
    """r (float32, about [-pi/4, pi/4]) and q (an integer-valued float32, |q| < 2**12 or
    in [0, 3]) with x = r + (q + 4j) pi/2, for every float32 x (NaN for inf and NaN);
    s: five 64-bit-wide scratch tiles."""
    _cody_waite(kb, r, q, x)
    r2, n2, big = _payne_hanek(kb, x, s)
    select(kb, r, big, r2, r)
    select(kb, q, big, n2, q)


def _quadrant(kb, q, period: int, shift: int = 0):
    """q = (q + shift) mod `period` (q may be negative: 2**22 + q > 0 is exact)."""
    ts(kb, q, q, "add", float(4 * 2 ** 20 + shift), "remainder", float(period))


def _sin_quadrant(kb, dst, r, q, t1, t2):
    """sin(r + q pi/2), q in [0, 3]: sin or cos of r, negated in quadrants 2 and 3."""
    ts(kb, t1, q, "remainder", 2.0)                        # odd: cos r
    ts(kb, t2, r, "abs_max", 0.0, "subtract", HALF_PI, rev1=True)
    select(kb, t2, t1, t2, r)
    act(kb, t2, t2, "sin")
    ts(kb, t1, q, "is_ge", 2.0, "multiply", -2.0)
    return stt(kb, dst, t1, "add", 1.0, "multiply", t2)


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
    _quadrant(kb, q, 4, 0 if step.kind == "sine" else 1)
    t1, t2 = (v.with_(dtype="float32") for v in s[2:4])
    return _sin_quadrant(kb, dst, r, q, t1, t2)


def _tan(kb, dst, srcs, step):
    """sin r / cos r, or -cos r / sin r in odd quadrants."""
    (x,), s = tiles(srcs, 1)
    x = _f32(kb, x, s[7])
    r, q, sn, cs = (v.with_(dtype="float32") for v in s[:4])
    reduce(kb, r, q, x, s[2:7])
    _quadrant(kb, q, 2)
    act(kb, sn, r, "sin")
    ts(kb, cs, r, "abs_max", 0.0, "subtract", HALF_PI, rev1=True)
    act(kb, cs, cs, "sin")
    ts(kb, r, cs, "multiply", -1.0)
    select(kb, r, q, r, sn)                        # numerator: -cos r or sin r
    select(kb, cs, q, sn, cs)                      # denominator: sin r or cos r
    return tt(kb, dst, r, cs, "divide")


RULES: dict[str, TileRule] = {
    "sine": TileRule(_sine_cosine, 8, width=8), "cosine": TileRule(_sine_cosine, 8, width=8),
    "tan": TileRule(_tan, 8, width=8),
}
