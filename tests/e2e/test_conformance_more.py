"""What JAX's tests beyond issue 13's five files found (lax_numpy_*, lax_vmap, random,
debugging_primitives, linalg, api, pjit, shard_map): each reproducer against JAX's CPU
backend, in our own words."""
from __future__ import annotations

import numpy as np


def _both(jax, trn, cpu, fn, *args):
    f = jax.jit(fn)
    return (np.asarray(f(*(jax.device_put(a, trn) for a in args))),
            np.asarray(f(*(jax.device_put(a, cpu) for a in args))))


# --- empty arrays ---------------------------------------------------------------------

def test_spacing_of_an_empty_array(jax, trn, cpu):
    """`jnp.spacing` of a (3, 0) array: the fused region's splat constant folds to an
    empty one, which the translator reshaped (it was 'cannot reshape array of size 0
    into shape (0,newaxis)' at compile time)."""
    out, ref = _both(jax, trn, cpu, jax.numpy.spacing, np.zeros((3, 0), np.float16))
    assert out.shape == ref.shape == (3, 0) and out.dtype == ref.dtype


# --- complex scatter ------------------------------------------------------------------

def _complex(shape, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=shape) + 1j * rng.normal(size=shape)).astype(np.complex64)


def test_complex_scatter_multiply_with_unique_indices(jax, trn, cpu):
    """`x.at[i].multiply(y)` on complex64 with unique indices: real scatters, one
    complex multiply and a select (was refused: 'complex scatter with the combiner
    ['multiply', 'return'] is not supported')."""
    idx = np.array([0, 2])
    fn = lambda x, y: x.at[idx].multiply(y, unique_indices=True)
    x = _complex((3, 4, 5))
    out, ref = _both(jax, trn, cpu, fn, x, _complex((2, 4, 5), 1))
    np.testing.assert_allclose(out, ref, rtol=1e-6)      # CPU fuses a*c - b*d (FMA)
    np.testing.assert_array_equal(out[1], x[1])           # untouched rows: exactly x


def test_complex_scatter_power_by_bool(jax, trn, cpu):
    """`x.at[i].power(y)`: JAX scatters a multiply into ones, then takes the power."""
    idx = np.array([0, 1, 2])
    fn = lambda x, y: x.at[idx].power(y, indices_are_sorted=True, unique_indices=True)
    y = np.random.default_rng(2).normal(size=(3, 4, 5)) > 0
    out, ref = _both(jax, trn, cpu, fn, _complex((3, 4, 5)), y)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)


# --- jax.debug.inspect_array_sharding under jit -----------------------------------------

