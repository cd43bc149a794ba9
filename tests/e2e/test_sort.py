"""sort / argsort / top_k / unique on trn against the CPU backend, bit for bit: 1-D and
2-D along each axis, descending, several operands and keys, stable ties, NaN / -0 / inf
in JAX's total order, integer types incl. int64 / uint32, bool, bf16, edge sizes, and
an unrecognised comparator as a compile-time error."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hlo_passes import ir
from jax_trn.lower import LoweringError
from jax_trn.lower.sortkeys import keys
from tests.lower.irbuild import FnBuilder


def _same(jax, trn, cpu, fn, *xs):
    f = jax.jit(fn)
    out = f(*[jax.device_put(x, trn) for x in xs])
    ref = f(*[jax.device_put(x, cpu) for x in xs])
    out, ref = jax.tree.leaves(out), jax.tree.leaves(ref)
    for o, r in zip(out, ref):
        assert o.devices() == {trn}
        assert o.shape == r.shape and o.dtype == r.dtype
        o, r = np.asarray(o), np.asarray(r)     # bit-exact: NaN payloads and -0 included
        np.testing.assert_array_equal(o.view(f"u{o.itemsize}") if o.dtype != bool else o,
                                      r.view(f"u{r.itemsize}") if r.dtype != bool else r)


def _special(n, rng):
    x = rng.standard_normal(n).astype(np.float32)
    x[rng.random(n) < 0.2] = np.nan
    x[rng.random(n) < 0.1] = -0.0
    x[rng.random(n) < 0.1] = 0.0
    x[rng.random(n) < 0.05] = np.inf
    x[rng.random(n) < 0.05] = -np.inf
    x[:3] = [-np.nan, 1.5, 1.5]
    return x


@pytest.mark.parametrize("shape, axis", [((13,), 0), ((6, 37), 0), ((6, 37), 1),
                                         ((3, 5, 4), 1), ((130, 9), 1),
                                         ((40, 33), 0), ((2, 20, 17), 1)])   # transposed
def test_sort_argsort_along_each_axis(jax, trn, cpu, shape, axis):
    jnp = jax.numpy
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    _same(jax, trn, cpu, lambda x: jnp.sort(x, axis=axis), x)
    _same(jax, trn, cpu, lambda x: jnp.argsort(x, axis=axis), x)


def test_descending_and_nan_total_order(jax, trn, cpu):
    jnp = jax.numpy
    x = _special(50, np.random.default_rng(1))
    for fn in (jnp.sort, jnp.argsort, lambda x: jnp.sort(x, descending=True),
               lambda x: jnp.argsort(x, descending=True, stable=True)):
        _same(jax, trn, cpu, fn, x)


def test_stable_ties_and_multiple_operands(jax, trn, cpu):
    jnp, lax = jax.numpy, jax.lax
    rng = np.random.default_rng(2)
    a = rng.integers(-3, 3, (4, 50)).astype(np.int32)
    b = rng.integers(0, 4, (4, 50)).astype(np.int32)
    v = rng.standard_normal((4, 50)).astype(np.float32)
    _same(jax, trn, cpu, lambda a: jnp.argsort(a, axis=1, stable=True), a)
    _same(jax, trn, cpu, lambda a, b, v: lax.sort((a, b, v), num_keys=1), a, b, v)
    _same(jax, trn, cpu, lambda a, b, v: lax.sort((a, b, v), dimension=0, num_keys=2), a, b, v)
    _same(jax, trn, cpu, lambda a, v: jnp.lexsort((v, a), axis=1), a, v)


@pytest.mark.parametrize("k", [1, 5, 64])
def test_top_k(jax, trn, cpu, k):
    x = np.random.default_rng(k).standard_normal((32, 1000)).astype(np.float32)
    x[:, 7] = x[:, 8]                           # ties: the smaller index first
    _same(jax, trn, cpu, lambda x: jax.lax.top_k(x, k), x)


def test_top_k_nan_and_signed_zero(jax, trn, cpu):
    x = _special(40, np.random.default_rng(3))
    _same(jax, trn, cpu, lambda x: jax.lax.top_k(x, 12), x)


@pytest.mark.parametrize("dtype", ["int8", "int32", "uint8", "uint32", "bool", "bfloat16",
                                   "float16"])
def test_sort_dtypes(jax, trn, cpu, dtype):
    jnp = jax.numpy
    rng = np.random.default_rng(4)
    if dtype == "bool":
        x = rng.random((3, 21)) < 0.5
    elif dtype in ("bfloat16", "float16"):
        x = np.where(rng.random((3, 21)) < 0.1, np.nan, rng.standard_normal((3, 21)))
        x = x.astype(getattr(ml_dtypes, dtype, dtype))
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, (3, 21), dtype=dtype, endpoint=True)
        x[0, :2] = [info.min, info.max]
    _same(jax, trn, cpu, lambda x: jnp.sort(x, axis=1), x)
    _same(jax, trn, cpu, lambda x: jnp.argsort(x, axis=0), x)


@pytest.mark.parametrize("dtype", ["int64", "uint64"])
def test_sort_64_bit_integers(jax, trn, cpu, dtype):
    rng = np.random.default_rng(5)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, 40, dtype=dtype, endpoint=True)
    x[:6] = [info.min, info.max, 2 ** 32, 2 ** 32 - 1, 2 ** 31, 1]
    with jax.enable_x64(True):
        _same(jax, trn, cpu, jax.numpy.sort, x)
        _same(jax, trn, cpu, jax.numpy.argsort, x)


def test_edge_sizes_and_unique(jax, trn, cpu):
    jnp = jax.numpy
    _same(jax, trn, cpu, lambda x: jnp.sort(x, axis=1), np.zeros((3, 0), np.float32))
    _same(jax, trn, cpu, lambda x: jnp.sort(x, axis=1), np.float32([[3], [1], [2]]))
    _same(jax, trn, cpu, lambda x: jnp.argsort(x, axis=0), np.float32([[3, 1, 2]]))
    x = np.random.default_rng(6).integers(0, 6, 30).astype(np.int32)
    _same(jax, trn, cpu, lambda x: jnp.unique(x, size=8, fill_value=-1), x)


def test_few_long_lines_fold_onto_partitions(jax, trn, cpu):
    """4 or 8 lines of 300-700: each line is cut into segments on more partitions."""
    jnp, lax = jax.numpy, jax.lax
    rng = np.random.default_rng(8)
    x = np.stack([_special(700, rng) for _ in range(4)])
    _same(jax, trn, cpu, lambda x: jnp.sort(x, axis=1), x)
    _same(jax, trn, cpu, lambda x: jnp.argsort(x, axis=1, descending=True), x)
    a = rng.integers(-5, 5, (8, 300)).astype(np.int32)
    b = rng.standard_normal((8, 300)).astype(np.float32)
    _same(jax, trn, cpu, lambda a, b: lax.sort((a, b), dimension=1, num_keys=2), a, b)
    _same(jax, trn, cpu, lambda b: lax.top_k(b, 7), b)


def test_long_axis_folded_with_hbm_steps(jax, trn, cpu):
    """Lines too long for SBUF whole: folded on chip, the long-distance steps through
    HBM."""
    rng = np.random.default_rng(7)
    _same(jax, trn, cpu, jax.numpy.argsort, _special(5000, rng))
    _same(jax, trn, cpu, lambda x: jax.numpy.sort(x, axis=0),
          rng.integers(-9, 9, (4100, 3)).astype(np.int32))


@pytest.mark.slow
def test_many_long_lines_network_through_hbm(jax, trn, cpu):
    """Many long lines: every compare-exchange step round-trips through HBM (~15 s)."""
    x = np.random.default_rng(8).standard_normal((70, 4100)).astype(np.float32)
    _same(jax, trn, cpu, lambda x: jax.numpy.argsort(x, axis=1), x)


def _sort_op(body):
    """A one-operand float32 sort whose comparator is `body(b, x, y)`."""
    b = FnBuilder()
    x, y = (ir.Value(ir.TensorType((), "float32")) for _ in range(2))
    inner = FnBuilder()
    res = body(inner, x, y)
    region = ir.Region([ir.Block([x, y], [*inner.ops, ir.Op("return", [res], [])])])
    arg = b.arg((8,))
    b.op("sort", [arg], (8,), "float32", regions=[region], dimension=0, is_stable=True)
    return b.ops[-1]


def test_comparators_recognised_or_rejected():
    def lt(b, x, y, direction="LT"):
        return b.op("compare", [x, y], (), "bool", comparison_direction=direction,
                    compare_type="TOTALORDER")
    k, = keys(_sort_op(lt))
    assert (k.operand, k.descending, k.order) == (0, False, "total")
    k, = keys(_sort_op(lambda b, x, y: lt(b, y, x)))
    assert k.descending
    with pytest.raises(LoweringError, match=r"sort comparator.*stablehlo.sort\(float32\[8\]\)"):
        keys(_sort_op(lambda b, x, y: lt(b, b.op("negate", [x], (), "float32"), y)))
    with pytest.raises(LoweringError, match="sort comparator"):
        keys(_sort_op(lambda b, x, y: lt(b, x, y, "LE")))


# --- top_k through max8 / find_index8 / match_replace8 (jax_trn/lower/topk.py) ----------

def _top_k_path(jax, fn, x) -> str:
    """Which kernel `fn`'s top_k became: "top_k" (topk.py) or "sort" (sort + slice)."""
    text = jax.jit(fn).lower(x).compile().as_text()
    paths = [p for p in ("top_k", "sort") if f": {p} at " in text]
    assert len(paths) == 1, text
    return paths[0]


