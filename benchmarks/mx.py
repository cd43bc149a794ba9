"""MXFP8 / MXFP4 / nvfp4 block-scaled matmuls from JAX against BF16 on one NeuronCore
(simulated).

    PYTHONPATH=. python benchmarks/mx.py [--size 4096] [--sdg-size 1024]
                                         [--systems trn3-ultraserver trn2.3xlarge]

Per system (one process each: the system is fixed when the backend starts), one core:

- bf16:            `lax.dot(a, b)`, bf16 [S, S] x [S, S] -> bf16 (matmul_roofline.py's)
- mx matmul:       `jax.nn.scaled_matmul` of MXFP8 data (float8_e4m3fn [1, S, S]) and
                   E8M0 scales [1, S, S/32] already on the device -> bf16
  (on a core without MX, "dequantize" is the part of it spent in its mx-dequantize
  kernels, mx_dequant.py)
- quantize:        the program's own quantization of a bf16 operand (the jnp ops of
                   `jax.nn.scaled_dot_general`: amax per 32, E8M0 scale, cast), once,
                   at --sdg-size (recognized: one mx_quantize kernel, lower/mx_quantize.py)
- scaled_dot_general: the whole `jax.nn.scaled_dot_general(a, b, mxfp8)` of bf16
                   [1, Q, Q] operands (two quantizations + the MX matmul), Q = --sdg-size
- mxfp4 matmul:    `jax.nn.scaled_matmul` of MXFP4 data (float4_e2m1fn [1, S, S], E8M0
                   scales per 32) -> bf16: on Trn3 nc_matmul_mx on float4_e2m1fn_x4
                   words, each operand first packed by an mx-pack-fp4 kernel ("pack":
                   HBM holds FP4 one value per byte here, mx_pack.py); elsewhere
                   dequantize + BF16 matmul
- nvfp4 matmul:    the same with nvfp4's scales (float8_e4m3fn per 16 values), which no
                   MX mode takes (§2.2): dequantize + BF16 matmul on every generation
  ("dequantize" in the FP4 table: the mx-dequantize kernels of both FP4 programs)
- mxfp4 sdg / nvfp4 sdg: `scaled_dot_general` of the bf16 [1, Q, Q] operands with
                   those configs (quantization: one mx_quantize kernel per operand)

Targets (issue 18): mx matmul >= 3.8x bf16 on Trn3; on Trn2 (no MX: dequantize + BF16
matmul) it runs, and costs <= bf16 + the dequantization. Simulated figures are
deterministic (the FP4 programs run after the MXFP8 ones, which they do not change).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def measure(size: int, sdg_size: int) -> dict:
    """Simulated seconds of each program on the current system (this process)."""
    import jax
    import jax.numpy as jnp
    import ml_dtypes
    import numpy as np
    from jax import lax
    from jax._src.cudnn.scaled_matmul_stablehlo import BlockScaleConfig, quantize

    import jax_trn

    dev = jax.devices("trn")[0]
    cfg = jax.nn.get_scaled_dot_general_config("mxfp8")
    nvfp4 = jax.nn.get_scaled_dot_general_config("nvfp4")
    mxfp4 = BlockScaleConfig(mode="mxfp8", block_size=32, data_type=jnp.float4_e2m1fn,
                             scale_type=jnp.float8_e8m0fnu, global_scale=None,
                             infer_only=False)      # JAX 0.10.2 names no MXFP4 config
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal((1, size, size)).astype(ml_dtypes.bfloat16), dev)
    xq = jax.device_put(rng.standard_normal((1, sdg_size, sdg_size)).astype(
        ml_dtypes.bfloat16), dev)
    q = jax.device_put(rng.standard_normal((1, size, size)).astype(ml_dtypes.float8_e4m3fn), dev)
    s = jax.device_put(np.full((1, size, size // 32), 120, np.uint8).view(
        ml_dtypes.float8_e8m0fnu), dev)
    dn = (((2,), (2,)), ((0,), (0,)))
    q4 = jax.device_put(rng.standard_normal((1, size, size)).astype(
        ml_dtypes.float4_e2m1fn), dev)
    s16 = jax.device_put(rng.uniform(0.5, 2, (1, size, size // 16)).astype(
        ml_dtypes.float8_e4m3fn), dev)
    programs = {
        "bf16": (lambda a, b: lax.dot(a, b, preferred_element_type=jnp.bfloat16),
                 (x[0], x[0])),
        "mx matmul": (lambda a, b, sa, sb: jax.nn.scaled_matmul(
            a, b, sa, sb, preferred_element_type=jnp.bfloat16), (q, q, s, s)),
        "quantize": (lambda a: quantize(a, cfg), (xq,)),
        "scaled_dot_general": (lambda a, b: jax.nn.scaled_dot_general(
            a, b, dn, preferred_element_type=jnp.bfloat16, configs=[cfg] * 3), (xq, xq)),
        "mxfp4 matmul": (lambda a, b, sa, sb: jax.nn.scaled_matmul(
            a, b, sa, sb, preferred_element_type=jnp.bfloat16), (q4, q4, s, s)),
        "nvfp4 matmul": (lambda a, b, sa, sb: jax.nn.scaled_matmul(
            a, b, sa, sb, preferred_element_type=jnp.bfloat16), (q4, q4, s16, s16)),
        "mxfp4 sdg": (lambda a, b: jax.nn.scaled_dot_general(
            a, b, dn, preferred_element_type=jnp.bfloat16, configs=[mxfp4] * 3), (xq, xq)),
        "nvfp4 sdg": (lambda a, b: jax.nn.scaled_dot_general(
            a, b, dn, preferred_element_type=jnp.bfloat16, configs=[nvfp4] * 3), (xq, xq)),
    }
    out = {"system": jax_trn.get_system().name}
    for name, (fn, args) in programs.items():
        f = jax.jit(fn)
        with jax_trn.profile() as prof:
            jax.block_until_ready(f(*args))
        ex = prof.executions[-1]
        out[name] = ex.simulated_time_s
        part = lambda what: sum(k.duration_ns for k in ex.kernels if what in k.name) * 1e-9
        if name == "mx matmul":
            out["dequantize"] = part("mx-dequantize")
        if name.endswith("fp4 matmul"):
            out[name + " pack"] = part("mx-pack-fp4")
            out[name + " dequantize"] = part("mx-dequantize")
    return out


def _row(r: dict, size: int) -> str:
    flops = 2 * size ** 3
    bf, mx = r["bf16"], r["mx matmul"]
    return (f"{r['system']:>18} {bf * 1e6:9.1f} {mx * 1e6:10.1f} {bf / mx:6.2f}x "
            f"{flops / mx / 1e12:8.1f} {r['dequantize'] * 1e6:10.1f} "
            f"{r['quantize'] * 1e6:9.1f} {r['scaled_dot_general'] * 1e6:9.1f}")


def _fp4_row(r: dict, size: int) -> str:
    flops = 2 * size ** 3
    bf, mx4, nv = r["bf16"], r["mxfp4 matmul"], r["nvfp4 matmul"]
    deq = r["mxfp4 matmul dequantize"] + r["nvfp4 matmul dequantize"]
    return (f"{r['system']:>18} {bf * 1e6:9.1f} {mx4 * 1e6:10.1f} {bf / mx4:6.2f}x "
            f"{flops / mx4 / 1e12:8.1f} {r['mxfp4 matmul pack'] * 1e6:8.1f} "
            f"{nv * 1e6:10.1f} {bf / nv:6.2f}x {deq * 1e6:10.1f} "
            f"{r['mxfp4 sdg'] * 1e6:9.1f} {r['nvfp4 sdg'] * 1e6:9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--sdg-size", type=int, default=1024)
    parser.add_argument("--systems", nargs="+", default=["trn3-ultraserver", "trn2.3xlarge"])
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(measure(opts.size, opts.sdg_size)))
        return
    print(f"MXFP8 vs BF16, {opts.size}^3 on one core; quantize and scaled_dot_general "
          f"(sdg) at {opts.sdg_size}^3 (simulated; times in us)")
    print(f"{'system':>18} {'bf16':>9} {'mx matmul':>10} {'speedup':>7} {'TFLOP/s':>8} "
          f"{'dequantize':>10} {'quantize':>9} {'sdg':>9}")
    rows = []
    for system in opts.systems:
        env = {**os.environ, "JAX_TRN_SYSTEM": system}
        res = subprocess.run([sys.executable, __file__, "--size", str(opts.size),
                              "--sdg-size", str(opts.sdg_size), "--child"],
                             env=env, capture_output=True, text=True, check=True)
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(_row(rows[-1], opts.size), flush=True)
    print(f"\nFP4 vs BF16, {opts.size}^3 on one core; scaled_dot_general (sdg) at "
          f"{opts.sdg_size}^3 (simulated; times in us)")
    print(f"{'system':>18} {'bf16':>9} {'mxfp4':>10} {'speedup':>7} {'TFLOP/s':>8} "
          f"{'pack':>8} {'nvfp4':>10} {'speedup':>7} {'dequantize':>10} "
          f"{'mxfp4 sdg':>9} {'nvfp4 sdg':>9}")
    for r in rows:
        print(_fp4_row(r, opts.size), flush=True)


if __name__ == "__main__":
    main()
