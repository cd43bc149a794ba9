"""The NeuronCore hardware model: ISA, memories, numerics, costs, timing (ARCHITECTURE.md §4).

Public names are re-exported here; the modules are, bottom up (each imports only those
above it; `python tests/test_layering.py` prints the graph):
  spec       generations as data (`CoreSpec`, `ChipSpec`, `CHIPS`), every hardware number
  dtypes     element types; mx: microscaling formats
  operands   `Tile`, `DramAP`, `IsaError`
  memory     SBUF/PSUM byte arrays, DRAM access patterns
  numerics   casts, rounding (RNE / stochastic), TF32
  alu        ALU ops and activation functions
  semantics  what each instruction does (semantics_mx: the MX instructions)
  costs      cycles per instruction, DMA shape, generation checks
  isa_base   `Instr`: each instruction class names its semantics and cost
  isa_*      the instruction families; isa: the public face (`isa.NcMatmul`, ...)
  bandwidth  shared-bandwidth reservation (core DMA engines, chip HBM)
  sync       semaphore insertion
  core       `NeuronCore.run`: the discrete-event engine/queue simulation
  trace      `TraceEvent`, `KernelRun`

The public names load their module on first use (PEP 562), so importing one module of
the model (e.g. `jax_trn.hw.spec` for a system's chip) does not load all of it.
"""
from __future__ import annotations

import importlib

# public name -> the module that defines it
_EXPORTS = {
    "Bandwidth": "bandwidth", "Hbm": "bandwidth",
    "DeadlockError": "core", "NeuronCore": "core", "chip_cores": "core",
    "IsaError": "isa", "Tile": "isa", "DramAP": "isa",
    "Numerics": "numerics",
    "DramTensor": "program", "Kernel": "program", "Program": "program",
    "CHIPS": "spec", "ChipSpec": "spec", "CoreSpec": "spec", "LinkSpec": "spec",
    "insert_semaphores": "sync",
    "KernelRun": "trace", "TraceEvent": "trace",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