def _ties_and_specials(shape, dtype, rng):
    """Values of `dtype` with many ties, and for floats NaN (both signs), +-0, +-inf."""
    if dtype in ("int8", "int32", "uint8", "uint32", "int16", "uint16"):
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        x[..., ::3] = info.max                       # ties at the top
        x[..., 1::7] = info.min
        return x
    x = rng.integers(-3, 4, shape).astype(np.float32)          # ties
    x = np.where(rng.random(shape) < 0.5, x, rng.standard_normal(shape).astype(np.float32))
    for value, frac in ((np.nan, 0.05), (-np.nan, 0.03), (-0.0, 0.1), (0.0, 0.1),
                        (np.inf, 0.03), (-np.inf, 0.03)):
        x[rng.random(shape) < frac] = value
    return x.astype(getattr(ml_dtypes, dtype, dtype))


@pytest.mark.parametrize("k", [1, 5, 8, 9, 20])
def test_top_k_rounds_of_max8(jax, trn, cpu, k):
    """k <= 8: one max8 round; more: rounds with match_replace8; 200 rows (2 groups of
    partitions, the second partial)."""
    x = np.random.default_rng(10 + k).standard_normal((200, 37)).astype(np.float32)
    x[:, 3] = x[:, 30]                               # ties: the smaller index first
    fn = lambda x: jax.lax.top_k(x, k)               # noqa: E731
    _same(jax, trn, cpu, fn, x)
    assert _top_k_path(jax, fn, jax.device_put(x, trn)) == "top_k"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "int32", "uint32",
                                   "int8", "uint16"])
