"""pads-to-concat and compose-views: the IR they leave, and what they leave alone.
Their numerics against the CPU backend are in tests/e2e/test_layout_rewrites.py."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import hlo_passes
from hlo_passes import ir
from tests.hlo_passes.helpers import artifact_of, kinds


def _ir(f, *args) -> list[str]:
    return kinds(hlo_passes.compile_to_ir(artifact_of(f, *args)).main.body)


def _ops(f, *args) -> list[ir.Op]:
    return hlo_passes.compile_to_ir(artifact_of(f, *args)).main.body.ops


X3 = jnp.ones((3, 8, 16))


def test_gradient_of_unstacking_is_one_concatenate():
    g = jax.grad(lambda a: (jnp.sin(a[0]) + 2 * jnp.sin(a[1]) + 3 * a[2]).sum())
    got = _ir(g, X3)
    assert "concatenate" in got and "pad" not in got and "add" not in got


def test_a_gap_becomes_a_zero_piece():
    g = jax.grad(lambda a: (jnp.sin(a[0]) + 3 * a[2]).sum())
    ops = _ops(g, X3)
    (cat,) = [op for op in ops if op.kind == "concatenate"]
    assert [v.shape for v in cat.operands] == [(1, 8, 16)] * 3
    assert "pad" not in [op.kind for op in ops]


def test_overlapping_pieces_still_add():
    g = jax.grad(lambda a: (jnp.sin(a[0:2]) + a[1:3] ** 2).sum())
    got = _ir(g, X3)
    assert "concatenate" not in got and got.count("pad") == 2


def test_pads_along_two_axes_still_add():
    x = jnp.ones((4, 4))
    g = jax.grad(lambda a: (jnp.sin(a[:2, :2]) + jnp.cos(a[2:, 2:])).sum())
    assert "concatenate" not in _ir(g, x)


def _split_heads(x):
    qkv = x.reshape(64, 3, 4, 32).transpose(1, 2, 0, 3)
    q, k = qkv[0][None], qkv[1][None]
    return jnp.einsum("bhqd,bhkd->bhqk", q, k)


def test_a_head_split_is_one_view_per_operand():
    module = hlo_passes.compile_to_ir(artifact_of(_split_heads, jnp.ones((64, 384))))
    ops = module.main.body.ops
    views = [op for op in ops if op.kind == "trn.view"]
    assert len(views) == 2 and all(op.operands[0] is module.main.args[0] for op in views)
    assert not {"reshape", "transpose", "slice"} & {op.kind for op in ops[:-2]}
    q, k = sorted(views, key=lambda op: op.attrs["offset"])
    assert q.attrs["offset"] == 0 and k.attrs["offset"] == 128
    assert q.attrs["axes"][-3:] == ((32, 4), (384, 64), (1, 32))


def test_a_chain_with_a_strided_innermost_axis_is_left_to_the_transpose():
    f = lambda x: x.reshape(16, 4, 8).transpose(0, 2, 1)[:, :, 1:] * 2     # noqa: E731
    got = _ir(f, jnp.ones((64, 8)))
    assert "trn.view" not in got


def test_a_single_layout_op_is_left_alone():
    f = lambda x, w: x.T @ w          # noqa: E731
    assert "trn.view" not in _ir(f, jnp.ones((8, 16)), jnp.ones((8, 4)))


def test_reshape_of_a_strided_view():
    """numpy's rule: a transposed [6, 4] view of a [4, 6] array can split its first
    axis without a copy, but not merge the two."""
    from hlo_passes.passes.compose_views import _reshape
    t = ((1, 6), (6, 4))
    assert _reshape(t, (24,), 0) is None
    axes, offset = _reshape(t, (3, 2, 4), 5)
    assert offset == 5
    want = np.arange(24).reshape(4, 6).T.reshape(3, 2, 4)
    got = np.array([[[sum(st * i for st, i in zip((a[0] for a in axes), (i, j, k)))
                      for k in range(4)] for j in range(2)] for i in range(3)])
    assert np.array_equal(got, want)


def test_gradient_of_a_transposed_weight_has_no_transpose():
    """simplify composes transpose(transpose(x)): JAX's gradient of x @ E.T (flax
    `Embed.attend`) is a dot and two transposes; composed away, the dot is the gradient."""
    def f(e, x):
        return jax.grad(lambda e: jnp.dot(x, e.astype(jnp.bfloat16).T).astype(
            jnp.float32).sum())(e)
    got = _ir(f, jnp.ones((512, 128)), jnp.ones((4, 64, 128), jnp.bfloat16))
    assert "transpose" not in got


def test_transposes_compose():
    f = lambda x: jnp.transpose(jnp.transpose(x, (1, 2, 0)), (2, 0, 1)) + 1.0   # noqa: E731
    g = lambda x: jnp.transpose(jnp.transpose(x, (1, 2, 0)), (1, 0, 2)) + 1.0   # noqa: E731
    x = jnp.ones((2, 3, 4))
    assert _ir(f, x).count("transpose") == 0
    ops = _ops(g, x)
    (t,) = [op for op in ops if op.kind == "transpose"]
    assert tuple(t.attrs["permutation"]) == (2, 1, 0)


def test_two_pieces_at_the_same_place_still_add():
    from tests.hlo_passes.helpers import from_text
    from hlo_passes.passes import pads_to_concat
    m = from_text("""
  func.func @main(%a: tensor<1x4xf32>, %b: tensor<1x4xf32>) -> tensor<2x4xf32> {
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %pa = stablehlo.pad %a, %z, low = [0, 0], high = [1, 0], interior = [0, 0] : (tensor<1x4xf32>, tensor<f32>) -> tensor<2x4xf32>
    %pb = stablehlo.pad %b, %z, low = [0, 0], high = [1, 0], interior = [0, 0] : (tensor<1x4xf32>, tensor<f32>) -> tensor<2x4xf32>
    %s = stablehlo.add %pa, %pb : tensor<2x4xf32>
    return %s : tensor<2x4xf32>
  }""")
    assert not pads_to_concat.run(m)
    assert kinds(m.main.body).count("pad") == 2
