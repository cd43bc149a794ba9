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


# --- loops: an inner loop's init hoisted out of the outer loop ------------------------

def test_inner_loop_init_hoisted_out_of_outer_loop_is_not_clobbered(jax, trn, cpu):
    """The inner fori_loop's carry starts from zeros that the outer loop hoists (one
    broadcast before it); the inner loop used that buffer as its carried buffer, so
    the second outer trip started from the first one's final value (was off by 10.5)."""
    lax, jnp = jax.lax, jax.numpy

    def f(u):
        def inner(j, st):
            v, t = st
            return v * 0.5 + t, t + 1

        def body(k, u):
            return lax.fori_loop(0, 3, inner, (u, jnp.zeros((4,), u.dtype)))[0] * 2
        return lax.fori_loop(0, 2, body, u)
    out, ref = _run(jax, trn, cpu, f, np.ones((6, 4), np.float32))
    _equal(out, ref)


def test_qdwh_and_polar_match_cpu(jax, trn, cpu):
    """qdwh's QR iterations are a fori_loop around Householder QR (itself loops): it
    converged in 5 iterations to a wrong U (|U H - A| 0.8) before the fix above."""
    a = np.random.default_rng(0).normal(size=(6, 4)).astype(np.float32)
    with jax.default_matmul_precision("highest"):
        (u, h, iters, ok), ref = _run(jax, trn, cpu, jax.lax.linalg.qdwh, a)
        assert int(iters) == int(ref[2]) and bool(ok)
        np.testing.assert_allclose(np.asarray(u), np.asarray(ref[0]), atol=2e-6)
        np.testing.assert_allclose(np.asarray(u) @ np.asarray(h), a, atol=2e-5)
        (u, h), _ = _run(jax, trn, cpu, jax.scipy.linalg.polar, a)
        np.testing.assert_allclose(np.asarray(u).T @ np.asarray(u), np.eye(4), atol=1e-6)


def test_linalg_rules_under_rank_promotion_raise(jax, trn, cpu):
    """The trn lowering rules of eigh / svd broadcast a (2, 1) column against a (2,)
    iota; under the user's `jax_numpy_rank_promotion="raise"` (as in JAX's tests) they
    raised a ValueError while lowering."""
    jnp = jax.numpy
    a = np.array([[3.0, 1.0], [1.0, 2.0]], np.float32)
    with jax.numpy_rank_promotion("raise"):
        for f in (jnp.linalg.eigvalsh, lambda x: jnp.linalg.svd(x, compute_uv=False)):
            out, ref = _run(jax, trn, cpu, f, a)
            np.testing.assert_allclose(np.asarray(out), np.asarray(ref), atol=1e-5)


# --- reduce bodies ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["uint32", "int32", "uint8", "int16"])
def test_bitwise_reductions_of_integers(jax, trn, cpu, dtype):
    """reduce_and / reduce_or / reduce_xor of integers (was 'reduce combiner (and) is
    not supported'), over leading, inner, mixed and all axes; uint32 with the top bit
    set (an FP32 datapath would round it)."""
    lax = jax.lax
    x = np.random.default_rng(0).integers(0, 2**15, (3, 4, 130)).astype(dtype)
    x[0, 0, 0] = np.iinfo(dtype).max
    fns = [lambda a, op=op, d=d: op(a, d) for op in (lax.reduce_and, lax.reduce_or,
                                                     lax.reduce_xor)
           for d in [(0,), (1, 2), (0, 2), (0, 1, 2)]]
    out, ref = _run(jax, trn, cpu, lambda a: [f(a) for f in fns], x)
    for o, r in zip(out, ref):
        _equal(o, r)


# --- sort of float8, argmax over bool ----------------------------------------------------

