"""Whole JAX programs compiled with and without fusion: the same results (within the
dtype's tolerance, and against the CPU backend), fewer kernels, less simulated time;
the decisions visible in `compiled.as_text()`."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_passes
from jax_trn.lower import lower_module
from tests.hlo_passes.helpers import artifact_of

from .runner import SPEC, run_program


def _layernorm(x):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5)


def _mlp(x, w1, b1, w2):
    return jax.nn.relu(x @ w1 + b1) @ w2


def _args(key, *specs):
    keys = jax.random.split(jax.random.key(key), len(specs))
    return [jax.random.normal(k, s, jnp.float32).astype(d) for k, (s, d) in zip(keys, specs)]


F32, BF16 = jnp.float32, jnp.bfloat16
PROGRAMS = {
    "chain": (lambda x, y: jnp.tanh(x * 2 + 1) * y, [((256, 512), F32)] * 2, 1e-6),
    "softmax": (jax.nn.softmax, [((256, 512), F32)], 1e-5),
    "layernorm": (_layernorm, [((130, 300), F32)], 1e-4),
    "logsumexp": (lambda x: jnp.log(jnp.exp(x - x.max(0)).sum(0)), [((300, 130), F32)],
                  1e-5),
    "gelu_layer": (lambda x, w, b: jax.nn.gelu(x @ w + b),
                   [((512, 1024), BF16), ((1024, 256), BF16), ((256,), BF16)], 2e-2),
    "mlp": (_mlp, [((128, 256), BF16), ((256, 512), BF16), ((512,), BF16),
                   ((512, 64), BF16)], 3e-2),
    "where": (lambda x, y: jnp.where(x > y, jnp.exp(x), y * 3).astype(BF16),
              [((100, 7), F32)] * 2, 1e-2),
    "bits": (lambda x: ((x ^ (x << 13)) + jnp.uint32(0x9E3779B9)) >> 9, None, 0.0),
    "bf16_gain": (lambda x, g: (_layernorm(x) * g.astype(F32)).astype(BF16),
                  [((130, 300), F32), ((300,), BF16)], 1e-2),
}


def _run(code: bytes, args, fuse: bool):
    program = lower_module(hlo_passes.compile_to_ir(code, fuse=fuse), SPEC)
    result = run_program(program, [np.asarray(a) for a in args])
    return program, result


def _inputs(name):
    f, specs, tol = PROGRAMS[name]
    if specs is None:
        return f, [np.random.default_rng(7).integers(0, 2**32, (64, 33), np.uint32)], tol
    return f, _args(3, *specs), tol


def _close(got: np.ndarray, expected: np.ndarray, tol: float) -> None:
    """Within `tol` relative to the largest magnitude (bf16 results of size ~100)."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    got, expected = got.astype(np.float64), expected.astype(np.float64)
    scale = max(1.0, float(np.max(np.abs(expected))))
    assert np.max(np.abs(got - expected)) <= tol * scale


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_fused_program_matches_unfused_and_cpu(name):
    f, args, tol = _inputs(name)
    code = artifact_of(f, *args)
    fused_p, fused = _run(code, args, fuse=True)
    plain_p, plain = _run(code, args, fuse=False)
    cpu = jax.devices("cpu")[0]
    expected = np.asarray(jax.jit(f)(*(jax.device_put(a, cpu) for a in args)))
    for got in (fused.outputs[0], plain.outputs[0]):
        _close(got, expected, tol)
    _close(fused.outputs[0], plain.outputs[0], tol)
    assert len(fused_p.kernels) < len(plain_p.kernels)
    assert fused.ns < plain.ns
    assert not any(n.startswith("fallback") for k in fused_p.kernels for n in k.notes)


def test_gelu_layer_is_one_kernel():
    f, args, _ = _inputs("gelu_layer")
    program, _ = _run(artifact_of(f, *args), args, fuse=True)
    (kernel,) = program.kernels
    assert kernel.notes[0] == "fusion_kind: matmul_epilogue"


def test_a_cast_broadcast_input_is_loaded_in_the_target_type():
    """A bf16 gain cast to f32 and broadcast over the rows is DMA-cast as it loads:
    no convert instruction runs on the [P, F] tiles."""
    f, args, _ = _inputs("bf16_gain")
    program, _ = _run(artifact_of(f, *args), args, fuse=True)
    converts = [i for k in program.kernels for i in k.instructions
                if type(i).__name__ == "TensorCopy" and i.src.dtype == "bfloat16"
                and i.dst.dtype == "float32"]
    assert not converts, converts[:2]


def test_as_text_shows_fusion_decisions():
    x, w, b = _args(5, ((128, 256), BF16), ((256, 64), BF16), ((64,), BF16))
    dev = jax.devices("trn")[0]
    x, w, b = (jax.device_put(a, dev) for a in (x, w, b))
    text = jax.jit(lambda x, w, b: jnp.tanh(x @ w + b)).lower(x, w, b).compile().as_text()
    assert text.count('custom_call_target="trn.kernel"') == 1
    assert "fusion_kind: matmul_epilogue" in text
    assert "decision: dot_general %" in text and "matmul epilogue" in text
    assert "broadcast of vector along dim 1: fused" in text
