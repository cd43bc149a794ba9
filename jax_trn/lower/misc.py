"""rng_bit_generator, partition_id / replica_id and custom_call.

rng_bit_generator: XLA's CPU backend expands the DEFAULT algorithm as PHILOX
(`RngBitGeneratorExpander(RNG_PHILOX)`), so DEFAULT and PHILOX both run Philox-4x32-10
here, bit for bit as XLA does it for a u64[2] state: the key is state[0], the 128-bit
counter is (state[1] low, state[0] high), counter c + i gives output words
4i .. 4i + 3 (32-bit results; narrower types keep the low bits of each word, 64-bit
results take words (0, 1) and (2, 3) as two values), and the new state is
(state[0], state[1] + ceil(words / 4)).

THREE_FRY runs Threefry-2x32 (20 rounds) as XLA's prng.cc expands it: key = state[0]
(low word, high word), the 64-bit counter state[1] + i gives two words (x0, x1).
64-bit results: value i = x0 | x1 << 32 of counter i, new state state[1] + size.
Narrower results (narrow ones keep each word's low bits) split the shape on its first
even dimension (else its largest, first of equals; a scalar as [1]): with
A = the product of the dimensions before it, D its size, B of those after and
h = ceil(D / 2), element (a, 2i + j, b) is word x_j of counter (a h + i) B + b, the
x1 of i = h - 1 dropped when D is odd; the new state is state[1] + A h B.

Both run on GpSimd in 32-bit integer lanes (§2.5: no 64-bit multiply): the state is
DMAed into every partition (a stride-0 partition pattern) and its words used as
per-partition TensorScalar operands; counters come from an Iota (carries as
carry = sum < addend). Philox: counters tiled [128, <=512], the ten rounds compute
mulhi / mullo of 32-bit words with 16-bit limbs (17 instructions per product), ~390
GpSimd instructions per tile. Threefry: tiles of <= 2048 counters per partition
(partitions over rows, groups or columns, whichever costs least), a round is 5
instructions (add, rotate as shift / shift / or, xor; key injections folded into the
next round's operands), ~111 per tile. The words of a counter are adjacent
outputs: one bit-exact TensorCopy per word (round-robin over VectorE / GpSimd /
ScalarE), each writing that word of every counter through a strided access pattern
(16 bytes or less, full bandwidth, §3.1), interleave them before a contiguous store
(4-byte DMA descriptors would be ~600x slower, §3.4).

partition_id / replica_id: read from a per-device DRAM scalar the runtime writes.

custom_call: JAX emits targets for other platforms (LAPACK, cuSOLVER, host
callbacks, ...); none has a trn implementation, so each is a compile error naming the
target. Except `dce_sink` (`lax.dce_sink`): a side-effecting sink with no results whose
only job is to keep its operand's computation alive through DCE; it emits nothing
(its operand is still computed, as XLA's CPU backend does).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .errors import LoweringError
from .layout import FlatTile, flat_tiles, tiles
from .registry import LowerCtx, register_lowering

__all__ = ["philox_kernel", "three_fry_kernel"]

_M32 = 0xFFFFFFFF
PHILOX_ROUNDS = 10
PHILOX_W = (0x9E3779B9, 0xBB67AE85)        # key increments per round
PHILOX_M = (0xD2511F53, 0xCD9E8D57)        # round multipliers
THREE_FRY_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)   # group g: [4 (g % 2), +4)
THREE_FRY_PARITY = 0x1BD11BDA              # the third key word is key0 ^ key1 ^ this
THREE_FRY_GROUPS = 5                       # of four rounds, then a key injection
RNG_FREE = 512                             # elements per partition of one tile
# Counters per partition of a Threefry tile: 4 scratch words + 2 output words + the
# narrow copy, <= 56 KiB of SBUF (§3.1); the instruction start-ups are ~4% of the time.
THREE_FRY_FREE = 2048
# A Threefry tile's ~111 GpSimd instructions cost 150 cycles each to start plus ~180
# cycles per element in all (§6.3: 150 + N): a tile is worth ~100 elements of work.
THREE_FRY_TILE_COST = 100
_G = "gpsimd"


# --- custom_call, partition_id, replica_id -------------------------------------------

NO_OP_TARGETS = frozenset({"dce_sink"})     # sinks with no results: nothing to run

@register_lowering("custom_call")
def _custom_call_lower(ctx: LowerCtx, *operands: DramTensor, call_target_name: str = "",
                       **_attrs) -> None:
    if call_target_name in NO_OP_TARGETS:
        return
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
    kernel = _RNG_KERNELS.get(rng_algorithm)
    if kernel is None:
        raise LoweringError(f"rng_bit_generator algorithm {rng_algorithm} is not supported "
                            f"on trn (DEFAULT, PHILOX and THREE_FRY are): "
                            f"{ctx.op.describe()}")
    if tuple(state.shape) != (2,) or state.dtype != "uint64":
        raise LoweringError(f"rng_bit_generator with a {state.dtype}{list(state.shape)} "
                            f"state (trn takes uint64[2]): {ctx.op.describe()}")
    bits = ctx.outs[1]
    if not ir.is_int(bits.dtype):
        raise LoweringError(f"rng_bit_generator of {bits.dtype} values: "
                            f"{ctx.op.describe()}")
    kernel(ctx.kb, state, ctx.outs[0], bits)


def philox_kernel(kb: KernelBuilder, state: DramTensor, new_state: DramTensor,
                  bits: DramTensor) -> None:
    """Writes XLA's Philox bits for `state` into `bits` and the next state."""
    per = 2 if ir.np_dtype(bits.dtype).itemsize == 8 else 4     # elements per counter
    st, words = _load_state(kb, state)
    keys = _round_keys(kb, words)
    blocks = flat_tiles(bits.size // per, RNG_FREE, kb.target.partitions)
    if bits.size % per:                                    # the last, partial counter
        blocks.append(FlatTile(bits.size // per, 1, 1, 1))
    if blocks:
        free = max(b.free for b in blocks)
        scratch = [kb.tile(free, "uint32") for _ in range(13)]
        words_out = kb.tile(4 * free, "uint32")
        narrow = kb.tile(4 * free, bits.dtype) if ir.np_dtype(bits.dtype).itemsize < 4 \
            else None
        engines = itertools.cycle(("vector", "gpsimd", "scalar"))
        for b in blocks:
            mine = [sub(t, b.parts, b.free) for t in scratch]
            y = _philox_block(kb, b, mine, [sub(w, b.parts) for w in _cols(words, 4)],
                              [sub(k, b.parts) for k in _cols(keys, 2 * PHILOX_ROUNDS)])
            val = _interleave(kb, y, sub(words_out, b.parts, 4 * b.free), engines)
            val = _as_bits(kb, val, bits.dtype, narrow)
            count = min(per * b.free, bits.size - per * b.offset)
            kb.dma(kb.ap(bits, per * b.offset, ((per * b.pstride, b.parts), (1, count))),
                   sub(val, free=count))
        kb.release(words_out, *scratch, *([narrow] if narrow is not None else []))
    _next_state(kb, words, new_state, -(-bits.size // per))
    kb.release(keys, st)


def _load_state(kb: KernelBuilder, state: DramTensor) -> tuple[isa.Tile, isa.Tile]:
    """The u64[2] state in every partition (a stride-0 partition pattern), and the same
    bytes as [P, 4] uint32 words (key low, key high, counter low, counter high)."""
    st = kb.tile(2, "uint64")
    kb.dma(st, kb.ap(state, 0, ((0, kb.target.partitions), (1, 2))))
    return st, st.with_(dtype="uint32", free=(4,))


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


def _interleave(kb, y, out: isa.Tile, engines, cols: int = 1) -> isa.Tile:
    """out[:, q, j, f] = y[j][:, q * cols + f]: the words of each counter side by side
    (cols = 1), or rows of `cols` counters' word j one after another, one bit-exact copy
    per word through a strided destination pattern (§3.1)."""
    rows = y[0].free_size // cols
    dims = [(n, st) for n, st in ((rows, len(y) * cols), (cols, 1)) if n > 1] or [(1, 1)]
    free, strides = zip(*dims)
    for j, word in enumerate(y):
        dst = sub(out, free=1, at=j * cols)
        dst = dst.with_(free=free) if strides == (1,) else \
            dst.with_(free=free, strides=strides)
        kb.emit(isa.TensorCopy, dst=dst, src=word.with_(free=free), engine=next(engines))
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


# --- Threefry-2x32 -----------------------------------------------------------------------

@dataclass(frozen=True)
class _Rows:
    """Part of a Threefry output: G groups of T rows of B counters, counter
    c + g cg + t B + b, its words x_j (j < nj) at word o + g og + (2t + j) B + b."""
    G: int
    T: int
    B: int
    cg: int
    og: int
    c: int = 0
    o: int = 0
    nj: int = 2


@dataclass(frozen=True)
class _Block:
    """One tile: counter c0 + p cps + q B + f (p < parts, q < rows, f < cols), its
    word j at o0 + p ops + (2q + j) B + f."""
    c0: int
    o0: int
    parts: int
    cps: int
    ops: int
    rows: int
    cols: int


def three_fry_layout(shape: tuple[int, ...], wide: bool) -> tuple[int, list[_Rows]]:
    """(counters used, the parts of the output) as XLA's prng.cc lays Threefry out:
    64-bit values are the word pairs of counters 0..n-1; narrower ones split the shape
    on its first even dimension, else its largest (a scalar as [1]), into (A, D, B),
    rows 2i and 2i + 1 of a group being words x0 and x1 of its row i of counters.

    >>> three_fry_layout((3, 4, 5), False)
    (30, [_Rows(G=1, T=6, B=5, cg=0, og=0, c=0, o=0, nj=2)])
    >>> for r in three_fry_layout((3, 5), False)[1]: print(r)
    _Rows(G=3, T=2, B=1, cg=3, og=5, c=0, o=0, nj=2)
    _Rows(G=3, T=1, B=1, cg=3, og=5, c=2, o=4, nj=1)
    """
    n = math.prod(shape)
    if wide:
        return n, [_Rows(1, n, 1, 0, 0)] if n else []
    if n == 0:
        return 0, []
    dims = shape or (1,)
    even = [i for i, d in enumerate(dims) if d % 2 == 0]
    s = even[0] if even else dims.index(max(dims))
    a, d, b = math.prod(dims[:s]), dims[s], math.prod(dims[s + 1:])
    h = -(-d // 2)
    if d % 2 == 0:
        return a * h * b, [_Rows(1, a * h, b, 0, 0)]
    full = [_Rows(a, h - 1, b, h * b, d * b)] if h > 1 else []
    return a * h * b, full + [_Rows(a, 1, b, h * b, d * b, (h - 1) * b, (d - 1) * b, 1)]


def _by_rows(r: _Rows, pmax: int) -> Iterator[_Block]:
    """Partitions over rows: runs of whole rows each (rows of <= THREE_FRY_FREE
    counters), else one row's columns in chunks."""
    for g in range(r.G):
        c, o = r.c + g * r.cg, r.o + g * r.og
        if r.B <= THREE_FRY_FREE:
            for t in flat_tiles(r.T, THREE_FRY_FREE // r.B, pmax):
                yield _Block(c + t.offset * r.B, o + 2 * t.offset * r.B, t.parts,
                             t.pstride * r.B, 2 * t.pstride * r.B, t.free, r.B)
        else:
            for t0, tp in tiles(r.T, pmax):
                for b0, bc in tiles(r.B, THREE_FRY_FREE):
                    yield _Block(c + t0 * r.B + b0, o + 2 * t0 * r.B + b0, tp, r.B,
                                 2 * r.B, 1, bc)


def _by_groups(r: _Rows, pmax: int) -> Iterator[_Block]:
    """Partitions over groups, each a run of rows or of one row's columns."""
    chunks = ([(t0, tq, 0, r.B) for t0, tq in tiles(r.T, THREE_FRY_FREE // r.B)]
              if r.B <= THREE_FRY_FREE else
              [(t, 1, b0, bc) for t in range(r.T) for b0, bc in tiles(r.B, THREE_FRY_FREE)])
    for g0, gp in tiles(r.G, pmax):
        for t0, tq, b0, bc in chunks:
            yield _Block(r.c + g0 * r.cg + t0 * r.B + b0,
                         r.o + g0 * r.og + 2 * t0 * r.B + b0, gp, r.cg, r.og, tq, bc)


def _by_cols(r: _Rows, pmax: int) -> Iterator[_Block]:
    """Partitions over the columns of one row."""
    for g in range(r.G):
        for t in range(r.T):
            c, o = r.c + g * r.cg + t * r.B, r.o + g * r.og + 2 * t * r.B
            for f in flat_tiles(r.B, THREE_FRY_FREE, pmax):
                yield _Block(c + f.offset, o + f.offset, f.parts, f.pstride, f.pstride, 1,
                             f.free)


def three_fry_blocks(r: _Rows, pmax: int) -> list[_Block]:
    """The cheapest of the tilings by rows, groups and columns over `pmax` partitions:
    each tile costs THREE_FRY_TILE_COST plus its elements per partition (a candidate is
    dropped as soon as it costs more than the best so far).

    >>> [(b.parts, b.rows, b.cols) for b in three_fry_blocks(_Rows(1, 512, 1024, 0, 0), 128)]
    [(128, 2, 1024), (128, 2, 1024)]
    >>> [(b.parts, b.rows, b.cols)
    ...  for b in three_fry_blocks(_Rows(1, 512, 4096, 0, 0), 128)][:2]
    [(128, 1, 2048), (128, 1, 2048)]
    >>> [(b.parts, b.rows, b.cols) for b in three_fry_blocks(_Rows(1, 1, 65536, 0, 0), 128)][:1]
    [(128, 1, 512)]
    """
    best, best_cost = [], math.inf
    for tiling in (_by_rows, _by_groups, _by_cols):
        blocks, cost = [], 0
        for b in tiling(r, pmax):
            cost += THREE_FRY_TILE_COST + b.rows * b.cols
            if cost >= best_cost:
                break
            blocks.append(b)
        else:
            best, best_cost = blocks, cost
    return best


def three_fry_kernel(kb: KernelBuilder, state: DramTensor, new_state: DramTensor,
                     bits: DramTensor) -> None:
    """Writes XLA's Threefry-2x32 bits for `state` into `bits` and the next state."""
    wide = ir.np_dtype(bits.dtype).itemsize == 8
    counters, parts = three_fry_layout(tuple(bits.shape), wide)
    st, words = _load_state(kb, state)
    keys = _three_fry_keys(kb, words)
    work = [(r, b) for r in parts for b in three_fry_blocks(r, kb.target.partitions)]
    if work:
        free = max(b.rows * b.cols for _, b in work)
        scratch = [kb.tile(free, "uint32") for _ in range(4)]
        words_out = kb.tile(2 * free, "uint32")
        narrow = kb.tile(2 * free, bits.dtype) if ir.np_dtype(bits.dtype).itemsize < 4 \
            else None
        engines = itertools.cycle(("vector", "gpsimd", "scalar"))
        for r, b in work:
            n = b.rows * b.cols
            c, x0, x1, t = (sub(tt, b.parts, n) for tt in scratch)
            kb.emit(isa.Iota, dst=c, pattern=_axes(((r.B, b.rows), (1, b.cols))),
                    offset=b.c0, channel_multiplier=b.cps)
            _three_fry_block(kb, c, x0, x1, t, [sub(w, b.parts) for w in _cols(words, 4)],
                             [sub(k, b.parts) for k in _cols(keys, _TF_KEYS)])
            val = x0 if r.nj == 1 else \
                _interleave(kb, [x0, x1], sub(words_out, b.parts, 2 * n), engines, b.cols)
            val = _as_bits(kb, val, "uint32" if wide else bits.dtype, narrow)
            pattern = ((b.ops, b.parts),
                       *_axes(((2 * r.B, b.rows), (r.B, r.nj), (1, b.cols))))
            # 64-bit values are stored as their words (a uint32 view of the tensor).
            dst = kb.ap(bits, b.o0, pattern)
            kb.dma(dataclasses.replace(dst, dtype="uint32") if wide else dst, val)
        kb.release(words_out, *scratch, *([narrow] if narrow is not None else []))
    _next_state(kb, words, new_state, counters)
    kb.release(keys, st)


def _axes(pattern: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """The (stride, num) pairs of `pattern` with more than one element, at least one."""
    return tuple((st, n) for st, n in pattern if n > 1) or ((1, 1),)


# Columns of the Threefry key tile: ks2, counter high + key1, then for the injections
# after groups 0..4 the x1 addends b_g = ks[(g + 2) % 3] + g + 1, and for groups 0..3
# a_g + b_g with a_g = ks[(g + 1) % 3] (folded into the next group's first round).
_TF_KS2, _TF_HIGH, _TF_B, _TF_AB = 0, 1, 2, 2 + THREE_FRY_GROUPS
_TF_KEYS = _TF_AB + THREE_FRY_GROUPS - 1


def _three_fry_keys(kb: KernelBuilder, words: isa.Tile) -> isa.Tile:
    """[P, _TF_KEYS] per-partition key constants (see above), mod 2**32."""
    keys = kb.tile(_TF_KEYS, "uint32")
    k = _cols(keys, _TF_KEYS)
    w = _cols(words, 4)
    _tt(kb, k[_TF_KS2], w[0], w[1], "bitwise_xor")
    _ts(kb, k[_TF_KS2], k[_TF_KS2], "bitwise_xor", THREE_FRY_PARITY)
    _tt(kb, k[_TF_HIGH], w[3], w[1], "add")
    ks = (w[0], w[1], k[_TF_KS2])
    for g in range(THREE_FRY_GROUPS):
        _ts(kb, k[_TF_B + g], ks[(g + 2) % 3], "add", g + 1)
        if g < THREE_FRY_GROUPS - 1:
            _tt(kb, k[_TF_AB + g], k[_TF_B + g], ks[(g + 1) % 3], "add")
    return keys


def _three_fry_block(kb, c, x0, x1, t, w, k) -> None:
    """(x0, x1) = Threefry-2x32(state[1] + c, key): the counter's words plus the key,
    then five groups of four rounds x0 += x1, x1 = rotl(x1, r) ^ x0, each group followed
    by a key injection; that of groups 0..3 folded into the next round as
    x0 += a + b, x0 += x1, x1 = rotl(x1 + b, r) ^ x0. `c` is overwritten."""
    _ts(kb, x0, c, "add", w[2])                              # counter low word
    _tt(kb, c, x0, c, "is_lt")                               # its carry
    _ts(kb, x1, c, "add", k[_TF_HIGH])                       # counter high word + key1
    _ts(kb, x0, x0, "add", w[0])                             # + key0
    for g in range(THREE_FRY_GROUPS):
        for i in range(4):
            rot = THREE_FRY_ROTATIONS[4 * (g % 2) + i]
            pre = () if g == 0 or i else ("add", k[_TF_B + g - 1])
            if pre:
                _ts(kb, x0, x0, "add", k[_TF_AB + g - 1])
            _tt(kb, x0, x0, x1, "add")
            _ts(kb, t, x1, *pre, "shift_right_logical", 32 - rot)
            _ts(kb, x1, x1, *pre, "shift_left", rot)
            _tt(kb, x1, x1, t, "bitwise_or")
            _tt(kb, x1, x1, x0, "bitwise_xor")
    _ts(kb, x0, x0, "add", k[_TF_KS2])                       # a_4 = ks[5 % 3]
    _ts(kb, x1, x1, "add", k[_TF_B + THREE_FRY_GROUPS - 1])


_RNG_KERNELS = {"DEFAULT": philox_kernel, "PHILOX": philox_kernel,
                "THREE_FRY": three_fry_kernel}