@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_sort_of_float8(jax, trn, cpu, dtype):
    """sort / argsort / sort with a payload of float8 keys (was 'sort of float8_e4m3fn
    is not supported'); -0 and NaN in place (a NaN's payload may differ: XLA's CPU
    backend canonicalises it)."""
    import ml_dtypes
    jnp = jax.numpy
    x = np.random.default_rng(0).uniform(-8, 8, (5, 37)).astype(getattr(ml_dtypes, dtype))
    x[0, 3], x[1, 2] = np.nan, -0.0
    iota = lambda a: jnp.broadcast_to(jnp.arange(37, dtype=jnp.int32), a.shape)  # noqa: E731
    fns = [jnp.sort, jnp.argsort, lambda a: jax.lax.sort((a, iota(a)), num_keys=1),
           lambda a: jax.lax.sort((iota(a)[:, ::-1], a), num_keys=1)]
    out, ref = _run(jax, trn, cpu, lambda a: [f(a) for f in fns], x)
    for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        o, r = np.asarray(o), np.asarray(r)
        assert o.dtype == r.dtype
        np.testing.assert_array_equal(o.astype(np.float32), r.astype(np.float32))
        if o.dtype.itemsize == 1:
            assert (np.signbit(o.astype(np.float32)) == np.signbit(r.astype(np.float32))).all()


@pytest.mark.parametrize("shape,axis", [((4, 37), 1), ((4, 37), 0), ((300, 5), 0),
                                        ((3, 2000), 1), ((148,), None)])
def test_argmax_argmin_over_bool(jax, trn, cpu, shape, axis):
    """argmax / argmin of bool (was 'argmax/argmin over bool values ... is not
    supported'), with an all-False and an all-True row."""
    jnp = jax.numpy
    x = np.random.default_rng(1).integers(0, 2, shape).astype(bool)
    x[0] = False
    x[-1] = True
    out, ref = _run(jax, trn, cpu, lambda a: [jnp.argmax(a, axis), jnp.argmin(a, axis)], x)
    for o, r in zip(out, ref):
        _equal(o, r)


# --- int4 / uint4 -------------------------------------------------------------------------

INT4_BINARY = ["add", "sub", "mul", "div", "rem", "max", "min", "shift_left",
               "shift_right_arithmetic", "shift_right_logical", "bitwise_and",
               "bitwise_or", "bitwise_xor", "eq", "ne", "gt", "ge", "lt", "le"]


def _as_int(a):
    a = np.asarray(a)
    return a.astype(np.int64) if a.dtype.itemsize == 1 else a


@pytest.mark.parametrize("dtype", ["int4", "uint4"])
def test_int4_transfers_and_arithmetic(jax, trn, cpu, dtype):
    """int4 / uint4 buffers and every elementwise op on them wrap to 4 bits like XLA
    (was 'element type int4 is not supported'); shifts count in 4 bits; float -> int4
    saturates, int32 -> int4 wraps; a sum in int4 wraps."""
    import ml_dtypes
    jnp, lax = jax.numpy, jax.lax
    dt = getattr(ml_dtypes, dtype)
    lo, hi = (-8, 8) if dtype == "int4" else (0, 16)
    rng = np.random.default_rng(0)
    a, b = (rng.integers(lo, hi, (3, 130)).astype(dt) for _ in range(2))
    b = np.where(_as_int(b) == 0, 1, _as_int(b)).astype(dt)
    assert np.array_equal(_as_int(jax.device_put(a, trn)), _as_int(a))
    fns = [getattr(lax, n) for n in INT4_BINARY]
    unary = [lax.bitwise_not, lax.neg, lax.sign, lambda x: x.astype(jnp.float32),
             lambda x: (x.astype(jnp.float32) * 3.3).astype(dt),
             lambda x: (x.astype(jnp.int32) * 5).astype(dt),
             lambda x: jnp.sum(x, axis=1, dtype=dt), lambda x: lax.iota(dt, 20) + x[0, :20]]
    out, ref = _run(jax, trn, cpu, lambda x, y: [f(x, y) for f in fns] + [f(x) for f in unary],
                    a, b)
    for o, r in zip(out, ref):
        assert o.dtype == r.dtype
        np.testing.assert_array_equal(_as_int(o), _as_int(r))


@pytest.mark.parametrize("pair", [("int4", "int8"), ("uint4", "float16"), ("int4", "float32"),
                                  ("uint4", "uint32"), ("int4", "uint4"), ("uint4", "int4"),
                                  ("int8", "int4"), ("float32", "uint4"), ("bfloat16", "int4")])
