"""The persistent compilation cache on an lm1b-size training step (issue 19).

Compiles flax lm1b's model shape (6 decoder layers, width 512, 8 heads, MLP 2048, causal
self-attention, tied embedding over a 30k vocabulary, optax adamw) twice, each time in a
fresh process with the same `jax_compilation_cache_dir`: the first compiles and writes
the cache, the second reads it. Prints wall seconds of JAX's tracing (`.lower()`, which
no cache skips, on CPU either) and of the compile (`.compile()`), a digest of the
compiled program (the same both times), and the target: second compile <= 5% of the
first.

    python benchmarks/compile_cache.py [--layers 6] [--keep DIR]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]

STEP = """
    import hashlib, sys, time
    import jax, jax.numpy as jnp, numpy as np
    import flax.linen as nn, optax

    jax.config.update("jax_compilation_cache_dir", sys.argv[1])
    LAYERS, VOCAB, WIDTH, HEADS, MLP, LEN, BATCH = int(sys.argv[2]), 30000, 512, 8, 2048, 256, 4

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, mask):
            h = nn.LayerNorm()(x)
            x = x + nn.MultiHeadDotProductAttention(HEADS, qkv_features=WIDTH)(h, h, mask=mask)
            h = nn.LayerNorm()(x)
            return x + nn.Dense(WIDTH)(nn.relu(nn.Dense(MLP)(h)))

    class TransformerLM(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            embed = nn.Embed(VOCAB, WIDTH)
            pos = self.param("pos", nn.initializers.normal(0.02), (LEN, WIDTH))
            x = embed(tokens) + pos[:tokens.shape[1]]
            mask = nn.make_causal_mask(tokens)
            for _ in range(LAYERS):
                x = Block()(x, mask)
            return embed.attend(nn.LayerNorm()(x))

    model, tx = TransformerLM(), optax.adamw(1e-3)
    dev = jax.devices("trn")[0]
    tokens = jax.device_put(np.random.default_rng(0).integers(0, VOCAB, (BATCH, LEN)), dev)
    params = jax.jit(model.init, device=dev)(jax.random.key(0), tokens)
    opt = jax.jit(tx.init, device=dev)(params)

    def step(params, opt, tokens):
        def loss_fn(p):
            logits = model.apply(p, tokens[:, :-1])
            labels = optax.smooth_labels(jax.nn.one_hot(tokens[:, 1:], VOCAB), 0.1)
            return optax.softmax_cross_entropy(logits, labels).mean()
        loss, g = jax.value_and_grad(loss_fn)(params)
        upd, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, upd), opt, loss

    start = time.perf_counter()
    lowered = jax.jit(step).lower(params, opt, tokens)
    lower_s = time.perf_counter() - start
    start = time.perf_counter()
    compiled = lowered.compile()
    compile_s = time.perf_counter() - start
    print(lower_s, compile_s, hashlib.sha256(compiled.as_text().encode()).hexdigest()[:16])
"""


def run(cache_dir: str, layers: int) -> tuple[float, float, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(STEP), cache_dir, str(layers)],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    if out.returncode:
        sys.exit(out.stderr[-3000:])
    lower_s, compile_s, program = out.stdout.split()[-3:]
    return float(lower_s), float(compile_s), program


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--keep", help="cache directory to use (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache_dir = args.keep or tmp
        cold = run(cache_dir, args.layers)
        warm = run(cache_dir, args.layers)
    print(f"lm1b-size training step ({args.layers} layers), wall seconds of JAX's tracing "
          f"(.lower()) and of the trn compile (.compile())")
    print(f"{'run':<22}{'lower s':>9}{'compile s':>11}  program")
    for name, (low, comp, prog) in (("first (cache empty)", cold), ("second (cache hit)", warm)):
        print(f"{name:<22}{low:>9.2f}{comp:>11.2f}  {prog}")
    ratio = warm[1] / cold[1]
    print(f"second compile / first: {ratio:.1%} (target <= 5%: "
          f"{'met' if ratio <= 0.05 else 'NOT met'}); same program: {warm[2] == cold[2]}")


if __name__ == "__main__":
    main()
