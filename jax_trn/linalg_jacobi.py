"""Symmetric eigendecomposition and SVD by parallel (Brent-Luk) Jacobi, in plain jax/lax,
for the trn lowering rules of `eigh_p` and `svd_p` (`jax_trn/jax_rules.py`).

Layout: the n (even) indices sit in two rows, top = positions [0, h) and bottom = [h, n),
h = n/2; step pairs position k with k + h, so the h rotations of a step are disjoint and
are applied together. After each step the positions are permuted round-robin (position 0
stays, the others move one place around the ring 1..h-1, bottom h-1..0), so every pair of
indices meets once in n - 1 steps and the order returns to the start after a sweep.

A step is one n x n matrix M = J P^T (J: the h rotations, P: the round-robin permutation),
built elementwise from two constant 0/1 matrices and the rotation cosines and sines, and
applied by matmuls at HIGHEST precision: B <- M^T B M (eigh), U <- U M (SVD), V <- V M.
Each column of M has at most two nonzeros, so every entry of a product is the rotation's
own two-term sum (the other terms are exact zeros): as accurate as rotating rows and
columns one pair at a time.

The steps of a sweep run in a `fori_loop` (`UNROLL` steps per trip); sweeps run in a
`while_loop` until the off-diagonal part is at rounding level (eigh: ||off(B)||_F <=
n eps ||B||_F; SVD: every |u_i . u_j| <= max(m, n) eps ||u_i|| ||u_j||) or `MAX_SWEEPS`
sweeps ran: 5-7 sweeps for eigh and 6-10 for SVD at n = 16..128 on random matrices. Odd n
is padded with one zero row and column: its pairs have a zero off-diagonal entry, hence
the identity rotation, and the padded index stays decoupled; it is dropped at the end.
The input is first scaled by a power of two (exact) so that no square overflows, and
every sqrt input is kept in ScalarE's valid range (§2.4).

Cost on the simulated Trn2 core: a step is 7 kernels (X s, two row sums, the elementwise
rotation kernel, three matmuls; SVD: the Gram matrix instead of one of the B products),
~40 us at n <= 128, almost all fixed per-kernel DMA cost; `benchmarks/linalg.py` measures
eigh at 8.1 / 20.8 / 51.4 ms and SVD at 8.4 / 23.9 / 71.2 ms for n = 32 / 64 / 128.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from jax_trn import linalg_complex

HI = lax.Precision.HIGHEST
MAX_SWEEPS = 12
# SVD columns of the scaled matrix (max entry in [1, 2)) with s^2 below this are treated as
# zero: their singular value is 0 and their u column comes from the QR completion. 2^-100
# keeps 1 / s, products of two such reciprocals and sqrt's input (>= 2^-116, §2.4) in range.
S2_MIN = 2.0 ** -100
UNROLL = 7                   # steps per loop trip (a trip costs ~10 us of loop control)


def _round_robin(n: int) -> np.ndarray:
    """perm[i] = the position whose index moves to position i after a step."""
    h = n // 2
    ring = [*range(1, h), *range(n - 1, h - 1, -1)]      # positions 1..h-1, then bottom reversed
    perm = np.arange(n)
    for a, b in zip(ring, ring[1:] + ring[:1]):           # the index at a moves to b
        perm[b] = a
    return perm


def _step_matrices(n: int, dtype):
    """E = P^T and F = X P^T (X swapping the halves: X[k, k+h] = X[k+h, k] = 1), so that
    M = J P^T = c (E + t F) row by row, J = diag(c) + diag(c t) X, with t[i] the rotation's
    tangent for row i (opposite signs in the two rows of a pair)."""
    h = n // 2
    perm = _round_robin(n)
    pt = np.zeros((n, n), np.float64)
    pt[perm, np.arange(n)] = 1                            # (P^T)[perm[i], i] = 1
    swap = np.roll(np.eye(n), h, axis=1)                  # X[k, k+h] = X[k+h, k] = 1
    return jnp.asarray(pt, dtype), jnp.asarray(swap @ pt, dtype)


def _step_matrix(s, e, f, eye, swap, half_sign):
    """M = J P^T for the step whose pairs are read from the symmetric s [..., n, n]: row i of
    J holds the cosine and sine of the rotation of the pair (i, p = partner(i)), zeroing
    s[i, p] (symmetric Schur, Golub-Van Loan 8.5.2, tan written without a division by
    s[i, p]). Everything after the two row sums is one elementwise [n, n] computation (the
    sums broadcast along rows first, so nothing narrower is computed), one kernel."""
    def rows(x):                 # [..., n] -> [..., n, n], x[i] along row i (a fused view)
        return jnp.broadcast_to(x[..., :, None], s.shape)

    # xs = X s (rows swapped, exact): row i of s holds s[i, i] and s[i, partner], row i of xs
    # s[partner, partner] and s[partner, i]; two masked row sums give the difference of the
    # diagonal entries and the off-diagonal entry averaged over both triangles (s = M^T s M
    # is symmetric only to rounding, and both rows of a pair must get the same rotation:
    # unequal copies of a rounding-level entry may differ in sign, and J is not orthogonal).
    # Each sum has two nonzero terms, so the two rows of a pair get d and -d, the same off.
    xs = _mm(swap, s)
    d = rows(jnp.sum(xs * swap - s * eye, axis=-1))                 # s[p, p] - s[i, i]
    off = rows(jnp.sum(s * swap + xs * eye, axis=-1)) / 2           # s[i, p], s[p, i]
    # r = hypot(d, 2 off) as q sqrt((|d|/q)^2 + (2|off|/q)^2), q = max(|d|, 2|off|): the sqrt
    # input is in [1, 2], inside ScalarE's valid range [2^-116, 2^118] (§2.4), for pairs of
    # any size (tiny columns of a rank-deficient SVD must be rotated too).
    sign = jnp.where(d == 0, half_sign, jnp.sign(d))    # both rows of a pair agree at d = 0
    ad, ao = d * sign, 2 * jnp.abs(off)
    q = jnp.maximum(ad, ao)
    zero = q == 0
    q = jnp.where(zero, 1, q)
    r = q * jnp.sqrt(jnp.square(ad / q) + jnp.square(ao / q))
    t = jnp.where(zero, 0, 2 * off * sign / jnp.where(zero, 1, ad + r))
    c = lax.rsqrt(1 + t * t)                            # 1 + t^2 in [1, 2]: in rsqrt's range
    return c * (e + t * f)


def _mm(a, b):
    return jnp.matmul(a, b, precision=HI)


def _tmm(a, b):
    """a^T b over the last two axes, without materialising a^T."""
    nb = a.ndim - 2
    batch = tuple(range(nb))
    return lax.dot_general(a, b, (((nb,), (nb,)), (batch, batch)), precision=HI)


class _Consts:
    def __init__(self, n: int, dtype):
        self.eye = jnp.eye(n, dtype=dtype)
        self.swap = jnp.roll(self.eye, n // 2, axis=1)
        self.e, self.f = _step_matrices(n, dtype)
        h = n // 2
        self.half_sign = jnp.asarray(np.where(np.arange(n) < h, 1.0, -1.0)[:, None]
                                     * np.ones(n), dtype)

    def step(self, s):
        return _step_matrix(s, self.e, self.f, self.eye, self.swap, self.half_sign)


def _sweeps(n: int, carry, step, converged):
    """Jacobi sweeps (n - 1 steps each) over `carry` until `converged(carry)` or MAX_SWEEPS."""
    def cond(state):
        return (state[0] < MAX_SWEEPS) & ~converged(state[1])

    def body(state):
        return state[0] + 1, lax.fori_loop(0, n - 1, lambda _, c: step(c), state[1],
                                           unroll=UNROLL)

    return lax.while_loop(cond, body, (jnp.int32(0), carry))[1]


def _ranks(keys):
    """A permutation matrix p [..., n, n] with (x @ p)[..., j] the j-th smallest key's entry
    (ties by index): p[i, j] = 1 where j = #{keys smaller than keys[i]}."""
    n = keys.shape[-1]
    i = jnp.arange(n)
    ki, kj = keys[..., :, None], keys[..., None, :]
    before = (kj < ki) | ((kj == ki) & (i[None, :] < i[:, None]))
    rank = jnp.sum(before.astype(jnp.int32), axis=-1)
    return (rank[..., :, None] == i).astype(jnp.float32)


