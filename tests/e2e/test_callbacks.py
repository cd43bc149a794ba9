"""Host callbacks on trn against the CPU backend (issue 12, item 3): jax.debug.print /
debug.callback, pure_callback (with vmap_method), io_callback (ordered and not), checkify
and equinox.error_if; inside while / scan / cond, over device meshes (one call for the
whole array under jit, one per device under shard_map / pmap / partitioned=True);
errors reach the user as on CPU; each call is a profiler record with its transfers.

Every test here failed before host callbacks existed on trn: `debug_print` had no rule
for the platform, the others raised "`EmitPythonCallback` not supported on trn backend".
The CPU backend runs callbacks asynchronously: its side of each comparison ends with
`jax.effects_barrier()`.
"""
from __future__ import annotations

import gc

import numpy as np
import pytest


def _on(jax, device, f, *args):
    """f(*args) jitted on `device`, with every callback of the call finished."""
    out = jax.jit(f)(*[jax.device_put(a, device) for a in args])
    out = jax.block_until_ready(out)
    jax.effects_barrier()
    return out


def _both(jax, trn, cpu, f, *args):
    """(trn result, trn log, cpu result, cpu log) of `f(log, *args)`."""
    results = []
    for device in (trn, cpu):
        log: list = []
        results += [_on(jax, device, lambda *a: f(log, *a), *args), log]
    return results


def _close(a, b):
    for x, y in zip(np.atleast_1d(np.asarray(a, dtype=object)), np.atleast_1d(
            np.asarray(b, dtype=object))):
        np.testing.assert_allclose(np.asarray(x, np.float64), np.asarray(y, np.float64),
                                   rtol=1e-6, atol=1e-6)


# --- the callback kinds ---------------------------------------------------------------

def test_debug_print_prints_what_cpu_prints(jax, trn, cpu, capsys):
    import jax.numpy as jnp

    def f(x):
        jax.debug.print("x={x} sum={s}", x=x, s=x.sum(), ordered=True)
        jax.debug.print("static {} and {}", 3, jnp.int32(7), ordered=True)
        jax.debug.print("unordered {}", x[1:3])
        return x * 2

    x = np.arange(5, dtype=np.float32)
    printed = []
    for device in (trn, cpu):
        _on(jax, device, f, x)
        printed.append(capsys.readouterr().out.splitlines())
    ordered = ["x=[0. 1. 2. 3. 4.] sum=10.0", "static 3 and 7"]
    assert [line for line in printed[0] if "unordered" not in line] == ordered
    assert sorted(printed[0]) == sorted(printed[1]) == sorted(ordered + ["unordered [1. 2.]"])


def test_pure_callback_gets_cpu_arrays_and_returns_results(jax, trn, cpu):
    def f(log, x, y):
        def host(a, b):
            log.append((type(a).__name__, a.dtype.name, a.shape, b.dtype.name))
            return np.sin(np.asarray(a)) * np.asarray(b, np.float32), np.asarray(b) + 1
        out = jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct(y.shape, y.dtype)
        s, t = jax.pure_callback(host, out, x, y)
        return s + 1, t * 2

    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    y = np.arange(3 * 4, dtype=np.int32).reshape(3, 4)
    got, tlog, want, clog = _both(jax, trn, cpu, f, x, y)
    _close(got, want)
    assert tlog == clog == [("ArrayImpl", "float32", (3, 4), "int32")]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "int8", "uint32", "bool"])
def test_callback_operands_and_results_keep_their_dtype(jax, trn, cpu, dtype):
    import jax.numpy as jnp
    x = (np.arange(6) % 2 == 1) if dtype == "bool" else np.arange(6)
    x = np.asarray(jnp.asarray(x).astype(dtype))

    def f(log, a):
        def host(v):
            log.append(np.asarray(v).copy())
            return np.asarray(v)[::-1].copy()
        return jax.pure_callback(host, jax.ShapeDtypeStruct(a.shape, a.dtype), a)

    got, tlog, want, clog = _both(jax, trn, cpu, f, x)
    assert got.dtype == want.dtype and np.array_equal(np.asarray(got), np.asarray(want))
    assert tlog[0].dtype == clog[0].dtype and np.array_equal(tlog[0], clog[0])


