"""top_k (`lax.top_k`; `custom_call @trn.top_k` from hlo_passes/mlir_passes.py) with
VectorE's max8 / nc_find_index8 / nc_match_replace8 (§6.2) instead of a full sort.

lax.top_k orders by IEEE total order (-NaN < -inf < ... < -0 < +0 < ... < +inf < +NaN,
NaN payloads by their bits), equal values by position (the lower index first). The
three instructions compare in FP32, where -0 == +0 and NaN is unordered, so they never
see the data itself: every element becomes an integer *key* whose FP32 order is the
total order and whose FP32 equality is bitwise equality of the value. Rows go on
partitions (128 per group), the last axis on the free axis.

- 16-bit floats: bits b (int16) -> b ^ ((b >> 15) & 0x7fff); 8/16-bit integers as they
  are. Exact in FP32 (|key| < 2^16): one key.
- 32-bit (float32 via the same flip of its int32 bits, int32, uint32 with the sign bit
  flipped): the int32 key K does not fit FP32's 24 bits, so it is split lexicographically
  into A = K >> 8 (exact, |A| < 2^23) and B = K & 255. First the k largest A's
  a_1 >= ... >= a_k (max8 + match_replace8 rounds). Every element of the top k has
  A >= a_k, and the rank c = #{j : a_j <= A} is 0 below a_k and strictly increasing in
  A above it (each such A is one of the a_j), so C = 256 c + B (< 2^24, exact) orders
  the candidates as K does and every other element below them: the second key.
- then per round of 8: m = max8(key); indices = find_index8(key, m) (duplicates take
  successive positions, ascending: equal keys by position); match_replace8(key, m,
  -inf) removes them before the next round (it removes the same first occurrences).
- values: one-key types are rebuilt from the selected keys (the flip is an involution);
  32-bit values are gathered by index from the input in HBM (DmaGather, one 4-byte
  descriptor each, §3.4), bit-exact (NaN payloads, -0).

Lines shorter than 8 are padded with -inf keys (k <= N never selects them). Cost per
group of 128 rows (N = line length, R = ceil(k / 8) rounds, VectorE, §6.3): one key
~3N; 32-bit keys add R x 2N for the A rounds and k x 2N for the rank. mlir_passes keeps
top_k as this op only for these dtypes, N <= TOP_K_MAX_LEN (three FP32 [128, N]
working tiles in SBUF) and k <= TOP_K_MAX_K (beyond, the rank's k passes lose to the
sort); other top_k's are a sort + slice as before.
"""
from __future__ import annotations

import math

from jax_trn.hw import isa
from jax_trn.hw.isa_vector import FindIndex8, MatchReplace8, Max8
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .errors import LoweringError
from .layout import P, tiles
from .registry import LowerCtx, register_lowering

NEG_INF = float("-inf")
INT32_MAX = 2 ** 31 - 1
ONE_KEY = ("bfloat16", "float16", "int8", "int16", "uint8", "uint16")
TWO_KEYS = ("float32", "int32", "uint32")


class _Tiles:
    """The working tiles of one kernel, sized for 128 rows of W = max(N, 8) keys."""

    def __init__(self, kb: KernelBuilder, x: DramTensor, n: int, k: int):
        self.w, self.rounds = max(n, 8), math.ceil(k / 8)
        self.x = kb.tile(n, x.dtype) if x.dtype in ONE_KEY else None
        self.bufs = [kb.tile(self.w, "float32") for _ in range(3 if self.x is None else 2)]
        self.tops = kb.tile(8 * self.rounds, "float32")
        self.vals = kb.tile(8 * self.rounds, "float32")
        self.idx = kb.tile(8 * self.rounds, "uint32")
        self.out = kb.tile(k, "int32")

    def all(self) -> list[isa.Tile]:
        return [t for t in (self.x, *self.bufs, self.tops, self.vals, self.idx, self.out)
                if t is not None]


