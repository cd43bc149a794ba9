"""Uneven shardings in the idioms users write, against JAX's CPU backend on the same
8-device meshes (issue 12 item 5, category by category): a 1-D mesh of 8, a 2-D mesh
of 4 x 2 and, for the programs the issue reports, a 1-D mesh of 4.

tests/multichip/test_uneven.py has the first cut of each category (4 devices, one op
at a time); here the same categories as users meet them: jax.nn / jnp functions over
the padded dim, dims smaller than the shard count, shard_map next to padded values,
flax's partitioning metadata and a plain-JAX FSDP loop whose parameters cross the
program's boundary at every step."""
from __future__ import annotations

import numpy as np
import pytest

from tests.multichip.test_uneven import _both, _wsc, highest, meshes  # noqa: F401

RNG = np.random.default_rng(12)
X13 = RNG.normal(size=(13, 7)).astype(np.float32)
X13 += np.sign(X13) / 2          # |x| >= 0.5: a zero of the padding stands out
M4 = ((4,), ("x",))
M8 = ((8,), ("x",))
M2 = ((4, 2), ("x", "y"))


@pytest.fixture(autouse=True)
def _same_data_in_any_order():
    """Each test draws the same arrays from RNG whichever tests ran before it."""
    RNG.bit_generator.state = np.random.default_rng(13).bit_generator.state


def _jit(jax, f):
    return lambda m: jax.jit(lambda *a: f(m, *a))


# --- reductions ---------------------------------------------------------------------

@pytest.mark.parametrize("mesh,spec", [(M8, ("x",)), (M2, ("x", "y")), (M2, (("x", "y"),)),
                                       (M2, ("y", "x"))])
def test_normalizations_and_arg_reductions_over_padded_dims(jax, meshes, mesh, spec):
    jnp, nn = jax.numpy, jax.nn

    def f(m, a):
        a = _wsc(jax, m, a, *spec)
        return (a.mean(0), jnp.var(a), nn.logsumexp(a, 0), nn.softmax(a, 0),
                nn.standardize(a, axis=1).sum(0), jnp.argmax(a, 0), jnp.argmin(a, 1),
                jnp.argmax(a), jnp.max(a, 1), jnp.min(a))
    _both(jax, meshes, *mesh, _jit(jax, f), [(X13, ())], rtol=1e-5, atol=1e-5)


def test_integer_and_boolean_reductions_over_padded_dims(jax, meshes):
    jnp = jax.numpy
    ints = RNG.integers(-50, 50, size=(13, 7)).astype(np.int32)

    def f(m, a):
        a = _wsc(jax, m, a, "x", "y")
        return (a.sum(0), a.max(0), a.min(1), jnp.any(a > 40, 0), jnp.all(a > -45),
                jnp.count_nonzero(a > 0, 1))
    _both(jax, meshes, *M2, _jit(jax, f), [(ints, ())])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rows", [16, 13])
def test_half_precision_values_with_constants(jax, meshes, dtype, rows):
    """bf16 / f16, the dtypes users train in: every sharded program has constants that
    Shardy's propagation makes `sdy.constant`s, whose bf16 values the importer used to
    keep as text ("Cannot cast scalar from dtype('<U34') to dtype(bfloat16)"), evenly
    sharded or not."""
    jnp = jax.numpy
    x = np.random.default_rng(rows).normal(size=(rows, 8)).astype(dtype)

    def f(m, a):
        a = _wsc(jax, m, a, "x")
        return a.sum(0), a.max(0), jnp.cumsum(a, 0), a * 2 + 1
    # atol: a few bf16 ulps of the partial sums (|sum| < 4, ulp 2^-6), rounded in
    # another order than on CPU
    _both(jax, meshes, *M4, _jit(jax, f), [(x, ())], rtol=2e-2, atol=6e-2)


# --- sort, top_k, cumulative ops -------------------------------------------------------

def test_sort_top_k_argsort_over_8_shards(jax, meshes):
    jnp = jax.numpy

    def f(m, a):
        return (jnp.sort(_wsc(jax, m, a, "x"), 0), jax.lax.top_k(_wsc(jax, m, a.T, None, "x"), 4),
                jnp.argsort(_wsc(jax, m, a, "x"), 0), jnp.sort(_wsc(jax, m, a, None, "x"), 1))
    _both(jax, meshes, *M8, _jit(jax, f), [(X13, ())])


