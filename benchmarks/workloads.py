"""Programs users run, written as they write them, for the speed benchmarks.

Each builder returns `(step, args)`: a jitted function and its arguments as numpy
arrays / pytrees (place them with `jax.device_put(args, device)`), so one definition
runs on trn and on JAX's CPU backend in the same process. Shapes follow the issue that
asked for the measure (issue 14: "speed").
"""
from __future__ import annotations

import numpy as np


def flax_lm(layers: int = 2, width: int = 128, heads: int = 4, mlp: int = 512,
            vocab: int = 30000, length: int = 256, batch: int = 4, dtype=None,
            abstract: bool = False):
    """A flax linen decoder LM training step, lm1b's model shape scaled to `layers` x
    `width` (pre-LN blocks, causal self-attention, tied embedding, smoothed labels,
    optax adamw): (step(params, opt, tokens) -> (params, opt, loss), args). `dtype`:
    the modules' compute dtype (float32 parameters either way); `abstract`: args as
    `jax.ShapeDtypeStruct`s (for `jax_trn.estimate`), nothing initialized."""
    import flax.linen as nn
    import jax
    import optax

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, mask):
            h = nn.LayerNorm(dtype=dtype)(x)
            x = x + nn.MultiHeadDotProductAttention(heads, qkv_features=width,
                                                    dtype=dtype)(h, h, mask=mask)
            h = nn.LayerNorm(dtype=dtype)(x)
            return x + nn.Dense(width, dtype=dtype)(nn.relu(nn.Dense(mlp, dtype=dtype)(h)))

    class TransformerLM(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            embed = nn.Embed(vocab, width, dtype=dtype)
            pos = self.param("pos", nn.initializers.normal(0.02), (length, width))
            x = embed(tokens) + pos[:tokens.shape[1]]
            mask = nn.make_causal_mask(tokens)
            for _ in range(layers):
                x = Block()(x, mask)
            return embed.attend(nn.LayerNorm(dtype=dtype)(x))

    model, tx = TransformerLM(), optax.adamw(1e-3)
    tokens = np.random.default_rng(0).integers(0, vocab, (batch, length)).astype(np.int32)
    with jax.default_device(jax.devices("cpu")[0]):
        if abstract:
            params = jax.eval_shape(model.init, jax.random.key(0), tokens)
            opt = jax.eval_shape(tx.init, params)
            tokens = jax.ShapeDtypeStruct(tokens.shape, tokens.dtype)
        else:
            params = jax.device_get(model.init(jax.random.key(0), tokens))
            opt = jax.device_get(tx.init(params))

    @jax.jit
    def step(params, opt, tokens):
        def loss_fn(p):
            logits = model.apply(p, tokens[:, :-1])
            labels = optax.smooth_labels(jax.nn.one_hot(tokens[:, 1:], vocab), 0.1)
            return optax.softmax_cross_entropy(logits, labels).mean()
        loss, g = jax.value_and_grad(loss_fn)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss
    return step, (params, opt, tokens)


def equinox_gru(steps: int = 64, hidden: int = 128, features: int = 64, batch: int = 32):
    """An equinox GRUCell unrolled by `lax.scan` over `steps` time steps (vmapped over
    the batch), a linear readout, MSE, optax adam: a training step."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax

    class Model(eqx.Module):
        cell: eqx.nn.GRUCell
        out: eqx.nn.Linear

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.cell = eqx.nn.GRUCell(features, hidden, key=k1)
            self.out = eqx.nn.Linear(hidden, 1, key=k2)

        def __call__(self, xs):
            def scan_fn(h, x):
                return self.cell(x, h), None
            h, _ = jax.lax.scan(scan_fn, jnp.zeros(hidden), xs)
            return self.out(h)

    rng = np.random.default_rng(1)
    xs = rng.standard_normal((batch, steps, features)).astype(np.float32)
    ys = rng.standard_normal((batch, 1)).astype(np.float32)
    tx = optax.adam(1e-3)
    with jax.default_device(jax.devices("cpu")[0]):
        model = Model(jax.random.key(0))
        params, static = eqx.partition(model, eqx.is_inexact_array)
        params = jax.device_get(params)
        opt = jax.device_get(tx.init(params))

    @jax.jit
    def step(params, opt, xs, ys):
        def loss_fn(p):
            m = eqx.combine(p, static)
            return jnp.mean((jax.vmap(m)(xs) - ys) ** 2)
        loss, g = jax.value_and_grad(loss_fn)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss
    return step, (params, opt, xs, ys)


def block(d: int = 1024, s: int = 1024):
    """benchmarks/compiler.py's transformer block fwd+bwd (bf16, [S, d]) with numpy
    arguments."""
    import jax
    import ml_dtypes
    from compiler import block_args
    f, specs = block_args(d, s)
    rng = np.random.default_rng(2)
    args = jax.tree.map(lambda a: (rng.standard_normal(a.shape) * 0.05).astype(
        ml_dtypes.bfloat16), specs)
    return jax.jit(f), args


def dp_mlp(devices: int, sizes=(128, 256, 256, 128, 10), per_device: int = 8, seed: int = 0):
    """A data-parallel MLP training step (ReLU layers, softmax cross-entropy over
    `take_along_axis`, plain SGD at 0.1): (step(params, x, y) -> (params, loss),
    (params, x, y)) with a global batch of `per_device` rows per device. Place params
    replicated and x, y sharded on their first axis. The default sizes (~132K
    parameters) are issue 14's 1152-device measure (simspeed.py's dp1152 row);
    tests/multichip runs a small one on a few chips."""
    import jax
    import jax.numpy as jnp
    rng = np.random.default_rng(seed)
    params = [(rng.standard_normal((a, b)).astype(np.float32) * a ** -0.5,
               np.zeros(b, np.float32)) for a, b in zip(sizes[:-1], sizes[1:])]
    x = rng.standard_normal((per_device * devices, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], per_device * devices).astype(np.int32)

    def loss_fn(params, x, y):
        for w, b in params[:-1]:
            x = jax.nn.relu(x @ w + b)
        w, b = params[-1]
        logits = x @ w + b
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], 1))

    @jax.jit
    def step(params, x, y):
        loss, g = jax.value_and_grad(loss_fn)(params, x, y)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, g), loss
    return step, (params, x, y)
