"""Complex Hermitian eigh and complex singular values on trn, through the real
embedding of a complex matrix, for `jax_trn/linalg_jacobi.py` (the hardware has no
complex type, §4; the Jacobi sweeps are real).

A = X + iY acts on C^n as the real matrix E(A) = [[X, -Y], [Y, X]] acts on R^2n
(z = x + iy <-> [x; y]). E(A) has every eigenvalue (singular value) of A twice, and
the real eigenvectors of one pair span the complex line of A's eigenvector:

    eigvalsh / eigh   E(H) is symmetric for Hermitian H: its eigenvalues ascending are
                      w0, w0, w1, w1, ...; the eigenvectors [x; y] give z = x + iy. One
                      of each pair is taken by a pivoted complex Gram-Schmidt over the 2n
                      candidates (the other of a pair, or of a cluster of equal
                      eigenvalues, then has no residual left), so repeated eigenvalues
                      still get orthonormal vectors.
    svd, no vectors   the singular values of E(A) descending, every other one.
    svd               the Hermitian eigh of [[0, A], [A^H, 0]] (see `svd`).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
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
    """n orthonormal columns of z [..., n, 2n] and their w2, ascending: n times, the
    candidate with the largest residual against those taken (pivoted Gram-Schmidt: a
    cluster of r equal eigenvalues has 2r real candidates spanning r complex
    directions; taking them in order with a fixed threshold could miss one)."""
    n = z.shape[-2]
    batch = z.shape[:-2]
    cands = jnp.arange(2 * n)

    def pick(k, state):
        q, w = state
        coef = jnp.matmul(jnp.conj(jnp.swapaxes(q, -1, -2)), z, precision=HI)   # [..., n, 2n]
        r = z - jnp.matmul(q, coef, precision=HI)
        nr = jnp.sum(jnp.real(r * jnp.conj(r)), axis=-2)                       # [..., 2n]
        best = jnp.argmax(nr, axis=-1)[..., None]                             # [..., 1]
        sel = cands == best                                                    # [..., 2n]
        new = jnp.sum(jnp.where(sel[..., None, :], r, 0), axis=-1)            # [..., n]
        norm = jnp.sqrt(jnp.sum(jnp.where(sel, nr, 0), axis=-1, keepdims=True))
        at = jnp.arange(n) == k
        q = jnp.where(at[..., None, :], (new / norm.astype(new.dtype))[..., :, None], q)
        w = jnp.where(at, jnp.sum(jnp.where(sel, w2, 0), axis=-1, keepdims=True), w)
        return q, w

    init = (jnp.zeros((*batch, n, n), z.dtype), jnp.zeros((*batch, n), w2.dtype))
    q, w = lax.fori_loop(0, n, pick, init)
    order = jnp.argsort(w, axis=-1)
    return (jnp.take_along_axis(q, order[..., None, :], axis=-1),
            jnp.take_along_axis(w, order, axis=-1))


def singular_values(real_svd, a):
    """The singular values of complex a, descending, by `real_svd` of its embedding."""
    s2 = real_svd(embed(a))
    return s2[..., ::2].astype(jnp.real(a).dtype)


def svd(real_eigh, a, full_matrices: bool):
    """(s, u, vh) of complex a [..., m, n], m >= n, from the Hermitian eigh of
    [[0, a], [a^H, 0]]: its n largest eigenvalues are the singular values, their
    eigenvectors [u; v] / sqrt(2). Columns whose singular value is at the eigh's
    rounding level (+s and -s are then not told apart), and a full u's extra columns,
    come from a complex Householder QR of the others (as the real SVD completes)."""
    m, n = a.shape[-2:]
    zm, zn = jnp.zeros((*a.shape[:-2], m, m), a.dtype), jnp.zeros((*a.shape[:-2], n, n), a.dtype)
    ah = jnp.conj(jnp.swapaxes(a, -1, -2))
    big = jnp.concatenate([jnp.concatenate([zm, a], -1), jnp.concatenate([ah, zn], -1)], -2)
    vecs, w = eigh(real_eigh, big, True, m, m + n)             # the n largest, ascending
    vecs, s = vecs[..., ::-1] * np.sqrt(2), w[..., ::-1]
    tol = 4 * (m + n) * jnp.finfo(s.dtype).eps * s[..., :1]
    ok = s > tol
    u = _completed(jnp.where(ok[..., None, :], vecs[..., :m, :], 0), ok, full_matrices)
    v = _completed(jnp.where(ok[..., None, :], vecs[..., m:, :], 0), ok, False)
    return [jnp.where(ok, s, 0), u, jnp.conj(jnp.swapaxes(v, -1, -2))]


def _completed(x, ok, full: bool):
    """x [..., k, n] with orthonormal columns where `ok` (a prefix) and zeros elsewhere:
    the zeros replaced by an orthonormal completion (and k - n more columns if full)."""
    k, n = x.shape[-2:]
    q, r = jnp.linalg.qr(x, mode="complete" if full else "reduced")
    d = jnp.diagonal(r, axis1=-2, axis2=-1)
    mag = jnp.abs(d)
    phase = jnp.where(ok & (mag > 0), d / jnp.where(mag > 0, mag, 1).astype(d.dtype), 1)
    if full and k > n:
        phase = jnp.concatenate([phase, jnp.ones((*phase.shape[:-1], k - n), phase.dtype)], -1)
    return q * phase[..., None, :]
