"""stablehlo.fft as real matmuls: DFT matrices on TensorE (a systolic array multiplies by
a constant matrix at full rate, §2.1), for the `complex-planes` pass.

One axis of length n, complex input (re, im): the planes are concatenated along the
axis (2n) and multiplied by one real matrix [2n, 2m] holding the cosines and sines
(rows 0..n-1 take the real plane, n..2n-1 the imaginary one; columns 0..m-1 give the
real part, m..2m-1 the imaginary part), so the contraction fills up to 2n partitions
in one pass. RFFT's first axis is real (matrix [n, 2(n/2+1)]); IRFFT's last axis
returns a real plane (matrix [2(n/2+1), n] with the Hermitian weights 1, 2, ..., 2, 1).

Long axes (n > DIRECT_MAX with a factor) use one Cooley-Tukey step, n = n1 * n2 with
n1 the factor nearest sqrt(n): DFTs of n1 along the rows, twiddles e^(-+2 pi i j2 k1 / n)
as constants, DFTs of n2, then the transpose that orders k = k1 + n1 k2; recursively,
so every matrix stays small. A prime n above DIRECT_MAX and up to PRIME_MAX is one
direct matrix; longer primes are refused (Bluestein is not built).

Every dot_general contracts the transformed axis and puts the new one last; doing the
axes in order brings them back where they were (a final transpose otherwise). The
matmuls run with precision HIGHEST (FP32 on TensorE): an FFT is not a user's matmul, and
CPU's FFT is accurate to ~1e-6 relative, which bf16 auto-cast would not match.
Matrices and twiddles are computed in float64 (angles reduced mod n) and rounded once.
"""
from __future__ import annotations

import math

import numpy as np

from hlo_passes import ir
from hlo_passes.complex_math import Builder, Planes
from hlo_passes.errors import HloImportError

DIRECT_MAX = 256          # longest axis done as one DFT matrix when n has a factor
PRIME_MAX = 2048          # longest prime axis (one [2n, 2n] FP32 matrix: 64 MiB)
PRECISION = ("HIGHEST", "HIGHEST")


def fft(b: Builder, x, fft_type: str, lengths: tuple[int, ...]):
    """The result of `stablehlo.fft` on `x` (planes for FFT/IFFT/IRFFT input, a real
    value for RFFT input); planes out, except a real value for IRFFT."""
    k = len(lengths)
    if fft_type in ("FFT", "IFFT"):
        rank = len(x[0].shape)
        return _axes(b, x, list(range(rank - k, rank)), list(range(rank)),
                     fft_type == "IFFT")
    if fft_type == "RFFT":
        rank = len(x.shape)
        planes = _rfft_last(b, x, lengths[-1])
        return _axes(b, planes, list(range(rank - k, rank - 1)), list(range(rank)), False)
    if fft_type == "IRFFT":
        rank = len(x[0].shape)
        planes = _axes(b, x, list(range(rank - k, rank - 1)), list(range(rank)), True)
        return _irfft_last(b, planes, lengths[-1])
    raise HloImportError(f"fft type {fft_type} is not supported")


def _axes(b: Builder, z: Planes, axes: list[int], order: list[int], inverse: bool) -> Planes:
    """Transforms the original axes `axes` (`order[i]`: the original axis at position
    i); returns planes in the original axis order."""
    order = list(order)
    for a in axes:
        pos = order.index(a)
        z = _fft_axis(b, z, pos, inverse)
        order = order[:pos] + order[pos + 1:] + [a]
    if order != sorted(order):
        perm = tuple(order.index(i) for i in range(len(order)))
        z = tuple(_transpose(b, p, perm) for p in z)
    return z


