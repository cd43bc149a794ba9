"""Multi-device programs on the 8 NeuronCores of the default Trn2 chip, against JAX's CPU
backend with the same mesh (8 host devices, `--xla_force_host_platform_device_count`,
set in tests/conftest.py): pjit with Auto and Explicit axes, sharding constraints,
shard_map collectives, and the programs users write (data-parallel MLP step,
Megatron-style tensor parallelism, FSDP, MoE all_to_all, a ppermute ring)."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def meshes(jax, trn_devices):
    cpus = jax.devices("cpu")
    if len(cpus) < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (conftest)")

    def make(shape, names, devices, explicit=False):
        t = jax.sharding.AxisType.Explicit if explicit else jax.sharding.AxisType.Auto
        return jax.make_mesh(shape, names, devices=devices[:int(np.prod(shape))],
                             axis_types=(t,) * len(shape))

    return lambda shape, names, explicit=False: (
        make(shape, names, trn_devices, explicit), make(shape, names, cpus, explicit))


def _put(jax, mesh, x, spec):
    from jax.sharding import NamedSharding, PartitionSpec as P
    return jax.device_put(x, NamedSharding(mesh, P(*spec)))


def _both(jax, meshes, shape, names, f, args_specs, explicit=False, rtol=1e-5, atol=1e-6):
    """Runs f on trn and on CPU meshes of the same shape; checks values and shardings."""
    mt, mc = meshes(shape, names, explicit)
    out_t = f(mt)(*(_put(jax, mt, a, s) for a, s in args_specs))
    out_c = f(mc)(*(_put(jax, mc, a, s) for a, s in args_specs))
    for t, c in zip(jax.tree.leaves(out_t), jax.tree.leaves(out_c)):
        assert t.shape == c.shape and t.dtype == c.dtype
        assert {d.platform for d in t.devices()} == {"trn"}
        assert t.sharding.spec == c.sharding.spec, (t.sharding, c.sharding)
        np.testing.assert_allclose(np.asarray(t, np.float64), np.asarray(c, np.float64),
                                   rtol=rtol, atol=atol)
    return out_t


@pytest.fixture
def highest(jax):
    with jax.default_matmul_precision("highest"):
        yield


RNG = np.random.default_rng(0)
A = RNG.normal(size=(16, 32)).astype(np.float32)
B = RNG.normal(size=(32, 8)).astype(np.float32)


def test_elementwise_on_sharded_arrays(jax, meshes):
    _both(jax, meshes, (4, 2), ("x", "y"), lambda m: jax.jit(lambda a: jax.numpy.tanh(a) * 2),
          [(A, ("x", "y"))])


def test_matmul_with_sharded_contraction_all_reduces(jax, meshes, highest):
    _both(jax, meshes, (4, 2), ("x", "y"), lambda m: jax.jit(lambda a, b: a @ b),
          [(A, ("x", "y")), (B, ("y", None))])


def test_sum_and_max_over_sharded_axes(jax, meshes):
    f = lambda m: jax.jit(lambda a: (a.sum(0), a.max(1), a.sum()))  # noqa: E731
    _both(jax, meshes, (4, 2), ("x", "y"), f, [(A, ("x", "y"))])


def test_sharding_constraint_reshards(jax, meshes):
    from jax.sharding import NamedSharding, PartitionSpec as P
    f = lambda m: jax.jit(lambda a: jax.lax.with_sharding_constraint(  # noqa: E731
        a * 2, NamedSharding(m, P("y", "x"))) + 1)
    _both(jax, meshes, (4, 2), ("x", "y"), f, [(A, ("x", "y"))])


def test_explicit_axes_matmul(jax, meshes, highest):
    _both(jax, meshes, (4, 2), ("x", "y"), lambda m: jax.jit(lambda a, b: a @ b),
          [(A, ("x", None)), (B, (None, "y"))], explicit=True)


def test_position_dependent_ops_on_sharded_dims(jax, meshes):
    jnp = jax.numpy
    f = lambda m: jax.jit(lambda a: (a[1:9] * 2, a + jnp.arange(16.)[:, None],  # noqa: E731
                                     jnp.argmax(a, 0), jnp.cumsum(a, 0)))
    _both(jax, meshes, (4, 2), ("x", "y"), f, [(A, ("x", "y"))])


def test_shard_map_collectives(jax, meshes):
    from jax import shard_map
    from jax.sharding import PartitionSpec as P
    lax = jax.lax

    def body(x):
        return (lax.psum(x, "x"), lax.all_gather(x, "y", tiled=True),
                lax.all_to_all(x, "x", 0, 0, tiled=True),
                lax.ppermute(x, "x", [(i, (i + 1) % 4) for i in range(4)]),
                lax.psum_scatter(x, "y", tiled=True), lax.pmax(x, ("x", "y")))

    f = lambda m: jax.jit(shard_map(body, mesh=m, in_specs=P("x", "y"),  # noqa: E731
                                    out_specs=(P("x", "y"),) * 6, check_vma=False))
    _both(jax, meshes, (4, 2), ("x", "y"), f, [(A, ("x", "y"))])


def test_psum_over_one_axis_of_a_2d_mesh(jax, meshes):
    from jax import shard_map
    from jax.sharding import PartitionSpec as P
    f = lambda m: jax.jit(shard_map(lambda x: jax.lax.psum(x, "y"), mesh=m,  # noqa: E731
                                    in_specs=P("x", "y"), out_specs=P("x", None),
                                    check_vma=False))
    _both(jax, meshes, (2, 4), ("x", "y"), f, [(A, ("x", "y"))])


def test_data_parallel_mlp_step(jax, meshes, highest):
    jnp = jax.numpy

    def loss(p, x, y):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)

    def step(m):
        def f(p, x, y):
            g = jax.grad(loss)(p, x, y)
            return jax.tree.map(lambda p, g: p - 0.1 * g, p, g)
        return jax.jit(f)

    rng = np.random.default_rng(1)
    p = {"w1": rng.normal(size=(16, 32)).astype(np.float32) / 4,
         "b1": np.zeros(32, np.float32),
         "w2": rng.normal(size=(32, 4)).astype(np.float32) / 6}
    x = rng.normal(size=(64, 16)).astype(np.float32)
    y = rng.normal(size=(64, 4)).astype(np.float32)
    mt, mc = meshes((8,), ("data",))
    outs = []
    for m in (mt, mc):
        pp = jax.tree.map(lambda a: _put(jax, m, a, ()), p)
        outs.append(step(m)(pp, _put(jax, m, x, ("data",)), _put(jax, m, y, ("data",))))
    for t, c in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1])):
        np.testing.assert_allclose(np.asarray(t), np.asarray(c), rtol=1e-5, atol=1e-6)


def test_megatron_tensor_parallel_mlp(jax, meshes, highest):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(8, 16)).astype(np.float32)
    w1 = rng.normal(size=(16, 64)).astype(np.float32) / 4
    w2 = rng.normal(size=(64, 16)).astype(np.float32) / 8
    f = lambda m: jax.jit(lambda x, w1, w2: jax.nn.gelu(x @ w1) @ w2)  # noqa: E731
    _both(jax, meshes, (8,), ("model",), f,
          [(x, ()), (w1, (None, "model")), (w2, ("model", None))], rtol=1e-5, atol=1e-5)


def test_fsdp_weight_gather_and_gradient_reduce_scatter(jax, meshes, highest):
    from jax.sharding import NamedSharding, PartitionSpec as P
    rng = np.random.default_rng(3)
    w = rng.normal(size=(32, 16)).astype(np.float32) / 4
    x = rng.normal(size=(64, 32)).astype(np.float32)

    def step(m):
        def f(w, x):
            def loss(w):
                full = jax.lax.with_sharding_constraint(w, NamedSharding(m, P()))
                return jax.numpy.sum(jax.numpy.tanh(x @ full) ** 2)
            g = jax.grad(loss)(w)
            return jax.lax.with_sharding_constraint(w - 0.01 * g, NamedSharding(m, P("fsdp")))
        return jax.jit(f)

    _both(jax, meshes, (8,), ("fsdp",), step, [(w, ("fsdp",)), (x, ("fsdp",))],
          rtol=1e-5, atol=1e-5)


def test_moe_all_to_all_in_shard_map(jax, meshes, highest):
    from jax import shard_map
    from jax.sharding import PartitionSpec as P
    jnp = jax.numpy
    E, T, D = 8, 16, 8                       # experts (one per device), tokens per device
    rng = np.random.default_rng(4)
    tokens = rng.normal(size=(E * T, D)).astype(np.float32)
    experts = rng.normal(size=(E, D, D)).astype(np.float32) / 3

    def body(tok, w):
        # each device sends T/E tokens to every expert, applies its expert, sends back
        send = tok.reshape(E, T // E, D)
        recv = jax.lax.all_to_all(send, "e", 0, 0, tiled=True)
        out = jnp.tanh(recv.reshape(-1, D) @ w[0])
        back = jax.lax.all_to_all(out.reshape(E, T // E, D), "e", 0, 0, tiled=True)
        return back.reshape(T, D)

    f = lambda m: jax.jit(shard_map(body, mesh=m, in_specs=(P("e"), P("e")),  # noqa: E731
                                    out_specs=P("e"), check_vma=False))
    _both(jax, meshes, (8,), ("e",), f, [(tokens, ("e",)), (experts, ("e",))],
          rtol=1e-5, atol=1e-5)


def test_ppermute_ring(jax, meshes):
    from jax import shard_map
    from jax.sharding import PartitionSpec as P

    def body(x):
        acc = x
        for _ in range(7):
            x = jax.lax.ppermute(x, "r", [(i, (i + 1) % 8) for i in range(8)])
            acc = acc + x * 0.5
        return acc

    f = lambda m: jax.jit(shard_map(body, mesh=m, in_specs=P("r"), out_specs=P("r"),  # noqa: E731
                                    check_vma=False))
    _both(jax, meshes, (8,), ("r",), f, [(A, ("r",))])


def test_collectives_are_profiled_with_algorithm_and_participants(jax, meshes, highest):
    import jax_trn
    mt, _ = meshes((4, 2), ("x", "y"))
    f = jax.jit(lambda a, b: a @ b)
    with jax_trn.profile() as prof:
        f(_put(jax, mt, A, ("x", "y")), _put(jax, mt, B, ("y", None))).block_until_ready()
    ex = prof.executions[-1]
    assert sorted(ex.devices) == list(range(8))
    (c, *_) = ex.collectives
    assert c.kind == "all_reduce" and c.algorithm and len(c.devices) == 8
    assert c.end_ns > c.start_ns


def test_pmap_with_psum(jax, trn_devices):
    x = np.arange(32, dtype=np.float32).reshape(8, 4)
    f = jax.pmap(lambda v: jax.lax.psum(v, "i") * v - jax.lax.pmax(v, "i"), axis_name="i",
                 devices=trn_devices)
    out = f(x)
    assert {d.platform for d in out.devices()} == {"trn"}
    np.testing.assert_allclose(np.asarray(out), x.sum(0) * x - x.max(0))


def test_shard_map_body_ops_are_per_device(jax, meshes):
    """Inside shard_map, slices / iota / concatenate / cumsum act on the device's block."""
    from jax import shard_map
    from jax.sharding import PartitionSpec as P
    jnp = jax.numpy

    def body(x):
        return (x[:, :3] * 2, jnp.concatenate([x, x[::-1]], 0),
                jnp.cumsum(x, 0) + jnp.arange(x.shape[0], dtype=x.dtype)[:, None])

    f = lambda m: jax.jit(shard_map(body, mesh=m, in_specs=P("x", "y"),  # noqa: E731
                                    out_specs=(P("x", "y"),) * 3, check_vma=False))
    _both(jax, meshes, (4, 2), ("x", "y"), f, [(A, ("x", "y"))])


