"""Wall-clock of the simulator running numerics (not timing-only), jitted on the trn
backend vs JAX's CPU backend, in one run: the transformer block fwd+bwd of
benchmarks/compiler.py (d1024, S1024, bf16), a 2048^3 bf16 GEMM, a GRU cell in
`lax.scan` over 64 steps (equinox's GRUCell equations, batch 16, 64 -> 128), and a
training step of a 2-layer d128 flax-linen LM (lm1b-style: vocab 1024, 4 heads, MLP
512, batch 8 x 64 tokens, optax adamw) -- issue 14's targets.

    PYTHONPATH=. python benchmarks/sim_numerics.py [--rows block gemm gru lm] [--repeat N]

Prints the best wall time of `--repeat` calls after a first (compiling) call. The
simulator's tile math runs on one BLAS thread (`jax_trn.runtime.blas`, issue 14 point
1) whatever numpy's own setting is; set OPENBLAS_NUM_THREADS to compare.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _concrete(jax, args, seed: int = 0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: (rng.normal(size=s.shape) * 0.02).astype(s.dtype), args)


def block(jax):
    from benchmarks.compiler import block_args
    f, args = block_args()
    return jax.jit(f), _concrete(jax, args)


def gemm(jax):
    jnp = jax.numpy
    s = jax.ShapeDtypeStruct((2048, 2048), jnp.bfloat16)
    return jax.jit(lambda a, b: a @ b), _concrete(jax, (s, s))


def gru(jax, steps: int = 64, batch: int = 16, n_in: int = 64, hidden: int = 128):
    jnp = jax.numpy
    rng = np.random.default_rng(1)
    w = lambda *s: (rng.normal(size=s) / np.sqrt(s[0])).astype(np.float32)   # noqa: E731
    params = {"wi": w(n_in, 3 * hidden), "wh": w(hidden, 3 * hidden),
              "b": np.zeros(3 * hidden, np.float32), "bn": np.zeros(hidden, np.float32)}

    def cell(p, h, x):                              # equinox.nn.GRUCell
        i = x @ p["wi"] + p["b"]
        hh = h @ p["wh"]
        r = jax.nn.sigmoid(i[:, :hidden] + hh[:, :hidden])
        z = jax.nn.sigmoid(i[:, hidden:2 * hidden] + hh[:, hidden:2 * hidden])
        n = jnp.tanh(i[:, 2 * hidden:] + r * (hh[:, 2 * hidden:] + p["bn"]))
        return (1 - z) * n + z * h

    def f(p, xs):
        h0 = jnp.zeros((batch, hidden), jnp.float32)
        h, hs = jax.lax.scan(lambda h, x: (cell(p, h, x),) * 2, h0, xs)
        return h, hs.sum()
    xs = rng.normal(size=(steps, batch, n_in)).astype(np.float32)
    return jax.jit(f), (params, xs)


def lm(jax, vocab: int = 1024, d: int = 128, layers: int = 2, heads: int = 4,
       batch: int = 8, seq: int = 64):
    import flax.linen as nn
    import optax
    jnp = jax.numpy

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            mask = nn.make_causal_mask(jnp.ones(x.shape[:2]))
            x = x + nn.SelfAttention(heads, deterministic=True)(nn.LayerNorm()(x), mask)
            h = nn.Dense(4 * d)(nn.LayerNorm()(x))
            return x + nn.Dense(d)(nn.gelu(h))

    class LM(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            emb = nn.Embed(vocab, d)
            x = emb(tokens) + self.param("pos", nn.initializers.normal(0.02), (seq, d))
            for _ in range(layers):
                x = Block()(x)
            return emb.attend(nn.LayerNorm()(x))

    rng = np.random.default_rng(2)
    tokens = rng.integers(0, vocab, (batch, seq + 1)).astype(np.int32)
    model, tx = LM(), optax.adamw(1e-3)
    with jax.default_device(jax.devices("cpu")[0]):
        params = jax.tree.map(np.asarray, model.init(jax.random.PRNGKey(0), tokens[:, :-1]))
    opt = jax.tree.map(np.asarray, tx.init(params))

    def step(params, opt, tokens):
        def loss_fn(p):
            logits = model.apply(p, tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(
                logits, tokens[:, 1:]).mean()
        loss, g = jax.value_and_grad(loss_fn)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss
    return jax.jit(step), (params, opt, tokens)


ROWS = {"block": block, "gemm": gemm, "gru": gru, "lm": lm}


def best_wall(jax, f, args, device, repeat: int) -> tuple[float, float]:
    args = jax.device_put(args, device)
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    first = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        jax.block_until_ready(f(*args))
        best = min(best, time.perf_counter() - t0)
    return first, best


def main() -> None:
    import jax
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--repeat", type=int, default=1)
    a = parser.parse_args()
    print(f"{'program':8} {'cpu s':>8} {'trn first s':>12} {'trn s':>8} {'trn/cpu':>8}")
    for name in a.rows:
        f, args = ROWS[name](jax)
        _, cpu = best_wall(jax, f, args, jax.devices("cpu")[0], a.repeat)
        first, trn = best_wall(jax, f, args, jax.devices("trn")[0], a.repeat)
        print(f"{name:8} {cpu:8.2f} {first:12.2f} {trn:8.2f} {trn / cpu:8.1f}x", flush=True)


if __name__ == "__main__":
    main()
