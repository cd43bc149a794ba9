"""ScalarE functions with a published input range, fed only inputs inside it (§2.4).

ScalarE evaluates log, sqrt and rsqrt with piecewise polynomials that are valid only on
[2**-64, 2**64], [2**-116, 2**118] and [2**-87, 2**97] (§2.4 [NKI-SHARED], read from
the Target); outside them the hardware gives invalid results (the model: NaN under the
default strict ranges). So for float32 and bfloat16 operands, whose values reach
2**-149 and 2**128, the argument is first scaled into the range by an exact power of
two and the result corrected; float16 and fp8 values all lie inside the ranges and get
the single Activation. IEEE special inputs (+-0, +-inf, NaN) and the negative inputs
outside the functions' domains reach the Activation unscaled or scaled by a power of
two and get the IEEE result there (sqrt(-0) = -0, log(0) = -inf, log(-1) = NaN,
hw/alu.py). Denormal inputs get the exact result (the CPU backend flushes them to zero
first: sqrt(1e-40) is 0 there, 1e-20 here).

Engines: VectorE runs a tile's instructions in order, so an instruction after the
Activation that VectorE would run stalls the next tile until ScalarE is done; the work
after the Activation goes to GpSimd instead (or the Activation is last). V / S / G:
VectorE / ScalarE / GpSimd instructions per tile.

sqrt, rsqrt: f(x) = f(b) * f(y), b = clamp(x, lo, hi), y = x / b, with lo, hi the even
powers of two closest inside the range, so f(lo), f(hi) are exact powers of two and
y = x * 2**-2k is exact (y >= 2**-33 for sqrt, 2**-63 for rsqrt, at x = 2**-149). For
x inside, b = x and y = 1: the result is the single Activation's, bit for bit. 3 V +
2 S (the product stays on VectorE: these tiles are all FP32, so spread.py moves every
other one to GpSimd whole).

log: log(x) = log(x * 2**(-96 q)) + 96 q ln2, q = -1 below 2**-64, 0 inside, +1 at and
above 2**64, read from the exponent bits: ((bits & ~sign) - (63 << 23)) >> 30 (a
128-binade window; SBUF is untyped, §3.1; bit ops on VectorE, §6.2). 2**(-96 q) is made
as float bits, (q * -96 + 127) << 23 in an integer tile read as float32. x * 2**(-96q)
is exact and inside the range for every x (2**-149 * 2**96 = 2**-53); 96 ln2 is within
0.024 ulp of its float32 value, and |log x| >= 44 wherever q != 0, so the error there
is ~1 ulp. For q = 0 the result is the single Activation's. 4 V (3 cheap integer
tensor_scalars, the multiply) + 2 S (the log; 96 q ln2 as identity(q * 96 ln2), exact)
+ 1 G (the sum).

log_plus_one: log(u) + e with u = (1 + x) * 2**(-96 p), p = x above 2**63 (1 + x is
never below 2**-64 unless it is <= 0: 1 + x >= 2**-24 for a float x > -1), and e the
first-order correction of the rounding of 1 + x, -((u - 1) - x) / u, for x in
(-1, 2**63], else 96 p ln2 (x = -1: -inf, inf, NaN, x < -1 need no correction), for
every float type (float16 / fp8 just never have p = 1). e is ready before the
Activation; the sum is formed as -(-e - log u) so that log1p(-0) is -0. 9 V + 1 S + 2 G.
"""
from __future__ import annotations

import math

import ml_dtypes

from hlo_passes import ir

from ..errors import LoweringError
from .core import TileRule, act, select, stt, tiles, ts, tt

K = 96                               # log's scale exponent: 2**(+-96), see the docstring
K_LN2 = 66.54212951660156            # float32(96 * ln 2), 0.024 ulp from the true value
EXP_ONE = 127 << 23                  # float32 bits of 1.0: (127 - 96 q) << 23 is 2**(-96 q)
_BITS = {"float32": ("int32", 32, 23), "bfloat16": ("int16", 16, 7)}   # view, width, mant


def fits(kb, dtype: str, func: str) -> bool:
    """Whether every value of `dtype` (denormals included) is a valid input of `func`."""
    rng = kb.target.activation_range(func)
    if rng is None:
        return True
    fi = ml_dtypes.finfo(ir.np_dtype(dtype))
    return rng[0] <= float(fi.smallest_subnormal) and float(fi.max) <= rng[1]


def _check_dtype(x, func: str) -> None:
    if x.dtype not in _BITS:
        raise LoweringError(f"{func} of {x.dtype} is not lowered (float32, bfloat16, float16 "
                            f"and fp8 are)")


# --- sqrt, rsqrt -------------------------------------------------------------------------

def even_bounds(kb, func: str) -> tuple[float, float]:
    """The even powers of two closest inside `func`'s range: f of them is exact."""
    lo, hi, _ = kb.target.activation_range(func)
    return 2.0 ** (2 * math.ceil(math.log2(lo) / 2)), 2.0 ** (2 * math.floor(math.log2(hi) / 2))


