"""Folds of folding.py beyond act(x*a+b): per-row TensorScalar operands, one
ScalarTensorTensor for (x op a) op y, converts into their neighbours. Each test checks
the instruction count drops and the result against the op-by-op lowering."""
from __future__ import annotations

from collections import Counter

import numpy as np

import pytest

from jax_trn.hw import isa
from jax_trn.lower import lower_module
from jax_trn.lower.builder import KernelBuilder
from jax_trn.lower.folding import Arg
from jax_trn.lower.target import Target
from jax_trn.lower.tileops import TILE_OPS, Src, Step

from tests.hlo_passes.helpers import from_text

from .runner import SPEC, run_program
from .test_elementwise import make
from .test_fusion import both, ty


def _mix(program) -> Counter:
    return Counter(type(i).__name__ for k in program.kernels for i in k.instructions
                   if not isinstance(i, isa.DmaCopy))


def _run(text, *args):
    fused, plain = both(text)
    f, p = run_program(fused, list(args)), run_program(plain, list(args))
    return fused, f.outputs[0], p.outputs[0]


def _program(params: str, body: str, result: str) -> str:
    return f"func.func @main({params}) -> {result} {{\n{body}\n}}"


def test_scaled_sum_of_two_tiles_is_one_scalar_tensor_tensor():
    t, s = ty((256, 1024), "float32"), ty((), "float32")
    text = _program(f"%x: {t}, %y: {t}", f"""
        %c = stablehlo.constant dense<0.9> : {s}
        %b = stablehlo.broadcast_in_dim %c, dims = [] : ({s}) -> {t}
        %0 = stablehlo.multiply %b, %x : {t}
        %1 = stablehlo.add %0, %y : {t}
        return %1 : {t}""", t)
    x, y = make((256, 1024), "float32", role=0), make((256, 1024), "float32", role=1)
    fused, out, plain = _run(text, x, y)
    ins = [i for k in fused.kernels for i in k.instructions]
    assert any(isinstance(i, isa.ScalarTensorTensor) for i in ins)
    # VectorE runs it as one instruction; GpSimd (spread.py) as TS + TT
    assert all(i.engine == "gpsimd" for i in ins if isinstance(i, isa.TensorTensor))
    np.testing.assert_array_equal(out, plain)              # FP32 inside either way


def test_per_row_statistics_are_tensor_scalar_operands():
    t, r = ty((256, 512), "float32"), ty((256,), "float32")
    text = _program(f"%x: {t}, %m: {r}, %s: {r}", f"""
        %bm = stablehlo.broadcast_in_dim %m, dims = [0] : ({r}) -> {t}
        %bs = stablehlo.broadcast_in_dim %s, dims = [0] : ({r}) -> {t}
        %0 = stablehlo.subtract %x, %bm : {t}
        %1 = stablehlo.multiply %0, %bs : {t}
        return %1 : {t}""", t)
    x, m, s = (make(shape, "float32", role=i) for i, shape in
               enumerate([(256, 512), (256,), (256,)]))
    fused, out, plain = _run(text, x, m, s)
    ts = [i for k in fused.kernels for i in k.instructions if isinstance(i, isa.TensorScalar)]
    assert len(ts) == 2 and all(i.op1 == "multiply" for i in ts)     # one per tile
    assert _mix(fused)["TensorTensor"] == 0
    np.testing.assert_array_equal(out, plain)


@pytest.mark.parametrize("kind", ["tensor_scalar", "scalar_tensor_tensor", "activation_row"])
def test_folded_steps_run_op_by_op_when_a_box_gives_full_tiles(kind):
    """A per-row operand is a [P, 1] tile under the row tiling; where a box gives a full
    tile instead, the folded step emits the unfolded instructions (same numerics)."""
    kb = KernelBuilder("k", Target.of(SPEC))
    x, m, y, dst = (kb.tile(64, "float32") for _ in range(4))
    srcs = [Src.of(x), Src.of(m)]
    step = {"tensor_scalar": Step(kind, (0, 1), "float32", {"ops": (
                ("subtract", Arg(1), False), ("multiply", 3.0, False))}),
            "scalar_tensor_tensor": Step(kind, (0, 2, 1), "float32", {
                "op0": "subtract", "operand0": Arg(2), "reverse0": False,
                "op1": "multiply", "reverse1": False}),
            "activation_row": Step(kind, (0, 1), "float32", {"func": "exponential",
                                                             "negate": True})}[kind]
    if kind == "scalar_tensor_tensor":
        srcs = [Src.of(x), Src.of(y), Src.of(m)]
    if kind == "activation_row":
        srcs.append(Src.of(kb.tile(1, "float32"), scalar=True))
    TILE_OPS[kind].emit(kb, dst, srcs, step)
    first, second = kb.instrs
    assert isinstance(first, isa.TensorTensor) and first.op == "subtract"
    assert first.data2 == m and first.dst == dst
    assert second.dst == dst and type(second) is not isa.ScalarTensorTensor


