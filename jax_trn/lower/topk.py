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
- values, rebuilt from the keys (the flip is an involution), bit-exact (NaN payloads,
  -0): one-key types from the selected keys; 32-bit types as K = 256 a_t + (C_t & 255)
  for output slot t: the top k by K hold exactly the A values a_1 >= ... >= a_k of the
  first rounds (all elements with A > a_k, and as many with A = a_k as the list holds),
  in the same (descending) order, so slot t's A is a_t, no lookup needed.

Many short lines: g lines per partition come in one DMA (partition p holds lines
r0 + p g .. r0 + p g + g - 1, contiguous), are selected one after another, and their
k results leave in one DMA per output, so the DMA fixed cost (§2.6) is paid per block,
not per 128 lines.

The rank's k indicator tiles [A >= a_j] (VectorE tensor_scalar, BF16 0/1) are summed
by TensorE into PSUM (identity stationary, accumulate=True; exact in FP32), N columns
of TensorE per j at its own clock, instead of k VectorE scalar_tensor_tensor passes of
2N (§6.3), when a line fits PSUM (W <= 4096 FP32 per partition, §3.2); longer lines
and lines shorter than PE_MIN (where the passes cost little) use the VectorE passes.

Lines shorter than 8 are padded with -inf keys (k <= N never selects them). Cost per
line of 128 rows (N = line length, R = ceil(k / 8) rounds, VectorE, §6.3): one key
~3N; 32-bit keys add R x 2N for the A rounds and k x N/2 (or k x 2N) for the rank.
mlir_passes keeps top_k as this op only for these dtypes, N <= TOP_K_MAX_LEN (three
FP32 [128, N] working tiles in SBUF) and k <= TOP_K_MAX_K (a safe bound: at N = 1000
k = 256 still beats the sort, 311 vs 485 us, but the rank's k passes grow with k);
other top_k's are a sort + slice as before.
"""
from __future__ import annotations

import math

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.isa_vector import FindIndex8, MatchReplace8, Max8
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .errors import LoweringError
from .registry import LowerCtx, register_lowering

NEG_INF = float("-inf")
ONE_KEY = ("bfloat16", "float16", "int8", "int16", "uint8", "uint16")
TWO_KEYS = ("float32", "int32", "uint32")
XIN_BYTES = 32 * 1024            # input lines per partition loaded at once
PE_MIN = 128                     # shorter lines: the VectorE rank (2N <= MIN_II-bound
#                                  mask + the cross-engine wait, §2.6)


class _Tiles:
    """The working tiles of one kernel: 3 FP32 key buffers of W = max(N, 8), the input
    of g lines per partition, and the results of g lines (8 R spare columns: a round
    writes 8)."""

    def __init__(self, kb: KernelBuilder, x: DramTensor, n: int, k: int, g: int):
        self.n, self.k, self.w, self.rounds = n, k, max(n, 8), math.ceil(k / 8)
        spare = 8 * self.rounds
        self.xin = kb.tile(g * n, x.dtype)
        self.bufs = [kb.tile(self.w, "float32") for _ in range(3)]
        self.tops = kb.tile(g * k + spare, "float32")
        self.vals = kb.tile(g * k + spare, "float32")
        self.idx = kb.tile(g * k + spare, "uint32")
        self.ints = [kb.tile(g * k, "int32") for _ in range(2)]
        self.pe = (x.dtype in TWO_KEYS and PE_MIN <= self.w
                   and self.w * 4 <= kb.target.psum_bytes)
        self.pe_tiles = []
        if self.pe:
            self.count = kb.tile(self.w, "float32", mem="psum")
            self.masks = [kb.tile(self.w, "bfloat16") for _ in range(2)]
            pmax = kb.target.partitions
            self.ident = kb.tile(pmax, "bfloat16")
            self.pe_tiles = [self.count, *self.masks, self.ident]
            kb.emit(isa.Memset, dst=self.ident, value=1.0, engine="gpsimd")
            kb.emit(isa.AffineSelect, dst=self.ident, on_true_tile=self.ident,
                    on_false_value=0.0, pattern=((-1, pmax),), channel_multiplier=1,
                    cmp_op="is_equal")

    def all(self) -> list[isa.Tile]:
        return [self.xin, *self.bufs, self.tops, self.vals, self.idx, *self.ints,
                *self.pe_tiles]


def _view(t: isa.Tile, parts: int, n: int, dtype: str, at: int = 0) -> isa.Tile:
    v = sub(t, parts, n, at=at)
    return v.with_(dtype=dtype) if dtype != t.dtype else v


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


def _one_key(kb: KernelBuilder, t: _Tiles, x: isa.Tile, p: int) -> isa.Tile:
    """The FP32 key of a line of an 8/16-bit type `x`, in bufs[0]."""
    key, scratch = t.bufs[0], t.bufs[1]
    kf = sub(key, p, t.n)
    if x.dtype in ("bfloat16", "float16"):
        _flip(kb, kf, x.with_(dtype="int16"), _view(scratch, p, t.n, "int16"), 16)
    else:
        kb.emit(isa.TensorCopy, dst=kf, src=x)
    _pad(kb, key, p, t.n, t.w)
    return sub(key, p, t.w)


def _two_keys(kb: KernelBuilder, t: _Tiles, x: isa.Tile, p: int, tops: isa.Tile) -> isa.Tile:
    """C = 256 * #{j : a_j <= A} + B (FP32, in bufs[2]) of a line of a 32-bit type; the
    a_j go to `tops` ([p, 8 R])."""
    n, k = t.n, t.k
    a, work, bkey = t.bufs
    if x.dtype == "float32":
        kk = _view(work, p, n, "int32")
        _flip(kb, kk, x.with_(dtype="int32"), _view(bkey, p, n, "int32"), 32)
    elif x.dtype == "uint32":
        kk = _view(work, p, n, "int32")
        kb.emit(isa.TensorScalar, dst=kk, data=x, op0="bitwise_xor", operand0=2 ** 31)
    else:
        kk = x
    kb.emit(isa.TensorScalar, dst=sub(bkey, p, n), data=kk, op0="bitwise_and", operand0=255)
    kb.emit(isa.TensorScalar, dst=sub(a, p, n), data=kk, op0="shift_right_arithmetic",
            operand0=8)
    for buf in (a, bkey):
        _pad(kb, buf, p, n, t.w)
    a, work, bkey = sub(a, p, t.w), sub(work, p, t.w), sub(bkey, p, t.w)
    _rounds(kb, a, tops, None, t.rounds, work)
    count = _rank_pe(kb, t, a, tops) if t.pe else _rank_vector(kb, a, tops, work, k)
    kb.emit(isa.ScalarTensorTensor, dst=bkey, data=count, op0="multiply", operand0=256.0,
            op1="add", operand1=bkey)
    return bkey


def _rank_vector(kb: KernelBuilder, a: isa.Tile, tops: isa.Tile, work: isa.Tile,
                 k: int) -> isa.Tile:
    """#{j : a_j <= A} in `work`: k VectorE passes."""
    p = a.num_partitions
    for j in range(k):
        aj = sub(tops, p, 1, at=j)
        if j == 0:
            kb.emit(isa.TensorScalar, dst=work, data=a, op0="is_ge", operand0=aj)
        else:
            kb.emit(isa.ScalarTensorTensor, dst=work, data=a, op0="is_ge", operand0=aj,
                    op1="add", operand1=work)
    return work


def _rank_pe(kb: KernelBuilder, t: _Tiles, a: isa.Tile, tops: isa.Tile) -> isa.Tile:
    """#{j : a_j <= A} in PSUM: BF16 indicator tiles (VectorE) summed by TensorE, one
    matmul per PSUM bank of columns (§2.2)."""
    p, w, bank = a.num_partitions, a.free_size, kb.target.psum_bank_fp32
    count, ident = sub(t.count, p, w), sub(t.ident, p, p)
    for j in range(t.k):
        mask = sub(t.masks[j % 2], p, w)
        kb.emit(isa.TensorScalar, dst=mask, data=a, op0="is_ge", operand0=sub(tops, p, 1, at=j))
        for c0 in range(0, w, bank):
            cn = min(bank, w - c0)
            kb.emit(isa.NcMatmul, dst=sub(count, p, cn, at=c0), stationary=ident,
                    moving=sub(mask, p, cn, at=c0), accumulate=j > 0)
    return count


def _rounds(kb: KernelBuilder, key: isa.Tile, vals: isa.Tile, idx: isa.Tile | None,
            rounds: int, work: isa.Tile | None = None) -> None:
    """vals (and idx) [p, 8 x rounds] = the largest keys (and their positions), by rounds
    of max8 (+ find_index8), each followed by match_replace8 of what it found: in place,
    or into `work` (then `key` is left as it was)."""
    p = key.num_partitions
    for r in range(rounds):
        m = sub(vals, p, 8, at=8 * r)
        kb.emit(Max8, dst=m, src=key)
        if idx is not None:
            kb.emit(FindIndex8, dst=sub(idx, p, 8, at=8 * r), data=key, vals=m)
        if r + 1 < rounds:
            dst = key if work is None else work
            kb.emit(MatchReplace8, dst=dst, data=key, vals=m, imm=NEG_INF)
            key = dst


def _values_from_keys(kb: KernelBuilder, t: _Tiles, x: DramTensor, out: isa.DramAP,
                      p: int, gk: int) -> None:
    """One-key types: the value is the key (integers) or its flip (16-bit floats)."""
    keys = sub(t.vals, p, gk)
    if x.dtype not in ("bfloat16", "float16"):
        kb.dma(out, keys)
        return
    kq, scratch = (_view(i, p, gk, "int16") for i in t.ints)
    kb.emit(isa.TensorCopy, dst=kq, src=keys)
    _flip(kb, kq, kq, scratch, 16)
    kb.dma(out, kq.with_(dtype=x.dtype))


def _values_from_two_keys(kb: KernelBuilder, t: _Tiles, x: DramTensor, out: isa.DramAP,
                          p: int, gk: int) -> None:
    """32-bit types: K = 256 a_t + (C_t & 255), then the key flip undone."""
    kk, b = (sub(i, p, gk) for i in t.ints)
    kb.emit(isa.TensorCopy, dst=kk, src=sub(t.tops, p, gk))
    kb.emit(isa.TensorCopy, dst=b, src=sub(t.vals, p, gk))
    kb.emit(isa.TensorScalar, dst=b, data=b, op0="bitwise_and", operand0=255)
    kb.emit(isa.TensorScalar, dst=kk, data=kk, op0="shift_left", operand0=8)
    kb.emit(isa.TensorTensor, dst=kk, data1=kk, data2=b, op="bitwise_or")
    if x.dtype == "float32":
        _flip(kb, b, kk, b, 32)
    elif x.dtype == "uint32":
        kb.emit(isa.TensorScalar, dst=b.with_(dtype="uint32"), data=kk, op0="bitwise_xor",
                operand0=2 ** 31)
    else:
        b = kk
    kb.dma(out, b.with_(dtype=x.dtype))


def _blocks(rows: int, gmax: int, pmax: int) -> list[tuple[int, int, int]]:
    """(first line, partitions, lines per partition) covering `rows` lines."""
    out, r = [], 0
    while r < rows:
        rem = rows - r
        g = max(1, min(rem // pmax, gmax))
        p = min(pmax, rem) if g == 1 else pmax
        out.append((r, p, g))
        r += p * g
    return out


def _block(kb: KernelBuilder, t: _Tiles, x: DramTensor, outs, r0: int, p: int,
           g: int) -> None:
    n, k = t.n, t.k
    vout, iout = outs
    kb.dma(sub(t.xin, p, g * n), kb.ap(x, r0 * n, ((g * n, p), (1, g * n))))
    for i in range(g):
        line = sub(t.xin, p, n, at=i * n)
        width = 8 * t.rounds
        if x.dtype in ONE_KEY:
            key = _one_key(kb, t, line, p)
        else:
            key = _two_keys(kb, t, line, p, sub(t.tops, p, width, at=i * k))
        _rounds(kb, key, sub(t.vals, p, width, at=i * k), sub(t.idx, p, width, at=i * k),
                t.rounds)
    pattern = ((g * k, p), (1, g * k))
    kb.dma(kb.ap(iout, r0 * k, pattern), sub(t.idx, p, g * k))
    if x.dtype in ONE_KEY:
        _values_from_keys(kb, t, x, kb.ap(vout, r0 * k, pattern), p, g * k)
    else:
        _values_from_two_keys(kb, t, x, kb.ap(vout, r0 * k, pattern), p, g * k)


@register_lowering("top_k")
def _top_k_lower(ctx: LowerCtx, x: DramTensor, *, k: int) -> None:
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
    blocks = _blocks(rows, max(1, XIN_BYTES // (n * hw_dtypes.itemsize(x.dtype))),
                     ctx.target.partitions)
    t = _Tiles(kb, x, n, k, max(g for _, _, g in blocks))
    for r0, p, g in blocks:
        _block(kb, t, x, ctx.outs, r0, p, g)
    kb.release(*t.all())
