"""Uneven shardings (a dimension that does not divide into its shards) on the trn mesh,
against JAX's CPU backend on the same mesh: padded per-device blocks whose padding
never reaches a result (hlo_passes/localize_pad.py).

JAX refuses uneven shardings at a program's boundary (device_put, in/out_shardings), so
the programs make them inside: with_sharding_constraint, shapes that stop dividing
(slices, roll), propagation onto an unannotated parameter or result. Results whose
propagated sharding does not divide come back as XLA gives them (its longest even
prefix of axes), which `_both` checks by comparing shardings with the CPU's."""
from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def meshes(jax, trn_devices):
    cpus = jax.devices("cpu")
    if len(cpus) < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (conftest)")

    def make(shape, names, devices):
        return jax.make_mesh(shape, names, devices=devices[:int(np.prod(shape))],
                             axis_types=(jax.sharding.AxisType.Auto,) * len(shape))

    return lambda shape, names: (make(shape, names, trn_devices), make(shape, names, cpus))


@pytest.fixture
def highest(jax):
    with jax.default_matmul_precision("highest"):
        yield


def _put(jax, mesh, x, spec):
    from jax.sharding import NamedSharding, PartitionSpec as P
    return x if spec is None else jax.device_put(x, NamedSharding(mesh, P(*spec)))


def _both(jax, meshes, mesh_shape, names, build, args, rtol=1e-5, atol=1e-6):
    """Runs build(mesh)(*args) on the trn and CPU meshes; checks values and shardings.
    `args`: (array, spec) pairs; spec None passes the numpy array (uncommitted)."""
    outs = []
    for m in meshes(mesh_shape, names):
        with jax.set_mesh(m):
            outs.append(build(m)(*(_put(jax, m, a, s) for a, s in args)))
    for t, c in zip(jax.tree.leaves(outs[0]), jax.tree.leaves(outs[1])):
        assert t.shape == c.shape and t.dtype == c.dtype
        assert {d.platform for d in t.devices()} == {"trn"}
        assert t.sharding.spec == c.sharding.spec, (t.sharding, c.sharding)
        np.testing.assert_allclose(np.asarray(t, np.float64), np.asarray(c, np.float64),
                                   rtol=rtol, atol=atol)
    return outs[0]


def _wsc(jax, m, x, *spec):
    from jax.sharding import NamedSharding, PartitionSpec as P
    return jax.lax.with_sharding_constraint(x, NamedSharding(m, P(*spec)))


RNG = np.random.default_rng(0)
X13 = RNG.normal(size=(13, 7)).astype(np.float32)
X13 += np.sign(X13) / 2          # |x| >= 0.5: the padding's zeros stand out (TRAPS)
X12 = RNG.normal(size=(12, 3)).astype(np.float32)
M1 = ((4,), ("x",))
M2 = ((4, 2), ("x", "y"))


# --- the programs the issue reports --------------------------------------------------

def test_constraint_on_a_dim_of_size_1_over_4(jax, meshes):
    """`with_sharding_constraint` of a [32,1] array over a 4-way axis (3 devices hold
    nothing but padding)."""
    x = np.arange(32, dtype=np.float32).reshape(32, 1)
    _both(jax, meshes, *M1, lambda m: jax.jit(lambda a: _wsc(jax, m, a * 2, None, "x") + 1),
          [(x, ())])


def test_roll_of_12_rows_over_4_shards(jax, meshes):
    """`jnp.roll(a, 3, axis=0)`: the rolled-in 3 rows and the 9 others do not divide."""
    _both(jax, meshes, *M1, lambda m: jax.jit(lambda a: jax.numpy.roll(a, 3, axis=0)),
          [(X12, ("x",))])


def test_fsdp_sharded_unit_parameter(jax, meshes, highest):
    """flax's FSDP example shards a float32[1,1] parameter over 4 devices."""
    w = np.full((1, 1), 0.5, np.float32)

    def build(m):
        def f(w, x):
            w = _wsc(jax, m, w, "x", None)
            return jax.numpy.sum(jax.numpy.tanh(x @ w)), w * 2
        return jax.jit(f)
    _both(jax, meshes, *M1, build, [(w, ()), (RNG.normal(size=(8, 1)).astype(np.float32),
                                             ("x",))])


def test_sub_axis_shardings_shardy_propagates_through_a_padded_dim(jax, meshes, highest):
    """fsdp_odd_shapes' core (tests/programs/sharded.py): hidden activations [16, 10]
    constrained over 4 devices; Shardy shards relu and the next matmul on the half of
    the axis that divides ({"x":(1)2}), forward and backward."""
    jnp = jax.numpy
    h = RNG.normal(size=(16, 10)).astype(np.float32)
    w = RNG.normal(size=(10, 3)).astype(np.float32)

    def build(m):
        def f(h, w):
            loss = lambda h, w: jnp.sum(jnp.tanh(  # noqa: E731
                jax.nn.relu(_wsc(jax, m, h, None, "x")) @ w))
            return _wsc(jax, m, jax.nn.relu(_wsc(jax, m, h, None, "x")) @ w, "x"), \
                jax.grad(loss, argnums=(0, 1))(h, w)
        return jax.jit(f)
    _both(jax, meshes, *M1, build, [(h, ()), (w, ())], rtol=1e-5, atol=1e-5)


