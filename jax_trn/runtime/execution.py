"""The profiler's record of one call of a program (`profiler.Execution`), and the dtype
its MFU is measured against."""
from __future__ import annotations

from jax_trn import profiler

def make_execution(name: str, prog, system, device_ids: list[int], kernels, collectives=(),
                   dtype: str | None = None) -> profiler.Execution:
    """The profiler's record of one call; `dtype`: `compute_dtype(prog)` if known."""
    dtype = dtype or compute_dtype(prog)
    peak = system.chip.peak_tflops_per_core(dtype) * 1e12
    return profiler.Execution(name, system.name, device_ids, kernels, peak,
                              generation=system.generation, dtype=dtype,
                              collectives=list(collectives), chip=system.chip)


def compute_dtype(prog) -> str:
    """The dtype whose TensorE peak MFU is measured against: the input dtype of the
    matmuls doing most FLOPs ("tf32" for FP32 matmuls rounded to TF32), else the
    first parameter's dtype."""
    flops: dict[str, int] = {}
    for kernel in prog.kernels:
        for instr in kernel.instructions:
            moving = getattr(instr, "moving", None)
            if instr.flops and moving is not None:
                dtype = moving.dtype
                if dtype == "float32" and getattr(instr, "precision", "") == "tf32":
                    dtype = "tf32"
                flops[dtype] = flops.get(dtype, 0) + instr.flops
    if flops:
        return max(flops, key=lambda d: flops[d])
    return prog.params[0].dtype if prog.params else "float32"
