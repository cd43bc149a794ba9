"""Every elementwise function over the whole float range, against JAX's CPU backend,
under the default settings (issue 12, item 1).

The defaults keep `strict_activation_ranges` on: the hardware model gives NaN for a
ScalarE input outside the function's published range (§2.4), as the hardware gives
invalid results there. So these sweeps check that the compiler never feeds one
(jax_trn/lower/tileops/ranged.py, trig.py).

Inputs per float type: every power of two of the type, denormals included, and 1.37
times it, both signs, +-0, +-inf, NaN (`sweep`). How results are compared:

- in ulps of the result type (`ulps`), NaN matching only NaN;
- results below the smallest normal count as zero: the CPU backend runs with
  flush-to-zero and denormals-are-zero (x * x of 1e-20 is 0 there), the hardware model
  keeps gradual underflow (`test_the_cpu_backend_flushes_denormals` pins this);
- a denormal input may give the CPU's result or the IEEE one (numpy in float64, rounded):
  the CPU's are not all "as if 0" (log(1e-40) = -103.97, cbrt(1e-40) = -5.6e-16);
- functions JAX decomposes into several ops (chlo: asin, erf, lgamma, ...) run the same
  op sequence on both backends, but the CPU contracts multiply-adds into FMAs and
  flushes denormal intermediates: they may also differ by 1e-6 (f32) absolutely
  (lgamma(1) is 4.8e-7 on CPU), and denormal inputs only must not give NaN where
  neither reference does;
- float16 / bfloat16: 2 ulps of the type, or the suite's 16-bit tolerance (rtol 2e-3 /
  2e-2, tests/conftest.py): both backends compute in float32 and round once;
- zero results carry the CPU's sign (sin(-0), log1p(-0), ceil(-0.7) are -0).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import scipy.special as sp

DTYPES = ["float32", "bfloat16", "float16"]
RTOL16 = {"bfloat16": 2e-2, "float16": 2e-3}


def _jnp():
    import jax.numpy as jnp
    return jnp


def _lax():
    import jax.lax as lax
    return lax


def _np_dtype(dtype: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, dtype, dtype))


def sweep(dtype: str) -> np.ndarray:
    """Every power of two of `dtype` (denormals included) and 1.37x, both signs, and
    +-0, +-inf, NaN."""
    fi = ml_dtypes.finfo(_np_dtype(dtype))
    lo = int(np.log2(float(fi.smallest_subnormal)))
    mags = [m * 2.0 ** e for e in range(lo, int(np.log2(float(fi.max))) + 1)
            for m in (1.0, 1.37) if m * 2.0 ** e <= float(fi.max)]
    x = np.concatenate([mags, np.negative(mags), [0.0, -0.0, np.inf, -np.inf, np.nan]])
    return x.astype(np.float32).astype(_np_dtype(dtype))


def _ordered(a: np.ndarray) -> np.ndarray:
    bits = 8 * a.dtype.itemsize
    u = a.view({16: np.uint16, 32: np.uint32}[bits]).astype(np.int64)
    sign = 1 << (bits - 1)
    return np.where(u & sign, -(u & (sign - 1)), u)


def ftz(a: np.ndarray) -> np.ndarray:
    """Values below the smallest normal as zeros of the same sign."""
    a = np.asarray(a)
    f = a.astype(np.float32)
    tiny = float(ml_dtypes.finfo(a.dtype).smallest_normal)
    return np.where(np.abs(f) < tiny, np.copysign(0.0, f).astype(a.dtype), a)


def ulps(got, want) -> np.ndarray:
    """Distance in ulps of the type, after flushing denormals; NaN only matches NaN."""
    got, want = ftz(got), ftz(want)
    d = np.abs(_ordered(got) - _ordered(want)).astype(np.float64)
    gn, wn = np.isnan(got.astype(np.float32)), np.isnan(want.astype(np.float32))
    return np.where(gn & wn, 0.0, np.where(gn | wn, np.inf, d))


def run(jax, f, device, *args) -> np.ndarray:
    return np.asarray(jax.jit(f)(*(jax.device_put(a, device) for a in args)))


# name: (jax function, numpy float64 reference, ulps allowed in float32)
PRIMITIVE = {
    "exp": (lambda x: _jnp().exp(x), np.exp, 2),
    "exp2": (lambda x: _jnp().exp2(x), np.exp2, 2),
    "expm1": (lambda x: _jnp().expm1(x), np.expm1, 3),
    "log": (lambda x: _jnp().log(x), np.log, 2),
    "log2": (lambda x: _jnp().log2(x), np.log2, 2),
    "log10": (lambda x: _jnp().log10(x), np.log10, 2),
    "log1p": (lambda x: _jnp().log1p(x), np.log1p, 2),
    "sqrt": (lambda x: _jnp().sqrt(x), np.sqrt, 1),
    "rsqrt": (lambda x: _lax().rsqrt(x), lambda x: 1 / np.sqrt(x), 2),
    "cbrt": (lambda x: _jnp().cbrt(x), np.cbrt, 2),
    "reciprocal": (lambda x: 1 / x, lambda x: 1 / x, 0),
    "sin": (lambda x: _jnp().sin(x), np.sin, 2),
    "cos": (lambda x: _jnp().cos(x), np.cos, 2),
    "tan": (lambda x: _jnp().tan(x), np.tan, 4),
    "tanh": (lambda x: _jnp().tanh(x), np.tanh, 4),      # CPU: +-1 beyond 7.9 (4 ulps)
    "logistic": (lambda x: _lax().logistic(x), sp.expit, 2),
    "atan": (lambda x: _jnp().arctan(x), np.arctan, 2),
    "abs": (lambda x: _jnp().abs(x), np.abs, 0),
    "sign": (lambda x: _jnp().sign(x), np.sign, 0),
    "floor": (lambda x: _jnp().floor(x), np.floor, 0),
    "ceil": (lambda x: _jnp().ceil(x), np.ceil, 0),
    "round": (lambda x: _jnp().round(x), np.rint, 0),
}
COMPOSITE = {
    "asin": (lambda x: _jnp().arcsin(x), np.arcsin),
    "acos": (lambda x: _jnp().arccos(x), np.arccos),
    "sinh": (lambda x: _jnp().sinh(x), np.sinh),
    "cosh": (lambda x: _jnp().cosh(x), np.cosh),
    "asinh": (lambda x: _jnp().arcsinh(x), np.arcsinh),
    "acosh": (lambda x: _jnp().arccosh(x), np.arccosh),
    "atanh": (lambda x: _jnp().arctanh(x), np.arctanh),
    "erf": (lambda x: _lax().erf(x), sp.erf),
    "erfc": (lambda x: _lax().erfc(x), sp.erfc),
    "erf_inv": (lambda x: _lax().erf_inv(x), sp.erfinv),
    "lgamma": (lambda x: _lax().lgamma(x), sp.gammaln),
    "digamma": (lambda x: _lax().digamma(x), sp.digamma),
    "softplus": (lambda x: __import__("jax").nn.softplus(x), lambda x: np.logaddexp(x, 0)),
    "log_sigmoid": (lambda x: __import__("jax").nn.log_sigmoid(x),
                    lambda x: -np.logaddexp(-x, 0)),
    "gelu": (lambda x: __import__("jax").nn.gelu(x, approximate=False),
             lambda x: x * sp.ndtr(x)),
}


def _ieee(ref, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(ref(x.astype(np.float64))).astype(np.float32).astype(x.dtype)


def _denormal(x: np.ndarray) -> np.ndarray:
    f = np.abs(x.astype(np.float32))
    return (f > 0) & (f < float(ml_dtypes.finfo(x.dtype).smallest_normal))


def _off(x, got, want, dtype: str, budget: int) -> np.ndarray:
    """Where `got` is further from `want` than allowed for `dtype` (see the docstring)."""
    u = ulps(got, want)
    if dtype == "float32":
        return u > budget
    g, w = ftz(got).astype(np.float64), ftz(want).astype(np.float64)
    with np.errstate(all="ignore"):
        rel = np.abs(g - w) <= RTOL16[dtype] * np.abs(w)
    return (u > 2) & ~rel


def check_sweep(jax, trn, cpu, f, ref, dtype: str, budget: int, atol: float = 0.0,
                composite: bool = False, arg=None) -> None:
    """`arg`: the function's argument as computed from x (float32), when the CPU may
    flush that instead of x (affine forms)."""
    x = sweep(dtype)
    got, want = run(jax, f, trn, x), run(jax, f, cpu, x)
    den = _denormal(x)
    if arg is not None:
        with np.errstate(all="ignore"):
            den |= _denormal(arg(x).astype(x.dtype))
    bad = _off(x, got, want, dtype, budget)
    if atol:
        with np.errstate(all="ignore"):
            bad &= ~(np.abs(ftz(got).astype(np.float64) - ftz(want).astype(np.float64)) <= atol)
    ieee = _ieee(ref, x[den])
    if composite:           # denormal inputs: no NaN where neither reference has one
        gn = np.isnan(got[den].astype(np.float32))
        bad[den] = gn & ~np.isnan(want[den].astype(np.float32)) & ~np.isnan(ieee.astype(np.float32))
    else:
        bad[den] &= _off(x[den], got[den], ieee, dtype, budget)
    bad |= _zero_signs_differ(got, want) & ~den
    assert not bad.any(), (f"{bad.sum()} of {x.size} off, e.g. x, trn, cpu = "
                           f"{list(zip(x[bad][:4], got[bad][:4], want[bad][:4]))}")


def _zero_signs_differ(got, want) -> np.ndarray:
    """Where both results are zeros (normal ones: the CPU flushes) of different signs:
    sin(-0), log1p(-0), ceil(-0.7) are -0 there."""
    g, w = got.astype(np.float32), want.astype(np.float32)
    return (g == 0) & (w == 0) & (np.signbit(g) != np.signbit(w))


@pytest.mark.parametrize("name", sorted(PRIMITIVE))
@pytest.mark.parametrize("dtype", DTYPES)
def test_primitive_over_the_range(jax, trn, cpu, name, dtype):
    f, ref, budget = PRIMITIVE[name]
    check_sweep(jax, trn, cpu, f, ref, dtype, budget)


@pytest.mark.parametrize("name", sorted(COMPOSITE))
@pytest.mark.parametrize("dtype", DTYPES)
def test_composite_over_the_range(jax, trn, cpu, name, dtype):
    f, ref = COMPOSITE[name]
    check_sweep(jax, trn, cpu, f, ref, dtype, 4, atol=1e-6, composite=True)


AFFINE = {   # the forms folding.py used to fold into one Activation: (a, b) of x * a + b
    "log(x + 1e-20)": (_jnp, "log", 1.0, 1e-20),
    "rsqrt(x * 0.5 + 1e-5)": (_lax, "rsqrt", 0.5, 1e-5),
    "sqrt(x * 1e-30)": (_jnp, "sqrt", 1e-30, 0.0),
    "log1p(x * 4e19)": (_jnp, "log1p", 4e19, 0.0),
    "sin(x * 2 - 1)": (_jnp, "sin", 2.0, -1.0),   # x * 2 exact: the CPU backend contracts
}                                                  # x * a + b into one FMA (one rounding)
NUMPY = {"log": np.log, "rsqrt": lambda t: 1 / np.sqrt(t), "sqrt": np.sqrt,
         "log1p": np.log1p, "sin": np.sin}


@pytest.mark.parametrize("name", sorted(AFFINE))
def test_affine_arguments(jax, trn, cpu, name):
    """x * a + b reaches the range reduction first (ScalarE cannot fold it in)."""
    mod, fn, a, b = AFFINE[name]
    def arg(x):             # no "+ 0.0": XLA's CPU simplifier drops it, making -0 stay -0
        return x * np.float32(a) + np.float32(b) if b else x * np.float32(a)
    f = lambda x: getattr(mod(), fn)(x * a + b if b else x * a)  # noqa: E731
    ref = lambda x: NUMPY[fn](arg(x.astype(np.float32)).astype(np.float64))   # noqa: E731
    check_sweep(jax, trn, cpu, f, ref, "float32", 2, arg=arg)


def _grid(dtype: str):
    s = sweep(dtype)
    with np.errstate(over="ignore"):            # 3e38 is inf in float16
        few = np.array([0.0, -0.0, 1.0, -1.0, 0.37, -2.5, 1e-30, -1e30, 3e38, np.inf,
                        -np.inf, np.nan, 1.5, 100.0], np.float32).astype(s.dtype)
    a = np.concatenate([np.repeat(s, few.size), np.tile(few, s.size)])
    b = np.concatenate([np.tile(few, s.size), np.repeat(s, few.size)])
    return a, b


@pytest.mark.parametrize("name", ["atan2", "pow"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_over_the_range(jax, trn, cpu, name, dtype):
    """Every sweep value against a row of special and ordinary ones, both ways round."""
    jnp = _jnp()
    f = jnp.arctan2 if name == "atan2" else jnp.power
    a, b = _grid(dtype)
    got, want = run(jax, f, trn, a, b), run(jax, f, cpu, a, b)
    bad = (_off(a, got, want, dtype, 2) | _zero_signs_differ(got, want)) \
        & ~_denormal(a) & ~_denormal(b)
    assert not bad.any(), list(zip(a[bad][:4], b[bad][:4], got[bad][:4], want[bad][:4]))


@pytest.fixture
def activation_inputs(monkeypatch):
    """Records every ScalarE input outside its function's published range (§2.4) that
    the model sees: (func, count). Negative inputs of log / sqrt / rsqrt are outside
    the functions' domains, not ranges; the model gives them the IEEE NaN (hw/alu.py)."""
    from jax_trn.hw import alu
    seen, real = [], alu.activation

    def recording(func, x, strict=False):
        bad = alu.out_of_range(func, x)
        if func in ("log", "sqrt", "rsqrt"):
            bad &= ~(x < 0)
        if bad.any():
            seen.append((func, int(bad.sum()), x[bad][:3]))
        return real(func, x, strict)
    monkeypatch.setattr(alu, "activation", recording)
    return seen


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_activation_sees_an_input_outside_its_range(jax, trn, activation_inputs, dtype):
    """The direct check: a NaN from an out-of-range input could hide behind a select."""
    x = sweep(dtype)
    for f, *_ in (*PRIMITIVE.values(), *COMPOSITE.values()):
        run(jax, f, trn, x)
    a, b = _grid(dtype)
    run(jax, _jnp().arctan2, trn, a, b)
    assert activation_inputs == []


