"""Complex arithmetic on (real, imaginary) planes, as real IR ops: the expanders of the
`complex-planes` pass (hlo_passes/passes/complex_planes.py).

The hardware has no complex type (trainium-hardware.md §4), so a complex value is a pair
of real values of the part type (complex64 -> float32). `Builder` appends real ops to a
list of ops; the functions below build one complex operation from them, following the
formulas of XLA's elemental IR emitter for targets without native complex (the same
special cases where they matter: zero and infinite inputs, overflow-safe `abs`):

    mul       (ac - bd, ad + bc)
    div       Smith's algorithm (scale by the larger part of the divisor: no overflow),
              C99 Annex G's recovery of zero and infinite operands
    abs       max(|a|,|b|) * sqrt(1 + (min/max)^2)        (hypot, overflow-safe)
    exp       e^(a/2) * (cos b, sin b) * e^(a/2)          (finite where e^a overflows)
    log       (log|z|, atan2(b, a)), log|z| = log(max) + log1p((min/max)^2)/2
    sqrt      t = sqrt((|a| + |z|)/2); a >= 0: (t, b/2t), else (|b|/2t, copysign(t, b))
    pow       exp(w * log z), 0^w as XLA: 1 for w = 0, 0 for re w > 0
    sin, cos  via sinh/cosh of b (from expm1: exact near 0)
    tan, tanh (sinh a cosh a, sin b cos b) / (sinh^2 a + cos^2 b), saturated for large |a|
"""
from __future__ import annotations

import numpy as np

from hlo_passes import ir

Planes = tuple[ir.Value, ir.Value]

PART = {"complex64": "float32", "complex128": "float64"}
COMPLEX = {v: k for k, v in PART.items()}


def is_complex(dtype: str) -> bool:
    return dtype in PART


