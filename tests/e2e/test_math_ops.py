"""Elementwise math with multi-instruction lowerings (jax_trn/lower/mathops.py), against
JAX's CPU backend: trig over several periods, rounding on halves and negatives,
is_finite on inf / nan, integer bit counts on int32 / uint32."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.e2e.test_ops import check

SHAPES = [(), (7,), (130, 3), (256, 384)]
FLOATS = ["float32", "bfloat16"]
TRANSCENDENTAL_TOL = {"float32": dict(rtol=1e-5, atol=1e-5),
                      "bfloat16": dict(rtol=1e-2, atol=1e-2)}
EXACT_TOL = {"float32": dict(rtol=0, atol=0), "bfloat16": dict(rtol=0, atol=0)}


def _jnp():
    import jax.numpy as jnp
    return jnp


def _lax():
    import jax.lax as lax
    return lax


def _floats(shape, dtype, lo, hi, seed=0):
    x = np.random.default_rng(seed).uniform(lo, hi, shape).astype(np.float32)
    return x.astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))


def _halves(shape, dtype, seed=0):
    """Multiples of 0.25 in [-8, 8] (ties for rounding) plus random fractions."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-32, 33, shape).astype(np.float32) / 4
    x = np.where(rng.random(shape) < 0.3, rng.uniform(-9, 9, shape), x).astype(np.float32)
    return x.astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))


TRANSCENDENTAL = {
    "sine": (lambda x: _jnp().sin(x), (-40.0, 40.0)),
    "cosine": (lambda x: _jnp().cos(x), (-40.0, 40.0)),
    "tan": (lambda x: _jnp().tan(x), (-1.4, 1.4)),
    "log_plus_one": (lambda x: _jnp().log1p(x), (-0.9, 5.0)),
    "exponential_minus_one": (lambda x: _jnp().expm1(x), (-3.0, 3.0)),
    "cbrt": (lambda x: _jnp().cbrt(x), (-30.0, 30.0)),
}
ROUNDING = {
    "floor": lambda x: _jnp().floor(x),
    "ceil": lambda x: _jnp().ceil(x),
    "round_nearest_even": lambda x: _jnp().round(x),
    "round_nearest_afz": lambda x: _lax().round(x, _lax().RoundingMethod.AWAY_FROM_ZERO),
    "sign": lambda x: _jnp().sign(x),
}


@pytest.mark.parametrize("name", sorted(TRANSCENDENTAL))
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_transcendental(jax, trn, cpu, name, dtype, shape):
    fn, (lo, hi) = TRANSCENDENTAL[name]
    check(jax, trn, cpu, fn, _floats(shape, dtype, lo, hi), **TRANSCENDENTAL_TOL[dtype])


@pytest.mark.parametrize("name", ["log_plus_one", "exponential_minus_one", "sine", "tan"])
def test_small_arguments_keep_relative_precision(jax, trn, cpu, name):
    x = np.float32(10.0) ** -np.linspace(1, 12, 64, dtype=np.float32)
    x = np.concatenate([x, -x]).astype(np.float32)
    check(jax, trn, cpu, TRANSCENDENTAL[name][0], x, rtol=1e-5, atol=0)


def test_trig_of_large_arguments(jax, trn, cpu):
    x = _floats((512,), "float32", -1000.0, 1000.0)
    x[:4] = [np.pi, -np.pi, np.pi / 2, 1e4]
    for name in ("sine", "cosine"):
        check(jax, trn, cpu, TRANSCENDENTAL[name][0], x, rtol=0, atol=1e-6)
    t = _floats((512,), "float32", -100.0, 100.0)
    t = np.where(np.abs(np.cos(t)) < 0.05, 0.5, t).astype(np.float32)    # off the poles
    check(jax, trn, cpu, TRANSCENDENTAL["tan"][0], t, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(ROUNDING))
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rounding(jax, trn, cpu, name, dtype, shape):
    check(jax, trn, cpu, ROUNDING[name], _halves(shape, dtype), **EXACT_TOL[dtype])


