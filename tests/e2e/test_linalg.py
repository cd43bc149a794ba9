"""The ops jax_trn/jax_rules.py lowers for trn: linear solves, Cholesky and Householder QR
(fori_loops of masked matrix-vector products) and cumlogsumexp (an associative scan),
against CPU."""
from __future__ import annotations

import numpy as np
import pytest

RNG = np.random.default_rng(0)
A = (RNG.normal(size=(6, 6)) + 6 * np.eye(6)).astype(np.float32)
B = RNG.normal(size=(6, 3)).astype(np.float32)
SPD = (A @ A.T + np.eye(6)).astype(np.float32)


def _cases(jax):
    jnp, sl = jax.numpy, jax.scipy.linalg
    tri = jax.lax.linalg.triangular_solve
    return {
        "solve": lambda a, b: jnp.linalg.solve(a, b),
        "inv": lambda a, b: jnp.linalg.inv(a),
        "lower": lambda a, b: sl.solve_triangular(jnp.tril(a), b, lower=True),
        "upper_transposed": lambda a, b: sl.solve_triangular(jnp.triu(a), b, lower=False, trans=1),
        "unit_diagonal": lambda a, b: sl.solve_triangular(jnp.tril(a), b, lower=True,
                                                          unit_diagonal=True),
        "right_side": lambda a, b: tri(jnp.tril(a), b.T, left_side=False, lower=True),
        "batched": lambda a, b: jnp.linalg.solve(jnp.stack([a, a.T]), jnp.stack([b, 2 * b])),
        "cholesky": lambda a, b: jnp.linalg.cholesky(a @ a.T + jnp.eye(6)),
        "cho_solve": lambda a, b: sl.cho_solve(sl.cho_factor(a @ a.T + jnp.eye(6)), b),
    }


@pytest.mark.parametrize("name", ["solve", "inv", "lower", "upper_transposed", "unit_diagonal",
                                  "right_side", "batched", "cholesky", "cho_solve"])
def test_matches_cpu(jax, trn, name):
    f = jax.jit(_cases(jax)[name])
    with jax.default_matmul_precision("highest"):
        got = np.asarray(f(jax.device_put(A, trn), jax.device_put(B, trn)))
        want = np.asarray(f(A, B))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_cholesky_of_a_matrix_that_is_not_positive_definite_has_nans(jax, trn):
    got = np.asarray(jax.jit(jax.numpy.linalg.cholesky)(jax.device_put(-SPD, trn)))
    assert np.isnan(got).any()


@pytest.mark.parametrize("axis,reverse", [(1, False), (0, True)])
def test_cumlogsumexp(jax, trn, axis, reverse):
    x = RNG.normal(size=(6, 130)).astype(np.float32)
    f = jax.jit(lambda x: jax.lax.cumlogsumexp(x, axis=axis, reverse=reverse))
    np.testing.assert_allclose(np.asarray(f(jax.device_put(x, trn))), np.asarray(f(x)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(5, 5), (6, 4), (4, 6), (2, 5, 3)])
@pytest.mark.parametrize("mode", ["reduced", "complete", "r"])
def test_qr_matches_lapack(jax, trn, shape, mode):
    """Same Q and R as LAPACK on CPU, signs included (dlarfg's reflector convention)."""
    a = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    f = jax.jit(lambda a: jax.numpy.linalg.qr(a, mode=mode))
    for got, want in zip(jax.tree.leaves(f(jax.device_put(a, trn))), jax.tree.leaves(f(a))):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=2e-6)


def test_orthogonal_initializer(jax, trn):
    init = jax.nn.initializers.orthogonal()
    w = np.asarray(jax.jit(lambda k: init(k, (8, 8)))(jax.device_put(jax.random.PRNGKey(0), trn)))
    np.testing.assert_allclose(w @ w.T, np.eye(8), atol=1e-5)


# --- eigh and svd: parallel Jacobi (jax_trn/linalg_jacobi.py) ---------------------------------
# Eigenvectors and singular vectors are not unique (signs, rotations within repeated values), so
# vectors are checked by their defining equations; values against CPU. Jacobi's error grows
# with the number of rotations (~n per sweep): bounds scale with n (f32 eps = 1.2e-7).


def _sym(n, batch=(), seed=0):
    x = np.random.default_rng(seed).normal(size=(*batch, n, n)).astype(np.float32)
    return (x + np.swapaxes(x, -1, -2)) / 2


def _run(jax, trn, f, *args):
    f = jax.jit(f)
    with jax.default_matmul_precision("highest"):
        got = f(*[jax.device_put(a, trn) for a in args])
        want = f(*args)
    to64 = lambda t: jax.tree.map(lambda x: np.asarray(x, np.float64), t)   # noqa: E731
    return to64(got), to64(want)


