"""Tile-level elementwise ops: one IR elementwise op on SBUF/PSUM tiles, as instructions.

`TILE_OPS[kind](kb, dst, srcs, step)` emits the instruction(s) computing `step` into
`dst` from `srcs`. A `Src` is a tile, or a per-partition value (`scalar`: a [P, 1] tile
or an immediate `imm`) broadcast along the free axis, which binary ops take as the
`TensorScalar` operand.

Engines (trainium-hardware.md §2.3-2.5, §6.2): transcendental functions run on ScalarE
(`Activation`), arithmetic on VectorE (`TensorTensor`, `TensorScalar`), both computing in
FP32 and casting on output, so a bf16 add is bf16(f32(a) + f32(b)), XLA's CPU result for
a single op. Integer arithmetic runs natively on GpSimd, and `power` always runs there.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from hlo_passes import ir
from jax_trn.hw import isa

from .builder import KernelBuilder

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


@dataclass(frozen=True)
class Src:
    tile: isa.Tile | None           # None for an immediate
    scalar: bool = False            # one value per partition, broadcast along F
    imm: float | int | None = None  # an immediate (then `scalar`)
    dtype: str = ""

    @classmethod
    def of(cls, tile: isa.Tile, scalar: bool = False) -> "Src":
        return cls(tile, scalar, None, tile.dtype)

    @classmethod
    def immediate(cls, value, dtype: str) -> "Src":
        return cls(None, True, value, dtype)

    @property
    def operand(self):
        """What a TensorScalar takes: the immediate, or the [P, 1] tile."""
        return self.imm if self.imm is not None else self.tile


def engine_for(dtype: str) -> str:
    return "gpsimd" if ir.is_int(dtype) else "vector"


def _binary(kb: KernelBuilder, dst: isa.Tile, a: Src, b: Src, op: str, engine: str):
    """a <op> b: a per-partition operand is the TensorScalar operand (reversed for a)."""
    if b.scalar and a.tile is not None:
        return kb.emit(isa.TensorScalar, dst=dst, data=a.tile, op0=op, operand0=b.operand,
                       engine=engine)
    if a.scalar:
        return kb.emit(isa.TensorScalar, dst=dst, data=b.tile, op0=op, operand0=a.operand,
                       reverse0=True, engine=engine)
    return kb.emit(isa.TensorTensor, dst=dst, data1=a.tile, data2=b.tile, op=op,
                   engine=engine)


def _alu(kb, dst, srcs, step):
    dtype = srcs[0].dtype
    if dtype == "bool" and step.kind in BOOL_ALU:
        return _binary(kb, dst, *srcs, BOOL_ALU[step.kind], "vector")
    if step.kind == "shift_right_arithmetic" and dtype.startswith("uint"):
        return _shift_unsigned_arithmetic(kb, dst, *srcs)
    engine = "gpsimd" if step.kind == "power" else engine_for(dtype)
    return _binary(kb, dst, *srcs, ALU[step.kind], engine)


def _shift_unsigned_arithmetic(kb, dst, x: Src, amount: Src):
    """XLA shifts the bits arithmetically whatever the type: the value and result are
    read as the signed type of the same width (SBUF is untyped, §3.1); the amount
    stays unsigned."""
    signed = dst.dtype[1:]
    return _binary(kb, dst.with_(dtype=signed), _as_signed(x, signed), amount,
                   "shift_right_arithmetic", "gpsimd")


def _as_signed(src: Src, signed: str) -> Src:
    """The same bits as the signed type `signed`."""
    if src.imm is None:
        return Src(src.tile.with_(dtype=signed), src.scalar, None, signed)
    half = 1 << (8 * ir.np_dtype(signed).itemsize - 1)
    v = int(src.imm)
    return Src.immediate(v - 2 * half if v >= half else v, signed)


def _compare(kb, dst, srcs, step):
    op = COMPARE[step.attrs["comparison_direction"]]
    return _binary(kb, dst, *srcs, op, engine_for(srcs[0].dtype))


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
                       engine=engine_for(x.dtype))
    both_int = not ir.is_float(x.dtype) and not ir.is_float(dst.dtype)
    return kb.emit(isa.TensorCopy, dst=dst, src=x, engine="gpsimd" if both_int else "vector")


def _select(kb, dst, srcs, step):
    pred, on_true, on_false = (s.tile for s in srcs)
    return kb.emit(isa.Select, dst=dst, pred=pred, on_true=on_true, on_false=on_false,
                   engine=engine_for(dst.dtype))


def _clamp(kb, dst, srcs, step):
    lo, x, hi = srcs
    engine = engine_for(x.dtype)
    if lo.scalar and hi.scalar and not x.scalar:
        return kb.emit(isa.TensorScalar, dst=dst, data=x.tile, op0="max", operand0=lo.operand,
                       op1="min", operand1=hi.operand, engine=engine)
    _binary(kb, dst, x, lo, "max", engine)
    return _binary(kb, dst, Src.of(dst), hi, "min", engine)


def _folded_activation(kb, dst, srcs, step):
    """func(x * scale + bias): folding.py; the bias is a [P, 1] tile (srcs[1])."""
    bias = srcs[1].operand if len(srcs) > 1 else None
    return kb.emit(isa.Activation, dst=dst, data=srcs[0].tile,
                   func=ACTIVATION[step.attrs["func"]], scale=step.attrs["scale"], bias=bias)


def _folded_tensor_scalar(kb, dst, srcs, step):
    """(x <op0> a) <op1> b: folding.py."""
    (op0, a, r0), (op1, b, r1) = step.attrs["ops"]
    return kb.emit(isa.TensorScalar, dst=dst, data=srcs[0].tile, op0=op0, operand0=a,
                   reverse0=r0, op1=op1, operand1=b, reverse1=r1)


TileOp = Callable[[KernelBuilder, isa.Tile, list[Src], Step], Any]
TILE_OPS: dict[str, TileOp] = {
    **{k: _alu for k in ALU}, **{k: _activation for k in ACTIVATION},
    "compare": _compare, "negate": _negate, "abs": _abs, "not": _not,
    "convert": _convert, "select": _select, "clamp": _clamp,
    "activation": _folded_activation, "tensor_scalar": _folded_tensor_scalar,
}
NO_INSTRUCTION = frozenset({"constant", "folded"})     # steps with no tile of their own
# Ops whose operands must all be tiles of the destination's shape.
NEEDS_FULL_TILES = frozenset({"select", "atan2"})


def fill_scalar(kb: KernelBuilder, dst: isa.Tile, value) -> isa.Tile:
    """A [P, 1] tile holding an immediate."""
    value = int(value) if isinstance(value, (bool,)) else value
    kb.emit(isa.Memset, dst=dst, value=value, engine=engine_for(dst.dtype))
    return dst


def expand(kb: KernelBuilder, src: Src, dst: isa.Tile) -> isa.Tile:
    """dst[p, :] = src[p] (`bypass` returns its first operand, here operand0)."""
    kb.emit(isa.TensorScalar, dst=dst, data=dst, op0="bypass", operand0=src.operand,
            reverse0=True, engine=engine_for(dst.dtype))
    return dst


from . import mathops  # noqa: E402,F401  (adds the multi-instruction math ops to TILE_OPS)
