"""Elementwise ops that are one instruction on tiles (two for a clamp of tiles).

Arithmetic and comparisons on VectorE (GpSimd for integers, `power` always), the
transcendental functions on ScalarE (`Activation`), and the two folded forms folding.py
makes (`activation`: func(x * scale + bias); `tensor_scalar`: two ops with
immediates). See core.py for engines and numerics.
"""
from __future__ import annotations

from hlo_passes import ir
from jax_trn.hw import isa

from .core import (ACTIVATION, ALU, BOOL_ALU, COMPARE, Src, TileRule, binary, engine_for,
                   fill_scalar, rules)


def _alu(kb, dst, srcs, step):
    dtype = srcs[0].dtype
    if dtype == "bool" and step.kind in BOOL_ALU:
        return binary(kb, dst, *srcs, BOOL_ALU[step.kind], "vector")
    if step.kind == "shift_right_arithmetic" and dtype.startswith("uint"):
        return _shift_unsigned_arithmetic(kb, dst, *srcs)
    engine = "gpsimd" if step.kind == "power" else engine_for(dtype)
    return binary(kb, dst, *srcs, ALU[step.kind], engine)


def _shift_unsigned_arithmetic(kb, dst, x: Src, amount: Src):
    """XLA shifts the bits arithmetically whatever the type: the value and result are
    read as the signed type of the same width (SBUF is untyped, §3.1); the amount
    stays unsigned."""
    signed = dst.dtype[1:]
    return binary(kb, dst.with_(dtype=signed), _as_signed(x, signed), amount,
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
    return binary(kb, dst, *srcs, op, engine_for(srcs[0].dtype))


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


def _bitcast(kb, dst, srcs, step):
    """A same-width bitcast_convert (the uniform draw's mantissa bits seen as a float):
    SBUF is untyped bytes (§3.1), so it is a bit copy on GpSimd with source and
    destination both seen as the unsigned integer of the width."""
    bits = _UINT[ir.np_dtype(dst.dtype).itemsize]
    return kb.emit(isa.TensorCopy, dst=dst.with_(dtype=bits),
                   src=srcs[0].tile.with_(dtype=bits), engine="gpsimd")


_UINT = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64"}


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
    binary(kb, dst, x, lo, "max", engine)
    return binary(kb, dst, Src.of(dst), hi, "min", engine)


def _folded_activation(kb, dst, srcs, step):
    """func(x * scale + bias): folding.py; the bias is a [P, 1] tile (srcs[1])."""
    bias = srcs[1].operand if len(srcs) > 1 else None
    return kb.emit(isa.Activation, dst=dst, data=srcs[0].tile,
                   func=ACTIVATION[step.attrs["func"]], scale=step.attrs["scale"], bias=bias)


def _folded_activation_row(kb, dst, srcs, step):
    """func(x - m) / func(x + m), m per partition: one Activation, its bias -m (made
    exactly in the [P, 1] FP32 scratch srcs[2]) or m, §2.4; else op by op."""
    x, m, row = srcs[0], srcs[1], srcs[2]
    func = ACTIVATION[step.attrs["func"]]
    if not m.scalar or x.scalar:
        binary(kb, dst, x, m, "subtract" if step.attrs["negate"] else "add", "vector")
        return kb.emit(isa.Activation, dst=dst, data=dst, func=func)
    bias = m.operand
    if step.attrs["negate"]:
        if m.imm is not None:
            bias = -m.imm
        else:
            kb.emit(isa.TensorScalar, dst=row.tile, data=m.tile, op0="multiply",
                    operand0=-1.0)
            bias = row.tile
    if not isinstance(bias, isa.Tile):
        bias = fill_scalar(kb, row.tile, bias)
    return kb.emit(isa.Activation, dst=dst, data=x.tile, func=func, bias=bias)


def _folded_tensor_scalar(kb, dst, srcs, step):
    """(x <op0> a) <op1> b: folding.py. An operand is an immediate or srcs[k]
    (`folding.Arg`); one TensorScalar when every value operand is per-partition, else
    op by op like the unfolded steps (folding.py folds those only at equal types), the
    intermediate in its own tile of the type it had before a convert narrowed the step
    ("via")."""
    (op0, a, r0), (op1, b, r1) = step.attrs["ops"]
    x, a, b = srcs[0], _operand(srcs, a, x_dtype(srcs)), _operand(srcs, b, x_dtype(srcs))
    if _one_instruction(x, a, b):
        return kb.emit(isa.TensorScalar, dst=dst, data=x.tile, op0=op0, operand0=a.operand,
                       reverse0=r0, op1=op1, operand1=b.operand, reverse1=r1)
    via = step.attrs.get("via", dst.dtype)
    if via == dst.dtype:
        _op_by_op(kb, dst, x, a, op0, r0)
        return _op_by_op(kb, dst, Src.of(dst), b, op1, r1)
    mid = kb.tile(dst.free, via, parts=dst.num_partitions)    # the folded intermediate's type
    _op_by_op(kb, mid, x, a, op0, r0)
    _op_by_op(kb, dst, Src.of(mid), b, op1, r1)
    kb.release(mid)


def _folded_stt(kb, dst, srcs, step):
    """(x <op0> a) <op1> y (reversed: y <op1> ...): folding.py; one ScalarTensorTensor
    when x and y are tiles and a per-partition, else op by op."""
    x, y, at = srcs[0], srcs[1], step.attrs
    a = _operand(srcs, at["operand0"], x_dtype(srcs))
    if not x.scalar and not y.scalar and a.scalar and "sbuf" in (x.tile.mem, y.tile.mem):
        return kb.emit(isa.ScalarTensorTensor, dst=dst, data=x.tile, op0=at["op0"],
                       operand0=a.operand, reverse0=at["reverse0"], op1=at["op1"],
                       operand1=y.tile, reverse1=at["reverse1"])
    _op_by_op(kb, dst, x, a, at["op0"], at["reverse0"])
    return _op_by_op(kb, dst, y, Src.of(dst), at["op1"], not at["reverse1"])


def x_dtype(srcs) -> str:
    return srcs[0].dtype


def _operand(srcs, value, dtype: str) -> Src:
    """A folded step's operand as a Src: srcs[k] for `Arg(k)`, else the immediate."""
    index = getattr(value, "index", None)
    return srcs[index] if index is not None else Src.immediate(value, dtype)


def _one_instruction(x: Src, *operands: Src) -> bool:
    return all(o.scalar for o in operands)


def _op_by_op(kb, dst, x: Src, a: Src, op: str, reverse: bool):
    """dst = x <op> a (a <op> x when reversed), as the unfolded step would run."""
    return binary(kb, dst, *((a, x) if reverse else (x, a)), op, "vector")


# `sign` is not here: a float sign needs a fix-up for -0 (mathops.py).
RULES: dict[str, TileRule] = {
    **rules(_alu, ALU), **rules(_activation, [k for k in ACTIVATION if k != "sign"]),
    **rules(_compare, ["compare"]), **rules(_negate, ["negate"]), **rules(_abs, ["abs"]),
    **rules(_not, ["not"]), **rules(_convert, ["convert"]), **rules(_select, ["select"]),
    **rules(_bitcast, ["bitcast_convert"]),
    **rules(_clamp, ["clamp"]), **rules(_folded_activation, ["activation"]),
    **rules(_folded_tensor_scalar, ["tensor_scalar"]),
    **rules(_folded_stt, ["scalar_tensor_tensor"]),
    "activation_row": TileRule(_folded_activation_row, row_scratch=1),
}
