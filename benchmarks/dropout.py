"""Dropout as users write it: simulated time and the kernels that take it (issue 15, points
1 and 5: random bits where they are used; attention with dropout on the probabilities).

    python benchmarks/dropout.py [--rows bernoulli linen mha0 mha] [--system trn2.3xlarge]
                                 [--kernels N]

    bernoulli  jax.random.bernoulli + jnp.where(keep, x / keep_prob, 0) + x, [4, 1024, 1024]
               bf16, forward
    linen      flax linen: 2 x (Dense 1024 -> Dropout(0.1) -> residual -> LayerNorm),
               [4, 512, 1024] bf16, jax.grad of a loss (a training step's gradient)
    mha0       flax linen MultiHeadDotProductAttention, B1 S1024 H8 D64 bf16, jax.grad,
               no dropout (the reference for the next row)
    mha        the same with dropout_rate=0.1, deterministic=False: dropout on the
               attention probabilities (flax broadcasts one [S, S] draw over B and H)
    mha_fwd    the same, forward only (no jax.grad)

Each program is timed with `jax_trn.estimate` (compiled as the backend compiles it,
timing only); per row: simulated time, kernel count, and the N kernels taking the most
time. The hash is real work (threefry-2x32: ~190 integer ops per draw on GpSimd), so a
dropout costs what its draws cost; what the compiler can save is the bits' round trip
through HBM and the kernels around them.
"""
from __future__ import annotations

import argparse

ROWS = ("bernoulli", "linen", "mha0", "mha", "mha_fwd")


def bernoulli(jax):
    jnp = jax.numpy

    def f(key, x):
        keep = jax.random.bernoulli(key, 0.9, x.shape)
        return jnp.where(keep, x / 0.9, 0) + x
    return f, (jax.random.key(0), jax.ShapeDtypeStruct((4, 1024, 1024), jnp.bfloat16))


def linen(jax):
    import flax.linen as nn
    jnp = jax.numpy

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, train):
            for _ in range(2):
                h = nn.Dense(1024, dtype=jnp.bfloat16)(x)
                h = nn.Dropout(0.1, deterministic=not train)(h)
                x = nn.LayerNorm(dtype=jnp.bfloat16)(x + h)
            return x

    m, x = Block(), jax.ShapeDtypeStruct((4, 512, 1024), jnp.bfloat16)
    params = jax.eval_shape(lambda: m.init(jax.random.key(0), jnp.zeros(x.shape, x.dtype),
                                           False))

    def step(params, x, key):
        def loss(p):
            return m.apply(p, x, True, rngs={"dropout": key}).astype(jnp.float32).mean()
        return jax.grad(loss)(params)
    return step, (params, x, jax.random.key(0))


def mha(jax, rate: float, grad: bool = True):
    import flax.linen as nn
    jnp = jax.numpy
    layer = nn.MultiHeadDotProductAttention(num_heads=8, qkv_features=512, dtype=jnp.bfloat16,
                                            dropout_rate=rate)
    x = jax.ShapeDtypeStruct((1, 1024, 512), jnp.bfloat16)
    zeros = jnp.zeros(x.shape, x.dtype)
    params = jax.eval_shape(lambda: layer.init(jax.random.key(0), zeros, zeros,
                                               deterministic=True))

    def fwd(params, x, key):
        return layer.apply(params, x, x, deterministic=rate == 0, rngs={"dropout": key})

    def step(params, x, key):
        return jax.grad(lambda p: fwd(p, x, key).astype(jnp.float32).sum())(params)
    return step if grad else fwd, (params, x, jax.random.key(0))


def build(name: str, jax):
    return {"bernoulli": lambda: bernoulli(jax), "linen": lambda: linen(jax),
            "mha0": lambda: mha(jax, 0.0), "mha": lambda: mha(jax, 0.1),
            "mha_fwd": lambda: mha(jax, 0.1, grad=False)}[name]()


def report(name: str, ex, top: int) -> None:
    per: dict[str, list] = {}
    for k in ex.kernels:
        entry = per.setdefault(k.name, [0, 0.0])
        entry[0] += 1
        entry[1] += k.duration_ns
    print(f"{name}: {ex.simulated_time_s * 1e6:.1f} us, {len(ex.kernels)} kernels")
    for kname, (n, ns) in sorted(per.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"  {ns / 1e3:10.1f} us  {kname}" + (f" x{n}" if n > 1 else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--system", default="trn2.3xlarge")
    parser.add_argument("--kernels", type=int, default=6)
    args = parser.parse_args()
    import jax
    import jax_trn
    for name in args.rows:
        f, fargs = build(name, jax)
        report(name, jax_trn.estimate(f, *fargs, system=args.system), args.kernels)


if __name__ == "__main__":
    main()
