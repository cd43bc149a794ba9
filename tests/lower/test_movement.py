"""reshape / transpose / broadcast_in_dim / iota / constants / output copies, run on the
simulated NeuronCore."""
from __future__ import annotations

import numpy as np
import pytest

from hlo_passes import ir

from .irbuild import FnBuilder
from .runner import run
from .test_elementwise import make


def test_relayout_paths_and_speed():
    """Matrix transposes go through TensorE, row broadcasts through SBUF, and both
    are far faster than a DMA reading 4-byte runs."""
    from collections import Counter
    from jax_trn.lower import lower_module
    from .runner import SPEC
    t = lower_module(one_op("transpose", (256, 512), (512, 256), permutation=(1, 0)), SPEC)
    assert Counter(type(i).__name__ for i in t.kernels[0].instructions)["NcTranspose"] == 8
    bc = one_op("broadcast_in_dim", (256,), (256, 512), broadcast_dimensions=(0,))
    x = make((256, 512), "float32")
    assert run(one_op("transpose", (256, 512), (512, 256), permutation=(1, 0)), x).ns < 20e3
    assert run(bc, x[:, 0].copy()).ns < 10e3


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape,perm", [((1, 2, 256, 64, 4), (0, 1, 4, 3, 2)),
                                        ((64, 8, 40), (2, 1, 0)),
                                        ((70, 3, 2, 40), (3, 1, 2, 0))])
def test_transpose_in_two_stages(shape, perm, dtype, monkeypatch):
    """An output whose innermost dim is strided in the input, and no swap of two axes
    (gemma's grouped scores: [S, T, G] -> [G, T, S]): a TensorE swap into a temporary,
    then whole rows, is exact and far faster than one DMA of 2-4 byte runs."""
    from jax_trn.lower import relayout
    out_shape = tuple(shape[p] for p in perm)
    module = lambda: one_op("transpose", shape, out_shape, dtype, permutation=perm)
    x = make(shape, dtype)
    two = run(module(), x)
    np.testing.assert_array_equal(two.outputs[0], np.transpose(x, perm))
    monkeypatch.setattr(relayout, "MIN_ROW", 1 << 30)       # the direct copy
    one = run(module(), x)
    np.testing.assert_array_equal(one.outputs[0], np.transpose(x, perm))
    assert two.ns < 0.5 * one.ns


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape,perm", [((1024, 24, 128), (1, 0, 2)),
                                        ((24, 1024, 128), (1, 0, 2)),
                                        ((2, 1024, 8, 128), (0, 2, 1, 3)),
                                        ((2, 8, 1030, 128), (0, 2, 1, 3))])
def test_head_split_transposes_stage_long_runs(shape, perm, dtype, monkeypatch):
    """[S, H, D] <-> [H, S, D] with D short (attention's head split): staged through
    SBUF and reordered by engine copies, DMAs of >= 2 KiB runs, exact, and far faster
    than one DMA of D-element runs."""
    from jax_trn.lower import lower_module, relayout
    from .runner import SPEC
    out_shape = tuple(shape[p] for p in perm)
    module = lambda: one_op("transpose", shape, out_shape, dtype, permutation=perm)
    x = make(shape, dtype)
    staged = run(module(), x)
    np.testing.assert_array_equal(staged.outputs[0], np.transpose(x, perm))
    copies = [i for i in lower_module(module(), SPEC).kernels[0].instructions
              if type(i).__name__ == "TensorCopy"]
    assert copies and all(i.src.strides is not None for i in copies)
    monkeypatch.setattr(relayout, "ROW_SWAP_TYPES", frozenset())     # the direct copy
    direct = run(module(), x)
    np.testing.assert_array_equal(direct.outputs[0], np.transpose(x, perm))
    assert staged.ns < 0.6 * direct.ns


@pytest.mark.parametrize("shape,perm", [((2, 300, 8, 64), (0, 2, 1, 3)),
                                        ((129, 130, 16), (1, 0, 2))])
def test_head_split_with_short_axes_copies_directly(shape, perm):
    """Too few positions for long runs on both sides: no staging (it would be slower)."""
    from jax_trn.lower import lower_module
    from .runner import SPEC
    out_shape = tuple(shape[p] for p in perm)
    module = one_op("transpose", shape, out_shape, "float32", permutation=perm)
    kernel = lower_module(module, SPEC).kernels[0]
    assert not any(type(i).__name__ == "TensorCopy" for i in kernel.instructions)
    x = make(shape, "float32")
    np.testing.assert_array_equal(run(module, x).outputs[0], np.transpose(x, perm))


