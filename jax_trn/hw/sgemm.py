"""The simulator's FP32 matrix products: one BLAS, loaded for the simulator alone.

TensorE's semantics (§2.2: FP32 products accumulated in FP32) are computed with a
single-precision GEMM on tiles of at most [128, 128] x [128, 512]. That product is most
of a matmul-heavy program's wall time (issue 14: ~60% of a transformer block's replay),
so which GEMM kernel runs matters. numpy's own OpenBLAS picks its kernel when numpy is
imported, by its CPU detection; on some CPUs with AVX-512 (AMD Zen 4/5 seen) it picks
the AVX2 ("Haswell") kernel, 1.7x slower per core than the AVX-512 ("SkylakeX") one on
these tile shapes, and by then the choice cannot be changed in-process.

So the simulator loads its own OpenBLAS, the `scipy-openblas32` wheel (a separate
library, nobody else's copy), before anything has initialized it: on one thread (the
simulator parallelizes itself, `lanes.py`), with the AVX-512 kernel when the CPU has
AVX-512 F/CD/BW/DQ/VL (numpy's `AVX512_SKX` feature), else with OpenBLAS's own choice.
`JAX_TRN_BLAS_CORETYPE=<OpenBLAS core name>` chooses the kernel instead (e.g. `Haswell`
for the AVX2 kernel on every x86-64 machine; jax_trn.config passes it in,
`set_environment`); `OPENBLAS_CORETYPE` is numpy's setting and is left to numpy's
library. Every FP32 product of the hardware model, the
interpreter's (`semantics.nc_matmul`) and the compiled plans' (`plan.py`), goes
through `matmul`, so the two agree bit for bit; where that library is missing it is
`np.matmul`. The summation order inside a product is the GEMM kernel's: FP32 results
of long dot products may differ in the last bit from another machine's (as they did
with numpy's BLAS); the hardware's own order is not modelled.

`matmul` releases the GIL during the product (ctypes does), as `np.matmul` does.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import threading

import numpy as np

__all__ = ["matmul", "bound", "kernel", "library", "set_environment"]

_F32 = np.dtype(np.float32)
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112
_lock = threading.Lock()
_state: dict = {}


def _cpu_has_avx512() -> bool:
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:                      # numpy < 2
        from numpy.core._multiarray_umath import __cpu_features__
    return bool(__cpu_features__.get("AVX512_SKX"))


def set_environment(factory) -> None:
    """`factory(settings)`: a context manager giving the process environment
    `settings` ({variable: value, None to unset}) while the library loads (OpenBLAS's
    initializer reads them). jax_trn.config, which owns the environment, sets it (and
    may override the kernel: JAX_TRN_BLAS_CORETYPE)."""
    _state["environment"] = factory


def _load():
    """(cblas_sgemm, core name) of our own OpenBLAS, or None without one. Importing
    `scipy_openblas32` loads the library, so it happens inside the environment."""
    settings = {"OPENBLAS_NUM_THREADS": "1",
                "OPENBLAS_CORETYPE": "SkylakeX" if _cpu_has_avx512() else None}
    factory = _state.get("environment")
    with (factory(settings) if factory is not None else contextlib.nullcontext()):
        try:
            import scipy_openblas32
            name = scipy_openblas32.get_library()
            paths = [p for ext in ("so", "dylib") for p in sorted(glob.glob(
                os.path.join(scipy_openblas32.get_lib_dir(), f"*{name}*.{ext}*")))]
            lib = ctypes.CDLL(paths[0], mode=ctypes.RTLD_LOCAL) if paths else None
        except (ImportError, OSError):
            lib = None
    if lib is None:
        return None
    prefix = "scipy_"
    fn = getattr(lib, f"{prefix}cblas_sgemm")
    c_int, c_float, ptr = ctypes.c_int, ctypes.c_float, ctypes.c_void_p
    fn.argtypes = [c_int, c_int, c_int, c_int, c_int, c_int, c_float, ptr, c_int,
                   ptr, c_int, c_float, ptr, c_int]
    fn.restype = None
    getattr(lib, f"{prefix}openblas_set_num_threads")(1)
    core = getattr(lib, f"{prefix}openblas_get_corename")
    core.restype = ctypes.c_char_p
    return fn, core().decode()


def _sgemm():
    got = _state.get("sgemm", False)
    if got is False:
        with _lock:
            got = _state.get("sgemm", False)
            if got is False:
                got = _state["sgemm"] = _load()
    return got


def kernel() -> str | None:
    """The OpenBLAS core name of the simulator's GEMM (None: numpy.matmul's)."""
    got = _sgemm()
    return got[1] if got else None


def library() -> str:
    """Which GEMM the simulator's products run on (for benchmarks' headers)."""
    got = _sgemm()
    return f"scipy-openblas32 ({got[1]} kernel, 1 thread)" if got else "numpy.matmul"


def _leading(x: np.ndarray, column_major: bool) -> int | None:
    """`x`'s leading dimension (elements) as a GEMM array laid out column-major
    (transposed) or row-major, or None when its alignment or strides do not allow that
    in place."""
    if x.ctypes.data % 4:
        return None
    (rows, cols), (s0, s1) = x.shape, x.strides
    inner, outer, extent = (s0, s1, rows) if column_major else (s1, s0, cols)
    if inner == 4 and outer % 4 == 0 and outer >= 4 * max(extent, 1):
        return outer // 4
    return None


def _operand(x: np.ndarray, column_major: bool):
    """(x or a copy, its CBLAS transpose flag, leading dimension): A always goes to the
    GEMM column-major (transposed) and B row-major, copied if need be, so a product's
    bits depend on the values and shape only (OpenBLAS's kernels for a vector-shaped
    product sum in an order that depends on the operands' layout)."""
    flag = _TRANS if column_major else _NO_TRANS
    ld = _leading(x, column_major)
    if ld is None:
        x = np.asfortranarray(x) if column_major else np.ascontiguousarray(x)
        ld = max(x.shape[0] if column_major else x.shape[1], 1)
    return x, flag, ld


def _call(a: np.ndarray, b: np.ndarray, dst: np.ndarray, accumulate: bool) -> tuple:
    """(A and B as the GEMM reads them, copies where needed; the cblas_sgemm arguments
    writing `dst`, a row-major FP32 [M, N] array, with beta 1 if `accumulate`)."""
    (m, k), n = a.shape, b.shape[1]
    a, ta, lda = _operand(a, True)
    b, tb, ldb = _operand(b, False)
    return a, b, (_ROW_MAJOR, ta, tb, m, n, k, 1.0, a.ctypes.data, lda, b.ctypes.data, ldb,
                  1.0 if accumulate else 0.0, dst.ctypes.data, _leading(dst, False))


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
           accumulate: bool = False) -> np.ndarray:
    """a [M, K] @ b [K, N] in FP32 (both FP32 arrays, any strides), into `out` (an
    [M, N] FP32 array, any strides) or a new array; with `accumulate`, `out += a @ b`
    (one GEMM with beta = 1: the kernel adds its FP32 sum to `out` as one rounding,
    which for K within one of its blocks, every TensorE product, is the bits of
    `out + (a @ b)`; tests/sim/test_sgemm.py checks it for the loaded kernel)."""
    got = _sgemm()
    if got is None or a.dtype != _F32 or b.dtype != _F32 or a.ndim != 2 or b.ndim != 2:
        if accumulate:
            return np.add(out, np.matmul(a, b), out=out)
        return np.matmul(a, b, out=out)
    (m, k), n = a.shape, b.shape[1]
    if b.shape[0] != k:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not contract")
    if out is None:
        if accumulate:
            raise ValueError("matmul: accumulate needs `out`")
        out = np.empty((m, n), _F32)
        dst = out
    else:
        direct = (out.dtype == _F32 and out.shape == (m, n)
                  and _leading(out, False) is not None)
        dst = out if direct else np.array(out, _F32) if accumulate else np.empty((m, n), _F32)
    if m and n:
        if k == 0:
            if not accumulate:
                dst[...] = 0
        else:
            a, b, args = _call(a, b, dst, accumulate)    # a, b: kept alive for the call
            got[0](*args)
    if dst is not out:
        out[...] = dst
    return out


def bound(a: np.ndarray, b: np.ndarray, out: np.ndarray, accumulate: bool = False):
    """`matmul(a, b, out, accumulate)` for arrays whose memory never moves (tile views,
    scratch buffers), as a no-argument callable with the GEMM's arguments worked out
    once (the same call, so the same bits); None where `matmul` would copy an operand
    or the output, or fall back to numpy."""
    got = _sgemm()
    if (got is None or a.dtype != _F32 or b.dtype != _F32 or out.dtype != _F32
            or a.ndim != 2 or b.ndim != 2 or out.ndim != 2):
        return None
    (m, k), n = a.shape, b.shape[1]
    if b.shape[0] != k or out.shape != (m, n) or not (m and n and k):
        return None
    if _leading(out, False) is None:
        return None
    a2, b2, args = _call(a, b, out, accumulate)
    if a2 is not a or b2 is not b:
        return None
    call = functools.partial(got[0], *args)
    call.arrays = (a, b, out)              # the memory the pointers point into
    return call
