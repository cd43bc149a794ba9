"""Integers are exact two's-complement arithmetic that wraps, as XLA computes them: dots,
reductions, cumulative ops, scatter-add and elementwise math against the CPU backend,
over the full range of every width; and the compiled programs do their integer
arithmetic where the hardware does it exactly (GpSimd's integer ALU, §2.5; VectorE and
ScalarE compute in FP32, §2.3/§2.4; TensorE accumulates FP32, §2.2)."""
from __future__ import annotations

import io

import numpy as np
import pytest

from jax_trn.hw import isa
from jax_trn.hw.spec import CHIPS

WIDTHS = ["int8", "uint8", "int16", "uint16", "int32", "uint32"]


def full_range(shape, dtype, seed=0):
    info = np.iinfo(dtype)
    x = np.random.default_rng(seed).integers(info.min, info.max, shape, dtype=dtype,
                                             endpoint=True)
    x.reshape(-1)[:2] = (info.min, info.max)[:x.size]
    return x


def check(jax, trn, cpu, fn, *args):
    f = jax.jit(fn)
    got = f(*(jax.device_put(a, trn) for a in args))
    want = f(*(jax.device_put(a, cpu) for a in args))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    return got


# --- the examples of issue 12 -------------------------------------------------------------

@pytest.mark.parametrize("x, y, dtype", [
    ([[16777217]], [[1]], "int32"),            # FP32 gave 16777216
    ([[100000]], [[100000]], "int32"),         # FP32 gave 2147483647, XLA wraps
    ([[100, 100]], [[100], [100]], "int8"),    # FP32 gave 127, XLA wraps to 32
])
def test_issue_dot_examples(jax, trn, cpu, x, y, dtype):
    check(jax, trn, cpu, lambda a, b: a @ b, np.array(x, dtype), np.array(y, dtype))


def test_issue_elementwise_example(jax, trn, cpu):
    out = check(jax, trn, cpu, lambda a, b: a * b, np.int32([100000]), np.int32([100000]))
    assert int(out[0]) == 1410065408


# --- dot_general ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", WIDTHS)
def test_dot_full_range(jax, trn, cpu, dtype):
    a, b = full_range((130, 300), dtype, 1), full_range((300, 70), dtype, 2)
    check(jax, trn, cpu, lambda a, b: a @ b, a, b)
    check(jax, trn, cpu, lambda a, b: a @ b.T, a, np.ascontiguousarray(b.T))


@pytest.mark.parametrize("dtype, result", [("int8", "int32"), ("uint8", "uint32"),
                                           ("int16", "int32"), ("uint16", "uint32")])
def test_dot_preferred_wider_result(jax, trn, cpu, dtype, result):
    a, b = full_range((64, 200), dtype, 3), full_range((200, 96), dtype, 4)
    check(jax, trn, cpu, lambda a, b: jax.lax.dot(a, b, preferred_element_type=result), a, b)


def test_dot_large_k(jax, trn, cpu):
    """K = 5000: int8 sums of 1024 products reach 2**24 (one FP32 group each), int32
    takes K blocks."""
    lo = np.full((8, 5000), -128, np.int8)
    check(jax, trn, cpu, lambda a, b: jax.lax.dot(a, b, preferred_element_type="int32"),
          lo, np.ascontiguousarray(lo.T))
    check(jax, trn, cpu, lambda a, b: a @ b, full_range((40, 5000), "int32", 5),
          full_range((5000, 30), "int32", 6))


def test_batched_and_inner_products(jax, trn, cpu):
    a, b = full_range((3, 40, 50), "int32", 7), full_range((3, 50, 20), "int32", 8)
    check(jax, trn, cpu, lambda a, b: a @ b, a, b)
    check(jax, trn, cpu, lambda a, b: (a * 1 @ b.transpose(0, 2, 1)[..., :1]), a,
          full_range((3, 20, 50), "int32", 9))
    check(jax, trn, cpu, lambda a, b: jax.numpy.einsum("bk,bk->b", a, b),
          full_range((300, 70), "int32", 10), full_range((300, 70), "int32", 11))


def test_dot_with_fused_elementwise(jax, trn, cpu):
    check(jax, trn, cpu, lambda a, b: (a @ b) % 7 + 1, full_range((64, 80), "int32", 12),
          full_range((80, 48), "int32", 13))


# --- elementwise ---------------------------------------------------------------------------

