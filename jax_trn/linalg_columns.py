"""Column helpers and LAPACK's Householder reflector (larfg) for the linalg rules of
`jax_trn/jax_rules.py` and `jax_trn/linalg_tridiagonal.py`: masked sums and selects
instead of column gathers and scatters (a column is strided across partitions)."""
from __future__ import annotations

import jax.numpy as jnp


def column(x, j):
    """Column j of x [..., m, n] as [..., m]: a masked row sum (one term), as a column
    dynamic_slice is a strided copy across partitions."""
    return jnp.sum(jnp.where(jnp.arange(x.shape[-1]) == j, x, jnp.zeros_like(x)), axis=-1)


def entry(x, j):
    """x[..., j] as [..., 1] (a masked sum, no gather)."""
    return jnp.sum(jnp.where(jnp.arange(x.shape[-1]) == j, x, jnp.zeros_like(x)), axis=-1,
                   keepdims=True)


def set_column(x, j, col):
    """x with column j replaced by col [..., m]: one select over x (a column
    dynamic_update_slice writes one element per partition; at 64 x 64 it took ~0.5 ms)."""
    return jnp.where(jnp.arange(x.shape[-1]) == j, col[..., :, None].astype(x.dtype), x)


def reflector(alpha, x):
    """LAPACK's larfg for alpha [..., 1] and x [..., m] (zeros where not part of the
    vector): beta (real), tau, the scale of x into v (v = [1, x * scale]) and whether
    H is not the identity (x != 0 or alpha not real)."""
    xnorm = jnp.sqrt(jnp.sum(abs2(x), axis=-1, keepdims=True))
    beta = -jnp.copysign(jnp.sqrt(abs2(alpha) + xnorm * xnorm), alpha.real)
    safe = (xnorm != 0) | (alpha.imag != 0)
    tau = jnp.where(safe, (beta - alpha) / jnp.where(safe, beta, 1), 0)
    scale = jnp.where(safe, 1 / jnp.where(safe, alpha - beta, 1), 0)
    return beta, tau, scale, safe


def abs2(z):
    """|z|^2 (z * z for reals, the same ops as before complex support)."""
    return z.real * z.real + z.imag * z.imag if jnp.iscomplexobj(z) else z * z
