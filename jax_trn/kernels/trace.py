"""Tracing a kernel: running the user's Python function, with every `nisa` call
emitting one instruction into a `KernelBuilder` (jax_trn/lower/builder.py); a second
time when `tile[...] = value` copies can be dropped (`run`).

The kernel's Python runs as ordinary Python: loops (`nl.affine_range`, ...) unroll,
shapes and loop indices are ints, so every instruction's operands are known when it
is built. What the tracer adds:

- **the kernel's own source line** for every instruction (`Kernel.lines`, shown by the
  profiler) and in every error: the innermost frame outside this package;
- **lifetimes**: outside loops an on-chip tensor's buffer lives as long as the
  kernel's Python code holds a view of it. Inside loops each allocation site (line,
  shape, type, memory) has a pool of buffers that rotate like a ring of `bufs`
  (default 2): iteration i+1 never takes iteration i's buffer, so its loads overlap
  i's compute (double buffering), and a buffer whose tensor is still referenced (a
  tile kept in a list across iterations) is skipped, the pool growing instead. A
  pool is released when the loop where its site was first used ends; the sync pass
  orders each reuse after the instructions that read the buffer before;
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

import collections
import contextlib
import contextvars
import dataclasses
import itertools
import math
import os
import sys
import weakref
from typing import Callable

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor
from jax_trn.lower.builder import KernelBuilder
from jax_trn.lower.errors import LoweringError

from . import errors
from .errors import KernelError
from . import tensors as tensors_module
from .tensors import HbmView, TileView, normalize_dtype

DEFAULT_BUFS = 2      # buffers an allocation site keeps in rotation (double buffering)
_HERE = os.path.dirname(os.path.abspath(__file__))
_current: contextvars.ContextVar["Tracer | None"] = contextvars.ContextVar(
    "jax_trn_kernel_tracer", default=None)


def _where():
    tracer = _current.get()
    return (tracer.name, user_line()) if tracer is not None else None


errors._where = _where


def _mask():
    tracer = _current.get()
    return tracer.mask if tracer is not None else None


tensors_module._current_mask = _mask


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
    """What a PSUM allocation holds: `zero` (nl.zeros: the memset is emitted only if
    something reads it before matmuls overwrite it), the byte ranges matmuls wrote
    (accumulation groups a later matmul may add to, §2.2) and those other instructions
    wrote."""
    tile: isa.Tile
    zero: bool = False
    zero_emitted: bool = False
    matmul: list = dataclasses.field(default_factory=list)     # [(lo, hi)]
    other: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Pool:
    """The buffers of one allocation site inside loops: [tile, weakref to the token of
    its current tensor] each, and the order they were last handed out."""
    entries: list = dataclasses.field(default_factory=list)
    order: list = dataclasses.field(default_factory=list)


class _Alloc:
    """One on-chip allocation; every view of it holds this token, and the buffer is
    released when the last view is gone (weakref.finalize)."""
    __slots__ = ("tile", "psum", "seq", "__weakref__")

    def __init__(self, tile: isa.Tile, psum: _Psum | None, seq: int = -1):
        self.tile, self.psum, self.seq = tile, psum, seq


class Tracer:
    """The state of one kernel being traced (see the module docstring)."""

    def __init__(self, name: str, kb: KernelBuilder, hbm: Callable[[tuple, str], DramTensor],
                 inputs: list[DramTensor]):
        self.name, self.kb, self.target = name, kb, kb.target
        self._hbm = hbm
        self._constant = None                    # (array, dtype) -> DramTensor
        self.inputs = {t.name for t in inputs}
        self._known = {t.name: t for t in inputs}  # every DRAM tensor the kernel may name
        self.loops: list[str] = []               # the kinds of the loops being unrolled
        self.grid: tuple[int, ...] = (1,)        # launch grid (`kernel[gx, gy](...)`)
        self.pid: tuple[int, ...] = (0,)         # this instance's position in it
        self.mask = None                         # the `mask=` of the call being made
        self._hbm_sites: dict = {}               # grid launch: (line, n) -> the tensor
        self._hbm_seen: collections.Counter = collections.Counter()
        self._pools: dict = {}                   # allocation site in a loop -> _Pool
        self._seq = itertools.count()            # allocations, in order (both passes)
        self.last_read: dict[int, int] = {}      # allocation -> last instruction reading it
        self.assigned: list[tuple[int, int]] = []   # (allocation, instructions then)
        self.elide: set[int] = set()             # allocations whose `[...] =` copy goes
        self._loop_pools: list[list] = []        # per loop being unrolled: its sites
        self.lines: list[str] = []               # per instruction of kb.instrs

    # --- errors ---------------------------------------------------------------------

    def error(self, msg: str, line: str | None = None) -> KernelError:
        return KernelError(f"kernel {self.name} at {line or user_line()}: {msg}")

    # --- instructions ---------------------------------------------------------------

    def emit(self, cls: type, line: str | None = None, **fields) -> isa.Instr:
        """One instruction of class `cls`, checked for the target core; `line`: the
        kernel's line it comes from (default: the caller's)."""
        line = line or user_line()
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
        """An HBM tensor; in a grid launch every instance gets the same tensor from the
        same line (the n-th allocation there), as NKI's shared_hbm outputs are shared."""
        site = None
        if self.grid != (1,):
            line = user_line()
            site = (line, self._hbm_seen[line])
            self._hbm_seen[line] += 1
            if site in self._hbm_sites:
                return HbmView.whole(self._hbm_sites[site])
        t = self._hbm(tuple(int(d) for d in shape), normalize_dtype(dtype))
        self._known[t.name] = t
        if site is not None:
            self._hbm_sites[site] = t
        return HbmView.whole(t)

    @contextlib.contextmanager
    def masked(self, mask):
        """Operands made meanwhile are cut to `mask` (tensors.IndexMask)."""
        outer, self.mask = self.mask, (mask if self.mask is None else self.mask & mask)
        try:
            yield
        finally:
            self.mask = outer

    def constant(self, value, dtype) -> HbmView:
        """An HBM tensor holding `value` (NKI's `nl.shared_constant`): a constant of the
        program, there from the start of every call."""
        import numpy as np
        dtype = normalize_dtype(dtype or np.asarray(value).dtype)
        array = np.asarray(value).astype(hw_dtypes.np_dtype(dtype))
        if self._constant is None:
            raise self.error("nl.shared_constant needs a program to hold the constant")
        t = self._constant(array, dtype)
        self._known[t.name] = t
        return HbmView.whole(t)

    def retarget(self, value: TileView, dst: TileView) -> bool:
        """`dst[...] = value` where the instruction just emitted wrote all of `value`
        (a fresh result, e.g. `t[...] = nl.exp(x)`): when the first trace pass saw
        nothing read `value` afterwards (`elide`), that instruction writes `dst`
        instead and no copy is emitted. Returns whether it did."""
        token = value.base
        if token is None:
            return False
        self.assigned.append((token.seq, len(self.kb.instrs)))
        if token.seq not in self.elide or not self.kb.instrs:
            return False
        last = self.kb.instrs[-1]
        whole = token.tile
        if getattr(last, "dst", None) != value.tile() or value.tile() != whole.with_(
                free=value.free, strides=None) or dst.num_partitions != value.num_partitions \
                or dst.free_size != value.free_size:
            return False
        try:
            new = dataclasses.replace(last, dst=dst.tile())
            new.check(self.target.core)
        except (isa.IsaError, TypeError, KernelError):
            return False
        self.kb.instrs[-1] = new
        self.wrote(dst, type(last).matmul_output)
        return True

    def elidable(self) -> set[int]:
        """After a pass: the assigned values nothing read after their assignment (the
        copy at index `at` is the assignment's own read)."""
        return {seq for seq, at in self.assigned if self.last_read.get(seq, -1) <= at}

    def program_id(self, axis: int) -> int:
        if not 0 <= axis < len(self.grid):
            raise self.error(f"program_id({axis}) of a launch grid {self.grid}")
        return self.pid[axis]

    def num_programs(self, axis: int) -> int:
        if not 0 <= axis < len(self.grid):
            raise self.error(f"num_programs({axis}) of a launch grid {self.grid}")
        return self.grid[axis]

    def alloc(self, shape, dtype, mem: str, label: str = "", bufs: int | None = None
              ) -> TileView:
        """An on-chip tensor [P, *free] in SBUF or PSUM, alive while the kernel's Python
        code holds a view of it (and, for double buffering, until `bufs - 1` later
        allocations at the same line)."""
        line = user_line()
        pdim = next((k for k, d in enumerate(shape) if getattr(d, "par_dim", False)), 0)
        shape = tuple(int(d) for d in shape)
        if pdim:                       # NKI's block axes before par_dim: stored after it
            shape = (shape[pdim],) + shape[:pdim] + shape[pdim + 1:]
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
                             f"partition; {self.target.name}'s PSUM has "
                             f"{self.target.psum_bytes} (§3.2)", line)
        depth = DEFAULT_BUFS if bufs is None else int(bufs)
        if depth < 1:
            raise self.error(f"bufs={bufs}: at least one buffer", line)
        if not self.loops:                           # lives while referenced
            tile = self._tile(shape, dtype, mem, line)
            token = _Alloc(tile, _Psum(tile) if mem == "psum" else None, next(self._seq))
            weakref.finalize(token, self.kb.release, tile)
        else:
            tile, token = self._from_pool((line, shape, dtype, mem), depth, line)
        view = self._view(tile, shape, label, token)
        return dataclasses.replace(view, pdim=pdim) if pdim else view

    def _from_pool(self, site, depth: int, line: str):
        """Inside a loop: the site's buffers rotate like a ring of `depth` (iteration
        i+1 never takes iteration i's), and one still referenced (a tile kept in a list)
        is skipped: the pool grows instead. The pool is released when the outermost
        loop of its first use ends (buffers still referenced, when they are dropped)."""
        pool = self._pools.get(site)
        if pool is None:
            pool = self._pools[site] = _Pool()
            self._loop_pools[-1].append(site)
        recent = pool.order[-(depth - 1):] if depth > 1 else []
        entry = next((e for e in pool.entries if e[1]() is None and e not in recent), None)
        if entry is None:
            shape, dtype, mem = site[1:]
            entry = [self._tile(shape, dtype, mem, line), lambda: None]
            pool.entries.append(entry)
        tile = entry[0]
        token = _Alloc(tile, _Psum(tile) if tile.mem == "psum" else None, next(self._seq))
        entry[1] = weakref.ref(token)
        pool.order = [e for e in pool.order if e is not entry] + [entry]
        return tile, token

    def place(self, shape, dtype, where, label: str = "") -> TileView:
        """A tensor at an explicit place (`compiler.sbuf.mod_alloc` / `psum.mod_alloc`):
        reserved there; block axes (before `par_dim`) `where.block_bytes` apart when set
        (PSUM bank tiles)."""
        line = user_line()
        pdim = next((k for k, d in enumerate(shape) if getattr(d, "par_dim", False)), 0)
        shape = tuple(int(d) for d in shape)
        dtype = normalize_dtype(dtype)
        parts, blocks, inner = shape[pdim], shape[:pdim], shape[pdim + 1:] or (1,)
        item = hw_dtypes.itemsize(dtype)
        inner_bytes = math.prod(inner) * item
        step = where.block_bytes or inner_bytes
        if step < inner_bytes:
            raise self.error(f"a block of {list(inner)} {dtype} ({inner_bytes} bytes) does not "
                             f"fit the {step} bytes between placed blocks", line)
        nbytes = step * (math.prod(blocks) - 1) + inner_bytes if blocks else inner_bytes
        alloc = self.kb.sbuf if where.mem == "sbuf" else self.kb.psum
        try:
            alloc.reserve(where.offset, nbytes, self.name)
        except LoweringError as e:
            raise self.error(str(e).split(": ", 1)[-1], line) from None
        tile = isa.Tile(where.mem, where.partition, parts, where.offset,
                        (max(1, nbytes // item),), dtype)
        token = _Alloc(tile, _Psum(tile) if where.mem == "psum" else None, next(self._seq))
        weakref.finalize(token, alloc.unreserve, where.offset, nbytes)
        free = tuple(blocks) + tuple(inner)
        strides, acc = [], 1
        for d in reversed(inner):
            strides.append(acc)
            acc *= d
        block_strides, acc = [], step // item
        for d in reversed(blocks):
            block_strides.append(acc)
            acc *= d
        strides = tuple(reversed(block_strides)) + tuple(reversed(strides))
        try:
            view = TileView(where.mem, where.partition, parts, where.offset, free, strides,
                            dtype, label, token, pdim)
            view.tile()
        except (KernelError, isa.IsaError) as e:
            raise self.error(f"placed tensor {list(shape)}: {e}", line) from None
        return view

    def _tile(self, shape, dtype, mem, line) -> isa.Tile:
        try:
            # from the top: the bottom is where kernels place tensors by hand (mod_alloc)
            return self.kb.tile(shape[1:], dtype, mem, parts=shape[0], top_down=True)
        except LoweringError as e:
            used = (self.kb.sbuf if mem == "sbuf" else self.kb.psum).live
            raise self.error(f"{mem.upper()} of {self.target.name} is full: {list(shape)} "
                             f"{dtype} does not fit next to the {len(used)} tensors still "
                             f"referenced ({e})", line) from None

    @staticmethod
    def _view(t: isa.Tile, shape, label: str, token) -> TileView:
        free = shape[1:]
        strides, acc = [], 1
        for d in reversed(free):
            strides.append(acc)
            acc *= d
        return TileView(t.mem, t.start_partition, t.num_partitions, t.offset, tuple(free),
                        tuple(reversed(strides)), t.dtype, label, token)

    # --- loops ----------------------------------------------------------------------

    def loop(self, kind: str, n: range):
        """Iterates `n` (unrolled: each iteration's instructions are emitted in turn);
        at the end, the pools of the sites first used in it are released."""
        self.loops.append(kind)
        self._loop_pools.append([])
        try:
            yield from n
        finally:
            if self.loops:
                self.loops.pop()
            for site in self._loop_pools.pop() if self._loop_pools else ():
                for tile, ref in self._pools.pop(site).entries:
                    token = ref()
                    if token is None:
                        self.kb.release(tile)
                    else:                    # still referenced: freed when dropped
                        weakref.finalize(token, self.kb.release, tile)

    # --- PSUM accumulation state (NKI's `nl.zeros(..., psum)` + `+=` idiom) ------------

    def zeroed(self, view: TileView) -> None:
        """`view` (a whole PSUM allocation) reads as zeros until written."""
        view.base.psum.zero = True

    def read(self, view: TileView) -> None:
        """An instruction reads `view`: a PSUM allocation still pending zero gets its
        memset now (unless matmuls wrote every byte read)."""
        if view.base is not None:
            self.last_read[view.base.seq] = len(self.kb.instrs)
        st = view.base.psum if view.mem == "psum" and view.base is not None else None
        if st is None or not st.zero or st.zero_emitted:
            return
        lo, hi = view.byte_span
        if not _covered(st.matmul, lo, hi):
            st.zero_emitted = True
            self.emit(isa.Memset, dst=st.tile, value=0.0, engine="vector")

    def wrote(self, view: TileView, by_matmul: bool) -> None:
        st = view.base.psum if view.mem == "psum" and view.base is not None else None
        if st is None:
            return
        lo, hi = view.byte_span
        if by_matmul:
            st.matmul.append((lo, hi))
            st.other = [(a, b) for a, b in st.other if b <= lo or a >= hi]
        else:
            st.other.append((lo, hi))
            st.matmul = [(a, b) for a, b in st.matmul if b <= lo or a >= hi]

    def accumulates(self, view: TileView) -> bool:
        """Whether a matmul into `view` adds to it (its bytes hold a matmul's sums) or
        starts a new accumulation group (a fresh tile, or nl.zeros)."""
        st = view.base.psum if view.mem == "psum" and view.base is not None else None
        if st is None:
            raise self.error(f"a matmul writes PSUM; its dst {view!r} is not there (§2.2)")
        lo, hi = view.byte_span
        if _covered(st.matmul, lo, hi):
            return True
        touched = [(a, b) for a, b in st.matmul + st.other if a < hi and b > lo]
        if not touched:
            return False
        if not any(a < hi and b > lo for a, b in st.other):
            raise self.error(f"a matmul into {view!r} would add onto sums that cover only "
                             "part of it: accumulate into the same region each k-step")
        if self.target.psum_accumulate_any:
            return True
        raise self.error(f"a matmul adding into {view!r}, which holds data another "
                         f"instruction wrote: on {self.target.name} a matmul adds only onto "
                         "a matmul's sums (§2.2); start from nl.zeros(..., buffer=nl.psum) "
                         "or pass accumulate=False")

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
        inputs: list[DramTensor], args: tuple, kwargs: dict, grid: tuple[int, ...] = (1,),
        constant=None) -> tuple[Tracer, list[HbmView]]:
    """Traces `fn(*args, **kwargs)` into `kb`: `args` hold `None` where an input tensor
    goes (in the order of `inputs`); with a launch `grid`, once per instance, in turn
    (`nl.program_id`). Returns the tracer and the returned HBM views."""
    elide: set[int] = set()
    made: dict = {}                  # constants by content: the same tensor in both passes
    while True:
        # If the trace had `tile[...] = value` copies that can go (nothing reads the
        # value after), it is traced once more without them into the reset builder
        # (tracing is deterministic: allocations come in the same order).
        tracer = Tracer(name, kb, hbm, inputs)
        tracer.grid = tuple(grid)
        tracer._constant = None if constant is None else (
            lambda a, d: made.setdefault((a.tobytes(), a.shape, d), constant(a, d)))
        tracer.elide = elide
        views = iter([HbmView.whole(t) for t in inputs])
        call_args = tuple(next(views) if a is None else a for a in args)
        token = _current.set(tracer)
        try:
            for pid in itertools.product(*(range(g) for g in tracer.grid)):
                tracer.pid = pid
                tracer._hbm_seen.clear()
                result = fn(*call_args, **kwargs)
        finally:
            _current.reset(token)
        more = tracer.elidable() - elide
        if elide or not more:
            break
        elide = more
        kb.reset()
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
