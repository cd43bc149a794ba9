"""Compiler faults that JAX's own tests found (issue 13, benchmarks/jax_conformance.py),
each as the program a JAX test runs, on trn against the CPU backend: single-device
programs against one CPU device, multi-device ones against the 8-device CPU mesh
(tests/conftest.py sets `--xla_force_host_platform_device_count=8`)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.test_ops import check


# --- inline-calls: calls that return their argument ---------------------------------

def _scan_loss(jax, unroll, remat):
    jnp = jax.numpy

    def body(c, _):
        return jnp.sin(c) * 1.1, jnp.cos(c)

    def loss(x):
        step = jax.checkpoint(body) if remat else body
        c, ys = jax.lax.scan(step, x, None, length=4, unroll=unroll)
        return c.sum() + ys.sum()
    return loss


@pytest.mark.parametrize("unroll,remat", [(2, True), (2, False), (1, True)])
def test_grad_of_scan_unrolled_and_checkpointed(jax, trn, cpu, unroll, remat):
    x = np.linspace(-1, 2, 5, dtype=np.float32)
    check(jax, trn, cpu, jax.grad(_scan_loss(jax, unroll, remat)), x)


def test_nanmax_with_where_of_an_empty_axis(jax, trn, cpu):
    """JAX prunes the size-0 arguments: the program has none and runs on the default
    device, so each backend is made the default in turn."""
    x, where = np.zeros((3, 0), np.float16), np.ones((3, 0), bool)
    f = jax.jit(lambda a, w: jax.numpy.nanmax(a, axis=1, where=w, initial=0))
    outs = []
    for device in (trn, cpu):
        with jax.default_device(device):
            outs.append(f(*(jax.device_put(a, device) for a in (x, where))))
    assert outs[0].devices() == {trn} and outs[0].dtype == np.float16
    np.testing.assert_array_equal(np.asarray(outs[0]), np.asarray(outs[1]))


# --- rank0-windows: windows over no dimension ----------------------------------------

@pytest.mark.parametrize("batch_groups,feature_groups,spec", [
    (1, 1, ("NC", "OI", "NC")), (2, 1, ("NC", "OI", "NC")), (1, 2, ("NC", "OI", "NC")),
    (1, 1, ("NC", "IO", "NC"))])
def test_conv_without_spatial_dims(jax, trn, cpu, batch_groups, feature_groups, spec):
    rng = np.random.default_rng(3)
    lhs = rng.normal(size=(2 * batch_groups, 3 * feature_groups)).astype(np.float32)
    o, i = 2 * feature_groups * batch_groups, 3
    rhs = rng.normal(size=(o, i) if spec[1] == "OI" else (i, o)).astype(np.float32)
    f = lambda a, b: jax.lax.conv_general_dilated(  # noqa: E731
        a, b, (), (), dimension_numbers=spec, feature_group_count=feature_groups,
        batch_group_count=batch_groups, precision="highest")
    check(jax, trn, cpu, f, lhs, rhs)


@pytest.mark.parametrize("op,init", [("add", 0.0), ("max", -np.inf), ("mul", 1.0)])
def test_reduce_window_of_rank_0(jax, trn, cpu, op, init):
    f = lambda x: jax.lax.reduce_window(x, init, getattr(jax.lax, op), (), (), [])  # noqa: E731
    check(jax, trn, cpu, f, np.float32(2.5))


# --- split-reductions: variadic reductions with a separable body ---------------------

def _sum_and_product(x, y):
    return x[0] + y[0], x[1] * y[1]


@pytest.mark.parametrize("shape,dims", [((3, 4, 5), (0,)), ((3, 4, 5), (1, 2)),
                                        ((3, 4, 5), ()), ((3, 0, 5), (1,))])
def test_reduce_pair_and_its_grad(jax, trn, cpu, shape, dims):
    """lax_autodiff_test.testReducePairGrad's reduction and its gradient."""
    rng = np.random.default_rng(4)
    x, y = (rng.normal(size=shape).astype(np.float32) for _ in range(2))
    inits = (np.float32(0), np.float32(1))

    def reduce(a, b):
        return jax.lax.reduce((a, b), inits, _sum_and_product, dims)
    grad = jax.grad(lambda a, b: sum(r.sum() for r in reduce(a, b)), (0, 1))
    check(jax, trn, cpu, lambda a, b: (reduce(a, b), grad(a, b)), x, y, rtol=1e-5)


