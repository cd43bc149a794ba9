"""JAX lowering rules for the "trn" platform, for primitives whose generic lowering
emits an op that XLA expands in its own pipeline (so no backend sees it on CPU/GPU) but
that reaches ours as is.

    triangular_solve   (jnp.linalg.solve / inv / cholesky solves, jax.scipy.linalg.
                        solve_triangular): substitution row by row, a `fori_loop` whose
                        body is one masked matrix-vector product at HIGHEST precision (a
                        solve is as sensitive as XLA's expander assumes)
    cholesky           (jnp.linalg.cholesky, cho_factor): column by column, a
                        `fori_loop` whose body is one masked matrix-vector product; a
                        matrix that is not positive definite (a pivot <= 0, also an
                        exactly singular one) gives NaNs everywhere, as on CPU
    geqrf,             (jnp.linalg.qr, orthogonal initializers): Householder QR in
    householder_product LAPACK's conventions (dlarfg's reflector, R and the vectors packed
                        in one matrix), one column per trip of a `fori_loop`; their generic
                        lowering is a custom_call XLA expands only for TPU
    cumlogsumexp       (its generic lowering is a reduce_window with a logaddexp body):
                        `lax.associative_scan` of logaddexp, log2(n) steps of elementwise
                        ops on shifted slices (the form JAX uses on TPU)
    tridiagonal        (lax.linalg.tridiagonal, LAPACK sytrd / hetrd): Householder
                        reductions, one per trip of a `fori_loop`, in
                        `jax_trn/linalg_tridiagonal.py`
    eigh, svd          (jnp.linalg.eigh / eigvalsh / svd / pinv / lstsq / matrix_rank /
                        norm(ord=2); their generic lowering is a LAPACK or cuSOLVER call):
                        parallel (Brent-Luk) Jacobi, two-sided for eigh and one-sided for
                        svd, in `jax_trn/linalg_jacobi.py`

They are registered when the plugin initializes (`register()`), for platform "trn"
only; everything they emit runs on the device like any other program. `register()` also
registers the host callback rules (`jax_trn.jax_callbacks`), the block-scaled matmul
rules (`jax_trn.jax_mx`: `jax.nn.scaled_matmul` / `scaled_dot_general`) and tells JAX that trn
honours buffer donation (`_enable_donation`).
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from jax_trn.linalg_columns import column, entry, reflector, set_column

_done = False


def register() -> None:
    global _done
    if _done:
        return
    from jax._src.interpreters import mlir
    from jax._src.lax import linalg as lax_linalg
    mlir.register_lowering(lax_linalg.triangular_solve_p,
                           _lower_fun(mlir, _triangular_solve, False),
                           platform="trn")
    mlir.register_lowering(lax_linalg.cholesky_p,
                           _lower_fun(mlir, _cholesky, False),
                           platform="trn")
    mlir.register_lowering(lax_linalg.geqrf_p,
                           _lower_fun(mlir, _geqrf, True), platform="trn")
    mlir.register_lowering(lax_linalg.householder_product_p,
                           _lower_fun(mlir, _householder_product, False),
                           platform="trn")
    from jax_trn import linalg_jacobi
    mlir.register_lowering(lax_linalg.eigh_p,
                           _lower_fun(mlir, linalg_jacobi.eigh, True),
                           platform="trn")
    mlir.register_lowering(lax_linalg.svd_p,
                           _lower_fun(mlir, linalg_jacobi.svd, True),
                           platform="trn")
    from jax_trn import linalg_tridiagonal
    mlir.register_lowering(lax_linalg.tridiagonal_p,
                           _lower_fun(mlir, linalg_tridiagonal.tridiagonal, True),
                           platform="trn")
    from jax._src.lax.control_flow import loops
    mlir.register_lowering(loops.cumlogsumexp_p,
                           _lower_fun(mlir, _cumlogsumexp, False),
                           platform="trn")
    from jax_trn import jax_callbacks, jax_mx
    from jax_trn.kernels import call as kernel_call
    jax_callbacks.register()
    jax_mx.register()
    kernel_call.register()
    _enable_donation(mlir)
    _done = True


def _lower_fun(mlir, fn, multiple_results: bool):
    """`mlir.lower_fun(fn)` traced with implicit rank promotion allowed: the rules
    broadcast e.g. a (2, 1) column against a (2,) iota, which a user's
    `jax_numpy_rank_promotion="raise"` (JAX's own tests set it) must not forbid inside
    a primitive's lowering; likewise `jax_numpy_dtype_promotion="strict"` (a complex
    reflector mixes its real beta with complex values)."""
    import jax

    def traced(*args, **params):
        with jax.numpy_rank_promotion("allow"), jax.numpy_dtype_promotion("standard"):
            return fn(*args, **params)
    return mlir.lower_fun(traced, multiple_results=multiple_results)


def _enable_donation(mlir) -> None:
    """Lists "trn" among the platforms JAX lowers donation for.

    JAX decides in `mlir.lower_jaxpr_to_module` from the module-level list
    `mlir._platforms_with_donation` (cpu, cuda, rocm, tpu, neuron): for the others it
    drops every donation with "Donation is not implemented for ('trn',)". No plugin
    hook or config option sets it, so we add our name to that list (a list JAX reads on
    every lowering; nothing else of JAX is patched). JAX then marks donated arguments
    `tf.aliasing_output` / `jax.buffer_donor`, and the runtime honours them
    (`jax_trn.runtime.donation`)."""
    if "trn" not in mlir._platforms_with_donation:
        mlir._platforms_with_donation.append("trn")


def _triangular_solve(a, b, *, left_side, lower, transpose_a, conjugate_a, unit_diagonal):
    """op(a) x = b (left_side) or x op(a) = b, a triangular; canonicalised to a lower
    left solve without transpose, then forward substitution."""
    if conjugate_a:
        a = jnp.conj(a)
    if transpose_a:
        a, lower = jnp.swapaxes(a, -1, -2), not lower
    if not left_side:               # x a = b  <=>  a^T x^T = b^T
        x = _triangular_solve(jnp.swapaxes(a, -1, -2), jnp.swapaxes(b, -1, -2),
                              left_side=True, lower=not lower, transpose_a=False,
                              conjugate_a=False, unit_diagonal=unit_diagonal)
        return jnp.swapaxes(x, -1, -2)
    if not lower:                   # reverse rows and columns: upper becomes lower
        x = _forward(a[..., ::-1, ::-1], b[..., ::-1, :], unit_diagonal)
        return x[..., ::-1, :]
    return _forward(a, b, unit_diagonal)


def _row(x, i):
    """Row i of x [..., m, k] as [..., 1, k], and the same with columns >= i zeroed."""
    xi = lax.dynamic_slice_in_dim(x, i, 1, axis=-2)
    return xi, jnp.where(jnp.arange(x.shape[-1]) < i, xi, jnp.zeros_like(xi))


def _forward(a, b, unit_diagonal: bool):
    """x with a x = b, a lower triangular [..., m, m], b [..., m, n]."""
    m = a.shape[-1]
    if m == 0 or b.size == 0:
        return jnp.zeros(b.shape, b.dtype)

    def row(i, x):
        ai, below = _row(a, i)                                          # [..., 1, m]
        s = jnp.matmul(below, x, precision=lax.Precision.HIGHEST)      # [..., 1, n]
        xi = lax.dynamic_slice_in_dim(b, i, 1, axis=-2) - s
        if not unit_diagonal:
            xi = xi / lax.dynamic_slice_in_dim(ai, i, 1, axis=-1)
        return lax.dynamic_update_slice_in_dim(x, xi.astype(x.dtype), i, axis=-2)

    return lax.fori_loop(0, m, row, jnp.zeros(b.shape, b.dtype))


def _cholesky(a):
    """Lower L with L L^H = a [..., m, m] (the lower triangle of a is read; L^T for
    real a). For complex a the diagonal is the square root of a real number, as LAPACK's."""
    m = a.shape[-1]
    if a.size == 0:
        return a
    idx = jnp.arange(m)

    def step(i, low):
        _, li = _row(low, i)                                           # [..., 1, m]
        ai = column(a, i)                                             # column i of a
        s = jnp.matmul(low, jnp.conj(jnp.swapaxes(li, -1, -2)),
                       precision=lax.Precision.HIGHEST)[..., 0]      # [..., m]
        pivot = entry(ai, i) - entry(s, i)
        d = jnp.sqrt(pivot.real.astype(a.dtype) if jnp.iscomplexobj(a) else pivot)
        col = jnp.where(idx > i, (ai - s) / d, jnp.where(idx == i, d, jnp.zeros_like(ai)))
        return set_column(low, i, col)

    low = lax.fori_loop(0, m, step, jnp.zeros_like(a))
    # LAPACK's potrf stops at a pivot that is not > 0 and JAX then returns NaNs for the
    # whole matrix (a singular covariance must not give a finite factor)
    diag = jnp.sum(jnp.where(idx[:, None] == idx, low, jnp.zeros_like(low)), axis=-1)
    bad = jnp.any(~(diag > 0), axis=-1, keepdims=True)[..., None]
    return jnp.where(bad, jnp.full_like(low, jnp.nan), low)


