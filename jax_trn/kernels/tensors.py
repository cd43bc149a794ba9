"""The tensors a kernel names: HBM tensors and on-chip tiles, and views of them.

    a[i * 128:(i + 1) * 128, :]      an `HbmView`: an access pattern over a DRAM tensor
    t[0:64, 0:512:2]                 a `TileView`: partitions 0..63 of SBUF/PSUM tile `t`,
                                     every other element of its first 512

Indexing is numpy's basic indexing (ints, slices with a positive step, `...`); an int
drops its axis, except on a tile's partition axis, which a tile always keeps (an int
there selects one partition). The first axis of an on-chip tensor is the partition
axis (at most 128, §3.1); the others are free axes laid out row-major in each
partition. An HBM view indexed by a [P, 1] tile of int32 row numbers (`table[idx, :]`)
is an indirect access: `dma_copy` of it is a gather (a store to it, a scatter, §3.4).

A view turns into the ISA's operands (`jax_trn.hw.isa.Tile`, `DramAP`) with `tile()`
and `ap()`; the instruction checks its own constraints when it is built.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from . import errors


def KernelError(msg: str):              # noqa: N802 (raised like the class)
    """A KernelError naming the kernel and its line when one is being traced."""
    return errors.located(msg)

__all__ = ["HbmView", "TileView", "AffineIndex", "normalize_dtype"]

# Set by language.py (which imports this module): `tile + x`, `tile[...] = x`, ... emit
# instructions through the kernel language, which this module cannot import.
_ARITH = None        # (op, a, b, into=None) -> TileView
_ASSIGN = None       # (dst view, value) -> None
_BROADCAST = None    # (view, shape) -> a broadcast operand
_current_mask = lambda: None     # noqa: E731 (set by trace.py: the call's mask=)


def _cut(count: int, axis_mask) -> tuple[int, int]:
    """[lo, hi) of an axis of `count` positions under a mask's bounds for it."""
    if axis_mask is None:
        return 0, count
    lo, hi = axis_mask
    if count < hi:                  # an operand shorter than the masked grid: kept
        return 0, count
    return lo, hi


def normalize_dtype(dtype) -> str:
    """The hardware's name of `dtype` (a name, a numpy / ml_dtypes / jnp dtype)."""
    if isinstance(dtype, str):
        name = dtype
    else:
        import numpy as np
        name = getattr(dtype, "name", None) or np.dtype(dtype).name
    if name == "bool_":
        name = "bool"
    try:
        hw_dtypes.np_dtype(name)
    except (KeyError, TypeError):
        raise KernelError(f"{dtype!r} is not an element type of the hardware (§4)") from None
    return name


def _index_tuple(index, ndim: int) -> tuple:
    index = index if isinstance(index, tuple) else (index,)
    if sum(i is Ellipsis for i in index) > 1:
        raise KernelError("an index can have only one '...'")
    if Ellipsis in index:
        at = index.index(Ellipsis)
        fill = ndim - (len(index) - 1)
        index = index[:at] + (slice(None),) * fill + index[at + 1:]
    if len(index) > ndim:
        raise KernelError(f"too many indices ({len(index)}) for a tensor of rank {ndim}")
    return index + (slice(None),) * (ndim - len(index))


