"""reverse, reduce_precision, rng_bit_generator (Philox, Threefry, jax.random on rbg
keys), partition_id / replica_id and custom_call errors (jax_trn/lower/slicing.py,
misc.py), against JAX's CPU backend."""
from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from tests.conftest import assert_close, run_python

REVERSE_CASES = [((7,), (0,)), ((301,), (0,)), ((5, 7), (0,)), ((5, 7), (1,)),
                 ((5, 7), (0, 1)), ((130, 3), (0,)), ((3, 4, 5), (1,)), ((3, 4, 5), (0, 2)),
                 ((2, 600), (1,)), ((4, 1, 3), (1, 2)), ((), ()), ((0, 3), (1,))]


def _bits_equal(out, ref):
    out, ref = np.asarray(out), np.asarray(ref)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_array_equal(out.reshape(-1).view(np.uint8), ref.reshape(-1).view(np.uint8))


def _run(jax, trn, cpu, fn, *args):
    f = jax.jit(fn)
    out = f(*(jax.device_put(a, trn) for a in args))
    assert jax.tree.leaves(out)[0].devices() == {trn}
    return out, f(*(jax.device_put(a, cpu) for a in args))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8", "bool"])
def test_reverse_bit_exact(jax, trn, cpu, dtype):
    """Every case of REVERSE_CASES in one program per dtype."""
    rng = np.random.default_rng(0)
    xs = [rng.uniform(-100, 100, shape).astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))
          for shape, _ in REVERSE_CASES]
    fn = lambda *a: [jax.lax.rev(x, d) for x, (_, d) in zip(a, REVERSE_CASES)]  # noqa: E731
    for out, ref in zip(*_run(jax, trn, cpu, fn, *xs)):
        _bits_equal(out, ref)


def test_reverse_keeps_negative_zero_and_nan(jax, trn, cpu):
    x = np.array([[-0.0, np.nan, np.inf, -np.inf, 1.5]] * 3, np.float32)
    _bits_equal(*_run(jax, trn, cpu, lambda a: a[::-1, ::-1], x))


def _opcodes(jax, fn, *args):
    import jax_trn
    with jax_trn.profile() as prof:
        jax.block_until_ready(jax.jit(fn)(*args))
    return [e.opcode for e in prof.executions[-1].events]


def test_flip_of_leading_axis_is_dma_only(jax, trn):
    """Reversing a leading axis needs no engine: the DMA pattern steps backwards."""
    x = jax.device_put(np.zeros((64, 256), np.float32), trn)
    assert set(_opcodes(jax, lambda a: a[::-1], x)) == {"DmaCopy"}


def test_flip_of_innermost_axis_copies_columns_on_chip(jax, trn):
    x = jax.device_put(np.zeros((130, 20), np.float32), trn)
    ops = _opcodes(jax, lambda a: a[:, ::-1], x)
    # 130 rows: two row tiles, each reversed by one copy through a stride -1 pattern.
    assert ops.count("TensorCopy") == 2 and ops.count("DmaCopy") == 4


# --- rng_bit_generator ------------------------------------------------------------------

STATE = np.array([0x89ABCDEF, 0x01234567, 0xFFFFFFFE, 0xFFFFFFFF], np.uint32)  # counter carries


RNG_CASES = [((3, 5), "uint32"), ((300, 7), "uint32"), ((7,), "uint8"), ((130,), "uint16"),
             ((), "uint32"), ((0, 4), "uint32")]


def test_rng_bit_generator_is_bit_exact(jax, trn, cpu):
    """DEFAULT (Philox on XLA's CPU backend) and PHILOX, state outputs included."""
    algs = jax.lax.RandomAlgorithm.RNG_DEFAULT, jax.lax.RandomAlgorithm.RNG_PHILOX

    def draws(s):
        return [jax.lax.rng_bit_generator(s, shape, np.dtype(dt), algorithm=alg)
                for shape, dt in RNG_CASES for alg in algs]
    out, ref = _run(jax, trn, cpu, draws, STATE)
    for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        _bits_equal(o, r)