def test_inspect_array_sharding_is_called_with_the_sharding(jax, trn_devices):
    """The `InspectSharding` custom call's backend_config is two raw pointers; its
    bytes broke the importer ('nanobind ... conversion error'). localize now calls the
    callback with the operand's sharding."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    got = []

    def f(x):
        jax.debug.inspect_array_sharding(x, callback=got.append)
        return x * x

    mesh = Mesh(np.array(trn_devices[:8]).reshape(2, 4), ("a", "b"))
    for spec in (P("b", None), P(None, ("a", "b")), P("a")):
        x = jax.device_put(np.arange(64.0).reshape(8, 8), NamedSharding(mesh, spec))
        jax.jit(f)(x)
        assert got[-1].is_equivalent_to(NamedSharding(mesh, spec), 2)


def test_visualize_sharding_inside_shard_map(jax, trn_devices, capsys):
    from jax.sharding import Mesh, PartitionSpec as P
    mesh = Mesh(np.array(trn_devices[:2]), ("x",))

    def f():
        a = jax.numpy.zeros(1000)
        jax.debug.visualize_array_sharding(a)
        return a

    out = jax.shard_map(f, mesh=mesh, in_specs=P(None), out_specs=P("x"))()
    assert out.shape == (2000,) and "0" in capsys.readouterr().out


# --- linalg: complex Householder QR, empty matrices ---------------------------------------

def test_complex_householder_product_conjugates_the_reflectors(jax, trn, cpu):
    """orgqr's complex form (ungqr) applies H = I - tau v v^H: the reflector was not
    conjugated, a silent wrong result (off by O(1) from CPU)."""
    a, taus = _complex((10, 5)), _complex((3,), 1)
    out, ref = _both(jax, trn, cpu, jax.lax.linalg.householder_product, a, taus)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_complex_qr(jax, trn, cpu):
    """zgeqrf's reflector (real beta, complex tau), R = ... H_1^H A (it was
    'copysign does not support complex-valued inputs' while tracing the rule)."""
    a = _complex((6, 4))
    (q, r), (q_ref, r_ref) = (jax.jit(jax.numpy.linalg.qr)(jax.device_put(a, d))
                              for d in (trn, cpu))
    np.testing.assert_allclose(np.asarray(q), np.asarray(q_ref), atol=2e-6)
    np.testing.assert_allclose(np.asarray(r), np.asarray(r_ref), atol=2e-6)


def test_empty_matrices(jax, trn, cpu):
    """qr / inv / cholesky of a (0, 0) matrix: the rules' dynamic slices of an empty
    matrix failed while tracing ('slice_sizes (1, 0) for operand shape (0, 0)')."""
    jnp, e = jax.numpy, np.zeros((0, 0), np.float32)
    for fn in (lambda a: jnp.linalg.qr(a)[1], jnp.linalg.inv, jnp.linalg.cholesky):
        out, ref = _both(jax, trn, cpu, fn, e)
        assert out.shape == ref.shape == (0, 0)


def test_half_precision_qr_is_refused(jax, trn):
    """As on JAX's CPU and GPU backends: 'Unsupported dtype float16' (it ran)."""
    import pytest
    with pytest.raises(NotImplementedError, match="Unsupported dtype float16"):
        jax.numpy.linalg.qr(jax.device_put(np.ones((5, 6), np.float16), trn))


# --- fusion: a computed vector read as a column and as a row -------------------------------

def test_outer_product_of_a_computed_vector(jax, trn, cpu):
    """v (x) v with v computed from the input: row fusion computed v one value per
    partition and its row broadcast read those values as if laid along the row (a
    silent wrong result, off by O(1))."""
    jnp = jax.numpy
    idx = jnp.arange(4)

    def f(s):
        col = jnp.sum(jnp.where(idx == 0, s, 0), axis=-1)
        v = jnp.where(idx == 1, 1.0, col * col[1])
        return v[:, None] * v[None, :]

    a = np.random.default_rng(3).normal(size=(4, 4)).astype(np.float32)
    out, ref = _both(jax, trn, cpu, f, a)
    np.testing.assert_allclose(out, ref, rtol=1e-6)


def test_corrcoef_float16(jax, trn, cpu):
    """jnp.corrcoef divides by sqrt(d[:, None] * d[None, :]): the same fused outer
    product (JAX's testCorrCoef on float16 was off by 0.27)."""
    x = (np.random.default_rng(9).normal(size=(4, 10)) * 4).astype(np.float16)
    out, ref = _both(jax, trn, cpu, jax.numpy.corrcoef, x)
    np.testing.assert_allclose(out.astype(np.float32), ref.astype(np.float32), atol=2e-3)


def test_tridiagonal_matches_lapack(jax, trn):
    """lax.linalg.tridiagonal had no trn rule ('MLIR translation rule for primitive
    tridiagonal not found'); it is LAPACK's sytrd / hetrd, packing included."""
    import pytest
    lapack = pytest.importorskip("scipy.linalg.lapack")
    a = np.random.default_rng(4).normal(size=(6, 6)).astype(np.float32)
    z = _complex((5, 5), 5)
    for x, ref_fn in ((a, lapack.ssytrd), (z, lapack.chetrd)):
        for lower in (True, False):
            out = jax.jit(lambda m: jax.lax.linalg.tridiagonal(m, lower=lower))(
                jax.device_put(x, trn))
            for o, r in zip(out, ref_fn(x, lower=lower)[:4]):
                np.testing.assert_allclose(np.asarray(o), r, atol=1e-5)


