"""What the compiler hands the hardware: kernels of instructions over named DRAM tensors.

A `Kernel` is the ISA program of one fused region for one NeuronCore: its instructions in
program order (each engine / DMA queue runs the subsequence on its own queue, in order,
waiting on semaphores), and the DRAM tensors it touches by name. A `Program` is the
per-device executable: parameters, outputs, HBM temporaries, constants (initial HBM
data, loaded once per executable), and the kernels to run in order.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import dtypes as _dt
from .isa import Instr


@dataclass(frozen=True)
class DramTensor:
    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.size * _dt.itemsize(self.dtype)


@dataclass
class Kernel:
    name: str                                  # e.g. "fusion.3" or "dot_general.1"
    instructions: list[Instr]
    dram: dict[str, DramTensor]                # every DRAM tensor an instruction names
    sbuf_bytes: int = 0                        # peak SBUF bytes per partition allocated
    psum_bytes: int = 0                        # peak PSUM bytes per partition allocated
    ops: list[str] = field(default_factory=list)    # source ops: "dot_general at f.py:3"
    flops: int = 0                             # useful (model) FLOPs of the source ops
    notes: list[str] = field(default_factory=list)  # compiler notes: fusion decisions, ...


@dataclass
class Program:
    params: list[DramTensor]                   # bound to the input buffers, in order
    outputs: list[DramTensor]                  # become the result buffers, in order
    temps: list[DramTensor]                    # HBM scratch, allocated per execution
    kernels: list[Kernel]
    text: str = ""                             # the optimized program, for as_text()
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # initial HBM data

    @property
    def flops(self) -> int:
        return sum(k.flops for k in self.kernels)
