"""Block-scaled matmuls from JAX on trn (issue 18): `jax.nn.scaled_matmul` and
`jax.nn.scaled_dot_general` ("mxfp8"; FP4 data: MXFP4 and nvfp4 in test_mx_fp4.py) under
jit, grad and sharding, against the CPU backend running the same program.

JAX 0.10.2 lowers `scaled_matmul` for cuda / rocm only, so the CPU reference gets the
primitive's definition as its rule for platform "cpu" here (`jax_mx._reference`:
dequantize, dot accumulating in FP32), for this test process only. The quantization
(JAX's jnp ops) runs on each backend as written. Tolerance: FP32 accumulation order
(the products are exact on both), rtol 1e-6 of max |out|; a BF16 result 2**-8."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

DN = (((2,), (2,)), ((0,), (0,)))


@pytest.fixture(scope="module")
def cpu_rule(jax):
    from jax._src.cudnn import scaled_matmul_stablehlo as sm
    from jax._src.interpreters import mlir

    from jax_trn import jax_mx
    rule = mlir.lower_fun(jax_mx._reference, multiple_results=True)
    for prim in (sm._scaled_matmul_p, sm._scaled_matmul_p_wrapper):
        mlir.register_lowering(prim, rule, platform="cpu")


def _both(jax, fn, args, trn, cpu):
    f = jax.jit(fn)
    got = f(*(jax.device_put(a, trn) for a in args))
    want = f(*(jax.device_put(a, cpu) for a in args))
    return jax.tree.map(np.asarray, got), jax.tree.map(np.asarray, want)


def _close(got, want, rtol=1e-6):
    want = np.asarray(want, np.float64)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0,
                               atol=rtol * np.abs(want).max())


def _operands(b, m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((b, m, k)).astype(np.float32),
            rng.standard_normal((b, n, k)).astype(np.float32))


def test_scaled_dot_general_mxfp8(jax, trn, cpu, cpu_rule):
    cfg = jax.nn.get_scaled_dot_general_config("mxfp8")
    f = lambda a, b: jax.nn.scaled_dot_general(a, b, DN, configs=[cfg] * 3)
    import jax_trn
    with jax_trn.profile() as prof:
        got, want = _both(jax, f, _operands(2, 64, 48, 256), trn, cpu)
    _close(got, want)
    kernels = [k.name.split(".")[0] for k in prof.executions[0].kernels]
    assert kernels.count("mx_quantize") == 2 and "mx_matmul" in kernels, kernels


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_program_quantization_is_one_kernel_bit_exact(jax, trn, cpu, dtype):
    """scaled_dot_general's own quantization (JAX's jnp ops) runs as one mx_quantize
    kernel (hlo_passes/passes/mx_quantize.py), bit-exact with the CPU backend. Compiled
    from PJRT (the compile runs with the CPU's flush-to-zero mode on, where the pass
    once failed to see JAX's 2**-127 constant and left the ~16 kernels)."""
    import jax_trn
    from jax._src.cudnn.scaled_matmul_stablehlo import quantize
    cfg = jax.nn.get_scaled_dot_general_config("mxfp8")
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((1, 136, 256)) * np.exp2(rng.integers(-60, 60, (1, 136, 1))))
    x = x.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)
    f = jax.jit(lambda a: quantize(a, cfg))
    with jax_trn.profile() as prof:
        got = [np.asarray(o) for o in f(jax.device_put(x, trn))]
    want = [np.asarray(o) for o in f(jax.device_put(x, cpu))]
    assert [k.name for k in prof.executions[-1].kernels] == ["mx_quantize.0"]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


def test_scaled_matmul_quantized_inputs_bf16_result(jax, trn, cpu, cpu_rule):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((1, 32, 128)).astype(ml_dtypes.float8_e4m3fn)
    b = rng.standard_normal((1, 64, 128)).astype(ml_dtypes.float8_e5m2)
    sa, sb = (rng.integers(120, 134, (1, f, 4)).astype(np.uint8).view(
        ml_dtypes.float8_e8m0fnu) for f in (32, 64))
    f = lambda *x: jax.nn.scaled_matmul(*x, preferred_element_type=np.dtype("bfloat16"))
    got, want = _both(jax, f, (a, b, sa, sb), trn, cpu)
    _close(got, want, rtol=2 ** -8)


def test_grad(jax, trn, cpu, cpu_rule):
    cfg = jax.nn.get_scaled_dot_general_config("mxfp8")
    loss = lambda a, b: (jax.nn.scaled_dot_general(a, b, DN, configs=[cfg] * 3) ** 2).sum()
    got, want = _both(jax, jax.grad(loss, argnums=(0, 1)), _operands(1, 64, 32, 128, 3),
                      trn, cpu)
    for g, w in zip(got, want):
        _close(g, w, rtol=1e-5)


@pytest.mark.parametrize("lhs,rhs", [
    (("x", None, None), ()), ((None, "x", None), ()), ((None, None, "x"), ()),
    ((None, None, "x"), (None, None, "x")), ((), (None, "x", None)),
    (("x", None, "y"), ("x", None, "y"))])
def test_sharded(jax, trn_devices, cpu, cpu_rule, lhs, rhs):
    """Batch, M, N or K sharded over two (or 2 x 2) cores: the scaled matmul runs as
    mx_matmul on each core (not its definition), K sharded as partial sums and an
    all_reduce (Shardy dropped the op's rule before: K was sliced, nothing summed)."""
    import jax_trn
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh_shape = (2, 2) if "y" in lhs else (2,)
    if len(trn_devices) < int(np.prod(mesh_shape)):
        pytest.skip("needs more trn devices")
    cfg = jax.nn.get_scaled_dot_general_config("mxfp8")
    f = jax.jit(lambda a, b: jax.nn.scaled_dot_general(a, b, DN, configs=[cfg] * 3))
    a, b = _operands(2, 64, 32, 256, seed=4)
    devs = np.array(trn_devices[:int(np.prod(mesh_shape))]).reshape(mesh_shape)
    mesh = Mesh(devs, ("x", "y")[:len(mesh_shape)])
    with jax_trn.profile() as prof:
        got = f(jax.device_put(a, NamedSharding(mesh, P(*lhs))),
                jax.device_put(b, NamedSharding(mesh, P(*rhs))))
        got = np.asarray(got)
    want = f(jax.device_put(a, cpu), jax.device_put(b, cpu))
    _close(got, np.asarray(want))
    names = {k.name.split(".")[0] for ex in prof.executions for k in ex.kernels}
    assert "mx_matmul" in names and not names & {"dot_general", "dot_general_fusion"}, names
