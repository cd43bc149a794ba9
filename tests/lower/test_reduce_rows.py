"""Row reductions of the rows tiling (reduce.py `_rows`, folding_reduce.py): a max / min
of 16-bit floats keeps its partials in their own type (exact, the BF16 TensorReduce at
N / 2), and a sum of loaded floats splits its boxes between VectorE and ScalarE with
the same bits as VectorE alone. Column sums of 16-bit floats run on TensorE
(reduce_ones.py)."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.hw import isa
from jax_trn.lower import folding_reduce, lower_module

from .runner import SPEC, run_program
from .test_elementwise import make
from .test_reduce import reduce_module


def _instrs(program, cls) -> list:
    return [i for k in program.kernels for i in k.instructions if isinstance(i, cls)]


@pytest.mark.parametrize("kind, dtype", [("maximum", "bfloat16"), ("minimum", "float16")])
def test_a_16_bit_max_keeps_its_partials_in_16_bits(kind, dtype):
    shape = (256, 8192)
    program = lower_module(reduce_module(shape, (1,), kind, dtype), SPEC)
    reduces = _instrs(program, isa.TensorReduce)
    assert len(reduces) > 2 and all(i.dst.dtype == dtype for i in reduces)
    assert not _instrs(program, isa.TensorCopy)              # no cast at the end
    x = make(shape, dtype, seed=5)
    (out,) = run_program(program, [x]).outputs
    fn = np.max if kind == "maximum" else np.min
    np.testing.assert_array_equal(out, fn(x, axis=1))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_row_sum_splits_its_boxes_between_vector_and_scalar_engines(dtype, monkeypatch):
    shape = (256, 16384)
    module = reduce_module(shape, (1,), "add", dtype)
    program = lower_module(module, SPEC)
    acts = _instrs(program, isa.Activation)
    assert acts and all(a.func == "copy" and a.reduce_res is not None for a in acts)
    assert _instrs(program, isa.TensorReduce)
    monkeypatch.setattr(folding_reduce, "_box_cycles",
                        lambda engine, n, spec: n if engine == "vector" else float("inf"))
    alone = lower_module(reduce_module(shape, (1,), "add", dtype), SPEC)
    assert not _instrs(alone, isa.Activation)
    x = make(shape, dtype, seed=6)
    (out,) = run_program(program, [x]).outputs
    (ref,) = run_program(alone, [x]).outputs
    np.testing.assert_array_equal(out.view(np.uint8), ref.view(np.uint8))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_column_sum_is_a_ones_matmul(dtype):
    """A bias gradient's shape: sum over rows of [1000, 1536] 16-bit floats: TensorE
    matmuls against a ones vector accumulate the column sums in PSUM (reduce_ones.py),
    no VectorE accumulator and no transposes; FP32 sums, rounded once."""
    shape = (1000, 1536)
    program = lower_module(reduce_module(shape, (0,), "add", dtype), SPEC)
    assert _instrs(program, isa.NcMatmul) and not _instrs(program, isa.NcTranspose)
    assert not _instrs(program, isa.TensorTensor)
    x = make(shape, dtype, seed=7)
    (out,) = run_program(program, [x]).outputs
    exact = x.astype(np.float64).sum(0)
    np.testing.assert_allclose(out.astype(np.float64), exact, rtol=1e-2, atol=0.05)


def test_a_widened_16_bit_column_sum_is_a_ones_matmul(jax, trn, cpu):
    """A LayerNorm bias's gradient: a bf16 cotangent widened to f32 and summed over rows
    (the fusion's region only converts): TensorE reads the bf16 values against a bf16
    ones vector, FP32 sums."""
    import jax.numpy as jnp
    import jax_trn
    x = jnp.asarray(np.random.default_rng(4).standard_normal((1000, 768)), jnp.bfloat16)
    f = jax.jit(lambda x: x.astype(jnp.float32).sum(0))
    with jax_trn.profile() as prof:
        got = np.asarray(f(jax.device_put(x, trn)))
    instrs = [i for k in prof.executions[-1].kernels for i in k.kernel.instructions]
    mms = [i for i in instrs if isinstance(i, isa.NcMatmul)]
    assert mms and all(i.moving.dtype == "bfloat16" for i in mms)
    assert not [i for i in instrs if isinstance(i, isa.NcTranspose)]
    want = np.asarray(f(jax.device_put(x, cpu)))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
