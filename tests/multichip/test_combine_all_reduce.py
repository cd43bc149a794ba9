"""combine-all-reduce: a data-parallel step's gradient all-reduces become one message
(hlo_passes/passes/combine_all_reduce.py; the runtime sends a combined all_reduce as
one flat message), numerics checked against the CPU mesh; and what must not combine."""
from __future__ import annotations

import numpy as np
import pytest

import hlo_passes
from hlo_passes.passes import combine_all_reduce
from tests.hlo_passes.helpers import from_text

RNG = np.random.default_rng(5)
PARAMS = {"g": RNG.normal(size=(64,)).astype(np.float32),
          "w1": (RNG.normal(size=(64, 128)) * 0.1).astype(np.float32),
          "b1": RNG.normal(size=(128,)).astype(np.float32),
          "w2": (RNG.normal(size=(128, 64)) * 0.1).astype(np.float32),
          "b2": RNG.normal(size=(64,)).astype(np.float32)}
X = RNG.normal(size=(8 * 16, 64)).astype(np.float32)


def _step(p, x):
    import jax

    def loss(p):
        h = x * p["g"]
        h = jax.nn.gelu(h @ p["w1"] + p["b1"])
        return ((h @ p["w2"] + p["b2"] - x) ** 2).mean()
    l, g = jax.value_and_grad(loss)(p)
    return jax.tree.map(lambda a, b: a - 0.01 * b, p, g), l


def _run(jax, devices):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_trn
    mesh = jax.make_mesh((8,), ("d",), devices=devices[:8])
    p = jax.device_put(PARAMS, NamedSharding(mesh, P()))
    x = jax.device_put(X, NamedSharding(mesh, P("d")))
    with jax.default_matmul_precision("highest"), jax_trn.profile() as prof:
        out = jax.block_until_ready(jax.jit(_step)(p, x))
    return jax.device_get(out), prof.executions


def test_dp_step_sends_one_all_reduce_and_matches_cpu(jax, trn_devices):
    if len(jax.devices("cpu")) < 8:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8 (conftest)")
    got, executions = _run(jax, trn_devices)
    want, _ = _run(jax, jax.devices("cpu"))
    (ex,) = [e for e in executions if e.collectives]
    assert [c.kind for c in ex.collectives] == ["all_reduce"]   # 5 gradients + the loss
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6),
                 got, want)


ALL_REDUCE = """
    %{r} = "stablehlo.all_reduce"(%{x}) ({{
      ^bb0(%p: tensor<f32>, %q: tensor<f32>):
        %s = stablehlo.add %p, %q : tensor<f32>
        stablehlo.return %s : tensor<f32>
    }}) {{replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>}} : (tensor<4xf32>) -> tensor<4xf32>"""


def _module(body: str) -> str:
    return ("func.func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {"
            + body + "\n    return %out : tensor<4xf32>\n  }")


def _all_reduces(module) -> list:
    return [op for op in module.main.body.ops if op.kind == "all_reduce"]


def test_users_between_the_members_move_after_the_combined_op():
    text = _module(ALL_REDUCE.format(r="a", x="x") + """
    %t = stablehlo.exponential %a : tensor<4xf32>""" + ALL_REDUCE.format(r="b", x="y") + """
    %out = stablehlo.add %t, %b : tensor<4xf32>""")
    module = from_text(text)
    assert combine_all_reduce.run(module)
    hlo_passes.verify(module)
    ops = module.main.body.ops
    (ar,) = _all_reduces(module)
    assert len(ar.operands) == 2
    assert [o.kind for o in ops[ops.index(ar):]] == ["all_reduce", "exponential", "add",
                                                    "func.return"]


def test_an_all_reduce_of_an_all_reduce_is_not_combined():
    text = _module(ALL_REDUCE.format(r="a", x="x") + """
    %t = stablehlo.exponential %a : tensor<4xf32>""" + ALL_REDUCE.format(r="out", x="t"))
    module = from_text(text)
    assert not combine_all_reduce.run(module)
    assert len(_all_reduces(module)) == 2


def test_different_groups_are_not_combined():
    other = ALL_REDUCE.format(r="b", x="y").replace("[[0, 1, 2, 3]]", "[[0, 1], [2, 3]]") \
        .replace("1x4xi64", "2x2xi64")
    text = _module(ALL_REDUCE.format(r="a", x="x") + other + """
    %out = stablehlo.add %a, %b : tensor<4xf32>""")
    module = from_text(text)
    assert not combine_all_reduce.run(module)
    assert len(_all_reduces(module)) == 2