def _cumlogsumexp(x, *, axis: int, reverse: bool):
    return lax.associative_scan(jnp.logaddexp, x, reverse=reverse, axis=axis)


def _geqrf(a):
    """LAPACK geqrf: R above the diagonal, Householder vectors (unit leading entry
    implied) below it, and their taus: column j's reflector H = I - tau v v^H maps
    a[j:, j] to (beta, 0, ...), beta = -sign(Re alpha) * ||a[j:, j]|| (dlarfg / zlarfg:
    beta is real, tau complex for complex a; A is updated by H^H)."""
    _check_qr_dtype(a.dtype)
    *batch, m, n = a.shape
    k = min(m, n)
    taus = jnp.zeros((*batch, k), a.dtype)
    if k == 0:
        return [a, taus]
    rows, cols = jnp.arange(m), jnp.arange(n)
    hi = lax.Precision.HIGHEST

    def step(j, state):
        a, taus = state
        col = column(a, j)                                                  # [..., m]
        alpha = entry(col, j)
        x = jnp.where(rows > j, col, jnp.zeros_like(col))
        beta, tau, scale, safe = reflector(alpha, x)
        v = jnp.where(rows == j, jnp.ones_like(col), x * scale)
        w = jnp.matmul(jnp.conj(v)[..., None, :], a, precision=hi)[..., 0, :]  # v^H a
        w = jnp.where(cols > j, w, jnp.zeros_like(w))
        a = a - jnp.conj(tau)[..., None] * v[..., :, None] * w[..., None, :]
        new = jnp.where(rows < j, col, jnp.where(rows == j, jnp.where(safe, beta, alpha),
                                                   x * scale))
        a = set_column(a, j, new)
        taus = jnp.where(jnp.arange(k) == j, tau.astype(taus.dtype), taus)
        return a, taus

    return list(lax.fori_loop(0, k, step, (a, taus)))


