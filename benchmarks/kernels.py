"""Hand-written kernels (jax_trn.kernels): simulated time and TensorE utilization of the
example kernels, called from JAX on Trn1 / Trn2 / Trn3, against issue 16's targets.

    python benchmarks/kernels.py [--rows matmul_basic matmul_fast flash softmax rmsnorm error]

Each row jits a small JAX program calling one kernel and times it with
`jax_trn.estimate` (timing only, deterministic). Utilization is the FLOPs as JAX counts
the operation the kernel computes, over the simulated time at the core's BF16 peak:

    matmul    2 M N K (4096^3 bf16)
    flash     4 S^2 D H: the FLOPs of `jax.nn.dot_product_attention(..., is_causal=True)`'s
              two dot_generals, the measure of benchmarks/models.py's `dpa` row (the
              compiler's fused attention); the column "causal" counts only the unmasked
              half, 4 D H S (S + 1) / 2
    error     a PSUM tile wider than a bank per matmul: met when the KernelError names
              the kernel's own line

Targets (Trn2): user-written bf16 matmul 4096^3 >= 90% of TensorE peak; flash-attention
forward S2048 D128 causal >= 60%; the constraint error names the kernel's line.
"""
from __future__ import annotations

import argparse
import inspect
import os
import sys
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from text_table import measures_table  # noqa: E402

SYSTEMS = ("trn1.32xlarge", "trn2.3xlarge", "trn3-ultraserver")
ROWS = ("matmul_basic", "matmul_fast", "flash", "softmax", "rmsnorm", "error")
TARGETS = {"matmul_basic": "none (the first version)", "matmul_fast": ">= 90% (Trn2)",
           "flash": ">= 60% (Trn2)", "softmax": "none", "rmsnorm": "none",
           "error": "names the kernel's line"}
N = 4096                      # matmul M = N = K
S, H, D = 2048, 8, 128        # flash attention


@dataclass
class Measure:
    text: str
    met: bool | None


def _estimate(jax, f, shapes, system):
    import jax_trn
    args = [jax.ShapeDtypeStruct(s, d) for s, d in shapes]
    return jax_trn.estimate(f, *args, system=system)


def _util(ex, flops: float) -> float:
    return flops / ex.simulated_time_s / ex.peak_flops_per_s


def row(name: str, jax, system: str) -> Measure:
    import jax.numpy as jnp
    from jax_trn.kernels.examples import flash_attention, matmul, rmsnorm, softmax
    trn2 = system.startswith("trn2")
    bf16 = jnp.bfloat16
    if name in ("matmul_basic", "matmul_fast"):
        kernel = getattr(matmul, name)
        ex = _estimate(jax, lambda a, b: kernel(a, b), [((N, N), bf16)] * 2, system)
        u = _util(ex, 2.0 * N ** 3)
        return Measure(f"{u:.1%}, {ex.simulated_time_s * 1e6:.0f} us",
                       (u >= 0.90) if trn2 and name == "matmul_fast" else None)
    if name == "flash":
        ex = _estimate(jax, lambda q, k, v: flash_attention.flash_fwd(q, k, v),
                       [((S, H, D), bf16)] * 3, system)
        u = _util(ex, 4.0 * S * S * D * H)
        causal = _util(ex, 4.0 * D * H * S * (S + 1) / 2)
        return Measure(f"{u:.1%} (causal {causal:.1%}), {ex.simulated_time_s * 1e6:.0f} us",
                       (u >= 0.60) if trn2 else None)
    if name in ("softmax", "rmsnorm"):
        if name == "softmax":
            ex = _estimate(jax, lambda x: softmax.softmax_kernel(x),
                           [((4096, 4096), jnp.float32)], system)
        else:
            ex = _estimate(jax, lambda x, w: rmsnorm.rmsnorm_kernel(x, w),
                           [((4096, 4096), jnp.float32), ((4096,), jnp.float32)], system)
        mbu = ex.summary().to_dict()["mbu_estimated_percent"]
        return Measure(f"{ex.simulated_time_s * 1e6:.1f} us, MBU {mbu:.0f}%", None)
    if name == "error":
        return _error(jax, system)
    raise ValueError(name)


def _error(jax, system: str) -> Measure:
    """A matmul into a PSUM tile 1024 FP32 columns wide: the error must name this
    kernel's line of the matmul (§2.2: moving free size <= 512 before NeuronCore-v4)."""
    import jax.numpy as jnp
    from jax_trn import kernels
    import jax_trn.kernels.isa as nisa
    import jax_trn.kernels.language as nl

    @kernels.jit
    def too_wide(lhsT, rhs):
        out = nl.ndarray((128, 1024), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 1024), nl.float32, buffer=nl.psum)
        acc += nisa.nc_matmul(nl.load(lhsT), nl.load(rhs))      # the matmul
        nl.store(out, nl.copy(acc))
        return out

    lines, first = inspect.getsourcelines(too_wide.fn)
    line = first + next(i for i, text in enumerate(lines) if "# the matmul" in text)
    want = f"kernel too_wide at kernels.py:{line}"
    try:
        _estimate(jax, lambda a, b: too_wide(a, b),
                  [((128, 128), jnp.bfloat16), ((128, 1024), jnp.bfloat16)], system)
    except kernels.KernelError as e:
        msg = str(e)
        return Measure(msg[:60] + ("..." if len(msg) > 60 else ""), want in msg)
    return Measure("ran (NeuronCore-v4 takes 1024 columns)", None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS))
    args = parser.parse_args()
    import jax
    measures_table("hand-written kernels called from JAX: simulated (jax_trn.estimate), "
                   "deterministic", "kernel", args.rows, args.systems,
                   lambda name, system: row(name, jax, system), TARGETS, failed_met=lambda system: False if system.startswith("trn2") else None, width=70)

if __name__ == "__main__":
    main()
