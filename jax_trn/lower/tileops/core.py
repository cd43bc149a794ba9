"""What every tile op shares: the step it computes, its operands, the instruction helpers.

A tile op emits the instruction(s) computing one `Step` (one IR elementwise op) into a
destination tile from `Src` operands. A `Src` is a tile, or a per-partition value
(`scalar`: a [P, 1] tile or an immediate `imm`) broadcast along the free axis, which
binary ops take as the `TensorScalar` operand. `TileRule` is one entry of the table
(`tileops.TILE_OPS`): the emitter and how many scratch tiles it needs.

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

from ..builder import KernelBuilder

ALU = {"add": "add", "subtract": "subtract", "multiply": "multiply", "divide": "divide",
       "maximum": "max", "minimum": "min", "power": "power", "remainder": "remainder",
       "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor",
       "shift_left": "shift_left", "shift_right_logical": "shift_right_logical",
       "shift_right_arithmetic": "shift_right_arithmetic"}
BOOL_ALU = {"and": "min", "or": "max", "xor": "not_equal", "maximum": "max", "minimum": "min"}
# ScalarE functions valid for every input (§2.4): one Activation each, so folding.py may
# give them a scale and bias. log / sqrt / rsqrt / sin have published input ranges and
# their own instruction sequences (ranged.py, trig.py).
ACTIVATION = {"exponential": "exp", "tanh": "tanh", "logistic": "sigmoid", "sign": "sign"}
COMPARE = {"EQ": "is_equal", "NE": "not_equal", "LT": "is_lt", "LE": "is_le",
           "GT": "is_gt", "GE": "is_ge"}
NO_INSTRUCTION = frozenset({"constant", "folded"})     # steps with no tile of their own
# Ops whose operands must all be tiles of the destination's shape.
NEEDS_FULL_TILES = frozenset({"select", "atan2"})


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


Emit = Callable[[KernelBuilder, isa.Tile, list[Src], Step], Any]


@dataclass(frozen=True)
class TileRule:
    """How one step kind is emitted: `emit(kb, dst, srcs, step)`. A multi-instruction
    op takes `scratch` extra [parts, free] tiles after its operands (the Evaluator
    appends them, regions.py): FP32 for float work, the operand's type for integers,
    `width` bytes per element (8 for ops that view them as 64-bit integers); then
    `row_scratch` [parts, 1] FP32 tiles (a per-partition value it derives)."""
    emit: Emit
    scratch: int = 0
    width: int = 4
    row_scratch: int = 0


def rules(emit: Emit, kinds, scratch: int = 0) -> dict[str, TileRule]:
    """One TileRule for each of `kinds`."""
    return {kind: TileRule(emit, scratch) for kind in kinds}


def engine_for(dtype: str) -> str:
    return "gpsimd" if ir.is_int(dtype) else "vector"


def scratch_dtype(arg_dtype: str) -> str:
    """FP32 for float work, the operand's own type for integer bit tricks."""
    return arg_dtype if ir.is_int(arg_dtype) else "float32"


def binary(kb: KernelBuilder, dst: isa.Tile, a: Src, b: Src, op: str, engine: str):
    """a <op> b: a per-partition operand is the TensorScalar operand (reversed for a)."""
    if b.scalar and a.tile is not None:
        return kb.emit(isa.TensorScalar, dst=dst, data=a.tile, op0=op, operand0=b.operand,
                       engine=engine)
    if a.scalar:
        return kb.emit(isa.TensorScalar, dst=dst, data=b.tile, op0=op, operand0=a.operand,
                       reverse0=True, engine=engine)
    return kb.emit(isa.TensorTensor, dst=dst, data1=a.tile, data2=b.tile, op=op,
                   engine=engine)


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


# --- instruction helpers of the multi-instruction ops (mathops, ranged, trig) ----------

def ts(kb, dst, x, op0, a, op1=None, b=None, rev0=False, rev1=False, engine="vector"):
    """dst = (x <op0> a) <op1> b with immediates a, b (reversed: a <op0> x)."""
    more = {} if op1 is None else {"op1": op1, "operand1": b, "reverse1": rev1}
    return kb.emit(isa.TensorScalar, dst=dst, data=x, op0=op0, operand0=a, reverse0=rev0,
                   engine=engine, **more)


def tt(kb, dst, a, b, op, engine="vector"):
    return kb.emit(isa.TensorTensor, dst=dst, data1=a, data2=b, op=op, engine=engine)


def stt(kb, dst, data, op0, a, op1, t, rev0=False, rev1=False):
    """(data <op0> a) <op1> t on VectorE (t first when rev1)."""
    return kb.emit(isa.ScalarTensorTensor, dst=dst, data=data, op0=op0, operand0=a,
                   reverse0=rev0, op1=op1, operand1=t, reverse1=rev1)


def act(kb, dst, x, func, scale=1.0):
    return kb.emit(isa.Activation, dst=dst, data=x, func=func, scale=scale)


def select(kb, dst, pred, on_true, on_false):
    return kb.emit(isa.Select, dst=dst, pred=pred, on_true=on_true, on_false=on_false)


def tiles(srcs, n_in):
    """(the operands' tiles, the scratch tiles after them)."""
    return [s.tile for s in srcs[:n_in]], [s.tile for s in srcs[n_in:]]
