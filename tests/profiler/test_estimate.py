"""jax_trn.estimate: timing without numerics, from one representative device.

It must give what running the program on the backend gives (same kernels, same
simulated time, same collectives) wherever its assumptions hold (SPMD devices arriving
together, static trip counts), and cost one device's memory on any system size."""
from __future__ import annotations

import numpy as np
import pytest

import jax_trn
from jax_trn.collectives import run_collective
from jax_trn.hw.program import Collective, DramTensor
from jax_trn.runtime.timing_only import symmetric_result

W = (np.random.default_rng(0).normal(size=(256, 256)) * 0.05).astype(np.float32)
X = np.random.default_rng(1).normal(size=(64, 256)).astype(np.float32)


def _scan(w, x):
    import jax
    import jax.numpy as jnp

    def body(c, _):
        return jnp.tanh(c @ w), None
    c, _ = jax.lax.scan(body, x, None, length=4)
    return c.sum()


def _dp_step(w, x):
    import jax
    import jax.numpy as jnp
    loss, g = jax.value_and_grad(lambda w: jnp.tanh(x @ w).sum())(w)
    return w - 0.1 * g, loss


def _backend(jax, f, *args):
    """The Execution of one call of jit(f) on the backend (compiled before)."""
    g = jax.jit(f)
    jax.block_until_ready(g(*args))
    with jax_trn.profile() as prof:
        jax.block_until_ready(g(*args))
    return prof.executions[-1]


def test_one_device_loop_matches_the_backend(jax):
    dev = jax.devices("trn")[0]
    w, x = jax.device_put((W, X), dev)
    ran = _backend(jax, _scan, w, x)
    est = jax_trn.estimate(_scan, w, x)
    assert [k.name for k in est.kernels] == [k.name for k in ran.kernels]
    assert est.simulated_time_s == ran.simulated_time_s


def test_shape_only_arguments_give_the_same_estimate(jax):
    dev = jax.devices("trn")[0]
    est = jax_trn.estimate(_scan, *jax.device_put((W, X), dev))
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (W, X)]
    assert jax_trn.estimate(_scan, *shapes).simulated_time_s == est.simulated_time_s


def test_data_parallel_step_matches_the_backend(jax):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = jax.make_mesh((8,), ("d",), devices=jax.devices("trn"))
    w = jax.device_put(W, NamedSharding(mesh, P()))
    x = jax.device_put(X, NamedSharding(mesh, P("d")))
    ran = _backend(jax, _dp_step, w, x)
    est = jax_trn.estimate(_dp_step, w, x)
    assert ran.collectives and len(est.collectives) == len(ran.collectives)
    for e, r in zip(est.collectives, ran.collectives):
        assert (e.name, e.algorithm, e.start_ns, e.end_ns) == \
            (r.name, r.algorithm, r.start_ns, r.end_ns)
    assert est.simulated_time_s == ran.simulated_time_s
    assert est.devices == [0]                   # one device was simulated


def test_1152_devices_cost_one_device(jax):
    from jax.sharding import AbstractMesh, AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = AbstractMesh((1152,), ("d",), axis_types=(AxisType.Auto,))
    w = jax.ShapeDtypeStruct(W.shape, W.dtype, sharding=NamedSharding(mesh, P()))
    x = jax.ShapeDtypeStruct((1152 * 8, 256), X.dtype, sharding=NamedSharding(mesh, P("d")))
    est = jax_trn.estimate(_dp_step, w, x, system="trn3-ultraserver")
    assert est.system == "trn3-ultraserver"
    assert est.collectives and all(len(c.devices) == 1152 for c in est.collectives)
    assert est.simulated_time_s > max(c.end_ns for c in est.collectives) * 1e-9 * 0.99


def test_a_mesh_larger_than_the_system_is_an_error(jax):
    from jax.sharding import AbstractMesh, AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = AbstractMesh((16,), ("d",), axis_types=(AxisType.Auto,))
    x = jax.ShapeDtypeStruct((16 * 8, 256), X.dtype, sharding=NamedSharding(mesh, P("d")))
    with pytest.raises(ValueError, match="16 devices"):
        jax_trn.estimate(lambda x: x.sum(), x, system="trn2.3xlarge")


@pytest.mark.parametrize("kind, kw", [
    ("all_reduce", {}), ("all_gather", {"dim": 1}), ("reduce_scatter", {"dim": 0}),
    ("all_to_all", {"split_dim": 0, "concat_dim": 1}),
])
def test_symmetric_result_is_what_the_collective_gives_identical_inputs(kind, kw):
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    t = DramTensor("t", x.shape, "float32")
    step = Collective(f"{kind}.0", kind, [t], [t], tuple(map(tuple, groups)), **kw)
    args = {"axis": kw.get("dim", 0)} if kind in ("all_gather", "reduce_scatter") else {}
    if kind == "all_to_all":
        args = {"split_axis": 0, "concat_axis": 1}
    from jax_trn.config import get_system
    topo = get_system("trn2.3xlarge").interconnect()
    out, _ = run_collective(kind, {d: x for d in range(8)}, groups, topo, **args)
    np.testing.assert_array_equal(symmetric_result(step, x, groups), out[0])


def test_timing_only_calls_time_as_running_does_and_have_no_values(jax):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    mesh = jax.make_mesh((8,), ("d",), devices=jax.devices("trn"))
    w = jax.device_put(W, NamedSharding(mesh, P()))
    x = jax.device_put(X, NamedSharding(mesh, P("d")))
    ran = _backend(jax, _dp_step, w, x)
    step = jax.jit(_dp_step)
    with jax_trn.timing_only(), jax_trn.profile() as prof:
        w2, loss = jax.block_until_ready(step(w, x))
        w3, _ = jax.block_until_ready(step(w2, x))       # arrays without values go on
    assert [e.simulated_time_s for e in prof.executions] == [ran.simulated_time_s] * 2
    assert w3.shape == W.shape
    with pytest.raises(Exception, match="timing_only"):
        float(loss)
    with pytest.raises(Exception, match="timing_only"):
        step(w2, x)                                      # a computing call refuses them
    np.testing.assert_allclose(np.asarray(step(w, x)[1]), np.asarray(_dp_step(W, X)[1]),
                               rtol=2e-2)


def test_timing_only_calls_donate(jax):
    dev = jax.devices("trn")[0]
    x = jax.device_put(X, dev)
    f = jax.jit(lambda x: x * 2, donate_argnums=0)
    with jax_trn.timing_only():
        y = f(x)
    assert x.is_deleted() and y.shape == X.shape