def _pad_last(x, axes):
    pad = [(0, 0)] * x.ndim
    for ax in axes:
        pad[ax] = (0, 1)
    return jnp.pad(x, pad)


def _scaled(a):
    """a / 2^k, 2^k <= max |a| < 2^(k+1) (exact), and 2^k [..., 1]: the squares in the
    rotation formulas neither overflow nor fall far below 1. 2^k is max |a| with its
    mantissa bits cleared (log2 would be out of ScalarE's range [2^-64, 2^64], §2.4)."""
    amax = jnp.max(jnp.abs(a), axis=(-2, -1))[..., None]
    ok = (amax >= jnp.finfo(jnp.float32).tiny) & jnp.isfinite(amax)
    bits = lax.bitcast_convert_type(jnp.where(ok, amax, 1), jnp.int32) & 0x7F800000
    scale = lax.bitcast_convert_type(bits, jnp.float32)
    return a / scale[..., None], scale


def eigh(a, *, lower: bool, sort_eigenvalues: bool, subset_by_index, algorithm=None):
    """(v, w) of the symmetric a [..., n, n], eigenvalues ascending, eigenvectors as columns;
    only the triangle `lower` names is read. Every `algorithm` (QR, Jacobi, QDWH) runs as
    this Jacobi; unsorted eigenvalues come sorted (an order the API allows)."""
    del sort_eigenvalues, algorithm
    dtype = a.dtype
    n0 = a.shape[-1]
    lo, hi = (0, n0) if subset_by_index is None else subset_by_index
    if n0 == 0:
        return [a[..., :, :0], jnp.zeros((*a.shape[:-2], 0), jnp.real(a).dtype)]
    if jnp.issubdtype(dtype, jnp.complexfloating):      # jax_trn/linalg_complex.py
        return linalg_complex.eigh(lambda m: eigh(m, lower=True, sort_eigenvalues=True,
                                                  subset_by_index=None), a, lower, lo, hi)
    a = a.astype(jnp.float32)
    tri = jnp.tril(a) if lower else jnp.triu(a)
    a = tri + jnp.swapaxes(tri, -1, -2) - tri * jnp.eye(n0, dtype=a.dtype)
    a, scale = _scaled(a)
    n = n0 + n0 % 2
    if n != n0:
        a = _pad_last(a, (-2, -1))
    k = _Consts(n, a.dtype)
    tol = n * jnp.finfo(jnp.float32).eps           # the rounding floor of off / ||B|| is ~n eps / 2

    def step(bv):
        b, v = bv
        m = k.step(b)
        return _tmm(m, _mm(b, m)), _mm(v, m)

    def converged(bv):
        b = bv[0]
        off = jnp.sum(jnp.square(b * (1 - k.eye)), axis=(-2, -1))
        return jnp.all(off <= tol * tol * jnp.sum(jnp.square(b), axis=(-2, -1)))

    b, v = _sweeps(n, (a, jnp.broadcast_to(k.eye, a.shape)), step, converged)
    w = jnp.sum(b * k.eye, axis=-1) * scale
    keys = w
    if n != n0:                  # the padded index (back at n0 after whole sweeps) sorts last
        keys = jnp.where(jnp.arange(n) == n0, jnp.inf, w)
    p = _ranks(keys)
    w = _mm(w[..., None, :], p)[..., 0, :]
    v = _mm(v, p)
    return [v[..., :n0, lo:hi].astype(dtype), w[..., lo:hi].astype(dtype)]


