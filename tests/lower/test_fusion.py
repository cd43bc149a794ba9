"""Fused kernels (loop, reduction, matmul epilogue) run on the simulated NeuronCore,
against numpy and against the same program lowered op by op."""
from __future__ import annotations

import numpy as np
import pytest

from hlo_passes import ir
from hlo_passes.passes import fusion
from hlo_passes.verifier import verify
from jax_trn.hw import isa
from jax_trn.lower import lower_module
from tests.hlo_passes.helpers import from_text

from . import reference as ref
from .runner import SPEC, run_program
from .test_elementwise import make

T = {"float32": "f32", "bfloat16": "bf16", "int32": "i32"}


def both(text: str):
    """(fused program, unfused program) of StableHLO `text`."""
    plain, fused = from_text(text), from_text(text)
    assert fusion.run(fused)
    verify(fused)
    return lower_module(fused, SPEC), lower_module(plain, SPEC)


def run_both(text: str, *args):
    p, q = both(text)
    return run_program(p, list(args)), run_program(q, list(args))


def ty(shape, dtype: str) -> str:
    return f"tensor<{''.join(f'{n}x' for n in shape)}{T[dtype]}>"


def chain(shape, dtype):
    t = ty(shape, dtype)
    return f"""
      func.func @main(%x: {t}, %y: {t}) -> {t} {{
        %c2 = stablehlo.constant dense<2.0> : {ty((), dtype)}
        %c1 = stablehlo.constant dense<1.0> : {ty((), dtype)}
        %b2 = stablehlo.broadcast_in_dim %c2, dims = [] : ({ty((), dtype)}) -> {t}
        %b1 = stablehlo.broadcast_in_dim %c1, dims = [] : ({ty((), dtype)}) -> {t}
        %0 = stablehlo.multiply %x, %b2 : {t}
        %1 = stablehlo.add %0, %b1 : {t}
        %2 = stablehlo.tanh %1 : {t}
        %3 = stablehlo.multiply %2, %y : {t}
        return %3 : {t}
      }}"""


def chain_ref(x, y, dtype, folded: bool):
    """Op by op, each result rounded to `dtype`; `folded`: x * 2 + 1 stays FP32 inside
    the activation (folding.py)."""
    r = lambda a: a.astype(ir.np_dtype(dtype)).astype(np.float32)    # noqa: E731
    x, y = x.astype(np.float32), y.astype(np.float32)
    pre = x * 2 + 1 if folded else r(r(x * 2) + 1)
    return r(r(np.tanh(pre)) * y).astype(ir.np_dtype(dtype))


