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
per-partition TensorScalar operands; counters are tiled [128, <=512] from an Iota (the
128-bit add as four 32-bit adds with carries, carry = sum < addend), the ten rounds
compute mulhi / mullo of 32-bit words with 16-bit limbs (17 instructions per
product), ~390 GpSimd instructions per tile. The four words of a counter are adjacent
outputs: four bit-exact TensorCopies (round-robin over VectorE / GpSimd / ScalarE),
each writing one word of every counter through a stride-4 access pattern (16 bytes,
full bandwidth, §3.1), interleave them before a contiguous store (4-byte DMA
descriptors would be ~600x slower, §3.4).

partition_id / replica_id: read from a per-device DRAM scalar the runtime writes.

custom_call: JAX emits targets for other platforms (LAPACK, cuSOLVER, host
callbacks, ...); none has a trn implementation, so each is a compile error naming the
target.
"""
from __future__ import annotations

import itertools

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .errors import LoweringError
from .layout import P, FlatTile, flat_tiles
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
    per = 2 if ir.np_dtype(bits.dtype).itemsize == 8 else 4     # elements per counter
    st = kb.tile(2, "uint64")
    kb.dma(st, kb.ap(state, 0, ((0, P), (1, 2))))          # every partition: the state
    words = st.with_(dtype="uint32", free=(4,))
    keys = _round_keys(kb, words)
    blocks = flat_tiles(bits.size // per, RNG_FREE)
    if bits.size % per:                                    # the last, partial counter
        blocks.append(FlatTile(bits.size // per, 1, 1, 1))
    if blocks:
        free = max(b.free for b in blocks)
        tiles = [kb.tile(free, "uint32") for _ in range(13)]
        words_out = kb.tile(4 * free, "uint32")
        narrow = kb.tile(4 * free, bits.dtype) if ir.np_dtype(bits.dtype).itemsize < 4 \
            else None
        engines = itertools.cycle(("vector", "gpsimd", "scalar"))
        for b in blocks:
            mine = [sub(t, b.parts, b.free) for t in tiles]
            y = _philox_block(kb, b, mine, [sub(w, b.parts) for w in _cols(words, 4)],
                              [sub(k, b.parts) for k in _cols(keys, 2 * PHILOX_ROUNDS)])
            val = _interleave(kb, y, sub(words_out, b.parts, 4 * b.free), engines)
            val = _as_bits(kb, val, bits.dtype, narrow)
            count = min(per * b.free, bits.size - per * b.offset)
            kb.dma(kb.ap(bits, per * b.offset, ((per * b.pstride, b.parts), (1, count))),
                   sub(val, free=count))
        kb.release(words_out, *tiles, *([narrow] if narrow is not None else []))
    _next_state(kb, words, new_state, -(-bits.size // per))
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


def _philox_block(kb, block, t, w, keys) -> list[isa.Tile]:
    """The four output words of counters offset + p * pstride + f (`t`: 13 scratch)."""
    c, x, y, tmp = t[0], t[1:5], t[5:9], t[9:13]
    kb.emit(isa.Iota, dst=c, pattern=((1, block.free),), offset=block.offset,
            channel_multiplier=block.pstride)
    _counter(kb, x, c, w)
    for r in range(PHILOX_ROUNDS):
        _round(kb, x, y, keys[2 * r], keys[2 * r + 1], tmp)
        x, y = y, x
    return x


def _counter(kb, x, c, w) -> None:
    """x = the 128-bit counter (state[1] low, state[0] high) + c, in 32-bit words,
    carry = (sum < addend); c is overwritten with the carries."""
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


def _interleave(kb, y, out: isa.Tile, engines) -> isa.Tile:
    """out[:, 4f + j] = y[j][:, f]: the words of each counter side by side, one
    bit-exact copy per word through a stride-4 destination pattern (§3.1)."""
    n = y[0].free_size
    for j in range(4):
        dst = sub(out, free=1, at=j).with_(free=(n,), strides=(4,))
        kb.emit(isa.TensorCopy, dst=dst, src=y[j], engine=next(engines))
    return out


def _as_bits(kb, words: isa.Tile, dtype: str, narrow: isa.Tile | None) -> isa.Tile:
    """The output elements: the words themselves (32-bit types), pairs of words
    (64-bit: low word first, as XLA combines them), or each word's low bits."""
    size = ir.np_dtype(dtype).itemsize
    if size >= 4:
        return words.with_(dtype=dtype, free=(words.free_size * 4 // size,))
    dst = sub(narrow, words.num_partitions, words.free_size)
    kb.emit(isa.TensorCopy, dst=dst, src=words, engine=_G)     # GpSimd copies wrap
    return dst


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
