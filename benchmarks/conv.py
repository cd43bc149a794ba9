"""Simulated time and TensorE utilization of a ResNet-style 3x3 convolution on one core.

    python benchmarks/conv.py [--batch 8] [--size 56] [--channels 64 64] [--layout NCHW]
                              [--stride 1] [--grad] [--system trn2.3xlarge]

Default: N=8, 56x56, 64 -> 64 channels, 3x3 SAME, bf16 (a ResNet-50 conv2_x layer).
The roofline is the published per-core dense BF16 peak (trainium-hardware.md §1.2).
Simulated figures are deterministic; compile and run wall-clock times are the host's.
"""
from __future__ import annotations

import argparse
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--size", type=int, default=56)
    parser.add_argument("--channels", type=int, nargs=2, default=[64, 64])
    parser.add_argument("--layout", choices=["NCHW", "NHWC"], default="NCHW")
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--grad", action="store_true", help="also time d/dx and d/dw")
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
    n, s, (ci, co) = opts.batch, opts.size, opts.channels
    nchw = opts.layout == "NCHW"
    dn = ("NCHW", "OIHW", "NCHW") if nchw else ("NHWC", "HWIO", "NHWC")
    xshape = (n, ci, s, s) if nchw else (n, s, s, ci)
    wshape = (co, ci, 3, 3) if nchw else (3, 3, ci, co)
    x = jax.device_put(jnp.ones(xshape, jnp.bfloat16), dev)
    w = jax.device_put(jnp.ones(wshape, jnp.bfloat16) * 0.01, dev)
    stride = (opts.stride, opts.stride)

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, stride, "SAME", dimension_numbers=dn)

    out_s = -(-s // opts.stride)
    flops = 2 * n * out_s * out_s * co * ci * 9
    cases = [("forward", jax.jit(conv), flops)]
    if opts.grad:
        loss = lambda x, w: jnp.sum(conv(x, w).astype(jnp.float32))
        cases += [("d/dx", jax.jit(jax.grad(loss, 0)), flops),
                  ("d/dw", jax.jit(jax.grad(loss, 1)), flops)]
    print(f"3x3 conv N={n} {s}x{s} {ci}->{co} stride {opts.stride} {opts.layout} bf16 on one "
          f"{system.chip_name} {system.chip.core.name} ({system.name}), roofline "
          f"{peak / 1e12:.0f} TFLOP/s")
    print(f"{'case':>8} {'compile':>8} {'simulated':>11} {'roofline':>10} {'of peak':>8} "
          f"{'TensorE busy':>12}")
    for name, f, fl in cases:
        t0 = time.perf_counter()
        f.lower(x, w).compile()
        compile_s = time.perf_counter() - t0
        with jax_trn.profile() as prof:
            f(x, w).block_until_ready()
        ex = prof.executions[-1]
        t, roof = ex.simulated_time_s, fl / peak
        print(f"{name:>8} {compile_s:7.1f}s {t * 1e6:9.1f}us {roof * 1e6:8.1f}us "
              f"{roof / t:8.1%} {ex.engine_utilization['tensor']:12.1%}")
        for k in ex.kernels:
            busy = ", ".join(f"{e} {v / k.duration_ns:.0%}" for e, v in sorted(k.busy_ns.items())
                             if v)
            print(f"{'':>10}kernel {k.name}: {k.duration_ns / 1e3:.1f}us ({busy})")


if __name__ == "__main__":
    main()
