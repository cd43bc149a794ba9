"""Simulated time of a matmul on one NeuronCore against the TensorE FLOP roofline.

    python benchmarks/matmul_roofline.py [--sizes 1024 2048] [--system trn2.3xlarge]
                                         [--dtype bfloat16|float8_e5m2|...]

The roofline is the published per-core dense peak for the dtype (trainium-hardware.md
§1.2: BF16 92 / 79 / 79 TFLOPS on Trn1 / Trn2 / Trn3; FP8 158 on Trn2/Trn3 with
double_row). The result is bf16. Simulated figures are deterministic.
"""
from __future__ import annotations

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024])
    parser.add_argument("--system", default=None)
    parser.add_argument("--dtype", default="bfloat16")
    opts = parser.parse_args()
    if opts.system:
        os.environ["JAX_TRN_SYSTEM"] = opts.system
    import jax
    import jax.numpy as jnp
    import jax_trn

    system = jax_trn.get_system()
    peak = system.chip.peak_tflops_per_core(opts.dtype) * 1e12
    dev = jax.devices("trn")[0]
    f = jax.jit(lambda a, b: jax.lax.dot(a, b, preferred_element_type=jnp.bfloat16))
    print(f"{opts.dtype} matmul on one {system.chip_name} {system.chip.core.name} "
          f"({system.name}), roofline {peak / 1e12:.0f} TFLOP/s")
    print(f"{'M=K=N':>6} {'simulated':>12} {'roofline':>12} {'of peak':>8} {'TFLOP/s':>8} "
          f"{'TensorE busy':>12}")
    for n in opts.sizes:
        a = jax.device_put(jnp.ones((n, n), opts.dtype), dev)
        with jax_trn.profile() as prof:
            f(a, a).block_until_ready()
        ex = prof.executions[-1]
        t, roof = ex.simulated_time_s, 2 * n ** 3 / peak
        print(f"{n:>6} {t * 1e6:10.1f}us {roof * 1e6:10.1f}us {roof / t:8.1%} "
              f"{2 * n ** 3 / t / 1e12:8.1f} {ex.engine_utilization['tensor']:12.1%}")


if __name__ == "__main__":
    main()