def _fft_axis(b: Builder, z: Planes, axis: int, inverse: bool) -> Planes:
    """One complex DFT along `axis`; the transformed axis comes out last."""
    n = z[0].shape[axis]
    n1 = _factor(n)
    if n1 == 1:
        if n > PRIME_MAX:
            raise HloImportError(f"fft of length {n} (a prime above {PRIME_MAX}) is not "
                                 "supported on trn")
        cat = _concat(b, z, axis)
        y = _dot(b, cat, axis, complex_matrix(n, inverse))
        return _halves(b, y)
    rank = len(z[0].shape)
    perm = tuple(i for i in range(rank) if i != axis) + (axis,)
    rest = tuple(z[0].shape[i] for i in perm[:-1])
    z = tuple(_reshape(b, _transpose(b, p, perm), rest + (n1, n // n1)) for p in z)
    z = _fft_axis(b, z, rank - 1, inverse)                 # [..., n2, k1]
    tw = _twiddles(n1, n // n1, inverse)                   # [n2, k1]
    z = _mul_const(b, z, tw)
    z = _fft_axis(b, z, rank - 1, inverse)                 # [..., k1, k2]
    last2 = tuple(range(rank - 1)) + (rank, rank - 1)
    return tuple(_reshape(b, _transpose(b, p, last2), rest + (n,)) for p in z)


def _rfft_last(b: Builder, x: ir.Value, n: int) -> Planes:
    """Real -> complex along the last axis (n/2 + 1 outputs)."""
    h = n // 2 + 1
    if n > DIRECT_MAX and _factor(n) > 1:
        zero = b.const(0.0, x)
        z = _fft_axis(b, (x, zero), len(x.shape) - 1, False)
        return tuple(_slice_last(b, p, 0, h) for p in z)
    t = _angles(n, n, h)
    y = _dot(b, x, len(x.shape) - 1, np.concatenate([np.cos(t), -np.sin(t)], axis=1))
    return _halves(b, y)


def _irfft_last(b: Builder, z: Planes, n: int) -> ir.Value:
    """Complex (n/2 + 1 values, Hermitian) -> real along the last axis."""
    h = n // 2 + 1
    z = tuple(_slice_last(b, p, 0, min(h, p.shape[-1])) for p in z)
    if n > DIRECT_MAX and _factor(n) > 1:
        full = _hermitian(b, z, n)
        return _fft_axis(b, full, len(full[0].shape) - 1, True)[0]
    t = _angles(n, z[0].shape[-1], n)
    w = np.full((t.shape[0], 1), 2.0)
    w[0] = 1.0
    if n % 2 == 0 and t.shape[0] == h:
        w[-1] = 1.0
    mat = np.concatenate([w * np.cos(t), -w * np.sin(t)], axis=0) / n
    return _dot(b, _concat(b, z, len(z[0].shape) - 1), len(z[0].shape) - 1, mat)


def _hermitian(b: Builder, z: Planes, n: int) -> Planes:
    """The full spectrum X[0..n-1] from X[0..n/2]: X[n-k] = conj(X[k])."""
    h = n // 2 + 1
    lo, hi = 1, n - h + 1                  # mirror X[1 .. n-h] reversed
    last = len(z[0].shape) - 1
    mirror = [b.emit("reverse", [_slice_last(b, p, lo, hi)], _shape_last(p, hi - lo),
                     p.dtype, dimensions=(last,)) for p in z]
    mirror[1] = b.neg(mirror[1])
    return tuple(_cat(b, [p, m], last) for p, m in zip(z, mirror))


# --- matrices --------------------------------------------------------------------------


def _factor(n: int) -> int:
    """The factor of n nearest sqrt(n) for a Cooley-Tukey step, 1 for a direct DFT."""
    if n <= DIRECT_MAX:
        return 1
    for d in range(math.isqrt(n), 1, -1):
        if n % d == 0:
            return d
    return 1


def _angles(n: int, rows: int, cols: int) -> np.ndarray:
    """2 pi (j k mod n) / n in float64 for j < rows, k < cols."""
    jk = np.outer(np.arange(rows, dtype=np.int64), np.arange(cols, dtype=np.int64)) % n
    return 2.0 * np.pi * jk / n


def complex_matrix(n: int, inverse: bool) -> np.ndarray:
    """[2n, 2n]: [re | im] of y = sum_j x_j e^(-+2 pi i j k / n) (/ n if inverse) from
    the rows [re; im] of x."""
    t = _angles(n, n, n)
    c, s = np.cos(t), np.sin(t) * (1.0 if inverse else -1.0)
    mat = np.block([[c, s], [-s, c]])
    return mat / n if inverse else mat


def _twiddles(n1: int, n2: int, inverse: bool) -> tuple[np.ndarray, np.ndarray]:
    """e^(-+2 pi i j2 k1 / n) as [n2, n1] (re, im)."""
    t = _angles(n1 * n2, n2, n1)
    return np.cos(t), np.sin(t) * (1.0 if inverse else -1.0)


# --- ops -------------------------------------------------------------------------------


def _dot(b: Builder, x: ir.Value, axis: int, mat: np.ndarray) -> ir.Value:
    w = b.array(mat, x.dtype)
    shape = tuple(d for i, d in enumerate(x.shape) if i != axis) + (mat.shape[1],)
    return b.emit("dot_general", [x, w], shape, x.dtype, precision_config=PRECISION,
                  lhs_batching_dimensions=(), rhs_batching_dimensions=(),
                  lhs_contracting_dimensions=(axis,), rhs_contracting_dimensions=(0,))


def _mul_const(b: Builder, z: Planes, tw) -> Planes:
    """z * (tw_re + i tw_im), the [n2, n1] constants broadcast over z's leading dims."""
    x, y = z
    dims = (len(x.shape) - 2, len(x.shape) - 1)
    u, v = (b.emit("broadcast_in_dim", [b.array(t, x.dtype)], x.shape, x.dtype,
                   broadcast_dimensions=dims) for t in tw)
    return b.sub(b.mul(x, u), b.mul(y, v)), b.add(b.mul(x, v), b.mul(y, u))


def _halves(b: Builder, y: ir.Value) -> Planes:
    m = y.shape[-1] // 2
    return _slice_last(b, y, 0, m), _slice_last(b, y, m, 2 * m)


def _shape_last(x: ir.Value, size: int) -> tuple[int, ...]:
    return x.shape[:-1] + (size,)


def _slice_last(b: Builder, x: ir.Value, lo: int, hi: int) -> ir.Value:
    if (lo, hi) == (0, x.shape[-1]):
        return x
    r = len(x.shape)
    return b.emit("slice", [x], _shape_last(x, hi - lo), x.dtype,
                  start_indices=(0,) * (r - 1) + (lo,),
                  limit_indices=x.shape[:-1] + (hi,), strides=(1,) * r)


def _concat(b: Builder, z: Planes, axis: int) -> ir.Value:
    return _cat(b, list(z), axis)


def _cat(b: Builder, xs: list[ir.Value], axis: int) -> ir.Value:
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return b.emit("concatenate", xs, shape, xs[0].dtype, dimension=axis)


def _transpose(b: Builder, x: ir.Value, perm: tuple[int, ...]) -> ir.Value:
    if perm == tuple(range(len(x.shape))):
        return x
    return b.emit("transpose", [x], tuple(x.shape[p] for p in perm), x.dtype,
                  permutation=tuple(perm))


def _reshape(b: Builder, x: ir.Value, shape: tuple[int, ...]) -> ir.Value:
    return x if tuple(shape) == x.shape else b.emit("reshape", [x], shape, x.dtype)
