"""balance.py: a tiled loop's VectorE tensor_scalars move to ScalarE while ScalarE has
room and runs ahead of VectorE; regions.assign_slots keeps outputs off ScalarE's slots."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor
from jax_trn.lower import elementwise
from jax_trn.lower.regions import Input, Region, assign_slots
from jax_trn.lower.tileops import Step

from .runner import run_program
from .test_elementwise import make
from .test_fusion import both, ty


def _program(params: str, body: str, result: str) -> str:
    return f"func.func @main({params}) -> {result} {{\n{body}\n}}"


def _run(text, *args):
    """(fused program, its result, the result of the fused program lowered with no
    ScalarE balance)."""
    fused, _ = both(text)
    saved, elementwise.MIN_BALANCED = elementwise.MIN_BALANCED, 2 ** 62
    try:
        unbalanced, _ = both(text)
    finally:
        elementwise.MIN_BALANCED = saved
    f, p = run_program(fused, list(args)), run_program(unbalanced, list(args))
    return fused, f.outputs[0], p.outputs[0]


def _tensor_scalars(program, engine: str) -> list:
    return [i for k in program.kernels for i in k.instructions
            if isinstance(i, isa.TensorScalar) and i.engine == engine and i.dst.free_size > 1]


def _softmax_plus(rows: int, cols: int, inner: str) -> str:
    """exp(x - m) * c + (y^3 + y) over bf16 rows, m and c per row: ScalarE's exp and
    more VectorE work than DMA per tile, as in a cross-entropy gradient (`inner` may
    replace x - m)."""
    t, r = ty((rows, cols), "bfloat16"), ty((rows,), "bfloat16")
    return _program(f"%x: {t}, %m: {r}, %c: {r}, %y: {t}", f"""
        %bm = stablehlo.broadcast_in_dim %m, dims = [0] : ({r}) -> {t}
        %bc = stablehlo.broadcast_in_dim %c, dims = [0] : ({r}) -> {t}
        %0 = {inner} : {t}
        %1 = stablehlo.exponential %0 : {t}
        %2 = stablehlo.multiply %1, %bc : {t}
        %3 = stablehlo.multiply %y, %y : {t}
        %4 = stablehlo.multiply %3, %y : {t}
        %5 = stablehlo.add %4, %y : {t}
        %6 = stablehlo.add %2, %5 : {t}
        return %6 : {t}""", t)


def _args(rows: int, cols: int):
    return [make(shape, "bfloat16", role=k) for k, shape in
            enumerate([(rows, cols), (rows,), (rows,), (rows, cols)])]


def test_scalar_engine_takes_tensor_scalars_reading_its_own_results():
    """exp(x - m) on ScalarE, then * c: the multiply reads only ScalarE's result, so it
    moves to ScalarE in some tiles (VectorE keeps the rest); the same bits as without
    the moves."""
    rows, cols = 512, 8192
    text = _softmax_plus(rows, cols, "stablehlo.subtract %x, %bm")
    fused, out, plain = _run(text, *_args(rows, cols))
    assert _tensor_scalars(fused, "scalar")
    assert _tensor_scalars(fused, "vector")
    np.testing.assert_array_equal(out.view(np.uint16), plain.view(np.uint16))


@pytest.mark.parametrize("rows, cols, inner", [
    (512, 8192, "stablehlo.multiply %x, %y"), (256, 1024, "stablehlo.subtract %x, %bm")],
    ids=["scalar_engine_waits_for_vector_engine", "two_tiles"])
def test_no_move(rows, cols, inner):
    """exp(x * y) reads VectorE's product: ScalarE already waits for VectorE in every
    tile, so nothing moves there (it would queue the next tile's work behind the wait).
    A loop of two tiles: the kernel's time is one tile's chain, which ScalarE's slower
    elementwise rate would lengthen."""
    fused, out, plain = _run(_softmax_plus(rows, cols, inner), *_args(rows, cols))
    assert not _tensor_scalars(fused, "scalar")
    np.testing.assert_array_equal(out.view(np.uint16), plain.view(np.uint16))


def test_an_output_takes_a_slot_last_written_off_scalar_engine():
    """out = (exp(x) + y * y) * z: exp's slot (ScalarE) and y * y's are both free when
    the output is computed; the output, held until its store ends, takes y * y's."""
    t = DramTensor("x", (128, 512), "float32")
    region = Region((128, 512), [Input(t, ((512, 128), (1, 512)), "float32")] * 3, [
        Step("exponential", (0,), "float32"),                   # 3: slot 0
        Step("multiply", (1, 1), "float32"),                    # 4: slot 1
        Step("add", (3, 4), "float32"),                         # 5: slot 2
        Step("multiply", (5, 2), "float32"),                    # 6: the output
    ], [(6, DramTensor("out", (128, 512), "float32"))])
    assert assign_slots(region) == {0: 0, 1: 1, 2: 2, 3: 1}
