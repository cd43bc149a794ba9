"""Dtype conformance: elementwise, convert, compare, select, broadcast, reshape,
transpose, slice, concatenate, pad, iota, reverse and reduce ops on trn against JAX's
CPU backend, for f32, bf16, f16, float8_e4m3fn, float8_e5m2, int8/16/32, uint8/16/32,
bool (and int64/uint64 in an x64 subprocess), on shapes that are and are not multiples
of 128, scalars, size-0 dims and broadcasts.

One jitted program per dtype holds every check (one compile, one run); its outputs
are compared by name, exactly for integer / bool results and data movement, within
`assert_close`'s per-dtype tolerances for float arithmetic. float64 is not a Trainium
type: it must be a compile error. float8 reductions are left out: XLA's CPU backend
accumulates them in float8 (the result depends on its summation order), trn in FP32.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.conftest import assert_close, run_python

FLOATS = ["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"]
INTS = ["int8", "int16", "int32", "uint8", "uint16", "uint32"]
TYPES = FLOATS + INTS + ["bool"]
CONVERT_TO = FLOATS + INTS + ["bool"]
COMPARES = ["eq", "ne", "lt", "le", "gt", "ge"]
# Results compared bit for bit whatever their type: data movement and selection.
EXACT = {"neg", "abs", "max", "min", "clamp", "select", "where_scalar", "bcast", "reshape",
         "transpose", "slice", "concat", "pad", "rev", "zero", "scalar_in", "tiled",
         "bcast_row", "bcast_col", "iota", "floor", "round", "sign", "isfinite",
         "max_tiled", "min0", "max1", "block128"}


def npdt(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name, name))


def operands(dtype: str, shape=(130, 3)):
    """x, y of `shape` and a scalar s: small integers (no overflow in products of
    three), floats in [-4, 4] with |y| >= 0.5 (a safe divisor)."""
    rng = np.random.default_rng(0)
    if dtype == "bool":
        x, y, s = (rng.integers(0, 2, n).astype(bool) for n in (shape, shape, ()))
    elif dtype.startswith(("int", "uint")):
        lo = 0 if dtype.startswith("u") else -9
        x, y = (rng.integers(lo, 10, shape).astype(dtype) for _ in range(2))
        s = np.asarray(3, dtype)
    else:
        x, y = (rng.uniform(-4, 4, shape).astype(np.float32) for _ in range(2))
        y = np.where(np.abs(y) < 0.5, 1.0, y).astype(np.float32)
        x, y, s = x.astype(npdt(dtype)), y.astype(npdt(dtype)), np.asarray(1.5, npdt(dtype))
    return x, y, s


def checks(dtype: str, types=CONVERT_TO) -> dict:
    """name -> fn(x, y, s) for everything defined on `dtype`."""
    import jax.numpy as jnp
    from jax import lax
    is_float, is_bool = dtype in FLOATS or dtype == "float64", dtype == "bool"
    c = {
        "neg": lambda x, y, s: ~x if is_bool else -x,
        "select": lambda x, y, s: lax.select(x if is_bool else x > y, x, y),
        "where_scalar": lambda x, y, s: jnp.where(y if is_bool else y > x, x, s),
        "bcast": lambda x, y, s: jnp.broadcast_to(x[:, None, :], (130, 2, 3)),
        "reshape": lambda x, y, s: x.reshape(3, 130),
        "transpose": lambda x, y, s: x.T,
        "slice": lambda x, y, s: x[1:100:3, 1:],
        "concat": lambda x, y, s: jnp.concatenate([x, y, x[:1]], 0),
        "pad": lambda x, y, s: lax.pad(x, s, [(1, 2, 1), (0, 1, 0)]),
        "rev": lambda x, y, s: x[::-1, ::-1],
        "zero": lambda x, y, s: jnp.concatenate([x[:0], y[:0]], 1),
        "scalar_in": lambda x, y, s: s,
        "tiled": lambda x, y, s: jnp.tile(x, (2, 100)),         # [260, 300]
        "block128": lambda x, y, s: jnp.maximum(t := jnp.tile(x[:64], (2, 86))[:, :256],
                                                t[::-1]),    # [128, 256]
        "iota": lambda x, y, s: lax.broadcasted_iota(jnp.int32 if is_bool else x.dtype,
                                                     (5, 130), 1),
    }
    for name in COMPARES:
        c[name] = (lambda f: lambda x, y, s: f(x, y))(getattr(lax, name))
    for t in types:
        if t != dtype:
            c["to_" + t] = (lambda t: lambda x, y, s: x.astype(npdt(t)))(t)
    if is_bool:
        c.update(any=lambda x, y, s: x.any(0), all=lambda x, y, s: x.all(),
                 and_=lambda x, y, s: x & y, or_=lambda x, y, s: x | y,
                 xor=lambda x, y, s: x ^ y)
        return c
    c.update({
        "add": lambda x, y, s: x + y, "sub": lambda x, y, s: x - y,
        "mul": lambda x, y, s: x * y, "max": lambda x, y, s: jnp.maximum(x, y),
        "min": lambda x, y, s: jnp.minimum(x, y), "abs": lambda x, y, s: jnp.abs(x),
        "sign": lambda x, y, s: jnp.sign(x),
        "clamp": lambda x, y, s: lax.clamp(x[0, 0], y, x[1, 1]),
        "bcast_row": lambda x, y, s: x + y[0], "bcast_col": lambda x, y, s: x + y[:, :1],
        "scalar_add": lambda x, y, s: x * s + y,
    })
    if not dtype.startswith("float8"):
        c.update({"sum0": lambda x, y, s: x.sum(0), "sum_all": lambda x, y, s: x.sum(),
                  "sum_tiled": lambda x, y, s: jnp.tile(x, (2, 100)).sum(1),
                  "prod1": lambda x, y, s: x.prod(1), "prod0": lambda x, y, s: x[:5].prod(0)})
    if not dtype.startswith("float8") and dtype != "uint64":    # uint64 max/min: reduce.py
        c.update({"max1": lambda x, y, s: x.max(1), "min0": lambda x, y, s: x.min(0),
                  "max_tiled": lambda x, y, s: jnp.tile(x, (2, 100)).max(0)})
    if is_float:
        c.update({
            "div": lambda x, y, s: x / y, "exp": lambda x, y, s: jnp.exp(x),
            "tanh": lambda x, y, s: jnp.tanh(x), "floor": lambda x, y, s: jnp.floor(x),
            "round": lambda x, y, s: jnp.round(x), "rem": lambda x, y, s: lax.rem(x, y),
            "sqrt": lambda x, y, s: jnp.sqrt(jnp.abs(x)),
            "pow": lambda x, y, s: lax.pow(jnp.abs(x) + 1, y),
            "isfinite": lambda x, y, s: jnp.isfinite(x / (y - y[0, 0])),
        })
        return c
    bits = 8 * npdt(dtype).itemsize
    top = np.array(1 << (bits - 1), np.uint64).astype(dtype)         # the sign bit
    amount = lambda y: (y % bits).astype(y.dtype)  # noqa: E731
    nonzero = lambda y: jnp.where(y == 0, 1, y).astype(y.dtype)  # noqa: E731
    c.update({
        "and_": lambda x, y, s: x & y, "or_": lambda x, y, s: x | y,
        "xor": lambda x, y, s: x ^ y, "not_": lambda x, y, s: ~x,
        "div": lambda x, y, s: lax.div(x, nonzero(y)),
        "rem": lambda x, y, s: lax.rem(x, nonzero(y)),
        "shl": lambda x, y, s: lax.shift_left(x, amount(y)),
        "shr": lambda x, y, s: lax.shift_right_logical(x, amount(y)),
        "sar": lambda x, y, s: lax.shift_right_arithmetic(x, amount(y)),
        "sar_top_bit": lambda x, y, s: lax.shift_right_arithmetic(x | top, amount(y)),
        "popcnt": lambda x, y, s: lax.population_count(x),
        "clz": lambda x, y, s: lax.clz(x), "cube": lambda x, y, s: x ** 3,
    })
    return c


def compare(name: str, out, ref) -> None:
    out, ref = np.asarray(out), np.asarray(ref)
    assert out.shape == ref.shape and out.dtype == ref.dtype, (name, out.dtype, ref.dtype)
    kind = str(ref.dtype)
    if name in EXACT or not (kind.startswith("float") or kind == "bfloat16"):
        np.testing.assert_array_equal(out.reshape(-1).view(np.uint8),
                                      ref.reshape(-1).view(np.uint8), err_msg=name)
    else:
        assert_close(out, ref, kind)


def run_checks(jax, trn, cpu, dtype: str, types=CONVERT_TO) -> list[str]:
    """Runs every check of `dtype` as one program on trn and on CPU; returns the names
    of the checks that differ."""
    table = checks(dtype, types)
    f = jax.jit(lambda x, y, s: {k: fn(x, y, s) for k, fn in table.items()})
    args = operands(dtype)
    out = f(*(jax.device_put(a, trn) for a in args))
    ref = f(*(jax.device_put(a, cpu) for a in args))
    failed = []
    for name in table:
        try:
            compare(name, out[name], ref[name])
        except AssertionError as e:
            failed.append(f"{name}: {str(e).strip().splitlines()[-1][:160]}")
    return failed


# The default run covers one type of each kind; the CPU reference compiles ~70 ms per
# op, so the other types (and the x64 subprocess) are `slow`.
DEFAULT_TYPES = ("float32", "bfloat16", "float8_e5m2", "uint32", "bool")


@pytest.mark.parametrize("dtype", [t if t in DEFAULT_TYPES else
                                   pytest.param(t, marks=pytest.mark.slow) for t in TYPES])
def test_dtype_conformance(jax, trn, cpu, dtype):
    assert run_checks(jax, trn, cpu, dtype) == []


@pytest.mark.slow
def test_64_bit_integers_and_float64_in_x64():
    code = ("import jax\n"
            "jax.config.update('jax_enable_x64', True)\n"
            "from tests.e2e.test_conformance import run_checks, TYPES\n"
            "trn, cpu = jax.devices('trn')[0], jax.devices('cpu')[0]\n"
            "types = TYPES + ['int64', 'uint64']\n"
            "for dt in ('int64', 'uint64'):\n"
            "    print(dt, run_checks(jax, trn, cpu, dt, types))\n"
            "try:\n"
            "    jax.jit(lambda a: a * 2)(jax.device_put(jax.numpy.ones(3, 'float64'), trn))\n"
            "except Exception as e:\n"
            "    print('float64 error:', 'float64' in str(e))\n")
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-3:] == ["int64 []", "uint64 []",
                                                  "float64 error: True"], r.stdout[-3000:]
