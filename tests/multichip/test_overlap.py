"""Collectives overlap the compute that does not depend on them (trainium-hardware.md
§5.2: CC cores and DMA rings run beside the compute engines, sharing the DMA engines),
on the 8 NeuronCores of the default Trn2 chip, numbers checked against the CPU mesh."""
from __future__ import annotations

import numpy as np
import pytest

RNG = np.random.default_rng(3)
X = RNG.normal(size=(8 * 128, 512)).astype(np.float32)       # psum operand: (128, 512) a device
A = RNG.normal(size=(8 * 128, 256)).astype(np.float32)       # matmul lhs: (128, 256) a device
W = RNG.normal(size=(256, 256)).astype(np.float32)


@pytest.fixture(scope="module")
def meshes(jax, trn_devices):
    if len(jax.devices("cpu")) < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (conftest)")
    return (jax.make_mesh((8,), ("d",), devices=trn_devices[:8]),
            jax.make_mesh((8,), ("d",), devices=jax.devices("cpu")[:8]))


def _run(jax, mesh, body, n_out):
    from jax import shard_map
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_trn
    f = jax.jit(shard_map(body, mesh=mesh, in_specs=(P("d"), P("d"), P()),
                          out_specs=(P("d"),) * n_out, check_vma=False))
    args = [jax.device_put(X, NamedSharding(mesh, P("d"))),
            jax.device_put(A, NamedSharding(mesh, P("d"))),
            jax.device_put(W, NamedSharding(mesh, P()))]
    with jax_trn.profile() as prof:
        out = jax.block_until_ready(f(*args))
    return out, (prof.executions[-1] if prof.executions else None)


def _parts(ex):
    """(collective span, compute span of device 0's kernels after the collective's
    arrival, execution span)."""
    (c,) = ex.collectives
    dev = ex.devices[0]
    after = [k for k in ex.kernels if k.device == dev and k.start_ns >= c.arrival_ns[0]]
    compute = max(k.end_ns for k in after) - min(k.start_ns for k in after)
    return c, compute, ex.span_ns


def _check(jax, meshes, body, n_out):
    mt, mc = meshes
    got, ex = _run(jax, mt, body, n_out)
    want, _ = _run(jax, mc, body, n_out)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-4)
    return got, ex


def independent(x, a, w):
    import jax
    return jax.lax.psum(x, "d"), a @ w


def dependent(x, a, w):
    import jax
    s = jax.lax.psum(x, "d")
    return s, s[:, :256] @ w


def test_psum_overlaps_an_independent_matmul(jax, meshes):
    with jax.default_matmul_precision("highest"):
        _, ex = _check(jax, meshes, independent, 2)
    c, compute, span = _parts(ex)
    # The matmul's kernels run while the all-reduce is in flight: the execution is
    # shorter than the collective and the compute after it back to back.
    assert c.end_ns > c.start_ns and compute > 0
    matmul = [k for k in ex.kernels if k.device == ex.devices[0] and k.start_ns >= c.arrival_ns[0]]
    assert any(k.start_ns < c.end_ns for k in matmul)
    assert span < c.duration_ns + compute + c.start_ns - 1.0


def test_psum_then_dependent_matmul_waits(jax, meshes):
    with jax.default_matmul_precision("highest"):
        _, ex = _check(jax, meshes, dependent, 2)
    (c,) = ex.collectives
    for dev in ex.devices:
        users = [k for k in ex.kernels if k.device == dev and k.start_ns >= c.arrival_ns[0]]
        assert users and all(k.start_ns >= c.end_ns for k in users)


def test_overlap_leaves_numerics_bit_identical(jax, meshes):
    # The overlapped program gives the same bits as the psum alone and the matmul alone
    # (each in a program of its own: nothing to overlap).
    import jax as _jax
    mt, _ = meshes
    with jax.default_matmul_precision("highest"):
        (s1, m1), _ = _run(jax, mt, independent, 2)
        (s2,), _ = _run(jax, mt, lambda x, a, w: (_jax.lax.psum(x, "d"),), 1)
        (m2,), _ = _run(jax, mt, lambda x, a, w: (a @ w,), 1)
    assert np.array_equal(np.asarray(s1), np.asarray(s2))
    assert np.array_equal(np.asarray(m1), np.asarray(m2))


def test_overlapped_kernels_share_dma_with_the_collective(jax, meshes):
    """The kernels that overlap the collective get less DMA bandwidth than alone: the
    same matmul after the psum's end (dependent variant computes on the result) vs
    during it. Compared at the level of the model: the core's DMA timeline holds the
    collective's reservation over its span."""
    from jax_trn.hw.core import NeuronCore
    from jax_trn.hw.program import Collective, DramTensor, Kernel
    from jax_trn.runtime import spmd
    from jax_trn.runtime.executable import _StepRunner
    from jax_trn.systems import SYSTEMS
    system = SYSTEMS["trn2.48xlarge"]
    core = NeuronCore(system.chip.core)
    core.begin(None)
    run = _StepRunner(core, {}, 0, 0, True)
    step = Collective("all_reduce.1", "all_reduce", [DramTensor("x", (4,), "float32")],
                      [DramTensor("y", (4,), "float32")])
    run.issue(step, spmd.Issued(100.0, 1100.0, 50.0))
    free, _ = core.dma_bw.free_at(500.0)
    assert free == pytest.approx(core.dma_bw.capacity - 50.0)
    assert core.dma_bw.free_at(1200.0)[0] == pytest.approx(core.dma_bw.capacity)
    user = Kernel("k", [], {"y": DramTensor("y", (4,), "float32")})
    other = Kernel("k2", [], {"z": DramTensor("z", (4,), "float32")})
    assert run.wait_for(other, 200.0) == 200.0
    assert run.wait_for(user, 200.0) == 1100.0


def test_psum_in_a_loop_waits_per_trip_and_timing_run_agrees(jax, meshes):
    # A fori_loop whose trip multiplies the psum's result (dependent, program order):
    # every trip's kernels that use it start at its end; the cost_analysis timing run
    # (spmd drive on zeros) gives the call's span.
    from jax import shard_map
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_trn

    def body(x, a, w):
        def step(i, c):
            s, m = c
            return jax.lax.psum(s, "d") * 0.125, m @ w
        return jax.lax.fori_loop(0, 2, step, (x, a))

    outs, exs, costs = [], [], []
    for mesh in meshes:
        f = jax.jit(shard_map(body, mesh=mesh, in_specs=(P("d"), P("d"), P()),
                              out_specs=(P("d"), P("d")), check_vma=False))
        args = [jax.device_put(X[:, :128].copy(), NamedSharding(mesh, P("d"))),
                jax.device_put(A[:, :128].copy(), NamedSharding(mesh, P("d"))),
                jax.device_put(W[:128, :128] / 12, NamedSharding(mesh, P()))]
        with jax.default_matmul_precision("highest"), jax_trn.profile() as prof:
            outs.append([np.asarray(o) for o in f(*args)])
            exs += prof.executions
            if prof.executions:
                costs.append(f.lower(*args).compile().cost_analysis())
    for t, c in zip(*outs):
        np.testing.assert_allclose(t, c, rtol=1e-5, atol=1e-4)
    (ex,) = exs
    assert len(ex.collectives) == 2
    for c in ex.collectives:
        users = [k for k in ex.kernels if k.device == ex.devices[0] and k.name.startswith("multiply")
                 and k.start_ns >= c.start_ns]
        assert min(k.start_ns for k in users) >= c.end_ns
    assert costs[0]["simulated_time_s"] == pytest.approx(ex.span_ns * 1e-9, rel=1e-9)
