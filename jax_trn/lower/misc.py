"""rng_bit_generator, partition_id / replica_id and custom_call.

rng_bit_generator: XLA's CPU backend expands the DEFAULT algorithm as PHILOX
(`RngBitGeneratorExpander(RNG_PHILOX)`), so DEFAULT and PHILOX both run Philox-4x32-10
here, bit for bit as XLA does it for a u64[2] state: the key is state[0], the 128-bit
counter is (state[1] low, state[0] high), counter c + i gives output words
4i .. 4i + 3 (32-bit results; narrower types keep the low bits of each word, 64-bit
results take words (0, 1) and (2, 3) as two values), and the new state is
(state[0], state[1] + ceil(words / 4)). THREE_FRY is a LoweringError.

It runs on GpSimd in 32-bit integer lanes (§2.5: no 64-bit multiply): the state is
DMAed into every partition (a stride-0 partition pattern) and its words used as
per-partition TensorScalar operands; each output element e gets its counter e >> 2
from an Iota (the 128-bit add as four 32-bit adds with carries, carry = sum < addend),
the ten rounds compute mulhi / mullo of 32-bit words with 16-bit limbs (17
instructions per product), and the element's word is picked with selects. Each
element computes its whole counter block (4x the minimal work) because no engine
writes a tile with a stride (the words of a block are adjacent outputs): that costs
GpSimd time instead of 4-byte DMA descriptors (§3.4, ~400x slower per byte). ~400
GpSimd instructions per [128, <=512] tile.

partition_id / replica_id: read from a per-device DRAM scalar the runtime writes.

custom_call: JAX emits targets for other platforms (LAPACK, cuSOLVER, host
callbacks, ...); none has a trn implementation, so each is a compile error naming the
target.
"""
from __future__ import annotations

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .errors import LoweringError
from .layout import P, flat_tiles
from .registry import LowerCtx, register_lowering

__all__ = ["philox_kernel"]

_M32 = 0xFFFFFFFF
PHILOX_ROUNDS = 10
PHILOX_W = (0x9E3779B9, 0xBB67AE85)        # key increments per round
PHILOX_M = (0xD2511F53, 0xCD9E8D57)        # round multipliers
RNG_FREE = 512                             # elements per partition of one tile
_G = "gpsimd"


# --- custom_call, partition_id, replica_id -------------------------------------------

@register_lowering("custom_call")
def _custom_call_lower(ctx: LowerCtx, *operands: DramTensor, call_target_name: str = "",
                       **_attrs) -> None:
    raise LoweringError(f"custom_call target {call_target_name!r} is not supported on trn "
                        f"(it is another platform's kernel or a host callback): "
                        f"{ctx.op.describe()}")


@register_lowering("partition_id", "replica_id")
def _device_id_lower(ctx: LowerCtx) -> None:
    """This device's id: a uint32 the runtime writes into DRAM for every execution
    ("sys:partition_id" / "sys:replica_id", `runtime.executable.bind_dram`), copied
    into the result by one DMA."""
    out, kb = ctx.outs[0], ctx.kb
    src = DramTensor(_ID_TENSORS[ctx.op.kind], (), "uint32")
    tile = kb.tile(1, "uint32", parts=1)
    kb.dma(tile, kb.ap(src, 0, ((1, 1), (1, 1))))
    kb.dma(kb.ap(out, 0, ((1, 1), (1, 1))), tile)
    kb.release(tile)


_ID_TENSORS = {"partition_id": "sys:partition_id", "replica_id": "sys:replica_id"}


# --- rng_bit_generator -----------------------------------------------------------------

@register_lowering("rng_bit_generator")
def _rng_bit_generator_lower(ctx: LowerCtx, state: DramTensor, *,
                             rng_algorithm: str = "DEFAULT", **_attrs) -> None:
    if rng_algorithm not in ("DEFAULT", "PHILOX"):
        raise LoweringError(f"rng_bit_generator algorithm {rng_algorithm} is not supported "
                            f"on trn (DEFAULT and PHILOX are): {ctx.op.describe()}")
    if tuple(state.shape) != (2,) or state.dtype != "uint64":
        raise LoweringError(f"rng_bit_generator with a {state.dtype}{list(state.shape)} "
                            f"state (trn takes uint64[2]): {ctx.op.describe()}")
    bits = ctx.outs[1]
    if not ir.is_int(bits.dtype):
        raise LoweringError(f"rng_bit_generator of {bits.dtype} values: "
                            f"{ctx.op.describe()}")
    philox_kernel(ctx.kb, state, ctx.outs[0], bits)


