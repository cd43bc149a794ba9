"""Simulated time of an embedding lookup (gather) and its gradient (scatter-add) on one core.

    python benchmarks/embedding.py [--vocab 32768] [--dim 1024] [--ids 4 1024]
                                   [--dtype bfloat16] [--system trn2.3xlarge]

Default: a 32k x 1024 bf16 table and 4 x 1024 token ids. Prints, per case, the
simulated time of the whole program and of the gather / scatter kernel, its
instruction count, and the kernel's effective HBM rate (rows moved / kernel time).
Simulated figures are deterministic; wall-clock times are the host's.
"""
from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--ids", type=int, nargs=2, default=[4, 1024])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--system", default=None)
    opts = parser.parse_args()
    if opts.system:
        os.environ["JAX_TRN_SYSTEM"] = opts.system
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_trn

    dev = jax.devices("trn")[0]
    dtype = jnp.dtype(opts.dtype)
    rng = np.random.default_rng(0)
    table = jax.device_put(jnp.asarray(rng.standard_normal((opts.vocab, opts.dim),
                                                           np.float32), dtype), dev)
    ids = jax.device_put(rng.integers(0, opts.vocab, opts.ids).astype(np.int32), dev)
    row_bytes = opts.dim * dtype.itemsize
    n_ids = opts.ids[0] * opts.ids[1]
    cases = [("lookup", jax.jit(lambda t, i: t[i]), "gather"),
             ("grad", jax.jit(jax.grad(lambda t, i: t[i].astype(jnp.float32).sum())),
              "scatter")]
    print(f"{jax_trn.get_system().name}: table {opts.vocab}x{opts.dim} {opts.dtype}, "
          f"{n_ids} ids")
    for name, f, kind in cases:
        f(table, ids).block_until_ready()                 # compile
        with jax_trn.profile() as prof:
            t0 = time.perf_counter()
            f(table, ids).block_until_ready()
            wall = time.perf_counter() - t0
        ex = prof.executions[-1]
        k = next(k for k in ex.kernels if k.name.startswith(kind))
        ns = k.end_ns - k.start_ns
        print(f"  {name:6s} program {ex.simulated_time_s * 1e6:8.1f} us | {k.name} "
              f"{ns / 1e3:8.1f} us, {len(k.kernel.instructions)} instructions, "
              f"{n_ids * row_bytes / ns:6.1f} GB/s of rows | wall {wall:.2f} s")


if __name__ == "__main__":
    main()
