"""The mx-quantize pass's second pattern: JAX's nvfp4 quantization (`quantize(x, cfg)`
with `cfg.mode == "nvfp4"`, jax/_src/cudnn/scaled_matmul_stablehlo.py, JAX 0.10.2):

    r     = x reshaped [..., K/16, 16], in float32 (a bf16 x converted)
    r     = r / global_scale                         a compile-time scalar constant
    d     = max(|r|, axis=-1) / 6                    6 = finfo(float4_e2m1fn).max
    s     = float8_e4m3fn(min(448, max(0, d)))       optimization_barrier(s)
    q     = float4_e2m1fn(clip(r / float32(s), -6, 6))

-> `%q, %s = mx_quantize(%x) {block = 16, global_scale = g}` (jax_trn/lower/
mx_quantize.py). Matched in its imported form; any difference leaves the program as
it is. A global scale that is not a constant (a traced value) is not matched.
"""
from __future__ import annotations

import numpy as np

from hlo_passes import ir
from hlo_passes.graph import BlockGraph

BLOCK = 16
DATA, SCALE = "float4_e2m1fn", "float8_e4m3fn"
DATA_MAX, SCALE_MAX = 6.0, 448.0
INPUTS = ("float32", "bfloat16")


def pairs(g: BlockGraph, ops) -> list[tuple[ir.Op, ir.Value, float, ir.Op]]:
    """(data output op, x, global scale, scale output op) of each nvfp4 quantization."""
    data = {m[2]: (op, m) for op in ops if (m := _data_output(g, op))}
    out = []
    for op in ops:
        if op.kind == "reshape" and op.result.dtype == SCALE and op.operands[0] in data:
            d, (x, gs, bar) = data[op.operands[0]]
            if op.result.shape == bar.shape[:-1]:
                out.append((d, x, gs, op))
    return out


def _data_output(g: BlockGraph, op: ir.Op):
    """(x, global scale, the barrier'd E4M3 scales) if `op` is q of the definition."""
    if op.kind != "reshape" or op.result.dtype != DATA:
        return None
    cvt = _producer(g, op.operands[0], "convert")
    div = cvt and _producer(g, _clip(g, cvt.operands[0], -DATA_MAX, DATA_MAX), "divide")
    if not div:
        return None
    r, b = div.operands
    bc = _producer(g, b, "broadcast_in_dim")
    wide = bc and _producer(g, bc.operands[0], "convert")
    bar = wide and _producer(g, wide.operands[0], "optimization_barrier")
    if not (bar and bar.result.dtype == SCALE and bc.result.shape == r.shape
            and _is_scale(g, bar.operands[0], r)):
        return None
    x, gs = _scaled_input(g, r)
    ok = x is not None and x.shape == op.result.shape
    return (x, gs, bar.result) if ok else None


def _is_scale(g: BlockGraph, v: ir.Value, r: ir.Value) -> bool:
    """v = float8_e4m3fn(min(448, max(0, max(|r|, -1) / 6)))."""
    cvt = _producer(g, v, "convert")
    d = cvt and _producer(g, _clip(g, cvt.operands[0], 0.0, SCALE_MAX), "divide")
    if not (d and _value(g, d.operands[1]) == DATA_MAX):
        return False
    up = _producer(g, d.operands[0], "broadcast_in_dim")
    red = up and _producer(g, up.operands[0], "reduce")
    absop = red and _producer(g, red.operands[0], "abs")
    body = red.regions[0].blocks[0].ops if red and red.regions else []
    return (bool(absop) and absop.operands[0] is r and len(red.operands) == 2
            and red.attrs.get("dimensions") == (len(r.shape) - 1,)
            and _value(g, red.operands[1]) == -np.inf
            and [o.kind for o in body] == ["maximum", "return"])


def _scaled_input(g: BlockGraph, r: ir.Value) -> tuple[ir.Value | None, float]:
    """(x, g) of r = float32(reshape(x)) / g, x [..., K] f32 / bf16, g a constant."""
    div = _producer(g, r, "divide")
    gs = div and _value(g, div.operands[1])
    if gs is None or not div or r.dtype != "float32" or r.shape[-1] != BLOCK:
        return None, 0.0
    v = div.operands[0]
    cvt = _producer(g, v, "convert")
    v = cvt.operands[0] if cvt else v
    rs = _producer(g, v, "reshape")
    x = rs and rs.operands[0]
    ok = (x is not None and x.dtype in INPUTS and x.shape and x.shape[:-1] == r.shape[:-2]
          and x.shape[-1] == r.shape[-2] * BLOCK)
    return (x, float(gs)) if ok else (None, 0.0)


def _clip(g: BlockGraph, v: ir.Value, low: float, high: float) -> ir.Value | None:
    """The value v clips: minimum(high, maximum(low, that))."""
    mn = _producer(g, v, "minimum")
    mx = mn and _producer(g, mn.operands[1], "maximum")
    if mx and _value(g, mn.operands[0]) == high and _value(g, mx.operands[0]) == low:
        return mx.operands[1]
    return None


def _producer(g: BlockGraph, v: ir.Value | None, kind: str) -> ir.Op | None:
    op = g.producer.get(v) if v is not None else None
    return op if op is not None and op.kind == kind else None


def _value(g: BlockGraph, v: ir.Value) -> float | None:
    """The float value of a one-element constant seen through broadcasts and converts."""
    op = g.producer.get(v)
    while op is not None and op.kind in ("broadcast_in_dim", "convert", "reshape"):
        if int(np.prod(op.operands[0].shape)) != 1:
            return None
        op = g.producer.get(op.operands[0])
    if op is None or op.kind != "constant":
        return None
    value = np.asarray(op.attrs["value"])
    return float(value.reshape(-1)[0]) if value.size == 1 else None