def test_io_callback_ordered_and_unordered_keep_program_order(jax, trn, cpu):
    from jax.experimental import io_callback

    def f(log, x):
        io_callback(lambda v: log.append(("first", float(v))), None, x.sum(), ordered=True)
        y = io_callback(lambda v: (log.append(("ret", float(v))), np.float32(v * 3))[1],
                        jax.ShapeDtypeStruct((), np.float32), x.max(), ordered=True)
        io_callback(lambda v: log.append(("last", float(v))), None, y, ordered=True)
        z = io_callback(lambda v: np.asarray(v) + 1, jax.ShapeDtypeStruct(x.shape, x.dtype), x)
        return y, z

    x = np.arange(4, dtype=np.float32)
    got, tlog, want, clog = _both(jax, trn, cpu, f, x)
    _close(got, want)
    assert tlog == clog == [("first", 6.0), ("ret", 3.0), ("last", 9.0)]


def test_ordered_effects_order_calls_across_executions(jax, trn):
    """The runtime token JAX passes from one call to the next goes in and out."""
    from jax.experimental import io_callback
    log = []
    f = jax.jit(lambda x: (io_callback(log.append, None, x, ordered=True), x + 1)[1])
    x = jax.device_put(np.float32(0), trn)
    for _ in range(4):
        x = f(x)
    assert [float(v) for v in log] == [0.0, 1.0, 2.0, 3.0]


def test_callbacks_inside_while_scan_and_cond(jax, trn, cpu):
    from jax import lax
    from jax.experimental import io_callback

    def f(log, x):
        def body(i, c):
            io_callback(lambda i, v: log.append(("fori", int(i), np.asarray(v).tolist())),
                        None, i, c, ordered=True)
            return c * 2
        c = lax.fori_loop(0, 3, body, x)

        def cond_fn(s):
            return s[0] < 20.0
        def while_body(s):
            jax.debug.callback(lambda v: log.append(("while", np.asarray(v).tolist())), s)
            return s + 7
        w = lax.while_loop(cond_fn, while_body, c)

        def step(carry, xi):
            io_callback(lambda a, b: log.append(("scan", float(a), float(b))), None, carry, xi,
                        ordered=True)
            return carry + xi, carry
        total, partial = lax.scan(step, np.float32(0), x)

        pure = lambda v: jax.pure_callback(lambda u: np.asarray(u) * 10,
                                           jax.ShapeDtypeStruct(v.shape, v.dtype), v)
        d = lax.cond(total > 2, pure, lambda v: v, w)
        e = lax.cond(total > 100, pure, lambda v: v - 1, w)
        return d, e, partial

    x = np.array([1, 2, 0.5], np.float32)
    got, tlog, want, clog = _both(jax, trn, cpu, f, x)
    _close(got, want)
    assert tlog == clog and [e[0] for e in tlog] == ["fori"] * 3 + ["while"] * 2 + ["scan"] * 3


def test_a_callback_result_carried_through_scan_and_while(jax, trn, cpu):
    def f(log, c0, xs):
        def times(k):
            return lambda c: jax.pure_callback(lambda u: np.asarray(u) * k,
                                               jax.ShapeDtypeStruct(c.shape, c.dtype), c)

        def step(c, x):
            c = times(2)(c)
            return c + x, c
        carry, ys = jax.lax.scan(step, c0, xs)
        w = jax.lax.while_loop(lambda c: c[0] < 100, times(3), c0)
        return carry, ys, w

    got, _, want, _ = _both(jax, trn, cpu, f, np.ones(3, np.float32),
                            np.arange(12, dtype=np.float32).reshape(4, 3))
    _close(got, want)


@pytest.mark.parametrize("method", ["sequential", "sequential_unrolled", "expand_dims",
                                    "broadcast_all"])
def test_pure_callback_vmap_method(jax, trn, cpu, method):
    def f(log, x, y):
        def g(a, b):
            def host(u, w):
                log.append((np.shape(u), np.shape(w)))
                return np.asarray(u) * np.asarray(w)
            return jax.pure_callback(host, jax.ShapeDtypeStruct(a.shape, a.dtype), a, b,
                                     vmap_method=method)
        return jax.vmap(g, in_axes=(0, None))(x, y)

    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    y = np.array([2, 3], np.float32)
    got, tlog, want, clog = _both(jax, trn, cpu, f, x, y)
    _close(got, want)
    assert tlog == clog