CUMULATIVE = {
    "cumsum": (lambda jax, a: jax.numpy.cumsum(a, 0), lambda a: np.cumsum(a, 0)),
    "cumprod": (lambda jax, a: jax.numpy.cumprod(1 + a / 8, 0),
                lambda a: np.cumprod(1 + a / 8, 0)),
    "cumlogsumexp": (lambda jax, a: jax.lax.cumlogsumexp(a, 0),
                     lambda a: np.logaddexp.accumulate(a, 0)),
    "cummin": (lambda jax, a: jax.lax.cummin(a, 0), lambda a: np.minimum.accumulate(a, 0)),
    "int_cumsum": (lambda jax, a: jax.numpy.cumsum((a > 0).astype("int32"), 0),
                   lambda a: np.cumsum(a > 0, 0)),
}


@pytest.mark.parametrize("op", CUMULATIVE)
def test_cumulative_ops_over_8_shards(jax, meshes, op):
    f = CUMULATIVE[op][0]
    _both(jax, meshes, *M8, _jit(jax, lambda m, a: f(jax, _wsc(jax, m, a, "x"))), [(X13, ())],
          rtol=1e-5, atol=1e-5)


def test_cumulative_ops_in_one_program_over_8_shards(jax, trn_devices):
    """All of them on one padded value in one program. Against numpy: XLA's CPU backend
    (jaxlib 0.10.2) returns wrong cumlogsumexp and cummin in this program (each alone
    is right, as the test above checks)."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((8,), ("x",), devices=trn_devices[:8],
                         axis_types=(jax.sharding.AxisType.Auto,))
    with jax.set_mesh(mesh):
        outs = jax.jit(lambda a: [f(jax, jax.lax.with_sharding_constraint(
            a, NamedSharding(mesh, P("x")))) for f, _ in CUMULATIVE.values()])(X13)
    for out, (_, ref) in zip(outs, CUMULATIVE.values()):
        np.testing.assert_allclose(np.asarray(out, np.float64), ref(X13.astype(np.float64)),
                                   rtol=1e-5, atol=1e-5)


# --- jnp.roll -------------------------------------------------------------------------------

def test_roll_of_10_rows_over_4_shards(jax, meshes):
    x10 = RNG.normal(size=(10, 3)).astype(np.float32)
    _both(jax, meshes, *M4, _jit(jax, lambda m, a: jax.numpy.roll(a, 3, axis=0)), [(x10, ())])
    _both(jax, meshes, *M4, _jit(jax, lambda m, a: jax.numpy.roll(_wsc(jax, m, a, "x"), 3, 0) * 2),
          [(x10, ())])


def test_roll_of_sharded_rows_both_ways_and_on_a_2d_mesh(jax, meshes):
    x12 = RNG.normal(size=(12, 3)).astype(np.float32)
    _both(jax, meshes, *M4, _jit(jax, lambda m, a: (jax.numpy.roll(a, -5, 0),
                                                    jax.numpy.roll(a, 13, 0))),
          [(x12, ("x",))])
    _both(jax, meshes, *M2, _jit(jax, lambda m, a: jax.numpy.roll(
        _wsc(jax, m, a, "x", "y"), (3, -2), (0, 1))), [(X13, ())])


# --- gather / scatter -------------------------------------------------------------------

def test_gather_and_scatter_near_the_end_over_8_shards(jax, meshes):
    jnp = jax.numpy
    idx = jnp.array([12, 11, 0, 12, 9, 7])

    def f(m, a, i):
        a = _wsc(jax, m, a, "x")
        return (a[idx], a.at[idx].add(1.0), a.at[idx].max(0.0),
                jnp.take_along_axis(a, jnp.full((13, 1), 6), 1), a[_wsc(jax, m, i, "x")])
    rows = np.arange(10, dtype=np.int32)[::-1] + 3          # 12 .. 3, sharded unevenly
    _both(jax, meshes, *M8, _jit(jax, f), [(X13, ()), (rows, ())])


def test_scatter_set_of_the_last_row_over_8_shards(jax, trn_devices):
    """`.at[12].set` of a [13, 7] array sharded 8 ways. Checked against numpy: XLA's CPU
    backend in jaxlib 0.10.2 gets this one wrong (rows 1, 3, 5, ... come back as row 12
    over 8 devices, rows 3, 7, 11 over 4), so it cannot be the reference here."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((8,), ("x",), devices=trn_devices[:8],
                         axis_types=(jax.sharding.AxisType.Auto,))
    with jax.set_mesh(mesh):
        out = jax.jit(lambda a: jax.lax.with_sharding_constraint(
            a, NamedSharding(mesh, P("x"))).at[12].set(0.0))(X13)
    want = X13.copy()
    want[12] = 0
    np.testing.assert_array_equal(np.asarray(out), want)


