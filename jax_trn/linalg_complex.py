"""Complex Hermitian eigh and complex singular values on trn, through the real
embedding of a complex matrix, for `jax_trn/linalg_jacobi.py` (the hardware has no
complex type, §4; the Jacobi sweeps are real).

A = X + iY acts on C^n as the real matrix E(A) = [[X, -Y], [Y, X]] acts on R^2n
(z = x + iy <-> [x; y]). E(A) has every eigenvalue (singular value) of A twice, and
the real eigenvectors of one pair span the complex line of A's eigenvector:

    eigvalsh / eigh   E(H) is symmetric for Hermitian H: its eigenvalues ascending are
                      w0, w0, w1, w1, ...; the eigenvectors [x; y] give z = x + iy. One
                      of each pair is taken by a complex Gram-Schmidt over the 2n
                      candidates in order (a candidate whose residual is below 1/2 is
                      the other of a pair, or of a cluster of equal eigenvalues, already
                      spanned), so repeated eigenvalues still get orthonormal vectors.
    svd, no vectors   the singular values of E(A) descending, every other one.

A complex SVD with singular vectors stays refused (its u and v would have to be chosen
together, a cluster at a time).
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

HI = lax.Precision.HIGHEST


def embed(a):
    """E(a) [..., 2m, 2n] for complex a [..., m, n]."""
    x, y = jnp.real(a), jnp.imag(a)
    return jnp.concatenate([jnp.concatenate([x, -y], -1), jnp.concatenate([y, x], -1)], -2)


def hermitian(a, lower: bool):
    """The Hermitian matrix the `lower` (else upper) triangle of a names (real diagonal)."""
    n = a.shape[-1]
    idx = jnp.arange(n)
    strict = idx[:, None] > idx[None, :] if lower else idx[:, None] < idx[None, :]
    tri = jnp.where(strict, a, jnp.zeros_like(a))
    diag = jnp.where(idx[:, None] == idx[None, :], jnp.real(a).astype(a.dtype), 0)
    return tri + jnp.conj(jnp.swapaxes(tri, -1, -2)) + diag


def eigh(real_eigh, a, lower: bool, lo: int, hi: int):
    """(v, w) of the Hermitian a [..., n, n], by `real_eigh` of its embedding."""
    n = a.shape[-1]
    v2, w2 = real_eigh(embed(hermitian(a, lower)))
    z = (v2[..., :n, :] + 1j * v2[..., n:, :]).astype(a.dtype)           # [..., n, 2n]
    v, w = _one_per_pair(z, w2)
    return [v[..., lo:hi], w[..., lo:hi].astype(jnp.real(a).dtype)]


def _one_per_pair(z, w2):
    """n orthonormal columns of z [..., n, 2n] (candidates in order) and their w2."""
    n = z.shape[-2]
    batch = z.shape[:-2]

    def pick(c, state):
        q, w, count = state
        cand = jnp.sum(jnp.where(jnp.arange(2 * n) == c, z, 0), axis=-1)        # [..., n]
        coef = jnp.matmul(jnp.conj(jnp.swapaxes(q, -1, -2)), cand[..., None], precision=HI)
        r = cand - jnp.matmul(q, coef, precision=HI)[..., 0]
        nr = jnp.sum(jnp.real(r * jnp.conj(r)), axis=-1, keepdims=True)
        keep = (nr > 0.5) & (count < n)
        new = r / jnp.sqrt(jnp.where(keep, nr, 1)).astype(r.dtype)
        wc = jnp.sum(jnp.where(jnp.arange(2 * n) == c, w2, 0), axis=-1, keepdims=True)
        at = jnp.arange(n) == count                                              # [..., n]
        q = jnp.where((keep & at)[..., None, :], new[..., :, None], q)
        w = jnp.where(keep & at, wc, w)
        return q, w, count + keep.astype(count.dtype)

    init = (jnp.zeros((*batch, n, n), z.dtype), jnp.zeros((*batch, n), w2.dtype),
            jnp.zeros((*batch, 1), jnp.int32))
    q, w, _ = lax.fori_loop(0, 2 * n, pick, init)
    return q, w


def singular_values(real_svd, a):
    """The singular values of complex a, descending, by `real_svd` of its embedding."""
    s2 = real_svd(embed(a))
    return s2[..., ::2].astype(jnp.real(a).dtype)