class Builder:
    """Appends real ops to `ops`, each tagged with the source op's location and name."""

    def __init__(self, ops: list[ir.Op], loc: str = "", name: str = ""):
        self.ops, self.loc, self.name = ops, loc, name

    def emit_op(self, kind: str, operands, types, attrs=None, regions=None) -> ir.Op:
        op = ir.Op(kind, list(operands), [ir.Value(t) for t in types], dict(attrs or {}),
                   list(regions or []), loc=self.loc, name=self.name)
        self.ops.append(op)
        return op

    def emit(self, kind: str, operands, shape, dtype: str, **attrs) -> ir.Value:
        return self.emit_op(kind, operands, [ir.TensorType(tuple(shape), dtype)],
                            attrs).result

    def unary(self, kind: str, x: ir.Value) -> ir.Value:
        return self.emit(kind, [x], x.shape, x.dtype)

    def binary(self, kind: str, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.emit(kind, [x, y], x.shape, x.dtype)

    def const(self, value, like: ir.Value, dtype: str | None = None) -> ir.Value:
        """A splat of `value` with `like`'s shape (and its dtype unless given)."""
        dtype = dtype or like.dtype
        scalar = self.emit("constant", [], (), dtype,
                           value=np.array(value, dtype=ir.np_dtype(dtype)))
        if not like.shape:
            return scalar
        return self.emit("broadcast_in_dim", [scalar], like.shape, dtype,
                         broadcast_dimensions=())

    def array(self, value: np.ndarray, dtype: str) -> ir.Value:
        value = np.array(value, dtype=ir.np_dtype(dtype), order="C")
        return self.emit("constant", [], value.shape, dtype, value=value)

    def compare(self, x: ir.Value, y: ir.Value, direction: str) -> ir.Value:
        kind = "FLOAT" if ir.is_float(x.dtype) else None
        return self.emit("compare", [x, y], x.shape, "bool",
                         comparison_direction=direction, compare_type=kind)

    def select(self, p: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
        return self.emit("select", [p, x, y], x.shape, x.dtype)

    # shorthand for the arithmetic below
    def add(self, x, y): return self.binary("add", x, y)
    def sub(self, x, y): return self.binary("subtract", x, y)
    def mul(self, x, y): return self.binary("multiply", x, y)
    def div(self, x, y): return self.binary("divide", x, y)
    def max(self, x, y): return self.binary("maximum", x, y)
    def min(self, x, y): return self.binary("minimum", x, y)
    def neg(self, x): return self.unary("negate", x)
    def abs(self, x): return self.unary("abs", x)
    def half(self, x): return self.mul(x, self.const(0.5, x))
    def twice(self, x): return self.add(x, x)


# --- arithmetic ---------------------------------------------------------------------


def mul(b: Builder, z: Planes, w: Planes) -> Planes:
    (x, y), (u, v) = z, w
    return b.sub(b.mul(x, u), b.mul(y, v)), b.add(b.mul(x, v), b.mul(y, u))


def div(b: Builder, z: Planes, w: Planes) -> Planes:
    """Smith's algorithm (divide by the divisor's larger part first: no overflow), with
    C99 Annex G's recovery where it gives NaN: a zero divisor (inf), an infinite
    dividend over a finite divisor (inf), a finite dividend over an infinite one (0)."""
    (x, y), (u, v) = z, w
    wide = b.compare(b.abs(u), b.abs(v), "GE")
    # |u| >= |v|: r = v/u, d = u + v r, ((x + y r)/d, (y - x r)/d)
    r1 = b.div(v, u)
    d1 = b.add(u, b.mul(v, r1))
    re1, im1 = b.div(b.add(x, b.mul(y, r1)), d1), b.div(b.sub(y, b.mul(x, r1)), d1)
    # else: r = u/v, d = v + u r, ((x r + y)/d, (y r - x)/d)
    r2 = b.div(u, v)
    d2 = b.add(v, b.mul(u, r2))
    re2, im2 = b.div(b.add(b.mul(x, r2), y), d2), b.div(b.sub(b.mul(y, r2), x), d2)
    re, im = b.select(wide, re1, re2), b.select(wide, im1, im2)
    return _recover_div(b, (x, y), (u, v), (re, im))


def _recover_div(b: Builder, z: Planes, w: Planes, q: Planes) -> Planes:
    (x, y), (u, v), (re, im) = z, w, q
    zero, inf = b.const(0.0, x), b.const(np.inf, x)
    nan = _or(b, is_nan(b, re), is_nan(b, im))
    # a zero divisor, a dividend not all NaN: copysign(inf, u) * (x, y)
    w0 = _and(b, b.compare(u, zero, "EQ"), b.compare(v, zero, "EQ"))
    w0 = _and(b, w0, _or(b, b.unary("not", is_nan(b, x)), b.unary("not", is_nan(b, y))))
    s = _copysign(b, inf, u)
    cases = [(w0, (b.mul(s, x), b.mul(s, y)))]
    # an infinite dividend, a finite divisor: inf * (x' u + y' v, y' u - x' v)
    z_inf = _and(b, _or(b, is_inf(b, x), is_inf(b, y)), _and(b, is_fin(b, u), is_fin(b, v)))
    xs, ys = (_copysign(b, b.select(is_inf(b, t), b.const(1.0, t), zero), t) for t in (x, y))
    cases.append((z_inf, (b.mul(inf, b.add(b.mul(xs, u), b.mul(ys, v))),
                          b.mul(inf, b.sub(b.mul(ys, u), b.mul(xs, v))))))
    # a finite dividend, an infinite divisor: 0 * (x u' + y v', y u' - x v')
    w_inf = _and(b, _or(b, is_inf(b, u), is_inf(b, v)), _and(b, is_fin(b, x), is_fin(b, y)))
    us, vs = (_copysign(b, b.select(is_inf(b, t), b.const(1.0, t), zero), t) for t in (u, v))
    cases.append((w_inf, (b.mul(zero, b.add(b.mul(x, us), b.mul(y, vs))),
                          b.mul(zero, b.sub(b.mul(y, us), b.mul(x, vs))))))
    for cond, (cr, ci) in reversed(cases):
        take = _and(b, nan, cond)
        re, im = b.select(take, cr, re), b.select(take, ci, im)
    return re, im


def is_nan(b: Builder, x: ir.Value) -> ir.Value:
    return b.compare(x, x, "NE")


def is_inf(b: Builder, x: ir.Value) -> ir.Value:
    return b.compare(b.abs(x), b.const(np.inf, x), "EQ")


def is_fin(b: Builder, x: ir.Value) -> ir.Value:
    return b.emit("is_finite", [x], x.shape, "bool")


def abs_(b: Builder, z: Planes) -> ir.Value:
    """|z| without overflow or underflow (hypot): max * sqrt(1 + (min/max)^2)."""
    ax, ay = b.abs(z[0]), b.abs(z[1])
    hi, lo = b.max(ax, ay), b.min(ax, ay)
    q = b.div(lo, hi)
    out = b.mul(hi, b.unary("sqrt", b.add(b.const(1.0, q), b.mul(q, q))))
    zero, inf = b.const(0.0, hi), b.const(np.inf, hi)
    out = b.select(b.compare(hi, zero, "EQ"), zero, out)       # 0/0 above
    return b.select(b.compare(hi, inf, "EQ"), inf, out)        # inf/inf above


def log_abs(b: Builder, z: Planes) -> ir.Value:
    """log|z| = log(max) + log1p((min/max)^2)/2: exact near |z| = 1, no overflow."""
    ax, ay = b.abs(z[0]), b.abs(z[1])
    hi, lo = b.max(ax, ay), b.min(ax, ay)
    q = b.div(lo, hi)
    q = b.select(b.compare(hi, b.const(0.0, hi), "EQ"), b.const(0.0, hi), q)
    q = b.select(b.compare(hi, b.const(np.inf, hi), "EQ"), b.const(0.0, hi), q)
    return b.add(b.unary("log", hi), b.half(b.unary("log_plus_one", b.mul(q, q))))


def exp(b: Builder, z: Planes) -> Planes:
    x, y = z
    h = b.unary("exponential", b.half(x))
    re = b.mul(b.mul(h, b.unary("cosine", y)), h)
    im = b.mul(b.mul(h, b.unary("sine", y)), h)
    return re, b.select(b.compare(y, b.const(0.0, y), "EQ"), y, im)   # exp(x + 0i) real


def expm1(b: Builder, z: Planes) -> Planes:
    """e^z - 1 = (expm1(x) cos y - 2 sin^2(y/2), e^x sin y): exact near 0."""
    x, y = z
    s = b.unary("sine", b.half(y))
    re = b.sub(b.mul(b.unary("exponential_minus_one", x), b.unary("cosine", y)),
               b.twice(b.mul(s, s)))
    im = b.mul(b.unary("exponential", x), b.unary("sine", y))
    return re, b.select(b.compare(y, b.const(0.0, y), "EQ"), y, im)    # real stays real


def log(b: Builder, z: Planes) -> Planes:
    return log_abs(b, z), arg(b, z)


def arg(b: Builder, z: Planes) -> ir.Value:
    return b.binary("atan2", z[1], z[0])


def log1p(b: Builder, z: Planes) -> Planes:
    """log(1 + z): real part log1p(2x + x^2 + y^2)/2 (exact near 0), small |z| only
    matter there; large |z| go through log of 1 + z."""
    x, y = z
    one = b.const(1.0, x)
    t = b.add(b.add(b.twice(x), b.mul(x, x)), b.mul(y, y))
    small = b.half(b.unary("log_plus_one", t))
    large = log_abs(b, (b.add(x, one), y))
    use_small = b.compare(b.abs(t), b.const(0.5, x), "LT")
    return b.select(use_small, small, large), arg(b, (b.add(x, one), y))


def sqrt(b: Builder, z: Planes) -> Planes:
    x, y = z
    zero = b.const(0.0, x)
    t = b.unary("sqrt", b.half(b.add(b.abs(x), abs_(b, z))))
    two_t = b.twice(t)
    pos = b.compare(x, zero, "GE")
    re = b.select(pos, t, b.div(b.abs(y), two_t))
    im = b.select(pos, b.div(y, two_t), _copysign(b, t, y))
    is_zero = b.compare(t, zero, "EQ")
    return b.select(is_zero, zero, re), b.select(is_zero, y, im)


def rsqrt(b: Builder, z: Planes) -> Planes:
    one = b.const(1.0, z[0])
    return div(b, (one, b.const(0.0, one)), sqrt(b, z))


def pow_(b: Builder, z: Planes, w: Planes) -> Planes:
    """z^w = exp(w log z); 0^w is 1 for w = 0 and 0 for re(w) > 0, im(w) = 0; 1^w = 1."""
    re, im = exp(b, mul(b, w, log(b, z)))
    zero, one = b.const(0.0, re), b.const(1.0, re)
    z1 = _and(b, b.compare(z[0], one, "EQ"), b.compare(z[1], zero, "EQ"))
    re, im = b.select(z1, one, re), b.select(z1, zero, im)
    z0 = _and(b, b.compare(z[0], zero, "EQ"), b.compare(z[1], zero, "EQ"))
    w_real = b.compare(w[1], zero, "EQ")
    w0 = _and(b, b.compare(w[0], zero, "EQ"), w_real)
    wpos = _and(b, b.compare(w[0], zero, "GT"), w_real)
    at_zero = _and(b, z0, wpos)
    re, im = b.select(at_zero, zero, re), b.select(at_zero, zero, im)
    return b.select(w0, one, re), b.select(w0, zero, im)


def sinh_cosh(b: Builder, y: ir.Value) -> Planes:
    """(sinh y, cosh y); sinh from expm1 so it keeps its relative precision near 0."""
    p, m = b.unary("exponential_minus_one", y), b.unary("exponential_minus_one", b.neg(y))
    sinh = b.half(b.sub(p, m))
    cosh = b.add(b.const(1.0, y), b.half(b.add(p, m)))
    return sinh, cosh


def sin(b: Builder, z: Planes) -> Planes:
    x, y = z
    sh, ch = sinh_cosh(b, y)
    return b.mul(b.unary("sine", x), ch), b.mul(b.unary("cosine", x), sh)


def cos(b: Builder, z: Planes) -> Planes:
    x, y = z
    sh, ch = sinh_cosh(b, y)
    return b.mul(b.unary("cosine", x), ch), b.neg(b.mul(b.unary("sine", x), sh))


def tanh(b: Builder, z: Planes) -> Planes:
    """(sinh x cosh x, sin y cos y) / (sinh^2 x + cos^2 y): the half-angle form of
    (sinh 2x, sin 2y) / (cosh 2x + cos 2y), so 2x and 2y never overflow. For |x| > 40
    (sinh^2 would overflow) it is (sign x, 4 sin y cos y e^(-2|x|))."""
    x, y = z
    sh, ch = sinh_cosh(b, x)
    sy, cy = b.unary("sine", y), b.unary("cosine", y)
    d = b.add(b.mul(sh, sh), b.mul(cy, cy))
    re, im = b.div(b.mul(sh, ch), d), b.div(b.mul(sy, cy), d)
    big = b.compare(b.abs(x), b.const(40.0, x), "GT")
    tiny = b.mul(b.mul(b.const(4.0, x), b.mul(sy, cy)),
                 b.unary("exponential", b.mul(b.const(-2.0, x), b.abs(x))))
    # x infinite: (sign x, 0 sin 2y); y infinite with x finite: NaN (C99's ctanh)
    sign = b.select(_or(b, is_fin(b, y), is_inf(b, x)), b.unary("sign", x), b.const(np.nan, x))
    tiny = b.select(is_inf(b, x), b.const(0.0, x), tiny)
    return b.select(big, sign, re), b.select(big, tiny, im)


def tan(b: Builder, z: Planes) -> Planes:
    """tan z = -i tanh(i z)."""
    x, y = z
    re, im = tanh(b, (b.neg(y), x))
    return im, b.neg(re)


def logistic(b: Builder, z: Planes) -> Planes:
    one = b.const(1.0, z[0])
    e = exp(b, (b.neg(z[0]), b.neg(z[1])))
    return div(b, (one, b.const(0.0, one)), (b.add(one, e[0]), e[1]))


def sign(b: Builder, z: Planes) -> Planes:
    """z / |z|, 0 at 0 (NaN stays NaN)."""
    m = abs_(b, z)
    zero = b.const(0.0, m)
    is0 = b.compare(m, zero, "EQ")
    safe = b.select(is0, b.const(1.0, m), m)
    return (b.select(is0, zero, b.div(z[0], safe)), b.select(is0, zero, b.div(z[1], safe)))


def _copysign(b: Builder, mag: ir.Value, sgn: ir.Value) -> ir.Value:
    """|mag| with the sign of `sgn`, -0 included (1 / -0 = -inf)."""
    zero = b.const(0.0, sgn)
    neg = _or(b, b.compare(sgn, zero, "LT"),
              b.compare(b.div(b.const(1.0, sgn), sgn), zero, "LT"))
    return b.select(neg, b.neg(b.abs(mag)), b.abs(mag))


def _and(b: Builder, p: ir.Value, q: ir.Value) -> ir.Value:
    return b.emit("and", [p, q], p.shape, "bool")


def _or(b: Builder, p: ir.Value, q: ir.Value) -> ir.Value:
    return b.emit("or", [p, q], p.shape, "bool")


# kind -> expander of a complex result from complex operands (the pass's table).
UNARY = {"exponential": exp, "exponential_minus_one": expm1, "log": log,
         "log_plus_one": log1p, "sqrt": sqrt, "rsqrt": rsqrt, "sine": sin, "cosine": cos,
         "tan": tan, "tanh": tanh, "logistic": logistic, "sign": sign}
BINARY = {"multiply": mul, "divide": div, "power": pow_}
