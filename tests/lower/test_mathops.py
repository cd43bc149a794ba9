"""Multi-instruction math (jax_trn/lower/tileops/mathops.py): engines, instruction counts and
results on the simulated core against numpy (the e2e tests compare with JAX's CPU)."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.hw import isa

from .irbuild import binary, unary
from .runner import run

F32 = np.float32


def _instrs(result, cls=None):
    out = [i for k in result.program.kernels for i in k.instructions]
    return [i for i in out if cls is None or isinstance(i, cls)]


def _engines(result) -> set[str]:
    return {i.engine for i in _instrs(result) if not isinstance(i, isa.DmaCopy)}


@pytest.mark.parametrize("kind,fn", [("sine", np.sin), ("cosine", np.cos), ("tan", np.tan)])
def test_trig_reduces_into_sins_range(kind, fn):
    """Strict ScalarE ranges (the default) would give NaN if sin saw |arg| > pi."""
    x = np.linspace(-3000, 3000, 4001, dtype=F32)
    if kind == "tan":
        x = x[np.abs(np.cos(x)) > 0.05]
    res = run(unary(kind, x.shape), x)
    np.testing.assert_allclose(res.outputs[0], fn(x.astype(np.float64)),
                               rtol=1e-5 if kind == "tan" else 0, atol=1e-6)
    assert {i.func for i in _instrs(res, isa.Activation)} <= {"sin", "sign"}


@pytest.mark.parametrize("kind,fn", [("floor", np.floor), ("ceil", np.ceil),
                                     ("round_nearest_even", np.rint)])
def test_rounding_is_exact(kind, fn):
    x = np.concatenate([np.arange(-40, 41, dtype=F32) / 8,
                        F32([2 ** 23 + 1, -(2 ** 24) - 2, 2 ** 22 + 0.5, 1e-38, np.inf,
                             -np.inf, np.nan])])
    res = run(unary(kind, x.shape), x)
    np.testing.assert_array_equal(res.outputs[0], fn(x))


@pytest.mark.parametrize("kind,fn", [("floor", np.floor), ("ceil", np.ceil),
                                     ("round_nearest_even", np.rint),
                                     ("round_nearest_afz", np.rint)])
def test_rounding_keeps_large_integral_values(kind, fn):
    """Above 2**24 every float32 is an integer: it must come back unchanged (the step
    |x| - min(|x|, 2**23) used to round, e.g. round(1.9281036e14) gave 1.9281034e14)."""
    x = F32([1.9281036e14, -1.9281036e14, 3e38, -2.0 ** 100, 2.0 ** 24 + 2, 1.37 * 2 ** 60])
    res = run(unary(kind, x.shape), x)
    np.testing.assert_array_equal(res.outputs[0], fn(x))


def test_round_away_from_zero_ties():
    x = F32([0.5, -0.5, 1.5, -2.5, 2.5, 0.49999997, -0.49999997, 8388607.5])
    res = run(unary("round_nearest_afz", x.shape), x)
    np.testing.assert_array_equal(res.outputs[0], np.sign(x) * np.floor(np.abs(x) + 0.5)
                                  * (np.abs(x) != F32(0.49999997)))


def test_is_finite_is_one_vector_instruction():
    x = F32([1.0, -0.0, np.inf, -np.inf, np.nan, 3e38])
    res = run(unary("is_finite", x.shape, out_dtype="bool"), x)
    np.testing.assert_array_equal(res.outputs[0], np.isfinite(x))
    assert len(_instrs(res, isa.TensorScalar)) == 1


@pytest.mark.parametrize("dtype", ["int32", "uint32"])
def test_bit_counts_run_on_gpsimd(dtype):
    info = np.iinfo(dtype)
    x = np.array([0, 1, 2, 3, 255, 1 << 20, info.max, info.min, 12345678], np.int64)
    x = x.astype(dtype)
    bits = [bin(int(v) & 0xFFFFFFFF) for v in x]
    pop = run(unary("popcnt", x.shape, dtype), x)
    clz = run(unary("count_leading_zeros", x.shape, dtype), x)
    np.testing.assert_array_equal(pop.outputs[0], [b.count("1") for b in bits])
    np.testing.assert_array_equal(clz.outputs[0],
                                  [32 - (len(b) - 2) if b != "0b0" else 32 for b in bits])
    assert _engines(pop) == _engines(clz) == {"gpsimd"}


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int64", "uint64"])
def test_bit_counts_of_other_widths(dtype):
    """Narrow types are zero-extended to 32 bits, 64-bit ones counted as two words."""
    info, width = np.iinfo(dtype), 8 * np.dtype(dtype).itemsize
    x = np.array([0, 1, 2, 3, 100, info.max, info.min, info.max // 3], dtype)
    bits = [format(int(v) & ((1 << width) - 1), f"0{width}b") for v in x]
    pop = run(unary("popcnt", x.shape, dtype), x)
    clz = run(unary("count_leading_zeros", x.shape, dtype), x)
    np.testing.assert_array_equal(pop.outputs[0], [b.count("1") for b in bits])
    np.testing.assert_array_equal(clz.outputs[0], [len(b) - len(b.lstrip("0")) for b in bits])
    assert _engines(pop) == _engines(clz) == {"gpsimd"}


def test_atan2_quadrants():
    y = F32([0.0, 1.0, -1.0, 0.0, 2.0, -2.0, 0.0, 3.0, 1e-3, -5.0])
    x = F32([1.0, 0.0, 0.0, -1.0, -2.0, -2.0, 0.0, 3.0, -4.0, 1e-3])
    res = run(binary("atan2", y.shape), y, x)
    np.testing.assert_allclose(res.outputs[0], np.arctan2(y, x), rtol=1e-6, atol=1e-7)


def _ulps(a, b) -> np.ndarray:
    """Distance in float32 ulps (the ordered bit patterns)."""
    ia, ib = (np.asarray(v, F32).view(np.int32).astype(np.int64) for v in (a, b))
    ia, ib = (np.where(i < 0, -(i & 0x7FFFFFFF), i) for i in (ia, ib))
    return np.abs(ia - ib)


def test_cbrt_is_within_two_ulps_over_the_range():
    """One power of float32(1/3) is off by |ln x| * 1e-8 relatively (17 ulps at 1e-38);
    the second, tiny power puts that back."""
    x = F32(2.0) ** np.arange(-149, 128, 3, dtype=F32)
    x = np.concatenate([x, -1.37 * x, F32([0.0, -0.0, np.inf, -np.inf])]).astype(F32)
    res = run(unary("cbrt", x.shape), x)
    assert _ulps(res.outputs[0], np.cbrt(x.astype(np.float64)).astype(F32)).max() <= 2
    assert np.signbit(res.outputs[0][-3]) and np.isnan(run(unary("cbrt", (1,)), F32([np.nan])).outputs[0]).all()


def test_atan2_of_a_finite_value_and_an_infinity():
    """IEEE: atan2(y, +inf) = +-0, atan2(y, -inf) = +-pi, atan2(+-inf, x) = +-pi/2, and
    inf against inf gives the odd multiples of pi/4 (magnitudes were capped at FLT_MAX,
    so 3e38 against inf gave 0.72)."""
    big = F32([3e38, -3e38, 1e30, -1.0, 0.0, -0.0])
    inf = F32([np.inf, -np.inf])
    y = np.concatenate([np.repeat(big, 2), np.tile(inf, 6), F32([np.inf, np.inf, -np.inf, -np.inf])])
    x = np.concatenate([np.tile(inf, 6), np.repeat(big, 2), F32([np.inf, -np.inf, np.inf, -np.inf])])
    res = run(binary("atan2", y.shape), y.astype(F32), x.astype(F32))
    want = np.arctan2(y, x).astype(F32)
    np.testing.assert_array_equal(res.outputs[0], want)
    np.testing.assert_array_equal(np.signbit(res.outputs[0]), np.signbit(want))
