"""What the timeline of a kernel needs to know about each instruction, worked out once.

`NeuronCore.run` times every instruction from static facts: its queue and engine, its
duration on a compute engine (cycles / clock, §6.3), for TensorE the stationary it
loads and the LoadStationary and MultiplyMoving times (§2.2), for DMA the per-chunk
efficiency, rate and bytes (§3.4), the tiles it writes, whether it holds the SBUF port
VectorE and GpSimd share (§2.3, §2.6), and whether the generation and the memories
accept it at all (validation). None of that depends on the data or on when the
instruction runs, so `facts(kernel, core)` computes it once per kernel and core
geometry and keeps it on the kernel; a loop body run 64 times is validated and sized
once. The values are the very expressions `core.py` used per instruction, so the
timeline is bit-identical.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import costs
from .isa import DmaCopy, Instr
from .sync import written_tiles

__all__ = ["InstrFacts", "KernelFacts", "facts"]

_ATTR = "_sim_facts"      # Kernel attribute holding {core geometry: KernelFacts}


class InstrFacts:
    """The static timing facts of one instruction of a kernel."""
    __slots__ = ("index", "instr", "queue", "engine", "waits", "opcode", "name", "flops",
                 "overhead_ns", "compute_ns", "port", "written", "stationary", "ls_ns",
                 "mm_ns", "nbytes", "inv_eff", "rate", "hbm_sides")

    def __init__(self, index: int, instr: Instr, core):
        spec, clock = core.spec, core._clock.get(instr.engine)     # None: a DMA queue
        self.index, self.instr = index, instr
        self.queue, self.engine, self.waits = instr.queue, instr.engine, instr.waits
        self.opcode, self.name, self.flops = type(instr).__name__, instr.name, instr.flops
        self.overhead_ns = None if clock is None else spec.static_overhead / clock
        self.port = costs.shares_gpsimd_port(instr, spec)
        self.written = tuple(written_tiles(instr))
        self.compute_ns = self.stationary = self.ls_ns = self.mm_ns = None
        self.nbytes = 0
        self.inv_eff = self.rate = self.hbm_sides = None
        if instr.engine == "tensor":
            self.stationary = costs.stationary(instr)
            if self.stationary is not None:
                self.ls_ns = costs.load_stationary(instr, spec) / core.pipe.clock
            self.mm_ns = instr.cycles(spec) / core.pipe.clock
        elif instr.engine == "dma":
            chunk, engines = costs.dma_shape(instr, spec)
            eff = spec.dma_efficiency(chunk) * instr.efficiency
            self.nbytes = instr.nbytes
            self.inv_eff = 1.0 / eff
            self.rate = engines * spec.dma_engine_bytes_per_ns * eff
            self.hbm_sides = instr.hbm_bytes / max(instr.nbytes, 1)
        else:
            self.compute_ns = instr.cycles(spec) / clock


@dataclass
class KernelFacts:
    instructions: tuple[Instr, ...]                 # the kernel's, to detect edits
    queues: dict[str, list[InstrFacts]]             # per queue, program order
    port_users: bool                                # any instruction holds the port
    hbm_bytes: int                                  # bytes DMA'd to or from DRAM


def facts(kernel, core) -> KernelFacts:
    """The kernel's facts for `core`'s generation and memories (validated on first
    use: `core.validate` raises IsaError for an instruction the core cannot run)."""
    cache = kernel.__dict__.setdefault(_ATTR, {})
    key = (core.spec, core.sbuf.nbytes, core.psum.nbytes)
    got = cache.get(key)
    instructions = tuple(kernel.instructions)
    if got is not None and got.instructions == instructions:
        return got
    core.validate(kernel)
    queues: dict[str, list[InstrFacts]] = {}
    for i, instr in enumerate(instructions):
        queues.setdefault(instr.queue, []).append(InstrFacts(i, instr, core))
    got = KernelFacts(instructions, queues,
                      any(f.port for q in queues.values() for f in q),
                      sum(i.hbm_bytes for i in instructions if isinstance(i, DmaCopy)))
    cache[key] = got
    return got