@dataclass(frozen=True)
class AffineIndex:
    """NKI's index expressions: `nl.arange(n)` (`[:, None]` / `[None, :]` put it on an
    axis of a grid), `nl.mgrid[0:128, 0:512]`, and `start + sum(step * them)`: `terms`
    are (grid axis, step, size). Indexing a tensor axis with one takes those elements
    (a strided slice); with a sum over several grid axes (`2 * i1 + i2`), the axis
    becomes one axis per grid axis, in grid order."""
    start: int
    terms: tuple            # ((grid axis, step, size), ...), grid axes distinct, sorted
    ndim: int = 1           # the grid's rank

    @property
    def step(self) -> int:
        return self._one()[1]

    @property
    def size(self) -> int:
        return self._one()[2]

    @property
    def dim(self) -> int:
        return self._one()[0]

    def _one(self):
        if len(self.terms) != 1:
            raise KernelError(f"index expression over grid axes "
                              f"{[t[0] for t in self.terms]}: one axis expected here")
        return self.terms[0]

    def __getitem__(self, index) -> "AffineIndex":
        """`[:, None]`, `[None, :]`, `[None, :, None]`, ...: the grid axis of the `:`."""
        index = index if isinstance(index, tuple) else (index,)
        colons = [k for k, i in enumerate(index) if i == slice(None)]
        if self.ndim != 1 or len(self.terms) != 1 or len(colons) != 1 or \
                any(i is not None for k, i in enumerate(index) if k != colons[0]):
            raise KernelError(f"index expression {index}: one ':' and None elsewhere "
                              "(e.g. [:, None])")
        _, step, size = self.terms[0]
        return AffineIndex(self.start, ((colons[0], step, size),), len(index))

    def _num(self, c) -> int:
        if not hasattr(c, "__index__"):
            raise KernelError(f"index expressions combine with ints and each other, not "
                              f"{c!r}")
        return c.__index__()

    def __add__(self, c):
        if isinstance(c, AffineIndex):
            dims = [t[0] for t in self.terms + c.terms]
            if len(set(dims)) != len(dims) or self.ndim != c.ndim:
                raise KernelError("adding index expressions of the same grid axis (or of "
                                  "grids of different rank) is not an affine index")
            return AffineIndex(self.start + c.start, tuple(sorted(self.terms + c.terms)),
                               self.ndim)
        return AffineIndex(self.start + self._num(c), self.terms, self.ndim)

    __radd__ = __add__

    def __sub__(self, c):
        return self + (-self._num(c))

    def __mul__(self, c):
        c = self._num(c)
        return AffineIndex(self.start * c, tuple((d, s * c, n) for d, s, n in self.terms),
                           self.ndim)

    __rmul__ = __mul__

    # Comparisons make masks (NKI's `mask=(i_p < n)`): the grid positions kept.
    def _positions(self, keep) -> "IndexMask":
        d, step, size = self._one()
        ok = [j for j in range(size) if keep(self.start + step * j)]
        lo, hi = (ok[0], ok[-1] + 1) if ok else (0, 0)
        if ok and len(ok) != hi - lo:
            raise KernelError("a mask must keep a contiguous range of positions")
        return IndexMask({d: (lo, hi)}, self.ndim)

    def __lt__(self, c):
        return self._positions(lambda v: v < c)

    def __le__(self, c):
        return self._positions(lambda v: v <= c)

    def __gt__(self, c):
        return self._positions(lambda v: v > c)

    def __ge__(self, c):
        return self._positions(lambda v: v >= c)


@dataclass(frozen=True)
class IndexMask:
    """Grid positions an instruction acts on (`mask=`): grid axis -> [lo, hi), of a grid
    of rank `ndim`. An operand indexed by the grid's expressions is cut on the axes
    they made; another operand (a tile) lines up with the grid's last axes, as numpy
    broadcasts: a [P, F] tile under a 4-D grid takes grid axes 2 and 3."""
    bounds: dict
    ndim: int = 2

    def __and__(self, other: "IndexMask") -> "IndexMask":
        out = dict(self.bounds)
        for k, (lo, hi) in other.bounds.items():
            a, b = out.get(k, (lo, hi))
            out[k] = (max(a, lo), min(b, hi))
        return IndexMask(out, max(self.ndim, other.ndim))

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.bounds.items())), self.ndim))

    def axes(self, gdims, rank: int) -> dict[int, tuple[int, int]]:
        """Operand axis -> [lo, hi): by the grid axes its axes came from (`gdims`), else
        aligned with the grid's last `rank` axes."""
        out = {}
        for d, b in self.bounds.items():
            if gdims is not None and any(g is not None for g in gdims):
                out.update({k: b for k, g in enumerate(gdims) if g == d})
            else:
                k = d - (self.ndim - rank)
                if 0 <= k < rank:
                    out[k] = b
        return out