def test_complex_eigh_through_the_real_embedding(jax, trn):
    """Hermitian eigh of complex64 (it was refused: 'complex operand ... is not
    supported'), also with a repeated eigenvalue: orthonormal vectors of each cluster."""
    jnp = jax.numpy
    q, _ = np.linalg.qr(_complex((4, 4), 6))
    a = _complex((5, 5), 7)
    for h in ((q @ np.diag([1.0, 1.0, 1.0, 2.0]) @ q.conj().T).astype(np.complex64),
              ((a + a.conj().T) / 2).astype(np.complex64)):
        w, v = map(np.asarray, jax.jit(jnp.linalg.eigh)(jax.device_put(h, trn)))
        n = h.shape[0]
        assert w.dtype == np.float32 and v.dtype == np.complex64
        np.testing.assert_allclose(w, np.linalg.eigvalsh(h), atol=5e-6)
        np.testing.assert_allclose(h @ v, v * w, atol=5e-6)
        np.testing.assert_allclose(v.conj().T @ v, np.eye(n), atol=5e-6)


def test_complex_singular_values(jax, trn):
    """svd(compute_uv=False) of complex64 (cond, norm(ord=2), matrix_rank use it): every
    other singular value of the real embedding."""
    x = _complex((7, 4), 8)
    s = jax.jit(lambda a: jax.numpy.linalg.svd(a, compute_uv=False))(jax.device_put(x, trn))
    np.testing.assert_allclose(np.asarray(s), np.linalg.svd(x, compute_uv=False), rtol=2e-6)


# --- total order ----------------------------------------------------------------------------

def test_searchsorted_with_nans(jax, trn, cpu):
    """`lax.lt_to` (compare TOTALORDER) was lowered as an IEEE compare: NaNs never
    compared less, so searchsorted's 'scan' and 'compare_all' methods put NaNs at the
    end or at 0 (a silent wrong result)."""
    import functools
    x = np.array([-np.inf, -1.0, 0.0, -0.0, 1.0, np.inf, np.nan, -np.nan], np.float32)
    for method in ("scan", "compare_all"):
        for side in ("left", "right"):
            fn = functools.partial(jax.numpy.searchsorted, side=side, method=method)
            out, ref = _both(jax, trn, cpu, fn, x, x)
            np.testing.assert_array_equal(out, ref)


def test_complex_svd_with_vectors(jax, trn):
    """Complex SVD (jnp.linalg.svd / pinv of complex64), also rank-deficient: u s v^H
    rebuilds a, u and v orthonormal (it was refused: 'complex operand ... is not
    supported')."""
    for a, full in ((_complex((7, 4), 10), True), (_complex((6, 2), 11) @ _complex((2, 4), 12),
                                                     False)):
        u, s, vh = map(np.asarray, jax.jit(lambda x: jax.numpy.linalg.svd(
                x, full_matrices=full))(jax.device_put(a, trn)))
        k = min(a.shape)
        np.testing.assert_allclose(s, np.linalg.svd(a, compute_uv=False), atol=3e-5)
        np.testing.assert_allclose((u[:, :k] * s) @ vh, a, atol=3e-5)
        np.testing.assert_allclose(u.conj().T @ u, np.eye(u.shape[1]), atol=3e-6)
        np.testing.assert_allclose(vh @ vh.conj().T, np.eye(vh.shape[0]), atol=3e-6)


# --- JAX's unreduced shardings (partial sums) ---------------------------------------------

def test_unreduced_reshard_roundtrip(jax, trn_devices):
    """reshard to P(..., unreduced=...) and back: sdy.replicated_to_unreduced /
    sharded_to_unreduced were refused by localize, an unreduced output was reported
    replicated ('Unexpected XLA sharding override') and an all_reduce of an unreduced
    value could not tell its combiner. The shards are the ones XLA's CPU backend makes:
    the value at coordinate 0 of the unreduced axes (or each block in place), zeros
    elsewhere."""
    from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P, reshard
    mesh = Mesh(np.array(trn_devices[:8]).reshape(2, 2, 2), ("x", "y", "z"),
                axis_types=(AxisType.Explicit,) * 3)
    x = np.arange(16).reshape(4, 4)
    with jax.set_mesh(mesh):
        for orig, un in ((P("x", None), P("x", None, unreduced={"y"})),
                         (P(("x", "z"), "y"), P("x", None, unreduced={"y", "z"}))):
            a = jax.device_put(x, orig)
            u = reshard(a, un)
            assert u.sharding == NamedSharding(mesh, un)
            back = reshard(u, orig)
            np.testing.assert_array_equal(np.asarray(back), x)
            assert back.sharding == a.sharding