# --- one category at a time --------------------------------------------------------------

# Each reduction reads g(a) where g(0) (the padding is zeros where a block was cut out
# of a replicated value) would win if it were reduced: a sum it adds to, a max it
# exceeds, a min below every element, an any it makes true, an all it makes false.
TRAPS = {"sum": lambda a: a + 1, "mean": lambda a: a + 1, "max": lambda a: -a * a - 1,
         "min": lambda a: a * a + 1, "any": lambda a: a == 0, "all": lambda a: a != 0,
         "prod": lambda a: a * a + 2}


# prod over a sharded dim needs an all_reduce that multiplies, which the collective
# lowering refuses (even shardings too: "combines with add, maximum or minimum").
@pytest.mark.parametrize("reduce,axis", [(r, a) for r in TRAPS if r != "prod"
                                         for a in (0, 1, None)] + [("prod", 1)])
def test_reductions_never_see_the_padding(jax, meshes, reduce, axis):
    f = lambda m: jax.jit(lambda a: getattr(jax.numpy, reduce)(  # noqa: E731
        TRAPS[reduce](_wsc(jax, m, a, "x", None)), axis))
    _both(jax, meshes, *M1, f, [(X13, ())], rtol=1e-5, atol=1e-5)


def test_reduction_of_values_the_padding_makes_infinite(jax, meshes):
    """log(0) = -inf, 0 * inf = nan in the padding: masked, not multiplied away."""
    x = np.abs(X13) + 0.5
    f = lambda m: jax.jit(lambda a: (jax.numpy.log(_wsc(jax, m, a, "x")).sum(0),  # noqa: E731
                                     (1 / _wsc(jax, m, a - a, "x") * 0).max(1)))
    out = _both(jax, meshes, *M1, f, [(x, ())], rtol=1e-5, atol=1e-5)
    assert np.isnan(np.asarray(out[1])).all()


@pytest.mark.parametrize("axis", [0, 1])
def test_sort_top_k_argmax_along_and_across_padded_dims(jax, meshes, axis):
    jnp = jax.numpy

    def build(m):
        def f(a):
            a = _wsc(jax, m, a, "x", None)
            top = jax.lax.top_k(jnp.moveaxis(a, axis, -1), 3)
            return jnp.sort(a, axis), top, jnp.argmax(a, axis), jnp.argmin(a, axis)
        return jax.jit(f)
    _both(jax, meshes, *M1, build, [(X13, ())])


def test_cumulative_ops_along_a_padded_dim(jax, meshes):
    jnp = jax.numpy
    f = lambda m: jax.jit(lambda a: (  # noqa: E731
        jnp.cumsum(_wsc(jax, m, a, "x"), 0), jax.lax.cummax(_wsc(jax, m, a, "x"), 0),
        jnp.cumprod(_wsc(jax, m, 1 + a / 8, None, "x"), 1)))
    _both(jax, meshes, *M1, f, [(X13, ())], rtol=1e-5, atol=1e-5)


def test_collectives_between_uneven_shardings(jax, meshes):
    """all_gather (to replicated), all_to_all (dim 0 -> dim 1), a 2-D reshard that
    permutes axes, and slicing a replicated value into padded blocks."""
    x = RNG.normal(size=(13, 6)).astype(np.float32)

    def build(m):
        def f(a):
            b = _wsc(jax, m, a * 2, "x", "y")
            return (_wsc(jax, m, b, None, None) + 1, _wsc(jax, m, b + 1, "y", "x") * 3,
                    _wsc(jax, m, b - 1, None, ("x", "y")), _wsc(jax, m, b, ("y", "x")) * 2)
        return jax.jit(f)
    _both(jax, meshes, *M2, build, [(x, ())])


def test_reduce_scatter_onto_a_padded_dim(jax, meshes, highest):
    """A matmul contracting over a sharded dim whose result is constrained onto a dim
    that does not divide: partial sums reduce-scattered into padded blocks."""
    a = RNG.normal(size=(13, 16)).astype(np.float32)
    b = RNG.normal(size=(16, 5)).astype(np.float32)
    f = lambda m: jax.jit(lambda a, b: jax.numpy.tanh(_wsc(jax, m, a @ b, "x")))  # noqa: E731
    _both(jax, meshes, *M1, f, [(a, (None, "x")), (b, ("x",))], rtol=1e-5, atol=1e-5)


