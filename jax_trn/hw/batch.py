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
the memories hold only the byte ranges the kernel's tiles touch (`span`), zeroed when
made: B x 128 x those bytes, not B copies of a 24 MiB SBUF.
"""
from __future__ import annotations

import numpy as np

from . import dtypes as _dt
from .memory import _ap_layout, _check_no_overlap, _typed_strided, dram_read, dram_write
from .operands import DramAP, Tile
from .trace import merged

__all__ = ["BatchCore", "BatchMemory", "span"]


def span(kernel) -> dict[str, tuple[tuple[int, int], ...]]:
    """{memory: the byte ranges [lo, hi) per partition that `kernel`'s tiles touch,
    merged where they overlap or meet}: what a batch keeps of SBUF and PSUM (a
    kernel's tiles sit apart in a 24 MiB SBUF; a batch holds only their bytes)."""
    got: dict[str, list[tuple[int, int]]] = {}
    for ins in kernel.instructions:
        for t in _tiles(ins.__dict__.values()):
            got.setdefault(t.mem, []).append(t.byte_range)
    return {mem: tuple((lo, hi) for lo, hi in merged(ranges)) for mem, ranges in got.items()}


def _tiles(values):
    for v in values:
        if isinstance(v, Tile):
            yield v
        elif isinstance(v, (tuple, list)):
            yield from _tiles(v)


class BatchMemory:
    """The byte ranges `ranges` ([lo, hi) per partition) of SBUF or PSUM, for B
    devices, packed one after another: `data[d]` is device d's."""
    __slots__ = ("name", "data", "ranges", "_base", "by_matmul", "_views")

    def __init__(self, name: str, batch: int, partitions: int, ranges):
        self.name, self.ranges = name, tuple(ranges)
        self._base, at = [], 0
        for lo, hi in self.ranges:
            self._base.append(at)
            at += hi - lo
        self.data = np.zeros((batch, partitions, at), np.uint8)
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
        at = next((base + lo - rlo for (rlo, rhi), base in zip(self.ranges, self._base)
                   if rlo <= lo and hi <= rhi), None)
        if at is None:
            raise ValueError(f"{self.name} tile bytes [{lo}, {hi}) outside the batch's "
                             f"ranges {self.ranges}")
        p0, n = tile.start_partition, tile.num_partitions
        rows = self.data[:, p0:p0 + n, at:at + hi - lo]
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
    doc). `spans`: {memory: byte ranges per partition to keep} (`span(kernel)`)."""

    def __init__(self, spec, numerics, batch: int, spans: dict[str, tuple[int, int]]):
        self.spec, self.numerics = spec, numerics
        self.lead = (batch,)
        self._mems = {name: BatchMemory(name, batch, spec.pmax, spans.get(name, ()))
                      for name in ("sbuf", "psum")}
        self.drams: list[dict] = [{}] * batch
        # DRAM tensors the devices hold as rows of one array (see `_rows_view`): read
        # and written for all devices in one view, not device by device
        self.stacked: dict[str, tuple] = {}
        self.slices = [_SliceCore(self, d) for d in range(batch)]

    def mem(self, tile) -> BatchMemory:
        return self._mems[tile.mem]

    @property
    def batch(self) -> int:
        return self.lead[0]

    def read_dram(self, ap: DramAP) -> np.ndarray:
        """[B, *ap.shape]: each device's elements of `ap`."""
        rows = self.stacked.get(ap.tensor)
        if rows is not None:
            return _rows_view(rows, ap, self.lead[0])
        return np.stack([dram_read(ap, dram) for dram in self.drams])

    def write_dram(self, ap: DramAP, values: np.ndarray) -> None:
        """Device d's `values[d]` through `ap`, for every d."""
        rows = self.stacked.get(ap.tensor)
        if rows is not None and rows[1]:
            _check_no_overlap(ap)
            view = _rows_view(rows, ap, self.lead[0])
            if values.dtype != view.dtype:
                raise TypeError(f"writing {values.dtype} into {ap.tensor!r} of {view.dtype}")
            view[...] = values
            return
        for d, dram in enumerate(self.drams):
            dram_write(ap, dram, values[d])


def _rows_view(rows: tuple, ap: DramAP, batch: int) -> np.ndarray:
    """The view of `ap` on every device's flat tensor, shape [batch, *ap.shape].
    `rows` = (buffer, row stride in bytes, elements per device): device d's tensor is
    the `elements` items of the buffer's dtype at byte d x stride (stride 0: one array
    all devices hold)."""
    buf, stride, size = rows
    dtype, offset, shape, strides = _ap_layout(ap, buf.dtype, size)
    return np.ndarray((batch, *shape), dtype, buffer=buf, offset=offset,
                      strides=(stride, *strides))