def test_narrowing_convert_is_the_producers_destination_type():
    t, b = ty((256, 512), "float32"), ty((256, 512), "bfloat16")
    text = _program(f"%x: {t}, %y: {t}", f"""
        %0 = stablehlo.multiply %x, %y : {t}
        %1 = stablehlo.convert %0 : ({t}) -> {b}
        return %1 : {b}""", b)
    x, y = make((256, 512), "float32", role=0), make((256, 512), "float32", role=1)
    fused, out, plain = _run(text, x, y)
    assert _mix(fused)["TensorCopy"] == 0
    np.testing.assert_array_equal(out.view(np.uint16), plain.view(np.uint16))


def test_widening_convert_is_read_directly():
    t, b = ty((256, 512), "float32"), ty((256, 512), "bfloat16")
    text = _program(f"%x: {b}, %y: {t}", f"""
        %0 = stablehlo.convert %x : ({b}) -> {t}
        %1 = stablehlo.multiply %0, %y : {t}
        return %1 : {t}""", t)
    x, y = make((256, 512), "bfloat16", role=0), make((256, 512), "float32", role=1)
    fused, out, plain = _run(text, x, y)
    assert _mix(fused)["TensorCopy"] == 0
    np.testing.assert_array_equal(out, plain)


@pytest.mark.parametrize("dtype", ["int32", "float32"])
def test_a_compare_converted_to_float_writes_the_float(dtype):
    """One-hot labels as jax.nn.one_hot writes them, convert(x == y) to f32, times a
    scale: the compare writes 1.0 / 0.0 in float32 itself (no TensorCopy of the bool),
    same values."""
    t, f = ty((256, 512), dtype), ty((256, 512), "float32")
    bl = "tensor<256x512xi1>"
    text = _program(f"%x: {t}, %y: {t}, %s: {f}", f"""
        %0 = stablehlo.compare EQ, %x, %y : ({t}, {t}) -> {bl}
        %1 = stablehlo.convert %0 : ({bl}) -> {f}
        %2 = stablehlo.multiply %1, %s : {f}
        return %2 : {f}""", f)
    rng = np.random.default_rng(4)
    x = rng.integers(0, 3, (256, 512)).astype(dtype)
    y = rng.integers(0, 3, (256, 512)).astype(dtype)
    fused, out, plain = _run(text, x, y, make((256, 512), "float32", role=2))
    assert _mix(fused)["TensorCopy"] == 0
    np.testing.assert_array_equal(out, plain)


def test_exp_of_x_minus_row_max_is_one_activation():
    t, r = ty((256, 512), "float32"), ty((256,), "float32")
    text = _program(f"%x: {t}, %m: {r}", f"""
        %bm = stablehlo.broadcast_in_dim %m, dims = [0] : ({r}) -> {t}
        %0 = stablehlo.subtract %x, %bm : {t}
        %1 = stablehlo.exponential %0 : {t}
        return %1 : {t}""", t)
    x, m = make((256, 512), "float32", role=0), make((256,), "float32", role=1)
    fused, out, plain = _run(text, x, m)
    acts = [i for k in fused.kernels for i in k.instructions if isinstance(i, isa.Activation)]
    assert len(acts) == 2 and all(a.bias is not None and a.bias.free == (1,) for a in acts)
    full = [i for k in fused.kernels for i in k.instructions
            if isinstance(i, (isa.TensorScalar, isa.TensorTensor)) and i.dst.free_size > 1]
    assert not full                                        # only the [P, 1] negation
    np.testing.assert_array_equal(out, plain)              # x + (-m) == x - m in FP32


