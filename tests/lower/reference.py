"""Numpy references for the lowered ops (XLA semantics, like jax's lax_reference.py).

Float ops compute in FP32 and round once to the result dtype (what XLA's CPU backend
gives for a single bf16 op); integer ops compute in int64 and wrap.
"""
from __future__ import annotations

import numpy as np
import scipy.special as sp

from hlo_passes import ir

F32 = np.float32


def _trunc_div(a, b):
    q = np.abs(a) // np.abs(b)
    return np.where((a < 0) != (b < 0), -q, q)


def _int_pow(a, b):
    return np.where(b < 0, 0, np.power(a, np.maximum(b, 0)))


FLOAT_REF = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply,
    "divide": np.divide, "maximum": np.maximum, "minimum": np.minimum,
    "power": np.power, "remainder": np.fmod,
    "negate": np.negative, "abs": np.abs, "exponential": np.exp, "log": np.log,
    "tanh": np.tanh, "logistic": sp.expit, "sqrt": np.sqrt,
    "rsqrt": lambda x: F32(1) / np.sqrt(x), "sign": np.sign,
}
INT_REF = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply,
    "divide": _trunc_div, "maximum": np.maximum, "minimum": np.minimum,
    "power": _int_pow, "negate": np.negative, "abs": np.abs,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "not": np.invert,
    "shift_left": lambda a, b: np.where(b < 32, np.left_shift(a, np.clip(b, 0, 31)), 0),
    "shift_right_arithmetic": lambda a, b: np.right_shift(a, np.clip(b, 0, 31)),
    "shift_right_logical": lambda a, b: np.where(
        b < 32, np.right_shift(a & 0xFFFFFFFF, np.clip(b, 0, 31)), 0),
}
COMPARE_REF = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
               "GT": np.greater, "GE": np.greater_equal}


def elementwise(kind: str, dtype: str, *args: np.ndarray) -> np.ndarray:
    """The XLA result of one elementwise op on `args` (all of `dtype`)."""
    out = ir.np_dtype(dtype)
    if ir.is_float(dtype):
        with np.errstate(all="ignore"):
            return FLOAT_REF[kind](*(a.astype(F32) for a in args)).astype(out)
    if dtype == "bool":
        return INT_REF[kind](*args).astype(out)
    return INT_REF[kind](*(a.astype(np.int64) for a in args)).astype(out)


def tol(dtype: str) -> dict:
    """assert_allclose tolerances for results of `dtype` (one rounding of slack)."""
    if dtype in ("bfloat16",):
        return dict(rtol=1e-2, atol=1e-2)
    if dtype == "float16":
        return dict(rtol=2e-3, atol=2e-3)
    if ir.is_float(dtype):
        return dict(rtol=2e-6, atol=1e-6)
    return dict(rtol=0, atol=0)


def assert_close(actual: np.ndarray, expected: np.ndarray, dtype: str, **kw) -> None:
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    t = {**tol(dtype), **kw}
    if ir.is_float(dtype):
        np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64),
                                   equal_nan=True, **t)
    else:
        np.testing.assert_array_equal(actual, expected)