def _view(t: isa.Tile, parts: int, n: int, dtype: str, at: int = 0) -> isa.Tile:
    return sub(t, parts, n, at=at).with_(dtype=dtype) if dtype != t.dtype else sub(t, parts, n, at=at)


def _pad(kb: KernelBuilder, t: isa.Tile, parts: int, n: int, w: int) -> None:
    if w > n:
        kb.emit(isa.Memset, dst=sub(t, parts, w - n, at=n), value=NEG_INF)


def _flip(kb: KernelBuilder, dst: isa.Tile, bits: isa.Tile, scratch: isa.Tile,
          width: int) -> None:
    """dst = bits ^ ((bits >> (width - 1)) & max): the sign-magnitude -> two's
    complement order flip of IEEE bits (an involution on the integer)."""
    kb.emit(isa.TensorScalar, dst=scratch, data=bits, op0="shift_right_arithmetic",
            operand0=width - 1, op1="bitwise_and", operand1=(1 << (width - 1)) - 1)
    kb.emit(isa.TensorTensor, dst=dst, data1=bits, data2=scratch, op="bitwise_xor")


def _one_key(kb: KernelBuilder, t: _Tiles, x: DramTensor, p: int, n: int) -> isa.Tile:
    """The key of 8/16-bit types in bufs[0] (FP32)."""
    key, scratch = t.bufs
    kf = sub(key, p, n)
    if x.dtype in ("bfloat16", "float16"):
        bits = _view(t.x, p, n, "int16")
        _flip(kb, kf, bits, _view(scratch, p, n, "int16"), 16)
    else:
        kb.emit(isa.TensorCopy, dst=kf, src=sub(t.x, p, n))
    _pad(kb, key, p, n, t.w)
    return sub(key, p, t.w)


def _two_keys(kb: KernelBuilder, t: _Tiles, x: DramTensor, p: int, n: int) -> isa.Tile:
    """C = 256 * #{j : a_j <= A} + B in a buffer (FP32), from the input in bufs[0]."""
    b0, b1, b2 = t.bufs
    if x.dtype == "float32":
        kk = _view(b1, p, n, "int32")
        _flip(kb, kk, _view(b0, p, n, "int32"), _view(b2, p, n, "int32"), 32)
        a, work = b1, b0
    else:
        kk = _view(b0, p, n, "int32")
        if x.dtype == "uint32":
            kb.emit(isa.TensorScalar, dst=kk, data=_view(b0, p, n, "uint32"),
                    op0="bitwise_xor", operand0=2 ** 31)
        a, work = b0, b1
    kb.emit(isa.TensorScalar, dst=sub(b2, p, n), data=kk, op0="bitwise_and", operand0=255)
    kb.emit(isa.TensorScalar, dst=sub(a, p, n), data=kk, op0="shift_right_arithmetic",
            operand0=8)
    for buf in (a, b2):
        _pad(kb, buf, p, n, t.w)
    a, work, bkey = sub(a, p, t.w), sub(work, p, t.w), sub(b2, p, t.w)
    kb.emit(isa.TensorCopy, dst=work, src=a)
    k = t.out.free_size
    _rounds(kb, work, sub(t.tops, p), None, t.rounds)
    for j in range(k):
        aj = sub(t.tops, p, 1, at=j)
        if j == 0:
            kb.emit(isa.TensorScalar, dst=work, data=a, op0="is_ge", operand0=aj)
        else:
            kb.emit(isa.ScalarTensorTensor, dst=work, data=a, op0="is_ge", operand0=aj,
                    op1="add", operand1=work)
    kb.emit(isa.ScalarTensorTensor, dst=bkey, data=work, op0="multiply", operand0=256.0,
            op1="add", operand1=bkey)
    return bkey


