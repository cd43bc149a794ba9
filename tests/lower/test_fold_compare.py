"""folding.py's compare fold (a compare converted to float, then an ALU op with a
per-row or immediate operand: one TensorScalar on VectorE) and narrowed folded
tensor_scalars (a convert to bf16 after `(x op a) op b`: the TensorScalar writes bf16
itself). Each test checks the instructions and the result against the unfused program."""
from __future__ import annotations

from collections import Counter

import numpy as np

from jax_trn.hw import isa
from jax_trn.lower.builder import KernelBuilder
from jax_trn.lower.folding import Arg
from jax_trn.lower.target import Target
from jax_trn.lower.tileops import TILE_OPS, Src, Step

from .runner import SPEC, run_program
from .test_fusion import both, ty


def _program(params: str, body: str, result: str) -> str:
    return f"func.func @main({params}) -> {result} {{\n{body}\n}}"


def _instrs(program) -> list:
    return [i for k in program.kernels for i in k.instructions if not isinstance(i, isa.DmaCopy)]


def _run(text, *args):
    fused, plain = both(text)
    f, p = run_program(fused, list(args)), run_program(plain, list(args))
    return fused, f.outputs[0], p.outputs[0]


def _smoothed_labels(rows: int, cols: int) -> str:
    """optax.smooth_labels(one_hot(t), 0.1) times a per-row scale, rounded to bf16: the
    label half of a cross-entropy gradient."""
    t, i, f, b = (ty((rows, 1), "int32"), ty((rows, cols), "int32"),
                  ty((rows, cols), "float32"), ty((rows, cols), "bfloat16"))
    r, s, bl = ty((rows,), "float32"), ty((), "float32"), f"tensor<{rows}x{cols}xi1>"
    return _program(f"%t: {t}, %g: {r}", f"""
        %0 = stablehlo.iota dim = 1 : {i}
        %1 = stablehlo.broadcast_in_dim %t, dims = [0, 1] : ({t}) -> {i}
        %2 = stablehlo.compare EQ, %0, %1 : ({i}, {i}) -> {bl}
        %3 = stablehlo.convert %2 : ({bl}) -> {f}
        %c9 = stablehlo.constant dense<0.9> : {s}
        %b9 = stablehlo.broadcast_in_dim %c9, dims = [] : ({s}) -> {f}
        %4 = stablehlo.multiply %3, %b9 : {f}
        %cb = stablehlo.constant dense<3.125e-06> : {s}
        %bb = stablehlo.broadcast_in_dim %cb, dims = [] : ({s}) -> {f}
        %5 = stablehlo.add %4, %bb : {f}
        %bg = stablehlo.broadcast_in_dim %g, dims = [0] : ({r}) -> {f}
        %6 = stablehlo.multiply %5, %bg : {f}
        %7 = stablehlo.convert %6 : ({f}) -> {b}
        return %7 : {b}""", b)


def test_smoothed_one_hot_is_two_tensor_scalars_on_vector_engine():
    """iota == t, * 0.9 is one VectorE TensorScalar (the compare in FP32 is exact: the
    iota's values are below 2**24), + b, * g another writing bf16 itself: no GpSimd
    compare, no TensorCopy, and the same bits as the unfused program."""
    rows, cols = 256, 2048
    labels = np.random.default_rng(1).integers(0, cols, (rows, 1)).astype(np.int32)
    labels[0, 0] = 2 ** 24 + 1          # rounds to 2**24 in FP32: still no column's value
    scale = np.random.default_rng(2).standard_normal(rows).astype(np.float32)
    fused, out, plain = _run(_smoothed_labels(rows, cols), labels, scale)
    ts = [i for i in _instrs(fused) if isinstance(i, isa.TensorScalar) and i.dst.free_size > 1]
    cmp = [i for i in ts if i.op0 == "is_equal"]
    assert cmp and all(i.op1 == "multiply" and i.engine == "vector" for i in cmp)
    assert len(ts) == 2 * len(cmp)
    assert all(i.dst.dtype == "bfloat16" for i in ts if i.op0 == "add")
    assert Counter(type(i).__name__ for i in _instrs(fused))["TensorCopy"] == 0
    np.testing.assert_array_equal(out.view(np.uint16), plain.view(np.uint16))


def test_a_compare_of_two_integer_inputs_is_not_folded():
    """x == y of int32 values is not exact in FP32 (2**24 + 1 rounds to 2**24), so the
    compare stays an integer instruction of its own."""
    rows, cols = 256, 512
    t, r, f = ty((rows, cols), "int32"), ty((rows,), "int32"), ty((rows, cols), "float32")
    s, bl = ty((), "float32"), f"tensor<{rows}x{cols}xi1>"
    text = _program(f"%x: {t}, %y: {r}", f"""
        %1 = stablehlo.broadcast_in_dim %y, dims = [0] : ({r}) -> {t}
        %2 = stablehlo.compare EQ, %x, %1 : ({t}, {t}) -> {bl}
        %3 = stablehlo.convert %2 : ({bl}) -> {f}
        %c = stablehlo.constant dense<0.9> : {s}
        %b = stablehlo.broadcast_in_dim %c, dims = [] : ({s}) -> {f}
        %4 = stablehlo.multiply %3, %b : {f}
        return %4 : {f}""", f)
    x = np.full((rows, cols), 2 ** 24 + 1, np.int32)
    y = np.full((rows,), 2 ** 24, np.int32)
    fused, out, plain = _run(text, x, y)
    assert not any(isinstance(i, isa.TensorScalar) and i.op1 == "multiply"
                   and i.op0 == "is_equal" for i in _instrs(fused))
    assert not out.any()
    np.testing.assert_array_equal(out, plain)


def test_a_narrowed_tensor_scalar_op_by_op_keeps_its_intermediate_type():
    """A folded (x - m) * 3 narrowed to bf16 by its convert ("via" float32): where a box
    gives m as a full tile, the subtract writes an FP32 tile of its own and only the
    multiply writes bf16 (one rounding, as unfolded)."""
    kb = KernelBuilder("k", Target.of(SPEC))
    x, m, dst = kb.tile(64, "float32"), kb.tile(64, "float32"), kb.tile(64, "bfloat16")
    step = Step("tensor_scalar", (0, 1), "bfloat16", {"ops": (
        ("subtract", Arg(1), False), ("multiply", 3.0, False)), "via": "float32"})
    TILE_OPS["tensor_scalar"].emit(kb, dst, [Src.of(x), Src.of(m)], step)
    first, second = kb.instrs
    assert isinstance(first, isa.TensorTensor) and first.dst.dtype == "float32"
    assert second.data == first.dst and second.dst == dst
