"""Hand-written kernels (jax_trn.kernels): numerics against numpy / the CPU backend,
standalone and from JAX (jit, vmap, custom_vjp, shard_map), the errors naming the
kernel's line, and the profile pointing back to the kernel's source."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jax_trn import kernels
import jax_trn.kernels.isa as nisa
import jax_trn.kernels.language as nl
from jax_trn.kernels.examples.matmul import matmul_basic, matmul_fast
from jax_trn.kernels.examples.rmsnorm import rmsnorm_kernel
from jax_trn.kernels.examples.softmax import softmax_kernel

from ..conftest import assert_close

RNG = np.random.default_rng(0)


def _x(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


@kernels.jit
def scale_kernel(x, factor):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(x.shape[0] // 128):
        t = nl.load(x[i * 128:(i + 1) * 128, :])
        nisa.dma_copy(dst=out[i * 128:(i + 1) * 128, :], src=nl.multiply(t, factor))
    return out


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _rmsnorm(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


# --- standalone -------------------------------------------------------------------------

@pytest.mark.parametrize("system", ["trn1", "trn2", "trn3"])
def test_simulate_softmax_and_rmsnorm(system):
    x, w = _x(256, 512), _x(512)
    run = kernels.simulate(softmax_kernel, x, system=system)
    np.testing.assert_allclose(run.outputs[0], _softmax(x), rtol=1e-5, atol=1e-7)
    run = kernels.simulate(rmsnorm_kernel, x, w, system=system)
    np.testing.assert_allclose(run.outputs[0], _rmsnorm(x, w), rtol=1e-5, atol=1e-5)
    assert run.execution.generation == system
    assert run.simulated_time_s > 0


@pytest.mark.parametrize("kernel", [matmul_basic, matmul_fast])
def test_simulate_matmul_bf16(kernel):
    a, b = _x(384, 256, dtype=ml_dtypes.bfloat16), _x(384, 1024, dtype=ml_dtypes.bfloat16)
    run = kernels.simulate(kernel, a, b, system="trn2")
    ref = a.astype(np.float32).T @ b.astype(np.float32)      # FP32 sums in PSUM, §2.2
    assert_close(run.outputs[0].astype(np.float32), ref.astype(ml_dtypes.bfloat16), "bfloat16",
                 atol=0.25)
    assert run.execution.flops == 2 * 384 * 256 * 1024


def test_fast_matmul_beats_basic():
    a, b = _x(512, 512, dtype=ml_dtypes.bfloat16), _x(512, 2048, dtype=ml_dtypes.bfloat16)
    basic = kernels.simulate(matmul_basic, a, b, system="trn2").simulated_time_s
    fast = kernels.simulate(matmul_fast, a, b, system="trn2").simulated_time_s
    assert fast < basic / 3


def test_gather_strided_and_broadcast_loads():
    @kernels.jit
    def gather_rows(table, idx):
        out = nl.ndarray((128, 64), dtype=table.dtype, buffer=nl.shared_hbm)
        ids = nl.load(idx)                               # [128, 1] int32 row numbers
        rows = nl.ndarray((128, 64), dtype=table.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=rows, src=table[ids, 0:128:2])  # every other column
        nl.store(out, rows)
        return out
    table, idx = _x(300, 128), RNG.integers(0, 300, (128, 1)).astype(np.int32)
    run = kernels.simulate(gather_rows, table, idx, system="trn2")
    np.testing.assert_array_equal(run.outputs[0], table[idx[:, 0], 0:128:2])


def test_static_arguments_and_several_results():
    @kernels.jit
    def two(x, k=2):
        a = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        b = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(x)
        nl.store(a, nl.multiply(t, float(k)))
        nl.store(b, nl.sum(t, axis=1, keepdims=True))
        return a, b
    x = _x(128, 32)
    a, b = kernels.simulate(two, x, k=3, system="trn2").outputs
    a2, _ = kernels.simulate_kernel(two, x, k=3, system="trn2")      # NKI's name
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_allclose(a, 3 * x, rtol=1e-6)
    np.testing.assert_allclose(b, x.sum(1, keepdims=True), rtol=1e-5, atol=1e-5)


# --- errors name the kernel's line ------------------------------------------------------

def _line_of(fn, text: str) -> str:
    import inspect
    lines, first = inspect.getsourcelines(fn.fn)
    return f"test_kernels.py:{first + next(i for i, l in enumerate(lines) if text in l)}"


def test_psum_tile_wider_than_a_bank_names_the_line():
    @kernels.jit
    def wide(lhsT, rhs):
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 1024), nl.float32, buffer=nl.psum)
        a, b = nl.load(lhsT), nl.load(rhs)
        acc += nisa.nc_matmul(a, b)   # the bad line
        nl.store(out, nl.copy(acc))
        return out
    a, b = _x(128, 128), _x(128, 1024)
    with pytest.raises(kernels.KernelError) as e:
        kernels.simulate(wide, a, b, system="trn2")
    assert f"kernel wide at {_line_of(wide, 'the bad line')}" in str(e.value)
    assert "moving free size 1024 > 512" in str(e.value)


def test_other_errors():
    @kernels.jit
    def too_big(x):
        t = nl.ndarray((128, 60000), dtype=nl.float32, buffer=nl.sbuf)
        return x
    with pytest.raises(kernels.KernelError, match=r"kernel too_big at test_kernels.py:\d+: "
                       r"SBUF of NeuronCore-v3 is full"):
        kernels.simulate(too_big, _x(128, 4), system="trn2")

    @kernels.jit
    def writes_input(x):
        nl.store(x, nl.load(x))
        return x
    with pytest.raises(kernels.KernelError, match="writes kernel input"):
        kernels.simulate(writes_input, _x(128, 4), system="trn2")

    @kernels.jit
    def bad_partitions(x):
        nl.ndarray((256, 4), dtype=nl.float32, buffer=nl.sbuf)
    with pytest.raises(kernels.KernelError, match=r"partition\) axis is 1\.\.\.128"):
        kernels.simulate(bad_partitions, _x(128, 4), system="trn2")

    @kernels.jit
    def v4_only(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        t = nl.load(x)
        nisa.exponential(dst=t, src=t)
        nl.store(out, t)
        return out
    with pytest.raises(kernels.KernelError, match="kernel v4_only at .*exponential"):
        kernels.simulate(v4_only, _x(128, 4), system="trn2")
    out = kernels.simulate(v4_only, _x(128, 4), system="trn3").outputs[0]
    assert out.shape == (128, 4)

    with pytest.raises(kernels.KernelError, match="only inside a kernel"):
        nl.ndarray((128, 4), dtype=nl.float32)


def test_psum_accumulation_groups():
    """A matmul into a fresh PSUM tile (or nl.zeros) starts a group; later ones add
    (NKI's `+=` and `accumulate=None`); adding onto data another instruction wrote is
    NeuronCore-v4 only (§2.2)."""
    @kernels.jit
    def fresh(lhsT, rhs):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(2):
            nisa.nc_matmul(dst=acc, stationary=nl.load(lhsT[k * 128:(k + 1) * 128, :]),
                           moving=nl.load(rhs[k * 128:(k + 1) * 128, :]))
        nl.store(out, nl.copy(acc))
        return out

    @kernels.jit
    def onto_copy(lhsT, rhs):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        nisa.memset(acc, 1.0)
        acc += nisa.nc_matmul(nl.load(lhsT[0:128, :]), nl.load(rhs[0:128, :]))
        nl.store(out, nl.copy(acc))
        return out
    a, b = _x(256, 128), _x(256, 512)
    for system in ("trn2", "trn3"):
        got = kernels.simulate(fresh, a, b, system=system).outputs[0]
        np.testing.assert_allclose(got, a.T @ b, rtol=1e-4, atol=1e-4)
    with pytest.raises(kernels.KernelError, match="adds only onto a matmul's sums"):
        kernels.simulate(onto_copy, a, b, system="trn2")
    got = kernels.simulate(onto_copy, a, b, system="trn3").outputs[0]
    np.testing.assert_allclose(got, 1 + a[:128].T @ b[:128], rtol=1e-4, atol=1e-4)


def test_tiles_live_while_referenced():
    """Tiles kept across iterations (NKI's tutorial appends them to a list) keep their
    buffers; dropped ones are reused (no aliasing either way)."""
    @kernels.jit
    def hoisted(x):
        rows, cols = x.shape
        out = nl.ndarray((rows, cols), dtype=x.dtype, buffer=nl.shared_hbm)
        tiles = []
        for i in nl.affine_range(rows // 128):
            t = nl.ndarray((128, cols), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=t, src=x[i * 128:(i + 1) * 128, :])
            tiles.append(t)
        later = nl.zeros((128, cols), dtype=x.dtype)      # must not take a kept buffer
        for i in nl.affine_range(rows // 128):
            nl.store(out[i * 128:(i + 1) * 128, :], nl.add(tiles[i], later))
        return out
    x = _x(512, 64)
    np.testing.assert_array_equal(kernels.simulate(hoisted, x, system="trn2").outputs[0], x)


# --- profile ------------------------------------------------------------------------------

def test_profile_points_back_to_kernel_lines(tmp_path):
    run = kernels.simulate(softmax_kernel, _x(256, 256), system="trn2")
    ex = run.execution
    assert [k.name for k in ex.kernels] == ["softmax_kernel"]
    lines = {i.line for i in ex.instructions}
    assert lines and all(l.startswith("softmax.py:") for l in lines)
    act_lines = {i.line for i in ex.instructions if i.opcode == "Activation"}
    import inspect
    src, first = inspect.getsourcelines(softmax_kernel.fn)
    exp_line = first + next(k for k, l in enumerate(src) if "nl.exp" in l)
    assert f"softmax.py:{exp_line}" in act_lines
    trace = ex.trace_events()
    assert any(e.get("args", {}).get("source", "").startswith("softmax.py:")
               for e in trace["traceEvents"])
    text = str(ex.summary())
    assert "softmax_kernel" in text and "hand-written kernel lines" in text
    rows = ex.summary().to_dict()["kernel_lines"]
    assert {r["engine"] for r in rows} >= {"dma", "vector", "scalar"}
    assert sum(r["instructions"] for r in rows) == len(ex.instructions)


# --- from JAX -------------------------------------------------------------------------------

def test_jit_on_trn_matches_cpu(jax, trn, cpu):
    import jax_trn
    x, w = _x(256, 384), _x(384)

    def f(x, w):
        return rmsnorm_kernel(softmax_kernel(x * 2.0), w) + 1.0

    with jax_trn.profile() as prof:
        got = jax.jit(f)(jax.device_put(x, trn), jax.device_put(w, trn))
    want = jax.jit(f)(jax.device_put(x, cpu), jax.device_put(w, cpu))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got), _rmsnorm(_softmax(2 * x), w) + 1,
                               rtol=1e-4, atol=1e-5)
    names = [k.name for k in prof.executions[-1].kernels]
    assert any(n.startswith("softmax_kernel.") for n in names)
    assert any(n.startswith("rmsnorm_kernel.") for n in names)
    rms = next(k for k in prof.executions[-1].kernels if k.name.startswith("rmsnorm_kernel"))
    assert "test_kernels.py" in rms.ops[0]        # the user's call site, not ours


def test_vmap_default_and_rule(jax, trn):
    xb = _x(3, 128, 64)
    got = jax.jit(jax.vmap(lambda a: scale_kernel(a, 3.0)))(jax.device_put(xb, trn))
    np.testing.assert_allclose(np.asarray(got), 3 * xb, rtol=1e-6)

    calls = []

    @kernels.jit
    def scale_rows(x, factor):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, nl.multiply(nl.load(x), factor))
        return out

    @scale_rows.def_vmap
    def _rule(axis_size, in_dims, x):
        calls.append(axis_size)
        x = jax.numpy.moveaxis(x, in_dims[0], 0).reshape(-1, x.shape[-1])
        return [scale_rows(x, 2.0).reshape(axis_size, -1, x.shape[-1])], [0]

    xb = _x(4, 32, 16)
    got = jax.jit(jax.vmap(lambda a: scale_rows(a, 2.0)))(jax.device_put(xb, trn))
    np.testing.assert_allclose(np.asarray(got), 2 * xb, rtol=1e-6)
    assert calls == [4]


def test_grad_through_custom_vjp(jax, trn, cpu):
    @jax.custom_vjp
    def scaled(x):
        return scale_kernel(x, 3.0)

    def fwd(x):
        return scaled(x), None

    def bwd(_, g):
        return (scale_kernel(g, 3.0),)

    scaled.defvjp(fwd, bwd)

    def loss(x):
        return (scaled(x) ** 2).sum()

    x = _x(128, 32)
    g = jax.jit(jax.grad(loss))(jax.device_put(x, trn))
    np.testing.assert_allclose(np.asarray(g), 18 * x, rtol=1e-5)
    with pytest.raises(Exception, match="no derivative of its own"):
        jax.grad(lambda x: scale_kernel(x, 2.0).sum())(jax.device_put(x, trn))


def test_shard_map_runs_per_device(jax, trn_devices):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(trn_devices[:2]), ("d",))
    x = _x(512, 64)
    f = jax.jit(jax.shard_map(lambda a: softmax_kernel(a), mesh=mesh, in_specs=P("d"),
                              out_specs=P("d")))
    got = f(jax.device_put(x, NamedSharding(mesh, P("d"))))
    np.testing.assert_allclose(np.asarray(got), _softmax(x), rtol=1e-5, atol=1e-7)


def test_estimate_with_a_kernel(jax):
    import jax_trn
    s = jax.ShapeDtypeStruct((1024, 1024), jax.numpy.bfloat16)
    ex = jax_trn.estimate(lambda a, b: matmul_fast(a, b), s, s, system="trn1.2xlarge")
    assert ex.generation == "trn1"
    assert [k.name.split(".")[0] for k in ex.kernels] == ["matmul_fast"]
    assert ex.mfu > 0.5


def test_compile_error_names_the_line_and_the_process_goes_on(jax, trn):
    @kernels.jit
    def wide(lhsT, rhs):
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 1024), nl.float32, buffer=nl.psum)
        acc += nisa.nc_matmul(nl.load(lhsT), nl.load(rhs))   # too wide before v4
        nl.store(out, nl.copy(acc))
        return out
    a = jax.device_put(_x(128, 128, dtype=ml_dtypes.bfloat16), trn)
    b = jax.device_put(_x(128, 1024, dtype=ml_dtypes.bfloat16), trn)
    with pytest.raises(Exception, match=r"kernel wide at "
                       + _line_of(wide, "too wide before v4").replace(".", r"\.")):
        jax.jit(wide)(a, b)
    got = jax.jit(lambda x: scale_kernel(x, 2.0))(jax.device_put(np.ones((128, 8), np.float32), trn))
    np.testing.assert_array_equal(np.asarray(got), 2.0)


def test_flash_attention_against_cpu_dot_product_attention(jax, trn, cpu):
    from jax_trn.kernels.examples.flash_attention import flash_fwd
    q, k, v = (_x(512, 2, 128, dtype=ml_dtypes.bfloat16) for _ in range(3))

    def kernel(q, k, v):
        return flash_fwd(q, k, v)

    def library(q, k, v):
        return jax.nn.dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]

    got = jax.jit(kernel)(*(jax.device_put(a, trn) for a in (q, k, v)))
    want = jax.jit(library)(*(jax.device_put(a, cpu) for a in (q, k, v)))
    assert_close(np.asarray(got).astype(np.float32), np.asarray(want).astype(np.float32),
                 "bfloat16")
    on_cpu = jax.jit(kernel)(*(jax.device_put(a, cpu) for a in (q, k, v)))
    np.testing.assert_array_equal(np.asarray(on_cpu), np.asarray(got))


def test_nki_index_expressions():
    @kernels.jit
    def tiled_copy(x):
        out = nl.ndarray((128, 64), dtype=x.dtype, buffer=nl.shared_hbm)
        i_p, i_f = nl.arange(128)[:, None], nl.arange(64)[None, :]
        t = nl.load(x[i_p + 128, 2 * i_f])                  # rows 128.., every other column
        ip, jf = nl.mgrid[0:128, 0:32]
        nisa.dma_copy(dst=out[ip, jf], src=t[ip, jf * 2 + 1])
        nisa.dma_copy(dst=out[ip, jf + 32], src=t[ip, jf * 2])
        return out
    x = _x(256, 128)
    got = kernels.simulate(tiled_copy, x, system="trn2").outputs[0]
    t = x[128:, 0:128:2]
    np.testing.assert_array_equal(got, np.concatenate([t[:, 1::2], t[:, 0::2]], 1))
    with pytest.raises(kernels.KernelError, match="72 past the tensor.s end: mask them"):
        @kernels.jit
        def oob(x):
            nl.load(x[nl.arange(128)[:, None] + 200, nl.arange(4)[None, :]])
            return x
        kernels.simulate(oob, x, system="trn2")


def test_kernel_inputs_keep_their_hbm_alive(jax, trn, cpu):
    """A temporary the kernel reads must not share its HBM slot with the kernel's own
    result (buffer assignment reads Kernel.dram for lifetimes)."""
    a = _x(512, 512, dtype=ml_dtypes.bfloat16)
    b = _x(512, 512, dtype=ml_dtypes.bfloat16)

    def f(a, b):
        return matmul_basic(a * 2, b) + 1

    got = jax.jit(f)(jax.device_put(a, trn), jax.device_put(b, trn))
    want = jax.jit(f)(jax.device_put(a, cpu), jax.device_put(b, cpu))
    assert_close(np.asarray(got).astype(np.float32), np.asarray(want).astype(np.float32),
                 "bfloat16", atol=0.5)


@pytest.mark.parametrize("case", ["splat", "twice", "scan", "fori", "cond"])
def test_kernel_in_programs(jax, trn, cpu, case):
    jnp = jax.numpy
    f = {"splat": lambda x: scale_kernel(jnp.ones((128, 64)), 2.0) + x,
         "twice": lambda x: scale_kernel(x, 2.0) + scale_kernel(x, 3.0),
         "scan": lambda x: jax.lax.scan(lambda c, _: (scale_kernel(c, 0.5) + 1, c.sum()),
                                        x, None, length=5)[0],
         "fori": lambda x: jax.lax.fori_loop(0, 3, lambda i, c: softmax_kernel(c) * 3, x),
         "cond": lambda x: jax.lax.cond(x.sum() > 0, lambda x: scale_kernel(x, 2.0),
                                        lambda x: scale_kernel(x, -1.0), x)}[case]
    x = RNG.random((128, 64)).astype(np.float32)
    got = jax.jit(f)(jax.device_put(x, trn))
    want = jax.jit(f)(jax.device_put(x, cpu))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)


def test_kernel_under_automatic_sharding_sees_whole_arrays(jax, trn_devices):
    """jit over a mesh (no shard_map): Shardy gathers a kernel's operands and the kernel
    runs on the whole array; its result comes out replicated."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(trn_devices[:2]), ("d",))
    x = _x(512, 64)
    y = jax.jit(lambda a: softmax_kernel(a) * 2)(jax.device_put(x, NamedSharding(mesh, P("d"))))
    np.testing.assert_allclose(np.asarray(y), 2 * _softmax(x), rtol=1e-5, atol=1e-7)
