"""Tracing a kernel: running the user's Python function once, with every `nisa` call
emitting one instruction into a `KernelBuilder` (jax_trn/lower/builder.py).

The kernel's Python runs as ordinary Python: loops (`nl.affine_range`, ...) unroll,
shapes and loop indices are ints, so every instruction's operands are known when it
is built. What the tracer adds:

- **the kernel's own source line** for every instruction (`Kernel.lines`, shown by the
  profiler) and in every error: the innermost frame outside this package;
- **allocation scopes**: a tile allocated inside a loop body belongs to one iteration.
  Each allocation site (line, and the n-th allocation at that line in the iteration)
  gets a ring of `bufs` buffers (default `DEFAULT_BUFS`, double buffering), handed out
  in turn, so iteration i+1's loads can overlap iteration i's compute; the rings are
  freed when the loop ends. A tile allocated outside loops lives until the kernel ends;
- **checks with the line**: operand rules when an instruction is built (`IsaError`),
  the generation's rules (`instr.check` for the target core), SBUF/PSUM capacity at
  allocation, each reported as a `KernelError` naming the kernel and its line;
- **HBM tensors**: inputs, outputs (`nl.ndarray(..., buffer=nl.shared_hbm)` returned
  by the kernel) and scratch (allocated in HBM, not returned) are `DramTensor`s made
  by the caller's `hbm` factory (a JAX lowering's temporaries, or a standalone
  program's); `finish` renames returned tensors to the caller's output tensors.

Engines and DMA queues run their instructions in program order and the sync pass
(`hw.sync.insert_semaphores`) adds every semaphore wait a data hazard needs, so a
kernel never synchronizes by hand.
"""
from __future__ import annotations

import contextvars
import dataclasses
import itertools
import math
import os
import sys
from collections import Counter
from typing import Callable

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor
from jax_trn.lower.builder import KernelBuilder
from jax_trn.lower.errors import LoweringError
from jax_trn.lower.target import Target

from .errors import KernelError
from .tensors import HbmView, TileView, normalize_dtype

DEFAULT_BUFS = 2      # buffers per allocation site in a loop (double buffering)
_HERE = os.path.dirname(os.path.abspath(__file__))
_current: contextvars.ContextVar["Tracer | None"] = contextvars.ContextVar(
    "jax_trn_kernel_tracer", default=None)


def current() -> "Tracer":
    tracer = _current.get()
    if tracer is None:
        raise KernelError("kernel-language calls (nl.*, nisa.*) work only inside a kernel "
                          "being traced: decorate the function with jax_trn.kernels.jit "
                          "and call it")
    return tracer


def user_line() -> str:
    """"file.py:12" of the innermost frame outside this package's modules (the
    kernel's line; kernels in examples/ are user code)."""
    f = sys._getframe(1)
    while f is not None and os.path.dirname(os.path.abspath(f.f_code.co_filename)) == _HERE:
        f = f.f_back
    if f is None:
        return "?"
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


@dataclasses.dataclass
class _Psum:
    """What a PSUM allocation holds: `zero` (nl.zeros, not yet written: the memset is
    emitted only if something reads it before a matmul overwrites it) and the byte
    ranges matmuls wrote (accumulation groups a later matmul may add to, §2.2)."""
    view: "TileView"
    zero: bool = False
    matmul: list = dataclasses.field(default_factory=list)     # [(lo, hi)]


@dataclasses.dataclass
class _Loop:
    kind: str                                   # "affine" | "sequential" | "static"
    rings: dict = dataclasses.field(default_factory=dict)   # site -> [tiles, uses]
    seen: Counter = dataclasses.field(default_factory=Counter)  # site -> this iteration


