"""Integer dot_general: exact two's-complement products and sums that wrap to the result
type, as XLA computes them (intdigits.py, intmatmul.py), on every generation."""
from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.spec import CHIPS
from jax_trn.lower import intdigits, intmatmul

from .runner import run
from .test_dot import CASES, _free, dot_module


def full_range(shape, dtype, seed):
    """Random integers over the whole range of `dtype`, extremes included."""
    info = np.iinfo(ir.np_dtype(dtype))
    x = np.random.default_rng(seed).integers(info.min, info.max, shape, dtype=info.dtype,
                                             endpoint=True)
    flat = x.reshape(-1)
    flat[:2] = (info.min, info.max)[:flat.size]
    return x


def int_ref(x, y, out_dtype, lb=(), rb=(), lc=(1,), rc=(0,)):
    """dot_general in 64-bit integers (wrapping mod 2**64, which keeps every lower
    bit exact), then wrapped to the result type like XLA."""
    lf, rf = _free(x.ndim, lb, lc), _free(y.ndim, rb, rc)
    wide = np.uint64 if "uint64" in (x.dtype.name, y.dtype.name) else np.int64
    xs = np.transpose(x, (*lb, *lf, *lc)).astype(wide)
    ys = np.transpose(y, (*rb, *rc, *rf)).astype(wide)
    bsz = [x.shape[d] for d in lb]
    m, n, k = (math.prod(x.shape[d] for d in lf), math.prod(y.shape[d] for d in rf),
               math.prod(x.shape[d] for d in lc))
    with np.errstate(over="ignore"):
        out = np.matmul(xs.reshape(math.prod(bsz), m, k), ys.reshape(math.prod(bsz), k, n))
    shape = tuple(bsz + [x.shape[d] for d in lf] + [y.shape[d] for d in rf])
    return out.reshape(shape).astype(ir.np_dtype(out_dtype))


def check(ls, rs, dtype, out_dtype=None, lb=(), rb=(), lc=(1,), rc=(0,), gen="trn2",
          rdtype=None, seed=0):
    out_dtype = out_dtype or dtype
    x, y = full_range(ls, dtype, seed), full_range(rs, rdtype or dtype, seed + 1)
    res = run(dot_module(ls, rs, lb, rb, lc, rc, dtype, rdtype, out_dtype), x, y,
              spec=CHIPS[gen].core)
    np.testing.assert_array_equal(res.outputs[0], int_ref(x, y, out_dtype, lb, rb, lc, rc))
    return res


def instrs(res, cls=None):
    return [i for k in res.program.kernels for i in k.instructions
            if cls is None or isinstance(i, cls)]


def test_doctests():
    assert doctest.testmod(intdigits).failed == 0


# --- the examples of issue 12 -------------------------------------------------------------

@pytest.mark.parametrize("x, y, dtype, want", [
    ([[16777217]], [[1]], "int32", 16777217),           # FP32 rounded it to 16777216
    ([[100000]], [[100000]], "int32", 1410065408),      # FP32 saturated at 2**31 - 1
    ([[100, 100]], [[100], [100]], "int8", 32),         # int8 . int8 -> int8 wraps
])
def test_issue_examples(x, y, dtype, want):
    x, y = np.array(x, dtype), np.array(y, dtype)
    out = run(dot_module(x.shape, y.shape, dtype=dtype), x, y).outputs[0]
    assert out.dtype == dtype and out.reshape(-1)[0] == want


# --- full range, every width and signedness ------------------------------------------------

WIDTHS = ["int8", "uint8", "int16", "uint16", "int32", "uint32"]


@pytest.mark.parametrize("dtype", WIDTHS)
def test_full_range_same_type(dtype):
    check((130, 300), (300, 70), dtype)


@pytest.mark.parametrize("dtype, out", [("int8", "int32"), ("uint8", "uint32"),
                                        ("int16", "int32"), ("uint16", "int32"),
                                        ("int8", "int16"), ("int32", "int8")])
def test_full_range_other_result_type(dtype, out):
    check((130, 300), (300, 70), dtype, out)


@pytest.mark.parametrize("case", [c for c in CASES if 0 not in c[0] + c[1]],
                         ids=lambda c: f"{c[0]}x{c[1]}")
