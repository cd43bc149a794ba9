"""Elementwise ops: one generic rule over a *region* of elementwise steps.

A `Region` is a small dataflow program over same-shaped tensors: inputs (in DRAM),
steps (one elementwise op each, reading inputs or earlier steps) and outputs. The
region's flat index space is tiled as [128, F] blocks plus an [r, 1] tail
(`layout.flat_tiles`); per tile the inputs are DMAed into SBUF ring buffers, every step
runs on its engine, and the outputs are DMAed back. Today each op is a region of one
step; the fusion pass will hand us bigger regions through the same `emit_region`.

Engines (trainium-hardware.md §2.3-2.5, §6.2): transcendental functions run on ScalarE
(`Activation`), arithmetic on VectorE (`TensorTensor`, `TensorScalar`), both computing in
FP32 and casting on output, so a bf16 add is bf16(f32(a) + f32(b)), XLA's CPU result for
a single op. Integer arithmetic runs natively on GpSimd, and `power` always runs there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .layout import P, flat_tiles
from .registry import LowerCtx, register_lowering

FMAX = 2048          # elements per partition of one elementwise tile
MIN_FREE = 512       # below this a DMA moves < 2 KiB per partition (§3.4): prefer fewer tiles
IN_DEPTH, STEP_DEPTH = 3, 2

ALU = {"add": "add", "subtract": "subtract", "multiply": "multiply", "divide": "divide",
       "maximum": "max", "minimum": "min", "power": "power", "remainder": "remainder",
       "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor",
       "shift_left": "shift_left", "shift_right_logical": "shift_right_logical",
       "shift_right_arithmetic": "shift_right_arithmetic"}
BOOL_ALU = {"and": "min", "or": "max", "xor": "not_equal", "maximum": "max", "minimum": "min"}
ACTIVATION = {"exponential": "exp", "log": "log", "tanh": "tanh", "logistic": "sigmoid",
              "sqrt": "sqrt", "rsqrt": "rsqrt", "sign": "sign"}
COMPARE = {"EQ": "is_equal", "NE": "not_equal", "LT": "is_lt", "LE": "is_le",
           "GT": "is_gt", "GE": "is_ge"}


@dataclass(frozen=True)
class Step:
    kind: str                       # op kind: "add", "exponential", "convert", ...
    args: tuple[int, ...]           # region value ids: inputs first, then steps
    dtype: str                      # result element type
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class Region:
    shape: tuple[int, ...]
    inputs: list[DramTensor]        # each of `shape`, or shape () (broadcast scalar)
    steps: list[Step]
    outputs: list[tuple[int, DramTensor]]   # (value id, where it goes)

    def dtype(self, vid: int) -> str:
        n = len(self.inputs)
        return self.inputs[vid].dtype if vid < n else self.steps[vid - n].dtype

    def is_scalar(self, vid: int) -> bool:
        return vid < len(self.inputs) and self.inputs[vid].shape == () and self.shape != ()


# --- tile-level ops -------------------------------------------------------------------

@dataclass(frozen=True)
class Src:
    tile: isa.Tile
    scalar: bool = False            # a [P, 1] broadcast of one value


def _engine(dtype: str) -> str:
    return "gpsimd" if ir.is_int(dtype) else "vector"


def _binary(kb: KernelBuilder, dst: isa.Tile, a: Src, b: Src, op: str, engine: str):
    if a.scalar:
        return kb.emit(isa.TensorScalar, dst=dst, data=b.tile, op0=op, operand0=a.tile,
                       reverse0=True, engine=engine)
    if b.scalar:
        return kb.emit(isa.TensorScalar, dst=dst, data=a.tile, op0=op, operand0=b.tile,
                       engine=engine)
    return kb.emit(isa.TensorTensor, dst=dst, data1=a.tile, data2=b.tile, op=op,
                   engine=engine)


def _alu(kb, dst, srcs, step):
    dtype = srcs[0].tile.dtype
    if dtype == "bool" and step.kind in BOOL_ALU:
        return _binary(kb, dst, *srcs, BOOL_ALU[step.kind], "vector")
    engine = "gpsimd" if step.kind == "power" else _engine(dtype)
    return _binary(kb, dst, *srcs, ALU[step.kind], engine)


def _compare(kb, dst, srcs, step):
    op = COMPARE[step.attrs["comparison_direction"]]
    return _binary(kb, dst, *srcs, op, _engine(srcs[0].tile.dtype))


def _activation(kb, dst, srcs, step):
    return kb.emit(isa.Activation, dst=dst, data=srcs[0].tile, func=ACTIVATION[step.kind])


def _negate(kb, dst, srcs, step):
    x = srcs[0].tile
    if ir.is_int(x.dtype):      # 0 - x, wrapping like XLA
        return kb.emit(isa.TensorScalar, dst=dst, data=x, op0="subtract", operand0=0,
                       reverse0=True, engine="gpsimd")
    return kb.emit(isa.TensorScalar, dst=dst, data=x, op0="multiply", operand0=-1.0)


def _abs(kb, dst, srcs, step):
    x = srcs[0].tile
    if ir.is_int(x.dtype):      # abs_max(x, 0) = |x|
        return kb.emit(isa.TensorScalar, dst=dst, data=x, op0="abs_max", operand0=0,
                       engine="gpsimd")
    return kb.emit(isa.Activation, dst=dst, data=x, func="abs")


def _not(kb, dst, srcs, step):
    x = srcs[0].tile
    if x.dtype == "bool":
        return kb.emit(isa.TensorScalar, dst=dst, data=x, op0="is_equal", operand0=0)
    return kb.emit(isa.TensorScalar, dst=dst, data=x, op0="bitwise_xor", operand0=-1,
                   engine="gpsimd")


def _convert(kb, dst, srcs, step):
    x = srcs[0].tile
    if dst.dtype == "bool" and x.dtype != "bool":   # x != 0
        return kb.emit(isa.TensorScalar, dst=dst, data=x, op0="not_equal", operand0=0,
                       engine=_engine(x.dtype))
    both_int = not ir.is_float(x.dtype) and not ir.is_float(dst.dtype)
    return kb.emit(isa.TensorCopy, dst=dst, src=x, engine="gpsimd" if both_int else "vector")


def _select(kb, dst, srcs, step):
    pred, on_true, on_false = (s.tile for s in srcs)
    return kb.emit(isa.Select, dst=dst, pred=pred, on_true=on_true, on_false=on_false,
                   engine=_engine(dst.dtype))


def _clamp(kb, dst, srcs, step):
    lo, x, hi = srcs
    engine = _engine(x.tile.dtype)
    if lo.scalar and hi.scalar:
        return kb.emit(isa.TensorScalar, dst=dst, data=x.tile, op0="max", operand0=lo.tile,
                       op1="min", operand1=hi.tile, engine=engine)
    _binary(kb, dst, x, lo, "max", engine)
    return _binary(kb, dst, Src(dst), hi, "min", engine)


TileOp = Callable[[KernelBuilder, isa.Tile, list[Src], Step], Any]
TILE_OPS: dict[str, TileOp] = {
    **{k: _alu for k in ALU}, **{k: _activation for k in ACTIVATION},
    "compare": _compare, "negate": _negate, "abs": _abs, "not": _not,
    "convert": _convert, "select": _select, "clamp": _clamp,
}


# --- the region emitter -----------------------------------------------------------------

def emit_region(kb: KernelBuilder, region: Region) -> int:
    """Emits the tiled loop of `region` into `kb`; returns its FLOP count."""
    n = math.prod(region.shape)
    if n == 0:
        return 0
    scalars = {i: _load_scalar(kb, t) for i, t in enumerate(region.inputs)
               if region.is_scalar(i)}
    blocks = flat_tiles(n, _free_size(kb, region, n // P))
    rings = _rings(kb, region, max(t.free for t in blocks), scalars)
    for t in blocks:
        _emit_tile(kb, region, t, rings, scalars)
    kb.release(*rings.values(), *scalars.values())
    return n * len(region.steps)


def _free_size(kb: KernelBuilder, region: Region, cols: int) -> int:
    """F of the [128, F] tiles: what fits half of SBUF, at least 4 tiles when large."""
    per_elem = sum(IN_DEPTH * _itemsize(t.dtype) for t in region.inputs)
    per_elem += sum(STEP_DEPTH * _itemsize(s.dtype) for s in region.steps)
    fit = max(1, (kb.limits.sbuf_bytes // 2) // per_elem)
    return max(1, min(FMAX, fit, max(MIN_FREE, -(-cols // 4))))


def _itemsize(dtype: str) -> int:
    return ir.np_dtype(dtype).itemsize


def _rings(kb, region, free, scalars) -> dict:
    rings = {i: kb.ring(IN_DEPTH, free, t.dtype) for i, t in enumerate(region.inputs)
             if i not in scalars}
    base = len(region.inputs)
    rings.update({base + j: kb.ring(STEP_DEPTH, free, s.dtype)
                  for j, s in enumerate(region.steps)})
    return rings


def _load_scalar(kb: KernelBuilder, t: DramTensor) -> isa.Tile:
    """Broadcasts a rank-0 tensor to a [128, 1] tile (a stride-0 partition pattern)."""
    tile = kb.tile(1, t.dtype)
    kb.dma(tile, kb.ap(t, 0, ((0, P), (1, 1))))
    return tile


def _emit_tile(kb, region, t, rings, scalars) -> None:
    vals: list[Src] = []
    for i, inp in enumerate(region.inputs):
        if i in scalars:
            vals.append(Src(sub(scalars[i], t.parts), scalar=True))
            continue
        tile = sub(rings[i].next(), t.parts, t.free)
        kb.dma(tile, kb.ap(inp, t.offset, t.pattern))
        vals.append(Src(tile))
    for j, step in enumerate(region.steps):
        dst = sub(rings[len(region.inputs) + j].next(), t.parts, t.free)
        TILE_OPS[step.kind](kb, dst, [vals[a] for a in step.args], step)
        vals.append(Src(dst))
    for vid, out in region.outputs:
        kb.dma(kb.ap(out, t.offset, t.pattern), vals[vid].tile)


# --- rules -------------------------------------------------------------------------------

def single_op_region(ctx: LowerCtx, kind: str, operands, attrs) -> Region:
    step = Step(kind, tuple(range(len(operands))), ctx.outs[0].dtype, dict(attrs))
    return Region(tuple(ctx.outs[0].shape), list(operands), [step],
                  [(len(operands), ctx.outs[0])])


def _elementwise(kind: str, ctx: LowerCtx, *operands: DramTensor, **attrs) -> None:
    ctx.kb.flops += emit_region(ctx.kb, single_op_region(ctx, kind, operands, attrs))


for _kind in TILE_OPS:
    register_lowering(_kind)(partial(_elementwise, _kind))
