"""The sharded programs of the real-program tier (FSDP on a 4-device mesh), and the
programs that reproduce faults this tier found. Registered into `programs.PROGRAMS`."""
from __future__ import annotations

import numpy as np

from tests.programs.programs import Run, _leaves, _train, program


# --- sharded ----------------------------------------------------------------------------


def _fsdp(jax, steps: int, hidden: int) -> Run:
    """FSDP in the style of flax's examples: the first layer's weight and the batch
    sharded over a 4-way `fsdp` axis (JAX inserts the gathers), and the hidden
    activations constrained to be sharded over it too (`with_sharding_constraint`).
    `hidden` units over 4 devices: 12 divides, 10 does not; XLA pads the uneven shards
    (JAX itself refuses uneven shards only at a jit's boundary and in `device_put`)."""
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    default = jax.config.jax_default_device
    devices = jax.devices(default.platform if default is not None else None)[:4]
    mesh = Mesh(np.array(devices), ("fsdp",))
    rng = np.random.default_rng(10)
    params = {"w1": (rng.normal(size=(8, hidden)) / 3).astype(np.float32),
              "b1": np.zeros((hidden,), np.float32),
              "w2": (rng.normal(size=(hidden, 3)) / 3).astype(np.float32)}
    x = rng.normal(size=(16, 8)).astype(np.float32)
    y = rng.integers(0, 3, 16).astype(np.int32)
    shard, rep = NamedSharding(mesh, P("fsdp")), NamedSharding(mesh, P())
    params = jax.device_put(params, {"w1": shard, "b1": rep, "w2": rep})
    x, y = jax.device_put(x, shard), jax.device_put(y, shard)
    tx = optax.adam(1e-2)
    opt = jax.jit(tx.init)(params)
    hidden_sharded = NamedSharding(mesh, P(None, "fsdp"))

    @jax.jit
    def step(params, opt, x, y):
        def loss_fn(p):
            h = jax.lax.with_sharding_constraint(x @ p["w1"] + p["b1"], hidden_sharded)
            logits = jax.nn.relu(h) @ p["w2"]
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        loss, g = jax.value_and_grad(loss_fn)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss

    return _train(jax, step, params, opt, x, y, steps)


@program("fsdp_even_shapes", "FSDP over a 4-device mesh, 12 hidden units (divide by 4)",
         devices=4)
def fsdp_even(jax, steps: int) -> Run:
    return _fsdp(jax, steps, hidden=12)


@program("fsdp_odd_shapes", "FSDP over a 4-device mesh, 10 hidden units sharded 4 ways",
         devices=4)
def fsdp_odd(jax, steps: int) -> Run:
    return _fsdp(jax, steps, hidden=10)


# --- faults this tier found -------------------------------------------------------------


@program("linen_scan_eager_init", "model.init of an nn.scan model outside jit (eager): "
         "an eager op whose outputs JAX pruned compiles to a module with no results")
def linen_scan_eager(jax, steps: int) -> Run:
    import flax.linen as nn

    class Layer(nn.Module):
        @nn.compact
        def __call__(self, h, _):
            return h + nn.tanh(nn.Dense(4)(h)), None

    stack = nn.scan(Layer, variable_axes={"params": 0}, split_rngs={"params": True},
                    length=2)
    x = np.ones((2, 4), np.float32)
    params = stack().init(jax.random.PRNGKey(0), x, None)["params"]
    return Run([float(np.sum(x))], _leaves(jax, params))


@program("pmap_data_parallel", "jax.pmap train step over 4 devices, grads averaged with "
         "lax.pmean (flax imagenet style), optax sgd with nesterov momentum", devices=4)
def pmap_data_parallel(jax, steps: int) -> Run:
    import optax
    default = jax.config.jax_default_device
    devices = jax.devices(default.platform if default is not None else None)[:4]
    rng = np.random.default_rng(11)
    params = {"w": (rng.normal(size=(8, 4)) / 3).astype(np.float32),
              "b": np.zeros((4,), np.float32)}
    x = rng.normal(size=(4, 8, 8)).astype(np.float32)          # [device, batch, features]
    y = rng.integers(0, 4, (4, 8)).astype(np.int32)
    tx = optax.sgd(0.1, momentum=0.9, nesterov=True)
    replicate = lambda t: jax.tree.map(lambda a: np.stack([np.asarray(a)] * 4), t)  # noqa
    params, opt = replicate(params), replicate(tx.init(params))

    def train_step(params, opt, x, y):
        def loss_fn(p):
            logits = x @ p["w"] + p["b"]
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
        loss, g = jax.value_and_grad(loss_fn)(params)
        g, loss = jax.lax.pmean((g, loss), "batch")
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss

    step = jax.pmap(train_step, axis_name="batch", devices=devices)
    losses = []
    for _ in range(steps):
        params, opt, loss = step(params, opt, x, y)
        losses.append(float(loss[0]))
    return Run(losses, _leaves(jax, jax.tree.map(lambda a: a[0], params)), step,
               (params, opt, x, y))