def test_trig_near_multiples_of_half_pi(jax, trn, cpu):
    """The reduced argument keeps its relative precision next to multiples of pi/2, up
    to 2**40 (x within an ulp of n pi/2: sin or cos of x is tiny)."""
    jnp = _jnp()
    n = np.unique(np.random.default_rng(1).integers(1, 2 ** 40, 20000))
    x = np.concatenate([(n * (np.pi / 2)), np.arange(1, 3000) * (np.pi / 2)]).astype(np.float32)
    for f, budget in ((jnp.sin, 2), (jnp.cos, 2), (jnp.tan, 4)):
        assert ulps(run(jax, f, trn, x), run(jax, f, cpu, x)).max() <= budget


def test_cos_of_small_arguments_is_unbiased(jax, trn):
    """cos x = sin(pi/2 - |x|) for |x| < 1 (and in odd quadrants): pi/2 - |x| rounded
    once. float32(pi/2) alone was 4.4e-8 too big: cos came out 2.2e-8 too high on
    average over [-1, 1] (up to 1.7 ulps), which put the second-order finite
    differences of JAX's lax_control_flow scan tests (testScanHigherOrderDifferentiation)
    out of their tolerance."""
    jnp = _jnp()
    x = np.linspace(-1, 1, 100001, dtype=np.float32)
    want = np.cos(x.astype(np.float64))
    err = run(jax, jnp.cos, trn, x).astype(np.float64) - want
    assert abs(err.mean()) < 5e-9
    assert (np.abs(err) / np.spacing(np.float32(want))).max() < 1.25