def svd(a, *, full_matrices: bool, compute_uv: bool, subset_by_index, algorithm=None):
    """One-sided (Hestenes) Jacobi: the columns of u = a v are rotated until mutually
    orthogonal; singular values are their norms (descending), u's columns normalised.
    Columns of zero norm, and the extra columns of a full u, come from a Householder QR
    of the normalised u (its leading columns are u's own, up to sign)."""
    del algorithm
    dtype = a.dtype
    m0, n0 = a.shape[-2:]
    if m0 == 0 or n0 == 0:
        from jax._src.lax.linalg import _empty_svd
        return list(_empty_svd(a, full_matrices=full_matrices, compute_uv=compute_uv))
    if not compute_uv and jnp.issubdtype(dtype, jnp.complexfloating):
        lo, hi = (0, min(m0, n0)) if subset_by_index is None else subset_by_index
        s = linalg_complex.singular_values(lambda m: svd(
                m, full_matrices=False, compute_uv=False, subset_by_index=None)[0], a)
        return [s[..., lo:hi]]
    if m0 < n0:                                           # a^T = v s u^T
        res = svd(jnp.swapaxes(a, -1, -2), full_matrices=full_matrices,
                  compute_uv=compute_uv, subset_by_index=subset_by_index)
        if not compute_uv:
            return res
        s, u, vt = res
        return [s, jnp.swapaxes(vt, -1, -2), jnp.swapaxes(u, -1, -2)]
    if jnp.issubdtype(dtype, jnp.complexfloating):     # jax_trn/linalg_complex.py
        lo, hi = (0, n0) if subset_by_index is None else subset_by_index
        s, u, vh = linalg_complex.svd(lambda m: eigh(m, lower=True, sort_eigenvalues=True,
                                                     subset_by_index=None), a, full_matrices)
        if subset_by_index is not None:
            s, u, vh = s[..., lo:hi], u[..., lo:hi], vh[..., lo:hi, :]
        return [s, u, vh]
    a, scale = _scaled(a.astype(jnp.float32))
    n = n0 + n0 % 2
    if n != n0:
        a = _pad_last(a, (-1,))
    k = _Consts(n, a.dtype)
    tol = max(m0, n) * jnp.finfo(jnp.float32).eps

    def step(uv):                # (u, v), or (u,) when v is not wanted
        m = k.step(_tmm(uv[0], uv[0]))
        return tuple(_mm(x, m) for x in uv)

    def converged(uv):          # every |cos| between columns (not treated as zero) <= tol
        g = _tmm(uv[0], uv[0])
        d = jnp.sum(g * k.eye, axis=-1)
        live = d >= S2_MIN
        inv = jnp.where(live, 1 / jnp.sqrt(jnp.where(live, d, 1)), 0)
        # 1 / (s_i s_j) by a K = 1 matmul: as a broadcast along partitions inside the
        # reduction this kernel took ~226 us at n = 64, as a matmul operand ~7 us
        cos = g * _mm(inv[..., :, None], inv[..., None, :])
        return jnp.all(jnp.max(jnp.abs(cos * (1 - k.eye)), axis=(-2, -1)) <= tol)

    carry = (a, jnp.broadcast_to(k.eye, (*a.shape[:-2], n, n))) if compute_uv else (a,)
    u, *v = _sweeps(n, carry, step, converged)
    ss = jnp.sum(u * u, axis=-2)                          # of the scaled matrix, < 4m
    s = jnp.where(ss >= S2_MIN, jnp.sqrt(jnp.where(ss >= S2_MIN, ss, 1)), 0)
    keys = -s
    if n != n0:                  # the padded column (back at n0 after whole sweeps) sorts last
        keys = jnp.where(jnp.arange(n) == n0, jnp.inf, keys)
    p = _ranks(keys)
    s = _mm(s[..., None, :], p)[..., 0, :n0]
    lo, hi = (0, n0) if subset_by_index is None else subset_by_index
    if not compute_uv:
        return [(s * scale)[..., lo:hi].astype(dtype)]
    u = _mm(u, p)[..., :n0]
    v = _mm(v[0], p)[..., :n0, :n0]
    ok = s > 0
    u = jnp.where(ok[..., None, :], u / jnp.where(ok, s, 1)[..., None, :], 0)
    full = full_matrices and m0 > n0

    def complete(u):
        q, r = jnp.linalg.qr(u, mode="complete" if full else "reduced")
        sign = jnp.where(jnp.diagonal(r, axis1=-2, axis2=-1) < 0, -1.0, 1.0)
        if full:
            sign = jnp.concatenate([sign, jnp.ones((*sign.shape[:-1], m0 - n0), sign.dtype)], -1)
        return q * sign[..., None, :]

    if full:
        u = complete(u)
    else:
        u = lax.cond(jnp.all(ok), lambda u: u, complete, u)
    vt = jnp.swapaxes(v, -1, -2)
    s = s * scale
    if subset_by_index is not None:
        s, u, vt = s[..., lo:hi], u[..., lo:hi], vt[..., lo:hi, :]
    return [s.astype(dtype), u.astype(dtype), vt.astype(dtype)]
