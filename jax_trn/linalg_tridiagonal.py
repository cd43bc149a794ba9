"""`lax.linalg.tridiagonal` on trn: LAPACK's sytrd / hetrd (the unblocked sytd2 /
hetd2), for the rule registered in `jax_trn/jax_rules.py` (its generic lowering is a
LAPACK or cuSOLVER call).

For `lower`, step j (a `fori_loop` trip) builds the reflector H_j = I - tau v v^H with
v = [0..0, 1, x * scale] that zeroes column j below the subdiagonal (larfg: the
subdiagonal becomes the real beta), then applies it on both sides of the trailing
block with the rank-2 update of sytd2: p = tau A v, w = p - tau/2 (p^H v) v,
A <- A - v w^H - w v^H. The result packs, as LAPACK does: the diagonal d and the
subdiagonal e, the reflectors' x * scale below the subdiagonal, and the input's other
triangle untouched. Only the `lower` (or upper) triangle of the input is read, the
diagonal's real part for complex input (Hermitian).

`upper` is `lower` on the matrix reversed in both dimensions: its lower triangle is
the input's upper one, and sytd2's upper sweep (last column first, the unit entry of
each v just above the diagonal) is the lower sweep read backwards.
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jax_trn.linalg_columns import column, entry, reflector, set_column


def tridiagonal(a, *, lower: bool):
    """(packed reflectors, d, e, taus) for a [..., n, n], as LAPACK's sytrd."""
    if not lower:
        c, d, e, taus = tridiagonal(a[..., ::-1, ::-1], lower=True)
        return [c[..., ::-1, ::-1], d[..., ::-1], e[..., ::-1], taus[..., ::-1]]
    n = a.shape[-1]
    idx = jnp.arange(n)
    below = idx[:, None] > idx[None, :]
    diag = (idx[:, None] == idx[None, :]).astype(a.dtype)
    low = jnp.where(below, a, jnp.zeros_like(a))
    s = low + jnp.conj(jnp.swapaxes(low, -1, -2)) + diag * jnp.real(a).astype(a.dtype)
    taus = jnp.zeros((*a.shape[:-2], max(n - 1, 0)), a.dtype)
    if n > 1:
        s, taus = lax.fori_loop(0, n - 1, _step, (s, taus))
    d = jnp.real(jnp.sum(diag * s, axis=-1))
    sub = idx[:, None] == idx[None, :] + 1
    e = jnp.real(jnp.sum(jnp.where(sub, s, jnp.zeros_like(s)), axis=-1))[..., 1:]
    packed = jnp.where(below, s, jnp.where(diag.astype(bool), d.astype(a.dtype)[..., None], a))
    return [packed, d, e, taus]


def _step(j, state):
    s, taus = state
    n = s.shape[-1]
    idx = jnp.arange(n)
    col = column(s, j)                                                  # [..., n]
    alpha = entry(col, j + 1)
    x = jnp.where(idx > j + 1, col, jnp.zeros_like(col))
    beta, tau, scale, safe = reflector(alpha, x)
    v = jnp.where(idx == j + 1, jnp.ones_like(col), x * scale)
    p = tau * jnp.matmul(s, v[..., :, None], precision=lax.Precision.HIGHEST)[..., 0]
    p = jnp.where(idx > j, p, jnp.zeros_like(p))
    w = p - 0.5 * tau * jnp.sum(jnp.conj(p) * v, axis=-1, keepdims=True) * v
    s = (s - v[..., :, None] * jnp.conj(w)[..., None, :]
         - w[..., :, None] * jnp.conj(v)[..., None, :])
    new = jnp.where(idx == j + 1, jnp.where(safe, beta, alpha), jnp.where(idx > j + 1, x * scale, col))
    s = set_column(s, j, new)
    taus = jnp.where(jnp.arange(n - 1) == j, tau.astype(taus.dtype), taus)
    return s, taus
