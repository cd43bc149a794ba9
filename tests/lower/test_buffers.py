"""Buffer assignment (jax_trn/lower/buffers.py): HBM temporaries with disjoint lifetimes
share a slot; ones live at the same step, or inside one loop, never do."""
from __future__ import annotations

import numpy as np

from jax_trn.hw.program import DramTensor, Kernel, While
from jax_trn.lower import buffers, lower_module

from .irbuild import FnBuilder
from .runner import SPEC, run_program


def _t(name: str, n: int) -> DramTensor:
    return DramTensor(name, (n,), "float32")


def _k(*tensors: DramTensor) -> Kernel:
    return Kernel("k", [], {t.name: t for t in tensors})


def test_a_chain_alternates_between_two_slots():
    x, out = _t("arg0", 8), _t("out0", 8)
    t = [_t(f"t{i}", 8 * (i + 1)) for i in range(4)]
    steps = [_k(x, t[0]), _k(t[0], t[1]), _k(t[1], t[2]), _k(t[2], t[3]), _k(t[3], out)]
    sizes, slot = buffers.assign(t, steps)
    assert slot == {"t0": 0, "t1": 1, "t2": 0, "t3": 1}
    assert sizes == [4 * 24, 4 * 32]


def test_values_of_one_loop_keep_their_own_memory():
    x = _t("arg0", 8)
    a, b, c, d = (_t(n, 8) for n in ("t0", "t1", "t2", "t3"))
    pred = DramTensor("t4", (), "bool")
    loop = While("while.0", [_k(b, pred)], pred, [_k(b, c), _k(c, b)], [b])
    steps = [_k(x, a), _k(a, b), loop, _k(b, d)]
    sizes, slot = buffers.assign([a, b, c, d, pred], steps)
    assert len({slot["t1"], slot["t2"], slot["t4"]}) == 3      # all live at the loop
    assert slot["t3"] != slot["t1"]                           # b is read by the last step


def test_best_fit_takes_the_smallest_slot_that_holds_it():
    x = _t("arg0", 1)
    big, small, mid = _t("t0", 100), _t("t1", 10), _t("t2", 10)
    steps = [_k(x, big, small), _k(x), _k(mid)]
    sizes, slot = buffers.assign([big, small, mid], steps)
    assert slot["t2"] == slot["t1"] and sizes == [400, 40]


def test_a_lowered_chain_shares_memory_and_computes_the_same():
    """A chain of unfused elementwise ops (lower_module does not fuse):
    each value is a temporary; the runtime binds them to shared slots, and the results
    are those of numpy."""
    b = FnBuilder()
    x = b.arg((256, 64))
    v = x
    for kind in ("exponential", "negate", "exponential", "negate", "tanh"):
        v = b.op(kind, [v], (256, 64), "float32")
    p = lower_module(b.ret(v), SPEC)
    assert len(p.temps) == 4 and len(p.slot_bytes) == 2
    assert p.temp_bytes == 2 * 256 * 64 * 4 < sum(t.nbytes for t in p.temps)
    xv = np.random.default_rng(0).normal(size=(256, 64)).astype(np.float32)
    got = run_program(p, [xv]).outputs[0]
    want = np.tanh(-np.exp(-np.exp(xv)))
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_a_jitted_chain_needs_the_memory_of_two_values(jax, trn):
    """Transposes do not fuse: each of the chain's values is a kernel's HBM temporary.
    XLA's memory analysis of the executable counts the shared slots, and the results
    are the CPU backend's."""
    jnp = jax.numpy

    def f(x):
        for _ in range(4):
            x = jnp.exp(x.T) - 1.0
        return x
    x = np.random.default_rng(1).normal(size=(512, 256)).astype(np.float32) * 0.1
    compiled = jax.jit(f).lower(jax.device_put(x, trn)).compile()
    temps = compiled.memory_analysis().temp_size_in_bytes
    assert 0 < temps <= 2 * x.nbytes
    got = np.asarray(compiled(jax.device_put(x, trn)))
    want = np.asarray(jax.jit(f)(jax.device_put(x, jax.devices("cpu")[0])))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