# --- errors -----------------------------------------------------------------------------

def test_an_error_in_a_callback_reaches_the_user_as_on_cpu(jax, trn, cpu):
    def boom(v):
        raise ValueError("boom from the host")

    fs = {"pure": lambda x: jax.pure_callback(boom, jax.ShapeDtypeStruct(x.shape, x.dtype), x),
          "debug": lambda x: (jax.debug.callback(boom, x), x + 1)[1]}
    for name, f in fs.items():
        for device in (trn, cpu):
            with pytest.raises(jax.errors.JaxRuntimeError) as info:
                _on(jax, device, f, np.ones(3, np.float32))
            text = str(info.value)
            assert text.startswith("INTERNAL: ") and "ValueError: boom from the host" in text
    x = jax.device_put(np.ones(3, np.float32), trn)       # the device goes on working
    assert np.asarray(jax.jit(lambda v: v + 1)(x)).tolist() == [2.0] * 3


def test_a_callback_returning_the_wrong_shape_fails_as_on_cpu(jax, trn, cpu):
    f = lambda x: jax.pure_callback(lambda v: np.asarray(v)[:2],
                                    jax.ShapeDtypeStruct(x.shape, x.dtype), x)
    for device in (trn, cpu):
        with pytest.raises(jax.errors.JaxRuntimeError,
                           match=r"Incorrect output shape for return value #0: "
                                 r"Expected: \(3,\), Actual: \(2,\)"):
            _on(jax, device, f, np.ones(3, np.float32))


def test_checkify(jax, trn, cpu):
    import jax.numpy as jnp
    from jax.experimental import checkify

    def f(x, i):
        checkify.check(x.sum() > 0, "sum must be positive, got {s}", s=x.sum())
        return jnp.log(x)[i]

    # (index_checks aggregate with an argmax over bool, which trn does not lower yet)
    for errors, want in ((checkify.user_checks | checkify.float_checks,
                          "sum must be positive, got -0.5"),
                         (checkify.nan_checks, "nan generated by primitive: log")):
        messages = []
        for device in (trn, cpu):
            x, i = (jax.device_put(v, device) for v in (np.array([-1.0, 0.5], np.float32),
                                                        np.int32(1)))
            err, _ = jax.jit(checkify.checkify(f, errors=errors))(x, i)
            messages.append(err.get())
        assert messages[0] == messages[1] and want in messages[0]


def test_checkify_check_as_a_runtime_error(jax, trn, cpu):
    """`jax_xla_runtime_errors`: an unfunctionalized check is a host callback."""
    from jax._src import config
    from jax.experimental import checkify

    def f(x):
        checkify.check(x.sum() > 0, "sum must be positive")
        return x + 1

    with config.xla_runtime_errors(True):
        for device in (trn, cpu):
            assert np.asarray(_on(jax, device, f, np.ones(2, np.float32))).tolist() == [2, 2]
            with pytest.raises(jax.errors.JaxRuntimeError, match="sum must be positive"):
                _on(jax, device, f, -np.ones(2, np.float32))


def test_equinox_error_if(jax, trn, cpu):
    eqx = pytest.importorskip("equinox")

    def f(x):
        return eqx.error_if(x, x > 2, "x too big") * 2

    for device in (trn, cpu):
        ok = eqx.filter_jit(f)(jax.device_put(np.array([1.0, 2.0], np.float32), device))
        assert np.asarray(ok).tolist() == [2.0, 4.0]
        with pytest.raises(eqx.EquinoxRuntimeError, match="x too big"):
            eqx.filter_jit(f)(jax.device_put(np.array([1.0, 3.0], np.float32), device))
        with pytest.raises(jax.errors.JaxRuntimeError, match="_EquinoxRuntimeError: x too big"):
            _on(jax, device, f, np.array([1.0, 3.0], np.float32))


# --- meshes -----------------------------------------------------------------------------

