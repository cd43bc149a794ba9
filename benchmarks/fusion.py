"""Fusion on and off: simulated time, kernels, HBM bytes and the DMA roofline.

    python benchmarks/fusion.py [--system trn2.3xlarge] [--mib 64]

Programs (one NeuronCore, timing only: simulated time never depends on the data):

- the memory-bound chain `tanh(x * 2 + 1) * y`, x and y float32 (and bfloat16) of
  `--mib` MiB each; its roofline is the time to read x and y and write the result once
  at the core's DMA ceiling (trainium-hardware.md §9: 368 GB/s on Trn2);
- the demo layer `gelu(x @ w + b)`, bf16 [512, 1024] x [1024, 256] + [256].

"unfused" compiles with the fusion pass disabled (as JAX_TRN_DISABLE_PASSES=fusion
does). The compile column is the wall-clock time of our compiler (hlo_passes +
lowering) for the program, best of three.
"""
from __future__ import annotations

import argparse
import io
import os
import time


def stablehlo(f, args) -> bytes:
    """MLIR bytecode of `jax.jit(f)` for the trn platform (as PJRT receives it)."""
    import jax
    module = jax.jit(f).trace(*args).lower(lowering_platforms=("trn",)).compiler_ir("stablehlo")
    buf = io.BytesIO()
    module.operation.write_bytecode(file=buf)
    return buf.getvalue()


def compile_program(code: bytes, system, fuse: bool):
    """(program, best wall-clock seconds of three compiles)."""
    import hlo_passes
    from jax_trn.lower import lower_module
    best, program = float("inf"), None
    for _ in range(3):
        start = time.perf_counter()
        program = lower_module(hlo_passes.compile_to_ir(code, fuse=fuse), system.chip.core)
        best = min(best, time.perf_counter() - start)
    return program, best


def measure(name: str, f, args, system, ideal_bytes: int | None) -> list[dict]:
    from jax_trn.runtime.executable import simulate
    code = stablehlo(f, args)
    rows = []
    for fuse in (False, True):
        program, seconds = compile_program(code, system, fuse)
        ex = simulate(name, program, system)
        t = ex.simulated_time_s
        row = dict(program=name, mode="fused" if fuse else "unfused", time_us=t * 1e6,
                   kernels=len(program.kernels), hbm_mb=ex.hbm_bytes / 1e6,
                   dma_gbs=ex.hbm_bytes / t / 1e9, compile_ms=seconds * 1e3)
        if ideal_bytes:
            ceiling = system.chip.core.dma_bytes_per_ns * 1e9
            row["roofline"] = ideal_bytes / ceiling / t
        rows.append(row)
    rows[1]["speedup"] = rows[0]["time_us"] / rows[1]["time_us"]
    return rows


def print_table(rows: list[dict]) -> None:
    head = (f"{'program':<34} {'mode':<8} {'simulated':>11} {'kernels':>7} {'HBM MB':>9} "
            f"{'DMA GB/s':>9} {'roofline':>8} {'speedup':>7} {'compile':>9}")
    print(head)
    print("-" * len(head))
    for r in rows:
        roof = f"{r['roofline']:.1%}" if "roofline" in r else "-"
        speed = f"{r['speedup']:.2f}x" if "speedup" in r else ""
        print(f"{r['program']:<34} {r['mode']:<8} {r['time_us']:9.1f}us {r['kernels']:>7} "
              f"{r['hbm_mb']:9.1f} {r['dma_gbs']:9.1f} {roof:>8} {speed:>7} "
              f"{r['compile_ms']:7.1f}ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", default="trn2.3xlarge")
    parser.add_argument("--mib", type=int, default=64)
    opts = parser.parse_args()
    import jax
    import jax.numpy as jnp
    from jax_trn.config import get_system

    system = get_system(opts.system)
    print(f"fusion on one {system.chip.core.name} of {system.name}: DMA ceiling "
          f"{system.chip.core.dma_bytes_per_ns:.0f} GB/s per core\n")
    rows = []
    for dtype in (jnp.float32, jnp.bfloat16):
        size = jnp.dtype(dtype).itemsize
        n = opts.mib * 2 ** 20 // size
        shape = (n // 4096, 4096)
        arg = jax.ShapeDtypeStruct(shape, dtype)
        name = f"tanh(x*2+1)*y {jnp.dtype(dtype).name} 2x{opts.mib} MiB"
        rows += measure(name, lambda x, y: jnp.tanh(x * 2 + 1) * y, (arg, arg), system,
                        3 * n * size)
    bf16 = jnp.bfloat16
    layer = [jax.ShapeDtypeStruct(s, bf16) for s in ((512, 1024), (1024, 256), (256,))]
    rows += measure("gelu(x@w+b) bf16 512x1024x256",
                    lambda x, w, b: jax.nn.gelu(x @ w + b), layer, system, None)
    print_table(rows)


if __name__ == "__main__":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    main()
