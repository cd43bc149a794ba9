"""Simulated time of cumulative ops, pooling, the max-pool gradient, sort and top_k on
one trn2 NeuronCore (jax_trn/lower/window.py, selectscatter.py, sort.py, topk.py).

    python benchmarks/window_sort.py

Float32 inputs unless named; the figures are deterministic (same program, same cycles).
top_k runs with max8 / find_index8 / match_replace8 (topk.py); the "(sort)" rows are the
same programs with top_k legalized into a sort + slice (hlo_passes.mlir_passes.KEEP_TOP_K
off), the path every top_k took before.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import jax_trn
from hlo_passes import mlir_passes


def _pool(x, window, strides, padding):
    return lax.reduce_window(x, -jnp.inf, lax.max, window, strides, padding)


CASES = [
    ("cumsum (4096,)", jnp.cumsum, (4096,)),
    ("cumsum (128,4096) axis=1", lambda x: jnp.cumsum(x, axis=1), (128, 4096)),
    ("cumsum (1024,512) axis=0", lambda x: jnp.cumsum(x, axis=0), (1024, 512)),
    ("maxpool 2x2/2 NHWC (8,32,32,64)",
     lambda x: _pool(x, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"), (8, 32, 32, 64)),
    ("maxpool 2x2/2 NCHW (8,64,32,32)",
     lambda x: _pool(x, (1, 1, 2, 2), (1, 1, 2, 2), "VALID"), (8, 64, 32, 32)),
    ("maxpool 3x3/2 SAME (4,32,32,64)",
     lambda x: _pool(x, (1, 3, 3, 1), (1, 2, 2, 1), "SAME"), (4, 32, 32, 64)),
    ("grad maxpool 2x2/2 (8,32,32,64)",
     jax.grad(lambda x: _pool(x, (1, 2, 2, 1), (1, 2, 2, 1), "VALID").sum()), (8, 32, 32, 64)),
    ("grad maxpool 3x3/2 SAME (4,32,32,64)",
     jax.grad(lambda x: _pool(x, (1, 3, 3, 1), (1, 2, 2, 1), "SAME").sum()), (4, 32, 32, 64)),
    ("top_k k=5 (32,1000)", lambda x: lax.top_k(x, 5), (32, 1000)),
    ("top_k k=5 (32,1000) (sort)", lambda x: lax.top_k(x, 5), (32, 1000)),
    ("top_k k=2 (2048,64)", lambda x: lax.top_k(x, 2), (2048, 64)),
    ("top_k k=2 (2048,64) (sort)", lambda x: lax.top_k(x, 2), (2048, 64)),
    ("top_k k=8 (128,4096)", lambda x: lax.top_k(x, 8), (128, 4096)),
    ("top_k k=8 (128,4096) (sort)", lambda x: lax.top_k(x, 8), (128, 4096)),
    ("top_k k=8 (128,4096) bf16", lambda x: lax.top_k(x, 8), (128, 4096), jnp.bfloat16),
    ("top_k k=64 (32,1000)", lambda x: lax.top_k(x, 64), (32, 1000)),
    ("top_k k=64 (32,1000) (sort)", lambda x: lax.top_k(x, 64), (32, 1000)),
    ("sort (128,1024) axis=1", lambda x: jnp.sort(x, axis=1), (128, 1024)),
    ("sort (1024,128) axis=0", lambda x: jnp.sort(x, axis=0), (1024, 128)),
    ("argsort (8192,)", jnp.argsort, (8192,)),
]


def main() -> None:
    trn = jax.devices("trn")[0]
    rng = np.random.default_rng(0)
    for name, f, shape, *dtype in CASES:
        x = rng.standard_normal(shape).astype(np.float32)
        x = jax.device_put(x.astype(dtype[0]) if dtype else x, trn)
        mlir_passes.KEEP_TOP_K = not name.endswith("(sort)")
        with jax_trn.profile() as prof:
            jax.block_until_ready(jax.jit(f)(x))
        mlir_passes.KEEP_TOP_K = True
        print(f"{name:40s} {prof.executions[-1].simulated_time_s * 1e6:9.1f} us")


if __name__ == "__main__":
    main()
