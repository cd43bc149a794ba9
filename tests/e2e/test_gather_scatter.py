"""gather and scatter on trn against the CPU backend: integer-array indexing, take,
take_along_axis, vmapped gathers, embedding lookups and their gradients, .at[] updates
with duplicate and out-of-bounds indices in every mode JAX emits."""
from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from tests.conftest import assert_close
from tests.e2e.test_ops import _rand

DTYPES = ["float32", "bfloat16", "int32"]


def run(jax, trn, cpu, fn, *args):
    """fn jitted on trn and on CPU: (trn result, CPU result), checked alike in shape,
    dtype and device."""
    f = jax.jit(fn)
    out = f(*(jax.device_put(a, trn) for a in args))
    ref = f(*(jax.device_put(a, cpu) for a in args))
    for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        assert o.shape == r.shape and o.dtype == r.dtype
        assert o.devices() == {trn} or o.size == 0      # JAX makes empty results itself
    return out, ref


def same(jax, trn, cpu, fn, *args):
    """Bit-identical to CPU (gathers and overwrites move data without arithmetic)."""
    out, ref = run(jax, trn, cpu, fn, *args)
    for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        np.testing.assert_array_equal(np.asarray(o), np.asarray(r))


def close(jax, trn, cpu, fn, *args, **tol):
    out, ref = run(jax, trn, cpu, fn, *args)
    for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        dt = str(r.dtype)
        assert_close(o, r, dt if dt in ("bfloat16", "float32") else "exact", **tol)


def idx(*values):
    return np.array(values, np.int32)


# --- gather ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(8,), (130, 3), (256, 128), (5, 6, 7)])
def test_index_rows(jax, trn, cpu, shape, dtype):
    x = _rand(shape, dtype, np.random.default_rng(0))
    i = idx(3, 1, 0, -1, shape[0] - 1, 2, 2)          # duplicates, negative (wrapped)
    same(jax, trn, cpu, lambda x, i: x[i], x, i)


@pytest.mark.parametrize("dtype", DTYPES)
def test_index_inner_axis(jax, trn, cpu, dtype):
    x = _rand((6, 130), dtype, np.random.default_rng(1))
    same(jax, trn, cpu, lambda x, i: x[:, i], x, idx(129, 0, 5, 5, -3))
    y = _rand((3, 5, 4), dtype, np.random.default_rng(2))
    same(jax, trn, cpu, lambda y, i: y[:, i, 1:3], y, idx(4, 0, 2))
    same(jax, trn, cpu, lambda y, i: y[1, :, i], y, idx(3, 3, 0))


def test_index_two_arrays_and_traced_scalars(jax, trn, cpu):
    x = _rand((9, 7, 3), "float32", np.random.default_rng(3))
    same(jax, trn, cpu, lambda x, a, b: x[a, b], x, idx(0, 8, 4, 4), idx(6, 0, 2, 2))
    same(jax, trn, cpu, lambda x, a, b: x[a[:, None], b[None, :]], x, idx(1, 2), idx(3, 4, 5))
    same(jax, trn, cpu, lambda x, a, b: x[a, :, b], x, np.int32(5), idx(2, 0))


@pytest.mark.parametrize("dtype", ["uint8", "bool"])
def test_index_small_types(jax, trn, cpu, dtype):
    x = _rand((40, 5), dtype, np.random.default_rng(4))
    same(jax, trn, cpu, lambda x, i: x[i], x, idx(39, 0, 17, 17))
    same(jax, trn, cpu, lambda x, i: x[:, i], x, idx(4, 1))


