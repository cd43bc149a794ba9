"""reduce_window and select_and_scatter on trn against the CPU backend: cumulative ops
(scan on VectorE) over each axis, a long axis in O(n), pooling (VALID / SAME / strided /
dilated, max and average, 1-D), the max-pool gradient, and unsupported bodies."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.conftest import assert_close

CUMULATIVE = ["cumsum", "cumprod", "cummax", "cummin"]


def _run(jax, trn, cpu, fn, *xs):
    f = jax.jit(fn)
    out = f(*[jax.device_put(x, trn) for x in xs])
    ref = f(*[jax.device_put(x, cpu) for x in xs])
    assert out.devices() == {trn}
    assert out.shape == ref.shape and out.dtype == ref.dtype
    return np.asarray(out), np.asarray(ref)


def _cumulative(jax, name, axis, reverse=False):
    return lambda x: getattr(jax.lax, name)(x, axis=axis, reverse=reverse)


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("name", CUMULATIVE)
def test_cumulative_over_each_axis(jax, trn, cpu, name, axis):
    x = np.random.default_rng(axis).uniform(0.5, 1.5, (5, 7, 6)).astype(np.float32)
    out, ref = _run(jax, trn, cpu, _cumulative(jax, name, axis), x)
    if name in ("cummax", "cummin"):
        np.testing.assert_array_equal(out, ref)
    else:
        assert_close(out, ref, "float32")


@pytest.mark.parametrize("name", CUMULATIVE)
def test_cumulative_reverse(jax, trn, cpu, name):
    """reverse=True scans right to left (rounding order differs from CPU's left-to-right
    window sums: compared within tolerance)."""
    x = np.random.default_rng(1).uniform(0.5, 1.5, (3, 300)).astype(np.float32)
    out, ref = _run(jax, trn, cpu, _cumulative(jax, name, 1, reverse=True), x)
    assert_close(out, ref, "float32", rtol=1e-4)


@pytest.mark.parametrize("name, reverse", [("cumsum", False), ("cummax", False),
                                           ("cumsum", True)])
def test_cumulative_along_strided_axis_is_transposed(jax, trn, cpu, name, reverse):
    x = np.random.default_rng(11).standard_normal((2, 40, 33)).astype(np.float32)
    out, ref = _run(jax, trn, cpu, _cumulative(jax, name, 1, reverse), x)
    assert_close(out, ref, "float32", rtol=1e-5, atol=1e-5)


def test_jnp_cumsum_cumprod_flat_and_integer(jax, trn, cpu):
    jnp = jax.numpy
    rng = np.random.default_rng(2)
    x = rng.integers(-1000, 1000, (4, 130)).astype(np.int32)
    out, ref = _run(jax, trn, cpu, lambda x: jnp.cumsum(x, axis=1), x)
    np.testing.assert_array_equal(out, ref)
    out, ref = _run(jax, trn, cpu, lambda x: jnp.cumsum(x), x)     # flattened
    np.testing.assert_array_equal(out, ref)
    y = rng.integers(-2, 3, (6, 9)).astype(np.int32)
    out, ref = _run(jax, trn, cpu, lambda x: jnp.cumprod(x, axis=0), y)
    np.testing.assert_array_equal(out, ref)


def test_cumsum_bf16_and_nan(jax, trn, cpu):
    jnp = jax.numpy
    x = np.random.default_rng(3).integers(-3, 4, (4, 40)).astype(ml_dtypes.bfloat16)
    out, ref = _run(jax, trn, cpu, lambda x: jnp.cumsum(x, axis=1), x)
    np.testing.assert_array_equal(out.astype(np.float32), ref.astype(np.float32))
    y = np.float32([[1, np.nan, 2, 3], [4, 1, -np.inf, 7]])
    for name in ("cumsum", "cummax"):
        out, ref = _run(jax, trn, cpu, _cumulative(jax, name, 1), y)
        np.testing.assert_array_equal(out, ref)


def test_cumsum_long_axis_is_linear(jax, trn, cpu):
    """4096 elements: 128 segment scans of 32 (cost max(MIN_II, 2N), §6.3) plus the
    carries across partitions, far from the 4096^2 / 2 adds of window sums; a two-level
    FP32 sum within tolerance of CPU."""
    import jax_trn
    x = np.random.default_rng(4).standard_normal(4096).astype(np.float32)
    f = jax.jit(jax.numpy.cumsum)
    xd = jax.device_put(x, trn)
    with jax_trn.profile() as prof:
        out = np.asarray(f(xd))
    ref = np.asarray(f(jax.device_put(x, cpu)))
    assert_close(out, ref, "float32", rtol=1e-4, atol=3e-4)
    assert prof.executions[-1].simulated_time_s < 10e-6


@pytest.mark.parametrize("name, shape, dtype", [
    ("cumsum", (5000,), "float32"),        # 40 per partition, a partial last partition
    ("cummax", (2, 3000), "float32"),
    ("cumprod", (1500,), "float32"),
    ("cumsum", (4096,), "int32"),
    ("cummin", (3, 1100), "int32"),
])
def test_long_lines_scan_on_all_partitions(jax, trn, cpu, name, shape, dtype):
    rng = np.random.default_rng(len(shape))
    if dtype == "int32":
        x = rng.integers(-10 ** 5, 10 ** 5, shape).astype(np.int32)
    elif name == "cumprod":
        x = (1 + 1e-3 * rng.standard_normal(shape)).astype(np.float32)
    else:
        x = rng.standard_normal(shape).astype(np.float32)
    out, ref = _run(jax, trn, cpu, _cumulative(jax, name, len(shape) - 1), x)
    if dtype == "int32" or name == "cummax":
        np.testing.assert_array_equal(out, ref)
    else:
        assert_close(out, ref, "float32", rtol=1e-5, atol=1e-4)


def _pool(jax, init, op, window, strides, padding, **kw):
    return lambda x: jax.lax.reduce_window(x, init, op, window, strides, padding, **kw)


@pytest.mark.parametrize("padding", ["VALID", "SAME"])
@pytest.mark.parametrize("window, strides", [((1, 2, 2, 1), (1, 2, 2, 1)),
                                             ((1, 3, 3, 1), (1, 2, 2, 1)),
                                             ((1, 3, 3, 1), (1, 1, 1, 1))])
def test_max_pool_nhwc(jax, trn, cpu, window, strides, padding):
    x = np.random.default_rng(5).standard_normal((2, 9, 10, 5)).astype(np.float32)
    out, ref = _run(jax, trn, cpu, _pool(jax, -np.inf, jax.lax.max, window, strides,
                                         padding), x)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("init, op, window, strides, padding", [
    (-np.inf, "max", (1, 1, 2, 2), (1, 1, 2, 2), "VALID"),
    (-np.inf, "max", (1, 1, 2, 2), (1, 1, 2, 2), "SAME"),
    (0.0, "add", (1, 1, 3, 2), (1, 1, 2, 2), "SAME"),
    (1.0, "mul", (1, 1, 1, 5), (1, 1, 1, 5), "VALID"),
])
def test_pool_nchw_last_dim_tiled(jax, trn, cpu, init, op, window, strides, padding):
    """Windows tiling the last dim load it as an inner free axis (TensorReduce)."""
    x = np.random.default_rng(12).uniform(0.5, 1.5, (2, 3, 9, 10)).astype(np.float32)
    out, ref = _run(jax, trn, cpu, _pool(jax, init, getattr(jax.lax, op), window, strides,
                                         padding), x)
    assert_close(out, ref, "float32")


def test_avg_pool_and_min_pool(jax, trn, cpu):
    x = np.random.default_rng(6).standard_normal((2, 8, 8, 16)).astype(np.float32)
    avg = _pool(jax, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "SAME")
    out, ref = _run(jax, trn, cpu, lambda x: avg(x) / 4, x)
    assert_close(out, ref, "float32")
    out, ref = _run(jax, trn, cpu, _pool(jax, np.inf, jax.lax.min, (1, 3, 3, 1),
                                         (1, 2, 2, 1), "VALID"), x)
    np.testing.assert_array_equal(out, ref)


def test_product_window(jax, trn, cpu):
    x = np.random.default_rng(10).uniform(0.5, 1.5, (2, 6, 6, 3)).astype(np.float32)
    out, ref = _run(jax, trn, cpu, _pool(jax, 1.0, jax.lax.mul, (1, 2, 2, 1), (1, 2, 2, 1),
                                         "SAME"), x)
    assert_close(out, ref, "float32")


@pytest.mark.parametrize("dtype", ["bfloat16", "int32"])
def test_max_pool_dtypes(jax, trn, cpu, dtype):
    x = np.random.default_rng(7).integers(-50, 50, (1, 6, 6, 130))
    x = x.astype(getattr(ml_dtypes, dtype, dtype))
    init = np.array(-np.inf if dtype == "bfloat16" else np.iinfo(np.int32).min, x.dtype)
    out, ref = _run(jax, trn, cpu, _pool(jax, init, jax.lax.max, (1, 2, 2, 1),
                                         (1, 2, 2, 1), "VALID"), x)
    np.testing.assert_array_equal(out.astype(np.float32), ref.astype(np.float32))


def test_windows_dilated_1d_and_large(jax, trn, cpu):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((6, 20)).astype(np.float32)
    cases = [
        _pool(jax, 0.0, jax.lax.add, (2, 3), (1, 2), "SAME", window_dilation=(2, 2)),
        _pool(jax, -np.inf, jax.lax.max, (1, 3), (1, 1), [(0, 0), (1, 1)],
              base_dilation=(1, 2)),
        _pool(jax, 0.0, jax.lax.add, (6, 20), (1, 1), "VALID"),           # the whole array
        _pool(jax, 1.0, jax.lax.add, (1, 4), (1, 4), "VALID"),            # non-identity init
        _pool(jax, 1.0, jax.lax.add, (2, 2), (1, 1), [(1, 1), (0, 2)]),   # padding adds nothing
        _pool(jax, 1.0, jax.lax.add, (2, 2), (1, 1), [(1, 0), (1, 1)], base_dilation=(2, 1)),
    ]
    for f in cases:
        out, ref = _run(jax, trn, cpu, f, x)
        assert_close(out, ref, "float32")
    y = rng.standard_normal(300).astype(np.float32)
    out, ref = _run(jax, trn, cpu, _pool(jax, -np.inf, jax.lax.max, (5,), (2,), "SAME"), y)
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("window, strides, padding", [
    ((1, 2, 2, 1), (1, 2, 2, 1), "VALID"),       # non-overlapping: direct strided writes
    ((1, 2, 2, 1), (1, 2, 2, 1), "SAME"),        # non-overlapping, padded
    ((1, 3, 3, 1), (1, 2, 2, 1), "SAME"),        # overlapping and padded: read-add-write
])
def test_pool_gradient(jax, trn, cpu, window, strides, padding):
    _check_pool_gradient(jax, trn, cpu, "max", window, strides, padding)


def test_min_pool_gradient(jax, trn, cpu):
    _check_pool_gradient(jax, trn, cpu, "min", (1, 3, 3, 1), (1, 2, 2, 1), "SAME")


def _check_pool_gradient(jax, trn, cpu, kind, window, strides, padding):
    rng = np.random.default_rng(9)
    x = rng.integers(-3, 4, (2, 7, 8, 3)).astype(np.float32)     # ties: the first wins
    init = -np.inf if kind == "max" else np.inf
    pool = _pool(jax, init, getattr(jax.lax, kind), window, strides, padding)
    out, ref = _run(jax, trn, cpu, jax.grad(lambda x: (pool(x) ** 2).sum()), x)
    assert_close(out, ref, "float32")


def test_run_time_init(jax, trn, cpu):
    x = np.random.default_rng(13).standard_normal((6, 10)).astype(np.float32)
    for padding in ("VALID", "SAME"):
        f = jax.jit(lambda x, i: jax.lax.reduce_window(x, i, jax.lax.add, (2, 2), (1, 1),
                                                       padding))
        out = f(jax.device_put(x, trn), jax.device_put(np.float32(0.5), trn))
        ref = f(jax.device_put(x, cpu), jax.device_put(np.float32(0.5), cpu))
        assert_close(out, ref, "float32")


def test_any_body_and_several_operands_match_cpu(jax, trn, cpu):
    """Bodies other than one add / max / min / multiply, and several operands at once,
    run offset by offset (windowbody.py; they were compile errors)."""
    x = np.random.default_rng(0).normal(size=(4, 8)).astype(np.float32)
    f = jax.jit(lambda x: jax.lax.reduce_window(x, 0.0, lambda a, b: a + 2 * b, (1, 2),
                                                (1, 2), "VALID"))
    np.testing.assert_allclose(f(jax.device_put(x, trn)), f(jax.device_put(x, cpu)),
                               rtol=1e-6)
    g = jax.jit(lambda x: jax.lax.reduce_window(
        (x, x), (0.0, 0.0), lambda a, b: (a[0] + b[0], a[1] + b[0]), (1, 2), (1, 1), "VALID"))
    for o, r in zip(g(jax.device_put(x, trn)), g(jax.device_put(x, cpu))):
        np.testing.assert_allclose(o, r, rtol=1e-6)


def test_any_body_over_a_huge_window_is_a_compile_error(jax, trn):
    x = jax.device_put(np.ones((4, 300), np.float32), trn)
    f = jax.jit(lambda x: jax.lax.reduce_window(x, 0.0, lambda a, b: a + 2 * b, (1, 300),
                                                (1, 1), "VALID"))
    with pytest.raises(Exception, match=r"reduce_window.*300 > 256.*float32\[4,300\]"):
        f(x)