def _programs(jax):
    from jax import shard_map
    from jax.sharding import PartitionSpec as P
    jnp, lax = jax.numpy, jax.lax
    sm = lambda f, m, i, o: shard_map(f, mesh=m, in_specs=i, out_specs=o,  # noqa: E731
                                      check_vma=False)
    return {
        "psum_in_a_scan": lambda m: sm(lambda x: lax.scan(
            lambda c, _: (lax.psum(c, "x") * 0.25, None), x, None, length=3)[0],
            m, P("x", "y"), P("x", "y")),
        "fori_loop_on_sharded": lambda m: lambda x: lax.fori_loop(
            0, 3, lambda i, c: jnp.tanh(c @ c.T @ c * 0.01), x),
        "cond_on_sharded": lambda m: lambda x: lax.cond(x.sum() > 0, lambda: x * 2,
                                                        lambda: x - 1),
        "gather_scatter_sort": lambda m: lambda x: (x[jnp.array([1, 5, 9, 13])],
                                                    x.at[jnp.array([1, 5])].add(1.0),
                                                    jnp.sort(x, axis=0)),
        "softmax_layernorm": lambda m: lambda x: (
            jax.nn.softmax(x, axis=-1),
            (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)),
        "all_to_all_over_two_axes": lambda m: sm(lambda x: lax.all_to_all(
            x, ("x", "y"), 1, 1, tiled=True), m, P(("x", "y")), P(("x", "y"))),
        "pmin_pmean_int_psum": lambda m: sm(lambda x: (
            lax.pmin(x, "x") + lax.pmean(x, "y"), lax.psum((x * 10).astype(jnp.int32), "y")),
            m, P("x", "y"), (P(None, None), P("x", None))),
        "grad_through_psum": lambda m: jax.grad(lambda x: jnp.sum(sm(
            lambda v: lax.psum(v ** 2, "x"), m, P("x", "y"), P(None, "y"))(x))),
    }