@pytest.mark.parametrize("mode", [None, "clip", "fill", "promise_in_bounds"])
def test_take_out_of_bounds(jax, trn, cpu, mode):
    """Out-of-bounds starts clamp ("clip"; "promise_in_bounds" clamps on CPU too) or
    give the fill value ("fill", the default of take and .at[].get)."""
    x = _rand((10, 4), "float32", np.random.default_rng(5))
    i = idx(0, 9, 10, 25, -1, -10, -11, -1000, 2 ** 31 - 1)
    kw = {} if mode is None else {"mode": mode}
    take_kw = {"mode": "wrap"} if mode == "promise_in_bounds" else kw
    same(jax, trn, cpu, lambda x, i: jax.numpy.take(x, i, axis=0, **take_kw), x, i)
    same(jax, trn, cpu, lambda x, i: x.at[i].get(**kw), x, i)
    same(jax, trn, cpu, lambda x, i: x.at[:, i].get(mode="fill", fill_value=-7.0), x, i)


def test_uint_and_int64_indices(jax, trn, cpu):
    x = _rand((300,), "float32", np.random.default_rng(6))
    same(jax, trn, cpu, lambda x, i: jax.numpy.take(x, i, mode="clip"),
         x, np.array([0, 299, 4000000000, 7], np.uint32))
    same(jax, trn, cpu, lambda x, i: x[i], x, np.array([1, 255, 3], np.uint8))


def test_empty_indices(jax, trn, cpu):
    x = _rand((8, 3), "float32", np.random.default_rng(7))
    same(jax, trn, cpu, lambda x, i: x[i], x, np.zeros((0,), np.int32))
    same(jax, trn, cpu, lambda x, i: x.at[i].add(1.0), x, np.zeros((0,), np.int32))
    same(jax, trn, cpu, lambda x, i: x.at[i].max(1.0), x, np.zeros((0, 2), np.int32)[:, 0])


@pytest.mark.parametrize("dtype", DTYPES)
def test_take_along_axis(jax, trn, cpu, dtype):
    x = _rand((5, 130), dtype, np.random.default_rng(8))
    i = np.random.default_rng(9).integers(-130, 130, (5, 7)).astype(np.int32)
    same(jax, trn, cpu, lambda x, i: jax.numpy.take_along_axis(x, i, axis=1), x, i)
    j = np.random.default_rng(10).integers(0, 5, (3, 130)).astype(np.int32)
    same(jax, trn, cpu, lambda x, j: jax.numpy.take_along_axis(x, j, axis=0), x, j)


def test_vmapped_gathers(jax, trn, cpu):
    x = _rand((6, 9, 4), "float32", np.random.default_rng(11))
    i = np.random.default_rng(12).integers(0, 9, (6, 3)).astype(np.int32)
    same(jax, trn, cpu, jax.vmap(lambda x, i: x[i]), x, i)
    same(jax, trn, cpu, jax.vmap(lambda x, i: x[i], in_axes=(None, 0)), x[0], i)
    same(jax, trn, cpu, jax.vmap(jax.vmap(lambda r, k: r[k, 1], in_axes=(None, 0))), x,
         np.random.default_rng(13).integers(-9, 9, (6, 5)).astype(np.int32))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_embedding_lookup_and_grad(jax, trn, cpu, dtype):
    jnp = jax.numpy
    rng = np.random.default_rng(14)
    table = _rand((300, 64), dtype, rng)
    ids = rng.integers(0, 300, (3, 50)).astype(np.int32)
    ids[0, :10] = 7                                   # many duplicates
    same(jax, trn, cpu, lambda t, i: t[i], table, ids)

    def loss(t, i):
        e = t[i].astype(jnp.float32)
        return (e * jnp.arange(64, dtype=jnp.float32) / 64).sum()
    close(jax, trn, cpu, jax.grad(loss), table, ids)


# --- scatter --------------------------------------------------------------------------

@pytest.mark.parametrize("op,dtype", [(op, "float32") for op in ("set", "add", "mul", "max",
                                                                   "min")]
                         + [("set", "bfloat16"), ("add", "bfloat16"), ("max", "bfloat16"),
                            ("add", "int32"), ("mul", "int32"), ("min", "int32")])
def test_at_update(jax, trn, cpu, op, dtype):
    x = _rand((130, 3), dtype, np.random.default_rng(15))
    u = _rand((6, 3), dtype, np.random.default_rng(16), lo=0.5, hi=2.0)
    i = idx(5, 129, 0, 5, -1, 64)                       # 5 and -1=129 repeated
    close(jax, trn, cpu, lambda x, i, u: getattr(x.at[i], op)(u), x, i, u)
    close(jax, trn, cpu, lambda x, i: getattr(x.at[:, i[:2] % 3], op)(x[:, 1:3]), x, i)


