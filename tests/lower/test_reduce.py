"""reduce (add / max / min, bool and / or) over any axes, run on the simulated NeuronCore."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from hlo_passes import ir
from jax_trn.lower import LoweringError, lower_module

from .irbuild import FnBuilder, combiner
from .runner import SPEC, run
from .test_elementwise import make

NP = {"add": np.sum, "maximum": np.max, "minimum": np.min, "and": np.all, "or": np.any}
IDENTITY = {"add": 0, "maximum": -np.inf, "minimum": np.inf, "and": True, "or": False}


def reduce_module(shape, dims, kind="add", dtype="float32", init=None, init_arg=False):
    b = FnBuilder()
    x = b.arg(shape, dtype)
    if init_arg:
        i = b.arg((), dtype)
    else:
        value = IDENTITY[kind] if init is None else init
        if ir.is_int(dtype) and np.isinf(value):
            info = np.iinfo(ir.np_dtype(dtype))
            value = info.min if value < 0 else info.max
        i = b.const(value, dtype)
    out = tuple(n for d, n in enumerate(shape) if d not in dims)
    r = b.op("reduce", [x, i], out, dtype, regions=[combiner(kind, dtype)], dimensions=dims)
    return b.ret(r)


def expected(x, dims, kind, dtype, init=None):
    acc = x.astype(np.float64) if ir.is_float(dtype) else x
    if x.size == 0:
        shape = tuple(n for d, n in enumerate(x.shape) if d not in dims)
        value = IDENTITY[kind] if init is None else init
        if ir.is_int(dtype) and np.isinf(value):
            info = np.iinfo(ir.np_dtype(dtype))
            value = info.min if value < 0 else info.max
        return np.full(shape, value, ir.np_dtype(dtype))
    r = NP[kind](acc, axis=tuple(dims))
    if init is not None:
        r = {"add": np.add, "maximum": np.maximum, "minimum": np.minimum}[kind](r, init)
    return np.asarray(r).astype(ir.np_dtype(dtype))


CASES = [((7,), (0,)), ((130, 3), (1,)), ((130, 3), (0,)), ((130, 3), (0, 1)),
         ((256, 512), (1,)), ((256, 512), (0,)), ((3, 5, 7), (0, 2)), ((3, 5, 7), (1,)),
         ((3, 5, 7), (0, 1)), ((3, 5, 7), ()), ((2, 3, 300), (0, 2)), ((), ()),
         ((0,), (0,)), ((4, 0), (1,)), ((0, 4), (1,))]


@pytest.mark.parametrize("shape,dims", CASES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize("kind", ["add", "maximum", "minimum"])
def test_reduce(kind, dtype, shape, dims):
    x = make(shape, dtype, seed=3)
    out = run(reduce_module(shape, dims, kind, dtype), x).outputs[0]
    exp = expected(x, dims, kind, dtype)
    if dtype == "bfloat16":   # FP32 accumulation in another order: one bf16 ulp
        np.testing.assert_allclose(out.astype(np.float32), exp.astype(np.float32),
                                   rtol=1e-2, atol=1e-2)
    else:
        np.testing.assert_allclose(out, exp, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape,dims", [((130, 3), (1,)), ((130, 3), (0,)), ((5, 7), (0, 1))])
@pytest.mark.parametrize("kind", ["and", "or"])
def test_reduce_bool(kind, shape, dims):
    x = make(shape, "bool", seed=4)
    x[0] = kind == "and"     # make sure some rows are all-True / all-False
    out = run(reduce_module(shape, dims, kind, "bool"), x).outputs[0]
    np.testing.assert_array_equal(out, NP[kind](x, axis=dims))


@pytest.mark.parametrize("shape,dims", [((130, 3), (1,)), ((130, 3), (0,)), ((3, 5, 7), (0, 1, 2))])
@pytest.mark.parametrize("kind,init", [("add", 10.0), ("maximum", 0.5), ("minimum", -0.5)])
def test_reduce_non_identity_init(kind, init, shape, dims):
    x = make(shape, "float32", seed=5)
    out = run(reduce_module(shape, dims, kind, init=init), x).outputs[0]
    np.testing.assert_allclose(out, expected(x, dims, kind, "float32", init), rtol=1e-5,
                               atol=1e-5)


def test_reduce_init_from_a_parameter():
    x = make((130, 3), "float32", seed=6)
    out = run(reduce_module((130, 3), (1,), "add", init_arg=True), x,
              np.array(2.0, np.float32)).outputs[0]
    np.testing.assert_allclose(out, x.sum(1) + 2, rtol=1e-5, atol=1e-5)


def test_reduce_of_empty_axis_is_init():
    out = run(reduce_module((4, 0), (1,), "add", init=3.0), np.zeros((4, 0), np.float32))
    np.testing.assert_array_equal(out.outputs[0], np.full(4, 3.0, np.float32))


def test_int_sum_is_exact_and_wraps():
    x = np.full((3, 1000), 2**30, np.int32)
    out = run(reduce_module((3, 1000), (1,), "add", "int32"), x).outputs[0]
    np.testing.assert_array_equal(out, x.sum(1, dtype=np.int32))


def test_reduce_strategies():
    """Rows (reduced axis innermost) never transpose; columns and all-reduce do once."""
    def counts(shape, dims):
        k = lower_module(reduce_module(shape, dims), SPEC).kernels[-1]
        return Counter(type(i).__name__ for i in k.instructions)
    assert counts((256, 512), (1,))["NcTranspose"] == 0
    assert counts((256, 512), (0,))["NcTranspose"] == 4       # 512 kept / 128
    assert counts((256, 512), (0, 1))["NcTranspose"] == 1


STREAM_CASES = [((4, 300, 70), (0,)), ((2, 129, 257), (0,)), ((3, 5, 7000), (0, 1))]


@pytest.mark.parametrize("shape,dims", STREAM_CASES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize("kind", ["add", "maximum", "minimum"])
def test_reduce_few_reduced_many_kept_streams(kind, dtype, shape, dims):
    """A sum over a small batch axis keeping a large contiguous space (a position
    embedding's gradient) combines [P, F] blocks elementwise: no transposes."""
    x = make(shape, dtype, seed=7)
    module = reduce_module(shape, dims, kind, dtype)
    k = lower_module(module, SPEC).kernels[-1]
    assert not any(type(i).__name__ == "NcTranspose" for i in k.instructions)
    out = run(module, x).outputs[0]
    exp = expected(x, dims, kind, dtype)
    if dtype == "bfloat16":
        np.testing.assert_allclose(out.astype(np.float32), exp.astype(np.float32),
                                   rtol=1e-2, atol=1e-2)
    else:
        np.testing.assert_allclose(out, exp, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind,init", [("add", 10.0), ("maximum", 0.5), ("minimum", -0.5)])
def test_streamed_reduce_applies_a_non_identity_init(kind, init):
    x = make((4, 300, 70), "float32", seed=8)
    out = run(reduce_module((4, 300, 70), (0,), kind, init=init), x).outputs[0]
    np.testing.assert_allclose(out, expected(x, (0,), kind, "float32", init), rtol=1e-5,
                               atol=1e-5)


def test_streamed_bool_and_int_reduces_are_exact():
    x = make((3, 200, 90), "bool", seed=9)
    for kind in ("and", "or"):
        out = run(reduce_module(x.shape, (0,), kind, "bool"), x).outputs[0]
        np.testing.assert_array_equal(out, NP[kind](x, axis=0))
    big = np.full((3, 200, 90), 2**30, np.int32)
    out = run(reduce_module(big.shape, (0,), "add", "int32"), big).outputs[0]
    np.testing.assert_array_equal(out, big.sum(0, dtype=np.int32))


def test_columns_read_long_rows():
    """A column reduce (LayerNorm gain gradient: [S, D] summed over S) reads rows of
    up to 1024 kept elements per partition (4 KiB of FP32, §3.4), not 128."""
    k = lower_module(reduce_module((1024, 1024), (0,)), SPEC).kernels[-1]
    loads = [i for i in k.instructions if type(i).__name__ == "DmaCopy"
             and hasattr(i.src, "pattern")]
    assert loads and all(i.src.pattern[-1][1] == 1024 for i in loads)
    assert sum(type(i).__name__ == "NcTranspose" for i in k.instructions) == 8


def test_unsupported_combiner():
    with pytest.raises(LoweringError, match=r"reduce combiner \(divide\).*at test.py:1"):
        lower_module(reduce_module((4, 3), (1,), "divide", init=1.0), SPEC)


def test_variadic_reduce_unsupported():
    b = FnBuilder()
    x, y = b.arg((4, 3)), b.arg((4, 3), "int32")
    i, j = b.const(0.0), b.const(0, "int32")
    op = b.op("reduce", [x, y, i, j], (4,), "float32", regions=[combiner("add", "float32")],
              dimensions=(1,))
    with pytest.raises(LoweringError, match="reduce of 2 operands"):
        lower_module(b.ret(op), SPEC)
