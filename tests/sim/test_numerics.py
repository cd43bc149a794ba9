"""Hardware numerics: RNE, FP32 PSUM accumulation, DMA casts, stochastic rounding,
ScalarE activation input ranges (§2.4, §4)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jax_trn.hw import CHIPS, DramAP, Kernel, NeuronCore, Numerics, alu, isa
from jax_trn.hw.numerics import cast, round_tf32, to_fp32
from tests.sim.helpers import core, run1, tile

BF16 = ml_dtypes.bfloat16


def test_bf16_cast_is_round_to_nearest_even():
    x = np.float32([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -(1 + 2 ** -8)])
    np.testing.assert_array_equal(cast(x, "bfloat16").astype(np.float32),
                                  [1, 1 + 2 ** -6, 1 + 2 ** -7, -1])


def test_to_fp32_is_exact_for_narrow_floats():
    for dtype in (BF16, np.float16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2,
                  ml_dtypes.float8_e4m3):
        dt = np.dtype(dtype)
        bits = np.arange(2 ** (8 * dt.itemsize)).astype(f"u{dt.itemsize}")
        x = bits.view(dt)
        wide = to_fp32(x)
        finite = np.isfinite(wide)
        np.testing.assert_array_equal(wide[finite].astype(dt).view(bits.dtype), bits[finite])


def test_round_tf32():
    x = np.float32([1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -11 + 2 ** -20, np.inf])
    np.testing.assert_array_equal(round_tf32(x), [1, 1 + 2 ** -9, 1 + 2 ** -10, np.inf])


def test_psum_accumulates_4096_bf16_ones_exactly():
    """32 matmuls of K=128 ones accumulate 4096 in FP32 PSUM (BF16 would stop at 256)."""
    st, mv = tile((128, 1), "bfloat16"), tile((128, 8), "bfloat16")
    d = tile((1, 8), "float32", mem="psum")
    c = core()
    c.mem(st).write(st, np.ones(st.shape, BF16))
    c.mem(mv).write(mv, np.ones(mv.shape, BF16))
    instrs = [isa.NcMatmul(dst=d, stationary=st, moving=mv, accumulate=i > 0) for i in range(32)]
    c.run(Kernel("acc", instrs, {}), {})
    np.testing.assert_array_equal(c.mem(d).read(d), np.full((1, 8), 4096, np.float32))


def test_dma_casts_through_fp32():
    src = np.float32([1 / 3, 70000, -2.5, 1e-8])
    out = np.zeros(4, np.float16)
    instr = isa.DmaCopy(dst=DramAP("o", 0, ((1, 4),), "float16"),
                        src=DramAP("i", 0, ((1, 4),), "float32"))
    core().run(Kernel("k", [instr], {}), {"i": src, "o": out})
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(out, src.astype(np.float16))


def test_dma_int_to_int_copies_directly():
    src = np.array([2 ** 40 + 1, -1], np.int64)
    out = np.zeros(2, np.int32)
    instr = isa.DmaCopy(dst=DramAP("o", 0, ((1, 2),), "int32"),
                        src=DramAP("i", 0, ((1, 2),), "int64"))
    core().run(Kernel("k", [instr], {}), {"i": src, "o": out})
    np.testing.assert_array_equal(out, [1, -1])


def _sr_copy(seed: int, x: np.ndarray) -> np.ndarray:
    s, d = tile((1, x.size)), tile((1, x.size), "bfloat16")
    c = core(rounding="stochastic", seed=seed)
    return run1(isa.TensorCopy(dst=d, src=s), {s: x.reshape(1, -1)}, c=c)[0].astype(np.float32)


def test_stochastic_rounding_is_unbiased_and_reproducible():
    x = np.full(20000, 1 + 2 ** -9, np.float32)        # a quarter of a bf16 ulp above 1
    a, b = _sr_copy(7, x), _sr_copy(7, x)
    np.testing.assert_array_equal(a, b)                 # same seed, same bits
    assert set(np.unique(a)) == {1.0, 1 + 2 ** -7}
    assert abs(a.mean() - x[0]) < 2e-4                  # unbiased on average
    assert not np.array_equal(a, _sr_copy(8, x))


def test_stochastic_rounding_keeps_exact_values_and_specials():
    x = np.float32([1.0, -2.5, np.inf, np.nan, 0.0, 3.389531e38])
    out = _sr_copy(1, x)
    np.testing.assert_array_equal(out[:5], x[:5])
    assert np.isfinite(out[5]) or np.isinf(out[5])


def test_a_core_reads_no_environment(monkeypatch):
    """The hardware model takes its numerics from its creator (the runtime builds them
    from the options), never from the environment (ARCHITECTURE.md Seams)."""
    monkeypatch.setenv("JAX_TRN_STOCHASTIC_ROUNDING", "1")
    monkeypatch.setenv("JAX_TRN_STOCHASTIC_ROUNDING_SEED", "42")
    monkeypatch.setenv("JAX_TRN_STRICT_ACTIVATION_RANGES", "0")
    n = NeuronCore(CHIPS["trn2"].core).numerics
    assert (n.rounding, n.seed, n.strict_ranges) == ("rne", 0, True)
    n = NeuronCore(CHIPS["trn2"].core, numerics=Numerics("stochastic", 42, False)).numerics
    assert (n.rounding, n.seed, n.strict_ranges) == ("stochastic", 42, False)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "float16"])
def test_stochastic_rounding_picks_a_neighbour(dtype):
    x = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    s, d = tile((1, 1000)), tile((1, 1000), dtype)
    out = run1(isa.TensorCopy(dst=d, src=s), {s: x[None]}, c=core(rounding="stochastic"))
    uint = f"u{out.itemsize}"
    rne = x.astype(out.dtype).view(uint).astype(int)
    steps = np.abs(out[0].view(uint).astype(int) - rne)
    assert steps.max() <= 1 and steps.any()


NAN, INF = float("nan"), float("inf")
_PI32 = float(np.float32(np.pi))


def _act(func, x, strict=True):
    x = np.float32(x).reshape(1, -1)
    t, d = tile(x.shape), tile(x.shape)
    c = core()
    c.numerics = Numerics(strict_ranges=strict)
    return run1(isa.Activation(dst=d, data=t, func=func), {t: x}, c=c)[0]


@pytest.mark.parametrize("func, x, strict", [
    # §2.4 ranges: log [2^-64, 2^64]; IEEE specials stay exact, domain errors are NaN
    ("log", [2.0 ** -65, 2.0 ** -64, 1, 2.0 ** 64, 2.0 ** 65, 0, -1, INF],
     [NAN, -64 * np.log(2), 0, 64 * np.log(2), NAN, -INF, NAN, INF]),
    ("sqrt", [2.0 ** -117, 2.0 ** -116, 4, 2.0 ** 119, 0, INF, -4],
     [NAN, 2.0 ** -58, 2, NAN, 0, INF, NAN]),
    ("rsqrt", [2.0 ** -88, 2.0 ** -86, 4, 2.0 ** 98, 0],
     [NAN, 2.0 ** 43, 0.5, NAN, INF]),
    ("reciprocal", [2.0 ** -43, -2.0 ** -43, 2.0 ** 43, -2.0 ** 42, 0, -0.5],
     [NAN, NAN, NAN, -2.0 ** -42, INF, -2]),
    ("sin", [_PI32, -_PI32, 3.15, -4, 0.5], [np.sin(np.float32(_PI32)), -np.sin(np.float32(_PI32)),
                                             NAN, NAN, np.sin(0.5)]),
    ("arctan", [1.5, 1.6, -1.6], [np.arctan(1.5), NAN, NAN]),
    ("exp", [-100, 100], [np.exp(np.float32(-100)), INF]),       # no published range
])
def test_activation_input_ranges(func, x, strict):
    np.testing.assert_allclose(_act(func, x), np.float32(strict), rtol=1e-6)


@pytest.mark.parametrize("func, x", [
    ("log", [2.0 ** -65, 2.0 ** 65]), ("sqrt", [2.0 ** -117]), ("rsqrt", [2.0 ** 98]),
    ("reciprocal", [2.0 ** 43]), ("sin", [4.0]), ("arctan", [1.6]),
])
def test_activation_ranges_can_be_turned_off(func, x):
    out = _act(func, x, strict=False)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, alu.activation(func, np.float32(x)), rtol=1e-6)


def test_runtime_cores_take_their_numerics_from_the_options(monkeypatch):
    """What the runtime does: each device's core gets the Numerics of the options
    (JAX_TRN_STOCHASTIC_ROUNDING=1, _SEED=5, JAX_TRN_STRICT_ACTIVATION_RANGES=0,
    JAX_TRN_SIMULATOR_THREADS=1)."""
    from jax_trn import config, systems
    from jax_trn.runtime.device import core_numerics, make_devices
    options = config.resolve(environ={"JAX_TRN_STOCHASTIC_ROUNDING": "1",
                                      "JAX_TRN_STOCHASTIC_ROUNDING_SEED": "5",
                                      "JAX_TRN_STRICT_ACTIVATION_RANGES": "0",
                                      "JAX_TRN_SIMULATOR_THREADS": "1"})
    n = core_numerics(options)
    assert (n.rounding, n.seed, n.strict_ranges, n.lanes) == ("stochastic", 5, False, False)
    assert core_numerics(config.Options()).rounding == "rne"
    assert core_numerics(config.Options()).lanes
    x = np.full((1, 4096), 1 + 2 ** -9, np.float32)
    s, d = tile(x.shape), tile(x.shape, "bfloat16")
    outs = [run1(isa.TensorCopy(dst=d, src=s), {s: x},
                 c=make_devices(systems.SYSTEMS["trn2.3xlarge"], n)[0].core_model)
            for _ in range(2)]
    np.testing.assert_array_equal(outs[0], outs[1])             # seeded: reproducible
    assert len(np.unique(outs[0])) == 2                          # really stochastic


@pytest.mark.parametrize("dtype, x", [
    ("float8_e4m3fn", 1 + 0.3 * 2 ** -3),       # 0.3 of an e4m3 ulp above 1
    ("float8_e5m2", -(2 + 0.7 * 2 ** -1)),      # 0.7 of an e5m2 ulp below -2
    ("float16", 1000 + 0.1 * 2 ** -0),          # fp16 ulp at 1000 is 0.5: 0.2 ulp
])
def test_stochastic_rounding_mean_is_the_value(dtype, x):
    shape = (100, 400)
    n = 100 * 400
    s, d = tile(shape), tile(shape, dtype)
    c = core(rounding="stochastic", seed=11)
    out = run1(isa.TensorCopy(dst=d, src=s), {s: np.full(shape, x, np.float32)}, c=c)
    values = out.astype(np.float64)
    assert len(np.unique(values)) == 2
    lo, hi = np.unique(values)
    p = (x - lo) / (hi - lo)
    sigma = (hi - lo) * np.sqrt(p * (1 - p) / n)
    assert abs(values.mean() - x) < 4 * sigma                   # unbiased within 4 sigma


def test_bf16_psum_on_trn3_accumulates_in_fp32_and_rounds_back():
    st, mv = tile((1, 1), "bfloat16"), tile((1, 1), "bfloat16")
    d = tile((1, 1), "bfloat16", mem="psum")
    c = core("trn3")
    c.mem(st).write(st, np.ones((1, 1), BF16))
    c.mem(mv).write(mv, np.full((1, 1), 256, BF16))
    small = isa.NcMatmul(dst=d, stationary=st, moving=mv)            # 256
    c.run(Kernel("a", [small], {}), {})
    c.mem(mv).write(mv, np.full((1, 1), 1.5, BF16))
    acc = isa.NcMatmul(dst=d, stationary=st, moving=mv, accumulate=True)
    c.run(Kernel("b", [acc], {}), {})
    assert float(c.mem(d).read(d)[0, 0]) == 258.0        # 257.5 -> RNE at bf16's 2.0 step
