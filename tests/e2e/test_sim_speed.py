"""Issue 14's speed-ups keep behaviour: tile math on one BLAS thread only inside our
calls (`runtime.blas`), timelines computed once and reused (`runtime.replay`)."""
from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits


def _blas_threads(ours: bool = True) -> list[int]:
    """Threads of every BLAS library loaded; `ours=False`: without the simulator's own
    OpenBLAS (hw/sgemm.py, one thread whatever the user's setting: only it uses it)."""
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"
            and (ours or "scipy_openblas32" not in i["filepath"])]


def test_tile_math_runs_on_one_blas_thread_and_the_users_setting_is_kept(jax, trn):
    seen = []

    def host(v):
        seen.append(_blas_threads())
        return np.asarray(v)

    def f(a, b):
        c = a @ b
        return jax.pure_callback(host, jax.ShapeDtypeStruct(c.shape, c.dtype), c)

    a = np.ones((64, 64), np.float32)
    with threadpool_limits(limits=2, user_api="blas"):
        out = jax.jit(f)(jax.device_put(a, trn), jax.device_put(a, trn))
        np.testing.assert_array_equal(np.asarray(out), a @ a)
        after = _blas_threads(ours=False)
    assert seen and all(n == 1 for n in seen[0]), seen
    assert after and all(n == 2 for n in after), after


def test_one_thread_nests_and_restores():
    from jax_trn.runtime import blas
    with threadpool_limits(limits=2, user_api="blas"):
        with blas.one_thread():
            with blas.one_thread():
                assert set(_blas_threads()) == {1}
            assert set(_blas_threads()) == {1}
        assert set(_blas_threads()) == {2}
        with blas.one_thread(needed=False):
            assert set(_blas_threads()) == {2}


def _calls(jax, f, *arg_sets):
    import jax_trn
    with jax_trn.profile() as prof:
        outs = [np.asarray(f(*args)) for args in arg_sets]
    return outs, prof.executions


def test_a_straight_line_program_is_timed_once_and_its_numerics_replayed(jax, trn):
    f = jax.jit(lambda a, b: jax.numpy.tanh(a @ b) + 1.0)
    rng = np.random.default_rng(0)
    sets = [[jax.device_put(rng.normal(size=s).astype(np.float32), trn)
             for s in ((32, 48), (48, 16))] for _ in range(3)]
    outs, (first, second, third) = _calls(jax, f, *sets)
    # the timeline is the recorded one: the same records, the same simulated time
    assert all(a is b for a, b in zip(first.kernels, second.kernels))
    assert all(a is b for a, b in zip(first.kernels, third.kernels))
    assert first.simulated_time_s == third.simulated_time_s
    # the numerics ran on each call's own inputs
    for out, (a, b) in zip(outs, sets):
        np.testing.assert_allclose(out, np.tanh(np.asarray(a) @ np.asarray(b)) + 1.0,
                                   rtol=2e-2, atol=2e-2)   # default precision: bf16 passes
    assert not np.array_equal(outs[0], outs[1])


def test_a_loop_replays_its_recorded_path_and_times_a_new_one(jax, trn):
    f = jax.jit(lambda n, x: jax.lax.fori_loop(0, n, lambda i, v: v * 2.0 + 1.0, x))
    x = jax.device_put(np.arange(8, dtype=np.float32), trn)
    calls = [(np.int32(n), x) for n in (2, 2, 3, 3, 2)]
    outs, (a, b, c, d, e) = _calls(jax, f, *calls)
    for out, (n, _) in zip(outs, calls):
        want = np.arange(8, dtype=np.float32)
        for _ in range(int(n)):
            want = want * 2.0 + 1.0
        np.testing.assert_array_equal(out, want)
    assert all(r is s for r, s in zip(a.kernels, b.kernels))        # same path: replayed
    assert not any(r is s for r in b.kernels for s in c.kernels)    # new path: timed
    assert c.simulated_time_s > b.simulated_time_s
    assert all(r is s for r, s in zip(c.kernels, d.kernels))
    assert e.simulated_time_s == a.simulated_time_s                 # timed again, equal


def test_a_conditional_taking_another_branch_is_timed_afresh(jax, trn):
    jnp = jax.numpy
    f = jax.jit(lambda i, x: jax.lax.switch(i, [jnp.sin, lambda v: jnp.exp(v) * 3.0], x))
    x = jax.device_put(np.linspace(-1, 1, 256, dtype=np.float32).reshape(16, 16), trn)
    outs, (a, b, c) = _calls(jax, f, (np.int32(0), x), (np.int32(1), x), (np.int32(1), x))
    ref = [jax.jit(f)(np.int32(i), np.asarray(x)) for i in (0, 1, 1)]
    for out, want in zip(outs, ref):
        np.testing.assert_allclose(out, np.asarray(want), rtol=1e-5, atol=1e-5)
    assert not any(r is s for r in a.kernels for s in b.kernels)
    assert all(r is s for r, s in zip(b.kernels, c.kernels))


def test_tile_views_are_made_once_per_memory():
    from jax_trn.hw.memory import OnChipMemory
    from jax_trn.hw.operands import Tile
    mem = OnChipMemory("sbuf", 128, 1024)
    t = Tile("sbuf", 0, 4, 16, (8,), "float32")
    view = mem.view(t)
    assert mem.view(Tile("sbuf", 0, 4, 16, (8,), "float32")) is view
    view[...] = 3.0
    assert (mem.data[:4, 16:48].view(np.float32) == 3.0).all()


def test_a_core_keeps_no_dram_of_a_finished_call():
    """A call's temporaries die with it: a core referencing the last call's DRAM kept a
    whole call's temporaries alive on every device (GiBs on 1152 devices)."""
    import weakref

    from jax_trn.hw.core import NeuronCore
    from jax_trn.hw.isa import DmaCopy, DramAP
    from jax_trn.hw.operands import Tile
    from jax_trn.hw.program import DramTensor, Kernel
    from jax_trn.hw.spec import CHIPS
    core = NeuronCore(CHIPS["trn2"].core)
    tile = Tile("sbuf", 0, 4, 0, (8,), "float32")
    kernel = Kernel("k", [DmaCopy(name="load", dst=tile, src=DramAP("t", 0, ((8, 4), (1, 8)),
                                                                      "float32"))],
                    {"t": DramTensor("t", (32,), "float32")})
    dram = {"t": np.ones(32, np.float32)}
    alive = weakref.ref(dram["t"])
    run = core.run(kernel, dram)
    core.replay(kernel, run.order, dram)
    del dram
    assert alive() is None and not core.dram
