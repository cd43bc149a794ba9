"""Small real programs in the idioms of flax (linen and NNX), optax and equinox, for the
test tier (test_real_programs.py) and benchmarks/programs.py.

Each program is `run(jax, steps) -> Run`: it builds its model and data from fixed seeds
and trains `steps` steps, all on JAX's default device, so the caller picks the backend
with `jax.default_device(device)` and compares a trn run with a CPU run. Sizes are tiny:
the tier has to fit in a few minutes of a 2-core machine, where compiling a step for the
simulated NeuronCore dominates.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np


@dataclass
class Run:
    losses: list[float]
    params: list = field(default_factory=list)          # leaves after the last step
    step: Callable | None = None                          # the jitted step, for timing
    args: tuple = ()                                      # arguments of one more step


@dataclass(frozen=True)
class Program:
    name: str
    run: Callable
    idioms: str
    needs: str = ""          # the issue-12 item it waits on ("" when it should work)
    devices: int = 1


PROGRAMS: dict[str, Program] = {}


def program(name: str, idioms: str, needs: str = "", devices: int = 1):
    def register(fn):
        PROGRAMS[name] = Program(name, fn, idioms, needs, devices)
        return fn
    return register


def _data(rows: int, features: int, classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, features)).astype(np.float32)
    y = rng.integers(0, classes, rows).astype(np.int32)
    return x, y


def _leaves(jax, tree) -> list:
    return [np.asarray(a) for a in jax.tree.leaves(tree)]


def _train(jax, step, params, opt, x, y, steps: int) -> Run:
    """`steps` calls of a `step(params, opt, x, y) -> (params, opt, loss)`."""
    losses = []
    for _ in range(steps):
        params, opt, loss = step(params, opt, x, y)
        losses.append(float(loss))
    return Run(losses, _leaves(jax, params), step, (params, opt, x, y))


def _schedule(optax, steps: int):
    return optax.warmup_cosine_decay_schedule(0.0, 1e-2, max(1, steps // 2), 10 * steps)


def _chain(optax, steps: int):
    """The usual optax chain: global-norm clipping, then AdamW on a warmup-cosine
    schedule."""
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(_schedule(optax, steps), weight_decay=1e-4))


# --- flax linen -----------------------------------------------------------------------


@program("linen_mlp_adamw", "linen Dense, optax chain (clip + adamw + schedule)")
def linen_mlp(jax, steps: int) -> Run:
    import flax.linen as nn
    import optax

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.gelu(nn.Dense(64)(x))
            return nn.Dense(10)(x)

    x, y = _data(32, 24, 10)
    model, tx = MLP(), _chain(optax, steps)
    params = model.init(jax.random.PRNGKey(0), x)["params"]
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, x, y):
        def loss_fn(p):
            logits = model.apply({"params": p}, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        loss, g = jax.value_and_grad(loss_fn)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss

    return _train(jax, step, params, opt, x, y, steps)


@program("linen_cnn_batchnorm_dropout", "linen Conv, BatchNorm (batch_stats), Dropout, sgd")
def linen_cnn(jax, steps: int) -> Run:
    import flax.linen as nn
    import optax

    class CNN(nn.Module):
        @nn.compact
        def __call__(self, x, train: bool):
            x = nn.Conv(8, (3, 3), use_bias=False)(x)        # BatchNorm follows
            x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
            x = nn.relu(x)
            x = nn.avg_pool(x, (2, 2), (2, 2))
            x = nn.Dropout(0.2, deterministic=not train)(x.reshape(x.shape[0], -1))
            return nn.Dense(10)(x)

    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 8, 8, 3)).astype(np.float32)
    y = rng.integers(0, 10, 8).astype(np.int32)
    model, tx = CNN(), optax.sgd(0.05, momentum=0.9)
    v = model.init(jax.random.PRNGKey(0), x, train=False)
    params, stats = v["params"], v["batch_stats"]
    opt = tx.init(params)

    @jax.jit
    def step(params, stats, opt, x, y, key):
        def loss_fn(p):
            logits, upd = model.apply({"params": p, "batch_stats": stats}, x, train=True,
                                      rngs={"dropout": key}, mutable=["batch_stats"])
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
            return loss, upd["batch_stats"]
        (loss, stats), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), stats, opt, loss

    losses, key = [], jax.random.PRNGKey(7)
    for i in range(steps):
        params, stats, opt, loss = step(params, stats, opt, x, y, jax.random.fold_in(key, i))
        losses.append(float(loss))
    args = (params, stats, opt, x, y, jax.random.fold_in(key, steps))
    return Run(losses, _leaves(jax, (params, stats)), step, args)


@program("linen_scan_layers", "nn.scan over layers (stacked params), optax adam")
def linen_scan(jax, steps: int) -> Run:
    import flax.linen as nn
    import optax

    class Layer(nn.Module):
        @nn.compact
        def __call__(self, h, _):
            return h + nn.tanh(nn.Dense(16)(h)), None

    class Deep(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.Dense(16)(x)
            stack = nn.scan(Layer, variable_axes={"params": 0}, split_rngs={"params": True},
                            length=3)
            h, _ = stack()(h, None)
            return nn.Dense(1)(h)[:, 0]

    rng = np.random.default_rng(2)
    x = rng.normal(size=(16, 8)).astype(np.float32)
    y = np.sin(x.sum(-1)).astype(np.float32)
    model, tx = Deep(), optax.adam(1e-2)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), x)["params"]
    opt = tx.init(params)

    @jax.jit
    def step(params, opt, x, y):
        loss, g = jax.value_and_grad(lambda p: ((model.apply({"params": p}, x) - y) ** 2)
                                     .mean())(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss

    return _train(jax, step, params, opt, x, y, steps)


# --- flax NNX ---------------------------------------------------------------------------


def _nnx_train(jax, nnx, model, optimizer, loss_fn, batches, steps):
    @nnx.jit
    def step(model, optimizer, *batch):
        loss, grads = nnx.value_and_grad(loss_fn)(model, *batch)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(model, optimizer, *batches)) for _ in range(steps)]
    return Run(losses, _leaves(jax, nnx.state(model, nnx.Param)), step,
               (model, optimizer, *batches))


@program("nnx_mlp_batchnorm_dropout", "NNX Linear, BatchNorm, Dropout, nnx.Optimizer(adamw)")
def nnx_mlp(jax, steps: int) -> Run:
    import optax
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            # no bias before BatchNorm (its gradient is zero: BN removes the mean)
            self.l1 = nnx.Linear(24, 48, use_bias=False, rngs=rngs)
            self.bn = nnx.BatchNorm(48, momentum=0.9, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)
            self.l2 = nnx.Linear(48, 10, rngs=rngs)

        def __call__(self, x):
            return self.l2(self.drop(nnx.relu(self.bn(self.l1(x)))))

    def loss_fn(model, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

    model = MLP(nnx.Rngs(params=0, dropout=1))
    optimizer = nnx.Optimizer(model, _chain(optax, steps), wrt=nnx.Param)
    return _nnx_train(jax, nnx, model, optimizer, loss_fn, _data(32, 24, 10), steps)


def _rope(jnp, x, base: float = 10000.0):
    """Rotary position embedding over the last axis of [batch, seq, heads, dim]."""
    s, d = x.shape[1], x.shape[-1]
    inv = 1.0 / base ** (np.arange(0, d, 2, dtype=np.float32) / d)
    ang = np.arange(s, dtype=np.float32)[:, None] * inv[None, :]
    cos, sin = jnp.asarray(np.cos(ang))[None, :, None], jnp.asarray(np.sin(ang))[None, :, None]
    x1, x2 = x[..., ::2], x[..., 1::2]
    return jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).reshape(x.shape)


@program("nnx_gqa_rope_attention", "NNX decoder block: GQA, RoPE, "
         "jax.nn.dot_product_attention (causal), RMSNorm, adamw")
def nnx_gqa(jax, steps: int) -> Run:
    import optax
    from flax import nnx
    jnp = jax.numpy
    heads, kv_heads, dim, seq, vocab = 4, 2, 8, 16, 32

    class Block(nnx.Module):
        def __init__(self, rngs):
            width = heads * dim
            self.embed = nnx.Embed(vocab, width, rngs=rngs)
            self.norm1, self.norm2 = nnx.RMSNorm(width, rngs=rngs), nnx.RMSNorm(width, rngs=rngs)
            self.q = nnx.Linear(width, heads * dim, use_bias=False, rngs=rngs)
            self.kv = nnx.Linear(width, 2 * kv_heads * dim, use_bias=False, rngs=rngs)
            self.o = nnx.Linear(heads * dim, width, use_bias=False, rngs=rngs)
            self.up = nnx.Linear(width, 2 * width, rngs=rngs)
            self.down = nnx.Linear(2 * width, width, rngs=rngs)

        def __call__(self, tokens):
            h = self.embed(tokens)
            b = h.shape[0]
            x = self.norm1(h)
            q = self.q(x).reshape(b, seq, heads, dim)
            k, v = jnp.split(self.kv(x).reshape(b, seq, 2 * kv_heads, dim), 2, axis=2)
            q, k = _rope(jnp, q), _rope(jnp, k)
            a = jax.nn.dot_product_attention(q, k, v, is_causal=True)   # GQA: 4 q, 2 kv
            h = h + self.o(a.reshape(b, seq, heads * dim))
            h = h + self.down(jax.nn.silu(self.up(self.norm2(h))))
            return h @ self.embed.embedding[...].T                     # tied embedding

    def loss_fn(model, tokens):
        logits = model(tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    tokens = np.random.default_rng(3).integers(0, vocab, (4, seq + 1)).astype(np.int32)
    model = Block(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adamw(3e-3), wrt=nnx.Param)
    return _nnx_train(jax, nnx, model, optimizer, loss_fn, (tokens,), steps)


# --- plain JAX with optax ---------------------------------------------------------------


@program("lax_scan_layers", "stacked params, jax.lax.scan over layers, optax lion")
def lax_scan_layers(jax, steps: int) -> Run:
    import optax
    jnp = jax.numpy
    rng = np.random.default_rng(4)
    params = {"w": (rng.normal(size=(4, 16, 16)) / 4).astype(np.float32),
              "b": np.zeros((4, 16), np.float32),
              "out": (rng.normal(size=(16, 3)) / 4).astype(np.float32)}
    x = rng.normal(size=(16, 16)).astype(np.float32)
    y = rng.integers(0, 3, 16).astype(np.int32)
    tx = optax.lion(1e-3)
    opt = tx.init(params)

    def loss_fn(p, x, y):
        def layer(h, wb):
            w, b = wb
            return jax.nn.relu(h @ w + b) + h, None
        h, _ = jax.lax.scan(layer, x, (p["w"], p["b"]))
        return optax.softmax_cross_entropy_with_integer_labels(h @ p["out"], y).mean()

    @jax.jit
    def step(params, opt, x, y):
        loss, g = jax.value_and_grad(loss_fn)(params, x, y)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss

    losses = []
    for _ in range(steps):
        params, opt, loss = step(params, opt, jnp.asarray(x), jnp.asarray(y))
        losses.append(float(loss))
    return Run(losses, _leaves(jax, params), step, (params, opt, x, y))


@program("label_smoothing_log_eps", "lm1b-style smoothed cross entropy with "
         "log(low_confidence + 1e-20)")
def label_smoothing(jax, steps: int) -> Run:
    """flax's lm1b/wmt `compute_weighted_cross_entropy`: with label_smoothing=0 the
    normalizing constant takes log(0 + 1e-20), below ScalarE's valid range for Ln."""
    import optax
    jnp = jax.numpy
    x, y = _data(16, 12, 8, seed=5)
    params = {"w": np.zeros((12, 8), np.float32)}
    tx = optax.sgd(0.1)
    opt = tx.init(params)

    def loss_fn(p, x, y, label_smoothing=0.0):
        vocab = 8
        confidence = 1.0 - label_smoothing
        low = (1.0 - confidence) / (vocab - 1)
        norm = -(confidence * jnp.log(confidence)
                 + (vocab - 1) * low * jnp.log(low + 1e-20))
        soft = optax.smooth_labels(jax.nn.one_hot(y, vocab), label_smoothing)
        loss = -jnp.sum(soft * jax.nn.log_softmax(x @ p["w"]), axis=-1) - norm
        return loss.mean()

    @jax.jit
    def step(params, opt, x, y):
        loss, g = jax.value_and_grad(loss_fn)(params, x, y)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss

    return _train(jax, step, params, opt, x, y, steps)