def _check_qr_dtype(dtype) -> None:
    """QR in float32 / complex64 only: a 16-bit QR loses the orthogonality the result
    promises; JAX's CPU and GPU backends refuse it the same way ("Unsupported dtype")."""
    if jnp.dtype(dtype) not in (jnp.float32, jnp.complex64, jnp.float64, jnp.complex128):
        raise NotImplementedError(f"Unsupported dtype {jnp.dtype(dtype)} for QR on trn "
                                  "(float32 and complex64 are)")


def _householder_product(a, taus):
    """LAPACK orgqr / ungqr: the first n columns of H_0 H_1 ... H_{k-1} for the
    reflectors packed below the diagonal of a [..., m, n], H_j = I - tau_j v_j v_j^H."""
    m, n = a.shape[-2:]
    k = taus.shape[-1]
    rows = jnp.arange(m)
    q = jnp.broadcast_to(jnp.eye(m, n, dtype=a.dtype), a.shape)
    if k == 0 or m == 0:
        return q

    def reflect(i, q):
        j = k - 1 - i
        col = column(a, j)
        v = jnp.where(rows < j, jnp.zeros_like(col), jnp.where(rows == j, 1, col))
        tau = entry(taus, j)
        w = jnp.matmul(jnp.conj(v)[..., None, :], q,
                       precision=lax.Precision.HIGHEST)[..., 0, :]
        return q - tau[..., None] * v[..., :, None] * w[..., None, :]

    return lax.fori_loop(0, k, reflect, q)