@pytest.mark.parametrize("mode", [None, "clip", "drop", "promise_in_bounds"])
@pytest.mark.parametrize("op", ["set", "add", "max"])
def test_at_update_out_of_bounds(jax, trn, cpu, mode, op):
    x = _rand((12, 4), "float32", np.random.default_rng(17))
    i = idx(11, 12, 30, -1, -12, -13, 2 ** 31 - 1, 3) if mode != "promise_in_bounds" \
        else idx(11, 0, 3, -1)
    kw = {} if mode is None else {"mode": mode}
    u = np.arange(i.size * 4, dtype=np.float32).reshape(-1, 4)
    close(jax, trn, cpu, lambda x, i, u: getattr(x.at[i], op)(u, **kw), x, i, u)
    close(jax, trn, cpu, lambda x, i: getattr(x.at[:, i], op)(5.0, **kw), x, i)


def test_scatter_window_partly_outside_is_dropped(jax, trn, cpu):
    """lax.scatter with a 2-row window: an update whose window would cross the end is
    dropped whole (XLA semantics), not clamped."""
    lax = jax.lax
    x = _rand((6, 3), "float32", np.random.default_rng(18))
    dn = lax.ScatterDimensionNumbers(update_window_dims=(1, 2), inserted_window_dims=(),
                                     scatter_dims_to_operand_dims=(0,))
    u = np.ones((4, 2, 3), np.float32)
    i = np.array([[0], [4], [5], [-1]], np.int32)
    close(jax, trn, cpu, lambda x, i, u: lax.scatter_add(x, i, u, dn), x, i, u)
    close(jax, trn, cpu, lambda x, i, u: lax.scatter(x, i, u, dn), x, i, u)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_scatter_add_duplicates_many(jax, trn, cpu, dtype):
    """600 updates into 7 rows of 130: sums of ~86 terms each, in update order."""
    rng = np.random.default_rng(19)
    x = np.zeros((7, 130), np.float32).astype(_np_dtype(dtype))
    i = rng.integers(0, 7, 600).astype(np.int32)
    u = _rand((600, 130), dtype, rng)
    close(jax, trn, cpu, lambda x, i, u: x.at[i].add(u), x, i, u,
          **({"rtol": 2e-2, "atol": 0.25} if dtype == "bfloat16" else {}))


def test_scatter_max_min_duplicates_traced(jax, trn, cpu):
    rng = np.random.default_rng(20)
    x = _rand((9, 5), "float32", rng)
    i = rng.integers(0, 9, 40).astype(np.int32)
    u = _rand((40, 5), "float32", rng)
    same(jax, trn, cpu, lambda x, i, u: (x.at[i].max(u), x.at[i].min(u)), x, i, u)
    same(jax, trn, cpu, lambda x, i, u: x.at[i].max(u, unique_indices=True), x,
         np.arange(9, dtype=np.int32)[::-1].copy(), u[:9])


def test_scatter_3d_and_small_types(jax, trn, cpu):
    x = _rand((4, 5, 6), "int32", np.random.default_rng(21))
    same(jax, trn, cpu, lambda x, a, b: x.at[a, :, b].add(3), x, idx(0, 3, 3), idx(5, 0, 5))
    same(jax, trn, cpu, lambda x, a: x.at[:, a].set(-1), x, idx(4, 1))
    b = _rand((20, 3), "bool", np.random.default_rng(22))
    same(jax, trn, cpu, lambda b, i: (b.at[i].set(True), b.at[i].max(True), b.at[i].min(False)),
         b, idx(1, 19, 1))
    u8 = _rand((20, 3), "uint8", np.random.default_rng(23))
    same(jax, trn, cpu, lambda x, i: (x.at[i].set(9), x.at[i].add(2), x.at[i].max(7)), u8,
         idx(0, 0, 19))