def _sqrt_like(kb, dst, srcs, step):
    """f(clamp(x)) * f(x / clamp(x)) (see the module docstring)."""
    func = "sqrt" if step.kind == "sqrt" else "rsqrt"
    (x,), (b, y) = tiles(srcs, 1)
    if fits(kb, x.dtype, func):
        return act(kb, dst, x, func)
    _check_dtype(x, func)
    lo, hi = even_bounds(kb, func)
    ts(kb, b, x, "max", lo, "min", hi)
    tt(kb, y, x, b, "divide")
    act(kb, b, b, func)
    act(kb, y, y, func)
    return tt(kb, dst, b, y, "multiply")


# --- log, log1p ----------------------------------------------------------------------------

def _window(kb) -> tuple[int, int]:
    """(biased exponent where q = 0 starts, log2 of the window's width in binades): the
    widest power-of-two window of binades inside log's range, [2**-64, 2**64) on every
    generation; checked to keep x * 2**(-K q) inside the range for every float32."""
    lo, hi, _ = kb.target.activation_range("log")
    lo2, hi2 = math.log2(lo), math.log2(hi)
    e_lo = math.ceil(lo2)
    w = int(math.log2(math.floor(hi2) - e_lo))
    if not (-149 + K >= lo2 and e_lo + K <= hi2 and e_lo + (1 << w) - K >= lo2
            and 128 - K <= hi2):
        raise LoweringError(f"log's ScalarE range [{lo}, {hi}] is too narrow for scaling "
                            f"by 2**+-{K}")
    return e_lo + 127, w


def log_scale(kb, q, g, x):
    """q = -1 / 0 / +1 (x below / inside / above log's range, by its exponent bits) into
    the int32 tile q, and g = 2**(-K q) into g; returns (q, g) as int32 and float32
    views."""
    view, width, mant = _BITS[x.dtype]
    e0, w = _window(kb)
    qi, gi = q.with_(dtype="int32"), g.with_(dtype="int32")
    ts(kb, qi, x.with_(dtype=view), "bitwise_and", (1 << (width - 1)) - 1,
       "subtract", e0 << mant)
    ts(kb, qi, qi, "shift_right_arithmetic", mant + w)
    ts(kb, gi, qi, "multiply", -(K << 23), "add", EXP_ONE)
    return qi, gi.with_(dtype="float32")


def _log(kb, dst, srcs, step):
    """log(x * 2**(-K q)) + K q ln2: VectorE scales, ScalarE takes both the log and the
    correction (identity(q * K ln2)), GpSimd adds them (see the module docstring)."""
    (x,), (q, g) = tiles(srcs, 1)
    if fits(kb, x.dtype, "log"):
        return act(kb, dst, x, "log")
    _check_dtype(x, "log")
    qi, gf = log_scale(kb, q, g, x)
    tt(kb, gf, x, gf, "multiply")                  # x * 2**(-K q): exact
    qf = q.with_(dtype="float32")
    act(kb, qf, qi, "identity", scale=K_LN2)       # K q ln2, exact: q in {-1, 0, 1}
    act(kb, gf, gf, "log")
    return tt(kb, dst, gf, qf, "add", engine="gpsimd")


def _log_plus_one(kb, dst, srcs, step):
    """-(e' - log(u)), e' = -e (see the module docstring): only GpSimd waits for the
    Activation; e' carries -x's zero and the exact negation comes last, so log1p(+-0)
    is +-0 (log u is +0 there, and (+0) + (-0) would be +0)."""
    (x,), (u, e, c, t) = tiles(srcs, 1)
    hi = kb.target.activation_range("log")[1]
    gi = e.with_(dtype="int32")
    ts(kb, c, x, "is_gt", hi / 2)                   # p: 1 + x above the range
    ts(kb, gi, c, "multiply", -(K << 23), "add", EXP_ONE)
    stt(kb, u, x, "add", 1.0, "multiply", gi.with_(dtype="float32"))
    ts(kb, t, c, "multiply", -K_LN2)                # -96 p ln2
    stt(kb, c, x, "is_gt", -1.0, "subtract", c)     # x in (-1, 2**63]: correct it
    ts(kb, e, u, "subtract", 1.0, rev0=True)        # (-x) - (1 - u) = (u - 1) - x, -x
    stt(kb, e, x, "multiply", -1.0, "subtract", e)   # itself at u = 1 (the sign of 0)
    tt(kb, e, e, u, "divide")
    select(kb, e, c, e, t)
    act(kb, u, u, "log")
    tt(kb, e, e, u, "subtract", engine="gpsimd")
    return ts(kb, dst, e, "multiply", -1.0, engine="gpsimd")


RULES: dict[str, TileRule] = {
    "sqrt": TileRule(_sqrt_like, 2), "rsqrt": TileRule(_sqrt_like, 2),
    "log": TileRule(_log, 2), "log_plus_one": TileRule(_log_plus_one, 4),
}