# --- dot_general ------------------------------------------------------------------------

def test_dot_general_contracting_over_padded_dims_on_a_2d_mesh(jax, meshes, highest):
    jnp = jax.numpy
    a, b = RNG.normal(size=(6, 13)).astype(np.float32), RNG.normal(size=(13, 5)).astype(np.float32)
    a3, b3 = (RNG.normal(size=(5, 6, 13)).astype(np.float32),
              RNG.normal(size=(5, 13, 3)).astype(np.float32))

    def f(m, a, b, a3, b3):
        return (_wsc(jax, m, a, "y", "x") @ _wsc(jax, m, b, "x", None),
                jnp.einsum("ij,jk->ik", _wsc(jax, m, a, None, ("x", "y")), b),
                jnp.einsum("bij,bjk->bik", _wsc(jax, m, a3, "x", None, "y"),
                           _wsc(jax, m, b3, "x", "y")))
    _both(jax, meshes, *M2, _jit(jax, f), [(a, ()), (b, ()), (a3, ()), (b3, ())],
          rtol=1e-5, atol=1e-5)


# --- dims smaller than the shard count ---------------------------------------------------

def test_dims_smaller_than_the_shard_count(jax, meshes, highest):
    jnp = jax.numpy
    x1, x3 = RNG.normal(size=(1, 5)).astype(np.float32), RNG.normal(size=(3, 5)).astype(np.float32)
    _both(jax, meshes, *M8, _jit(jax, lambda m, a: (
        _wsc(jax, m, a * 2, "x").sum(0), _wsc(jax, m, a, "x") + 1,
        jnp.exp(_wsc(jax, m, a, "x")) @ a.T)), [(x1, ())], rtol=1e-5, atol=1e-5)
    _both(jax, meshes, *M2, _jit(jax, lambda m, a: (
        _wsc(jax, m, a * 2, ("x", "y")).sum(0), _wsc(jax, m, a, ("x", "y")) + 1,
        _wsc(jax, m, a, "y", "x").max(), _wsc(jax, m, a[:, :1], None, "x") * 3)),
        [(x3, ())])


def test_constraint_of_32x1_over_one_axis_of_a_2d_mesh(jax, meshes):
    x = np.arange(32, dtype=np.float32).reshape(32, 1)
    _both(jax, meshes, *M2, _jit(jax, lambda m, a: (
        _wsc(jax, m, a * 2, None, "x") + 1, _wsc(jax, m, a, "y", "x").sum(0))), [(x, ("x",))])


# --- collectives ------------------------------------------------------------------------

def test_shard_map_collectives_on_values_from_padded_ones(jax, meshes):
    """shard_map needs its operands to divide (JAX checks; see the next test), so the
    padded value is cut to 12 rows before it: all_gather, psum_scatter, all_to_all and
    psum on the 3-row blocks."""
    from jax import shard_map
    from jax.sharding import PartitionSpec as P
    lax = jax.lax

    def body(x):
        return (lax.all_gather(x, "x", tiled=True),
                lax.psum_scatter(x, "x", scatter_dimension=1, tiled=True),
                lax.all_to_all(x, "x", 1, 0, tiled=True), lax.psum(x, "x"))

    def build(m):
        sm = shard_map(body, mesh=m, in_specs=P("x"), out_specs=(P("x"),) * 4,
                       check_vma=False)
        return jax.jit(lambda a: sm(jax.numpy.tanh(_wsc(jax, m, a, "x"))[:12, :4] * 2))
    _both(jax, meshes, *M4, build, [(X13, ())])


def test_what_jax_itself_refuses_is_refused_as_on_cpu(jax, meshes):
    """JAX checks divisibility before a backend sees the program: shard_map operands,
    Explicit-axis shardings (`reshard`), `device_put`. Same error on trn as on CPU."""
    from jax import shard_map
    from jax.sharding import NamedSharding, PartitionSpec as P
    for m in meshes(*M4):
        f = jax.jit(shard_map(lambda x: jax.lax.psum(x, "x"), mesh=m, in_specs=P("x"),
                              out_specs=P(), check_vma=False))
        with pytest.raises(ValueError, match="not evenly divisible"):
            f(X13)
        with pytest.raises(ValueError, match="divide"):
            jax.device_put(X13, NamedSharding(m, P("x")))
        explicit = jax.make_mesh((4,), ("x",), devices=list(m.devices.flat),
                                 axis_types=(jax.sharding.AxisType.Explicit,))
        with jax.set_mesh(explicit), pytest.raises(ValueError, match="evenly divide"):
            jax.jit(lambda a: jax.sharding.reshard(a * 2, P("x")))(X13)