def _mesh(jax, devices):
    from jax.sharding import Mesh
    return Mesh(np.array(devices[:4]), ("x",))


def _on_mesh(jax, devices, f, x):
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = _mesh(jax, devices)
    out = jax.block_until_ready(jax.jit(f(mesh))(jax.device_put(x, NamedSharding(mesh, P("x")))))
    jax.effects_barrier()
    return out


def _mesh_both(jax, trn_devices, f, x):
    results = []
    for devices in (trn_devices, jax.devices("cpu")):
        log: list = []
        results += [_on_mesh(jax, devices, lambda mesh: f(log, mesh), x), log]
    return results


def test_callbacks_of_a_sharded_jit_see_whole_arrays_once(jax, trn_devices):
    from jax.experimental import io_callback

    def f(log, mesh):
        def g(x):
            jax.debug.callback(lambda v: log.append(("debug", np.asarray(v).tolist())), x)
            y = jax.pure_callback(lambda v: (log.append(("pure", np.shape(v))),
                                             np.cos(np.asarray(v)))[1],
                                  jax.ShapeDtypeStruct(x.shape, x.dtype), x)
            io_callback(lambda v: log.append(("io", float(v))), None, y.sum(), ordered=True)
            return y * 2
        return g

    x = np.arange(8, dtype=np.float32)
    got, tlog, want, clog = _mesh_both(jax, trn_devices, f, x)
    _close(got, want)
    assert tlog[:2] == clog[:2] == [("debug", x.tolist()), ("pure", (8,))]
    assert len(tlog) == len(clog) == 3 and tlog[2][1] == pytest.approx(clog[2][1])


def test_a_sharded_loop_with_collectives_calls_back_once_per_trip(jax, trn_devices):
    """The callback is a rendezvous of the SPMD program (its operand a reduction over
    the shards, the loop body a reshard): every device waits for partition 0's call."""
    from jax.experimental import io_callback

    def f(log, mesh):
        def g(x):
            def body(i, c):
                io_callback(lambda i, s: log.append((int(i), float(s))), None, i, c.sum(),
                            ordered=True)
                return c * 2 + c[::-1]
            return jax.lax.fori_loop(0, 3, body, x)
        return g

    x = np.arange(16, dtype=np.float32).reshape(8, 2)
    got, tlog, want, clog = _mesh_both(jax, trn_devices, f, x)
    _close(got, want)
    assert tlog == clog == [(0, 120.0), (1, 360.0), (2, 1080.0)]


def test_callbacks_under_shard_map_run_on_every_device(jax, trn_devices):
    from jax.experimental import io_callback
    from jax.sharding import PartitionSpec as P

    def f(log, mesh):
        def g(x):
            jax.debug.callback(lambda v: log.append(("debug", np.asarray(v).tolist())), x)
            y = jax.pure_callback(lambda v: np.asarray(v) + 100,
                                  jax.ShapeDtypeStruct(x.shape, x.dtype), x)
            io_callback(lambda v: log.append(("io", float(v))), None, y.sum(), ordered=True)
            total = jax.lax.psum(y.sum(), "x")        # a collective between callbacks
            jax.debug.callback(lambda v: log.append(("total", float(v))), total)
            return y / total
        return jax.shard_map(g, mesh=mesh, in_specs=P("x"), out_specs=P("x"))

    x = np.arange(8, dtype=np.float32)
    got, tlog, want, clog = _mesh_both(jax, trn_devices, f, x)
    _close(got, want)
    assert sorted(tlog) == sorted(clog) and len(tlog) == 12


