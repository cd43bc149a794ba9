"""One kernel's numerics for a batch of devices at once (issue 14, point 4).

In an SPMD program every device runs the same kernels in the same order; a follower
device only replays its leader's instructions on its own data (runtime/spmd_batch.py).
Replaying them device by device costs the same Python per instruction for each of
1,152 devices. `BatchCore` is the numerics of B devices side by side: SBUF and PSUM
with a leading device axis (`BatchMemory`, [B, partitions, bytes]), one DRAM dict per
device. A kernel's plan compiled for it (`plan.kernel_plan`, which reads `core.lead`)
applies each instruction to all B devices with one numpy call per step of its
semantics (the same calls with a leading axis: elementwise math, casts and per-row
reductions give each device the bits it gets alone); a DMA gathers the B devices'
DRAM views into one array and scatters writes back; a matmul is one GEMM per device
(sgemm.matmul, the same call as alone). An instruction without a batched compiler
runs its semantics function once per device on `slices` (a view of device d's memory
and DRAM).

Only replays use it: no timing and no validation (the leader's run did both, and the
PSUM bookkeeping of who wrote a byte last is the same on every device, so it is not
kept). A kernel must not read on-chip bytes it did not write (`NeuronCore.begin`), so
the memories hold only the byte range the kernel's tiles touch (`span`), zeroed when
made: B x 128 x that range, not B copies of a 24 MiB SBUF.
"""
from __future__ import annotations

import numpy as np

from . import dtypes as _dt
from .memory import _typed_strided
from .operands import Tile

__all__ = ["BatchCore", "BatchMemory", "span"]


def span(kernel) -> dict[str, tuple[int, int]]:
    """{memory: (lowest byte, end byte)} of the tiles `kernel`'s instructions touch,
    per partition (partitions are all kept)."""
    got: dict[str, list[int]] = {}
    for ins in kernel.instructions:
        for t in _tiles(ins.__dict__.values()):
            lo, hi = t.byte_range
            cur = got.get(t.mem)
            got[t.mem] = [lo, hi] if cur is None else [min(cur[0], lo), max(cur[1], hi)]
    return {k: (v[0], v[1]) for k, v in got.items()}


def _tiles(values):
    for v in values:
        if isinstance(v, Tile):
            yield v
        elif isinstance(v, (tuple, list)):
            yield from _tiles(v)


class BatchMemory:
    """SBUF or PSUM bytes [lo, hi) of each partition, for B devices: `data[d]` is
    device d's."""
    __slots__ = ("name", "data", "lo", "hi", "by_matmul", "_views")

    def __init__(self, name: str, batch: int, partitions: int, lo: int, hi: int):
        self.name, self.lo, self.hi = name, lo, hi
        self.data = np.zeros((batch, partitions, hi - lo), np.uint8)
        self.by_matmul = None              # not kept: see the module doc
        self._views: dict[Tile, np.ndarray] = {}

    def view(self, tile: Tile) -> np.ndarray:
        """[B, *tile.shape] writable view, the same array object on every call."""
        view = self._views.get(tile)
        if view is None:
            view = self._views[tile] = self._make_view(tile)
        return view

    def _make_view(self, tile: Tile) -> np.ndarray:
        lo, hi = tile.byte_range
        if lo < self.lo or hi > self.hi:
            raise ValueError(f"{self.name} tile bytes [{lo}, {hi}) outside the batch's "
                             f"[{self.lo}, {self.hi})")
        p0, n = tile.start_partition, tile.num_partitions
        rows = self.data[:, p0:p0 + n, lo - self.lo:hi - self.lo]
        dtype = _dt.np_dtype(tile.dtype)
        if tile.strides is None:
            return rows.view(dtype).reshape((rows.shape[0], *tile.shape))
        raw = rows.view(f"u{dtype.itemsize}")[:, :, (tile.offset - lo) // dtype.itemsize:]
        return _typed_strided(raw, (rows.shape[0], *tile.shape),
                              (None, None, *tile.strides), dtype)

    def read(self, tile: Tile) -> np.ndarray:
        return self.view(tile)


class _SliceMemory:
    """Device d's part of a BatchMemory, as semantics functions use a memory."""
    __slots__ = ("_mem", "_d", "by_matmul")

    def __init__(self, mem: BatchMemory, d: int):
        self._mem, self._d, self.by_matmul = mem, d, None

    def view(self, tile: Tile) -> np.ndarray:
        return self._mem.view(tile)[self._d]

    read = view

    def write(self, tile: Tile, values: np.ndarray) -> None:
        dst = self.view(tile)
        if values.dtype != dst.dtype:
            raise TypeError(f"writing {values.dtype} into a {tile.dtype} tile")
        dst[...] = values

    def mark(self, tile: Tile, by_matmul: bool) -> None:
        pass

    def written_by_matmul(self, tile: Tile) -> bool:
        return True


class _SliceCore:
    """Device d of a BatchCore, for an instruction's semantics function."""
    lead = ()

    def __init__(self, batch: "BatchCore", d: int):
        self.spec, self.numerics = batch.spec, batch.numerics
        self._mems = {k: _SliceMemory(m, d) for k, m in batch._mems.items()}
        self._batch, self._d = batch, d

    @property
    def dram(self) -> dict:
        return self._batch.drams[self._d]

    def mem(self, tile) -> _SliceMemory:
        return self._mems[tile.mem]


class BatchCore:
    """The numerics of `batch` devices of generation `spec` side by side (see the module
    doc). `spans`: {memory: (lo, hi)} bytes per partition to keep (`span(kernel)`)."""

    def __init__(self, spec, numerics, batch: int, spans: dict[str, tuple[int, int]]):
        self.spec, self.numerics = spec, numerics
        self.lead = (batch,)
        self._mems = {name: BatchMemory(name, batch, spec.pmax, *spans.get(name, (0, 0)))
                      for name in ("sbuf", "psum")}
        self.drams: list[dict] = [{}] * batch
        self.slices = [_SliceCore(self, d) for d in range(batch)]

    def mem(self, tile) -> BatchMemory:
        return self._mems[tile.mem]

    @property
    def batch(self) -> int:
        return self.lead[0]