def test_shard_map_between_padded_values_on_a_2d_mesh(jax, meshes):
    from jax import shard_map
    from jax.sharding import PartitionSpec as P
    lax = jax.lax

    def body(x):
        return (lax.all_gather(x, "y", axis=1, tiled=True),
                lax.psum_scatter(x, "x", scatter_dimension=0, tiled=True))

    def build(m):
        sm = shard_map(body, mesh=m, in_specs=P("x", "y"),
                       out_specs=(P("x", None), P("x", "y")), check_vma=False)
        padded = lambda a: jax.numpy.pad(_wsc(jax, m, a, "x", "y"), ((0, 3), (0, 1)))  # noqa: E731
        return jax.jit(lambda a: jax.tree.map(lambda v: _wsc(jax, m, v, ("x", "y")).sum(0),
                                              sm(padded(a))))
    _both(jax, meshes, *M2, build, [(X13, ())], rtol=1e-5, atol=1e-5)


def test_shard_map_over_one_axis_with_a_padded_free_axis_inside(jax, meshes):
    """shard_map manual over "x" only (axis_names): inside, a constraint over the free
    "y" axis pads 13 columns into 2 blocks. The body's view of its operand is [4, 13]
    (global along the free axis); the localizer cut blocks out of the outer [16, 13]
    ("localized sdy.all_slice gives float32[16,7], expected float32[4,7]")."""
    from jax import shard_map
    from jax.sharding import PartitionSpec as P
    lax, jnp = jax.lax, jax.numpy
    x = RNG.normal(size=(16, 13)).astype(np.float32)

    def build(m):
        def body(x):
            y = jnp.tanh(_wsc(jax, m, x, None, "y"))
            return lax.psum(y.sum(1), "x"), lax.all_gather(y, "x", tiled=True) * 2
        return jax.jit(shard_map(body, mesh=m, in_specs=P("x"), out_specs=(P(), P()),
                                 axis_names={"x"}, check_vma=False))
    _both(jax, meshes, *M2, build, [(x, ("x",))], rtol=1e-5, atol=1e-5)


# --- layout and control flow around padded values --------------------------------------

def test_layout_ops_loops_and_convolutions_on_padded_values(jax, meshes, highest):
    jnp, lax = jax.numpy, jax.lax
    x = RNG.normal(size=(5, 3, 9)).astype(np.float32)
    k = RNG.normal(size=(4, 3, 3)).astype(np.float32)

    def f(m, a, x, k):
        p = _wsc(jax, m, a, "x")
        carry, ys = lax.scan(lambda c, r: (c + r, c.sum()), jnp.zeros(7), p)
        return (jnp.concatenate([p, a[:2]], 0), jnp.pad(p, ((1, 2), (0, 0))), p[3:11:2],
                jnp.flip(p, 0), jnp.where(jnp.arange(13)[:, None] > 6, p, 0.0).sum(0),
                carry, ys, lax.conv_general_dilated(_wsc(jax, m, x, "x"), k, (1,), "SAME"))
    _both(jax, meshes, *M8, _jit(jax, f), [(X13, ()), (x, ()), (k, ())], rtol=1e-5, atol=1e-5)


# --- FSDP training -------------------------------------------------------------------------

def _train(jax, mesh, model_init, loss_fn, x, y, steps=4):
    """`steps` jitted adam steps under `mesh`; the losses and the final parameters."""
    import optax
    from jax.sharding import NamedSharding, PartitionSpec as P
    tx = optax.adam(1e-2)
    with jax.set_mesh(mesh):
        x, y = (jax.device_put(v, NamedSharding(mesh, P("x"))) for v in (x, y))
        params = model_init(x)
        opt = jax.jit(tx.init)(params)

        @jax.jit
        def step(params, opt, x, y):
            loss, g = jax.value_and_grad(loss_fn)(params, x, y)
            upd, opt = tx.update(g, opt, params)
            return optax.apply_updates(params, upd), opt, loss
        losses = []
        for _ in range(steps):
            params, opt, loss = step(params, opt, x, y)
            losses.append(float(loss))
    return losses, params


