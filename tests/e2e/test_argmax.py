"""argmax / argmin (a variadic reduce over values and iota indices) on trn against the CPU
backend: dtypes, axes, shapes on and off 128, ties (the smallest index wins), NaN (the
first NaN wins), the identity values, and a variadic reduce that is not an argmax."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

SHAPES = [(7,), (130, 3), (4, 600)]
AXES = [0, 1, -1, None]
DTYPES = ["float32", "bfloat16", "int32"]


def _np_dtype(dtype):
    return np.dtype(getattr(ml_dtypes, dtype, dtype))


def _ties(shape, dtype, rng):
    """Few distinct values, so every reduced line has repeated maxima and minima."""
    return rng.integers(-2, 3, shape).astype(np.float32).astype(_np_dtype(dtype))


def _same(jax, trn, cpu, fn, x):
    f = jax.jit(fn)
    out = f(jax.device_put(x, trn))
    ref = f(jax.device_put(x, cpu))
    assert out.devices() == {trn}
    assert out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_ties(jax, trn, cpu, name, shape, axis, dtype):
    if axis is not None and axis >= len(shape):
        pytest.skip("no such axis")
    x = _ties(shape, dtype, np.random.default_rng(sum(shape)))
    _same(jax, trn, cpu, lambda x: getattr(jax.numpy, name)(x, axis=axis), x)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("axis", AXES)
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_nan(jax, trn, cpu, name, axis, dtype):
    rng = np.random.default_rng(3)
    x = rng.uniform(-3, 3, (130, 5)).astype(np.float32)
    x[rng.random(x.shape) < 0.05] = np.nan      # some lines with one or more NaNs
    x[7, :] = np.nan
    x[:, 2] = 3.5                               # a column of maxima, ties along axis 0
    x[9, 4] = np.nan
    _same(jax, trn, cpu, lambda x: getattr(jax.numpy, name)(x, axis=axis),
          x.astype(_np_dtype(dtype)))


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_identity_values(jax, trn, cpu, dtype):
    """Lines holding only the init value (-inf / INT32_MIN for argmax) give index 0."""
    lo = -np.inf if dtype != "int32" else np.iinfo(np.int32).min
    hi = np.inf if dtype != "int32" else np.iinfo(np.int32).max
    x = np.full((3, 130), lo, np.float64)
    x[1, 5], x[2, 129] = 0, hi
    y = np.full((3, 130), hi, np.float64)
    y[1, 7] = 0
    for data, fn in ((x, "argmax"), (y, "argmin")):
        data = data.astype(_np_dtype(dtype))
        for axis in (0, 1):
            _same(jax, trn, cpu, lambda v: getattr(jax.numpy, fn)(v, axis=axis), data)


def test_lax_argmax_and_keepdims(jax, trn, cpu):
    x = _ties((4, 600), "float32", np.random.default_rng(0))
    _same(jax, trn, cpu, lambda v: jax.lax.argmax(v, 1, jax.numpy.int32), x)
    _same(jax, trn, cpu, lambda v: jax.lax.argmin(v, 0, jax.numpy.int32), x)
    _same(jax, trn, cpu, lambda v: jax.numpy.argmax(v, axis=1, keepdims=True), x)
    _same(jax, trn, cpu, lambda v: jax.numpy.argmin(v * 2 + 1, axis=None), x)


def test_argmax_of_3d_middle_axis(jax, trn, cpu):
    x = _ties((5, 130, 3), "float32", np.random.default_rng(1))
    _same(jax, trn, cpu, lambda v: jax.numpy.argmax(v, axis=1), x)
    _same(jax, trn, cpu, lambda v: jax.numpy.argmin(v, axis=(2)), x)


def test_other_variadic_reduce_is_a_clear_error(jax, trn):
    lax = jax.lax

    def sums(x):    # not separable (split-reductions): result 1 reads operand 0
        return lax.reduce((x, x * 2), (np.float32(0), np.float32(0)),
                          lambda a, b: (a[0] + b[0], a[1] + b[0]), (0,))

    with pytest.raises(Exception, match="reduce of 2 operands at once that is not an argmax"):
        jax.jit(sums)(jax.device_put(np.ones((4, 3), np.float32), trn))


@pytest.mark.parametrize("shape,axis", [((3, 5000), 1), ((300, 260), 0), ((20000,), None),
                                        ((260, 300), 1)])
def test_argmax_large(jax, trn, cpu, shape, axis):
    """Several chunks along the reduced axis, and more than 128 kept lines."""
    x = _ties(shape, "float32", np.random.default_rng(5)) * 0.25
    x.reshape(-1)[x.size // 2] = 1.5                # one maximum late in the data
    _same(jax, trn, cpu, lambda v: jax.numpy.argmax(v, axis=axis), x)
    _same(jax, trn, cpu, lambda v: jax.numpy.argmin(v, axis=axis), x)


def test_argmax_int32_beyond_fp32(jax, trn, cpu):
    """Integers FP32 cannot tell apart still compare exactly."""
    x = np.array([[2**24 + 1, 2**24, 5, 2**30 + 3, 2**30 + 1],
                  [2**24 + 1, 2**24, 0, 1, 2],
                  [-2**31, -2**31 + 1, -2**31 + 3, -2**31, 0]], np.int32)
    for axis in (0, 1, None):
        _same(jax, trn, cpu, lambda v: jax.numpy.argmax(v, axis=axis), x)
        _same(jax, trn, cpu, lambda v: jax.numpy.argmin(v, axis=axis), x)