def _axis(i, size: int, axis: int):
    """(start, parts, keep) of index `i` on an axis of `size`: `parts` the (step, count,
    grid axis or None) of the view axes it makes (several for a sum of grid axes)."""
    if isinstance(i, AffineIndex):
        if i.start < 0 or any(step <= 0 for _, step, _ in i.terms):
            raise KernelError(f"axis {axis}: index expression {i.start} + ... must start "
                              ">= 0 and increase along each grid axis")
        return i.start, [(step, n, d) for d, step, n in i.terms], True
    if isinstance(i, slice):
        start, stop, step = i.indices(size)
        if step <= 0:
            raise KernelError(f"axis {axis}: slice step must be positive, got {i.step}")
        count = max(0, -(-(stop - start) // step))
        if count == 0:
            raise KernelError(f"axis {axis}: empty slice {i} of size {size}")
        return start, [(step, count, None)], True
    if hasattr(i, "__index__"):
        k = i.__index__()
        if not -size <= k < size:
            raise KernelError(f"axis {axis}: index {k} out of range for size {size}")
        return k % size, [], False
    raise KernelError(f"axis {axis}: unsupported index {i!r} (ints and slices; a [P, 1] "
                      "int32 tile on an HBM tensor's first axis for an indirect access)")


@dataclass(frozen=True)
class HbmView:
    """Elements `offset + sum(i_k * strides[k])` of DRAM tensor `tensor`, i_k < shape[k];
    with `indices` (a [P, 1] int32 tile), row i of axis 0 is row `indices[i]`."""
    tensor: DramTensor
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    indices: "TileView | None" = None
    rows: int = 0                     # indirect: the table's rows (axis 0)
    valid: tuple | None = None        # per axis, the positions inside the tensor (an
                                      # index expression may run past its end: masked)
    gdims: tuple | None = None        # per axis, the grid axis of the index expression
                                      # that made it (None: a slice), for masks

    @staticmethod
    def whole(t: DramTensor) -> "HbmView":
        strides, acc = [], 1
        for d in reversed(t.shape):
            strides.append(acc)
            acc *= d
        return HbmView(t, 0, tuple(t.shape), tuple(reversed(strides)))

    @property
    def dtype(self) -> str:
        return self.tensor.dtype

    @property
    def name(self) -> str:
        return self.tensor.name

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __getitem__(self, index) -> "HbmView":
        if self.indices is not None:
            raise KernelError("an indirect view cannot be indexed further")
        index = index if isinstance(index, tuple) else (index,)
        if index and isinstance(index[0], TileView):
            return self._indirect(index[0], index[1:])
        index = _index_tuple(index, len(self.shape))
        offset, shape, strides, valid, gdims = self.offset, [], [], [], []
        old_valid = self.valid or self.shape
        old_g = self.gdims or (None,) * len(self.shape)
        for k, (i, n, s) in enumerate(zip(index, self.shape, self.strides)):
            start, parts, keep = _axis(i, n, k)
            if not keep and start >= old_valid[k]:
                raise KernelError(f"axis {k}: index {start} out of range for size {n}")
            offset += start * s
            if len(parts) > 1:          # a sum over grid axes: every position inside
                last = start + sum(step * (c - 1) for step, c, _ in parts)
                if last >= old_valid[k]:
                    raise KernelError(f"axis {k}: index expression reaches {last}, past the "
                                      f"tensor's {old_valid[k]} positions")
            for step, count, g in parts:
                inside = count if len(parts) > 1 else \
                    max(0, min(count, -(-(old_valid[k] - start) // step)))
                if inside == 0:
                    raise KernelError(f"axis {k}: index {start}.. is outside the tensor's "
                                      f"{old_valid[k]} positions")
                shape.append(count)
                strides.append(step * s)
                valid.append(inside)
                gdims.append(g if g is not None else (old_g[k] if len(parts) == 1 and
                                                      isinstance(i, slice) and i == slice(None)
                                                      else None))
        full = tuple(valid) == tuple(shape)
        return HbmView(self.tensor, offset, tuple(shape), tuple(strides),
                       valid=None if full else tuple(valid),
                       gdims=tuple(gdims) if any(g is not None for g in gdims) else None)

    def _indirect(self, idx: "TileView", rest: tuple) -> "HbmView":
        if idx.dtype not in ("int32", "uint32") or idx.free_size != 1:
            raise KernelError(f"an indirect index must be a [P, 1] int32 tile, got "
                              f"{idx.shape} {idx.dtype}")
        if len(self.shape) < 2:
            raise KernelError("an indirect access needs a tensor of rank >= 2 (rows)")
        row = self[(0,) + rest]             # the columns taken of each row
        return HbmView(self.tensor, row.offset, (idx.num_partitions,) + row.shape,
                       (self.strides[0],) + row.strides, idx, self.shape[0])

    def reshape(self, *shape) -> "HbmView":
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) \
            else tuple(shape)
        if math.prod(shape) != self.size or not self.contiguous:
            raise KernelError(f"cannot reshape a view of shape {self.shape} (contiguous: "
                              f"{self.contiguous}) to {shape}")
        return HbmView(self.tensor, self.offset, shape, _row_major(shape))

    def broadcast_to(self, *shape) -> "HbmView":
        """The view repeated along new leading axes or its size-1 axes (stride 0):
        `w.reshape((1, D)).broadcast_to((128, D))` loads row w into every partition."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) \
            else tuple(shape)
        extra = len(shape) - len(self.shape)
        if extra < 0:
            raise KernelError(f"cannot broadcast {self.shape} to {shape}")
        strides = [0] * extra
        for n, m, s in zip(self.shape, shape[extra:], self.strides):
            if n != m and n != 1:
                raise KernelError(f"cannot broadcast {self.shape} to {shape}")
            strides.append(s if n == m else 0)
        return HbmView(self.tensor, self.offset, shape, tuple(strides))

    @property
    def contiguous(self) -> bool:
        return self.indices is None and self.strides == _row_major(self.shape)

    def ap(self) -> isa.DramAP:
        """The access pattern: (stride, count) pairs, outermost first (§3.1); cut to the
        call's `mask=` (axis 0 and the last axis), which must leave no position outside
        the tensor."""
        shape = list((self.rows,) + self.shape[1:] if self.indices is not None
                     else self.shape)
        valid = list(self.valid or shape)
        offset, mask = self.offset, _current_mask()
        if mask is not None and shape and self.indices is None:
            for k, bounds in mask.axes(self.gdims, len(shape)).items():
                if shape[k] > 1:
                    lo, hi = _cut(shape[k], bounds)
                    offset += lo * self.strides[k]
                    shape[k], valid[k] = hi - lo, max(0, min(valid[k], hi) - lo)
        for k, (n, ok) in enumerate(zip(shape, valid)):
            if n > ok:
                raise KernelError(f"{self.tensor.name}{list(self.tensor.shape)}: axis {k} "
                                  f"takes {n} positions, {n - ok} past the tensor's end: "
                                  "mask them (mask=(i_p < n), ...)")
        pattern = tuple((s, n) for s, n in zip(self.strides, shape)) or ((1, 1),)
        return isa.DramAP(self.tensor.name, offset, pattern, self.tensor.dtype)

    def __repr__(self) -> str:
        return f"HbmView({self.tensor.name}{list(self.shape)} {self.dtype})"


def _is_int(i) -> bool:
    return not isinstance(i, (slice, AffineIndex)) and hasattr(i, "__index__")


def _row_major(shape) -> tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


@dataclass(frozen=True)
class TileView:
    """Partitions [start, start + num_partitions) of on-chip memory `mem`, and in each
    the elements at byte `offset` + itemsize * sum(i_k * strides[k]), i_k < free[k]."""
    mem: str
    start_partition: int
    num_partitions: int
    offset: int
    free: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: str
    label: str = ""                   # what the kernel called it (for messages)
    base: object = None               # the allocation it views (trace._Alloc): alive
                                      # while any view of it is
    pdim: int = 0                     # where the partition axis is in `shape` (NKI's
                                      # par_dim after block axes: (2, par_dim(128), 64))
    gdims: tuple | None = None        # per physical axis, the grid axis of the index
                                      # expression that made it (masks)

    @property
    def shape(self) -> tuple[int, ...]:
        """The logical shape (block axes before the partition axis when `pdim` > 0)."""
        return (*self.free[:self.pdim], self.num_partitions, *self.free[self.pdim:])

    @property
    def phys_shape(self) -> tuple[int, ...]:
        """[partitions, free...]: the layout in memory."""
        return (self.num_partitions, *self.free)

    @property
    def byte_span(self) -> tuple[int, int]:
        """[lo, hi) bytes of each partition the view touches."""
        item = hw_dtypes.itemsize(self.dtype)
        return (self.offset, self.offset + item * (1 + sum((n - 1) * s for n, s in
                                                            zip(self.free, self.strides))))

    def __setitem__(self, index, value) -> None:
        """`tile[...] = value` (NKI): `value` lands in the view: the result of the
        instruction just emitted (`t[...] = nl.exp(x)`) is written there directly when
        nothing reads it afterwards (trace.Tracer.retarget), another tile is copied
        (VectorE), an HBM view loaded (DMA), a number set (memset), a matmul computed
        into it. (`tile[...] += x` ends here with the view itself: nothing to do.)"""
        dst = self[index]
        if value is dst or value == dst:
            return
        _ASSIGN(dst, value)

    # Elementwise arithmetic (VectorE tensor_tensor / tensor_scalar into a new SBUF tile;
    # `+=` and friends write the tile in place), as NKI's tiles have it.
    def __add__(self, o):
        return _ARITH("add", self, o)

    def __radd__(self, o):
        return _ARITH("add", o, self)

    def __sub__(self, o):
        return _ARITH("subtract", self, o)

    def __rsub__(self, o):
        return _ARITH("subtract", o, self)

    def __mul__(self, o):
        return _ARITH("multiply", self, o)

    def __rmul__(self, o):
        return _ARITH("multiply", o, self)

    def __truediv__(self, o):
        return _ARITH("divide", self, o)

    def __rtruediv__(self, o):
        return _ARITH("divide", o, self)

    def __neg__(self):
        return _ARITH("multiply", self, -1.0)

    def __iadd__(self, o):
        return _ARITH("add", self, o, into=self)

    def __isub__(self, o):
        return _ARITH("subtract", self, o, into=self)

    def __imul__(self, o):
        return _ARITH("multiply", self, o, into=self)

    def __itruediv__(self, o):
        return _ARITH("divide", self, o, into=self)

    def broadcast_to(self, *shape):
        """[P, 1] -> [P, F] (an operand read per partition, as tensor_scalar does) and
        [1, F] -> [P, F] (copied to every partition by a TensorE matmul with ones)."""
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) \
            else tuple(shape)
        return _BROADCAST(self, shape)

    @property
    def free_size(self) -> int:
        return math.prod(self.free)

    @property
    def buffer(self) -> str:
        return self.mem

    def __getitem__(self, index) -> "TileView":
        index = _index_tuple(index, 1 + len(self.free))
        pdim = self.pdim
        if pdim:        # logical (blocks..., P, free...) -> physical (P, blocks..., free...)
            kept = sum(not _is_int(i) for i in index[:pdim])
            index = (index[pdim],) + index[:pdim] + index[pdim + 1:]
        else:
            kept = 0
        start, parts, _ = _axis(index[0], self.num_partitions, 0)
        if len(parts) != 1 or parts[0][0] != 1:
            raise KernelError("the partition axis takes contiguous ranges only (§3.1)")
        count, pg = parts[0][1], parts[0][2]
        if start + count > self.num_partitions:
            raise KernelError(f"partitions {start}..{start + count - 1} of a "
                              f"{self.num_partitions}-partition tile")
        offset, free, strides, gdims = self.offset, [], [], [pg]
        item = hw_dtypes.itemsize(self.dtype)
        for k, (i, n, s) in enumerate(zip(index[1:], self.free, self.strides), 1):
            first, fparts, keep = _axis(i, n, k)
            if len(fparts) > 1 and first + sum(st * (c - 1) for st, c, _ in fparts) >= n:
                raise KernelError(f"axis {k}: index expression past the tile's {n} elements")
            if len(fparts) == 1 and first + fparts[0][0] * (fparts[0][1] - 1) >= n:
                raise KernelError(f"axis {k}: index {first}.. past the tile's {n} elements")
            offset += first * s * item
            for st, c, g in fparts:
                free.append(c)
                strides.append(st * s)
                gdims.append(g)
        if not free:
            free, strides = [1], [1]
            gdims.append(None)
        return TileView(self.mem, self.start_partition + start, count, offset,
                        tuple(free), tuple(strides), self.dtype, self.label, self.base,
                        min(kept, len(free)),
                        tuple(gdims) if any(g is not None for g in gdims) else None)

    def reshape(self, *shape) -> "TileView":
        shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) \
            else tuple(shape)
        if self.pdim or shape[0] != self.num_partitions or \
                math.prod(shape[1:]) != self.free_size or not self.contiguous:
            raise KernelError(f"cannot reshape tile {self.shape} to {shape}: the partition "
                              "axis stays, and the free axes must be contiguous")
        return TileView(self.mem, self.start_partition, self.num_partitions, self.offset,
                        tuple(shape[1:]), _row_major(shape[1:]), self.dtype, self.label,
                        self.base)

    def view(self, dtype) -> "TileView":
        """The same bytes read as `dtype` (NKI `view`): the last free axis rescaled."""
        dtype = normalize_dtype(dtype)
        old, new = hw_dtypes.itemsize(self.dtype), hw_dtypes.itemsize(dtype)
        if not self.contiguous or (self.free[-1] * old) % new:
            raise KernelError(f"cannot view tile {self.shape} {self.dtype} as {dtype}")
        free = self.free[:-1] + (self.free[-1] * old // new,)
        return TileView(self.mem, self.start_partition, self.num_partitions, self.offset,
                        free, _row_major(free), dtype, self.label, self.base)

    @property
    def contiguous(self) -> bool:
        return self.strides == _row_major(self.free)

    def tile(self) -> isa.Tile:
        """The ISA operand, cut to the call's `mask=` (grid axis 0 on the partitions,
        axis 1 on the last free axis; an operand shorter than the mask keeps its axis)."""
        view, mask = self, _current_mask()
        if mask is not None:
            cuts = mask.axes(self.gdims, 1 + len(self.free))
            if 0 in cuts:
                p0, p1 = _cut(view.num_partitions, cuts[0])
                if (p0, p1) != (0, view.num_partitions):
                    view = dataclasses.replace(view, start_partition=view.start_partition + p0,
                                               num_partitions=p1 - p0)
            free, offset = list(view.free), view.offset
            item = hw_dtypes.itemsize(view.dtype)
            for k, bounds in cuts.items():
                if k and free[k - 1] > 1:
                    f0, f1 = _cut(free[k - 1], bounds)
                    offset += f0 * view.strides[k - 1] * item
                    free[k - 1] = f1 - f0
            view = dataclasses.replace(view, free=tuple(free), offset=offset)
        try:
            return isa.Tile(view.mem, view.start_partition, view.num_partitions,
                            view.offset, view.free, view.dtype,
                            None if view.contiguous else view.strides)
        except isa.IsaError as e:
            raise KernelError(f"tile {self.label or ''}{list(self.shape)}: {e}") from None

    def __repr__(self) -> str:
        return (f"TileView({self.label or self.mem}[{self.start_partition}:"
                f"{self.start_partition + self.num_partitions}] {list(self.free)} {self.dtype})")
