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


# --- block-scaled matmuls with FP4 data: MXFP4 and nvfp4 -----------------------------------

DN = (((2,), (2,)), ((0,), (0,)))


def mxfp4_config():
    """MXFP4: JAX 0.10.2 names no such config (only "mxfp8" and "nvfp4"); its
    BlockScaleConfig with FP4 data, E8M0 scales per 32 and the MX quantization."""
    import jax.numpy as jnp
    from jax._src.cudnn.scaled_matmul_stablehlo import BlockScaleConfig
    return BlockScaleConfig(mode="mxfp8", block_size=32, data_type=jnp.float4_e2m1fn,
                            scale_type=jnp.float8_e8m0fnu, global_scale=None,
                            infer_only=False)


def _sdg(jax, cfg, grad=False):
    """The jitted scaled_dot_general (or its gradient). nvfp4's VJP is JAX's plain FP32
    matmul of the unquantized cotangent, which trn runs as BF16 at DEFAULT precision
    (lower/dot.py): traced at "float32" precision, as the CPU backend computes it."""
    f = lambda a, b: jax.nn.scaled_dot_general(a, b, DN, configs=[cfg] * 3)
    if not grad:
        return jax.jit(f)
    g = jax.jit(jax.grad(lambda a, b: (f(a, b) ** 2).sum(), argnums=(0, 1)))

    def run(*args):
        with jax.default_matmul_precision("float32"):
            return g(*args)
    return run


def _operands(b, m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, m, k)).astype(np.float32),
            rng.standard_normal((b, n, k)).astype(np.float32))


def _mx_kernels(prof) -> list[tuple[str, list[str]]]:
    return [(k.name.split(".", 2)[-1], k.kernel.notes) for ex in prof.executions
            for k in ex.kernels if k.name.startswith("mx_matmul")]


def _close(got, want, rtol):
    got, want = (np.asarray(x, np.float64) for x in (got, want))
    np.testing.assert_allclose(got, want, rtol=0, atol=rtol * np.abs(want).max())


# The Trn3 half runs in its own process (the system is fixed when the backend starts):
# the same programs, results and kernel lists printed as JSON.
TRN3 = """
import json, numpy as np, jax, jax_trn
from tests.e2e.test_mx_fp4 import mxfp4_config, _sdg, _operands, _mx_kernels, cpu_rule_on
cpu_rule_on()
trn, cpu = jax.devices("trn")[0], jax.devices("cpu")[0]
out = {}
for name, cfg in (("mxfp4", mxfp4_config()), ("nvfp4", jax.nn.get_scaled_dot_general_config("nvfp4"))):
    for grad in (False, True):
        f, args = _sdg(jax, cfg, grad), _operands(1, 128, 128, 256, seed=7)
        with jax_trn.profile() as prof:
            got = jax.tree.map(np.asarray, f(*(jax.device_put(a, trn) for a in args)))
        want = jax.tree.map(np.asarray, f(*(jax.device_put(a, cpu) for a in args)))
        err = max(float(np.abs(np.float64(g) - w).max() / np.abs(w).max())
                  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)))
        out[f"{name}{'-grad' if grad else ''}"] = [err, _mx_kernels(prof)]
print(json.dumps(out))
"""


def cpu_rule_on():
    """The CPU backend's rule for the primitive: its definition (tests/e2e/test_mx.py)."""
    from jax._src.cudnn import scaled_matmul_stablehlo as sm
    from jax._src.interpreters import mlir

    from jax_trn import jax_mx
    rule = mlir.lower_fun(jax_mx._reference, multiple_results=True)
    for prim in (sm._scaled_matmul_p, sm._scaled_matmul_p_wrapper):
        mlir.register_lowering(prim, rule, platform="cpu")


@pytest.fixture(scope="module")
def cpu_rule(jax):
    cpu_rule_on()


