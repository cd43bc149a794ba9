"""The demo: `python -m jax_trn`.

Prints the simulated system and its devices, runs a jitted bf16 layer
(gelu(x @ w + b)) on a NeuronCore, checks it against JAX's CPU backend, and prints the
simulated time, the achieved TFLOP/s against the core's peak, and engine utilization.
"""
from __future__ import annotations

import sys


def main() -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_trn

    system = jax_trn.get_system()
    devices = jax.devices("trn")
    print(f"system: {system.name} - {system.description}")
    print(f"devices ({len(devices)}): {devices[0].device_kind}")
    for d in devices[:8]:
        print(f"  {d}")
    if len(devices) > 8:
        print(f"  ... {len(devices) - 8} more")

    dev = devices[min(3, len(devices) - 1)]
    keys = jax.random.split(jax.random.key(0), 3)
    shapes = [(512, 1024), (1024, 256), (256,)]
    host = [jax.random.normal(k, s, jnp.float32).astype(jnp.bfloat16) for k, s in zip(keys, shapes)]
    x, w, b = (jax.device_put(a, dev) for a in host)
    layer = jax.jit(lambda x, w, b: jax.nn.gelu(x @ w + b))

    with jax_trn.profile() as prof:
        y = layer(x, w, b).block_until_ready()
    ex = prof.executions[-1]

    cpu = jax.devices("cpu")[0]
    ref = layer(*(jax.device_put(a, cpu) for a in host))
    err = float(np.max(np.abs(np.asarray(y, np.float32) - np.asarray(ref, np.float32))))
    scale = float(np.max(np.abs(np.asarray(ref, np.float32))))
    ok = err <= 0.02 * scale + 1e-2
    print(f"\nlayer gelu(x @ w + b), bf16 {shapes} on {dev}")
    print(f"  max |trn - cpu| = {err:.4g} (max |y| = {scale:.3g}): {'OK' if ok else 'MISMATCH'}")
    peak = system.chip.peak_tflops_per_core("bfloat16")
    tflops = ex.flops / ex.simulated_time_s / 1e12 if ex.simulated_time_s else 0.0
    print(f"  simulated time: {ex.simulated_time_s * 1e6:.2f} us  ({len(ex.kernels)} kernels)")
    print(f"  work: {ex.flops / 1e6:.1f} MFLOP, {ex.hbm_bytes / 1e6:.2f} MB to/from HBM")
    print(f"  achieved: {tflops:.2f} TFLOP/s of {peak:.0f} TFLOP/s peak per core "
          f"({tflops / peak:.1%})")
    print("  engine utilization: " + ", ".join(
        f"{e} {u:.0%}" for e, u in ex.engine_utilization.items()))
    print()
    print(ex.summary())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