def test_partly_manual_shard_map_calls_once_per_manual_shard(jax, trn_devices):
    """JAX's own rewrite for partly manual meshes (a cond on the auto axes' index)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    x0 = np.arange(16, dtype=np.float32).reshape(4, 4)
    logs = []
    for devices in (trn_devices, jax.devices("cpu")):
        mesh = Mesh(np.array(devices[:4]).reshape(2, 2), ("x", "y"))
        log: list = []

        def g(a):
            jax.debug.callback(lambda v: log.append(np.asarray(v).tolist()), a)
            return a * 2
        f = jax.jit(jax.shard_map(g, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                                  axis_names={"x"}))
        out = jax.block_until_ready(f(jax.device_put(x0, NamedSharding(mesh, P("x", "y")))))
        jax.effects_barrier()
        np.testing.assert_array_equal(np.asarray(out), x0 * 2)
        logs.append(sorted(log))
    assert logs[0] == logs[1] == [x0[:2].tolist(), x0[2:].tolist()]


def test_partitioned_debug_callback_sees_each_shard(jax, trn_devices):
    def f(log, mesh):
        def g(x):
            jax.debug.callback(lambda v: log.append(np.asarray(v).tolist()), x,
                               partitioned=True)
            return x + 1
        return g

    x = np.arange(8, dtype=np.float32)
    got, tlog, want, clog = _mesh_both(jax, trn_devices, f, x)
    _close(got, want)
    assert sorted(tlog) == sorted(clog) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_pmap_calls_back_per_device(jax, trn_devices):
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    logs = []
    for devices in (trn_devices[:4], jax.devices("cpu")[:4]):
        log: list = []

        def f(v):
            jax.debug.callback(lambda u: log.append(np.asarray(u).tolist()), v)
            return jax.pure_callback(lambda u: np.asarray(u) * 3,
                                     jax.ShapeDtypeStruct(v.shape, v.dtype), v)
        out = jax.block_until_ready(jax.pmap(f, devices=devices)(x))
        jax.effects_barrier()
        np.testing.assert_array_equal(np.asarray(out), x * 3)
        logs.append(sorted(log))
    assert logs[0] == logs[1] == x.tolist()


# --- simulated time, profiler, lifetime -----------------------------------------------------

def test_each_call_is_a_profiler_record_timed_over_the_host_link(jax, trn):
    import jax_trn
    n = 4096
    x = jax.device_put(np.ones(n, np.float32), trn)
    f = jax.jit(lambda v: jax.pure_callback(lambda u: np.asarray(u) * 2,
                                            jax.ShapeDtypeStruct(v.shape, v.dtype), v) + 1)
    with jax_trn.profile() as prof:
        np.testing.assert_array_equal(np.asarray(f(x)), np.full(n, 3, np.float32))
    ex = prof.executions[-1]
    [rec] = [k for k in ex.kernels if k.name.startswith("host_callback")]
    chip = jax_trn.get_system().chip
    one_way = chip.core.dma_fixed_ns + 4 * n / chip.links.host_bytes_per_ns
    assert rec.duration_ns == pytest.approx(2 * one_way)
    assert [e.opcode for e in rec.events] == ["DmaToHost", "DmaFromHost"]
    assert [e.bytes for e in rec.events] == [4 * n, 4 * n] and rec.hbm_bytes == 8 * n
    after = [k for k in ex.kernels if k.start_ns >= rec.end_ns]
    assert after, "the kernel after the callback waits for its results"
    assert ex.span_ns >= rec.end_ns
    assert "host_callback" in str(ex.summary())
    assert any(e.get("name") == rec.name for e in ex.trace_events()["traceEvents"])


def test_timing_runs_call_nothing(jax, trn):
    calls = []
    f = jax.jit(lambda v: jax.pure_callback(lambda u: (calls.append(1), np.asarray(u))[1],
                                            jax.ShapeDtypeStruct(v.shape, v.dtype), v))
    compiled = f.lower(jax.device_put(np.ones(4, np.float32), trn)).compile()
    assert compiled.cost_analysis()["simulated_time_s"] > 0
    assert calls == []
    compiled(jax.device_put(np.ones(4, np.float32), trn))
    assert calls == [1]


def test_the_registry_forgets_a_callback_with_its_executables(jax, trn):
    from jax_trn.runtime import callbacks
    before = set(callbacks._LIVE)

    def host(v):
        return np.asarray(v)

    f = jax.jit(lambda v: jax.pure_callback(host, jax.ShapeDtypeStruct(v.shape, v.dtype), v) * 5)
    np.testing.assert_array_equal(np.asarray(f(jax.device_put(np.ones(3, np.float32), trn))),
                                  [5, 5, 5])
    mine = set(callbacks._LIVE) - before
    assert len(mine) == 1
    del f
    jax.clear_caches()
    gc.collect()
    assert not mine & set(callbacks._LIVE)
