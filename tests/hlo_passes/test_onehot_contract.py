"""The onehot-contract pass: a row sum of (smoothed) one-hot labels times y becomes y
gathered at the label (plus b * sum(y) for smoothed labels), in the idioms users write
(optax.softmax_cross_entropy, flax's -sum(one_hot * log_softmax)), forward and
gradient; and what it must leave alone."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_passes
from hlo_passes import ir

from .helpers import artifact_of

B, S, V = 2, 24, 160


def _ops(module) -> list:
    """Top-level ops and those inside fusions."""
    return [o for op in module.main.body.ops for o in
            ([op] + (list(ir.walk(op.regions[0].block)) if op.regions else []))]


def _full_reduces(module, full) -> int:
    """Reduces (fused or not) whose input has the full [.., V] shape `full`."""
    return sum(o.kind == "reduce" and tuple(o.operands[0].shape) == full
               for o in _ops(module))


def _kinds(f, *args) -> list[str]:
    return [o.kind for o in _ops(hlo_passes.compile_to_ir(artifact_of(f, *args)))]


def _counts(f, *args):
    code = artifact_of(f, *args)
    full = (B, S, V)
    on = hlo_passes.compile_to_ir(code)
    off = hlo_passes.compile_to_ir(code, disabled_passes=("onehot-contract",))
    return _full_reduces(off, full), _full_reduces(on, full)


def _optax_smoothed(x, t):
    import optax
    labels = optax.smooth_labels(jax.nn.one_hot(t, V), 0.1)
    return optax.softmax_cross_entropy(x, labels).mean()


def _flax_onehot(x, t):
    return -jnp.sum(jax.nn.one_hot(t, V) * jax.nn.log_softmax(x), -1).mean()


ARGS = (jnp.zeros((B, S, V), jnp.float32), jnp.zeros((B, S), jnp.int32))


@pytest.mark.parametrize("loss, fewer", [(_optax_smoothed, 1), (_flax_onehot, 2)])
def test_label_sums_leave_the_logits(loss, fewer):
    """The gradient's row sum of labels is per-row work; the forward label term a
    gather, plus (smoothed labels) a plain row sum of log_softmax that reads no labels."""
    before, after = _counts(jax.value_and_grad(loss), *ARGS)
    assert after == before - fewer
    assert "gather" in _kinds(jax.value_and_grad(loss), *ARGS)


def test_no_labels_materialized():
    """The f32 [B, S, V] labels have one elementwise user left (the gradient): no
    fusion writes them."""
    module = hlo_passes.compile_to_ir(artifact_of(jax.grad(_optax_smoothed), *ARGS))
    outs = [r for op in module.main.body.ops for r in op.results
            if r.shape == (B, S, V)]
    assert len(outs) == 1       # the gradient itself


NOT_REWRITTEN = {
    "max, not sum": lambda x, t: jnp.max(jax.nn.one_hot(t, V) * x, -1),
    "one-hot along another axis": lambda x, t: jnp.sum(
        jax.nn.one_hot(t[:, :1], S, axis=1)[..., :1] * x, 1),
    "compare LT": lambda x, t: jnp.sum(
        (jnp.arange(V) < t[..., None]).astype(x.dtype) * x, -1),
    "not affine in the one-hot": lambda x, t: jnp.sum(
        jnp.exp(jax.nn.one_hot(t, V)) * x, -1),
    "init not zero": lambda x, t: jax.lax.reduce(
        jax.nn.one_hot(t, V) * x, np.float32(1.0), jax.lax.add, (2,)),
}


@pytest.mark.parametrize("name", sorted(NOT_REWRITTEN))
def test_must_not_rewrite(name):
    assert "gather" not in _kinds(NOT_REWRITTEN[name], *ARGS)
    before, after = _counts(NOT_REWRITTEN[name], *ARGS)
    assert before == after