def test_every_layout(case):
    ls, rs, lb, rb, lc, rc = case
    check(ls, rs, "int32", lb=lb, rb=rb, lc=lc, rc=rc)


@pytest.mark.parametrize("gen", ["trn1", "trn2", "trn3"])
@pytest.mark.parametrize("dtype", ["int8", "int16", "int32"])
@pytest.mark.parametrize("lc, rc", [((1,), (0,)), ((1,), (1,))])
def test_generations_and_transposes(gen, dtype, lc, rc):
    """[M, K] x [K, N] and [M, K] x [N, K]: K-contiguous operands go through
    dma_transpose (v3+, 2- and 4-byte) or TensorE transposes of their digits."""
    ls, rs = (200, 300), ((300, 150) if rc == (0,) else (150, 300))
    check(ls, rs, dtype, "int32", lc=lc, rc=rc, gen=gen)


def test_deep_k_goes_in_blocks_and_stays_exact():
    res = check((130, 9000), (9000, 600), "int32")
    assert len(instrs(res, isa.NcMatmul)) > 0


def test_int8_large_k_chunks_its_fp32_sums():
    """All +-127 / -128: every 1024-row sum reaches 2**24, more would round in FP32."""
    x, y = np.full((4, 5000), -128, np.int8), np.full((5000, 3), -128, np.int8)
    out = run(dot_module(x.shape, y.shape, dtype="int8", out_dtype="int32"), x, y)
    np.testing.assert_array_equal(out.outputs[0], np.full((4, 3), 5000 * 16384, np.int32))


def test_batched_inner_products_run_on_gpsimd():
    res = check((300, 70), (300, 70), "int32", lb=(0,), rb=(0,), lc=(1,), rc=(1,))
    kinds = {type(i).__name__ for i in instrs(res)}
    assert "NcMatmul" not in kinds
    assert all(i.engine == "gpsimd" for i in instrs(res, isa.TensorReduce))


def test_mixed_operand_types():
    check((60, 200), (200, 40), "int8", "int32", rdtype="int32")


# --- what it costs ------------------------------------------------------------------------

def _matmuls(dtype, out, shape=(256, 512, 512), gen="trn2"):
    m, k, n = shape
    x, y = full_range((m, k), dtype, 3), full_range((k, n), dtype, 4)
    res = run(dot_module((m, k), (k, n), dtype=dtype, out_dtype=out), x, y,
              spec=CHIPS[gen].core)
    np.testing.assert_array_equal(res.outputs[0], int_ref(x, y, out))
    return res, instrs(res, isa.NcMatmul)


def test_int8_fast_path_is_plain_bf16_matmuls():
    """int8 x int8 with K <= 1024: one accumulation group per output tile, bf16 digits
    straight from the DMA, and nothing on GpSimd but the result's wrap to int8."""
    res, mms = _matmuls("int8", "int32")
    assert {(i.stationary.dtype, i.moving.dtype) for i in mms} == {("bfloat16", "bfloat16")}
    assert len(mms) == 2 * 4                      # 2 row tiles x 4 k-tiles, 1 column tile
    assert not [i for i in instrs(res) if getattr(i, "engine", "") == "gpsimd"]


def test_int32_costs_ten_digit_pairs():
    _, mms = _matmuls("int32", "int32")
    assert len(mms) == 10 * 2 * 4                 # pairs with shift < 4 bytes
    assert all(i.stationary.dtype == "bfloat16" for i in mms)


def test_bool_dot_keeps_the_fp32_path():
    x = np.random.default_rng(0).random((20, 30)) > 0.5
    y = np.random.default_rng(1).random((30, 10)) > 0.5
    out = run(dot_module(x.shape, y.shape, dtype="bool"), x, y).outputs[0]
    np.testing.assert_array_equal(out, (x.astype(int) @ y.astype(int)) > 0)


def test_is_int_dot():
    assert intmatmul.is_int_dot("int8", "int8", "int32")
    assert not intmatmul.is_int_dot("int8", "int8", "float32")
    assert not intmatmul.is_int_dot("bool", "bool", "bool")