@pytest.mark.parametrize("impl", ["rbg", "unsafe_rbg"])
def test_rbg_random_matches_cpu(jax, trn, cpu, impl):
    """jax.random on rng_bit_generator keys (the default impl set to rbg / unsafe_rbg):
    bits, uniform and bernoulli bit for bit; normal through erf_inv's log, which XLA's
    CPU backend approximates (a few ulp from the exact FP32 log), to float32
    tolerance after its uniform input matched bit for bit."""
    with jax.default_prng_impl(impl):
        data = jax.random.key_data(jax.random.key(42))

        def draws(kd):
            k1, k2, k3, k4 = jax.random.split(jax.random.wrap_key_data(kd), 4)
            return (jax.random.bits(k1, (5, 3)), jax.random.uniform(k2, (9,)),
                    jax.random.bernoulli(k3, 0.3, (7, 2)),
                    jax.random.uniform(k4, (300,), minval=-1.0, maxval=1.0),
                    jax.random.normal(k4, (300,)))
        out, ref = _run(jax, trn, cpu, draws, data)
    for o, r in zip(out[:4], ref[:4]):
        _bits_equal(o, r)
    assert_close(out[4], ref[4], "float32")


@pytest.mark.slow
def test_rng_bit_generator_uint64_in_x64():
    code = ("import jax, numpy as np\n"
            "jax.config.update('jax_enable_x64', True)\n"
            "s = np.array([0x0123456789ABCDEF, 0xFFFFFFFFFFFFFFFF], np.uint64)\n"
            "f = jax.jit(lambda s: jax.lax.rng_bit_generator(s, (3, 3), np.uint64))\n"
            "a = f(jax.device_put(s, jax.devices('cpu')[0]))\n"
            "b = f(jax.device_put(s, jax.devices('trn')[0]))\n"
            "print(all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b)))\n")
    r = run_python(code)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().endswith("True")


THREE_FRY = "RNG_THREE_FRY"
# Every layout of XLA's Threefry: split on the first even dimension with rows of one
# counter (7, 2), many (300, 7), (3, 4, 5), longer than a tile (2, 1100), or on the
# largest of all-odd dimensions ((7,), (5, 3), (3, 5, 7), more than 128 groups
# (131, 133)), scalars, unit and empty dimensions.
THREE_FRY_CASES = [((), "uint8"), ((1,), "uint32"), ((7,), "uint16"), ((7, 2), "uint32"),
                   ((5, 3), "uint8"), ((3, 5), "uint32"), ((3, 4, 5), "uint32"),
                   ((3, 5, 7), "uint16"), ((300, 7), "uint32"), ((2, 1100), "uint32"),
                   ((131, 133), "uint32"), ((1, 3, 1), "uint8"), ((0, 4), "uint32"),
                   ((4, 0, 3), "uint16")]
LOW_CARRY = np.array([0x9E3779B9, 0xDEADBEEF, 0xFFFFFF00, 0x00000001], np.uint32)


def test_three_fry_is_bit_exact(jax, trn, cpu):
    """Values and new states of every case, from a state whose 64-bit counter wraps
    (STATE) and one whose low word carries into the high word (LOW_CARRY)."""
    alg = getattr(jax.lax.RandomAlgorithm, THREE_FRY)

    def draws(*states):
        return [jax.lax.rng_bit_generator(s, shape, np.dtype(dt), algorithm=alg)
                for s in states for shape, dt in THREE_FRY_CASES]
    out, ref = _run(jax, trn, cpu, draws, STATE, LOW_CARRY)
    for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        _bits_equal(o, r)