def test_trig_of_random_float32_bit_patterns(jax, trn, cpu):
    """Every exponent; the CPU is within 1 ulp of the rounded value, trn within 2 (sin,
    cos) and 4 (tan), so up to 3 and 5 apart (3 and 4 seen)."""
    jnp = _jnp()
    bits = np.random.default_rng(2).integers(0, 2 ** 32, 50000, dtype=np.uint64)
    x = bits.astype(np.uint32).view(np.float32)
    x = x[~_denormal(x)]
    for f, budget in ((jnp.sin, 3), (jnp.cos, 3), (jnp.tan, 5)):
        assert ulps(run(jax, f, trn, x), run(jax, f, cpu, x)).max() <= budget


def test_the_cpu_backend_flushes_denormals(jax, cpu):
    """Why results below the smallest normal are compared as zeros: the CPU backend's
    arithmetic flushes them (if this changes, the comparison above should too)."""
    x = np.array([1e-20, 3e-20], np.float32)
    assert (run(jax, lambda a: a * a, cpu, x) == 0).all()
    assert (run(jax, lambda a: _jnp().sqrt(a * 1e-21), cpu, x) == 0).all()


def test_range_reduction_inside_fusions(jax, trn, cpu):
    """A per-row value (computed on [P, 1] tiles), a matmul epilogue and a reduction
    with fused producers: RMS-norm of rows of ~1e-16 (mean square ~1e-32, below
    rsqrt's 2**-87 but normal, so the CPU does not flush it), sqrt of a tiny matmul
    (~1e-35, below sqrt's 2**-116), the sum of log of tiny values."""
    jnp = _jnp()
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((130, 256)) * 1e-16).astype(np.float32)
    w = (rng.standard_normal((256, 64)) * 1e-19).astype(np.float32)

    def rms(a):
        return a * _lax().rsqrt(jnp.mean(a * a, axis=-1, keepdims=True) + 1e-37)

    def sqrt_dot(a, b):         # positive terms: no cancellation in the FP32 sums
        return jnp.sqrt(jnp.matmul(a, b, precision="highest"))

    for f, args in ((rms, (x,)), (sqrt_dot, (np.abs(x), np.abs(w))),
                    (lambda a: jnp.log(jnp.abs(a) + 1e-30).sum(-1), (x,))):
        got, want = run(jax, f, trn, *args), run(jax, f, cpu, *args)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=0)