@pytest.mark.parametrize("shape", [(), (7,), (130, 3), (256, 512), (3, 5, 7)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_loop_fusion_is_one_kernel(shape, dtype):
    x, y = make(shape, dtype, role=0), make(shape, dtype, role=1)
    fused, plain = run_both(chain(shape, dtype), x, y)
    assert len(fused.program.kernels) == 1
    assert len(plain.program.kernels) > 1
    np.testing.assert_array_equal(fused.outputs[0], chain_ref(x, y, dtype, folded=True))
    np.testing.assert_array_equal(plain.outputs[0], chain_ref(x, y, dtype, folded=False))
    if dtype == "float32":          # FP32 inside the engines either way: bit-exact
        np.testing.assert_array_equal(fused.outputs[0], plain.outputs[0])
    ref.assert_close(fused.outputs[0], plain.outputs[0], dtype)


def test_immediate_scale_and_bias_fold_into_the_activation():
    fused, _ = both(chain((256, 512), "float32"))
    kinds = [type(i).__name__ for i in fused.kernels[0].instructions
             if not isinstance(i, isa.DmaCopy)]
    assert set(kinds) == {"Memset", "Activation", "TensorTensor"}   # bias tile, tanh, *y
    act = next(i for i in fused.kernels[0].instructions if isinstance(i, isa.Activation))
    assert act.func == "tanh" and act.scale == 2.0 and act.bias.free == (1,)


def test_loop_fusion_reads_each_input_once_and_writes_only_results():
    fused, plain = both(chain((256, 512), "float32"))
    dmas = [i for i in fused.kernels[0].instructions if isinstance(i, isa.DmaCopy)]
    read = sum(i.nbytes for i in dmas if isinstance(i.src, isa.DramAP))
    written = sum(i.nbytes for i in dmas if isinstance(i.dst, isa.DramAP))
    assert (read, written) == (2 * 256 * 512 * 4, 256 * 512 * 4)
    assert fused.temps == []


BIAS = """
  func.func @main(%x: tensor<{m}x{n}xf32>, %row: tensor<{n}xf32>, %col: tensor<{m}xf32>)
      -> tensor<{m}x{n}xf32> {{
    %r = stablehlo.broadcast_in_dim %row, dims = [1] : (tensor<{n}xf32>) -> tensor<{m}x{n}xf32>
    %c = stablehlo.broadcast_in_dim %col, dims = [0] : (tensor<{m}xf32>) -> tensor<{m}x{n}xf32>
    %0 = stablehlo.add %x, %r : tensor<{m}x{n}xf32>
    %1 = stablehlo.multiply %0, %c : tensor<{m}x{n}xf32>
    %2 = stablehlo.exponential %c : tensor<{m}x{n}xf32>
    %3 = stablehlo.subtract %1, %2 : tensor<{m}x{n}xf32>
    return %3 : tensor<{m}x{n}xf32>
  }}"""


@pytest.mark.parametrize("m,n", [(130, 3), (300, 700), (4, 5000)])
def test_row_and_column_broadcasts_in_one_kernel(m, n):
    x, row, col = make((m, n), "float32"), make((n,), "float32", role=1), \
        make((m,), "float32", role=2)
    fused, plain = run_both(BIAS.format(m=m, n=n), x, row, col)
    assert len(fused.program.kernels) == 1
    expected = (x + row[None, :]) * col[:, None] - np.exp(col)[:, None]
    ref.assert_close(fused.outputs[0], expected.astype(np.float32), "float32", rtol=1e-5)
    np.testing.assert_array_equal(fused.outputs[0], plain.outputs[0])


def test_function_result_is_an_extra_output():
    t = ty((130, 3), "float32")
    text = f"""
      func.func @main(%x: {t}, %y: {t}) -> ({t}, {t}) {{
        %0 = stablehlo.exponential %x : {t}
        %1 = stablehlo.add %0, %y : {t}
        return %1, %0 : {t}, {t}
      }}"""
    x, y = make((130, 3), "float32"), make((130, 3), "float32", role=1)
    fused, plain = run_both(text, x, y)
    assert len(fused.program.kernels) == 1
    for a, b in zip(fused.outputs, plain.outputs):
        np.testing.assert_array_equal(a, b)


def deviation(shape, dims, kept_axis: int):
    """sum((x - broadcast(m))^2) over `dims`, m broadcast along the kept axis."""
    m = shape[kept_axis]
    out = [n for d, n in enumerate(shape) if d not in dims]
    return f"""
      func.func @main(%x: {ty(shape, 'float32')}, %m: {ty((m,), 'float32')})
          -> {ty(out, 'float32')} {{
        %z = stablehlo.constant dense<0.0> : tensor<f32>
        %b = stablehlo.broadcast_in_dim %m, dims = [{kept_axis}] : ({ty((m,), 'float32')}) -> {ty(shape, 'float32')}
        %d = stablehlo.subtract %x, %b : {ty(shape, 'float32')}
        %q = stablehlo.multiply %d, %d : {ty(shape, 'float32')}
        %s = stablehlo.reduce(%q init: %z) applies stablehlo.add across dimensions = {list(dims)}
            : ({ty(shape, 'float32')}, tensor<f32>) -> {ty(out, 'float32')}
        return %s : {ty(out, 'float32')}
      }}"""


@pytest.mark.parametrize("shape,dims,kept", [((130, 300), (1,), 0), ((130, 300), (0,), 1),
                                             ((4, 3000), (1,), 0), ((2, 3, 300), (2,), 1)])
def test_reduction_with_fused_producers(shape, dims, kept):
    x, m = make(shape, "float32"), make((shape[kept],), "float32", role=1)
    fused, plain = run_both(deviation(shape, dims, kept), x, m)
    assert len(fused.program.kernels) == 1
    assert fused.program.kernels[0].notes[0] == "fusion_kind: reduction"
    bshape = [1] * len(shape)
    bshape[kept] = shape[kept]
    expected = ((x - m.reshape(bshape)) ** 2).sum(axis=dims, dtype=np.float64)
    ref.assert_close(fused.outputs[0], expected.astype(np.float32), "float32", rtol=1e-5)
    ref.assert_close(fused.outputs[0], plain.outputs[0], "float32", rtol=1e-6)


def test_full_reduction_of_a_fused_chain():
    text = """
      func.func @main(%x: tensor<1000xf32>) -> tensor<f32> {
        %z = stablehlo.constant dense<0xFF800000> : tensor<f32>
        %e = stablehlo.exponential %x : tensor<1000xf32>
        %s = stablehlo.reduce(%e init: %z) applies stablehlo.maximum across dimensions = [0]
            : (tensor<1000xf32>, tensor<f32>) -> tensor<f32>
        return %s : tensor<f32>
      }"""
    x = make((1000,), "float32")
    fused, plain = run_both(text, x)
    assert len(fused.program.kernels) == 1
    np.testing.assert_allclose(fused.outputs[0], np.exp(x).max(), rtol=1e-6)


def layer(m, k, n, dtype, bias_dim=1, act="tanh", batch=0):
    b = [2] * batch
    xs, ws, os_ = (*b, m, k), (*b, k, n), (*b, m, n)
    bias = n if bias_dim == batch + 1 else m
    dims = ("batching_dims = [0] x [0], " if batch else "")
    return f"""
      func.func @main(%x: {ty(xs, dtype)}, %w: {ty(ws, dtype)}, %b: {ty((bias,), dtype)})
          -> {ty(os_, dtype)} {{
        %d = stablehlo.dot_general %x, %w, {dims}contracting_dims = [{batch + 1}] x [{batch}]
            : ({ty(xs, dtype)}, {ty(ws, dtype)}) -> {ty(os_, dtype)}
        %bb = stablehlo.broadcast_in_dim %b, dims = [{bias_dim}] : ({ty((bias,), dtype)}) -> {ty(os_, dtype)}
        %a = stablehlo.add %d, %bb : {ty(os_, dtype)}
        %t = stablehlo.{act} %a : {ty(os_, dtype)}
        return %t : {ty(os_, dtype)}
      }}"""


def bf16(a):
    return a.astype(ir.np_dtype("bfloat16")).astype(np.float32)


def layer_ref(x, w, b, bias_dim, act, batch=0):
    """DEFAULT precision: bf16 operands, FP32 accumulation."""
    y = np.matmul(bf16(x), bf16(w))
    shape = [1] * y.ndim
    shape[bias_dim] = b.size
    y = y + b.astype(np.float32).reshape(shape)
    return {"tanh": np.tanh, "logistic": lambda v: 1 / (1 + np.exp(-v))}[act](y)


@pytest.mark.parametrize("m,k,n", [(512, 1024, 256), (130, 200, 600), (64, 128, 1100)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_matmul_epilogue_with_row_bias(m, k, n, dtype):
    rng = np.random.default_rng(0)
    x, w = ((rng.standard_normal(s) / k ** 0.25).astype(ir.np_dtype(dtype))
            for s in ((m, k), (k, n)))
    b = rng.standard_normal(n).astype(ir.np_dtype(dtype))
    fused, plain = run_both(layer(m, k, n, dtype), x, w, b)
    (kernel,) = fused.program.kernels
    assert kernel.notes[0] == "fusion_kind: matmul_epilogue"
    assert any(n.startswith("epilogue: 2 ops per output tile, dot value read from PSUM")
               for n in kernel.notes)
    expected = layer_ref(x, w, b, 1, "tanh")
    tol = dict(rtol=2e-2, atol=2e-2)        # bf16 operands either way (DEFAULT precision)
    np.testing.assert_allclose(fused.outputs[0].astype(np.float32), expected, **tol)
    np.testing.assert_allclose(fused.outputs[0].astype(np.float32),
                               plain.outputs[0].astype(np.float32), **tol)
    assert fused.ns < plain.ns


@pytest.mark.parametrize("bias_dim,batch", [(0, 0), (2, 1), (1, 1)])
def test_matmul_epilogue_column_bias_and_batches(bias_dim, batch):
    m, k, n = 130, 64, 96
    rng = np.random.default_rng(1)
    b_ = [2] * batch
    x = rng.standard_normal((*b_, m, k)).astype(np.float32) / 4
    w = rng.standard_normal((*b_, k, n)).astype(np.float32) / 4
    b = rng.standard_normal(n if bias_dim == batch + 1 else m).astype(np.float32)
    fused, plain = run_both(layer(m, k, n, "float32", bias_dim, "logistic", batch), x, w, b)
    assert len(fused.program.kernels) == 1
    expected = layer_ref(x, w, b, bias_dim, "logistic", batch)
    np.testing.assert_allclose(fused.outputs[0], expected, rtol=2e-2, atol=2e-2)
    np.testing.assert_allclose(fused.outputs[0], plain.outputs[0], rtol=1e-5, atol=1e-6)


def test_integer_epilogue_copies_out_of_psum_first():
    t = "tensor<64x32xi32>"
    text = f"""
      func.func @main(%x: tensor<64x16xi32>, %w: tensor<16x32xi32>) -> {t} {{
        %d = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0]
            : (tensor<64x16xi32>, tensor<16x32xi32>) -> {t}
        %c = stablehlo.constant dense<7> : tensor<i32>
        %b = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> {t}
        %r = stablehlo.remainder %d, %b : {t}
        return %r : {t}
      }}"""
    rng = np.random.default_rng(2)
    x, w = rng.integers(-9, 9, (64, 16)).astype(np.int32), \
        rng.integers(-9, 9, (16, 32)).astype(np.int32)
    fused, plain = run_both(text, x, w)
    (kernel,) = fused.program.kernels
    assert any("copied out of PSUM" in n for n in kernel.notes)
    np.testing.assert_array_equal(fused.outputs[0], np.fmod(x @ w, 7))


def test_unsupported_fusion_falls_back_to_one_kernel_per_op():
    """A batched inner product (M = N = 1) runs on VectorE, with no matmul epilogue."""
    text = """
      func.func @main(%x: tensor<6x40xf32>, %y: tensor<6x40xf32>) -> tensor<6xf32> {
        %d = stablehlo.dot_general %x, %y, batching_dims = [0] x [0], contracting_dims = [1] x [1]
            : (tensor<6x40xf32>, tensor<6x40xf32>) -> tensor<6xf32>
        %e = stablehlo.exponential %d : tensor<6xf32>
        return %e : tensor<6xf32>
      }"""
    x, y = make((6, 40), "float32"), make((6, 40), "float32", role=1) / 8
    fused, plain = run_both(text, x, y)
    kernels = fused.program.kernels
    assert [k.name.split(".")[0] for k in kernels] == ["dot_general", "exponential"]
    for k in kernels:
        assert k.notes[0] == "fusion_kind: matmul_epilogue"
        assert k.notes[-1] == ("fallback: no matmul epilogue for batched inner products "
                               "(M = N = 1)")
    np.testing.assert_array_equal(fused.outputs[0], plain.outputs[0])
    np.testing.assert_allclose(fused.outputs[0], np.exp((bf16(x) * bf16(y)).sum(1)),
                               rtol=1e-5)


def test_kernel_lists_fused_ops_and_decisions():
    fused, _ = both(chain((8, 4), "float32"))
    (kernel,) = fused.kernels
    assert kernel.name == "multiply_fusion.0"
    # the op doing the most work first (fusion.dominant_first), data movement last
    assert [o.split(" at ")[0] for o in kernel.ops] == [
        "multiply", "add", "tanh", "multiply", "broadcast_in_dim", "broadcast_in_dim"]
    assert kernel.notes[0] == "fusion_kind: loop"
    assert "decision: tanh %" in kernel.notes[1]
    assert "// decision: tanh %" in fused.text
