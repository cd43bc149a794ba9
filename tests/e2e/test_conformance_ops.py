"""Op forms JAX's own tests use that trn refused (issue 13): the dce_sink custom call,
PJRT_Buffer_UnsafePointer, reduce / reduce_window bodies beyond add / max / min /
multiply, variadic reduce_window, scatter with a custom update computation, sort of
float8, argmax over bool; each against JAX's CPU backend."""
from __future__ import annotations

import numpy as np
import pytest


def _run(jax, trn, cpu, fn, *args):
    f = jax.jit(fn)
    out = f(*(jax.device_put(a, trn) for a in args))
    return out, f(*(jax.device_put(a, cpu) for a in args))


def _equal(out, ref):
    out, ref = np.asarray(out), np.asarray(ref)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_array_equal(out, ref)


# --- the dce_sink custom call, UnsafePointer ---------------------------------------

def test_dce_sink_runs_and_is_listed(jax, trn):
    """`lax.dce_sink` keeps its operand's computation; it lowers to nothing (it was a
    compile error: 'custom_call target dce_sink is not supported')."""
    def f(x):
        jax.lax.dce_sink(x + 1, prevent_mlir_dce=True)
        return x
    x = jax.device_put(np.float32(1.0), trn)
    text = jax.jit(f).lower(x).compile().as_text()
    assert "dce_sink" in text and "add" in text
    assert float(jax.jit(f)(x)) == 1.0


def test_unsafe_buffer_pointer_is_stable_and_distinct(jax, trn):
    """A no-op convert is the same buffer (same pointer), a real one a new buffer
    (it was UNIMPLEMENTED)."""
    x = jax.device_put(np.zeros(5, np.float32), trn)
    same = jax.lax.convert_element_type(x, np.float32)
    other = jax.lax.convert_element_type(x, np.int32)
    assert x.unsafe_buffer_pointer() == same.unsafe_buffer_pointer() != 0
    assert x.unsafe_buffer_pointer() != other.unsafe_buffer_pointer()