class Tracer:
    """The state of one kernel being traced (see the module docstring)."""

    def __init__(self, name: str, kb: KernelBuilder, hbm: Callable[[tuple, str], DramTensor],
                 inputs: list[DramTensor]):
        self.name, self.kb, self.target = name, kb, kb.target
        self._hbm = hbm
        self.inputs = {t.name for t in inputs}
        self._known = {t.name: t for t in inputs}  # every DRAM tensor the kernel may name
        self.loops: list[_Loop] = []
        self.lines: list[str] = []               # per instruction of kb.instrs
        self.hbm_made: list[DramTensor] = []
        self._ids = itertools.count()
        self.psum: dict[int, _Psum] = {}         # PSUM allocation id -> its state

    # --- errors ---------------------------------------------------------------------

    def error(self, msg: str, line: str | None = None) -> KernelError:
        return KernelError(f"kernel {self.name} at {line or user_line()}: {msg}")

    # --- instructions ---------------------------------------------------------------

    def emit(self, cls: type, **fields) -> isa.Instr:
        """One instruction of class `cls`, checked for the target core."""
        line = user_line()
        for v in fields.values():
            if isinstance(v, isa.DramAP):
                self._note_dram(v.tensor)
        try:
            instr = self.kb.emit(cls, **fields)
        except (isa.IsaError, TypeError) as e:
            raise self.error(f"{_opname(cls)}: {e}", line) from None
        try:
            instr.check(self.target.core)
        except isa.IsaError as e:
            self.kb.instrs.pop()
            raise self.error(f"{_opname(cls)} on {self.target.name}: {e}", line) from None
        for w in instr.outputs():
            if isinstance(w, isa.DramAP) and w.tensor in self.inputs:
                self.kb.instrs.pop()
                raise self.error(f"{_opname(cls)} writes kernel input {w.tensor!r}: inputs "
                                 "are read-only; write an nl.shared_hbm output", line)
        self.lines.append(line)
        return instr

    def _note_dram(self, name: str) -> None:
        """The kernel names DRAM tensor `name`: it goes in `Kernel.dram`, which buffer
        assignment reads for lifetimes (an input missing there could share its HBM
        slot with the kernel's own output, jax_trn/lower/buffers.py)."""
        if name not in self.kb.dram:
            self.kb.dram[name] = self._known[name]

    def queue(self, queue: int | None) -> int:
        if queue is None:
            return self.kb.next_queue()
        if not 0 <= queue < self.target.dma_queues:
            raise self.error(f"DMA queue {queue} outside 0..{self.target.dma_queues - 1}")
        return queue

    # --- memory ---------------------------------------------------------------------

    def hbm(self, shape, dtype) -> HbmView:
        t = self._hbm(tuple(int(d) for d in shape), normalize_dtype(dtype))
        self.hbm_made.append(t)
        self._known[t.name] = t
        return HbmView.whole(t)

    def alloc(self, shape, dtype, mem: str, label: str = "", bufs: int | None = None
              ) -> TileView:
        """An on-chip tensor [P, *free] in SBUF or PSUM (a ring entry inside a loop)."""
        line = user_line()
        shape = tuple(int(d) for d in shape)
        dtype = normalize_dtype(dtype)
        if len(shape) < 2:
            shape = shape + (1,) * (2 - len(shape))
        if not 1 <= shape[0] <= self.target.partitions:
            raise self.error(f"an on-chip tensor's first (partition) axis is 1..."
                             f"{self.target.partitions}, got shape {shape} (§3.1)", line)
        if min(shape) < 1:
            raise self.error(f"empty on-chip tensor {shape}", line)
        per_part = math.prod(shape[1:]) * hw_dtypes.itemsize(dtype)
        if mem == "psum" and per_part > self.target.psum_bytes:
            raise self.error(f"PSUM tensor {list(shape)} {dtype} needs {per_part} bytes per "
                             f"partition; PSUM has {self.target.psum_bytes} (§3.2)", line)
        loop = self.loops[-1] if self.loops else None
        if loop is None:
            return self._made(self._tile(shape, dtype, mem, line), shape, label)
        site = (line, loop.seen[line], shape, dtype, mem)
        loop.seen[line] += 1
        ring = loop.rings.get(site)
        if ring is None:
            depth = DEFAULT_BUFS if bufs is None else int(bufs)
            if depth < 1:
                raise self.error(f"bufs={bufs}: at least one buffer", line)
            ring = loop.rings[site] = [[self._tile(shape, dtype, mem, line)
                                        for _ in range(depth)], 0]
        tile = ring[0][ring[1] % len(ring[0])]
        ring[1] += 1
        return self._made(tile, shape, label)

    def _made(self, t: isa.Tile, shape, label: str) -> TileView:
        view = self._view(t, shape, label, next(self._ids))
        if view.mem == "psum":
            self.psum[view.base] = _Psum(view)
        return view

    def _tile(self, shape, dtype, mem, line) -> isa.Tile:
        try:
            return self.kb.tile(shape[1:], dtype, mem, parts=shape[0])
        except LoweringError as e:
            used = (self.kb.sbuf if mem == "sbuf" else self.kb.psum).live
            raise self.error(f"{mem.upper()} is full: {list(shape)} {dtype} does not fit "
                             f"next to {len(used)} live tensors ({e})", line) from None

    @staticmethod
    def _view(t: isa.Tile, shape, label: str, base: int) -> TileView:
        free = shape[1:]
        strides, acc = [], 1
        for d in reversed(free):
            strides.append(acc)
            acc *= d
        return TileView(t.mem, t.start_partition, t.num_partitions, t.offset, tuple(free),
                        tuple(reversed(strides)), t.dtype, label, base)

    # --- PSUM accumulation state (NKI's `nl.zeros(..., psum)` + `+=` idiom) ------------

    def zeroed(self, view: TileView) -> None:
        """`view` (a whole PSUM allocation) reads as zeros until written."""
        self.psum[view.base].zero = True

    def read(self, view: TileView) -> None:
        """An instruction reads `view`: a PSUM allocation still pending zero gets its
        memset now (unless matmuls wrote every byte read)."""
        st = self.psum.get(view.base) if view.mem == "psum" else None
        if st is None or not st.zero:
            return
        lo, hi = view.byte_span
        if not _covered(st.matmul, lo, hi):
            st.zero = False
            self.emit(isa.Memset, dst=st.view.tile(), value=0.0, engine="vector")

    def wrote(self, view: TileView, by_matmul: bool) -> None:
        st = self.psum.get(view.base) if view.mem == "psum" else None
        if st is None:
            return
        lo, hi = view.byte_span
        if by_matmul:
            st.matmul.append((lo, hi))
        else:
            st.matmul = [(a, b) for a, b in st.matmul if b <= lo or a >= hi]
            if st.zero and lo <= st.view.offset and hi >= st.view.byte_span[1]:
                st.zero = False

    def accumulates(self, view: TileView) -> bool:
        """Whether a matmul into `view` adds to it (its bytes hold a matmul's sums) or
        starts a new accumulation group (fresh, or pending zero)."""
        st = self.psum.get(view.base)
        if st is None:
            raise self.error(f"matmul dst {view!r} is not in PSUM (§2.2)")
        lo, hi = view.byte_span
        if _covered(st.matmul, lo, hi):
            return True
        if st.zero and not any(a < hi and b > lo for a, b in st.matmul):
            return False
        if self.target.psum_accumulate_any:
            return True
        raise self.error(f"`+=` of a matmul into {view!r}, whose bytes no matmul wrote and "
                         "which is not nl.zeros: before NeuronCore-v4 a matmul adds only "
                         "onto a matmul's sums (§2.2); start from nl.zeros(..., "
                         "buffer=nl.psum)")

    # --- loops ----------------------------------------------------------------------

    def loop(self, kind: str, n: range):
        """Iterates `n`, one allocation scope per iteration (the module docstring)."""
        scope = _Loop(kind)
        self.loops.append(scope)
        try:
            for i in n:
                scope.seen.clear()
                yield i
        finally:
            if self.loops and self.loops[-1] is scope:
                self.loops.pop()
            for tiles, _ in scope.rings.values():
                for t in tiles:
                    self.kb.release(t)

    # --- the result -----------------------------------------------------------------

    def finish(self, renames: dict[str, DramTensor]) -> None:
        """Renames HBM tensors (a returned tensor -> the caller's output) in every
        instruction, and records the instructions' source lines on the builder."""
        if renames:
            self.kb.instrs[:] = [_renamed(i, renames) for i in self.kb.instrs]
            for old, new in renames.items():
                if self.kb.dram.pop(old, None) is not None:
                    self.kb.dram[new.name] = new
        self.kb.lines = list(self.lines)