def _rounds(kb: KernelBuilder, key: isa.Tile, vals: isa.Tile, idx: isa.Tile | None,
            rounds: int) -> None:
    """vals (and idx) [p, 8 x rounds] = the largest keys (and their positions), by rounds
    of max8 (+ find_index8), each followed by match_replace8 of what it found."""
    p = key.num_partitions
    for r in range(rounds):
        m = sub(vals, p, 8, at=8 * r)
        kb.emit(Max8, dst=m, src=key)
        if idx is not None:
            kb.emit(FindIndex8, dst=sub(idx, p, 8, at=8 * r), data=key, vals=m)
        if r + 1 < rounds:
            kb.emit(MatchReplace8, dst=key, data=key, vals=m, imm=NEG_INF)


def _values_from_keys(kb: KernelBuilder, t: _Tiles, x: DramTensor, vout: DramTensor,
                      r0: int, p: int, k: int) -> None:
    """One-key types: the value is the key (integers) or its flip (16-bit floats)."""
    keys = sub(t.vals, p, k)
    if x.dtype not in ("bfloat16", "float16"):
        kb.dma(kb.ap(vout, r0 * k, ((k, p), (1, k))), keys)
        return
    kq, scratch = _view(t.bufs[0], p, k, "int16"), _view(t.bufs[1], p, k, "int16")
    kb.emit(isa.TensorCopy, dst=kq, src=keys)
    _flip(kb, kq, kq, scratch, 16)
    kb.dma(kb.ap(vout, r0 * k, ((k, p), (1, k))), kq.with_(dtype=x.dtype))


def _values_gathered(kb: KernelBuilder, t: _Tiles, x: DramTensor, vout: DramTensor,
                     r0: int, p: int, n: int, k: int) -> None:
    """32-bit types: value = x[row, index], by indirect DMA from HBM (bit-exact)."""
    flat = sub(t.out, p, k)
    kb.emit(isa.Iota, dst=flat, pattern=((0, k),), offset=r0 * n, channel_multiplier=n)
    kb.emit(isa.TensorTensor, dst=flat, data1=flat, data2=sub(t.idx, p, k), op="add",
            engine="gpsimd")
    dst = _view(t.bufs[0], p, k, x.dtype)
    table = kb.ap(x, 0, ((1, x.size), (1, 1)))
    kb.emit(isa.DmaGather, dst=dst, src=table, indices=flat, dma_queue=next(kb._queues))
    kb.dma(kb.ap(vout, r0 * k, ((k, p), (1, k))), dst)


@register_lowering("top_k")
def _top_k_lower(ctx: LowerCtx, x: DramTensor, *, k: int) -> None:
    vout, iout = ctx.outs
    if x.dtype not in ONE_KEY + TWO_KEYS or not x.shape:
        raise LoweringError(f"top_k of {x.dtype}{list(x.shape)} is not supported "
                            f"({ctx.op.describe()})")
    n = x.shape[-1]
    rows = x.size // n if n else 0
    if rows == 0 or k == 0:
        return
    if not 1 <= k <= n:
        raise LoweringError(f"top_k with k={k} of a line of {n} ({ctx.op.describe()})")
    kb = ctx.kb
    kb.flops += rows * n * math.ceil(k / 8) * 3
    t = _Tiles(kb, x, n, k)
    for r0, p in tiles(rows, P):
        src = kb.ap(x, r0 * n, ((n, p), (1, n)))
        kb.dma(sub(t.x, p, n) if t.x is not None else _view(t.bufs[0], p, n, x.dtype), src)
        if t.x is not None:
            key = _one_key(kb, t, x, p, n)
        else:
            key = _two_keys(kb, t, x, p, n)
        _rounds(kb, key, sub(t.vals, p), sub(t.idx, p), t.rounds)
        kb.dma(kb.ap(iout, r0 * k, ((k, p), (1, k))), sub(t.idx, p, k))
        if t.x is not None:
            _values_from_keys(kb, t, x, vout, r0, p, k)
        else:
            _values_gathered(kb, t, x, vout, r0, p, n, k)
    kb.release(*t.all())
