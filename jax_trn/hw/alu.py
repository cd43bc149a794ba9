"""ALU operations and ScalarE activation functions, as numpy (§2.3, §2.4, §6.2).

Float operations take and return FP32 arrays (the engines compute in FP32). Integer
operations take int64 arrays plus the bit width of the operand type and return int64;
the caller wraps the result into the destination type, so results match XLA's integer
semantics (two's-complement wraparound; x / 0 = -1, x % 0 = x; shifts by >= width give
0, or the sign for arithmetic right shifts).

Activation functions are evaluated with exact FP32 numpy math, not the hardware's
piecewise polynomials (§2.4 [NKI-SHARED]). The polynomials are valid only on the
published input ranges (`RANGES`); outside them the hardware gives "invalid results".
With `strict=True` (the default of `Numerics`) such inputs give NaN; with
`strict=False` the exact answer. IEEE special inputs (+-0, +-inf, NaN) always get the
exact IEEE result (sqrt(0) = 0, log(0) = -inf, 1/0 = inf), on the assumption that
the hardware special-cases them before the polynomial; negative inputs of log / sqrt /
rsqrt are NaN either way. The compiler (jax_trn.lower.tileops: ranged.py, trig.py)
scales or reduces every argument into these ranges first, so compiled programs never
see the NaN; tests/e2e/test_full_range_math.py checks that here.
"""
from __future__ import annotations

import numpy as np
import scipy.special as _sp

from .operands import IsaError
from .spec import ACTIVATION_RANGES

__all__ = ["float_op", "int_op", "narrow_int_op", "narrow_operand", "NARROW_OPS",
           "activation", "reduce_float", "reduce_int",
           "ALU_OPS", "ACTIVATIONS"]

_F32 = np.float32
ALIASES = {"power": "pow", "maximum": "max", "minimum": "min", "mod": "remainder",
           "equal": "is_equal", "less": "is_lt", "less_equal": "is_le",
           "greater": "is_gt", "greater_equal": "is_ge"}


def _flag(x: np.ndarray, like: np.ndarray) -> np.ndarray:
    return x.astype(like.dtype)


def _cmp(fn):
    return lambda a, b: _flag(fn(a, b), a)


def _logic(fn):
    return lambda a, b: _flag(fn(a != 0, b != 0), a)


_COMMON = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply,
    "max": np.maximum, "min": np.minimum,
    "is_equal": _cmp(np.equal), "not_equal": _cmp(np.not_equal),
    "is_lt": _cmp(np.less), "is_le": _cmp(np.less_equal),
    "is_gt": _cmp(np.greater), "is_ge": _cmp(np.greater_equal),
    "logical_and": _logic(np.logical_and), "logical_or": _logic(np.logical_or),
    "logical_xor": _logic(np.logical_xor),
    "abs_max": lambda a, b: np.maximum(np.abs(a), np.abs(b)),
    "abs_min": lambda a, b: np.minimum(np.abs(a), np.abs(b)),
    "bypass": lambda a, b: np.broadcast_to(a, np.broadcast_shapes(a.shape, np.shape(b))),
}

_FLOAT = {**_COMMON, "divide": np.divide, "pow": np.power, "remainder": np.fmod}


