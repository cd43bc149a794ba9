"""The kernel builder: on-chip memory allocation and instruction emission for one kernel.

Rules allocate SBUF/PSUM tiles (`tile`, `ring`), emit instructions in program order
(`emit`, `dma`), and `finish` turns the result into a `Kernel` after the sync pass has
set the semaphore waits. Each engine and DMA queue runs its own subsequence in order, so
a ring of 2-3 buffers lets the DMA of tile i+1 overlap the compute on tile i: reuse of a
buffer is a write-after-read hazard the sync pass orders with semaphores.
"""
from __future__ import annotations

import itertools
import re
import sys
from typing import Iterable

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor, Kernel
from jax_trn.hw.sync import insert_semaphores

from .errors import LoweringError
from .layout import Axes
from .target import Target

SBUF_ALIGN = 64     # a compiler choice: SBUF allocations start on 64-byte boundaries


class Allocator:
    """First-fit allocation of byte ranges within each partition, with free and peak."""

    def __init__(self, mem: str, capacity: int, align: int):
        self.mem, self.capacity, self.align = mem, capacity, align
        self.live: dict[int, int] = {}          # offset -> size
        self.reserved: list[tuple[int, int]] = []   # placed by hand: (offset, size), may
                                                     # overlap each other, not `live`
        self.peak = 0

    def alloc(self, nbytes: int, who: str, top_down: bool = False) -> int:
        """First fit from the bottom (or from the top: hand-written kernels, whose
        authors may place tensors explicitly, `reserve`), around live and placed ranges."""
        nbytes = -(-max(nbytes, 1) // self.align) * self.align
        taken = sorted(list(self.live.items()) + self.reserved)
        if top_down:
            end = self.capacity // self.align * self.align
            for off, size in reversed(taken):
                if end - (off + size) >= nbytes:
                    break
                end = min(end, off)
            at = (end - nbytes) // self.align * self.align
            ok = at >= 0
        else:
            at = 0
            for off, size in taken:
                if off - at >= nbytes:
                    break
                at = max(at, off + size)
            ok = at + nbytes <= self.capacity
        if not ok:
            raise LoweringError(
                f"kernel {who} needs more {self.mem.upper()} than the core has: "
                f"{at + nbytes if not top_down else sum(n for _, n in taken) + nbytes} > "
                f"{self.capacity} bytes per partition")
        self.live[at] = nbytes
        self.peak = max(self.peak, self.capacity if top_down else at + nbytes)
        return at

    def reserve(self, offset: int, nbytes: int, who: str) -> int:
        """Bytes [offset, offset + nbytes) of each partition, placed by the kernel's
        author (jax_trn.kernels' mod_alloc). Placed ranges may overlap each other (the
        author decides what is dead); one overlapping a range `alloc` handed out is an
        error."""
        end = offset + nbytes
        clash = [(o, o + n) for o, n in self.live.items() if o < end and o + n > offset]
        if offset < 0 or end > self.capacity or clash:
            raise LoweringError(
                f"kernel {who}: {self.mem.upper()} bytes [{offset}, {end}) "
                + (f"overlap tensors allocated automatically at {clash}" if clash else
                   f"outside the {self.capacity} bytes per partition"))
        self.reserved.append((offset, nbytes))
        self.peak = max(self.peak, end)
        return offset

    def unreserve(self, offset: int, nbytes: int) -> None:
        self.reserved.remove((offset, nbytes))

    def free(self, offset: int) -> None:
        del self.live[offset]


class Ring:
    """Buffers handed out in rotation (multi-buffering)."""

    def __init__(self, tiles: list[isa.Tile]):
        self.tiles = tiles
        self._next = itertools.count()

    def next(self) -> isa.Tile:
        return self.tiles[next(self._next) % len(self.tiles)]


def sub(tile: isa.Tile, parts: int | None = None, free: int | tuple[int, ...] | None = None,
        at: int = 0) -> isa.Tile:
    """A [parts, free] tile inside `tile`, starting `at` elements into each partition."""
    assert tile.strides is None, "sub() of a strided tile"
    free = tile.free if free is None else free
    free = (free,) if isinstance(free, int) else tuple(free)
    parts = tile.num_partitions if parts is None else parts
    return tile.with_(num_partitions=parts, free=free,
                      offset=tile.offset + at * hw_dtypes.itemsize(tile.dtype))


def opcode(cls: type) -> str:
    """`NcMatmul` -> "nc_matmul"."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


class KernelBuilder:
    """Builds one `Kernel`: allocation, instructions in program order, DMA queues."""

    def __init__(self, name: str, target: Target):
        self.name, self.target = name, target
        self.instrs: list[isa.Instr] = []
        self.lines: list[str] = []              # per instruction: its source line, when
                                                # a hand-written kernel gave them
        self.flops = 0                          # useful FLOPs of the source ops
        self.notes: list[str] = []              # compiler notes for the Kernel
        self.dram: dict[str, DramTensor] = {}
        self.sbuf = Allocator("sbuf", target.sbuf_bytes, SBUF_ALIGN)
        # PSUM is allocated in whole banks: one accumulation group each (§3.2).
        self.psum = Allocator("psum", target.psum_bytes, target.psum_bank_bytes)
        self._queues = itertools.cycle(range(target.dma_queues))
        self._evac = itertools.cycle(("vector", "scalar"))

    def reset(self) -> None:
        """Back to an empty kernel (instructions, allocations, DMA queue rotation), for a
        second trace of a hand-written kernel (jax_trn.kernels.trace)."""
        self.instrs, self.lines, self.dram, self.flops = [], [], {}, 0
        self.sbuf = Allocator("sbuf", self.target.sbuf_bytes, SBUF_ALIGN)
        self.psum = Allocator("psum", self.target.psum_bytes, self.target.psum_bank_bytes)
        self._queues = itertools.cycle(range(self.target.dma_queues))
        self._evac = itertools.cycle(("vector", "scalar"))

    # --- memory ---------------------------------------------------------------

    def tile(self, free: int | tuple[int, ...], dtype: str, mem: str = "sbuf",
             parts: int | None = None, top_down: bool = False) -> isa.Tile:
        """A [parts, free] tile (all partitions by default) in SBUF or PSUM."""
        free = (free,) if isinstance(free, int) else tuple(free)
        parts = self.target.partitions if parts is None else parts
        t = isa.Tile(mem, 0, parts, 0, free, dtype)
        offset = self._alloc(mem).alloc(t.bytes_per_partition, self.name, top_down)
        return t.with_(offset=offset)

    def ring(self, depth: int, free: int | tuple[int, ...], dtype: str,
             mem: str = "sbuf") -> Ring:
        return Ring([self.tile(free, dtype, mem) for _ in range(depth)])

    def release(self, *tiles: isa.Tile | Ring) -> None:
        for t in tiles:
            for tt in (t.tiles if isinstance(t, Ring) else [t]):
                self._alloc(tt.mem).free(tt.offset)

    def _alloc(self, mem: str) -> Allocator:
        return self.sbuf if mem == "sbuf" else self.psum

    # --- instructions -----------------------------------------------------------

    def emit(self, cls: type, **fields) -> isa.Instr:
        # Interned: a kernel's instructions of one kind share one name object (a
        # program's ~10^5 names are a few thousand strings, stored once when cached).
        instr = cls(name=sys.intern(f"{self.name}/{opcode(cls)}"), **fields)
        self.instrs.append(instr)
        return instr

    def ap(self, tensor: DramTensor, offset: int, pattern: Axes,
           view: str | None = None) -> isa.DramAP:
        """An access pattern over `tensor` (recorded as used by the kernel); with `view`
        a dtype, over the tensor's bytes read as that type (offset and strides in its
        elements, NKI `view(dtype)`, §6.1)."""
        self.dram[tensor.name] = tensor
        return isa.DramAP(tensor.name, offset, tuple(pattern), view or tensor.dtype)

    def dma(self, dst: isa.Operand, src: isa.Operand) -> isa.Instr:
        """A DmaCopy on the next DMA queue (round-robin)."""
        return self.emit(isa.DmaCopy, dst=dst, src=src, dma_queue=self.next_queue())

    def next_queue(self) -> int:
        """The next DMA queue of the round-robin (for DMA instructions other than
        DmaCopy: gathers, transposes)."""
        return next(self._queues)

    def evac_engine(self) -> str:
        """Alternates PSUM evacuation copies between VectorE and ScalarE."""
        return next(self._evac)

    def finish(self, ops: Iterable[str] = ()) -> Kernel:
        """The Kernel, its semaphore waits set by the hardware's sync pass."""
        return Kernel(name=self.name, instructions=list(insert_semaphores(self.instrs)),
                      dram=dict(self.dram), sbuf_bytes=self.sbuf.peak,
                      psum_bytes=self.psum.peak, ops=list(ops), flops=self.flops,
                      notes=list(self.notes), lines=list(self.lines))