def test_int4_bitcasts(jax, trn, cpu, pair):
    """bitcast_convert packs / unpacks nibbles (value k in nibble k, little-endian):
    int4 holds one value per byte on the device, so a byte bitcast was wrong (it was a
    compile error: 'changes the byte count')."""
    import ml_dtypes
    src, dst = (np.dtype(getattr(ml_dtypes, n, n)) for n in pair)
    rng = np.random.default_rng(1)
    sbits = 4 if src.name.endswith("int4") else 8 * src.itemsize
    dbits = 4 if dst.name.endswith("int4") else 8 * dst.itemsize
    shape = (130, 3) + ((dbits // sbits,) if dbits > sbits else ())
    if sbits == 4:
        x = (rng.integers(0, 16, shape) - (8 if src.name == "int4" else 0)).astype(src)
    else:
        x = rng.integers(0, 256, shape + (src.itemsize,)).astype(np.uint8).view(src)[..., 0]
        x = np.where(np.isnan(x.astype(np.float32)), 0, x).astype(src) if "float" in src.name else x
    out, ref = _run(jax, trn, cpu, lambda v: jax.lax.bitcast_convert_type(v, dst), x)
    o, r = np.asarray(out), np.asarray(ref)
    assert o.shape == r.shape and o.dtype == r.dtype
    if dbits == 4:
        np.testing.assert_array_equal(_as_int(o), _as_int(r))
    else:
        np.testing.assert_array_equal(o.view(f"u{o.dtype.itemsize}"), r.view(f"u{r.dtype.itemsize}"))


# --- reduce_window with any body, over several operands -------------------------------------

@pytest.mark.parametrize("padding,base", [("VALID", (1, 1)), ("SAME", (1, 1)),
                                          ([(0, 3), (1, 2)], (2, 3))])
def test_reduce_window_general_bodies_and_their_jvp(jax, trn, cpu, padding, base):
    """A subtract / custom add / custom multiply body (was 'reduce_window body
    (subtract) is not supported') and the JVP of a custom min, a 2-operand window
    (was 'reduce_window of 2 operands at once is not supported'); padding and base
    dilation skipped as XLA skips them."""
    lax, jnp = jax.lax, jax.numpy
    x = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    cases = [(lambda a, b: a - b, 0.0), (lambda a, b: a + b, 1.0),
             (lambda a, b: a * b, 0.5), (lambda a, b: jnp.minimum(a, b), np.inf)]

    def fn(a):
        outs = []
        for body, init in cases:
            f = lambda v, body=body, init=init: lax.reduce_window(  # noqa: E731
                v, np.float32(init), body, (2, 1), (1, 2), padding, base, (1, 2))
            outs += [f(a), *jax.jvp(f, (a,), (a * 0.5 + 1,))]
        return outs
    out, ref = _run(jax, trn, cpu, fn, x)
    for o, r in zip(out, ref):
        np.testing.assert_allclose(np.asarray(o), np.asarray(r), rtol=1e-6, atol=1e-6)


# --- scatter with any update computation ---------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_scatter_apply(jax, trn, cpu, dtype):
    """`x.at[i].apply(f)` and `lax.scatter_apply` (was 'the update computation is not
    one of set / add / ...'), with repeated indices (f applied again) and windows."""
    import ml_dtypes
    jnp, lax = jax.numpy, jax.lax
    x = np.random.default_rng(0).normal(size=(10, 5)).astype(getattr(ml_dtypes, dtype, dtype))
    dn = lax.ScatterDimensionNumbers((1,), (0,), (0,))
    fns = [lambda a: a.at[jnp.array([0, 2, 2, 7])].apply(jnp.sin),
           lambda a: a.at[:, jnp.array([1, 1])].apply(lambda v: v * v + 1),
           lambda a: lax.scatter_apply(a, jnp.array([[3], [3]]), jnp.exp, dn,
                                       update_shape=(2, 5))]
    out, ref = _run(jax, trn, cpu, lambda a: [f(a) for f in fns], x)
    for o, r in zip(out, ref):
        np.testing.assert_allclose(np.asarray(o, np.float32), np.asarray(r, np.float32),
                                   rtol=1e-5, atol=1e-5)


def test_cholesky_of_a_singular_matrix_is_all_nan_like_cpu(jax, trn, cpu):
    """A zero pivot (an exactly singular covariance) gave a finite factor; LAPACK
    stops there and JAX returns NaNs (multivariate_normal's singular-covariance case)."""
    a = np.stack([np.array([[1.0, 1.0], [1.0, 1.0]]), np.array([[4.0, 2.0], [2.0, 3.0]])])
    out, ref = _run(jax, trn, cpu, jax.numpy.linalg.cholesky, a.astype(np.float32))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))
    assert np.isnan(np.asarray(out)[0]).sum() == 3