def _label_smoothing_loss(logits, labels, confidence=0.9):
    """flax lm1b / gemma: soft targets and log(p + 1e-20) (jnp.log of a softmax)."""
    import jax
    jnp = _jnp()
    n = logits.shape[-1]
    low = (1 - confidence) / (n - 1)
    normalizing = -(confidence * jnp.log(confidence) + (n - 1) * low * jnp.log(low + 1e-20))
    soft = jax.nn.one_hot(labels, n) * (confidence - low) + low
    return (-(soft * jnp.log(jax.nn.softmax(logits) + 1e-20)).sum(-1) - normalizing).mean()


def test_label_smoothing_loss_is_finite_and_equal_to_cpu(jax, trn, cpu):
    rng = np.random.default_rng(4)
    logits = (rng.standard_normal((64, 1000)) * 30).astype(np.float32)  # p down to 1e-60
    labels = rng.integers(0, 1000, 64).astype(np.int32)
    got = run(jax, _label_smoothing_loss, trn, logits, labels)
    want = run(jax, _label_smoothing_loss, cpu, logits, labels)
    assert np.isfinite(got)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _adam(p, g, m, v, t, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    jnp = _jnp()
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    mh, vh = m / (1 - b1 ** t), v / (1 - b2 ** t)
    return p - lr * mh / (jnp.sqrt(vh) + eps), m, v


def _tiny_grads(n: int = 4096, seed: int = 5):
    rng = np.random.default_rng(seed)
    g = (10.0 ** -rng.uniform(18, 30, n) * rng.choice([-1, 1], n)).astype(np.float32)
    p = rng.standard_normal(n).astype(np.float32)
    return p, g


def test_adam_update_with_tiny_gradients(jax, trn, cpu):
    """Gradients of 1e-18 .. 1e-30: v ~ g**2 reaches 1e-60 (sqrt of it was out of range,
    and the parameter became NaN)."""
    p, g = _tiny_grads()
    z = np.zeros_like(p)
    for t in (1.0, 10.0):
        got = run(jax, lambda *a: _adam(*a, t), trn, p, g, z, z)
        want = run(jax, lambda *a: _adam(*a, t), cpu, p, g, z, z)
        assert all(np.isfinite(a).all() for a in got)
        for a, b in zip(got, want):
            np.testing.assert_allclose(ftz(a), ftz(b), rtol=1e-6, atol=0)


def test_optax_adam_with_tiny_gradients(jax, trn, cpu):
    optax = pytest.importorskip("optax")
    p, g = _tiny_grads(seed=6)
    opt = optax.adam(1e-3)

    def step(p, g):
        updates, _ = opt.update(g, opt.init(p), p)
        return optax.apply_updates(p, updates)
    got, want = run(jax, step, trn, p, g), run(jax, step, cpu, p, g)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_rope_angles_of_long_contexts(jax, trn, cpu):
    """gemma's rotary embedding: sin / cos of position * timescale up to 1e5."""
    jnp = _jnp()
    pos = np.arange(0, 100000, 97, dtype=np.float32)
    inv = (1.0 / 10000.0 ** (np.arange(0, 128, 2) / 128)).astype(np.float32)

    def rope(p, i):
        a = p[:, None] * i[None, :]
        return jnp.sin(a), jnp.cos(a)
    got, want = run(jax, rope, trn, pos, inv), run(jax, rope, cpu, pos, inv)
    for a, b in zip(got, want):
        assert ulps(a, b).max() <= 2