@pytest.fixture(scope="module")
def trn3_results():
    import json

    from tests.conftest import run_python
    r = run_python(TRN3, env={"JAX_TRN_SYSTEM": "trn3-ultraserver"}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("grad", [False, True])
def test_mxfp4_on_trn3_runs_nc_matmul_mx(trn3_results, grad):
    """MXFP4 x MXFP4 as nc_matmul_mx on float4_e2m1fn_x4 words (each operand packed once
    by an mx-pack-fp4 kernel), matching the CPU backend (FP32 accumulation order only);
    its VJP's matmuls too (scaled_dot_general quantizes the cotangents the same way;
    M = N = 128 so that each of them contracts whole 128-row k-tiles)."""
    err, kernels = trn3_results["mxfp4-grad" if grad else "mxfp4"]
    assert err <= 1e-5
    names = [n for n, _ in kernels]
    assert "mx-matmul" in names and "mx-pack-fp4" in names, names
    assert not any("dequantize" in n for n in names), names


@pytest.mark.parametrize("grad", [False, True])
def test_nvfp4_on_trn3_dequantizes_and_says_why(trn3_results, grad):
    """nvfp4 (16 values per E4M3 scale) has no MX mode even on Trn3: dequantize + BF16
    matmul, each kernel noting the reason."""
    err, kernels = trn3_results["nvfp4-grad" if grad else "nvfp4"]
    assert err <= 1e-5
    names = [n for n, _ in kernels]
    assert "mx-bf16-matmul" in names and "mx-matmul" not in names, names
    for name, notes in kernels:
        if "dequantize" in name or "bf16" in name:
            assert any("block 16 with float8_e4m3fn scales" in n for n in notes), notes


@pytest.mark.parametrize("config", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("grad", [False, True])
def test_fp4_configs_on_trn2_dequantize(jax, trn, cpu, cpu_rule, config, grad):
    """Without MX hardware both run as dequantize + BF16 matmul, under jit and grad,
    matching the CPU backend; the kernels say why."""
    import jax_trn
    cfg = mxfp4_config() if config == "mxfp4" else jax.nn.get_scaled_dot_general_config(
        "nvfp4")
    f, args = _sdg(jax, cfg, grad), _operands(2, 64, 64, 256, seed=3)
    with jax_trn.profile() as prof:
        got = f(*(jax.device_put(a, trn) for a in args))
        got = jax.tree.map(np.asarray, got)
    want = jax.tree.map(np.asarray, f(*(jax.device_put(a, cpu) for a in args)))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        _close(g, w, 1e-5)
    kernels = _mx_kernels(prof)
    assert "mx-bf16-matmul" in [n for n, _ in kernels]
    why = "block 16" if config == "nvfp4" else "has no nc_matmul_mx"
    assert all(any(why in n for n in notes) for name, notes in kernels if "mx-" in name)


def test_scaled_matmul_mixes_mxfp8_and_mxfp4(jax, trn, cpu, cpu_rule):
    """`jax.nn.scaled_matmul` of an FP4 lhs and an FP8 rhs (mixing is allowed, §2.2)."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((1, 32, 128)).astype(F4)
    b = rng.standard_normal((1, 64, 128)).astype(ml_dtypes.float8_e4m3fn)
    sa, sb = (rng.integers(120, 134, (1, f, 4)).astype(np.uint8).view(
        ml_dtypes.float8_e8m0fnu) for f in (32, 64))
    f = jax.jit(lambda *x: jax.nn.scaled_matmul(*x, preferred_element_type=np.float32))
    got = f(*(jax.device_put(x, trn) for x in (a, b, sa, sb)))
    want = f(*(jax.device_put(x, cpu) for x in (a, b, sa, sb)))
    _close(got, want, 1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_mxfp4_quantization_is_one_kernel_bit_exact(jax, trn, cpu, dtype):
    """The program's own MXFP4 quantization (JAX's jnp ops, FP4 data: MAX = 6) runs as
    one mx_quantize kernel (hlo_passes/passes/mx_quantize.py), bit-exact with CPU (it was
    ~16 kernels)."""
    import jax_trn
    from jax._src.cudnn.scaled_matmul_stablehlo import quantize
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 136, 256)) * np.exp2(rng.integers(-60, 60, (1, 136, 1)))
    x = x.astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))
    f = jax.jit(lambda a: quantize(a, mxfp4_config()))
    with jax_trn.profile() as prof:
        got = [np.asarray(o) for o in f(jax.device_put(x, trn))]
    want = [np.asarray(o) for o in f(jax.device_put(x, cpu))]
    assert [k.name for k in prof.executions[-1].kernels] == ["mx_quantize.0"]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


@pytest.mark.parametrize("config", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("spec", [(None, None, "x"), ("x", None, None)])
def test_fp4_configs_sharded(jax, trn_devices, cpu, cpu_rule, config, spec):
    """K or batch sharded over two cores: the op's sharding rule uses its own block (16
    for nvfp4: K is 16-value groups), partial sums added by an all-reduce."""
    import jax_trn
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    if len(trn_devices) < 2:
        pytest.skip("needs two trn devices")
    cfg = mxfp4_config() if config == "mxfp4" else jax.nn.get_scaled_dot_general_config(
        "nvfp4")
    f = _sdg(jax, cfg)
    a, b = _operands(2, 64, 32, 256, seed=4)
    sharding = NamedSharding(Mesh(np.array(trn_devices[:2]), ("x",)), P(*spec))
    with jax_trn.profile() as prof:
        got = np.asarray(f(jax.device_put(a, sharding), jax.device_put(b, sharding)))
    want = np.asarray(f(jax.device_put(a, cpu), jax.device_put(b, cpu)))
    _close(got, want, 1e-6)
    names = {k.name.split(".")[0] for ex in prof.executions for k in ex.kernels}
    assert "mx_matmul" in names and not names & {"dot_general", "dot_general_fusion"}, names


def test_transfer_keeps_the_low_nibble_only(jax, trn, cpu):
    """Host float4 bytes with stray high bits (a uint8 array viewed as float4): the CPU
    client keeps each byte's low nibble; so does trn (the values were read through the
    whole byte before: 0x21 as -0.5 instead of 0.5)."""
    x = np.array([0x1F, 0x21, 0xF3, 0x05], np.uint8).view(F4)
    f = lambda a: a.astype(np.float32)
    _same(jax, f, (x,), trn, cpu)
    np.testing.assert_array_equal(np.asarray(jax.device_put(x, trn)).view(np.uint8),
                                  np.asarray(jax.device_put(x, cpu)).view(np.uint8))


NIBBLE_TYPES = ("float4_e2m1fn", "int4", "uint4")


def _codes(name: str, n: int, rng) -> np.ndarray:
    """n random values of type `name`: every 4-bit code, or any wider integer."""
    if name in NIBBLE_TYPES:
        low = -8 if name == "int4" else 0
        codes = rng.integers(low, low + 16, n)
        return codes.astype(np.uint8).view(F4) if name == "float4_e2m1fn" else \
            codes.astype(getattr(ml_dtypes, name))
    return rng.integers(0, 2 ** (8 * np.dtype(name).itemsize), n, dtype=np.uint64).astype(name)


@pytest.mark.parametrize("pair", [("float4_e2m1fn", "uint8"), ("uint8", "float4_e2m1fn"),
                                  ("float4_e2m1fn", "uint32"), ("uint16", "float4_e2m1fn"),
                                  ("float4_e2m1fn", "uint4"), ("float4_e2m1fn", "int4"),
                                  ("int4", "float4_e2m1fn"), ("uint4", "float4_e2m1fn")])
def test_bitcast_moves_codes(jax, trn, cpu, pair):
    """bitcast_convert to and from float4 moves its 4-bit codes, nibble k of a wide
    element being value k (refused at compile time before)."""
    dst = np.dtype(getattr(ml_dtypes, pair[1], pair[1]))
    rng = np.random.default_rng(9)
    x = _codes(pair[0], 2400, rng)
    if pair[0] in NIBBLE_TYPES and pair[1] not in NIBBLE_TYPES:
        x = x.reshape(-1, 2 * dst.itemsize)          # XLA: a minor dim of the ratio
    import jax.numpy as jnp
    _same(jax, lambda a: jax.lax.bitcast_convert_type(a, jnp.dtype(dst)), (x,), trn, cpu)


@pytest.mark.parametrize("fn", ["sort", "argsort", "sort_descending_axis0"])
def test_sort_float4(jax, trn, cpu, fn):
    """float4 keys sort like the other narrow floats (they widen exactly to FP32);
    refused by name before."""
    import jax.numpy as jnp
    x = np.random.default_rng(1).integers(0, 16, (8, 300)).astype(np.uint8).view(F4)
    f = {"sort": lambda a: jnp.sort(a, axis=1),
         "argsort": lambda a: jnp.argsort(a, axis=1, stable=True),
         "sort_descending_axis0": lambda a: jnp.sort(a, axis=0, descending=True)}[fn]
    _same(jax, f, (x,), trn, cpu)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("global_scale", [1.0, 0.37])
def test_nvfp4_quantization_is_one_kernel_bit_exact(jax, trn, cpu, dtype, global_scale):
    """nvfp4's quantization (divide by the global scale, amax / 6 per 16 values, E4M3
    scale clipped to 448, divide, clip, FP4) is one mx_quantize kernel (was 13 kernels,
    1335 us at 1024^2 on Trn3), bit-exact with CPU: an all-zero block (scale 0: q = -0
    from NaN), tiny and huge values, and XLA's division by a broadcast as a multiply by
    the reciprocal (an exact division differed on FP4 ties of bf16 inputs)."""
    import jax.numpy as jnp
    import jax_trn
    from jax._src.cudnn.scaled_matmul_stablehlo import BlockScaleConfig, quantize
    cfg = BlockScaleConfig(mode="nvfp4", block_size=16, data_type=jnp.float4_e2m1fn,
                           scale_type=jnp.float8_e4m3fn, infer_only=False,
                           global_scale=jnp.array([global_scale], jnp.float32))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 136, 256)) * np.exp2(rng.integers(-12, 12, (1, 136, 1)))
    x[0, 3, :16], x[0, 5, 16:32], x[0, 7, 40] = 0, 1e-30, 1e6
    x = x.astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))
    f = jax.jit(lambda a: quantize(a, cfg))
    with jax_trn.profile() as prof:
        got = [np.asarray(o) for o in f(jax.device_put(x, trn))]
    want = [np.asarray(o) for o in f(jax.device_put(x, cpu))]
    assert [k.name for k in prof.executions[-1].kernels] == ["mx_quantize.0"]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))