def test_unreduced_dot_keeps_partial_sums(jax, trn_devices):
    """einsum(out_sharding=P(None, None, unreduced={'x'})): each device keeps its own
    partial product (what JAX's test_unreduced_einsum_basic reads shard by shard)."""
    from jax.sharding import AxisType, Mesh, PartitionSpec as P, reshard
    mesh = Mesh(np.array(trn_devices[:2]), ("x",), axis_types=(AxisType.Explicit,))
    a = np.arange(4.0, dtype=np.float32).reshape(2, 2)
    with jax.set_mesh(mesh):
        x, y = jax.device_put(a, P(None, "x")), jax.device_put(a, P("x", None))
        out = jax.jit(lambda x, y: jax.numpy.einsum(
                "ab,bc->ac", x, y, out_sharding=P(None, None, unreduced={"x"})))(x, y)
        shards = [np.asarray(s.data) for s in sorted(out.addressable_shards,
                                                     key=lambda s: s.device.id)]
        np.testing.assert_array_equal(shards[0], np.outer(a[:, 0], a[0]))
        np.testing.assert_array_equal(shards[1], np.outer(a[:, 1], a[1]))
        np.testing.assert_array_equal(np.asarray(reshard(out, P(None, None))), a @ a)


def test_unreduced_gradient_of_a_reduced_input_is_counted_once(jax, trn_devices):
    """A constant made unreduced (the cotangent of a `reduced` input) is a partial sum:
    computed on every device it was added up once per device (a gradient 2x, 4x too
    large). It is kept on the devices at coordinate 0 of the axes, as XLA does."""
    from jax.sharding import AxisType, Mesh, PartitionSpec as P, reshard
    mesh = Mesh(np.array(trn_devices[:2]), ("x",), axis_types=(AxisType.Explicit,))
    a = np.arange(16.0, dtype=np.float32).reshape(8, 2)
    with jax.set_mesh(mesh):
        x = jax.device_put(a, P(reduced={"x"}))
        f = jax.jit(lambda p, u, v: jax.lax.select(p, u, v))
        g2, g3 = jax.jit(jax.grad(lambda p, u, v: f(p, u, v).sum(), argnums=(1, 2)))(
                x == x, x, x)
        np.testing.assert_array_equal(np.asarray(reshard(g2, P())), np.ones_like(a))
        np.testing.assert_array_equal(np.asarray(reshard(g3, P())), np.zeros_like(a))
        r = jax.jit(lambda v: jax.lax.reduce_sum(v, axes=(0,), out_sharding=P(
                None, unreduced={"x"})))(jax.device_put(a, P("x", None)))
        np.testing.assert_array_equal(np.asarray(reshard(r, P())), a.sum(0))


def test_complex_linalg_rules_under_strict_dtype_promotion(jax, trn):
    """JAX's tests set jax_numpy_dtype_promotion='strict': the rules mix a real beta
    with complex values ('no available implicit dtype promotion path' while tracing);
    they are traced with standard promotion, as with rank promotion."""
    a = _complex((6, 4), 13)
    with jax.numpy_dtype_promotion("strict"):
        q, r = jax.numpy.linalg.qr(jax.device_put(a, trn))
        w = jax.numpy.linalg.eigvalsh(jax.device_put(a[:4] + a[:4].conj().T, trn))
    np.testing.assert_allclose(np.asarray(q) @ np.asarray(r), a, atol=3e-6)
    assert np.asarray(w).dtype == np.float32