def one_op(kind, in_shape, out_shape, dtype="float32", **attrs):
    b = FnBuilder()
    x = b.arg(in_shape, dtype)
    return b.ret(b.op(kind, [x], out_shape, dtype, **attrs))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "bool"])
@pytest.mark.parametrize("src,dst", [((), (1, 1)), ((0, 3), (3, 0)), ((130, 3), (3, 130)),
                                     ((3, 5, 7), (105,)), ((256, 512), (512, 256))])
def test_reshape(src, dst, dtype):
    x = make(src, dtype)
    out = run(one_op("reshape", src, dst, dtype), x).outputs[0]
    np.testing.assert_array_equal(out, x.reshape(dst))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32", "bool"])
@pytest.mark.parametrize("shape,perm", [((130, 3), (1, 0)), ((3, 5, 7), (2, 0, 1)),
                                        ((3, 5, 7), (0, 2, 1)), ((2, 3, 4, 5), (3, 1, 0, 2)),
                                        ((0, 4), (1, 0)), ((), ()), ((600, 700), (1, 0)),
                                        ((2, 130, 300), (0, 2, 1)),
                                        ((4, 130, 6), (1, 0, 2))])
def test_transpose(shape, perm, dtype):
    x = make(shape, dtype)
    out_shape = tuple(shape[p] for p in perm)
    out = run(one_op("transpose", shape, out_shape, dtype, permutation=perm), x).outputs[0]
    np.testing.assert_array_equal(out, np.transpose(x, perm))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize("src,dst,dims", [((), (7,), ()), ((3,), (130, 3), (1,)),
                                          ((130,), (130, 3), (0,)),
                                          ((5, 1), (3, 5, 7), (1, 2)),
                                          ((1, 7), (3, 5, 7), (0, 2)),
                                          ((4,), (0, 4), (1,)), ((), (3000,), ()),
                                          ((256,), (256, 3000), (0,)),
                                          ((3, 4), (3, 5, 4, 6), (0, 2))])
def test_broadcast_in_dim(src, dst, dims, dtype):
    x = make(src, dtype)
    m = one_op("broadcast_in_dim", src, dst, dtype, broadcast_dimensions=dims)
    out = run(m, x).outputs[0]
    expand = [dst[d] if d in dims else 1 for d in range(len(dst))]
    view = x.reshape([src[dims.index(d)] if d in dims else 1 for d in range(len(dst))])
    assert len(expand) == len(dst)
    np.testing.assert_array_equal(out, np.broadcast_to(view, dst))


@pytest.mark.parametrize("dtype", ["int32", "float32", "bfloat16"])
@pytest.mark.parametrize("shape,dim", [((), 0), ((0,), 0), ((7,), 0), ((300,), 0),
                                       ((1024, 1024), 1), ((130, 3), 0), ((130, 3), 1),
                                       ((3, 5, 7), 1), ((2, 200, 3), 0)])
def test_iota(shape, dim, dtype):
    if shape == () and dim == 0:
        pytest.skip("iota needs rank >= 1")
    b = FnBuilder()
    m = b.ret(b.op("iota", [], shape, dtype, iota_dimension=dim))
    out = run(m).outputs[0]
    idx = np.arange(shape[dim]).reshape([-1 if d == dim else 1 for d in range(len(shape))])
    np.testing.assert_array_equal(out, np.broadcast_to(idx, shape).astype(ir.np_dtype(dtype)))


# --- constants and outputs --------------------------------------------------------------

@pytest.mark.parametrize("value,dtype", [(1.5, "float32"), (-np.inf, "float32"),
                                         (7, "int32"), (True, "bool"), (0.0, "bfloat16")])
@pytest.mark.parametrize("shape", [(), (0,), (130, 3)])
def test_splat_constant_is_a_memset(value, dtype, shape):
    b = FnBuilder()
    r = run(b.ret(b.const(np.full(shape, value), dtype)))
    np.testing.assert_array_equal(r.outputs[0], np.full(shape, value, ir.np_dtype(dtype)))
    assert not r.program.constants
    ops = {type(i).__name__ for k in r.program.kernels for i in k.instructions}
    assert ops <= {"Memset", "DmaCopy"}


def test_non_splat_constant_is_initial_data():
    b = FnBuilder()
    x = b.arg((4,))
    c = b.const([1.0, 2.0, 3.0, 4.0])
    r = run(b.ret(b.op("add", [x, c], (4,), "float32"), c), np.ones(4, np.float32))
    assert list(r.program.constants) == ["const:0"]
    np.testing.assert_array_equal(r.outputs[0], [2, 3, 4, 5])
    np.testing.assert_array_equal(r.outputs[1], [1, 2, 3, 4])     # a copy, not an alias


