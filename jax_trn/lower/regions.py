"""Regions of elementwise steps and their evaluation on one tile box.

A `Region` is a small dataflow program over one index space (`shape`): inputs (DRAM
tensors read through `axes` over the index space: row-major for a plain operand, stride
0 along broadcast dims), steps (one elementwise op each, reading earlier values; value
ids count inputs first, then steps; a "constant" step is an immediate) and outputs (step
values written row-major into DRAM tensors of the region's shape). A lowering rule picks
the tiling (elementwise.py: flat or row blocks; reduce.py: rows / columns; epilogue.py:
matmul output tiles) and evaluates the region per tile box:

    ev = Evaluator(kb, region, in_free, step_free)
    srcs = ev.load(boxes)              # each input's box, DMAed (reused when it repeats)
    vals = ev.compute(srcs, free)      # every step, in SBUF, into shared slots
    ev.store(vals, out_box)            # the outputs, DMAed out
    ev.close()

A box is (element offset, DMA pattern ((pstride, parts), free axes...)), one per input.
An input whose free strides are all 0 in a box is one value per partition: loaded as
[p, 1] and used as the TensorScalar operand; an input whose axes are all 0 (a scalar) is
loaded once per kernel. A step whose arguments are all per-partition values is computed
on [p, 1] tiles. Step values share slot buffers by liveness; each slot is a ring of
`STEP_DEPTH` buffers so tile i+1 computes while tile i is stored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from hlo_passes import ir

from .builder import KernelBuilder, Ring, sub
from .errors import LoweringError
from .layout import Axes, row_major
from .tileops import (ACTIVATION, NEEDS_FULL_TILES, NO_INSTRUCTION, TILE_OPS, Src, Step, expand,
                      fill_scalar, row_scratch, scratch, scratch_dtype,
                      scratch_width)

FMAX = 2048          # elements per partition of one elementwise tile
IN_DEPTH, STEP_DEPTH = 3, 2
SCALAR_STEPS = frozenset(ACTIVATION) | {"activation", "activation_row"}   # on ScalarE
IOTA_MARGIN = 16 * 1024   # SBUF bytes per partition left free after a kept iota box
SCRATCH_BYTES = 4    # scratch tiles of multi-instruction ops: FP32 / 32-bit ints, or wider
Box = tuple[int, Axes]          # (element offset, ((pstride, parts), *free axes))


@dataclass(frozen=True)
class IotaTensor(DramTensor):
    """`arange(n)` as a region input that no DMA reads: each box of it is generated
    in SBUF by one GpSimd `iota` (an affine pattern, §6.3), so an iota fused into a
    region (a PRNG's counters, a mask's indices) never reaches HBM."""


@dataclass(frozen=True)
class Input:
    t: DramTensor | None        # None: the caller provides the value (a PSUM tile)
    axes: Axes                  # (stride, num) per region dim; stride 0: broadcast
    dtype: str = ""

    @property
    def is_scalar(self) -> bool:
        return self.t is not None and all(s == 0 for s, _ in self.axes)


@dataclass
class Region:
    shape: tuple[int, ...]
    inputs: list[Input]
    steps: list[Step]
    outputs: list[tuple[int, DramTensor]]   # (value id, where it goes)
    # Steps computing one value per row of a row fusion (rows.py): [P, 1] tiles.
    row_vids: frozenset[int] = frozenset()

    def dtype(self, vid: int) -> str:
        n = len(self.inputs)
        return self.inputs[vid].dtype if vid < n else self.steps[vid - n].dtype

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def views(self) -> list[Axes]:
        """The index space row-major (the outputs' view), then each input's axes."""
        return [row_major(self.shape)] + [i.axes for i in self.inputs]

    def bytes_per_element(self) -> tuple[int, int]:
        """(input bytes, step bytes) per element of a tile, buffers included."""
        ins = sum(IN_DEPTH * _itemsize(i.dtype) for i in self.inputs if i.t is not None)
        nslots = len(set(assign_slots(self).values()))
        return ins, STEP_DEPTH * (nslots * self.max_itemsize() + self.scratch_bytes())

    def scratch_bytes(self) -> int:
        """Per element: the scratch tiles of the step that needs the most (tileops)."""
        return self.scratch_width() * max([scratch(s.kind) for s in self.steps] + [0])

    def scratch_width(self) -> int:
        """Bytes per element of each scratch tile: 4, or more when a step's op works on
        wider integers (64-bit words for trig's argument reduction, tileops/trig.py)."""
        return max([scratch_width(s.kind) for s in self.steps] + [SCRATCH_BYTES])

    def max_itemsize(self) -> int:
        return max([_itemsize(s.dtype) for s in self.steps] +
                   [_itemsize(i.dtype) for i in self.inputs] + [1])


def _itemsize(dtype: str) -> int:
    return max(1, hw_dtypes.itemsize(dtype))


def last_uses(region: Region) -> dict[int, int]:
    """Step index -> index of the last step reading it (outputs live to the end)."""
    n, end = len(region.inputs), len(region.steps)
    last = {j: j for j in range(end)}
    for j, step in enumerate(region.steps):
        for a in step.args:
            if a >= n:
                last[a - n] = max(last[a - n], j)
    for vid, _ in region.outputs:
        if vid >= n:
            last[vid - n] = end
    return last


def assign_slots(region: Region) -> dict[int, int]:
    """Step index -> slot: a slot is reused by the first step after its value's last
    reader (never in place: some ops take two instructions). An output is held until
    its store DMA ends, so it takes a freed slot last written off ScalarE when there is
    one: ScalarE runs ahead of VectorE (balance.py) and would wait for that store when
    it next writes the slot."""
    last, free, slot_of, live, count = last_uses(region), [], {}, [], 0
    n = len(region.inputs)
    outs, writer = {vid for vid, _ in region.outputs}, {}
    for j, step in enumerate(region.steps):
        for entry in [e for e in live if e[1] < j]:
            live.remove(entry)
            free.append(entry[0])
        if step.kind in NO_INSTRUCTION or n + j in region.row_vids:
            continue                # row values live in [P, 1] "sslot" buffers
        if free:
            off = [k for k, s in enumerate(free) if writer[s] not in SCALAR_STEPS]
            slot = free.pop(off[0] if off and n + j in outs else 0)
        else:
            slot, count = count, count + 1
        slot_of[j], writer[slot] = slot, step.kind
        live.append((slot, last[j]))
    return slot_of


class Evaluator:
    """Evaluates `region` per tile box into rings it allocates lazily (see module doc)."""

    def __init__(self, kb: KernelBuilder, region: Region, in_free: int,
                 step_free: int | None = None, depths: tuple[int, int] = (IN_DEPTH, STEP_DEPTH)):
        self.kb, self.region = kb, region
        self.in_depth, self.step_depth = depths     # ring buffers per input / step slot
        self.in_free, self.step_free = in_free, step_free or in_free
        self.slot_of = assign_slots(region)
        # Static per region; asked per step and tile (a 200-op region: quadratic).
        self.max_itemsize, self.scratch_width = region.max_itemsize(), region.scratch_width()
        self.rings: dict[tuple, Ring] = {}
        self.cache: dict[int, tuple[Box, Src]] = {}
        self.turn: dict[tuple, isa.Tile] = {}
        self.consts: dict[tuple, isa.Tile] = {}
        self.iotas: dict[tuple, isa.Tile] = {}      # generated iota boxes kept (`_iota_tile`)
        self.kept: list[isa.Tile] = []
        self.sums: dict[int, isa.Tile] = {}         # row sums an Activation already made
        self.globals = {i: self._load_global(inp) for i, inp in enumerate(region.inputs)
                        if inp.is_scalar and region.size > 1}

    def close(self) -> None:
        self.kb.release(*self.rings.values(), *(s.tile for s in self.globals.values()),
                        *self.consts.values(), *self.kept)

    def _ring(self, key: tuple, depth: int, free: int, dtype: str) -> Ring:
        if key not in self.rings:
            self.rings[key] = self.kb.ring(depth, free, dtype)
        return self.rings[key]

    def _load_global(self, inp: Input) -> Src:
        tile = self.kb.tile(1, inp.dtype)
        self.kb.dma(tile, self.kb.ap(inp.t, 0, ((0, self.kb.target.partitions), (1, 1))))
        return Src.of(tile, scalar=True)

    # --- loads ---------------------------------------------------------------------------

    def load(self, boxes: list[Box | None]) -> list[Src | None]:
        """Each input's box as a Src (None for inputs the caller provides)."""
        return [self._load(i, box) for i, box in enumerate(boxes)]

    def _load(self, i: int, box: Box | None) -> Src | None:
        inp = self.region.inputs[i]
        if inp.t is None or box is None:
            return None
        parts = box[1][0][1]
        if i in self.globals:
            return Src(sub(self.globals[i].tile, parts), True, None, inp.dtype)
        cached = self.cache.get(i)
        if cached is not None and cached[0] == box:
            return cached[1]
        src = self._dma_in(i, inp, box, parts)
        self.cache[i] = (box, src)
        return src

    def _dma_in(self, i: int, inp: Input, box: Box, parts: int) -> Src:
        offset, pattern = box
        free = [n for _, n in pattern[1:]]
        if isinstance(inp.t, IotaTensor):
            return self._generate(i, inp, box, parts, free)
        if math.prod(free) > 1 and all(s == 0 for s, n in pattern[1:] if n > 1):
            tile = sub(self._ring(("col", i), IN_DEPTH, 1, inp.dtype).next(), parts, 1)
            self.kb.dma(tile, self.kb.ap(inp.t, offset, (pattern[0], (1, 1))))
            return Src.of(tile, scalar=True)
        ring = self._ring(("in", i), self.in_depth, self.in_free, inp.dtype)
        tile = sub(ring.next(), parts, tuple(free) or 1)
        self.kb.dma(tile, self.kb.ap(inp.t, offset, pattern))
        return Src.of(sub(tile, free=math.prod(free)))

    def _generate(self, i: int, inp: Input, box: Box, parts: int, free: list[int]) -> Src:
        """The box of an `IotaTensor`: its element offsets are its values."""
        offset, pattern = box
        axes = tuple((s, n) for s, n in pattern[1:]) or ((1, 1),)
        if math.prod(free) > 1 and all(s == 0 for s, n in axes if n > 1):
            tile = sub(self._ring(("col", i), IN_DEPTH, 1, inp.dtype).next(), parts, 1)
            self.kb.emit(isa.Iota, dst=tile, pattern=((1, 1),), offset=offset,
                         channel_multiplier=pattern[0][0])
            return Src.of(tile, scalar=True)
        key = (i, offset, axes, parts, pattern[0][0])
        if key in self.iotas:
            return Src.of(self.iotas[key])
        # An iota varying along every axis (a flat one: hlo_passes linear-iota) never
        # repeats a box: nothing to keep.
        repeats = any(s == 0 for s, n in inp.axes if n > 1)
        tile = self._iota_tile(inp, math.prod(free)) if repeats else None
        kept = tile is not None
        if not kept:
            ring = self._ring(("in", i), self.in_depth, self.in_free, inp.dtype)
            tile = ring.next()
        tile = sub(tile, parts, tuple(free) or 1)
        self.kb.emit(isa.Iota, dst=tile, pattern=axes, offset=offset,
                     channel_multiplier=pattern[0][0])
        src = Src.of(sub(tile, free=math.prod(free)))
        if kept:
            self.iotas[key] = src.tile
        return src

    def _iota_tile(self, inp: Input, size: int) -> isa.Tile | None:
        """A tile of its own for a generated iota box, kept for the region's later boxes
        with the same values (an iota varies along few axes: one-hot labels' column
        indices repeat for every 128 rows, and GpSimd, sharing VectorE's SBUF port,
        paid one iota per box: 965 us of an LM's cross-entropy gradient); None when
        SBUF above the kernel's live tiles is short of IOTA_MARGIN after it."""
        top = max((off + n for off, n in self.kb.sbuf.live.items()), default=0)
        need = size * hw_dtypes.itemsize(inp.dtype)
        if self.kb.sbuf.capacity - top - need < IOTA_MARGIN:
            return None
        tile = self.kb.tile(size, inp.dtype)
        self.kept.append(tile)
        return tile

    # --- compute ---------------------------------------------------------------------------

    def compute(self, srcs: list[Src | None], parts: int, free: int, at: int = 0,
                dsts: dict[int, isa.Tile] | None = None,
                preset: dict[int, Src] | None = None) -> list[Src]:
        """Runs every step on [parts, free] tiles; input tiles are taken `at` elements
        into their box; `preset` gives inputs the caller provides (by value id), `dsts`
        pins a step value to a given tile."""
        vals = [self._window(s, parts, free, at) for s in srcs]
        for vid, src in (preset or {}).items():
            vals[vid] = src
        self._rotate()
        n = len(self.region.inputs)
        for j, step in enumerate(self.region.steps):
            vals.append(self._step(j, step, [vals[a] for a in step.args], parts, free,
                                   (dsts or {}).get(n + j)))
        return vals

    @staticmethod
    def _window(src: Src | None, parts: int, free: int, at: int) -> Src | None:
        if src is None or src.scalar or (at == 0 and src.tile.free_size == free):
            return src
        return Src.of(sub(src.tile, parts, free, at=at))

    def _rotate(self) -> None:
        """Every slot ring moves to its next buffer once per box."""
        self.turn = {key: ring.next() for key, ring in self.rings.items()
                     if key[0] in ("slot", "sslot")}

    def _buffer(self, key: tuple, free: int, dtype: str, parts: int,
                itemsize: int | None = None) -> isa.Tile:
        if key not in self.turn:
            width = self.step_free if key[0] == "slot" else 1
            width *= itemsize or self.max_itemsize
            self.turn[key] = self._ring(key, self.step_depth, width, "uint8").next()
        return sub(self.turn[key].with_(dtype=dtype, free=(free,)), parts, free)

    def _step(self, j: int, step: Step, args: list[Src], parts: int, free: int,
              pinned: isa.Tile | None) -> Src | None:
        if step.kind == "constant":
            return Src.immediate(step.attrs["value"], step.dtype)
        if step.kind == "folded":
            return None
        if step.kind == "row_reduce":
            return self._row_reduce(j, step, args[0], parts)
        if step.kind == "multiply" and step.args[0] == step.args[1] and \
                not args[0].scalar and args[0].tile.mem == "sbuf" and \
                ir.is_float(step.dtype) and "sum_into" not in step.attrs:
            return self._on_scalar(j, step, args[0], "square", 1.0, parts, free, pinned)
        if "sum_into" in step.attrs and pinned is None:
            done = self._product_sum(j, step, args, parts, free)
            if done is not None:
                return done
        if step.kind == "activation" and step.attrs["bias"] is not None:
            args = args + [self._const(step.attrs["bias"], parts)]
        if all(a.scalar for a in args):
            return self._scalar_step(j, step, args, parts, free, pinned)
        if step.kind in NEEDS_FULL_TILES:
            args = [self._full(a, parts, free, (j, k)) for k, a in enumerate(args)]
        args = args + self._scratch(step, args, parts, free, "slot")
        dst = pinned if pinned is not None else \
            self._buffer(("slot", self.slot_of[j]), free, step.dtype, parts)
        TILE_OPS[step.kind].emit(self.kb, dst, args, step)
        return Src.of(dst)

    def _row_reduce(self, j: int, step: Step, arg: Src, parts: int) -> Src:
        """A row fusion's reduction of a [P, F] tile along F: one TensorReduce on
        VectorE (FP32 inside, §2.3) into a [P, 1] value, or the sum the product's
        Activation made (`_product_sum`)."""
        n = len(self.region.inputs)
        done = self.sums.pop(n + j, None)
        if done is not None:
            if step.attrs.get("negate", False):
                self.kb.emit(isa.TensorScalar, dst=done, data=done, op0="multiply",
                             operand0=-1.0)
            return Src.of(done, scalar=True)
        if arg.scalar:
            raise LoweringError("a row reduction of a value that is already one per row")
        dst = self._buffer(("sslot", j), 1, step.dtype, parts)
        self.kb.emit(isa.TensorReduce, dst=dst, data=arg.tile, op=step.attrs["alu"],
                     negate=step.attrs.get("negate", False))
        return Src.of(dst, scalar=True)

    def _on_scalar(self, j: int, step: Step, x: Src, func: str, scale, parts: int,
                   free: int, pinned: isa.Tile | None = None,
                   reduce_res: isa.Tile | None = None) -> Src:
        """A multiply as one ScalarE Activation (§2.4: FP32 inside, rounded once to the
        step's type, as the VectorE multiply): x * x as `square` (GELU's x^2 and x^3
        leave VectorE, which bounds those chains, for ScalarE, which has only the
        tanh), x * c as `copy` with scale c; with `reduce_res`, also the row's sum."""
        dst = pinned if pinned is not None else \
            self._buffer(("slot", self.slot_of[j]), free, step.dtype, parts)
        self.kb.emit(isa.Activation, dst=dst, data=x.tile, func=func, scale=scale,
                     reduce_res=reduce_res)
        return Src.of(dst)

    def _product_sum(self, j: int, step: Step, args: list[Src], parts: int,
                     free: int) -> Src | None:
        """x * c (c an immediate or FP32 [P, 1]) or x * x as one ScalarE Activation
        (copy with scale c, or square) that also adds the row up into the [P, 1] tile
        of the reduction `sum_into` (rows.py `_sums_on_scalar`); None when the operands
        do not allow it (the multiply then runs as usual)."""
        a, b = args
        if a.scalar and not b.scalar:
            a, b = b, a
        square = a == b and not a.scalar
        if a.scalar or not (square or b.scalar and (b.imm is not None or
                                                    b.tile.dtype == "float32")):
            return None
        r = step.attrs["sum_into"] - len(self.region.inputs)
        row = self._buffer(("sslot", r), 1, "float32", parts)
        self.sums[step.attrs["sum_into"]] = row
        scale = 1.0 if square else float(b.imm) if b.imm is not None else b.tile
        return self._on_scalar(j, step, a, "square" if square else "copy", scale, parts,
                               free, reduce_res=row)

    def _scalar_step(self, j, step, args, parts, free, pinned) -> Src:
        """All arguments are per-partition: compute on [parts, 1]."""
        args = [self._materialize(a, parts, (j, k)) for k, a in enumerate(args)]
        args = args + self._scratch(step, args, parts, 1, "sslot")
        dst = self._buffer(("sslot", j), 1, step.dtype, parts)
        TILE_OPS[step.kind].emit(self.kb, dst, args, step)
        if pinned is None:
            return Src.of(dst, scalar=True)
        return Src.of(expand(self.kb, Src.of(dst, scalar=True), pinned))

    def _scratch(self, step: Step, args: list[Src], parts: int, free: int,
                 slot: str) -> list[Src]:
        """The scratch tiles a multi-instruction op takes after its operands, then its
        [parts, 1] FP32 ones (`tileops.row_scratch`)."""
        dtype = scratch_dtype(args[0].dtype)
        width = self.scratch_width
        return [Src.of(self._buffer((slot, "scratch", k), free, dtype, parts, width))
                for k in range(scratch(step.kind))] + \
            [Src.of(self._buffer(("sslot", "row", k), 1, "float32", parts, 4), scalar=True)
             for k in range(row_scratch(step.kind))]

    def _const(self, value: float, parts: int) -> Src:
        """A [P, 1] FP32 tile of `value`, written once per kernel (an Activation bias
        is a per-partition tile, §2.4)."""
        key = ("const", float(value))
        if key not in self.consts:
            self.consts[key] = fill_scalar(self.kb, self.kb.tile(1, "float32"), value)
        return Src.of(sub(self.consts[key], parts), scalar=True)

    def _materialize(self, a: Src, parts: int, key) -> Src:
        if a.imm is None:
            return a
        tile = self._buffer(("sslot", "imm", *key), 1, a.dtype, parts)
        return Src.of(fill_scalar(self.kb, tile, a.imm), scalar=True)

    def _full(self, a: Src, parts: int, free: int, key) -> Src:
        if not a.scalar:
            return a
        dst = self._buffer(("slot", "x", *key), free, a.dtype, parts)
        return Src.of(expand(self.kb, a, dst))

    # --- stores ------------------------------------------------------------------------------

    def store(self, vals: list[Src], box: Box, free: int) -> None:
        """DMAs every output value to its tensor at `box` (region space, row-major)."""
        offset, pattern = box
        parts = pattern[0][1]
        for vid, out in self.region.outputs:
            if vid in self.region.row_vids:
                continue                # a row fusion stores those itself (rows.py)
            src = vals[vid]
            if src.scalar:
                src = self._full(src, parts, free, ("out", vid))
            self.kb.dma(self.kb.ap(out, offset, pattern), src.tile)
