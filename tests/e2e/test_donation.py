"""Buffer donation on trn against the CPU backend (issue 12, item 4).

Before: JAX warned "Donation is not implemented for ('trn',)" listing every donated
buffer, the donated input stayed alive and each donated update allocated its output
anew (peak HBM twice the state). Now a donated argument is deleted, its HBM becomes the
aliased output's (no allocation: bytes in use and peak stay flat over a loop of donated
updates), with donate_argnums, donate_argnames, an optax-style state update and
sharded programs; a donated buffer passed twice fails as on CPU.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import warnings

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _call(jax, f, *args):
    """f(*args), and the warnings it raised."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = jax.block_until_ready(f(*args))
    return out, [str(w.message) for w in caught]


def _in_use(device) -> tuple[int, int]:
    s = device.memory_stats()
    return s["bytes_in_use"], s["peak_bytes_in_use"]


def test_a_donated_argument_is_deleted_without_a_warning(jax, trn, cpu):
    f = jax.jit(lambda a, b: a * 2 + b, donate_argnums=0)
    results = []
    for device in (trn, cpu):
        x, b = (jax.device_put(np.arange(6, dtype=np.float32).reshape(2, 3), device)
                for _ in range(2))
        out, caught = _call(jax, f, x, b)
        assert caught == [] and x.is_deleted() and not b.is_deleted()
        with pytest.raises(RuntimeError, match=r"Array has been deleted with shape=float32\[2,3\]"):
            np.asarray(x)
        with pytest.raises(ValueError, match="INVALID_ARGUMENT: Invalid buffer passed to "
                           "Execute.. as argument 0 to replica 0: INVALID_ARGUMENT: Buffer has "
                           "been deleted or donated"):
            f(x, b)                          # JAX's fast path leaves the check to PJRT
        results.append(np.asarray(out))
    np.testing.assert_array_equal(results[0], results[1])


LOOP = """
import jax, numpy as np
trn = jax.devices("trn")[0]
f = jax.jit(lambda w, g: w - 0.1 * g, donate_argnums=0)
g = jax.device_put(np.ones((128, 128), np.float32), trn)
w = jax.device_put(np.zeros((128, 128), np.float32), trn)
start = trn.memory_stats()["bytes_in_use"]
for _ in range(10):
    w = f(w, g)
s = trn.memory_stats()
print(start, s["bytes_in_use"], s["peak_bytes_in_use"], float(np.asarray(w)[0, 0]))
"""


def test_a_loop_of_donated_updates_allocates_nothing():
    """In a fresh process (a clean peak): the state and the gradient are all the HBM
    the loop ever holds (before: a second state at every step, peak +64 KiB)."""
    proc = subprocess.run([sys.executable, "-c", LOOP], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    start, in_use, peak, value = proc.stdout.split()
    assert int(in_use) == int(start) == 2 * 128 * 128 * 4
    assert int(peak) - int(start) < 1024              # constants of the program at most
    assert float(value) == pytest.approx(-1.0)


def test_without_donation_each_update_needs_a_second_buffer(jax, trn):
    """The contrast: the same update without donation raises the peak by a state."""
    f = jax.jit(lambda w: w + 1)
    w = jax.device_put(np.zeros((256, 256), np.float32), trn)
    w = f(w)
    base, peak = _in_use(trn)
    w2 = f(w)
    assert _in_use(trn)[0] == base + w.nbytes
    del w2


def test_donate_argnames_and_a_pytree_state(jax, trn, cpu):
    def step(params, grads, lr):
        return jax.tree.map(lambda p, g: p - lr * g, params, grads)

    f = jax.jit(step, donate_argnames=("params",))
    outs = []
    for device in (trn, cpu):
        params = {"w": jax.device_put(np.ones((8, 4), np.float32), device),
                  "b": jax.device_put(np.zeros(4, np.float32), device)}
        grads = jax.tree.map(lambda p: jax.device_put(np.full(p.shape, 0.5, np.float32), device),
                             params)
        new, caught = _call(jax, f, params, grads, 0.1)
        assert caught == []
        assert all(p.is_deleted() for p in jax.tree.leaves(params))
        assert not any(g.is_deleted() for g in jax.tree.leaves(grads))
        outs.append(jax.tree.map(np.asarray, new))
    jax.tree.map(np.testing.assert_array_equal, outs[0], outs[1])


def test_an_optax_training_state_update_loop(jax, trn, cpu):
    optax = pytest.importorskip("optax")
    import jax.numpy as jnp

    opt = optax.adam(1e-2)

    def loss(params, x, y):
        return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)

    @jax.jit
    def _step(params, state, x, y):
        grads = jax.grad(loss)(params, x, y)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    step = jax.jit(_step, donate_argnums=(0, 1))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 8)).astype(np.float32)
    y = rng.normal(size=(32, 1)).astype(np.float32)
    final = []
    for device in (trn, cpu):
        params = jax.device_put({"w": np.zeros((8, 1), np.float32),
                                 "b": np.zeros(1, np.float32)}, device)
        state = opt.init(params)
        xd, yd = jax.device_put(x, device), jax.device_put(y, device)
        params, state = step(params, state, xd, yd)
        if device is trn:
            base = _in_use(trn)
        for _ in range(5):
            old = jax.tree.leaves((params, state))
            (params, state), caught = _call(jax, step, params, state, xd, yd)
            assert caught == [] and all(a.is_deleted() for a in old)
        if device is trn:
            assert _in_use(trn) == base
        final.append(float(loss(params, xd, yd)))
    assert final[0] == pytest.approx(final[1], rel=1e-4)


