"""What the compiler hands the hardware: kernels of instructions over named DRAM tensors,
and the control flow between them.

A `Kernel` is the ISA program of one fused region for one NeuronCore: its instructions in
program order (each engine / DMA queue runs the subsequence on its own queue, in order,
waiting on semaphores), and the DRAM tensors it touches by name. A `Program` is the
per-device executable: parameters, outputs, HBM temporaries, constants (initial HBM
data, loaded once per executable), and its `steps`, run in order. A step is

    Kernel                         run the kernel (after the previous step completes)
    While(cond, pred, body, ...)   loop: run `cond`, read the bool `pred` from HBM,
                                   stop if false, else run `body` and repeat
    Case(index, branches, ...)     read the int32 `index` from HBM, run branch `index`
                                   (out of range: the last branch, as stablehlo.case)

    Collective(kind, ...)          a collective across the program's devices (SPMD):
                                   every device waits for its group, the topology's
                                   algorithm moves and combines the data
    HostCallback(key, ...)         the program stops, its operands are copied to the
                                   host, a Python function runs there, its results
                                   are copied back (jax.debug.print, pure_callback, ...)

`cond`, `body` and each branch are step lists themselves, so loops and conditionals
nest. Control flow runs on the core's control path between kernels: the predicate /
index is a device value, read from (simulated) HBM after the kernel that wrote it
completed. Loop-carried values live in DRAM tensors (`While.carried`): the body leaves
the next values there. `Program.kernels` lists every kernel once, in program order
(cond, then body, then each branch), for code that inspects the static program.
"""
from __future__ import annotations

from collections.abc import Iterator
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

    def __getstate__(self):
        """Pickled without the simulator's cached facts (`kernel_facts`)."""
        state = dict(self.__dict__)
        state.pop("_sim_facts", None)
        return state


@dataclass
class While:
    """A loop between kernels (stablehlo.while). Each trip: `cond` steps write the
    predicate into `pred` (a bool[] DRAM tensor); the control path reads it; if true,
    `body` steps run and leave the next loop-carried values in `carried`, which hold
    the loop's results when it stops."""
    name: str                                  # "while.4"
    cond: list[Step]
    pred: DramTensor
    body: list[Step]
    carried: list[DramTensor]                  # the loop-carried values, in order
    ops: list[str] = field(default_factory=list)    # the source op: "while at f.py:3"


@dataclass
class Case:
    """A conditional between kernels (stablehlo.case, lax.cond / lax.switch): the
    control path reads `index` (an int32[] DRAM tensor) and runs that branch's steps;
    an index out of [0, n) runs the last branch. Every branch writes `results`."""
    name: str                                  # "case.7"
    index: DramTensor
    branches: list[list[Step]]
    results: list[DramTensor]
    ops: list[str] = field(default_factory=list)


@dataclass
class Collective:
    """A collective between kernels (all_reduce, all_gather, reduce_scatter, all_to_all,
    collective_permute) over replica `groups` of partition ids, from `operands` into
    `results` (one result per operand). The runtime runs it once for all devices
    (`jax_trn.runtime.spmd`) on the system's topology (`jax_trn.collectives`)."""
    name: str                                  # "all_reduce.5"
    kind: str
    operands: list[DramTensor]
    results: list[DramTensor]
    groups: tuple[tuple[int, ...], ...] = ()   # partition ids; () = all devices
    op: str = "add"                            # combiner (all_reduce, reduce_scatter)
    dim: int = 0                               # all_gather / scatter dimension
    split_dim: int = 0                         # all_to_all
    concat_dim: int = 0
    pairs: tuple[tuple[int, int], ...] = ()    # collective_permute (source, target)
    ops: list[str] = field(default_factory=list)


@dataclass
class HostCallback:
    """A call of a Python function in the user's process (jax.debug.print /
    debug.callback, pure_callback, io_callback, checkify): the device stops, copies
    `operands` to host memory over the host link, the host runs the function
    registered under `key` (`jax_trn.runtime.callbacks`) and copies its results into
    `results`. `device` is the partition that calls it on behalf of all (a callback on
    whole arrays under automatic sharding: the other devices wait for its results),
    or None: each device calls it with its own values (one device, shard_map)."""
    name: str                                  # "host_callback.3"
    key: int                                   # the callable's key in the registry
    operands: list[DramTensor]
    results: list[DramTensor]
    device: int | None = None                  # partition id; None = every device
    ops: list[str] = field(default_factory=list)


Step = Kernel | While | Case | Collective | HostCallback


def walk_steps(steps: list[Step]) -> Iterator[Step]:
    """Every step of `steps` once, pre-order, nested steps included."""
    for step in steps:
        yield step
        if isinstance(step, While):
            yield from walk_steps(step.cond)
            yield from walk_steps(step.body)
        elif isinstance(step, Case):
            for branch in step.branches:
                yield from walk_steps(branch)


def walk_kernels(steps: list[Step]) -> Iterator[Kernel]:
    """Every kernel of `steps` once, in program order, nested steps included."""
    return (s for s in walk_steps(steps) if isinstance(s, Kernel))


def has_control_flow(steps: list[Step]) -> bool:
    return any(isinstance(s, (While, Case)) for s in steps)


def has_collectives(steps: list[Step]) -> bool:
    return any(isinstance(s, Collective) for s in walk_steps(steps))


def host_callbacks(steps: list[Step]) -> list[HostCallback]:
    """Every host callback step of `steps`, nested ones included."""
    return [s for s in walk_steps(steps) if isinstance(s, HostCallback)]


@dataclass
class Program:
    params: list[DramTensor]                   # bound to the input buffers, in order
    outputs: list[DramTensor]                  # become the result buffers, in order
    temps: list[DramTensor]                    # HBM scratch, allocated per execution
    steps: list[Step]                          # kernels and control flow, in order
    text: str = ""                             # the optimized program, for as_text()
    constants: dict[str, np.ndarray] = field(default_factory=dict)  # initial HBM data
    slot_bytes: list[int] | None = None        # HBM slots temps share (lower/buffers.py)
    temp_slot: dict[str, int] = field(default_factory=dict)   # temp name -> its slot

    @property
    def temp_bytes(self) -> int:
        """HBM a call allocates for temporaries: their shared slots (each temp its own
        when no buffer assignment was made)."""
        if self.slot_bytes is None:
            return sum(t.nbytes for t in self.temps)
        return sum(self.slot_bytes)

    @property
    def kernels(self) -> list[Kernel]:
        """Every kernel once, in program order (a loop body's kernels once, each branch's
        kernels once): the static program, not what an execution runs."""
        return list(walk_kernels(self.steps))

    @property
    def control_flow(self) -> bool:
        """True if the steps include a loop or a conditional."""
        return has_control_flow(self.steps)

    @property
    def flops(self) -> int:
        """Static FLOPs: each kernel counted once (one trip of every loop body, every
        branch of every conditional). What a call executed is the execution record's
        `flops` (`profiler.Execution.flops`), which counts every kernel instance."""
        return sum(k.flops for k in self.kernels)
