"""Loops on chip (issue 15, point 4) against the CPU backend: which whiles become an
on-chip `Loop` (static trip count, carries resident in SBUF) and which stay host-driven
(with the reason in the step's notes), their numerics, their timing (trip cost below
one host control decision, timing-only runs without numerics) and replayed calls."""
from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.test_control_flow import jnp, lax  # noqa: F401  (fixtures)
from tests.e2e.test_ops import _rand, check


def _program(jax, f, *args):
    """The per-device program trn compiles `jax.jit(f)` into."""
    from jax_trn import comparison, config
    from jax_trn.runtime import compiler
    specs = [jax.ShapeDtypeStruct(np.shape(a), np.asarray(a).dtype) for a in args]
    code, _, _ = comparison._stablehlo(f, specs, {})
    options = config.current()
    return compiler.lower(compiler.to_ir(code, options, name="f"), options)


def _loops(prog):
    from jax_trn.hw.program import Loop, While, walk_steps
    steps = list(walk_steps(prog.steps))
    return ([s for s in steps if isinstance(s, Loop)], [s for s in steps if isinstance(s, While)])


# --- which loops go on chip ------------------------------------------------------------------

def test_fori_loop_runs_on_chip_with_its_carry_in_sbuf(jax, trn, cpu, lax):
    x = _rand((128, 128), "float32", np.random.default_rng(0))
    f = lambda x: lax.fori_loop(0, 7, lambda i, c: c * 1.0001 + 1.0, x)   # noqa: E731
    check(jax, trn, cpu, f, x)
    loops, whiles = _loops(_program(jax, f, x))
    assert not whiles and len(loops) == 1
    loop = loops[0]
    assert loop.trips == 7 and loop.resident == ["out0"]
    assert len(loop.body) == 1 and loop.enter and loop.exit
    body_dram = [ins for ins in loop.body[0].instructions if ins.queue.startswith("dma")]
    assert not body_dram                  # no HBM traffic per trip
    assert any("resident in SBUF: out0" in n for n in loop.notes)


def test_data_dependent_while_stays_host_driven_and_says_why(jax, trn, cpu, lax):
    x = _rand((4, 8), "float32", np.random.default_rng(1), 0.5, 1)

    def f(x):
        return lax.while_loop(lambda c: c[1].sum() < 100.0, lambda c: (c[0] + 1, c[1] * 2),
                              (0, x))
    check(jax, trn, cpu, f, x)
    loops, whiles = _loops(_program(jax, f, x))
    assert not loops and len(whiles) == 1
    assert whiles[0].notes and "host-driven" in whiles[0].notes[0]


def test_runtime_limit_stays_host_driven(jax, trn, cpu, lax):
    x = _rand((4, 8), "float32", np.random.default_rng(2))
    n = np.int32(5)

    def f(x, n):
        return lax.fori_loop(0, n, lambda i, c: c * 0.5 + 1, x)
    check(jax, trn, cpu, f, x, n)
    loops, whiles = _loops(_program(jax, f, x, n))
    assert not loops and all(w.notes[0].startswith("host-driven loop: ") for w in whiles)


def test_body_reading_the_index_runs_on_chip_with_carries_in_hbm(jax, trn, cpu, lax):
    """fori_loop's own index is a second carried counter the body reads: the loop
    still counts on chip, its carries stay in HBM (the body is several kernels)."""
    x = _rand((8, 8), "float32", np.random.default_rng(3))
    f = lambda x: lax.fori_loop(0, 4, lambda i, c: c * 2 + i.astype(c.dtype), x)  # noqa: E731
    check(jax, trn, cpu, f, x)
    loops, _ = _loops(_program(jax, f, x))
    assert len(loops) == 1 and not loops[0].resident
    assert "carries stay in HBM" in loops[0].notes[0]


def test_scan_with_xs_and_a_carry(jax, trn, cpu, lax):
    xs = _rand((6, 4, 8), "float32", np.random.default_rng(4))
    c0 = _rand((4, 8), "float32", np.random.default_rng(5))

    def f(c0, xs):
        return lax.scan(lambda c, x: (c * 0.5 + x, c.sum()), c0, xs)
    check(jax, trn, cpu, f, c0, xs, rtol=1e-5, atol=1e-5)


def test_scan_without_xs_keeps_the_carry_resident(jax, trn, cpu, lax):
    c0 = _rand((64, 32), "float32", np.random.default_rng(6))
    f = lambda c: lax.scan(lambda c, _: (c * 0.75 - 0.5, None), c, None, length=5)[0]  # noqa: E731
    check(jax, trn, cpu, f, c0)
    loops, _ = _loops(_program(jax, f, c0))
    assert len(loops) == 1 and loops[0].resident


def test_read_only_carry_is_loaded_once(jax, trn, cpu, lax):
    """A carry the body reads but passes through unchanged (a weight) is loaded into
    SBUF by the enter kernel and never stored back."""
    x = _rand((32, 16), "float32", np.random.default_rng(7))
    w = _rand((32, 16), "float32", np.random.default_rng(8))

    def f(x, w):
        return lax.fori_loop(0, 3, lambda i, c: (c[0] * c[1] + 1, c[1]), (x, w))
    check(jax, trn, cpu, f, x, w, rtol=1e-5)
    loops, _ = _loops(_program(jax, f, x, w))
    loop = loops[0]
    assert len(loop.resident) == 2
    stored = {ins.dst.tensor for k in loop.exit for ins in k.instructions
              if ins.queue.startswith("dma")}
    assert len(stored & set(loop.resident)) == 1


