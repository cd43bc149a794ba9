"""JAX's MX quantization (`jax.nn.scaled_dot_general`'s "mxfp8" mode, with FP8 or FP4
data: MXFP8, MXFP4) -> one op.

`quantize(x, config)` in jax/_src/cudnn/scaled_matmul_stablehlo.py (JAX 0.10.2) is ~35
elementwise ops per operand; run as such they cost 712 us for a 1024^2 operand on a
NeuronCore (a reduce over blocks of 32 and a broadcast back dominate). This pass finds
that subgraph and replaces its two outputs with one op the backend lowers as a kernel
(jax_trn/lower/mx_quantize.py):

    %q, %s = mx_quantize(%x)       x: f32 / bf16 [..., K]; q: fp8 / fp4 [..., K];
                                   s: float8_e8m0fnu [..., K / 32]

whose definition is JAX's, step for step (so the result is bit-exact):

    r     = x reshaped [..., K/32, 32]
    d     = max(|r|, axis=-1) / MAX                  in x's type; MAX = finfo(q).max
    b     = bits of float32(d); e = b >> 23; m = b & 0x7FFFFF
    e    += m > 0 and e != 254 and not (e == 0 and m <= 0x400000)
    s     = uint8(e)                                 (wraps: 256 -> 0)
    scale = float32(s << 23), 2**-127 where 0, in x's type
    q     = fp8(clip(r / scale, -MAX, MAX))

nvfp4's quantization (16 values per float8_e4m3fn scale, a global scale) is the
second pattern (mx_quantize_nv.py): the same op with {block = 16, global_scale}.

Matched in its imported form (after inline-calls and cleanup), operand order as JAX
emits it; any difference (another block size, scale rule, clip, type) leaves the
program as it is. Each output may have other users; intermediate values used elsewhere
stay. The dead rest goes to the `dce` pass at the end of the pipeline.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from hlo_passes import ir
from hlo_passes.graph import BlockGraph, rewrite_blocks

from . import mx_quantize_nv

name = "mx-quantize"

BLOCK = 32                              # OCP MX group size
DATA = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn")   # MXFP8, MXFP4
INPUTS = ("float32", "bfloat16")
SCALE = "float8_e8m0fnu"
E8M0_MIN = np.uint32(0x00400000)        # float32 bits of 2**-127, the scale of byte 0
# The round-up test's constants: mantissa mask, exponent 0xFE, half mantissa.
MANT, EXP_MAX, HALF = 0x7FFFFF, 254, 0x400000


def run(module: ir.Module) -> bool:
    return rewrite_blocks(module, _rewrite_block)


def _rewrite_block(block: ir.Block) -> bool:
    g = BlockGraph(block)
    data = {m[1]: (op, m) for op in block.ops if (m := _data_output(g, op))}
    scales = {u8: op for op in block.ops if (u8 := _scale_output(g, op)) is not None}
    pairs = [(d, m[0], scales[u8], {"block": BLOCK}) for u8, (d, m) in data.items()
             if u8 in scales]
    nv = mx_quantize_nv.pairs(g, block.ops)
    pairs += [(d, x, s, {"block": mx_quantize_nv.BLOCK, "global_scale": gs})
              for d, x, gs, s in nv]
    if not pairs:
        return False
    # nvfp4's optimization_barrier (which DCE keeps) is the identity inside the one op
    barriers = {g.producer[s.operands[0]] for *_, s in nv}
    mapping = {bar.result: bar.operands[0] for bar in barriers}
    new_ops = {}
    for d, x, s, attrs in pairs:
        op = _quantize_op(x, d, s, attrs)
        new_ops[min(d, s, key=g.index.get)] = op
        mapping[d.result], mapping[s.result] = op.results
    block.ops = [o for old in block.ops if old not in barriers
                 for o in ([new_ops[old]] if old in new_ops else []) + [old]]
    block.replace_all_uses(mapping)
    return True


def _quantize_op(x: ir.Value, data: ir.Op, scale: ir.Op, attrs: dict) -> ir.Op:
    q = ir.Value(ir.TensorType(data.result.shape, data.result.dtype))
    s = ir.Value(ir.TensorType(scale.result.shape, scale.result.dtype))
    return ir.Op("mx_quantize", [x], [q, s], attrs, loc=data.loc, name=data.name)


# --- the data output: reshape(fp8(clip(r / scale))) -------------------------------------

def _data_output(g: BlockGraph, op: ir.Op):
    """(x, the uint8 scale bytes) if `op` is q of the definition, else None."""
    if op.kind != "reshape" or op.result.dtype not in DATA:
        return None
    cvt = _producer(g, op.operands[0], "convert")
    lo_hi = cvt and _clip(g, cvt.operands[0], op.result.dtype)
    div = lo_hi and _producer(g, lo_hi, "divide")
    if not div:
        return None
    r, b = div.operands
    x = _blocks_of(g, r)
    bc = _producer(g, b, "broadcast_in_dim")
    u8 = bc and _scale_value(g, bc.operands[0], r.dtype)
    if x is None or u8 is None or x.shape != op.result.shape or bc.result.shape != r.shape:
        return None
    return (x, u8) if _scale_bytes_of(g, u8, r, op.result.dtype) else None


def _clip(g: BlockGraph, v: ir.Value, dtype: str) -> ir.Value | None:
    """The value v clips: minimum(MAX, maximum(-MAX, that))."""
    top = float(ml_dtypes.finfo(getattr(ml_dtypes, dtype)).max)
    mn = _producer(g, v, "minimum")
    mx = mn and _producer(g, mn.operands[1], "maximum")
    if mx and _is(g, mn.operands[0], top) and _is(g, mx.operands[0], -top):
        return mx.operands[1]
    return None


def _blocks_of(g: BlockGraph, r: ir.Value) -> ir.Value | None:
    """x of r = reshape(x) [..., K] -> [..., K/32, 32], x f32 or bf16."""
    rs = _producer(g, r, "reshape")
    x = rs and rs.operands[0]
    ok = (x is not None and x.dtype in INPUTS and r.shape[-1] == BLOCK and x.shape
          and x.shape[:-1] == r.shape[:-2] and x.shape[-1] == r.shape[-2] * BLOCK)
    return x if ok else None


def _scale_value(g: BlockGraph, v: ir.Value, dtype: str) -> ir.Value | None:
    """The uint8 bytes u8 of v = dtype(select(f == 0, 2**-127, f)), f = float32(u8 << 23)."""
    if dtype != "float32":
        cvt = _producer(g, v, "convert")
        v = cvt.operands[0] if cvt else None
    sel = v is not None and _producer(g, v, "select")
    if not sel:
        return None
    cond, tiny, f = sel.operands
    eq = _producer(g, cond, "compare")
    if not (eq and _cmp(eq, "EQ") and eq.operands[0] is f and _is(g, eq.operands[1], 0.0)
            and _is(g, tiny, E8M0_MIN)):
        return None
    bits = _producer(g, f, "bitcast_convert")
    shl = bits and _producer(g, bits.operands[0], "shift_left")
    widen = shl and _producer(g, shl.operands[0], "convert")
    if widen and _is(g, shl.operands[1], 23) and widen.operands[0].dtype == "uint8":
        return widen.operands[0]
    return None


# --- the scale bytes: uint8(e + round_up) -----------------------------------------------

def _scale_bytes_of(g: BlockGraph, u8: ir.Value, r: ir.Value, data: str) -> bool:
    """u8 = uint8(select(round_up, e + 1, e)) of the blocks r (the definition)."""
    cvt = _producer(g, u8, "convert")
    sel = cvt and _producer(g, cvt.operands[0], "select")
    if not sel or sel.operands[0].shape != r.shape[:-1] + (1,):
        return False
    cond, inc, e = sel.operands
    add = _producer(g, inc, "add")
    if not (add and add.operands[0] is e and _is(g, add.operands[1], 1)):
        return False
    shr = _producer(g, e, "shift_right_logical")
    if not (shr and _is(g, shr.operands[1], 23)):
        return False
    b = shr.operands[0]
    return _rounds_up(g, cond, b, e) and _block_amax_bits(g, b, r, data)


def _rounds_up(g: BlockGraph, cond: ir.Value, b: ir.Value, e: ir.Value) -> bool:
    """cond = (m > 0 and e != 254) and not (e == 0 and m <= 0x400000), m = b & MANT."""
    outer = _producer(g, cond, "and")
    first = outer and _producer(g, outer.operands[0], "and")
    neg = outer and _producer(g, outer.operands[1], "not")
    second = neg and _producer(g, neg.operands[0], "and")
    if not (first and second):
        return False
    return (_compare(g, first.operands[0], "GT", _mantissa(g, b), 0)
            and _compare(g, first.operands[1], "NE", e, EXP_MAX)
            and _compare(g, second.operands[0], "EQ", e, 0)
            and _compare(g, second.operands[1], "LE", _mantissa(g, b), HALF))


def _mantissa(g: BlockGraph, b: ir.Value):
    """A matcher for values equal to b & MANT."""
    def match(v: ir.Value) -> bool:
        op = _producer(g, v, "and")
        return bool(op) and op.operands[0] is b and _is(g, op.operands[1], MANT)
    return match


def _compare(g: BlockGraph, v: ir.Value, direction: str, lhs, rhs: int) -> bool:
    op = _producer(g, v, "compare")
    if not (op and _cmp(op, direction) and _is(g, op.operands[1], rhs)):
        return False
    return lhs(op.operands[0]) if callable(lhs) else op.operands[0] is lhs


def _block_amax_bits(g: BlockGraph, b: ir.Value, r: ir.Value, data: str) -> bool:
    """b = bits of float32(max(|r|, -1) / MAX) (MAX, the division in r's type)."""
    bc = _producer(g, b, "bitcast_convert")
    d = bc and bc.operands[0]
    if d is not None and r.dtype != "float32":
        cvt = _producer(g, d, "convert")
        d = cvt.operands[0] if cvt else None
    div = d is not None and _producer(g, d, "divide")
    top = float(ml_dtypes.finfo(getattr(ml_dtypes, data)).max)
    if not (div and _is(g, div.operands[1], top)):
        return False
    up = _producer(g, div.operands[0], "broadcast_in_dim")
    red = up and _producer(g, up.operands[0], "reduce")
    return bool(red) and _is_amax(g, red, r)


def _is_amax(g: BlockGraph, red: ir.Op, r: ir.Value) -> bool:
    """red = reduce(abs(r), -inf) over the last axis with maximum."""
    absop = _producer(g, red.operands[0], "abs")
    body = red.regions[0].blocks[0].ops if red.regions else []
    return (bool(absop) and absop.operands[0] is r and len(red.operands) == 2
            and red.attrs.get("dimensions") == (len(r.shape) - 1,)
            and _is(g, red.operands[1], -np.inf)
            and [o.kind for o in body] == ["maximum", "return"])


# --- the scale output: bitcast(reshape(u8)) -> e8m0 -------------------------------------

def _scale_output(g: BlockGraph, op: ir.Op) -> ir.Value | None:
    if op.kind != "bitcast_convert" or op.result.dtype != SCALE:
        return None
    rs = _producer(g, op.operands[0], "reshape")
    u8 = rs and rs.operands[0]
    if u8 is None or u8.dtype != "uint8" or u8.shape != op.result.shape + (1,):
        return None
    return u8


# --- helpers ----------------------------------------------------------------------------

def _producer(g: BlockGraph, v: ir.Value | None, kind: str) -> ir.Op | None:
    op = g.producer.get(v) if v is not None else None
    return op if op is not None and op.kind == kind else None


def _cmp(op: ir.Op, direction: str) -> bool:
    return op.attrs.get("comparison_direction") == direction


def _const(g: BlockGraph, v: ir.Value) -> np.ndarray | None:
    """The value of a scalar constant, or of a broadcast of one; None otherwise."""
    op = g.producer.get(v)
    if op is not None and op.kind == "broadcast_in_dim" and not op.operands[0].shape:
        op = g.producer.get(op.operands[0])
    if op is None or op.kind != "constant":
        return None
    value = np.asarray(op.attrs["value"])
    return value.reshape(()) if value.size == 1 else None


def _is(g: BlockGraph, v: ir.Value, want) -> bool:
    """v is the scalar constant `want` (a number, or the bits of a float32), compared
    bit for bit: JAX compiles with the CPU's flush-to-zero / denormals-are-zero modes
    on, where 2**-127 equals 0 and a float32(2**-127) conversion gives 0."""
    value = _const(g, v)
    if value is None:
        return False
    if isinstance(want, np.uint32):
        return value.dtype == np.float32 and value.view(np.uint32) == want
    return np.asarray(want, value.dtype).tobytes() == value.tobytes()