@pytest.mark.parametrize("name", sorted(ROUNDING))
def test_rounding_of_large_and_special_values(jax, trn, cpu, name):
    x = np.array([2.0 ** 23 + 1, -(2.0 ** 23) - 3, 2.0 ** 22 + 0.5, -(2.0 ** 22) - 0.5,
                  3e9, -3e9, 1e-30, -1e-30, 0.5, -0.5, 1.5, -2.5, 0.49999997,
                  np.inf, -np.inf, np.nan], np.float32)
    check(jax, trn, cpu, ROUNDING[name], x, rtol=0, atol=0)
    if name == "sign":
        return                  # ScalarE sign(-0) is +0 (equal to CPU's -0, not bitwise)
    x = np.array([-0.4, -0.0, -0.5, -1e-30, 0.0, 0.4, -1.5], np.float32)
    out = jax.jit(ROUNDING[name])(jax.device_put(x, trn))
    ref = jax.jit(ROUNDING[name])(jax.device_put(x, cpu))
    np.testing.assert_array_equal(np.signbit(out), np.signbit(ref))      # -0 stays -0


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_is_finite(jax, trn, cpu, dtype, shape):
    x = _floats(shape, dtype, -1e3, 1e3).astype(np.float32)
    flat = x.reshape(-1)
    flat[::3], flat[1::5], flat[2::7] = np.inf, -np.inf, np.nan
    x = flat.reshape(shape).astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))
    check(jax, trn, cpu, lambda a: _jnp().isfinite(a), x)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_atan2(jax, trn, cpu, dtype, shape):
    y, x = _floats(shape, dtype, -5, 5, 1), _floats(shape, dtype, -5, 5, 2)
    check(jax, trn, cpu, lambda a, b: _jnp().arctan2(a, b), y, x,
          **TRANSCENDENTAL_TOL[dtype])


def test_atan2_axes_and_zeros(jax, trn, cpu):
    v = np.array([0.0, -0.0, 1.0, -1.0, 2.5, np.inf, -np.inf, np.nan], np.float32)
    y, x = (a.ravel() for a in np.meshgrid(v, v))
    out = np.asarray(jax.jit(_jnp().arctan2)(jax.device_put(y, trn), jax.device_put(x, trn)))
    ref = np.arctan2(y, x)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    assert (np.signbit(out) == np.signbit(ref))[~np.isnan(ref)].all()
    check(jax, trn, cpu, lambda a, b: _jnp().arctan2(a, b), y, x, rtol=1e-6, atol=1e-6)


def _ints(shape, dtype, seed=0):
    info = np.iinfo(dtype)
    x = np.random.default_rng(seed).integers(info.min, info.max, shape, dtype=np.int64,
                                             endpoint=True)
    flat = x.reshape(-1)
    flat[:6] = [0, 1, -1 if info.min < 0 else 2, info.max, info.min, 1 << 16][:flat.size]
    return flat.reshape(shape).astype(dtype)


INTEGER = {
    "popcnt": lambda x: _lax().population_count(x),
    "count_leading_zeros": lambda x: _lax().clz(x),
    "sign": lambda x: _jnp().sign(x),
    "not": lambda x: ~x,
}


@pytest.mark.parametrize("name", sorted(INTEGER))
@pytest.mark.parametrize("dtype", ["int32", "uint32"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_integer(jax, trn, cpu, name, dtype, shape):
    check(jax, trn, cpu, INTEGER[name], _ints(shape, dtype))


@pytest.mark.parametrize("dtype", FLOATS + ["int32"])
def test_remainder(jax, trn, cpu, dtype):
    if dtype == "int32":
        a, b = _ints((130, 3), dtype, 1) % 1000, _ints((130, 3), dtype, 2) % 37 + 1
    else:
        a, b = _floats((130, 3), dtype, -20, 20, 1), _floats((130, 3), dtype, 0.5, 4, 2)
    check(jax, trn, cpu, lambda u, v: _lax().rem(u, v), a, b)


def test_fused_chain(jax, trn, cpu):
    x = _floats((256, 384), "float32", -10, 10)
    fn = lambda a: _jnp().floor(_jnp().sin(a) * 4) + _jnp().cbrt(a) * _jnp().cos(a)  # noqa
    check(jax, trn, cpu, fn, x, rtol=1e-5, atol=1e-5)


def test_fused_on_broadcast_columns(jax, trn, cpu):
    """Steps whose operands are one value per partition run on [P, 1] scratch tiles."""
    c, y = _floats((130, 1), "float32", -20, 20, 1), _floats((130, 384), "float32", -2, 2, 2)
    jnp = _jnp()
    fn = lambda a, b: (jnp.sin(jnp.broadcast_to(a, b.shape)) * b  # noqa: E731
                       + jnp.floor(jnp.broadcast_to(a, b.shape)) + jnp.arctan2(b, a))
    check(jax, trn, cpu, fn, c, y, rtol=1e-5, atol=1e-5)