def test_zero_and_one_trip_loops(jax, trn, cpu, lax):
    x = _rand((8, 8), "float32", np.random.default_rng(9))
    for n in (0, 1, 2):
        check(jax, trn, cpu, lambda x, n=n: lax.fori_loop(0, n, lambda i, c: c * 3 - 1, x), x)


def test_final_counter_is_a_result(jax, trn, cpu, lax):
    x = _rand((8, 8), "float32", np.random.default_rng(10))

    def f(x):
        return lax.while_loop(lambda c: c[0] < 9, lambda c: (c[0] + 2, c[1] + 1.5), (1, x))
    check(jax, trn, cpu, f, x)
    loops, _ = _loops(_program(jax, f, x))
    assert len(loops) == 1 and loops[0].trips == 4


def test_nested_loops_and_swapped_carries(jax, trn, cpu, lax):
    a = _rand((4, 3), "float32", np.random.default_rng(11))
    b = _rand((4, 3), "float32", np.random.default_rng(12))

    def f(a, b):
        inner = lambda c: lax.fori_loop(0, 3, lambda j, d: d * 1.5 - 0.25, c)  # noqa: E731
        return lax.fori_loop(0, 4, lambda i, c: (inner(c[1]), c[0] + 1), (a, b))
    check(jax, trn, cpu, f, a, b, rtol=1e-5)


def test_matmul_body(jax, trn, cpu, lax, jnp):
    x = _rand((64, 64), "float32", np.random.default_rng(13), -0.1, 0.1)
    w = _rand((64, 64), "float32", np.random.default_rng(14), -0.1, 0.1)
    f = lambda x, w: lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c @ w) + c, x)  # noqa: E731
    check(jax, trn, cpu, f, x, w, rtol=2e-2, atol=2e-2)


def test_bf16_carry(jax, trn, cpu, lax, jnp):
    x = _rand((16, 32), "bfloat16", np.random.default_rng(15))
    check(jax, trn, cpu, lambda x: lax.fori_loop(0, 5, lambda i, c: c * 0.5 + 1, x), x)


def test_carry_too_big_for_sbuf_stays_in_hbm(jax, trn, cpu, lax):
    """A carry larger than SBUF (8 MiB) is tiled over several DMAs: it stays in HBM."""
    x = _rand((1024, 2048), "float32", np.random.default_rng(16))
    f = lambda x: lax.fori_loop(0, 2, lambda i, c: c * 2 + 1, x)  # noqa: E731
    check(jax, trn, cpu, f, x)
    loops, _ = _loops(_program(jax, f, x))
    assert len(loops) == 1 and not loops[0].resident
    assert any("in HBM" in n for n in loops[0].notes)


# --- timing, replay, timing-only -----------------------------------------------------------

def test_trip_costs_less_than_a_host_decision(jax, trn, lax):
    import jax_trn
    from jax_trn.hw.isa_control import back_edge, back_edge_ns
    from jax_trn.runtime.executable import control_ns
    x = jax.device_put(np.ones((128, 128), np.float32), trn)
    span = {}
    for n in (4, 8):
        with jax_trn.profile() as prof:
            jax.block_until_ready(jax.jit(
                lambda x, n=n: lax.fori_loop(0, n, lambda i, c: c * 0.5, x))(x))
        span[n] = prof.executions[-1].span_ns
    spec = prof.executions[-1].chip_spec.core
    trip = (span[8] - span[4]) / 4
    assert back_edge_ns(back_edge("r", 1, 8), spec) < trip < control_ns(spec)


def test_estimate_times_a_static_loop_without_numerics(jax, trn, lax, monkeypatch):
    """timing-only runs need no numerics for an on-chip Loop: same time as a real call."""
    import jax_trn
    from jax_trn.hw import core as hw_core
    f = lambda x: lax.fori_loop(0, 6, lambda i, c: c * 0.5 + 2, x)  # noqa: E731
    x = np.ones((128, 64), np.float32)
    with jax_trn.profile() as prof:
        jax.block_until_ready(jax.jit(f)(jax.device_put(x, trn)))
    real = prof.executions[-1].simulated_time_s
    executed = []
    run = hw_core.NeuronCore.run
    monkeypatch.setattr(hw_core.NeuronCore, "run", lambda self, k, d, t=0.0, *, execute=True:
                        executed.append(execute) or run(self, k, d, t, execute=execute))
    est = jax_trn.estimate(f, jax.ShapeDtypeStruct(x.shape, x.dtype))
    assert executed and not any(executed)
    assert est.simulated_time_s == pytest.approx(real)


def test_replayed_calls_give_new_results(jax, trn, cpu, lax):
    """A second call reuses the recorded timeline (no decisions to compare) and still
    computes its own numerics."""
    f = jax.jit(lambda x: lax.fori_loop(0, 5, lambda i, c: c * 1.5 - 1, x))
    for seed in (17, 18, 19):
        x = _rand((32, 32), "float32", np.random.default_rng(seed))
        out = np.asarray(f(jax.device_put(x, trn)))
        ref = np.asarray(f(jax.device_put(x, cpu)))
        np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