def test_every_output_is_its_own_buffer():
    b = FnBuilder()
    x = b.arg((130, 3))
    y = b.op("negate", [x], (130, 3), "float32")
    r = run(b.ret(x, y, y), make((130, 3), "float32"))
    names = [o.name for o in r.program.outputs]
    assert names == ["out0", "out1", "out2"]
    np.testing.assert_array_equal(r.outputs[0], make((130, 3), "float32"))
    np.testing.assert_array_equal(r.outputs[1], -make((130, 3), "float32"))
    np.testing.assert_array_equal(r.outputs[2], r.outputs[1])
    assert [k.name.split(".")[0] for k in r.program.kernels] == ["negate", "copy", "copy"]


def test_identity_init_constant_is_never_written():
    """A constant only used as a reduce's identity init needs no kernel."""
    from .irbuild import combiner
    b = FnBuilder()
    x = b.arg((130, 3))
    init = b.const(0.0)
    r = b.op("reduce", [x, init], (130,), "float32", regions=[combiner("add", "float32")],
             dimensions=(1,))
    res = run(b.ret(r), np.ones((130, 3), np.float32))
    assert [k.name.split(".")[0] for k in res.program.kernels] == ["reduce"]
    np.testing.assert_array_equal(res.outputs[0], np.full(130, 3.0, np.float32))


# --- slice / concatenate / pad ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
@pytest.mark.parametrize("shape,start,limit,strides", [
    ((130, 3), (2, 0), (130, 3), (1, 1)), ((3, 5, 7), (1, 0, 2), (3, 5, 7), (1, 2, 3)),
    ((256, 512), (0, 100), (256, 356), (1, 1)), ((7,), (3,), (3,), (1,))])
def test_slice(shape, start, limit, strides, dtype):
    x = make(shape, dtype)
    sl = tuple(slice(a, b, c) for a, b, c in zip(start, limit, strides))
    out_shape = x[sl].shape
    m = one_op("slice", shape, out_shape, dtype, start_indices=start, limit_indices=limit,
               strides=strides)
    np.testing.assert_array_equal(run(m, x).outputs[0], x[sl])


@pytest.mark.parametrize("dtype", ["float32", "bool"])
@pytest.mark.parametrize("shapes,dim", [([(130, 3), (130, 5)], 1), ([(3, 5), (0, 5), (4, 5)], 0),
                                        ([(2, 3, 4), (2, 1, 4)], 1)])
def test_concatenate(shapes, dim, dtype):
    b = FnBuilder()
    args = [b.arg(s, dtype) for s in shapes]
    out = list(shapes[0])
    out[dim] = sum(s[dim] for s in shapes)
    m = b.ret(b.op("concatenate", args, out, dtype, dimension=dim))
    xs = [make(s, dtype, seed=i) for i, s in enumerate(shapes)]
    np.testing.assert_array_equal(run(m, *xs).outputs[0], np.concatenate(xs, dim))


@pytest.mark.parametrize("const_value", [True, False])
@pytest.mark.parametrize("lo,hi,interior", [((1, 2), (3, 0), (0, 0)), ((0, 1), (0, 1), (1, 2)),
                                            ((-1, 2), (1, -2), (0, 0))])
def test_pad(lo, hi, interior, const_value):
    shape = (5, 7)
    x = make(shape, "float32")
    out_shape = tuple(l + h + n + max(n - 1, 0) * i for l, h, n, i in zip(lo, hi, shape, interior))
    b = FnBuilder()
    xa = b.arg(shape)
    v = b.const(2.5) if const_value else b.arg(())
    m = b.ret(b.op("pad", [xa, v], out_shape, "float32", edge_padding_low=lo,
                   edge_padding_high=hi, interior_padding=interior))
    args = [x] if const_value else [x, np.array(2.5, np.float32)]
    big = np.full([n + max(n - 1, 0) * i for n, i in zip(shape, interior)], 2.5, np.float32)
    big[tuple(slice(None, None, i + 1) for i in interior)] = x
    padded = np.pad(big, [(max(l, 0), max(h, 0)) for l, h in zip(lo, hi)], constant_values=2.5)
    exp = padded[tuple(slice(max(-l, 0), padded.shape[d] - max(-h, 0))
                       for d, (l, h) in enumerate(zip(lo, hi)))]
    np.testing.assert_array_equal(run(m, *args).outputs[0], exp)