def _same_training(jax, meshes, run, rtol=1e-5, atol=1e-6):
    (lt, pt), (lc, pc) = (run(m) for m in meshes(*M4))
    np.testing.assert_allclose(lt, lc, rtol=rtol, atol=atol)
    for t, c in zip(jax.tree.leaves(pt), jax.tree.leaves(pc)):
        np.testing.assert_allclose(np.asarray(t), np.asarray(c), rtol=rtol, atol=atol)
    assert lt[-1] < lt[0]


def test_flax_linen_fsdp_with_partitioning_metadata(jax, meshes, highest):
    """flax's FSDP idiom: parameters declared with nn.with_partitioning (nn.Partitioned
    boxes), a mesh set, so that flax constrains every parameter where the model reads it
    (10 hidden units and a [1, 1] scale over a 4-way axis)."""
    import flax.linen as nn
    import optax
    part = nn.with_partitioning

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(10, kernel_init=part(nn.initializers.lecun_normal(), (None, "x")),
                         bias_init=part(nn.initializers.zeros_init(), ("x",)))(x)
            scale = self.param("scale", part(nn.initializers.ones_init(), ("x", None)), (1, 1))
            h = nn.relu(h) * scale[0, 0]
            return nn.Dense(3, kernel_init=part(nn.initializers.lecun_normal(), ("x", None)))(h)

    model = MLP()
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(16, 8)).astype(np.float32), rng.integers(0, 3, 16).astype(np.int32)

    def loss(p, x, y):
        logits = model.apply({"params": p}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def run(mesh):
        losses, params = _train(jax, mesh, lambda x: jax.jit(model.init)(
            jax.random.key(0), x)["params"], loss, x, y)
        assert isinstance(params["scale"], nn.Partitioned)
        return losses, nn.unbox(params)
    _same_training(jax, meshes, run)


def test_flax_linen_logical_partitioning_rules(jax, meshes, highest):
    """The same with logical axis names (nn.with_logical_partitioning, a logical
    constraint on the activations, nn.logical_axis_rules mapping "mlp" to the mesh)."""
    import flax.linen as nn
    import optax
    part = nn.with_logical_partitioning

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(10, kernel_init=part(nn.initializers.lecun_normal(), ("embed", "mlp")),
                         bias_init=part(nn.initializers.zeros_init(), ("mlp",)))(x)
            h = nn.with_logical_constraint(nn.relu(h), ("batch", "mlp"))
            out = part(nn.initializers.lecun_normal(), ("mlp", "embed"))
            return nn.Dense(3, kernel_init=out)(h)

    model = MLP()
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(16, 8)).astype(np.float32), rng.integers(0, 3, 16).astype(np.int32)

    def loss(p, x, y):
        logits = model.apply({"params": p}, x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

    def run(mesh):
        with nn.logical_axis_rules((("batch", None), ("embed", None), ("mlp", "x"))):
            losses, params = _train(jax, mesh, lambda x: jax.jit(model.init)(
                jax.random.key(0), x)["params"], loss, x, y)
        return losses, nn.unbox(params)
    _same_training(jax, meshes, run)


def test_plain_jax_fsdp_steps_with_13x7_parameters(jax, meshes, highest):
    """A two-layer MLP with 13x7 and 7x3 parameters constrained FSDP-style over 4 devices
    on the dim that does not divide, one jitted adam step per call (the parameters leave
    each step gathered, as on CPU, and are resharded in the next): losses and parameters
    as on CPU after every one of 4 steps."""
    jnp = jax.numpy
    rng = np.random.default_rng(5)
    params = {"w1": rng.normal(size=(13, 7)).astype(np.float32) / 3,
              "b1": np.zeros(7, np.float32),
              "w2": rng.normal(size=(7, 3)).astype(np.float32) / 3}
    x, y = rng.normal(size=(8, 13)).astype(np.float32), rng.normal(size=(8, 3)).astype(np.float32)

    def loss(p, x, y):
        mesh = jax.sharding.get_abstract_mesh()
        p = {k: _wsc(jax, mesh, v, "x", *(None,) * (v.ndim - 1)) for k, v in p.items()}
        h = jax.nn.gelu(x @ p["w1"] + p["b1"])
        return jnp.mean((h @ p["w2"] - y) ** 2)
    _same_training(jax, meshes, lambda m: _train(jax, m, lambda x: params, loss, x, y),
                   rtol=2e-5)