def _covered(ranges, lo: int, hi: int) -> bool:
    """Whether the union of `ranges` covers [lo, hi)."""
    at = lo
    for a, b in sorted(ranges):
        if a > at:
            break
        at = max(at, b)
    return at >= hi


def _opname(cls: type) -> str:
    from jax_trn.lower.builder import opcode
    return opcode(cls)


def _renamed(instr: isa.Instr, renames: dict[str, DramTensor]) -> isa.Instr:
    changes = {}
    for f in dataclasses.fields(instr):
        v = getattr(instr, f.name)
        if isinstance(v, isa.DramAP) and v.tensor in renames:
            changes[f.name] = dataclasses.replace(v, tensor=renames[v.tensor].name)
    return dataclasses.replace(instr, **changes) if changes else instr


def run(fn, name: str, kb: KernelBuilder, hbm: Callable[[tuple, str], DramTensor],
        inputs: list[DramTensor], args: tuple, kwargs: dict) -> tuple[Tracer, list[HbmView]]:
    """Traces `fn(*args, **kwargs)` into `kb`: `args` hold `None` where an input tensor
    goes (in the order of `inputs`). Returns the tracer and the returned HBM views."""
    tracer = Tracer(name, kb, hbm, inputs)
    views = iter([HbmView.whole(t) for t in inputs])
    call_args = tuple(next(views) if a is None else a for a in args)
    token = _current.set(tracer)
    try:
        result = fn(*call_args, **kwargs)
    finally:
        _current.reset(token)
    tracer.single = not isinstance(result, (tuple, list))
    outs = list(result) if not tracer.single else [result]
    for k, o in enumerate(outs):
        if not isinstance(o, HbmView) or not o.contiguous or o.offset \
                or o.shape != o.tensor.shape:
            raise KernelError(f"kernel {name} returns {o!r} as result {k}: a kernel returns "
                              "whole HBM tensors it allocated (nl.ndarray(..., "
                              "buffer=nl.shared_hbm))")
        if o.tensor.name in tracer.inputs:
            raise KernelError(f"kernel {name} returns its input {o.tensor.name!r}: return "
                              "a tensor the kernel allocated")
    return tracer, outs
