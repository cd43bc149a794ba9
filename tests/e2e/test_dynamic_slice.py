"""dynamic_slice on trn against the CPU backend: start indices are read on the device
(traced operands), clamped like XLA; dynamic_update_slice says why it cannot compile."""
from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.test_ops import _rand, check

DTYPES = ["float32", "bfloat16", "int32"]
SHAPES = [(7,), (130, 3), (4, 600), (2, 3, 5)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_static_index(jax, trn, cpu, shape, dtype):
    x = _rand(shape, dtype, np.random.default_rng(0))
    check(jax, trn, cpu, lambda x: x[3 % shape[0]], x)
    check(jax, trn, cpu, lambda x: x[-1], x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_traced_index(jax, trn, cpu, shape, dtype):
    x = _rand(shape, dtype, np.random.default_rng(1))
    f = jax.jit(lambda x, i: x[i])
    for i in (0, shape[0] - 1, 2 % shape[0]):
        args = (x, np.int32(i))
        out = f(*(jax.device_put(a, trn) for a in args))
        ref = f(*(jax.device_put(a, cpu) for a in args))
        assert out.devices() == {trn}
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


@pytest.mark.parametrize("dtype", DTYPES)
def test_mixed_index(jax, trn, cpu, dtype):
    x = _rand((4, 600), dtype, np.random.default_rng(2))
    check(jax, trn, cpu, lambda x: x[1, 2:5], x)
    y = _rand((2, 3, 5), dtype, np.random.default_rng(3))
    check(jax, trn, cpu, lambda y: y[1, 2:3, 1:4], y)
    check(jax, trn, cpu, lambda y: y[:, 1], y)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,sizes", [((7,), (3,)), ((130, 3), (129, 2)),
                                         ((4, 600), (2, 300)), ((2, 3, 5), (2, 2, 3))])
def test_clamped_starts(jax, trn, cpu, shape, sizes, dtype):
    """Out-of-range starts (negative, past the end) clamp so the slice stays in bounds."""
    x = _rand(shape, dtype, np.random.default_rng(4))
    f = jax.jit(lambda x, *s: jax.lax.dynamic_slice(x, s, sizes))
    for starts in ([-5] * len(shape), [1000] * len(shape), [1] + [-1] * (len(shape) - 1),
                   [0] * (len(shape) - 1) + [2]):
        args = (x, *(np.int32(s) for s in starts))
        out = f(*(jax.device_put(a, trn) for a in args))
        ref = f(*(jax.device_put(a, cpu) for a in args))
        assert out.shape == ref.shape and out.dtype == ref.dtype
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


def test_large_rows(jax, trn, cpu):
    """Rows longer than one SBUF tile are gathered in chunks; many rows use partitions."""
    x = _rand((3, 20000), "float32", np.random.default_rng(5))
    check(jax, trn, cpu, lambda x, i: x[i], x, np.int32(2))
    y = _rand((300, 70), "float32", np.random.default_rng(6))
    check(jax, trn, cpu, lambda y, i: jax.lax.dynamic_slice(y, (i, 5), (290, 1)), y,
          np.int32(4))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,sizes", [((7,), (3,)), ((130, 3), (129, 2)),
                                         ((4, 600), (2, 300)), ((2, 3, 5), (2, 2, 3)),
                                         ((2, 3, 5), (1, 3, 5)), ((130, 3), (1, 3))])
def test_dynamic_update_slice(jax, trn, cpu, shape, sizes, dtype):
    """Update windows with clamped starts, and `.at[i].set` with a traced index."""
    x = _rand(shape, dtype, np.random.default_rng(8))
    v = _rand(sizes, dtype, np.random.default_rng(9))
    f = jax.jit(lambda x, v, *s: jax.lax.dynamic_update_slice(x, v, s))
    for starts in ([-5] * len(shape), [1000] * len(shape), [1] + [-1] * (len(shape) - 1),
                   [0] * (len(shape) - 1) + [2]):
        args = (x, v, *(np.int32(s) for s in starts))
        out = f(*(jax.device_put(a, trn) for a in args))
        ref = f(*(jax.device_put(a, cpu) for a in args))
        assert out.shape == ref.shape and out.dtype == ref.dtype
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


def test_update_index_traced(jax, trn, cpu):
    x = _rand((4, 600), "float32", np.random.default_rng(10))
    g = jax.jit(lambda x, i: jax.lax.dynamic_update_index_in_dim(x, x[0] * 2, i, 0) + 1)
    for i in (0, 3, 2):
        args = (x, np.int32(i))
        out = g(*(jax.device_put(a, trn) for a in args))
        ref = g(*(jax.device_put(a, cpu) for a in args))
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


def test_dynamic_update_slice_large_rows(jax, trn, cpu):
    x = _rand((3, 20000), "float32", np.random.default_rng(11))
    v = _rand((1, 20000), "float32", np.random.default_rng(12))
    check(jax, trn, cpu, lambda x, v, i: jax.lax.dynamic_update_slice(x, v, (i, 0)),
          x, v, np.int32(1))
    y = _rand((300, 70), "float32", np.random.default_rng(13))
    w = _rand((290, 1), "float32", np.random.default_rng(14))
    check(jax, trn, cpu, lambda y, w, i: jax.lax.dynamic_update_slice(y, w, (i, 5)),
          y, w, np.int32(4))


def test_uint32_and_constant_starts(jax, trn, cpu):
    """A uint32 start past 2^31 clamps to the end (no wrap); a constant start is folded."""
    x = _rand((130, 3), "float32", np.random.default_rng(7))
    f = jax.jit(lambda x, i: jax.lax.dynamic_slice(x, (i, np.uint32(1)), (5, 2)))
    for i in (np.uint32(3), np.uint32(2**31 + 5)):
        out = f(jax.device_put(x, trn), jax.device_put(i, trn))
        ref = f(jax.device_put(x, cpu), jax.device_put(i, cpu))
        np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