def test_three_fry_uint64_is_bit_exact(jax, trn, cpu):
    """64-bit values are one counter's two words each (not the halved layout)."""
    alg = getattr(jax.lax.RandomAlgorithm, THREE_FRY)
    with jax.enable_x64(True):
        states = [np.array([0x0123456789ABCDEF, 0xFFFFFFFFFFFFFFFD], np.uint64),
                  LOW_CARRY.view(np.uint64)]

        def draws(*st):
            return [jax.lax.rng_bit_generator(s, shape, np.uint64, algorithm=alg)
                    for s in st for shape in [(), (3, 5), (300, 7), (0, 2)]]
        out, ref = _run(jax, trn, cpu, draws, *states)
    for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        _bits_equal(o, r)


@pytest.mark.parametrize("shape", [(), (1,), (7,), (8,), (3, 5), (5, 3), (3, 4, 5), (3, 5, 7),
                                   (131, 133), (2, 1100), (1, 3, 1), (600, 2), (9, 1030),
                                   (4, 0, 3), (3, 131, 133)])
def test_three_fry_tiles_write_each_word_once(shape):
    """The blocks (the cheapest tiling of every part) reproduce XLA's layout exactly:
    output word k holds word j of counter c as three_fry_layout says, no word twice,
    every counter below the count used (pure layout arithmetic, no simulator)."""
    from jax_trn.lower import misc
    n = int(np.prod(shape))
    for wide in (False, True):
        counters, parts = misc.three_fry_layout(shape, wide)
        want = _three_fry_words(shape, wide)
        got = {}
        for r in parts:
            for b in misc.three_fry_blocks(r, 128):
                assert 1 <= b.parts <= 128 and b.rows * b.cols <= misc.THREE_FRY_FREE
                for p, q, f, j in itertools.product(range(b.parts), range(b.rows),
                                                    range(b.cols), range(r.nj)):
                    k = b.o0 + p * b.ops + (2 * q + j) * r.B + f
                    assert k not in got
                    got[k] = (b.c0 + p * b.cps + q * r.B + f, j)
        assert got == want and counters == (n if wide else _half_counters(shape))


def test_misc_doctests():
    import doctest

    from jax_trn.lower import misc
    assert doctest.testmod(misc).failed == 0