def _check_eigh(a, v, w, w_cpu):
    n = a.shape[-1]
    scale = np.abs(w_cpu).max()
    tol = 5e-7 * n * scale
    np.testing.assert_allclose(w, w_cpu, rtol=0, atol=tol)
    assert (np.diff(w, axis=-1) >= 0).all()                                # ascending
    np.testing.assert_allclose(a @ v, v * w[..., None, :], rtol=0, atol=tol)
    np.testing.assert_allclose(np.swapaxes(v, -1, -2) @ v, np.broadcast_to(np.eye(n), v.shape),
                               rtol=0, atol=1e-6 * n)


@pytest.mark.parametrize("n,batch", [(1, ()), (2, ()), (5, ()), (16, ()), (33, ()), (64, ()),
                                     (6, (3,))])
def test_eigh_matches_cpu(jax, trn, n, batch):
    a = _sym(n, batch)
    (w, v), (w_cpu, _) = _run(jax, trn, jax.numpy.linalg.eigh, a)
    _check_eigh(a.astype(np.float64), v, w, w_cpu)


@pytest.mark.parametrize("lower", [True, False])
def test_eigh_reads_only_the_named_triangle(jax, trn, lower):
    a = np.random.default_rng(2).normal(size=(7, 7)).astype(np.float32)   # not symmetric
    f = lambda a: jax.lax.linalg.eigh(a, lower=lower, symmetrize_input=False)   # noqa: E731
    (v, w), (_, w_cpu) = _run(jax, trn, f, a)
    t = np.tril(a) if lower else np.triu(a)
    _check_eigh((t + t.T - np.diag(np.diag(t))).astype(np.float64), v, w, w_cpu)


def test_eigh_repeated_eigenvalues_and_subset(jax, trn):
    q, _ = np.linalg.qr(np.random.default_rng(3).normal(size=(10, 10)))
    a = (q @ np.diag([-2, 1, 1, 1, 3, 3, 0, 0, 5, 7.5]) @ q.T).astype(np.float32)
    (w, v), (w_cpu, _) = _run(jax, trn, jax.numpy.linalg.eigh, a)
    _check_eigh(a.astype(np.float64), v, w, w_cpu)
    f = lambda a: jax.lax.linalg.eigh(a, subset_by_index=(6, 9))   # noqa: E731  (TPU-only on JAX)
    v3, w3 = (np.asarray(x, np.float64) for x in jax.jit(f)(jax.device_put(a, trn)))
    np.testing.assert_allclose(w3, w_cpu[6:9], atol=1e-5)
    np.testing.assert_allclose(a @ v3, v3 * w3, atol=1e-5)