@pytest.mark.parametrize("name", ["psum_in_a_scan", "fori_loop_on_sharded", "cond_on_sharded",
                                  "gather_scatter_sort", "softmax_layernorm",
                                  "all_to_all_over_two_axes", "pmin_pmean_int_psum",
                                  "grad_through_psum"])
def test_control_flow_and_more_ops_on_sharded_arrays(jax, meshes, highest, name):
    spec = (("x", "y"),) if name == "all_to_all_over_two_axes" else ("x", "y")
    f = _programs(jax)[name]
    _both(jax, meshes, (4, 2), ("x", "y"), lambda m: jax.jit(f(m)), [(A, spec)], rtol=1e-5,
          atol=1e-5)


def test_the_forced_collective_algorithm_comes_from_the_options(jax, meshes, highest):
    """The forced algorithm (JAX_TRN_COLLECTIVE_ALGORITHM, or per program as a compiler
    option) reaches the collectives as a parameter (`jax_trn.collectives` reads no
    environment)."""
    import jax_trn
    mt, _ = meshes((4, 2), ("x", "y"))
    a, b = _put(jax, mt, A, ("x", "y")), _put(jax, mt, B, ("y", None))
    f = jax.jit(lambda a, b: a @ b).lower(a, b).compile(
        {"jax_trn_collective_algorithm": "ring"})
    with jax_trn.profile() as prof:
        f(a, b).block_until_ready()
    (c, *_) = prof.executions[-1].collectives
    assert c.algorithm == "all_reduce ring"
