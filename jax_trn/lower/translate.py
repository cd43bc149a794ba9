"""A `fusion` op's region as the lowering sees it: a `regions.Region` plus its root.

    plan = translate(op, ins, outs)     # FusionPlan(kind, region, reduce, dot, ops)

Block arguments are the fusion's inputs (DRAM tensors `ins`). Inside the region:

- broadcast_in_dim / reshape of an input are views: `axes` over the region's index
  space, stride 0 along broadcast dims; a broadcast of a broadcast is one view;
- splat constants are immediates ("constant" steps); an iota is a view of arange(n)
  that the evaluator generates per box (`regions.IotaTensor`), never read from HBM;
- elementwise ops are steps, on values of the region's shape (or scalars);
- the root is a reduce (`ReduceRoot`: the reduced value, its init, dims, combiner) or a
  dot_general (`DotRoot`): its value is an `Input` with no tensor, the matmul's PSUM
  tile, provided per output tile by the epilogue;
- in a "rows" fusion (hlo_passes/fusion_rows.py, `row_axes` = k) a reduce over the
  last k axes is a "row_reduce" step (its init, unless the combiner's identity, one
  more step) and every value of a row shape (S[:-k], or with k trailing 1s) is one
  value per row: its views are the value itself, an input of a row shape is read with
  stride 0 along the row axes, and `Region.row_vids` lists the computed ones.

Anything else raises `Unsupported`; the driver then lowers the region's ops one by one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hlo_passes import ir
from jax_trn.hw.program import DramTensor

from .errors import LoweringError
from .layout import row_major
from .reduce import COMBINERS, combiner, is_identity
from .regions import Input, IotaTensor, Region
from .tileops import TILE_OPS, Step
from .registry import op_label as _label

VIEW_KINDS = ("broadcast_in_dim", "reshape")
_ALU_STEP = {alu: kind for kind, alu in COMBINERS.items()}     # "max" -> "maximum"


class Unsupported(LoweringError):
    """A fusion this lowering cannot emit as one kernel (the driver falls back)."""


@dataclass
class ReduceRoot:
    vid: int                        # the reduced value
    init: Any                       # DramTensor, or an immediate
    dimensions: tuple[int, ...]
    alu: str


@dataclass
class DotRoot:
    vid: int                        # the Input standing for the PSUM tile
    op: ir.Op
    lhs: DramTensor
    rhs: DramTensor


@dataclass
class FusionPlan:
    kind: str
    region: Region
    reduce: ReduceRoot | None = None
    dot: DotRoot | None = None
    ops: list[str] = field(default_factory=list)     # "add at f.py:3", in order


@dataclass(frozen=True)
class _View:
    t: DramTensor
    axes: tuple                     # over the value's own shape


@dataclass(frozen=True)
class _Imm:
    value: Any
    dtype: str


def translate(op: ir.Op, ins: list[DramTensor], outs: list[DramTensor]) -> FusionPlan:
    return _Translator(op, ins).run(outs)



DMA_CASTS = frozenset({"float32", "bfloat16", "float16"})   # exact or RNE (§3.4)


class _Translator:
    def __init__(self, op: ir.Op, ins: list[DramTensor]):
        self.op, self.block = op, op.regions[0].block
        self.kind = op.attrs.get("fusion_kind", "loop")
        self.row_axes = op.attrs.get("row_axes", 0) if self.kind == "rows" else 0
        self.row_refs: set[tuple] = set()
        self.env: dict[ir.Value, Any] = {a: _View(t, row_major(t.shape))
                                         for a, t in zip(self.block.args, ins)}
        self.shape = self._shape()
        self.inputs: list[Input] = []
        self.steps: list[tuple[str, tuple, str, dict]] = []   # args as refs
        self.outputs: list[tuple[tuple, DramTensor]] = []
        self.reduce: tuple | None = None
        self.dot: tuple | None = None
        self.ops: list[str] = []
        self._inputs: dict[tuple, tuple] = {}
        self._imms: dict[tuple, tuple] = {}

    def _shape(self) -> tuple[int, ...]:
        for o in self.block.ops:
            if o.kind == "reduce" and self.kind == "reduction":
                return tuple(o.operands[0].shape)
            if o.kind == "dot_general" and self.kind == "matmul_epilogue":
                return tuple(o.result.shape)
        return tuple(self.block.terminator.operands[0].shape)

    def run(self, outs: list[DramTensor]) -> FusionPlan:
        for o in self.block.ops[:-1]:
            if o.kind != "constant":
                self.ops.append(_label(o))
            self._op(o)
        self._outputs(outs)
        return self._plan()

    def _plan(self) -> FusionPlan:
        """Value ids: inputs first, then steps (refs are ("in", k) / ("st", j))."""
        n = len(self.inputs)

        def vid(ref: tuple) -> int:
            return ref[1] if ref[0] == "in" else n + ref[1]
        steps = [Step(k, tuple(vid(a) for a in args), dt, attrs)
                 for k, args, dt, attrs in self.steps]
        region = Region(self.shape, self.inputs, steps,
                        [(vid(r), out) for r, out in self.outputs],
                        frozenset(vid(r) for r in self.row_refs))
        plan = FusionPlan(self.kind, region, ops=self.ops)
        if self.reduce:
            ref, init, dims, alu = self.reduce
            plan.reduce = ReduceRoot(vid(ref), init, dims, alu)
        if self.dot:
            ref, o, lhs, rhs = self.dot
            plan.dot = DotRoot(vid(ref), o, lhs, rhs)
        return plan

    # --- ops ------------------------------------------------------------------------------

    def _op(self, o: ir.Op) -> None:
        if o.kind == "constant":
            self.env[o.result] = _constant(o)
        elif o.kind == "iota":
            self.env[o.result] = _iota(o)
        elif o.kind in VIEW_KINDS:
            self.env[o.result] = self._view(o, self.env[o.operands[0]])
        elif o.kind == "dot_general" and self.kind == "matmul_epilogue":
            self._dot(o)
        elif o.kind == "reduce" and self.kind == "reduction":
            self._reduce(o)
        elif o.kind == "reduce" and self.row_axes:
            self._row_reduce(o)
        elif o.kind in TILE_OPS:
            self._step(o)
        else:
            raise Unsupported(f"{o.kind} inside a {self.kind} fusion")

    def _view(self, o: ir.Op, entry) -> Any:
        if isinstance(entry, _Imm):
            return entry
        if entry in self.row_refs:
            return entry                # one value per row, whatever its row shape
        if not isinstance(entry, _View):
            raise Unsupported(f"{o.kind} of a computed value")
        src, out = tuple(o.operands[0].shape), tuple(o.result.shape)
        if o.kind == "broadcast_in_dim":
            strides = [0] * len(out)
            for i, j in enumerate(o.attrs["broadcast_dimensions"]):
                if src[i] == out[j]:
                    strides[j] = entry.axes[i][0]
            return _View(entry.t, tuple(zip(strides, out)))
        if all(s == 0 for s, _ in entry.axes):
            return _View(entry.t, tuple((0, n) for n in out))
        if entry.axes == row_major(src):
            return _View(entry.t, row_major(out))
        raise Unsupported("reshape of a broadcast view")

    def _step(self, o: ir.Op) -> None:
        cast = self._cast_input(o)
        if cast is not None:
            self.env[o.result] = cast
            return
        row = self._is_row(o.result)
        if tuple(o.result.shape) != self.shape and not row:
            raise Unsupported(f"{o.kind} of shape {o.result.type} in a region of "
                              f"shape {list(self.shape)}")
        args = tuple(self._vid(v) for v in o.operands)
        ref = self._append(o.kind, args, o.result.dtype, dict(o.attrs))
        if row:
            self.row_refs.add(ref)
        self.env[o.result] = ref

    def _is_row(self, v: ir.Value) -> bool:
        """Whether `v` has a row shape of a "rows" fusion (S[:-k] or S[:-k] + 1s)."""
        if not self.row_axes:
            return False
        lead = self.shape[:len(self.shape) - self.row_axes]
        return tuple(v.shape) in (lead, lead + (1,) * self.row_axes)

    def _cast_input(self, o: ir.Op) -> tuple | None:
        """A convert between 16/32-bit floats of a broadcast input (a LayerNorm gain
        cast to f32, a bias cast to bf16): the input is DMAed in the target type (the
        DMA casts through FP32 with RNE, §3.4, as the convert rounds) instead of
        converted per element of the region."""
        if o.kind != "convert" or tuple(o.result.shape) != self.shape:
            return None
        entry = self.env[o.operands[0]]
        src, dst = o.operands[0].dtype, o.result.dtype
        if not isinstance(entry, _View) or not {src, dst} <= DMA_CASTS or \
                tuple(o.operands[0].shape) != self.shape or \
                all(st != 0 for st, _ in entry.axes):
            return None
        return self._input(Input(entry.t, entry.axes, dst))

    def _append(self, kind: str, args: tuple, dtype: str, attrs: dict) -> tuple:
        self.steps.append((kind, args, dtype, attrs))
        return ("st", len(self.steps) - 1)

    def _vid(self, v: ir.Value) -> tuple:
        entry = self.env[v]
        if isinstance(entry, tuple):
            return entry
        if isinstance(entry, _Imm):
            return self._imm(entry)
        if tuple(v.shape) == self.shape:
            axes = entry.axes
        elif v.shape == ():
            axes = tuple((0, n) for n in self.shape)
        elif self._is_row(v):            # one value per row: stride 0 along the row
            lead = len(self.shape) - self.row_axes
            axes = tuple(entry.axes[:lead]) + tuple((0, n) for n in self.shape[lead:])
        else:
            raise Unsupported(f"operand {v.type} in a region of shape {list(self.shape)}")
        return self._input(Input(entry.t, axes, entry.t.dtype))

    def _input(self, inp: Input) -> tuple:
        key = (inp.t.name if inp.t else None, inp.axes, inp.dtype)
        if key not in self._inputs:
            self.inputs.append(inp)
            self._inputs[key] = ("in", len(self.inputs) - 1)
        return self._inputs[key]

    def _imm(self, imm: _Imm) -> tuple:
        key = (repr(imm.value), imm.dtype)
        if key not in self._imms:
            self._imms[key] = self._append("constant", (), imm.dtype, {"value": imm.value})
        return self._imms[key]

    # --- roots ------------------------------------------------------------------------------

    def _dot(self, o: ir.Op) -> None:
        lhs, rhs = (self._plain(v) for v in o.operands)
        ref = self._input(Input(None, row_major(self.shape), o.result.dtype))
        self.dot = (ref, o, lhs, rhs)
        self.env[o.result] = ref

    def _plain(self, v: ir.Value) -> DramTensor:
        entry = self.env[v]
        if not isinstance(entry, _View) or entry.axes != row_major(entry.t.shape) \
                or tuple(entry.t.shape) != tuple(v.shape):
            raise Unsupported("a dot_general operand that is not a stored tensor")
        return entry.t

    def _reduce(self, o: ir.Op) -> None:
        x, init = o.operands
        ref = self._vid(x)
        entry = self.env[init]
        if isinstance(entry, _Imm):
            value = entry.value
        elif isinstance(entry, _View) and init.shape == ():
            value = entry.t
        else:
            raise Unsupported("a reduce init that is not a scalar")
        alu = combiner(o, x.dtype)
        self.reduce = (ref, value, tuple(o.attrs["dimensions"]), alu)
        self.env[o.result] = "reduced"

    def _row_reduce(self, o: ir.Op) -> None:
        """A reduce over the row axes: one value per row ("row_reduce", FP32 inside the
        engine, §2.3), then its init when that is not the combiner's identity."""
        x, init = o.operands
        alu = combiner(o, x.dtype)
        ref = self._append("row_reduce", (self._vid(x),), o.result.dtype, {"alu": alu})
        self.row_refs.add(ref)
        entry = self.env[init]
        if not isinstance(entry, _Imm) and not (isinstance(entry, _View) and
                                                init.shape == ()):
            raise Unsupported("a reduce init that is not a scalar")
        if not (isinstance(entry, _Imm) and is_identity(entry.value, alu, x.dtype)):
            ref = self._append(_ALU_STEP[alu], (ref, self._vid(init)), o.result.dtype, {})
            self.row_refs.add(ref)
        self.env[o.result] = ref

    def _outputs(self, outs: list[DramTensor]) -> None:
        for v, out in zip(self.block.terminator.operands, outs):
            entry = self.env[v]
            if entry == "reduced":
                continue
            if not isinstance(entry, tuple) or entry[0] != "st":
                raise Unsupported("a fusion result that is not computed in the region")
            self.outputs.append((entry, out))


def _iota(o: ir.Op) -> _View:
    """An iota as a view of `arange(n)` (stride 1 along its dimension, 0 elsewhere),
    generated per box in SBUF (`regions.IotaTensor`)."""
    shape, dim = tuple(o.result.shape), o.attrs["iota_dimension"]
    t = IotaTensor(f"iota:{shape[dim]}:{o.result.dtype}", (shape[dim],), o.result.dtype)
    return _View(t, tuple((1 if d == dim else 0, n) for d, n in enumerate(shape)))


def _constant(o: ir.Op) -> _Imm:
    value = np.ascontiguousarray(o.attrs["value"]).reshape(-1)
    if value.size == 0:
        raise Unsupported("an empty constant inside the region")
    as_bytes = value.view(np.uint8).reshape(value.size, -1)
    if not (as_bytes == as_bytes[0]).all():
        raise Unsupported("a non-splat constant inside the region")
    item = value[0].item()
    return _Imm(int(item) if isinstance(item, bool) else item, o.result.dtype)