ELEMENTWISE = {
    "add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
    "div": lambda a, b: a // (b | 1), "rem": lambda a, b: a % (b | 1),
    "shift_left": lambda a, b: a << (b & 7), "shift_right": lambda a, b: a >> (b & 7),
    "negate": lambda a, b: -a, "max": lambda a, b: a > b, "square_plus": lambda a, b: a * a + b,
}


@pytest.mark.parametrize("dtype", WIDTHS)
def test_elementwise_wraps(jax, trn, cpu, dtype):
    a, b = full_range((5, 130), dtype, 14), full_range((5, 130), dtype, 15)
    check(jax, trn, cpu, lambda a, b: {k: f(a, b) for k, f in ELEMENTWISE.items()}, a, b)


# --- reductions and cumulative ops ---------------------------------------------------------

def test_sum_near_2_31(jax, trn, cpu):
    x = np.full((300, 130), 2 ** 31 // 20000 + 3, np.int32)     # sums wrap past 2**31
    check(jax, trn, cpu, lambda x: (x.sum(), x.sum(0), x.sum(1)), x)
    check(jax, trn, cpu, lambda x: x.sum(), np.int32([2 ** 30, 2 ** 30, 16777217]))


@pytest.mark.parametrize("dtype", WIDTHS)
def test_reductions_full_range(jax, trn, cpu, dtype):
    x = full_range((200, 300), dtype, 16)
    jnp = jax.numpy
    check(jax, trn, cpu, lambda x: (jnp.sum(x, 0, dtype=x.dtype), jnp.sum(x, 1, dtype=x.dtype),
                                    x.max(0), x.min(1), x.max(), x.min(),
                                    jnp.prod(x[:, :7], 1, dtype=x.dtype),
                                    jnp.prod(x[:9], 0, dtype=x.dtype),
                                    jnp.prod(x[:3, :5], dtype=x.dtype)), x)


def test_max_min_tell_apart_neighbours_above_2_24(jax, trn, cpu):
    x = np.int32([[16777217, 16777216, -16777217, -16777216]] * 3)
    check(jax, trn, cpu, lambda x: (x.max(1), x.min(1), x.max(0), jax.numpy.argmax(x, 1)), x)


def test_cumulative_ops(jax, trn, cpu):
    lax, jnp = jax.lax, jax.numpy
    x = full_range((20, 3000), "int32", 17)
    check(jax, trn, cpu, lambda x: (jnp.cumsum(x, 1), jnp.cumsum(x, 0), jnp.cumprod(x[:, :50], 1),
                                    lax.cummax(x, 1), lax.cummin(x, 0, reverse=True)), x)
    check(jax, trn, cpu, jnp.cumsum, np.full(50000, 2 ** 24 + 1, np.int32))   # one long line


# --- scatter-add ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", WIDTHS)
def test_scatter_add_repeated_indices(jax, trn, cpu, dtype):
    rng = np.random.default_rng(18)
    check(jax, trn, cpu, lambda x, i, v: x.at[i].add(v), full_range((20, 33), dtype, 19),
          rng.integers(0, 20, 300), full_range((300, 33), dtype, 20))


def test_scatter_add_examples(jax, trn, cpu):
    jnp, rng = jax.numpy, np.random.default_rng(21)
    check(jax, trn, cpu, lambda x, i, v: x.at[i].add(v), np.zeros(4, np.int32),
          np.array([1, 1, 2]), np.int32([2 ** 30, 2 ** 30, 16777217]))
    check(jax, trn, cpu, lambda x, i, v: x.at[i].add(v, mode="drop"),
          full_range(10, "int32", 22), np.array([0, 12, 3, -1, 3]), full_range(5, "int32", 23))
    check(jax, trn, cpu, lambda i: jnp.bincount(i, length=10), rng.integers(0, 10, 5000))
    check(jax, trn, cpu, lambda v, i: jax.ops.segment_sum(v, i, 7),
          full_range(400, "int32", 24), rng.integers(0, 7, 400))


def test_scatter_add_more_updates_than_one_byte_plane_holds(jax, trn, cpu):
    """70000 x 255 > 2**24: the positions go in two batches."""
    i = np.random.default_rng(25).integers(0, 3, 70000)
    check(jax, trn, cpu, lambda x, i, v: x.at[i].add(v), np.zeros(3, np.int32), i,
          np.full(70000, 255, np.int32))


# --- 64-bit under jax_enable_x64 -----------------------------------------------------------

I64 = """
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np, jax.numpy as jnp
t, c = jax.devices("trn")[0], jax.devices("cpu")[0]
rng = np.random.default_rng(0)
def full(shape, dt):
    i = np.iinfo(dt)
    return rng.integers(i.min, i.max, shape, dtype=dt, endpoint=True)
x, y, u, w = full((70, 150), "int64"), full((150, 40), "int64"), full((70, 150), "uint64"), \\
    full((70, 150), "int32")
cases = [(lambda a, b: a @ b, x, y), (lambda a, b: a @ b, u, u.T.copy()),
         (lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.int64), w, w.T.copy()),
         (lambda a: a.sum(0), x), (lambda a: jnp.cumsum(a, 1), x),
         (lambda a, i, v: a.at[i].add(v), full(20, "int64"), rng.integers(0, 20, 300),
          full(300, "int64")), (lambda a, b: a * b, x, x[::-1].copy())]
for f, *args in cases:
    got = np.asarray(jax.jit(f)(*[jax.device_put(a, t) for a in args]))
    want = np.asarray(jax.jit(f)(*[jax.device_put(a, c) for a in args]))
    print(got.dtype == want.dtype and np.array_equal(got, want))
"""


def test_64_bit_under_x64():
    from tests.conftest import run_python
    r = run_python(I64)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True"] * 7, r.stdout


# --- where the integer arithmetic runs -----------------------------------------------------

WIDE = {"int32", "uint32", "int64", "uint64"}
BITVEC = {"bitwise_and", "bitwise_or", "bitwise_xor", "shift_left", "shift_right_logical",
          "shift_right_arithmetic"}


OWN = ("dot_general", "reduce", "scatter")   # kernels of these ops (and their fusions)


def fp32_hazards(program) -> list[tuple]:
    """VectorE / ScalarE arithmetic (an ALU op other than a bitvec one, §6.2: VectorE's
    own) reading 32- or 64-bit integers: on the hardware it would round through FP32
    above 2**24 (§2.3). Copies count as data movement, as relayout.py's transposes
    treat them. Kernels of the ops above only."""
    out = []
    for k in (k for k in program.kernels if k.name.split(".")[0].startswith(OWN)):
        for i in k.instructions:
            ins = [v for f, v in vars(i).items() if isinstance(v, isa.Tile)
                   and f not in ("dst", "reduce_res")]
            ops = {getattr(i, a) for a in ("op", "op0", "op1") if getattr(i, a, None)}
            if getattr(i, "engine", None) in ("vector", "scalar") and ops - BITVEC \
                    and any(t.dtype in WIDE for t in ins):
                out.append((k.name, type(i).__name__, i.engine, tuple(sorted(ops))))
    return out


def compile_for(jax, fn, *args, gen="trn2"):
    import hlo_passes
    from jax_trn.lower import lower_module
    module = jax.jit(fn).trace(*args).lower(lowering_platforms=("trn",)).compiler_ir(
        "stablehlo")
    buf = io.BytesIO()
    module.operation.write_bytecode(file=buf)
    return lower_module(hlo_passes.compile_to_ir(buf.getvalue()), CHIPS[gen].core)


@pytest.mark.parametrize("gen", ["trn1", "trn2"])
@pytest.mark.parametrize("name", ["dot", "dot_t", "sum", "sum0", "max", "min0", "prod",
                                  "cumsum", "cumsum_long", "cummax", "scatter_add"])
def test_integer_arithmetic_runs_where_it_is_exact(jax, name, gen):
    jnp = jax.numpy
    x, i = np.zeros((130, 300), np.int32), np.zeros(50, np.int32)
    fns = {"dot": lambda x: x @ x.T, "dot_t": lambda x: x.T @ x, "sum": jnp.sum,
           "sum0": lambda x: x.sum(0), "max": jnp.max, "min0": lambda x: x.min(0),
           "prod": lambda x: jnp.prod(x, 1), "cumsum": lambda x: jnp.cumsum(x, 1),
           "cumsum_long": lambda x: jnp.cumsum(x.reshape(-1)),
           "cummax": lambda x: jax.lax.cummax(x, 0),
           "scatter_add": lambda x: x.at[i].add(x[:50])}
    assert fp32_hazards(compile_for(jax, fns[name], x, gen=gen)) == []