def test_vmapped_scatter(jax, trn, cpu):
    x = _rand((4, 10), "float32", np.random.default_rng(24))
    i = np.random.default_rng(25).integers(0, 10, (4, 6)).astype(np.int32)
    close(jax, trn, cpu, jax.vmap(lambda r, k: r.at[k].add(1.0)), x, i)


def test_grad_of_gathers(jax, trn, cpu):
    jnp = jax.numpy
    x = _rand((6, 130), "float32", np.random.default_rng(26))
    i = idx(1, 1, 5, 0, 1)
    close(jax, trn, cpu, jax.grad(lambda x, i: (jnp.sin(x[:, i]) * x[:, i]).sum()), x, i)
    j = np.random.default_rng(27).integers(0, 130, (6, 4)).astype(np.int32)
    close(jax, trn, cpu, jax.grad(lambda x, j: jnp.take_along_axis(x, j, 1).sum() ** 2), x, j)


def test_any_update_computation_matches_cpu(jax, trn, cpu):
    """`x.at[i].apply(f)`: the update computation runs as tile steps on the gathered
    rows (it was a compile error); repeated indices apply f again."""
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    i = np.array([1, 2, 2, 5], np.int32)
    f = jax.jit(lambda x, i: x.at[i].apply(jax.numpy.sin))
    np.testing.assert_allclose(f(jax.device_put(x, trn), jax.device_put(i, trn)),
                               f(jax.device_put(x, cpu), jax.device_put(i, cpu)),
                               rtol=1e-6, atol=1e-6)


def _np_dtype(name):
    return np.dtype(getattr(ml_dtypes, name, name))


def _kernel_counts(jax, trn, fn, *shapes) -> dict[str, int]:
    """Instruction counts per engine of the gather / scatter kernel, compiled only."""
    from jax.sharding import SingleDeviceSharding
    s = SingleDeviceSharding(trn)
    args = [jax.ShapeDtypeStruct(shape, dt, sharding=s) for shape, dt in shapes]
    text = jax.jit(fn).lower(*args).compile().as_text()
    cfg = re.search(r'"((?:gather|scatter)\.\d+: [^"]*)"', text).group(1)
    return {e: int(n) for e, n in re.findall(r"(\w+) x(\d+)", cfg.split("|")[1])}


def test_embedding_instruction_counts_are_bounded(jax, trn):
    """A 32k x 1024 bf16 table with 4 x 1024 ids: a few rows-DMAs per 1024 ids (up to
    16 KiB per partition per DmaGather), not one instruction per id or element."""
    jnp = jax.numpy
    table, ids = ((32768, 1024), jnp.bfloat16), ((4, 1024), jnp.int32)
    upd = ((4, 1024, 1024), jnp.bfloat16)
    lookup = _kernel_counts(jax, trn, lambda t, i: t[i], table, ids)
    assert sum(lookup.values()) <= 24, lookup
    add = _kernel_counts(jax, trn, lambda t, i, u: t.at[i].add(u), table, ids, upd)
    assert add["gpsimd"] <= 24 and add["dma"] <= 160, add     # incl. the 64 MiB copy
    unique = _kernel_counts(jax, trn, lambda t, i, u: t.at[i].max(u, unique_indices=True),
                            table, ids, upd)
    assert unique["vector"] <= 8, unique


def test_serial_read_modify_write_is_capped(jax, trn):
    """max with traced, possibly repeated indices runs one index vector per tile; past
    MAX_CHUNKS tiles it is a compile-time error naming the op, not a huge kernel."""
    from jax.sharding import SingleDeviceSharding
    s = SingleDeviceSharding(trn)
    args = [jax.ShapeDtypeStruct(shape, dt, sharding=s) for shape, dt in
            (((100, 8), np.float32), ((9000,), np.int32), ((9000, 8), np.float32))]
    with pytest.raises(Exception, match=r"scatter.*9000 index vectors"):
        jax.jit(lambda x, i, u: x.at[i].max(u)).lower(*args).compile()
