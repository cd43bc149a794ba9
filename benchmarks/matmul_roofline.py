"""Simulated time of a bf16 matmul on one NeuronCore against the TensorE FLOP roofline.

    python benchmarks/matmul_roofline.py [--sizes 1024 2048] [--system trn2.3xlarge]

The roofline is the published per-core dense BF16 peak (trainium-hardware.md §1.2:
92 / 79 / 79 TFLOPS on Trn1 / Trn2 / Trn3). Simulated figures are deterministic.
"""
from __future__ import annotations

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024])
    parser.add_argument("--system", default=None)
    opts = parser.parse_args()
    if opts.system:
        os.environ["JAX_TRN_SYSTEM"] = opts.system
    import jax
    import jax.numpy as jnp
    import jax_trn

    system = jax_trn.get_system()
    peak = system.chip.peak_tflops_per_core("bfloat16") * 1e12
    dev = jax.devices("trn")[0]
    f = jax.jit(lambda a, b: a @ b)
    print(f"bf16 matmul on one {system.chip_name} {system.chip.core.name} ({system.name}), "
          f"roofline {peak / 1e12:.0f} TFLOP/s")
    print(f"{'M=K=N':>6} {'simulated':>12} {'roofline':>12} {'of peak':>8} {'TFLOP/s':>8} "
          f"{'TensorE busy':>12}")
    for n in opts.sizes:
        a = jax.device_put(jnp.ones((n, n), jnp.bfloat16), dev)
        with jax_trn.profile() as prof:
            f(a, a).block_until_ready()
        ex = prof.executions[-1]
        t, roof = ex.simulated_time_s, 2 * n ** 3 / peak
        print(f"{n:>6} {t * 1e6:10.1f}us {roof * 1e6:10.1f}us {roof / t:8.1%} "
              f"{2 * n ** 3 / t / 1e12:8.1f} {ex.engine_utilization['tensor']:12.1%}")


if __name__ == "__main__":
    main()