def test_dot_contracting_over_a_padded_dim(jax, meshes, highest):
    a = RNG.normal(size=(6, 13)).astype(np.float32)
    b = RNG.normal(size=(13, 5)).astype(np.float32)
    f = lambda m: jax.jit(lambda a, b: (  # noqa: E731
        jax.numpy.exp(_wsc(jax, m, a, None, "x")) @ jax.numpy.exp(_wsc(jax, m, b, "x"))))
    _both(jax, meshes, *M1, f, [(a, ()), (b, ())], rtol=1e-5, atol=1e-5)


def test_gather_and_scatter_with_indices_near_the_end(jax, meshes):
    jnp = jax.numpy
    idx = jnp.array([12, 11, 0, 12, 9])

    def build(m):
        def f(a):
            a = _wsc(jax, m, a, "x")
            return a[idx] * 2, a.at[idx].add(1.0), a.at[jnp.array([12, 10])].set(-5.0)
        return jax.jit(f)
    _both(jax, meshes, *M1, build, [(X13, ())])


def test_two_dim_mesh_with_both_dims_padded(jax, meshes, highest):
    x = RNG.normal(size=(5, 3)).astype(np.float32)
    f = lambda m: jax.jit(lambda a: (  # noqa: E731
        _wsc(jax, m, jax.numpy.sin(a), "x", "y").sum(), _wsc(jax, m, a, "x", "y") @ a.T,
        _wsc(jax, m, a, ("x", "y")).max(0)))
    _both(jax, meshes, *M2, f, [(x, ())], rtol=1e-5, atol=1e-5)


def test_unannotated_parameter_and_result_with_uneven_propagation(jax, meshes):
    """Shardy propagates an uneven sharding onto a parameter and a result with no
    sharding of their own: both pass with what divides, as on CPU."""
    f = lambda m: jax.jit(lambda a: (_wsc(jax, m, a * 2, "x", "y"), a.sum(1)))  # noqa: E731
    _both(jax, meshes, *M2, f, [(RNG.normal(size=(13, 6)).astype(np.float32), None)])


def test_reshapes_of_padded_values(jax, meshes):
    f = lambda m: jax.jit(lambda a: (  # noqa: E731
        _wsc(jax, m, a, "x")[:, None, :] * 2, _wsc(jax, m, a, "x").reshape(7, 13),
        _wsc(jax, m, a, "x").reshape(-1).sum()))
    _both(jax, meshes, *M1, f, [(X13, ())], rtol=1e-5, atol=1e-5)


def test_loop_over_padded_values(jax, meshes):
    def build(m):
        def f(a):
            a = _wsc(jax, m, a, "x")
            return jax.lax.fori_loop(0, 3, lambda i, c: c * 0.5 + c.sum(0), a)
        return jax.jit(f)
    _both(jax, meshes, *M1, build, [(X13, ())], rtol=1e-5, atol=1e-5)


def test_dynamic_slice_keeping_a_sharded_dim_whole(jax, meshes):
    """A dynamic_slice over all of an (evenly) sharded dim keeps its per-device size
    (it used to keep the global one and read out of bounds)."""
    x = np.arange(16 * 32, dtype=np.float32).reshape(16, 32)
    f = lambda m: jax.jit(lambda a, i: jax.lax.dynamic_slice(a, (0, i), (16, 4)) * 2)  # noqa: E731
    _both(jax, meshes, *M1, f, [(x, ("x", None)), (np.int32(3), ())])


# --- a training step ------------------------------------------------------------------------

def test_fsdp_mlp_training_step_with_odd_sizes(jax, meshes, highest):
    """A two-layer MLP with 13x7 and 7x3 parameters sharded FSDP-style over 4 devices
    (on the dim that does not divide), three SGD steps: loss and parameters as on CPU."""
    jnp = jax.numpy
    rng = np.random.default_rng(5)
    params = {"w1": rng.normal(size=(13, 7)).astype(np.float32) / 3,
              "b1": np.zeros(7, np.float32),
              "w2": rng.normal(size=(7, 3)).astype(np.float32) / 3}
    x = rng.normal(size=(8, 13)).astype(np.float32)
    y = rng.normal(size=(8, 3)).astype(np.float32)

    def build(m):
        def shard(p):
            return {k: _wsc(jax, m, v, "x", *(None,) * (v.ndim - 1)) for k, v in p.items()}

        def loss(p, x, y):
            p = shard(p)
            h = jax.nn.gelu(x @ p["w1"] + p["b1"])
            return jnp.mean((h @ p["w2"] - y) ** 2)

        def step(p, x, y):
            for _ in range(3):
                val, g = jax.value_and_grad(loss)(p, x, y)
                p = shard(jax.tree.map(lambda a, b: a - 0.1 * b, p, shard(g)))
            return val, p
        return jax.jit(step)
    out = _both(jax, meshes, *M1, build,
                [(jax.tree.map(lambda a: a, params), ()), (x, ("x",)), (y, ("x",))],
                rtol=2e-5, atol=1e-6)
    assert np.isfinite(float(out[0]))
