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
