"""Every op lowered so far, against JAX's CPU backend, on shapes that are and are not
multiples of 128, scalars and size-0 dims."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.conftest import assert_close

SHAPES = [(), (0,), (7,), (128,), (130, 3), (3, 0, 2), (256, 384)]
FLOATS = ["float32", "bfloat16"]


def _rand(shape, dtype, rng, lo=-3.0, hi=3.0):
    if dtype.startswith(("int", "uint")):
        return rng.integers(-20 if dtype.startswith("int") else 0, 20, shape).astype(dtype)
    if dtype == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.uniform(lo, hi, shape).astype(np.float32).astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))


def check(jax, trn, cpu, fn, *args, dtype="float32", **tol):
    f = jax.jit(fn)
    out = f(*(jax.device_put(a, trn) for a in args))
    ref = f(*(jax.device_put(a, cpu) for a in args))
    outs, refs = jax.tree.leaves(out), jax.tree.leaves(ref)
    for o, r in zip(outs, refs):
        assert o.shape == r.shape and o.dtype == r.dtype
        assert o.devices() == {trn}
        assert_close(o, r, str(r.dtype) if str(r.dtype) in ("bfloat16", "float16", "float32") else "exact", **tol)


UNARY = {
    "negate": (lambda x: -x, None),
    "abs": (lambda x: abs(x), None),
    "exp": (lambda x: __import__("jax").numpy.exp(x), None),
    "log": (lambda x: __import__("jax").numpy.log(x), (0.1, 5.0)),
    "tanh": (lambda x: __import__("jax").numpy.tanh(x), None),
    "logistic": (lambda x: __import__("jax").nn.sigmoid(x), None),
    "sqrt": (lambda x: __import__("jax").numpy.sqrt(x), (0.0, 9.0)),
    "rsqrt": (lambda x: __import__("jax").lax.rsqrt(x), (0.1, 9.0)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_unary(jax, trn, cpu, name, dtype, shape):
    fn, rng_range = UNARY[name]
    x = _rand(shape, dtype, np.random.default_rng(0), *(rng_range or (-3.0, 3.0)))
    check(jax, trn, cpu, fn, x, rtol=2e-2 if dtype == "bfloat16" else 2e-6,
          atol=2e-2 if dtype == "bfloat16" else 1e-6)


BINARY = {
    "add": lambda a, b: a + b,
    "subtract": lambda a, b: a - b,
    "multiply": lambda a, b: a * b,
    "divide": lambda a, b: a / b,
    "maximum": lambda a, b: __import__("jax").numpy.maximum(a, b),
    "minimum": lambda a, b: __import__("jax").numpy.minimum(a, b),
    "power": lambda a, b: __import__("jax").lax.pow(abs(a) + 0.5, b),
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_binary(jax, trn, cpu, name, dtype, shape):
    rng = np.random.default_rng(1)
    a, b = _rand(shape, dtype, rng), _rand(shape, dtype, rng, 0.5, 3.0)
    check(jax, trn, cpu, BINARY[name], a, b, rtol=2e-2 if dtype == "bfloat16" else 1e-5,
          atol=2e-2 if dtype == "bfloat16" else 1e-6)


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "maximum", "minimum"])
@pytest.mark.parametrize("shape", [(), (7,), (130, 3)], ids=str)
def test_binary_int32(jax, trn, cpu, name, shape):
    rng = np.random.default_rng(2)
    check(jax, trn, cpu, BINARY[name], _rand(shape, "int32", rng), _rand(shape, "int32", rng))


@pytest.mark.parametrize("direction", ["lt", "le", "gt", "ge", "eq", "ne"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_compare_and_select(jax, trn, cpu, direction, dtype):
    import operator
    rng = np.random.default_rng(3)
    a, b = _rand((130, 5), dtype, rng), _rand((130, 5), dtype, rng)
    b[:3] = a[:3]
    cmp = getattr(operator, direction)
    check(jax, trn, cpu, lambda x, y: cmp(x, y), a, b)
    check(jax, trn, cpu, lambda x, y: __import__("jax").numpy.where(cmp(x, y), x, y), a, b)


@pytest.mark.parametrize("src,dst", [("float32", "bfloat16"), ("bfloat16", "float32"),
                                     ("float32", "int32"), ("int32", "float32"),
                                     ("float32", "float16"), ("int32", "bfloat16")])
def test_convert(jax, trn, cpu, src, dst):
    x = _rand((257,), src, np.random.default_rng(4), -50.0, 50.0)
    target = np.dtype(getattr(ml_dtypes, dst, dst))
    check(jax, trn, cpu, lambda a: a.astype(target), x)


@pytest.mark.parametrize("shape,out,dims", [((), (4, 3), ()), ((3,), (5, 3), (1,)),
                                            ((3,), (3, 130), (0,)), ((2, 1), (2, 7), (0, 1))])
def test_broadcast_in_dim(jax, trn, cpu, shape, out, dims):
    x = _rand(shape, "float32", np.random.default_rng(5))
    check(jax, trn, cpu, lambda a: __import__("jax").lax.broadcast_in_dim(a, out, dims), x)


@pytest.mark.parametrize("shape,perm", [((3, 4), (1, 0)), ((130, 200), (1, 0)),
                                        ((2, 3, 4), (2, 0, 1)), ((0, 3), (1, 0))])
def test_transpose_and_reshape(jax, trn, cpu, shape, perm):
    x = _rand(shape, "bfloat16", np.random.default_rng(6))
    check(jax, trn, cpu, lambda a: a.transpose(perm), x)
    check(jax, trn, cpu, lambda a: a.reshape(-1), x)


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("shape,axes", [((7,), (0,)), ((130, 3), (0,)), ((130, 3), (1,)),
                                        ((4, 600), None), ((2, 3, 5), (0, 2)), ((3, 0), (1,))])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_reduce(jax, trn, cpu, op, shape, axes, dtype):
    import jax.numpy as jnp
    if op != "sum" and 0 in shape:
        pytest.skip("max/min of an empty axis")
    x = _rand(shape, dtype, np.random.default_rng(7))
    check(jax, trn, cpu, lambda a: getattr(jnp, op)(a, axis=axes), x,
          rtol=2e-2 if dtype == "bfloat16" else 1e-5, atol=2e-2 if dtype == "bfloat16" else 1e-5)


@pytest.mark.parametrize("lhs,rhs,dims", [
    ((512, 1024), (1024, 256), "ij,jk->ik"),
    ((130, 200), (200, 70), "ij,jk->ik"),
    ((2, 130, 200), (2, 200, 70), "bij,bjk->bik"),
    ((7,), (7,), "i,i->"),
    ((5, 3), (4, 3), "ij,kj->ik"),
    ((3, 4, 5), (5, 4, 6), "abc,cbd->ad"),
])
def test_dot_general_bf16(jax, trn, cpu, lhs, rhs, dims):
    import jax.numpy as jnp
    rng = np.random.default_rng(8)
    a, b = _rand(lhs, "bfloat16", rng), _rand(rhs, "bfloat16", rng)
    check(jax, trn, cpu, lambda x, y: jnp.einsum(dims, x, y), a, b, rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("lhs,rhs,dims", [
    ((128, 128), (512, 128), "ik,jk->ij"),        # rhs stored [N, K]: TensorE-transposed
    ((130, 200), (700, 200), "ik,jk->ij"),
    ((64, 300), (2000, 300), "ik,jk->ij"),
    ((300, 520), (300, 130), "ki,kj->ij"),        # lhs stored [K, M]
    ((2, 520, 96), (2, 600, 96), "bik,bjk->bij"),
])
def test_dot_general_transposed_operands_f32_highest(jax, trn, cpu, lhs, rhs, dims):
    """Operands whose K axis is contiguous are staged in SBUF and transposed on TensorE
    in 128-row chunks; wide ones wrap the staging ring."""
    import jax.numpy as jnp
    rng = np.random.default_rng(13)
    a, b = _rand(lhs, "float32", rng), _rand(rhs, "float32", rng)
    with jax.default_matmul_precision("highest"):
        check(jax, trn, cpu, lambda x, y: jnp.einsum(dims, x, y), a, b, rtol=1e-5, atol=2e-4)


def test_dot_general_f32_highest(jax, trn, cpu):
    rng = np.random.default_rng(9)
    a, b = _rand((130, 300), "float32", rng), _rand((300, 70), "float32", rng)
    with jax.default_matmul_precision("highest"):
        check(jax, trn, cpu, lambda x, y: x @ y, a, b, rtol=1e-5, atol=1e-4)


def test_dot_general_f32_default_uses_bf16_operands(jax, trn):
    rng = np.random.default_rng(10)
    a, b = _rand((64, 96), "float32", rng), _rand((96, 32), "float32", rng)
    out = np.asarray(jax.jit(lambda x, y: x @ y)(jax.device_put(a, trn), jax.device_put(b, trn)))
    bf = lambda x: x.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_allclose(out, bf(a) @ bf(b), rtol=1e-5, atol=1e-4)
    assert not np.allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-6, atol=1e-6)


def test_constant_and_iota(jax, trn, cpu):
    import jax.numpy as jnp
    c = np.arange(300, dtype=np.float32).reshape(3, 100) * 0.5
    x = _rand((3, 100), "float32", np.random.default_rng(11))
    check(jax, trn, cpu, lambda a: a + c, x)
    check(jax, trn, cpu, lambda a: a + jnp.arange(100, dtype=jnp.float32), x)
    check(jax, trn, cpu, lambda a: a * 2.5 + 1.0, x)


@pytest.mark.parametrize("src,dst", [("float32", "uint32"), ("float32", "uint8"),
                                     ("bfloat16", "int16"), ("uint8", "float32"),
                                     ("int32", "float32")])
def test_bitcast_convert_is_bit_exact(jax, trn, cpu, src, dst):
    import jax.numpy as jnp
    ratio = np.dtype(getattr(ml_dtypes, dst, dst)).itemsize // np.dtype(getattr(ml_dtypes, src, src)).itemsize
    x = _rand((130, 8) + ((ratio,) if ratio > 1 else ()), src, np.random.default_rng(12))
    f = jax.jit(lambda a: jax.lax.bitcast_convert_type(a, jnp.dtype(getattr(ml_dtypes, dst, dst))))
    out, ref = np.asarray(f(jax.device_put(x, trn))), np.asarray(f(jax.device_put(x, cpu)))
    assert out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_array_equal(out.view(np.uint8), ref.view(np.uint8))


def test_int64_arithmetic(jax, trn, cpu):
    """Trn2/Trn3 have native INT64 (trainium-hardware.md §4); it runs on GpSimd."""
    with jax.enable_x64(True):
        a = np.array([2**40 + 3, -7, 2**62, 5], np.int64)
        b = np.array([9, 2**33, -1, -5], np.int64)
        check(jax, trn, cpu, lambda x, y: x * 3 + y - (x ^ y), a, b)


def test_random_bits_match_cpu(jax, trn, cpu):
    """threefry2x32 (uint32 arithmetic, shifts, xor, a uint64 seed constant, bitcasts)."""
    def sample(dev):
        with jax.default_device(dev):
            k1, k2 = jax.random.split(jax.random.key(4))
            return [np.asarray(v) for v in (jax.random.bits(jax.random.key(1), (300,)),
                                            jax.random.uniform(jax.random.key(2), (7, 5)),
                                            jax.random.randint(jax.random.key(3), (9,), 0, 100),
                                            jax.random.normal(k1, (130,)),
                                            jax.random.key_data(k2))]
    for a, b in zip(sample(trn), sample(cpu)):
        if a.dtype == np.float32 and a.shape == (130,):      # normal: erf_inv within ~1 ulp
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("config", [
    [(1, 2, 0), (0, 3, 0)], [(-2, -1, 0), (3, -4, 0)], [(1, 2, 1), (0, 1, 2)],
    [(-3, -2, 1), (-1, 4, 2)], [(2, -5, 3), (-6, -1, 1)], [(-4, 0, 1), (0, -9, 2)]])
def test_pad_edge_interior_and_negative(jax, trn, cpu, config):
    x = np.random.default_rng(7).normal(size=(6, 130)).astype(np.float32)
    check(jax, trn, cpu, lambda x: jax.lax.pad(x, np.float32(0.5), config), x)


def test_64_bit_integer_reductions_past_the_int32_range():
    from tests.conftest import run_python
    code = open(__file__.replace("test_ops.py", "_i64_reductions.py")).read()
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True"] * 5 + ["uint64-max-error"], r.stdout


def test_legacy_float8_e4m3_transfers_converts_and_multiplies(jax, trn, cpu):
    """The FP8 e4m3 of Trn1/Trn2 (ml_dtypes float8_e4m3; OCP e4m3fn is v4's), §2.2."""
    jnp = jax.numpy
    r = np.random.default_rng(0)
    a = r.normal(size=(256, 256)).astype(ml_dtypes.float8_e4m3)
    b = r.normal(size=(256, 128)).astype(ml_dtypes.float8_e4m3)
    check(jax, trn, cpu, lambda a, b: (jnp.dot(a, b, preferred_element_type=jnp.float32),
                                       (a.astype(jnp.float32) * 2 + 1).astype(a.dtype),
                                       a.astype(jnp.bfloat16)), a, b, rtol=0, atol=0)