def _half_counters(shape):
    dims = shape or (1,)
    even = [i for i, d in enumerate(dims) if d % 2 == 0]
    s = even[0] if even else int(np.argmax(dims))
    return int(np.prod(dims[:s])) * -(-dims[s] // 2) * int(np.prod(dims[s + 1:]))


def _three_fry_words(shape, wide):
    """{output word: (counter, word of it)} following prng.cc's ops literally: a
    concatenation of (x0, x1) on a new axis after the split one, reshape, slice."""
    n = int(np.prod(shape))
    if wide:
        return {2 * c + j: (c, j) for c in range(n) for j in (0, 1)}
    dims = list(shape or (1,))
    even = [i for i, d in enumerate(dims) if d % 2 == 0]
    s = even[0] if even else int(np.argmax(dims))
    half = dims[:s] + [-(-dims[s] // 2), 1] + dims[s + 1:]
    ctr = np.arange(int(np.prod(half))).reshape(half)
    pair = np.concatenate([ctr * 2, ctr * 2 + 1], axis=s + 1)     # 2c + j
    full = pair.reshape(dims[:s] + [2 * half[s]] + dims[s + 1:])
    full = full[tuple(slice(0, d) for d in dims)].reshape(-1)
    return {k: (int(v) // 2, int(v) % 2) for k, v in enumerate(full)}


def test_three_fry_runs_on_gpsimd_in_full_tiles(jax, trn):
    """A [2, 65536] draw (one row of counters per output row pair) tiles its columns
    over all 128 partitions: one Iota, ~111 GpSimd instructions, not 128 tiles."""
    import jax_trn
    alg = getattr(jax.lax.RandomAlgorithm, THREE_FRY)
    fn = lambda s: jax.lax.rng_bit_generator(s, (2, 65536), algorithm=alg)[1]  # noqa: E731
    with jax_trn.profile() as prof:
        jax.block_until_ready(jax.jit(fn)(jax.device_put(STATE, trn)))
    ev = prof.executions[-1].events
    ops = [e.opcode for e in ev]
    assert ops.count("Iota") == 1
    assert 100 < sum(e.queue == "gpsimd" for e in ev) < 140


# --- reduce_precision -------------------------------------------------------------------

def _special_values(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(600) * 10.0 ** rng.integers(-45, 39, 600)
    x = np.concatenate([x, [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 6e-8, 65504.0,
                            65520.0, 3.4e38, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11]])
    with np.errstate(over="ignore"):
        return x.astype(np.float32).astype(np.dtype(getattr(ml_dtypes, dtype, dtype)))


PRECISIONS = [(5, 10), (8, 7), (4, 3), (5, 2), (2, 1), (8, 0), (8, 23)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_reduce_precision_is_bit_exact(jax, trn, cpu, dtype):
    fn = lambda a: [jax.lax.reduce_precision(a, *bits) for bits in PRECISIONS]  # noqa: E731
    for out, ref in zip(*_run(jax, trn, cpu, fn, _special_values(dtype))):
        _bits_equal(out, ref)


# --- device ids, custom calls -----------------------------------------------------------

def test_axis_index_on_one_device_is_zero(jax, trn, cpu):
    from jax.sharding import Mesh, PartitionSpec
    mesh = Mesh(np.array([trn]), ("i",))
    f = jax.jit(jax.shard_map(lambda a: a + jax.lax.axis_index("i"), mesh=mesh,
                              in_specs=PartitionSpec("i"), out_specs=PartitionSpec("i")))
    assert "partition_id" in f.lower(np.ones(3, np.float32)).as_text()
    np.testing.assert_array_equal(f(jax.device_put(np.ones(3, np.float32), trn)), np.ones(3))


def test_other_platforms_custom_call_names_its_target(jax, trn):
    call = jax.ffi.ffi_call("lapack_sgetrf_ffi", jax.ShapeDtypeStruct((3,), np.float32))
    with pytest.raises(Exception) as info:
        jax.jit(call)(jax.device_put(np.ones(3, np.float32), trn))
    msg = str(info.value)
    assert "'lapack_sgetrf_ffi' is not supported on trn" in msg and "float32[3]" in msg


# --- integer edge cases -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32"])
def test_shifts_by_any_amount(jax, trn, cpu, dtype):
    """Amounts >= the width or negative (huge when unsigned): 0, or the sign for
    arithmetic right shifts, as XLA; unsigned arithmetic shifts copy the top bit."""
    info = np.iinfo(dtype)
    x = np.array([0, 1, -1, 5, -77, info.min, info.max, 100] * 4, np.int64).astype(dtype)
    amounts = np.array([0, 1, 3, 7, 8, 15, 16, 31, 32, 33, -1, -8, -33, 64, 2, 5] * 2,
                       np.int64).astype(dtype)
    lax = jax.lax
    fn = lambda a, b: [lax.shift_left(a, b), lax.shift_right_logical(a, b),  # noqa: E731
                       lax.shift_right_arithmetic(a, b)]
    for out, ref in zip(*_run(jax, trn, cpu, fn, x, amounts)):
        _bits_equal(out, ref)


def test_nextafter_bit_exact(jax, trn, cpu):
    """JAX expands nextafter into integer ops on the bits: signed zeros, infinities,
    NaN, the largest finite and the smallest denormal, f32 / bf16 / f16 in one program."""
    a = np.array([0, -0.0, 1, -1, np.inf, -np.inf, np.nan, 3e38, 1e-45, 2.0, 1.5, 0])
    b = np.array([1, 1, 2, -2, 0, 0, 1, np.inf, 0, 2.0, -np.inf, -1])
    types = (np.float32, ml_dtypes.bfloat16, np.float16)
    with np.errstate(over="ignore"):
        args = [v.astype(np.float32).astype(t) for t in types for v in (a, b)]
    fn = lambda *xs: [jax.numpy.nextafter(*xs[i:i + 2]) for i in (0, 2, 4)]  # noqa: E731
    for out, ref in zip(*_run(jax, trn, cpu, fn, *args)):
        _bits_equal(out, ref)
