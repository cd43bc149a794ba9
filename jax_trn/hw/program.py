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
    Loop(trips, enter, body, exit) a counted loop on chip: `enter` kernels once, then
                                   `body` kernels `trips` times, the trip counter in
                                   the sequencers' registers, then `exit` kernels

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
from .isa_control import back_edge


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
    # A hand-written kernel's source line of each instruction ("norm.py:31"), aligned
    # with `instructions`; empty for compiler-generated kernels.
    lines: list[str] = field(default_factory=list)

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
    notes: list[str] = field(default_factory=list)  # why it is not an on-chip `Loop`


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
class Loop:
    """A loop run on chip (a stablehlo.while with a static trip count): the trip
    counter lives in a register of each engine's sequencer, which runs the body's
    instructions `trips` times with a back edge per trip (`control`, isa_control.py);
    no predicate is computed or read from HBM. `enter` kernels run once before the
    first trip (they load the SBUF-resident carries, `resident`), `exit` kernels once
    after the last (they store those carries back to HBM and write the counter's final
    value). The body's kernels read and write the resident carries in SBUF and the
    other carries in HBM, in place. `notes` say what was kept resident and why not."""
    name: str                                  # "while.4"
    trips: int
    enter: list[Kernel]
    body: list[Kernel]
    exit: list[Kernel]
    carried: list[DramTensor]                  # the loop-carried values, in order
    counter: str = "counter"                   # the register holding the trip counter
    counter_carry: int = 0                     # the carried value the counter is
    start: int = 0                             # its value before the first trip ...
    step: int = 1                              # ... its increment per trip
    resident: list[str] = field(default_factory=list)   # carries kept in SBUF
    ops: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def control(self) -> tuple:
        """The back edge every sequencer runs after each trip (isa_control.py)."""
        return back_edge(self.counter, self.step, self.start + self.trips * self.step)


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


Step = Kernel | While | Case | Loop | Collective | HostCallback


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
        elif isinstance(step, Loop):
            yield from walk_steps(step.enter + step.body + step.exit)


def walk_kernels(steps: list[Step]) -> Iterator[Kernel]:
    """Every kernel of `steps` once, in program order, nested steps included."""
    return (s for s in walk_steps(steps) if isinstance(s, Kernel))


def has_control_flow(steps: list[Step]) -> bool:
    """Whether `steps` decide anything from data (a while's predicate, a case's index);
    a `Loop`'s trip count is static, so it is no control flow in this sense."""
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
        """True if the steps include a data-decided loop or a conditional (a static
        on-chip `Loop` needs no data: timing-only runs time it without numerics)."""
        return has_control_flow(self.steps)

    @property
    def flops(self) -> int:
        """Static FLOPs: each kernel counted once (one trip of every host-driven loop
        body, every branch of every conditional), an on-chip `Loop`'s body once per
        trip (its trip count is static). What a call executed is the execution record's
        `flops` (`profiler.Execution.flops`), which counts every kernel instance."""
        return _static_flops(self.steps)


def _static_flops(steps: list[Step]) -> int:
    total = 0
    for s in steps:
        if isinstance(s, Loop):
            total += _static_flops(s.enter + s.exit) + s.trips * _static_flops(s.body)
        elif isinstance(s, While):
            total += _static_flops(s.cond + s.body)
        elif isinstance(s, Case):
            total += sum(_static_flops(b) for b in s.branches)
        elif isinstance(s, Kernel):
            total += s.flops
    return total