@pytest.mark.parametrize("scale", [1e-25, 1e25])
def test_eigh_and_svd_of_tiny_and_huge_matrices(jax, trn, scale):
    """Scaled by a power of two near max |a| first: d^2 + 4 off^2 neither over- nor
    underflows (it would at 1e25 / 1e-25, leaving NaNs or unrotated pairs)."""
    a = _sym(5, seed=12) * np.float32(scale)
    (w, v), (w_cpu, _) = _run(jax, trn, jax.numpy.linalg.eigh, a)
    _check_eigh(a.astype(np.float64), v, w, w_cpu)
    (u, s, vt), (_, s_cpu, _) = _run(jax, trn, jax.numpy.linalg.svd, a[:, :4])
    _check_svd(a[:, :4].astype(np.float64), s, u, vt, s_cpu, True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_eigh_half_precision(jax, trn, dtype):
    """CPU (LAPACK) has no 16-bit eigh; trn computes in float32 and rounds the results."""
    a = _sym(8).astype(dtype)
    v, w = jax.jit(jax.numpy.linalg.eigh)(jax.device_put(a, trn))[::-1]
    assert v.dtype == w.dtype == a.dtype
    w_cpu = np.asarray(jax.jit(jax.numpy.linalg.eigvalsh)(a.astype(np.float32)), np.float64)
    np.testing.assert_allclose(np.asarray(w, np.float64), w_cpu, rtol=0, atol=2e-2 * 4)


def test_eigvalsh_and_grad_through_eigh(jax, trn):
    a = _sym(12, seed=4)
    got, want = _run(jax, trn, jax.numpy.linalg.eigvalsh, a)
    np.testing.assert_allclose(got, want, atol=1e-5 * 12)
    top = jax.grad(lambda a: jax.numpy.linalg.eigh(a)[0][-1])               # d lambda_max / dA
    got, want = _run(jax, trn, top, a)
    np.testing.assert_allclose(got, want, atol=2e-5)


def _check_svd(a, s, u, vt, s_cpu, full):
    m, n = a.shape[-2:]
    k = min(m, n)
    tol = 5e-7 * max(m, n) * s_cpu.max()
    np.testing.assert_allclose(s, s_cpu, rtol=0, atol=tol)
    assert (np.diff(s, axis=-1) <= 0).all()                                # descending
    assert u.shape[-2:] == (m, m if full else k) and vt.shape[-2:] == (n if full else k, n)
    np.testing.assert_allclose((u[..., :, :k] * s[..., None, :]) @ vt[..., :k, :], a, atol=tol)
    for q in (np.swapaxes(u, -1, -2) @ u, vt @ np.swapaxes(vt, -1, -2)):
        np.testing.assert_allclose(q, np.broadcast_to(np.eye(q.shape[-1]), q.shape),
                                   atol=1e-6 * max(m, n))


@pytest.mark.parametrize("shape", [(1, 1), (5, 5), (7, 4), (4, 7), (2, 6, 5), (40, 33)])
@pytest.mark.parametrize("full", [True, False])
def test_svd_matches_cpu(jax, trn, shape, full):
    a = np.random.default_rng(5).normal(size=shape).astype(np.float32)
    f = lambda a: jax.numpy.linalg.svd(a, full_matrices=full)             # noqa: E731
    (u, s, vt), (_, s_cpu, _) = _run(jax, trn, f, a)
    _check_svd(a.astype(np.float64), s, u, vt, s_cpu, full)


@pytest.mark.parametrize("shape", [(7, 4), (2, 4, 6)])
def test_svd_values_only(jax, trn, shape):
    a = np.random.default_rng(5).normal(size=shape).astype(np.float32)
    got, want = _run(jax, trn, lambda a: jax.numpy.linalg.svd(a, compute_uv=False), a)
    np.testing.assert_allclose(got, want, rtol=0, atol=5e-7 * max(shape) * want.max())


@pytest.mark.parametrize("full", [True, False])
def test_svd_rank_deficient(jax, trn, full):
    """A zero column and two equal ones: zero singular values, whose u columns are completed
    to an orthonormal basis (u is never NaN, as pinv needs)."""
    a = np.random.default_rng(6).normal(size=(9, 6)).astype(np.float32)
    a[:, 2] = 0
    a[:, 4] = a[:, 1]
    f = lambda a: jax.numpy.linalg.svd(a, full_matrices=full)             # noqa: E731
    (u, s, vt), (_, s_cpu, _) = _run(jax, trn, f, a)
    _check_svd(a.astype(np.float64), s, u, vt, s_cpu, full)
    assert (s[-2:] < 1e-5).all()


def test_svd_numerically_rank_deficient(jax, trn):
    """Hilbert 12 x 12: in float32 about half the singular values are rounding noise
    (< 1e-7 s_max); their u columns must still be orthonormal (tiny pairs are rotated
    too, and the convergence test is on cosines)."""
    i = np.arange(12)
    a = (1 / (i[:, None] + i[None, :] + 1)).astype(np.float32)
    (u, s, vt), (_, s_cpu, _) = _run(jax, trn, jax.numpy.linalg.svd, a)
    _check_svd(a.astype(np.float64), s, u, vt, s_cpu, True)


def test_svd_ill_conditioned(jax, trn):
    """Condition number 1e6: the small singular values to ~1e-8 absolute, as LAPACK's gesdd
    (via sqrt(eigvalsh(A^T A)) in float32 their errors are ~1e-4, 100x the smallest value)."""
    rng = np.random.default_rng(7)
    q1, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    q2, _ = np.linalg.qr(rng.normal(size=(12, 12)))
    a = (q1 @ np.diag(np.logspace(0, -6, 12)) @ q2.T).astype(np.float32)
    exact = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    (u, s, vt), (_, s_cpu, _) = _run(jax, trn, jax.numpy.linalg.svd, a)
    np.testing.assert_allclose(s, s_cpu, rtol=0, atol=6e-7)                 # 5 ulps of s_max
    np.testing.assert_allclose(s, exact, rtol=0, atol=6e-7)
    np.testing.assert_allclose(s[6:], exact[6:], rtol=0, atol=3e-8)        # LAPACK: ~1e-8 here
    _check_svd(a.astype(np.float64), s, u, vt, s_cpu, True)


@pytest.mark.parametrize("name", ["pinv", "matrix_rank", "norm2", "lstsq", "cond"])
def test_svd_users(jax, trn, name):
    jnp = jax.numpy
    a = np.random.default_rng(8).normal(size=(7, 5)).astype(np.float32)
    a[:, 3] = a[:, 0] + a[:, 1]                                            # rank 4
    b = np.random.default_rng(9).normal(size=(7,)).astype(np.float32)
    f = {"pinv": lambda a, b: jnp.linalg.pinv(a),
         "matrix_rank": lambda a, b: jnp.linalg.matrix_rank(a),
         "norm2": lambda a, b: jnp.linalg.norm(a, ord=2),
         "lstsq": lambda a, b: jnp.linalg.lstsq(a, b)[0],
         "cond": lambda a, b: jnp.linalg.cond(a[:, :3])}[name]
    got, want = _run(jax, trn, f, a, b)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("n", [64, 100, 128])
def test_eigh_and_svd_large(jax, trn, n):
    a = _sym(n, seed=10)
    (w, v), (w_cpu, _) = _run(jax, trn, jax.numpy.linalg.eigh, a)
    _check_eigh(a.astype(np.float64), v, w, w_cpu)
    x = np.random.default_rng(11).normal(size=(n + 3, n)).astype(np.float32)
    (u, s, vt), (_, s_cpu, _) = _run(jax, trn, jax.numpy.linalg.svd, x)
    _check_svd(x.astype(np.float64), s, u, vt, s_cpu, True)