@program("debug_print_in_step", "jax.debug.print inside a jitted train step")
def debug_print(jax, steps: int) -> Run:
    jnp = jax.numpy
    x, y = _data(16, 8, 2, seed=6)
    w = np.zeros((8, 2), np.float32)

    @jax.jit
    def step(w, x, y):
        def loss_fn(w):
            return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(x @ w), y[:, None], 1))
        loss, g = jax.value_and_grad(loss_fn)(w)
        jax.debug.print("loss {l}", l=loss)
        return w - 0.5 * g, loss

    losses = []
    for _ in range(steps):
        w, loss = step(w, x, y)
        losses.append(float(loss))
    return Run(losses, [np.asarray(w)], step, (w, x, y))


@program("donated_train_state", "jit(donate_argnums=0) of the train state, optax adam")
def donated(jax, steps: int) -> Run:
    """Donation honoured: the donated state's buffers are deleted after each step (JAX
    warns "Donation is not implemented" and keeps them otherwise)."""
    import warnings

    import optax
    x, y = _data(16, 8, 4, seed=8)
    rng = np.random.default_rng(8)
    params = {"w": (rng.normal(size=(8, 4)) / 3).astype(np.float32)}
    tx = optax.adam(1e-2)
    state = (jax.device_put(params), tx.init(jax.device_put(params)))

    def loss_fn(p):
        return optax.softmax_cross_entropy_with_integer_labels(x @ p["w"], y).mean()

    def step(state, x, y):
        params, opt = state
        loss, g = jax.value_and_grad(loss_fn)(params)
        upd, opt = tx.update(g, opt, params)
        return (optax.apply_updates(params, upd), opt), loss

    step = jax.jit(step, donate_argnums=0)
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")             # "Donation is not implemented for ..."
        for _ in range(steps):
            old = state
            state, loss = step(state, x, y)
            assert all(a.is_deleted() for a in jax.tree.leaves(old)), "donated state kept"
            losses.append(float(loss))
    return Run(losses, _leaves(jax, state[0]), None, ())


# --- equinox ----------------------------------------------------------------------------


@program("equinox_mlp", "equinox MLP, eqx.filter_jit / filter_value_and_grad, optax adamw")
def equinox_mlp(jax, steps: int) -> Run:
    import equinox as eqx
    import optax
    x, y = _data(32, 16, 5, seed=9)
    model = eqx.nn.MLP(16, 5, 32, 2, key=jax.random.PRNGKey(0))
    tx = optax.adamw(1e-2)
    opt = tx.init(eqx.filter(model, eqx.is_inexact_array))

    @eqx.filter_jit
    def step(model, opt, x, y):
        def loss_fn(m):
            logits = jax.vmap(m)(x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        loss, g = eqx.filter_value_and_grad(loss_fn)(model)
        upd, opt = tx.update(g, opt, eqx.filter(model, eqx.is_inexact_array))
        return eqx.apply_updates(model, upd), opt, loss

    losses = []
    for _ in range(steps):
        model, opt, loss = step(model, opt, x, y)
        losses.append(float(loss))
    return Run(losses, _leaves(jax, eqx.filter(model, eqx.is_inexact_array)), step,
               (model, opt, x, y))


from tests.programs import sharded  # noqa: E402,F401  (registers the sharded programs)