def float_op(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    fn = _FLOAT.get(ALIASES.get(op, op))
    if fn is None:
        raise IsaError(f"ALU op {op!r} needs integer operands" if op in _INT_ONLY
                       else f"unknown ALU op {op!r}")
    with np.errstate(all="ignore"):
        return np.asarray(fn(a, b), _F32)


def _int_div(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    zero = b == 0
    safe = np.where(zero, 1, b)
    q = np.abs(a) // np.abs(safe)
    q = np.where((a < 0) != (safe < 0), -q, q)
    return np.where(zero, -1, q)


def _int_rem(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    zero = b == 0
    q = _int_div(a, b, bits)
    return np.where(zero, a, a - q * np.where(zero, 0, b))


def _int_pow(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    out = np.power(a, np.maximum(b, 0))
    neg = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0))
    return np.where(b < 0, neg, out)


def _mask(bits: int) -> np.int64:
    return np.int64(-1) if bits >= 64 else np.int64((1 << bits) - 1)


def _shl(a, b, bits):
    return np.where((b < 0) | (b >= bits), 0, np.left_shift(a, np.clip(b, 0, 63)))


def _shr_logical(a, b, bits):
    ok = (b >= 0) & (b < bits)
    shifted = np.right_shift(a & _mask(bits), np.clip(b, 0, 63))
    if bits >= 64:      # int64 >> is arithmetic; clear the copied sign bits
        shifted &= ~np.left_shift(np.int64(-1), 64 - np.clip(b, 1, 63))
        shifted = np.where(b == 0, a, shifted)
    return np.where(ok, shifted, 0)


def _shr_arith(a, b, bits):
    """Amounts outside [0, bits) (negative ones are huge unsigned) fill with the sign."""
    return np.right_shift(a, np.where((b < 0) | (b >= bits), bits - 1, b))


_INT_ONLY = {
    "bitwise_and": lambda a, b, bits: np.bitwise_and(a, b),
    "bitwise_or": lambda a, b, bits: np.bitwise_or(a, b),
    "bitwise_xor": lambda a, b, bits: np.bitwise_xor(a, b),
    "shift_left": _shl, "shift_right_logical": _shr_logical,
    "shift_right_arithmetic": _shr_arith,
}
_INT = {**{k: (lambda fn: lambda a, b, bits: fn(a, b))(fn) for k, fn in _COMMON.items()},
        **_INT_ONLY, "divide": _int_div, "remainder": _int_rem, "pow": _int_pow}
ALU_OPS = frozenset(_INT) | frozenset(ALIASES)


def int_op(op: str, a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    fn = _INT.get(ALIASES.get(op, op))
    if fn is None:
        raise IsaError(f"unknown ALU op {op!r}")
    with np.errstate(all="ignore"):
        return np.asarray(fn(a, b, bits), np.int64)


# --- 32-bit integer ops without widening ------------------------------------------------
#
# For 32-bit operands whose result is stored (wrapped) into an integer type of at most 32
# bits, these ops give the same low 32 bits computed natively on uint32 views as
# `int_op` does through int64: add / subtract / multiply / bitwise ops depend only on the
# operands mod 2**32, and a logical right shift of a 32-bit operand masks its input to
# 32 bits first. Shifts by amounts outside [0, 32) give 0 either way. Threefry (JAX's
# PRNG) is made of exactly these, on tensors of millions of elements: the int64 round
# trip was most of its simulation time (issue 13, random_lax).

_U32 = np.uint32
_NARROW = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply,
    "bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
}
_NARROW_SHIFTS = {"shift_left": np.left_shift, "shift_right_logical": np.right_shift}
NARROW_OPS = frozenset(_NARROW) | frozenset(_NARROW_SHIFTS)


def narrow_operand(x) -> np.ndarray:
    """`x` (a 32-bit integer array or a Python / numpy integer) as uint32, wrapped."""
    if isinstance(x, np.ndarray) and x.dtype.itemsize == 4:
        return x.view(_U32)
    return np.asarray(np.asarray(x, np.int64) & 0xFFFFFFFF, _U32)


def narrow_int_op(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`int_op(op, a, b, 32)` mod 2**32, as uint32 (see above); `a`, `b` uint32."""
    op = ALIASES.get(op, op)
    fn = _NARROW.get(op)
    if fn is not None:
        return fn(a, b)
    shift = _NARROW_SHIFTS[op]
    if b.ndim == 0:
        return shift(a, b) if b < 32 else np.zeros(np.broadcast(a, b).shape, _U32)
    return np.where(b < 32, shift(a, b & _U32(31)), _U32(0))


def _gelu(x):
    return x * _F32(0.5) * (_F32(1.0) + _sp.erf(x * _F32(0.7071067811865476)))


def _gelu_tanh(x):
    inner = _F32(0.7978845608028654) * (x + _F32(0.044715) * x * x * x)
    return _F32(0.5) * x * (_F32(1.0) + np.tanh(inner))


def _softplus(x):
    return np.logaddexp(_F32(0.0), x)


ACTIVATIONS = {
    "copy": lambda x: x, "identity": lambda x: x, "bypass": lambda x: x,
    "exp": np.exp, "log": np.log, "tanh": np.tanh, "sigmoid": _sp.expit,
    "relu": lambda x: np.maximum(x, _F32(0.0)),
    "gelu": _gelu, "gelu_apprx_tanh": _gelu_tanh,
    "gelu_apprx_sigmoid": lambda x: x * _sp.expit(_F32(1.702) * x),
    "silu": lambda x: x * _sp.expit(x), "softplus": _softplus,
    "mish": lambda x: x * np.tanh(_softplus(x)),
    "sqrt": np.sqrt, "rsqrt": lambda x: _F32(1.0) / np.sqrt(x),
    "reciprocal": lambda x: _F32(1.0) / x, "square": np.square,
    "abs": np.abs, "sign": np.sign, "erf": _sp.erf, "sin": np.sin, "cos": np.cos,
    "arctan": np.arctan,
}


# §2.4 [NKI-SHARED]: func -> (low, high, on |x|): inputs on which ScalarE is valid.
RANGES = dict(ACTIVATION_RANGES)


def out_of_range(func: str, x: np.ndarray) -> np.ndarray:
    """Where `x` is a finite non-zero input outside `func`'s published range."""
    if func not in RANGES:
        return np.zeros(np.shape(x), bool)
    low, high, symmetric = RANGES[func]
    v = np.abs(x) if symmetric else x
    special = (x == 0) | ~np.isfinite(x)
    return ((v < low) | (v > high)) & ~special


def activation(func: str, x: np.ndarray, strict: bool = False) -> np.ndarray:
    fn = ACTIVATIONS.get(func)
    if fn is None:
        raise IsaError(f"unknown activation function {func!r}")
    with np.errstate(all="ignore"):
        y = np.asarray(fn(x), _F32)
    if strict and func in RANGES:
        y = np.where(out_of_range(func, x), _F32(np.nan), y)
    return y


_FLOAT_REDUCE = {"add": np.add, "max": np.maximum, "min": np.minimum,
                 "multiply": np.multiply}
_INT_REDUCE = {**_FLOAT_REDUCE, "bitwise_and": np.bitwise_and,
               "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor}


def reduce_float(op: str, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    op = ALIASES.get(op, op)
    if op in ("abs_max", "abs_min"):
        x, op = np.abs(x), op[4:]
    if op in ("logical_and", "logical_or"):
        fn = np.all if op == "logical_and" else np.any
        return fn(x != 0, axis=axes).astype(_F32)
    if op not in _FLOAT_REDUCE:
        raise IsaError(f"unknown or integer-only reduce op {op!r}")
    with np.errstate(all="ignore"):
        return _FLOAT_REDUCE[op].reduce(x, axis=axes, dtype=_F32)


def reduce_int(op: str, x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    op = ALIASES.get(op, op)
    if op in ("abs_max", "abs_min"):
        x, op = np.abs(x), op[4:]
    if op in ("logical_and", "logical_or"):
        fn = np.all if op == "logical_and" else np.any
        return fn(x != 0, axis=axes).astype(np.int64)
    if op not in _INT_REDUCE:
        raise IsaError(f"unknown reduce op {op!r}")
    return _INT_REDUCE[op].reduce(x, axis=axes, dtype=np.int64)