def test_matmul_epilogue_reads_psum_straight_into_scalar_tensor_tensor():
    a, b, o = ty((128, 64), "float32"), ty((64, 256), "float32"), ty((128, 256), "float32")
    s = ty((), "float32")
    text = _program(f"%a: {a}, %b: {b}, %y: {o}", f"""
        %d = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : ({a}, {b}) -> {o}
        %c = stablehlo.constant dense<0.5> : {s}
        %bc = stablehlo.broadcast_in_dim %c, dims = [] : ({s}) -> {o}
        %0 = stablehlo.multiply %d, %bc : {o}
        %1 = stablehlo.add %0, %y : {o}
        return %1 : {o}""", o)
    args = [make(shape, "float32", role=i) for i, shape in
            enumerate([(128, 64), (64, 256), (128, 256)])]
    fused, out, plain = _run(text, *args)
    (kernel,) = fused.kernels
    assert any("read from PSUM by scalar_tensor_tensor" in n for n in kernel.notes)
    stt = [i for i in kernel.instructions if isinstance(i, isa.ScalarTensorTensor)]
    assert stt and all(i.data.mem == "psum" for i in stt)
    np.testing.assert_allclose(out, plain, rtol=1e-6)


def test_rounding_to_bf16_and_back_keeps_the_rounding():
    """convert(convert(x * y, bf16), f32) * z: the narrowing convert becomes the
    multiply's bf16 destination, the widening one is read directly by the next multiply."""
    t, b = ty((256, 512), "float32"), ty((256, 512), "bfloat16")
    text = _program(f"%x: {t}, %y: {t}, %z: {t}", f"""
        %0 = stablehlo.multiply %x, %y : {t}
        %1 = stablehlo.convert %0 : ({t}) -> {b}
        %2 = stablehlo.convert %1 : ({b}) -> {t}
        %3 = stablehlo.multiply %2, %z : {t}
        return %3 : {t}""", t)
    args = [make((256, 512), "float32", role=i) for i in range(3)]
    fused, out, plain = _run(text, *args)
    assert _mix(fused)["TensorCopy"] == 0
    np.testing.assert_array_equal(out, plain)


def test_in_place_scalar_tensor_tensor_stays_whole_on_gpsimd():
    """ceil's sequence (tileops/mathops.py) has a scalar_tensor_tensor whose operand1 is
    its destination; spread.py must not split it into a tensor_scalar that overwrites
    operand1 before the tensor_tensor reads it (FP32 tiles move to GpSimd)."""
    t = ty((256, 384), "float32")
    text = _program(f"%x: {t}", f"""
        %0 = stablehlo.ceil %x : {t}
        return %0 : {t}""", t)
    x = (make((256, 384), "float32", role=0) * 8).astype(np.float32)
    (out,) = run_program(lower_module(from_text(text), SPEC), [x]).outputs
    np.testing.assert_array_equal(out, np.ceil(x))


def test_a_generated_iota_box_is_kept_for_the_next_rows():
    """One-hot labels, convert(iota == t) over [384, 16384]: rows are cut in column
    chunks, and each chunk's iota values repeat for every 128 rows, so its box is
    generated once and kept (regions._iota_tile), not once per row tile (3x the iotas
    before); same values as the unfused program."""
    rows, cols = 384, 16384
    t, f = ty((rows, 1), "int32"), ty((rows, cols), "float32")
    i = ty((rows, cols), "int32")
    bl = f"tensor<{rows}x{cols}xi1>"
    text = _program(f"%t: {t}", f"""
        %0 = stablehlo.iota dim = 1 : {i}
        %1 = stablehlo.broadcast_in_dim %t, dims = [0, 1] : ({t}) -> {i}
        %2 = stablehlo.compare EQ, %0, %1 : ({i}, {i}) -> {bl}
        %3 = stablehlo.convert %2 : ({bl}) -> {f}
        return %3 : {f}""", f)
    labels = np.random.default_rng(5).integers(0, cols, (rows, 1)).astype(np.int32)
    fused, out, plain = _run(text, labels)
    mix = _mix(fused)
    assert 1 < mix["Iota"] * 3 == mix["TensorScalar"], mix      # one per chunk, not per box
    np.testing.assert_array_equal(out, plain)
    np.testing.assert_array_equal(out, (np.arange(cols)[None] == labels).astype(np.float32))