@pytest.mark.parametrize("n", [50, 150])     # 32-bit ranks on VectorE / TensorE
def test_top_k_dtypes_ties_nan_signed_zero(jax, trn, cpu, dtype, n):
    x = _ties_and_specials((3, 4, n), dtype, np.random.default_rng(11))  # a 3-D batch
    for k in (3, 12):
        _same(jax, trn, cpu, lambda x: jax.lax.top_k(x, k), x)
    assert _top_k_path(jax, lambda x: jax.lax.top_k(x, 3), jax.device_put(x, trn)) == "top_k"


def test_top_k_short_lines_and_all_equal(jax, trn, cpu):
    rng = np.random.default_rng(12)
    _same(jax, trn, cpu, lambda x: jax.lax.top_k(x, 3), rng.standard_normal((5, 4))
          .astype(np.float32))                       # lines < 8: padded with -inf keys
    _same(jax, trn, cpu, lambda x: jax.lax.top_k(x, 10), np.zeros((4, 30), np.float32))
    x = np.float32([[np.nan, -np.nan, np.inf, -0.0, 0.0, -np.inf, 1, np.nan]])
    x[0, 7] = np.frombuffer(np.uint32(0x7FC00001).tobytes(), np.float32)[0]  # a payload
    _same(jax, trn, cpu, lambda x: jax.lax.top_k(x, 8), x)


def test_top_k_many_short_lines_several_per_partition(jax, trn, cpu):
    """1000 lines of 20: 7 lines per partition in one block, then 104 lines; a 16-bit
    and an integer case (the values rebuilt from keys) and a float32 one (gathered)."""
    rng = np.random.default_rng(15)
    x = rng.standard_normal((1000, 20)).astype(np.float32)
    x[::5, 4] = x[::5, 11]
    _same(jax, trn, cpu, lambda x: jax.lax.top_k(x, 3), x)
    _same(jax, trn, cpu, lambda x: jax.lax.top_k(x, 10), x.astype(ml_dtypes.bfloat16))
    _same(jax, trn, cpu, lambda x: jax.lax.top_k(x, 2),
          rng.integers(-4, 4, (600, 16)).astype(np.int8))


def test_top_k_outside_the_fast_path_is_a_sort(jax, trn, cpu):
    """k > 64 and 64-bit keys keep the sort + slice (still exact)."""
    x = np.random.default_rng(13).standard_normal((4, 100)).astype(np.float32)
    fn = lambda x: jax.lax.top_k(x, 70)              # noqa: E731
    _same(jax, trn, cpu, fn, x)
    assert _top_k_path(jax, fn, jax.device_put(x, trn)) == "sort"


def test_approx_max_k_runs_as_the_exact_top_k(jax, trn, cpu):
    """approx_max_k (custom_call @ApproxTopK, the fallback form) becomes top_k: equal
    to CPU's where values are distinct; with ties (bf16) CPU orders equal values
    arbitrarily, so only the values and that the indices point at them are compared."""
    lax = jax.lax
    x = np.random.default_rng(14).standard_normal((3, 32, 100)).astype(np.float32)
    fn = lambda x: lax.approx_max_k(x, 5)            # noqa: E731
    _same(jax, trn, cpu, fn, x)
    assert _top_k_path(jax, fn, jax.device_put(x, trn)) == "top_k"
    xb = x.astype(ml_dtypes.bfloat16)
    f = jax.jit(lambda x: lax.approx_max_k(x, 9))
    (v, i), (rv, _) = f(jax.device_put(xb, trn)), f(jax.device_put(xb, cpu))
    np.testing.assert_array_equal(np.asarray(v), np.asarray(rv))
    np.testing.assert_array_equal(np.take_along_axis(xb, np.asarray(i), -1), np.asarray(v))
