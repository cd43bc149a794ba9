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
"""
from .bandwidth import Bandwidth as Bandwidth, Hbm as Hbm
from .core import DeadlockError as DeadlockError, NeuronCore as NeuronCore
from .core import chip_cores as chip_cores
from .isa import IsaError as IsaError, Tile as Tile, DramAP as DramAP
from .numerics import Numerics as Numerics
from .program import DramTensor as DramTensor, Kernel as Kernel, Program as Program
from .spec import CHIPS as CHIPS, ChipSpec as ChipSpec, CoreSpec as CoreSpec
from .sync import insert_semaphores as insert_semaphores
from .trace import KernelRun as KernelRun, TraceEvent as TraceEvent
