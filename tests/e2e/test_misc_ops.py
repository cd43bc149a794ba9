"""reverse, reduce_precision, rng_bit_generator, partition_id / replica_id and
custom_call errors (jax_trn/lower/slicing.py, misc.py), against JAX's CPU backend."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.conftest import run_python

REVERSE_CASES = [((7,), (0,)), ((301,), (0,)), ((5, 7), (0,)), ((5, 7), (1,)),
                 ((5, 7), (0, 1)), ((130, 3), (0,)), ((3, 4, 5), (1,)), ((3, 4, 5), (0, 2)),
                 ((2, 600), (1,)), ((4, 1, 3), (1, 2)), ((), ()), ((0, 3), (1,))]


def _bits_equal(out, ref):
    out, ref = np.asarray(out), np.asarray(ref)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_array_equal(out.reshape(-1).view(np.uint8), ref.reshape(-1).view(np.uint8))


def _run(jax, trn, cpu, fn, *args):
    f = jax.jit(fn)
    out = f(*(jax.device_put(a, trn) for a in args))
    assert jax.tree.leaves(out)[0].devices() == {trn}
    return out, f(*(jax.device_put(a, cpu) for a in args))


@pytest.mark.parametrize("shape,dims", REVERSE_CASES, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "bool"])
def test_reverse_bit_exact(jax, trn, cpu, shape, dims, dtype):
    rng = np.random.default_rng(0)
    x = rng.uniform(-100, 100, shape).astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))
    _bits_equal(*_run(jax, trn, cpu, lambda a: jax.lax.rev(a, dims), x))


def test_reverse_keeps_negative_zero_and_nan(jax, trn, cpu):
    x = np.array([[-0.0, np.nan, np.inf, -np.inf, 1.5]] * 3, np.float32)
    _bits_equal(*_run(jax, trn, cpu, lambda a: a[::-1, ::-1], x))


def _opcodes(jax, fn, *args):
    import jax_trn
    with jax_trn.profile() as prof:
        jax.block_until_ready(jax.jit(fn)(*args))
    return [e.opcode for e in prof.executions[-1].events]


def test_flip_of_leading_axis_is_dma_only(jax, trn):
    """Reversing a leading axis needs no engine: the DMA pattern steps backwards."""
    x = jax.device_put(np.zeros((64, 256), np.float32), trn)
    assert set(_opcodes(jax, lambda a: a[::-1], x)) == {"DmaCopy"}


def test_flip_of_innermost_axis_copies_columns_on_chip(jax, trn):
    x = jax.device_put(np.zeros((130, 20), np.float32), trn)
    ops = _opcodes(jax, lambda a: a[:, ::-1], x)
    assert ops.count("TensorCopy") == 2 * 20 and ops.count("DmaCopy") == 4
