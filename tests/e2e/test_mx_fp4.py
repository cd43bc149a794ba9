"""float4_e2m1fn as a device type (issue 18, FP4): transfers, converts with OCP rounding
(round to nearest even, saturating at +-6 like ml_dtypes; NaN -> -0 like XLA's CPU
convert), elementwise ops computed in FP32 and plain dots, each bit-exact with the CPU
backend running the same program."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

F4 = ml_dtypes.float4_e2m1fn


def _values() -> np.ndarray:
    """Normal values, every tie of E2M1 (RNE), beyond +-6 (saturation), Inf, both
    NaNs, signed zeros and subnormal-range values."""
    rng = np.random.default_rng(0)
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
    edge = np.array([5.0001, 4.9999, 7, 1e30, np.inf, np.nan, 0.0, 1e-40, 0.2, 0.26],
                    np.float32)
    out = np.concatenate([rng.standard_normal(2000).astype(np.float32) * 3, ties, -ties,
                          edge, -edge])
    return out


def _same(jax, fn, args, trn, cpu):
    f = jax.jit(fn)
    got = np.asarray(f(*(jax.device_put(a, trn) for a in args)))
    want = np.asarray(f(*(jax.device_put(a, cpu) for a in args)))
    assert got.dtype == want.dtype and got.shape == want.shape
    bad = np.nonzero(got.reshape(-1).view(np.uint8) != want.reshape(-1).view(np.uint8))[0]
    assert bad.size == 0, (bad[:8], got.reshape(-1)[bad[:8]], want.reshape(-1)[bad[:8]])


def test_round_trip_keeps_every_code(jax, trn):
    codes = np.arange(16, dtype=np.uint8).view(F4)
    d = jax.device_put(codes, trn)
    assert d.dtype == F4
    np.testing.assert_array_equal(np.asarray(d).view(np.uint8), np.arange(16))


@pytest.mark.parametrize("src", ["float32", "bfloat16", "float16", "float8_e4m3fn"])
def test_convert_to_float4(jax, trn, cpu, src):
    with np.errstate(over="ignore"):
        x = _values().astype(np.dtype(getattr(ml_dtypes, src, src)))
    _same(jax, lambda a: a.astype(F4), (x,), trn, cpu)


@pytest.mark.parametrize("dst", ["float32", "bfloat16", "float8_e4m3fn"])
def test_convert_from_float4(jax, trn, cpu, dst):
    x = np.arange(16, dtype=np.uint8).view(F4)
    _same(jax, lambda a: a.astype(np.dtype(getattr(ml_dtypes, dst, dst))), (x,), trn, cpu)


@pytest.mark.parametrize("op", ["add", "multiply", "negative", "exp"])
def test_elementwise_in_float4(jax, trn, cpu, op):
    """Inputs widen to FP32, the result rounds back to float4 once (saturating)."""
    import jax.numpy as jnp
    x = _values()[:2000].astype(F4)
    y = x[::-1].copy()
    fn = getattr(jnp, op)
    args = (x,) if op in ("negative", "exp") else (x, y)
    _same(jax, fn, args, trn, cpu)


def test_nan_converts_to_negative_zero(jax, trn, cpu):
    """XLA's convert gives -0 for a NaN of either sign (ml_dtypes: +0 for -NaN)."""
    x = np.array([np.nan, -np.nan], np.float32)
    _same(jax, lambda a: a.astype(F4), (x,), trn, cpu)
    got = np.asarray(jax.jit(lambda a: a.astype(F4))(jax.device_put(x, trn)))
    np.testing.assert_array_equal(got.view(np.uint8), [8, 8])


def test_dot_of_float4_runs_as_bf16(jax, trn, cpu):
    """TensorE reads FP4 only inside nc_matmul_mx (§2.2); a plain dot loads the values as
    BF16, exact. (XLA's CPU backend cannot run an fp4 dot: the reference is the same
    dot of the FP32 values.)"""
    import jax.numpy as jnp
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 96)).astype(F4)
    b = rng.standard_normal((96, 48)).astype(F4)
    got = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))(
        jax.device_put(a, trn), jax.device_put(b, trn))
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-6 * np.abs(want).max())


def test_stochastic_rounding_never_leaves_the_range():
    """A value beyond 6 saturates; stochastic rounding may not step past 6 into the
    next code (0x8, -0), which the FP8 types never reach (their next code is NaN)."""
    from jax_trn.hw.numerics import cast
    x = np.full(4096, 6.5, np.float32)
    y = cast(x, "float4_e2m1fn", "stochastic", np.random.default_rng(0))
    np.testing.assert_array_equal(y.astype(np.float32), 6.0)
    z = cast(np.full(4096, 5.5, np.float32), "float4_e2m1fn", "stochastic",
             np.random.default_rng(0))
    assert set(np.unique(z.astype(np.float32))) == {4.0, 6.0}