def test_a_failed_call_donates_nothing(jax, trn):
    from jax import lax

    def runaway(x):
        return lax.while_loop(lambda c: c[0] < 1e30, lambda c: c + 0 * c, x)

    f = jax.jit(runaway, donate_argnums=0,
                compiler_options={"jax_trn_max_while_iterations": 5})
    x = jax.device_put(np.ones(4, np.float32), trn)
    before = _in_use(trn)[0]
    with pytest.raises(jax.errors.JaxRuntimeError, match="ran 5 iterations"):
        f(x)
    assert not x.is_deleted() and _in_use(trn)[0] == before
    np.testing.assert_array_equal(np.asarray(x), np.ones(4, np.float32))


@pytest.mark.parametrize("args, message", [
    ("donate, same", "Attempt to use a buffer that was previously donated in the same call"),
    ("same, donate", "Attempt to donate a buffer which is also used by the same call"),
    ("donate, donate", "Attempt to donate the same buffer twice in Execute()"),
])
def test_donating_a_buffer_passed_twice_fails_as_on_cpu(jax, trn, cpu, args, message):
    donate = tuple(i for i, a in enumerate(args.split(", ")) if a == "donate")
    f = jax.jit(lambda a, b: (a + b, a - b), donate_argnums=donate)
    for device in (trn, cpu):
        x = jax.device_put(np.arange(4, dtype=np.float32), device)
        with pytest.raises(jax.errors.JaxRuntimeError, match=f"INVALID_ARGUMENT: {message}"):
            f(x, x)
        assert not x.is_deleted()


def test_memory_analysis_reports_the_aliased_bytes(jax, trn, cpu):
    f = jax.jit(lambda a, b: (a * 2, b + 1), donate_argnums=0)
    for device in (trn, cpu):
        x = jax.device_put(np.ones((64, 32), np.float32), device)
        mem = f.lower(x, x).compile().memory_analysis()
        assert mem.alias_size_in_bytes == 64 * 32 * 4
        assert mem.argument_size_in_bytes == 2 * 64 * 32 * 4


def test_an_unusable_donation_warns_as_on_cpu(jax, trn, cpu):
    f = jax.jit(lambda a: a.sum(), donate_argnums=0)
    for device in (trn, cpu):
        x = jax.device_put(np.arange(4, dtype=np.float32), device)
        _, caught = _call(jax, f, x)
        assert len(caught) == 1 and "Some donated buffers were not usable: float32[4]" in caught[0]
        assert "not implemented" not in caught[0] and not x.is_deleted()


# --- sharded programs ----------------------------------------------------------------------

def _sharded(jax, devices, x):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(devices[:4]), ("x",))
    return mesh, NamedSharding(mesh, P("x")), jax.device_put(x, NamedSharding(mesh, P("x")))


@pytest.mark.parametrize("kind", ["out_shardings", "unconstrained", "shard_map"])
def test_donation_in_sharded_programs(jax, trn_devices, kind):
    from jax.sharding import PartitionSpec as P
    x0 = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    results = []
    for devices in (trn_devices, jax.devices("cpu")):
        mesh, s, x = _sharded(jax, devices, x0)
        fn = lambda a: a * 2 + 1
        f = {"out_shardings": jax.jit(fn, donate_argnums=0, out_shardings=s),
             "unconstrained": jax.jit(fn, donate_argnums=0),
             "shard_map": jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("x"),
                                                out_specs=P("x")), donate_argnums=0)}[kind]
        y, caught = _call(jax, f, x)
        assert caught == [] and x.is_deleted()
        if devices is trn_devices:
            base = [_in_use(d)[0] for d in devices[:4]]
            for _ in range(3):
                y = f(y)
            assert [_in_use(d)[0] for d in devices[:4]] == base
        else:
            for _ in range(3):
                y = f(y)
        results.append(np.asarray(y))
    np.testing.assert_array_equal(results[0], results[1])


def test_aliases_read_aliasing_outputs_then_buffer_donors():
    from jax_trn.hw.program import DramTensor
    from jax_trn.runtime.donation import aliases
    t = lambda shape, dtype="float32": DramTensor("t", shape, dtype)
    params = [t((4, 4)), t((16,)), t((8,)), t((4, 4), "int32")]
    outputs = [t((4, 4)), t((2, 8)), t((3,))]
    attrs = [{"tf.aliasing_output": 0}, {"jax.buffer_donor": True},
             {"jax.buffer_donor": True}, {"jax.buffer_donor": True}]
    # param 1 (64 bytes) takes output 1 (same size, another shape); param 2 (32 bytes)
    # finds no output of its size; param 3 would fit output 0, which param 0 has
    assert aliases(attrs, params, outputs) == {0: 0, 1: 1}
    assert aliases([{"tf.aliasing_output": 2}, {}, {}, {}], params, outputs) == {}
