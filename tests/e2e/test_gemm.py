"""GEMMs on trn against the CPU backend: bf16 through dma_transpose loads, FP8 through
double_row matmuls (K = 256 per matmul on trn2, §2.2), with `preferred_element_type`."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_close


def _rand(shape, dtype, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return x.astype(np.dtype(dtype))


def _run(jax, dev, f, *args):
    return np.asarray(jax.jit(f)(*(jax.device_put(a, dev) for a in args)))


@pytest.mark.parametrize("out", ["float32", "bfloat16"])
@pytest.mark.parametrize("ldt, rdt", [("float8_e5m2", "float8_e5m2"),
                                      ("float8_e4m3fn", "float8_e5m2")])
def test_fp8_dot_matches_cpu(jax, trn, cpu, ldt, rdt, out):
    """e5m2 runs double_row on trn2; e4m3fn (OCP, a v4 TensorE type, §2.2) is loaded
    as bf16 there, exactly."""
    import ml_dtypes  # noqa: F401  (registers the fp8 numpy dtypes)
    a, b = _rand((192, 384), ldt, 1), _rand((384, 320), rdt, 2)
    f = lambda a, b: jax.lax.dot(a, b, preferred_element_type=out)  # noqa: E731
    got, ref = _run(jax, trn, f, a, b), _run(jax, cpu, f, a, b)
    assert got.dtype == ref.dtype == np.dtype(out)
    # Products of fp8 values are exact in FP32; only the summation order differs.
    assert_close(got, ref, out, rtol=1e-5 if out == "float32" else None,
                 atol=1e-3 if out == "float32" else None)


def test_bf16_gemm_matches_cpu(jax, trn, cpu):
    a, b = _rand((256, 512), "bfloat16", 3), _rand((512, 384), "bfloat16", 4)
    f = lambda a, b: a @ b  # noqa: E731
    assert_close(_run(jax, trn, f, a, b), _run(jax, cpu, f, a, b), "bfloat16")


def test_bf16_gemm_rhs_transposed_matches_cpu(jax, trn, cpu):
    """a @ b.T: both operands K-contiguous, both come by dma_transpose."""
    a, b = _rand((200, 384), "bfloat16", 5), _rand((300, 384), "bfloat16", 6)
    f = lambda a, b: a @ b.T  # noqa: E731
    assert_close(_run(jax, trn, f, a, b), _run(jax, cpu, f, a, b), "bfloat16")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_grouped_query_einsums_match_cpu(jax, trn, cpu, dtype):
    """Gemma's GQA einsums: operands whose free dims do not merge ([B, T, K, G, H]
    against [B, S, K, H]) are copied into matmul layout (two-pass transposes), and the
    scores [B, K, S, T, G] -> [B, K, G, T, S] transpose too; exact layouts, CPU values."""
    import jax.numpy as jnp
    q, k = _rand((1, 64, 2, 4, 32), dtype, 5), _rand((1, 48, 2, 32), dtype, 6)
    v = _rand((1, 48, 2, 32), dtype, 7)

    def f(q, k, v):
        s = jnp.einsum("BTKGH,BSKH->BKGTS", q, k, preferred_element_type=jnp.float32)
        p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
        return jnp.einsum("BKGTS,BSKH->BTKGH", p, v, preferred_element_type=jnp.float32)
    with jax.default_matmul_precision("highest"):
        got, ref = _run(jax, trn, f, q, k, v), _run(jax, cpu, f, q, k, v)
    assert_close(got, ref, "float32", rtol=2e-2 if dtype == "bfloat16" else 1e-5,
                 atol=2e-2 if dtype == "bfloat16" else 1e-5)