def test_variadic_reduce_window(jax, trn, cpu):
    rng = np.random.default_rng(5)
    x, y = (rng.normal(size=(6, 5)).astype(np.float32) for _ in range(2))
    f = lambda a, b: jax.lax.reduce_window(  # noqa: E731
        (a, b), (np.float32(0), np.float32(-np.inf)),
        lambda p, q: (p[0] + q[0], jax.lax.max(p[1], q[1])), (2, 2), (1, 1), "VALID")
    check(jax, trn, cpu, f, x, y)


# --- localization of Explicit-axis programs ------------------------------------------

@pytest.fixture(scope="module")
def meshes(jax, trn_devices):
    """name -> (trn mesh, CPU mesh) of the same shape, Explicit axes."""
    cpus = jax.devices("cpu")
    if len(cpus) < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (conftest)")
    explicit = jax.sharding.AxisType.Explicit

    def make(shape, names):
        n = int(np.prod(shape))
        return tuple(jax.make_mesh(shape, names, devices=devs[:n],
                                   axis_types=(explicit,) * len(shape))
                     for devs in (trn_devices, cpus))
    return {"2d": make((4, 2), ("x", "y")), "1d": make((4,), ("x",))}


def _on_both(jax, pair, f, *args):
    """`f(mesh, *args)` under each mesh of `pair` (args placed by their specs)."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    outs = []
    for mesh in pair:
        placed = [jax.device_put(a, NamedSharding(mesh, P(*spec))) for a, spec in args]
        with jax.set_mesh(mesh):
            outs.append(f(mesh, *placed))
    return outs


def _same(jax, out_t, out_c, rtol=1e-5, atol=1e-6):
    for t, c in zip(jax.tree.leaves(out_t), jax.tree.leaves(out_c)):
        assert t.shape == c.shape and t.dtype == c.dtype
        assert {d.platform for d in t.devices()} == {"trn"}
        assert t.sharding.spec == c.sharding.spec, (t.sharding, c.sharding)
        np.testing.assert_allclose(np.asarray(t, np.float64), np.asarray(c, np.float64),
                                   rtol=rtol, atol=atol)


X = np.linspace(-7, 7, 32, dtype=np.float32).reshape(8, 4)


def test_erf_inv_of_an_explicit_sharded_array(jax, meshes):
    """chlo.erf_inv's coefficient tensors become sharded splat constants."""
    f = lambda m, a: jax.jit(lambda a: jax.lax.erf_inv(a / 8))(a)  # noqa: E731
    _same(jax, *_on_both(jax, meshes["2d"], f, (X, ("x", "y"))), rtol=2e-5)


def test_non_splat_constant_next_to_an_explicit_sharded_array(jax, meshes):
    c = np.arange(32, dtype=np.float32).reshape(8, 4)
    f = lambda m, a: jax.jit(lambda a: a * c + 1)(a)  # noqa: E731
    _same(jax, *_on_both(jax, meshes["2d"], f, (X, ("x", "y"))))


def test_any_over_sharded_dims_all_reduces_bool(jax, meshes):
    f = lambda m, a: jax.jit(lambda a: (jax.numpy.any(a > 6.5), jax.numpy.all(a > -7)))(a)  # noqa: E731
    _same(jax, *_on_both(jax, meshes["2d"], f, (X, ("x", "y"))))


def test_top_k_composite_of_sharded_rows(jax, meshes):
    """The chlo.top_k composite is partitioned as a call of its decomposition."""
    f = lambda m, a: jax.jit(lambda a: jax.lax.top_k(a, 2))(a)  # noqa: E731
    _same(jax, *_on_both(jax, meshes["2d"], f, (X, ("x", None))))


RANDOM = {
    "normal": lambda r, k, n, s: r.normal(k, shape=(n,), out_sharding=s),
    "ball": lambda r, k, n, s: r.ball(k, d=3, shape=(n,), out_sharding=s),
    "categorical": lambda r, k, n, s: r.categorical(k, np.ones((n,), np.float32),
                                                    shape=(n,), out_sharding=s,
                                                    replace=False),
}


@pytest.mark.parametrize("name", sorted(RANDOM))
def test_random_with_out_sharding(jax, meshes, name):
    from jax.sharding import NamedSharding, PartitionSpec as P

    def f(mesh):
        s = NamedSharding(mesh, P("x"))
        fn = jax.jit(lambda k: RANDOM[name](jax.random, k, 4, s))
        return fn(jax.random.key(0))
    _same(jax, *_on_both(jax, meshes["1d"], lambda m: f(m)), rtol=2e-5)
