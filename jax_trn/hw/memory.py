"""SBUF, PSUM and DRAM storage for the functional model (trainium-hardware.md §3).

SBUF and PSUM are 2-D byte arrays, 128 partitions x bytes per partition (§3.1, §3.2);
a `Tile` is a view of them reinterpreted as its dtype. DRAM is a dict of flat numpy
arrays, one per named tensor, read and written through `DramAP` access patterns.

PSUM also remembers, per byte, whether a TensorE matmul wrote it last: on v2/v3
accumulating onto PSUM data a non-matmul instruction wrote is undefined behaviour
(§2.2 [NKI-ISA]), which semantics.py turns into an IsaError.
"""
from __future__ import annotations

import functools

import numpy as np
from numpy.lib.stride_tricks import as_strided

from . import dtypes as _dt
from .operands import DramAP, IsaError, Tile

__all__ = ["OnChipMemory", "dram_read", "dram_write", "ap_bounds"]

_MAX_VIEWS = 1 << 18      # tile views an OnChipMemory keeps (~60 MiB at most)


class OnChipMemory:
    """One of SBUF / PSUM: `partitions` x `nbytes` bytes, zero-initialised. PSUM keeps
    `by_matmul`: per byte, whether a matmul (not another engine) wrote it last."""
    __slots__ = ("name", "data", "nbytes", "by_matmul", "_views")

    def __init__(self, name: str, partitions: int, nbytes: int):
        self.name = name
        self.nbytes = nbytes
        self.data = np.zeros((partitions, nbytes), np.uint8)
        self.by_matmul = np.zeros((partitions, nbytes), bool) if name == "psum" else None
        # tile -> its view: a tile's place in `data` never changes, so its view (and
        # the bounds check) is made once per memory, not once per instruction executed
        self._views: dict[Tile, np.ndarray] = {}

    def check(self, tile: Tile) -> None:
        lo, hi = tile.byte_range
        if lo < 0 or hi > self.nbytes:
            raise IsaError(f"{self.name} tile bytes [{lo}, {hi}) outside the "
                           f"{self.nbytes} bytes per partition")

    def view(self, tile: Tile) -> np.ndarray:
        """A writable view of the tile, shape `tile.shape`, dtype `tile.dtype` (strided
        when the tile has `strides`); the same array object on every call."""
        view = self._views.get(tile)
        if view is None:
            if len(self._views) >= _MAX_VIEWS:     # many programs ago: start afresh
                self._views.clear()
            view = self._views[tile] = self._make_view(tile)
        return view

    def _make_view(self, tile: Tile) -> np.ndarray:
        self.check(tile)
        p0 = tile.start_partition
        lo, hi = tile.byte_range
        rows = self.data[p0:p0 + tile.num_partitions, lo:hi]
        dtype = _dt.np_dtype(tile.dtype)
        if tile.strides is None:
            return rows.view(dtype).reshape(tile.shape)
        raw = rows.view(f"u{dtype.itemsize}")[:, (tile.offset - lo) // dtype.itemsize:]
        return _typed_strided(raw, tile.shape, (None, *tile.strides), dtype)

    def read(self, tile: Tile) -> np.ndarray:
        return self.view(tile)

    def _flags(self, tile: Tile) -> np.ndarray:
        p0, (lo, hi) = tile.start_partition, tile.byte_range
        return self.by_matmul[p0:p0 + tile.num_partitions, lo:hi]

    def mark(self, tile: Tile, by_matmul: bool) -> None:
        """Record who wrote `tile` last (PSUM only)."""
        if self.by_matmul is not None:
            self._flags(tile)[...] = by_matmul

    def written_by_matmul(self, tile: Tile) -> bool:
        """Whether a matmul wrote every byte of `tile` last (always True for SBUF)."""
        return self.by_matmul is None or bool(self._flags(tile).all())

    def write(self, tile: Tile, values: np.ndarray) -> None:
        """Store `values` (already of the tile's dtype; broadcastable to its shape)."""
        dst = self.view(tile)
        if values.dtype != dst.dtype:
            raise TypeError(f"writing {values.dtype} into a {tile.dtype} tile")
        dst[...] = values


def ap_bounds(ap: DramAP) -> tuple[int, int]:
    """The smallest and largest element index the pattern touches."""
    lo = hi = ap.offset
    for stride, num in ap.pattern:
        span = stride * (num - 1)
        if span < 0:
            lo += span
        else:
            hi += span
    return lo, hi


def _strided(ap: DramAP, arrays: dict[str, np.ndarray]) -> np.ndarray:
    try:
        flat = arrays[ap.tensor]
    except KeyError:
        raise IsaError(f"DRAM tensor {ap.tensor!r} is not allocated") from None
    if flat.ndim != 1 or not flat.flags.c_contiguous:
        raise IsaError(f"DRAM tensor {ap.tensor!r} must be a flat contiguous array")
    dtype, offset, shape, strides = _ap_layout(ap, flat.dtype, flat.size)
    return np.ndarray(shape, dtype, buffer=flat, offset=offset, strides=strides)


@functools.lru_cache(maxsize=1 << 16)
def _ap_layout(ap: DramAP, dtype: np.dtype, size: int):
    """(element dtype, byte offset, shape, byte strides) of the view of `ap` on a flat
    array of `size` elements of `dtype` (IsaError if the pattern does not fit): the
    static facts of an access pattern, worked out once per pattern and array type."""
    want = _dt.np_dtype(ap.dtype)
    if dtype != want:
        # A reinterpreting view (NKI `view(dtype)`, §6.1), e.g. FP8 bytes as 16-bit
        # pairs for dma_transpose; offsets and strides count the view's elements.
        if dtype.itemsize == want.itemsize or (size * dtype.itemsize) % want.itemsize:
            raise IsaError(f"DRAM tensor {ap.tensor!r} is {dtype}, pattern says {ap.dtype}")
        size, dtype = size * dtype.itemsize // want.itemsize, want
    if any(num < 1 for _, num in ap.pattern):
        raise IsaError(f"empty dimension in access pattern {ap.pattern}")
    lo, hi = ap_bounds(ap)
    if lo < 0 or hi >= size:
        raise IsaError(f"access pattern on {ap.tensor!r} touches elements [{lo}, {hi}] "
                       f"outside its {size} elements")
    item = dtype.itemsize
    return dtype, ap.offset * item, ap.shape, tuple(s * item for s, _ in ap.pattern)


def _typed_strided(raw: np.ndarray, shape, strides, dtype) -> np.ndarray:
    """A view of `raw` (unsigned integers of the element's width, from element 0) with
    element `strides` (None keeps raw's own stride on that axis), as `dtype`:
    as_strided cannot build ml_dtypes (float8, bfloat16) arrays directly."""
    item = raw.itemsize
    byte_strides = [raw.strides[i] if s is None else s * item for i, s in enumerate(strides)]
    return as_strided(raw, shape=shape, strides=byte_strides).view(dtype)


def dram_read(ap: DramAP, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """The elements of `ap`, shape `ap.shape` (a read-only strided view)."""
    view = _strided(ap, arrays)
    view.flags.writeable = False
    return view


def _disjoint(pattern: tuple[tuple[int, int], ...]) -> bool:
    """Sufficient test that no two index tuples hit the same element: with dims sorted
    by |stride|, each stride exceeds the extent of all smaller-stride dims."""
    dims = sorted((abs(s), n) for s, n in pattern if n > 1)
    extent = 0
    for stride, num in dims:
        if stride <= extent:
            return False
        extent += stride * (num - 1)
    return True


@functools.lru_cache(maxsize=1 << 16)
def _check_no_overlap(ap: DramAP) -> None:
    """IsaError if the pattern writes an element twice (a pattern that passes is
    remembered; one that fails raises on every use)."""
    if _disjoint(ap.pattern):
        return
    idx = np.full((), ap.offset, np.int64)
    for stride, num in ap.pattern:
        idx = idx[..., None] + stride * np.arange(num, dtype=np.int64)
    if np.unique(idx).size != idx.size:
        raise IsaError(f"DMA write pattern {ap.pattern} on {ap.tensor!r} writes some "
                       f"elements more than once")


def dram_write(ap: DramAP, arrays: dict[str, np.ndarray], values: np.ndarray) -> None:
    """Store `values` (of the tensor's dtype, shape `ap.shape`) through the pattern."""
    view = _strided(ap, arrays)
    if not view.flags.writeable:
        raise IsaError(f"DRAM tensor {ap.tensor!r} is read-only (a kernel input?)")
    _check_no_overlap(ap)
    if values.dtype != view.dtype:
        raise TypeError(f"writing {values.dtype} into {ap.tensor!r} of {view.dtype}")
    view[...] = values