def philox_kernel(kb: KernelBuilder, state: DramTensor, new_state: DramTensor,
                  bits: DramTensor) -> None:
    """Writes XLA's Philox bits for `state` into `bits` and the next state."""
    wide = ir.np_dtype(bits.dtype).itemsize == 8
    st = kb.tile(2, "uint64")
    kb.dma(st, kb.ap(state, 0, ((0, P), (1, 2))))          # every partition: the state
    words = st.with_(dtype="uint32", free=(4,))
    keys = _round_keys(kb, words)
    blocks = flat_tiles(bits.size, RNG_FREE)
    if blocks:
        free = max(b.free for b in blocks)
        tiles = [kb.tile(free, "uint32") for _ in range(15)]
        out = kb.tile(free, bits.dtype)
        for b in blocks:
            mine = [sub(t, b.parts, b.free) for t in tiles]
            val = _philox_block(kb, b, mine, [sub(w, b.parts) for w in _cols(words, 4)],
                                [sub(k, b.parts) for k in _cols(keys, 2 * PHILOX_ROUNDS)],
                                wide, sub(out, b.parts, b.free))
            kb.dma(kb.ap(bits, b.offset, b.pattern), val)
        kb.release(out, *tiles)
    counters = -(-bits.size * (2 if wide else 1) // 4)
    _next_state(kb, words, new_state, counters)
    kb.release(keys, st)


def _cols(tile: isa.Tile, n: int) -> list[isa.Tile]:
    return [sub(tile, free=1, at=k) for k in range(n)]


def _ts(kb, dst, x, op0, a, op1=None, b=None):
    more = {} if op1 is None else {"op1": op1, "operand1": b}
    return kb.emit(isa.TensorScalar, dst=dst, data=x, op0=op0, operand0=a, engine=_G, **more)


def _tt(kb, dst, a, b, op):
    return kb.emit(isa.TensorTensor, dst=dst, data1=a, data2=b, op=op, engine=_G)


def _round_keys(kb: KernelBuilder, words: isa.Tile) -> isa.Tile:
    """[P, 20]: (key0 + r * W0, key1 + r * W1) mod 2**32 for the ten rounds."""
    keys = kb.tile(2 * PHILOX_ROUNDS, "uint32")
    for r in range(PHILOX_ROUNDS):
        for h in range(2):
            _ts(kb, sub(keys, free=1, at=2 * r + h), sub(words, free=1, at=h), "add",
                (r * PHILOX_W[h]) & _M32)
    return keys


def _philox_block(kb, block, t, w, keys, wide: bool, out: isa.Tile) -> isa.Tile:
    """Output elements offset + p * pstride + f of one flat tile (`t`: 15 scratch)."""
    e, x, y, tmp = t[0], t[1:5], t[5:9], t[9:13]
    kb.emit(isa.Iota, dst=e, pattern=((1, block.free),), offset=block.offset,
            channel_multiplier=block.pstride)
    _counter(kb, x, e, w, tmp[0], 1 if wide else 2)
    for r in range(PHILOX_ROUNDS):
        _round(kb, x, y, keys[2 * r], keys[2 * r + 1], tmp)
        x, y = y, x
    return _pick(kb, e, x, t[13], t[14], wide, out)


def _counter(kb, x, e, w, c, shift: int) -> None:
    """x = the 128-bit counter (state[1] low, state[0] high) + (e >> shift), in 32-bit
    words, carry = (sum < addend)."""
    _ts(kb, c, e, "shift_right_logical", shift)
    addends = (w[2], w[3], w[0], w[1])
    _ts(kb, x[0], c, "add", addends[0])
    for k in range(1, 4):
        _tt(kb, c, x[k - 1], c, "is_lt")                     # the carry out of word k-1
        _ts(kb, x[k], c, "add", addends[k])


def _round(kb, x, y, k0, k1, tmp) -> None:
    """y = one Philox round of x: (hi(x2 B) ^ x1 ^ k0, lo(x2 B), hi(x0 A) ^ x3 ^ k1,
    lo(x0 A))."""
    _mul_hi_lo(kb, x[0], PHILOX_M[0], y[2], y[3], tmp)
    _mul_hi_lo(kb, x[2], PHILOX_M[1], y[0], y[1], tmp)
    _tt(kb, y[0], y[0], x[1], "bitwise_xor")
    _ts(kb, y[0], y[0], "bitwise_xor", k0)
    _tt(kb, y[2], y[2], x[3], "bitwise_xor")
    _ts(kb, y[2], y[2], "bitwise_xor", k1)


def _mul_hi_lo(kb, x, k: int, hi, lo, tmp) -> None:
    """(hi, lo) = the 64-bit product x * k in 32-bit words, from 16-bit limbs:
    hi = xh kh + (xl kh >> 16) + (xh kl >> 16) + (mid >> 16),
    mid = (xl kl >> 16) + (xl kh & 0xffff) + (xh kl & 0xffff) < 3 * 2**16."""
    kl, kh = k & 0xFFFF, k >> 16
    a, b, c, d = tmp
    _ts(kb, lo, x, "multiply", k)                            # mod 2**32
    _ts(kb, a, x, "bitwise_and", 0xFFFF)                     # xl
    _ts(kb, hi, x, "shift_right_logical", 16)                # xh
    _ts(kb, b, a, "multiply", kl, "shift_right_logical", 16)
    _ts(kb, c, a, "multiply", kh)                            # xl kh
    _ts(kb, a, hi, "multiply", kl)                           # xh kl
    _ts(kb, hi, hi, "multiply", kh)                          # xh kh
    for part in (c, a):
        _ts(kb, d, part, "bitwise_and", 0xFFFF)
        _tt(kb, b, b, d, "add")
    for part in (b, c, a):
        _ts(kb, part, part, "shift_right_logical", 16)
        _tt(kb, hi, hi, part, "add")


def _pick(kb, e, y, p, v, wide: bool, out: isa.Tile) -> isa.Tile:
    """The element's word(s): word e % 4, or words (2h, 2h + 1) with h = e % 2 as one
    64-bit value; narrower types keep the low bits (GpSimd copies wrap)."""
    if wide:
        _ts(kb, p, e, "bitwise_and", 1)
        kb.emit(isa.Select, dst=v, pred=p, on_true=y[3], on_false=y[1], engine=_G)
        kb.emit(isa.TensorCopy, dst=out, src=v, engine=_G)
        _ts(kb, out, out, "shift_left", 32)
        kb.emit(isa.Select, dst=v, pred=p, on_true=y[2], on_false=y[0], engine=_G)
        _tt(kb, out, out, v, "bitwise_or")
        return out
    val = y[0]
    for j in (1, 2, 3):
        _ts(kb, p, e, "bitwise_and", 3, "is_equal", j)
        kb.emit(isa.Select, dst=v, pred=p, on_true=y[j], on_false=val, engine=_G)
        val = v
    if out.dtype == "uint32":
        return v
    if ir.np_dtype(out.dtype).itemsize == 4:
        return v.with_(dtype=out.dtype)                      # the same bits, signed
    kb.emit(isa.TensorCopy, dst=out, src=v, engine=_G)
    return out


def _next_state(kb, words: isa.Tile, new_state: DramTensor, counters: int) -> None:
    """(state[0], state[1] + counters mod 2**64) on partition 0."""
    ns = kb.tile(4, "uint32", parts=1)
    w = [sub(c, 1) for c in _cols(words, 4)]
    n = _cols(ns, 4)
    for k in (0, 1):
        kb.emit(isa.TensorCopy, dst=n[k], src=w[k], engine=_G)
    _ts(kb, n[2], w[2], "add", counters & _M32)
    _ts(kb, n[3], n[2], "is_lt", counters & _M32)              # carry
    _tt(kb, n[3], n[3], w[3], "add")
    _ts(kb, n[3], n[3], "add", counters >> 32)
    kb.dma(kb.ap(new_state, 0, ((2, 1), (1, 2))), ns.with_(dtype="uint64", free=(2,)))
    kb.release(ns)
