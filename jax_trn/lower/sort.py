"""sort: multi-operand, along any dimension, as a bitonic network on 32-bit sort words.

The keys come from the comparator region (sortkeys.py: ascending / descending, integer
orders, JAX's canonical float order or IEEE total order, `num_keys`).

On the device, per group of up to 128 lines (all positions of the other dims):

1. words: each line is DMAed into SBUF and every key becomes one or two int32 sort
   words whose signed order is the key's order: integers as they are (uint32 with the
   sign bit flipped; 64-bit keys as a signed high word and a sign-flipped low word),
   floats through their FP32 bits, w ^ ((w >> 31) & 0x7fffffff), with -0 -> 0 and NaN
   -> 0x7fc00000 when canonical; descending keys are inverted (~w). A last compared word
   is the element's index (iota), so every element is distinct and the result is
   stable. Lines are padded to a power of two N with INT32_MAX keys (after everything).
   Other operands of <= 32 bits ride along as uncompared words (their bits).
2. network: the bitonic sorting network, log2(N)(log2(N)+1)/2 compare-exchange steps,
   on GpSimd (native int32, §2.5). Our tiles are contiguous, so a step at distance j
   compares the word tiles with themselves shifted by j (position i against i + j, for
   every i at once): swap = lexicographic partner < self over the compared words
   (is_lt / is_equal / multiply / max), kept at the low position of each pair (bit j of
   i clear, from an iota) and flipped in blocks sorting descending (bit s of i); two
   Selects per word on views shifted by j exchange the pair into the other buffer.
   Cost per step ~ (5 + 4 x words) GpSimd instructions of N elements per 128 lines.
   Few lines are folded: each line cut into g segments on g x more partitions, the
   steps of distance j < N / g run on [g x lines, N / g] tiles (g x fewer elements per
   instruction), the others on [lines, N], words moved by SBUF -> SBUF DMA.
3. results: keys whose words are a bijection of their values (integers, bool, IEEE
   total-order floats) are rebuilt from the words; carried operands are their words;
   anything else (64-bit payloads) is gathered by the final index word with indirect
   DMAs (DmaGather, one descriptor per element, §3.4), bit-exact (NaN payloads, -0).

Lines longer than SBUF holds keep their words in an HBM temporary instead; every
operand is gathered at the end. Few such lines: the words are loaded folded ([g x
lines, N / g], contiguous rows) and the steps of distance j < N / g run on chip as
above; the others go through HBM: the pairs (i, i + j) come into SBUF as two
contiguous [lines, pairs] tiles through strided DMA patterns (runs of >= N / g
elements) and go back the same way. Many long lines: every step goes through HBM (the
small-j steps are then DMA-descriptor bound: runs of j elements).
"""
from __future__ import annotations

import itertools
import math

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .errors import LoweringError
from .layout import View, row_major, tiles
from .movement import copy
from .relayout import relayout
from .registry import LowerCtx, register_lowering
from .sortkeys import Key, keys
from .window import lines

INT32_MAX = 2 ** 31 - 1
SIGN = -2 ** 31                  # 0x80000000 as an int32 immediate
CANONICAL_NAN = 0x7FC00000
PAIR_CHUNK = 2048                # pairs per partition in one compare-exchange tile
SBUF_BUDGET = 150 * 1024         # bytes per partition the network's tiles may take
MAX_LEN = 16384                  # padded line length the words kernel handles at once
TRANSPOSE_MIN = 16               # strided sort axes at least this long (and wide) are
#                                  transposed to contiguous lines first
HYBRID_FOLD_BYTES = 48 * 1024     # on-chip words of the fold + HBM path, per partition
SBUF_SLACK = 16 * 1024           # of the kernel's SBUF kept free when sorting on chip
FOLD_MIN = 64                    # elements per partition below which lines are not folded
FLOATS = ("float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3",
          "float4_e2m1fn")
#        (float8 / float4 keys widen exactly to FP32 through the DMA, and narrow back exactly)


def word_count(dtype: str) -> int:
    return 2 if ir.np_dtype(dtype).itemsize == 8 else 1


# --- 1. sort words ---------------------------------------------------------------------------

def _float_words(kb: KernelBuilder, x: isa.Tile, w: isa.Tile, key: Key, scratch) -> None:
    """int32 words of FP32 `x` whose signed order is the float order."""
    bits = x.with_(dtype="int32")
    s = sub(scratch[0], x.num_partitions, x.free)
    kb.emit(isa.TensorScalar, dst=s, data=bits, op0="shift_right_arithmetic", operand0=31,
            op1="bitwise_and", operand1=INT32_MAX)
    kb.emit(isa.TensorTensor, dst=w, data1=bits, data2=s, op="bitwise_xor")
    if key.order != "float":
        return
    # -0 (word -1) -> 0: w += (w == -1)
    kb.emit(isa.TensorScalar, dst=s, data=w, op0="is_equal", operand0=-1, engine="gpsimd")
    kb.emit(isa.TensorTensor, dst=w, data1=w, data2=s, op="add", engine="gpsimd")
    # NaN (|bits| > inf) -> the canonical NaN's word (x is free once the flag is made)
    kb.emit(isa.TensorScalar, dst=s, data=bits, op0="bitwise_and", operand0=INT32_MAX)
    kb.emit(isa.TensorScalar, dst=s, data=s, op0="is_gt", operand0=0x7F800000,
            engine="gpsimd")
    kb.emit(isa.Memset, dst=bits, value=CANONICAL_NAN, engine="gpsimd")
    kb.emit(isa.Select, dst=w, pred=s, on_true=bits, on_false=w, engine="gpsimd")


def _int64_words(kb: KernelBuilder, x: isa.Tile, hi: isa.Tile, lo: isa.Tile,
                 signed: bool) -> None:
    kb.emit(isa.TensorScalar, dst=hi, data=x, op0="shift_right_arithmetic" if signed
            else "shift_right_logical", operand0=32)
    if not signed:
        kb.emit(isa.TensorScalar, dst=hi, data=hi, op0="bitwise_xor", operand0=SIGN)
    kb.emit(isa.TensorScalar, dst=lo, data=x, op0="bitwise_and", operand0=0xFFFFFFFF,
            op1="bitwise_xor", operand1=2 ** 31)


class _Plan:
    """The geometry shared by the three kernels."""

    def __init__(self, ctx: LowerCtx, xs, ks: list[Key], dim: int):
        self.xs, self.keys, self.dim = xs, ks, dim
        self.pmax = ctx.target.partitions
        self.shape = tuple(xs[0].shape)
        self.n = self.shape[dim]
        self.c = math.prod(self.shape[dim + 1:])
        self.big_n = 1 << max(1, (self.n - 1).bit_length())
        self.groups = []            # (line offset, (pstride, parts), first row)
        r = 0
        for offset, (pstride, parts) in lines(self.shape, dim, self.pmax):
            self.groups.append((offset, (pstride, parts), r))
            r += parts
        self.rows = r
        self.nwords = sum(word_count(xs[k.operand].dtype) for k in ks) + 1
        self.passive: list[int] = []    # operands carried through the network as words
        self.words: DramTensor | None = None      # the long-line path's HBM words

    def sbuf_bytes(self, g: int) -> int:
        """Per partition, for the on-chip path: words (compared and carried) twice, a
        select buffer, three masks and the index iota ([N] int32 each, and [N / g]
        folded), the 8-byte load / gather buffer."""
        width = self.big_n + (self.big_n // g if g > 1 else 0)
        words = self.nwords + len(self.passive)
        return (2 * words + 5) * 4 * width + 8 * self.n + 1024

    def word_offset(self, w: int, row: int) -> int:
        return (w * self.rows + row) * self.big_n

    def line_ap(self, kb, t: DramTensor, offset: int, pstride: int, parts: int):
        return kb.ap(t, offset, ((pstride, parts), (self.c, self.n)))


class _WordsScratch:
    """SBUF the word computation needs: a load buffer (8 bytes per element with 64-bit
    operands, else 4) and an int32 scratch tile of the line length (float keys)."""

    def __init__(self, kb: KernelBuilder, plan: _Plan, scratch: list[isa.Tile] | None = None):
        n = plan.n
        self.kb, self.n = kb, n
        wide = any(word_count(x.dtype) == 2 for x in plan.xs)
        self.load = kb.tile((8 if wide else 4) * n, "uint8")
        floats = any(plan.xs[k.operand].dtype in FLOATS for k in plan.keys)
        self.own = scratch is None
        if scratch is None:
            scratch = [kb.tile(n, "int32")] if floats else []
        self.scratch = scratch

    def loaded(self, parts: int, dtype: str) -> isa.Tile:
        return self.load.with_(num_partitions=parts, free=(self.n,), dtype=dtype)

    def close(self) -> None:
        self.kb.release(self.load, *(self.scratch if self.own else []))


def _group_words(kb: KernelBuilder, plan: _Plan, group, outs, ws: _WordsScratch,
                 passive=(), sink=None) -> None:
    """The sort words of one group of lines into the tiles `outs` yields ([parts, N]
    int32 each, the index word last), padded with INT32_MAX keys; `sink(w, tile)` is
    called with each finished compared word."""
    offset, (pstride, parts), _ = group
    n, big = plan.n, plan.big_n
    it, w = iter(outs), 0
    for key in plan.keys:
        x = plan.xs[key.operand]
        mine = [next(it) for _ in range(word_count(x.dtype))]
        heads = [sub(o, parts, n) for o in mine]
        src = plan.line_ap(kb, x, offset, pstride, parts)
        if len(mine) == 2:
            t = ws.loaded(parts, x.dtype)
            kb.dma(t, src)
            _int64_words(kb, t, *heads, signed=x.dtype == "int64")
        elif x.dtype in FLOATS:
            t = ws.loaded(parts, "float32")
            kb.dma(t, src)
            _float_words(kb, t, heads[0], key, ws.scratch)
        else:       # integers and bool, value-preserving into int32 (uint32: its bits)
            kb.dma(heads[0], src)
            if x.dtype == "uint32":
                kb.emit(isa.TensorScalar, dst=heads[0], data=heads[0], op0="bitwise_xor",
                        operand0=SIGN)
        for o, h in zip(mine, heads):
            if key.descending:
                kb.emit(isa.TensorScalar, dst=h, data=h, op0="bitwise_xor", operand0=-1)
            if big > n:
                kb.emit(isa.Memset, dst=sub(o, parts, big - n, at=n), value=INT32_MAX,
                        engine="gpsimd")
            if sink is not None:
                sink(w, o)
            w += 1
    idx = next(it)
    kb.emit(isa.Iota, dst=sub(idx, parts, big), pattern=((1, big),))
    if sink is not None:
        sink(w, idx)
    for i in passive:           # carried operands: their bits (floats widened to FP32)
        x, o = plan.xs[i], sub(next(it), parts, n)
        if x.dtype in FLOATS:
            kb.dma(o.with_(dtype="float32"), plan.line_ap(kb, x, offset, pstride, parts))
        else:
            kb.dma(o, plan.line_ap(kb, x, offset, pstride, parts))


def _emit_words(kb: KernelBuilder, plan: _Plan) -> None:
    """The words of every group into the HBM temporary (the long-line path)."""
    big = plan.big_n
    wt = [kb.tile(big, "int32") for _ in range(max(word_count(x.dtype) for x in plan.xs))]
    ws = _WordsScratch(kb, plan)
    for group in plan.groups:
        _, (_, parts), row = group

        def sink(w, t, row=row, parts=parts):
            kb.dma(kb.ap(plan.words, plan.word_offset(w, row), ((big, parts), (1, big))),
                   sub(t, parts, big))
        _group_words(kb, plan, group, itertools.cycle(wt), ws, sink=sink)
    ws.close()
    kb.release(*wt)


# --- 2. the bitonic network -------------------------------------------------------------------

def _chunks(big: int, j: int, s: int, ch: int):
    """Pair chunks of step (merge size s, distance j): (lo element offset, free pattern,
    blocks (first, count), direction: 0 / 1 for the whole chunk or None: mixed)."""
    out = []
    if j >= ch:
        for b in range(big // (2 * j)):
            for i0 in range(0, j, ch):
                out.append((b * 2 * j + i0, ((1, ch),), (b, 1), (b * 2 * j // s) & 1))
    else:
        nb = ch // j
        for b0 in range(0, big // (2 * j), nb):
            dirs = {(b * 2 * j // s) & 1 for b in range(b0, b0 + nb)}
            d = dirs.pop() if len(dirs) == 1 else None
            out.append((b0 * 2 * j, ((2 * j, nb), (1, j)), (b0, nb), d))
    return out


def _lex_lt(kb: KernelBuilder, p, lt, eq, a: list[isa.Tile], b: list[isa.Tile]) -> None:
    """p = (a < b) lexicographically over the words (0 / 1, int32 on GpSimd)."""
    kb.emit(isa.TensorTensor, dst=p, data1=a[-1], data2=b[-1], op="is_lt", engine="gpsimd")
    for w in range(len(a) - 2, -1, -1):
        kb.emit(isa.TensorTensor, dst=lt, data1=a[w], data2=b[w], op="is_lt", engine="gpsimd")
        kb.emit(isa.TensorTensor, dst=eq, data1=a[w], data2=b[w], op="is_equal",
                engine="gpsimd")
        kb.emit(isa.TensorTensor, dst=p, data1=p, data2=eq, op="multiply", engine="gpsimd")
        kb.emit(isa.TensorTensor, dst=p, data1=p, data2=lt, op="max", engine="gpsimd")


def _pair_chunk(plan: _Plan, budget: int = SBUF_BUDGET) -> int:
    per_pair = (4 * plan.nwords + 6) * 4        # lo/hi double-buffered per word, masks
    ch = min(plan.big_n // 2, PAIR_CHUNK, max(1, budget // per_pair))
    return 1 << (ch.bit_length() - 1)


def _emit_network(kb: KernelBuilder, plan: _Plan) -> None:
    big, nw = plan.big_n, plan.nwords
    ch = _pair_chunk(plan)
    lo_r = [kb.ring(2, ch, "int32") for _ in range(nw)]
    hi_r = [kb.ring(2, ch, "int32") for _ in range(nw)]
    tmp_r = kb.ring(2, ch, "int32")
    p, lt, eq = (kb.tile(ch, "int32") for _ in range(3))
    s = 2
    while s <= big:
        j = s // 2
        while j >= 1:
            for lo_off, free, blocks, d in _chunks(big, j, s, ch):
                for _, (pstride, parts), row in plan.groups:
                    _exchange(kb, plan, row, parts, lo_off, j, free, blocks, s, d,
                              [r.next() for r in lo_r], [r.next() for r in hi_r],
                              tmp_r, (p, lt, eq), ch)
            j //= 2
        s *= 2
    kb.release(*lo_r, *hi_r, tmp_r, p, lt, eq)


def _exchange(kb, plan, row, parts, lo_off, j, free, blocks, s, d, los, his, tmp_r,
              masks, ch) -> None:
    """One compare-exchange chunk of `parts` lines: load, swap mask, select, store."""
    pattern = ((plan.big_n, parts),) + free
    los = [sub(t, parts, ch) for t in los]
    his = [sub(t, parts, ch) for t in his]
    for w in range(plan.nwords):
        at = plan.word_offset(w, row) + lo_off
        kb.dma(los[w], kb.ap(plan.words, at, pattern))
        kb.dma(his[w], kb.ap(plan.words, at + j, pattern))
    p, lt, eq = (sub(m, parts, ch) for m in masks)
    a, b = (los, his) if d == 1 else (his, los)      # swap when a < b
    _lex_lt(kb, p, lt, eq, a, b)
    if d is None:       # mixed directions: flip where the block sorts descending
        b0, nb = blocks
        kb.emit(isa.Iota, dst=lt, pattern=((2 * j, nb), (0, j)), offset=b0 * 2 * j)
        kb.emit(isa.TensorScalar, dst=lt, data=lt, op0="shift_right_logical",
                operand0=s.bit_length() - 1, op1="bitwise_and", operand1=1)
        kb.emit(isa.TensorTensor, dst=p, data1=p, data2=lt, op="not_equal", engine="gpsimd")
    for w in range(plan.nwords):
        new_lo = sub(tmp_r.next(), parts, ch)
        kb.emit(isa.Select, dst=new_lo, pred=p, on_true=his[w], on_false=los[w],
                engine="gpsimd")
        kb.emit(isa.Select, dst=his[w], pred=p, on_true=los[w], on_false=his[w],
                engine="gpsimd")
        at = plan.word_offset(w, row) + lo_off
        kb.dma(kb.ap(plan.words, at, pattern), new_lo)
        kb.dma(kb.ap(plan.words, at + j, pattern), his[w])


# --- 3. gather -----------------------------------------------------------------------------------

def _gather_group(kb: KernelBuilder, plan: _Plan, group, idx: isa.Tile, flat: isa.Tile,
                  base: isa.Tile, buf: isa.Tile, outs, skip=()) -> None:
    """Every operand's line in sorted order (but those in `skip`): flat element offsets
    from the final index word `idx` ([parts, n]), one indirect DMA per operand, then a
    plain DMA out."""
    offset, (pstride, parts), _ = group
    n = plan.n
    if len(skip) == len(plan.xs):
        return
    b, f = sub(base, parts, 1), sub(flat, parts, n)
    kb.emit(isa.Iota, dst=b, pattern=((0, 1),), offset=offset, channel_multiplier=pstride)
    kb.emit(isa.TensorScalar, dst=f, data=idx, op0="multiply", operand0=plan.c,
            op1="add", operand1=b, engine="gpsimd")
    spans = tiles(n, -(-n // kb.target.dma_queues))
    for i, (x, out) in enumerate(zip(plan.xs, outs)):
        if i in skip:
            continue
        dst = buf.with_(num_partitions=parts, free=(n,), dtype=x.dtype)
        table = kb.ap(x, 0, ((1, x.size), (1, 1)))
        for c0, cn in spans:        # column slices on separate queues (§3.4)
            kb.emit(isa.DmaGather, dst=sub(dst, parts, cn, at=c0), src=table,
                    indices=sub(f, parts, cn, at=c0), dma_queue=kb.next_queue())
        kb.dma(plan.line_ap(kb, out, offset, pstride, parts), dst)


def _emit_gather(kb: KernelBuilder, plan: _Plan, outs) -> None:
    """The long-line path: the index word comes back from HBM."""
    n = plan.n
    idx, flat, base = kb.tile(n, "int32"), kb.tile(n, "int32"), kb.tile(1, "int32")
    buf = kb.tile(max(ir.np_dtype(x.dtype).itemsize for x in plan.xs) * n, "uint8")
    for group in plan.groups:
        _, (_, parts), row = group
        i = sub(idx, parts, n)
        kb.dma(i, kb.ap(plan.words, plan.word_offset(plan.nwords - 1, row),
                        ((plan.big_n, parts), (1, n))))
        _gather_group(kb, plan, group, i, flat, base, buf, outs)
    kb.release(idx, flat, base, buf)


# --- the on-chip path: a whole line group stays in SBUF -------------------------------------

class _Layout:
    """Word tiles of one on-chip layout: `parts` partitions of `width` elements, the
    global element index of each position (`iota`, bits below log2(N) are the index
    within the line), the ping-pong buffers, a select buffer and three masks."""

    def __init__(self, kb: KernelBuilder, nwords: int, width: int, parts: int, ncmp: int):
        self.kb, self.width, self.parts, self.ncmp = kb, width, parts, ncmp
        self.xs = [kb.tile(width, "int32") for _ in range(nwords)]
        self.ys = [kb.tile(width, "int32") for _ in range(nwords)]
        self.t, self.iota = kb.tile(width, "int32"), kb.tile(width, "int32")
        self.masks = [kb.tile(width, "int32") for _ in range(3)]
        kb.emit(isa.Iota, dst=self.iota, pattern=((1, width),), channel_multiplier=width)

    def close(self) -> None:
        self.kb.release(*self.xs, *self.ys, self.t, self.iota, *self.masks)


def _step(kb: KernelBuilder, lay: _Layout, parts: int, s: int, j: int, big: int) -> None:
    """One compare-exchange step with contiguous shifted views: position i is compared
    with i + j (every i < width - j at once; j divides the segment a partition holds),
    the swap kept only at the low position of each pair (bit j of i clear) and flipped
    in blocks sorting descending (bit s of i set); the pair's elements are exchanged
    with two Selects on views shifted by j, into the other buffer."""
    m = lay.width - j
    xs, ys, t = lay.xs, lay.ys, lay.t
    pm, ltm, eqm, im = (sub(z, parts, m) for z in (*lay.masks, lay.iota))
    cmp = xs[:lay.ncmp]
    _lex_lt(kb, pm, ltm, eqm, [sub(x, parts, m, at=j) for x in cmp],
            [sub(x, parts, m) for x in cmp])
    kb.emit(isa.TensorScalar, dst=eqm, data=im, op0="shift_right_logical",
            operand0=j.bit_length() - 1, op1="bitwise_and", operand1=1)
    if s < big:
        kb.emit(isa.TensorScalar, dst=ltm, data=im, op0="shift_right_logical",
                operand0=s.bit_length() - 1, op1="bitwise_and", operand1=1)
        kb.emit(isa.TensorTensor, dst=pm, data1=pm, data2=ltm, op="not_equal",
                engine="gpsimd")
    kb.emit(isa.TensorTensor, dst=pm, data1=pm, data2=eqm, op="is_gt", engine="gpsimd")
    for x, y in zip(xs, ys):
        kb.emit(isa.Select, dst=sub(t, parts, m), pred=pm, on_true=sub(x, parts, m, at=j),
                on_false=sub(x, parts, m), engine="gpsimd")
        kb.emit(isa.TensorCopy, dst=sub(t, parts, j, at=m), src=sub(x, parts, j, at=m),
                engine="gpsimd")
        kb.emit(isa.Select, dst=sub(y, parts, m, at=j), pred=pm, on_true=sub(x, parts, m),
                on_false=sub(t, parts, m, at=j), engine="gpsimd")
        kb.emit(isa.TensorCopy, dst=sub(y, parts, j), src=sub(t, parts, j), engine="gpsimd")
    lay.xs, lay.ys = ys, xs


def _reshape(kb: KernelBuilder, dst: _Layout, src: _Layout, dparts: int, sparts: int) -> None:
    """SBUF -> SBUF DMAs moving the words between layouts (row-major reshape)."""
    for d, x in zip(dst.xs, src.xs):
        kb.dma(sub(d, dparts, dst.width), sub(x, sparts, src.width))


def _network(kb: KernelBuilder, line: _Layout, fold: _Layout | None, parts: int,
             g: int, big: int) -> None:
    """The bitonic network. Unfolded ([lines, N]) every step runs in `line`. Folded (g
    segments of N / g per line, on g x lines partitions: a fewer-line sort uses more
    lanes) the steps of distance j < N / g run in `fold`; the others (the first
    log2(s / seg) steps of the last log2(g) stages) in `line`, the words moved between
    the two by SBUF -> SBUF DMAs."""
    seg = big // g
    where = "line"
    s = 2
    while s <= big:
        j = s // 2
        while j >= 1:
            want = "line" if fold is None or j >= seg else "fold"
            if want != where:
                if want == "line":
                    _reshape(kb, line, fold, parts, parts * g)
                else:
                    _reshape(kb, fold, line, parts * g, parts)
                where = want
            if want == "line":
                _step(kb, line, parts, s, j, big)
            else:
                _step(kb, fold, parts * g, s, j, big)
            j //= 2
        s *= 2
    if where == "fold":
        _reshape(kb, line, fold, parts, parts * g)


def _fold(plan: _Plan, parts: int) -> int:
    """How many segments each line is cut into on chip (1: no folding)."""
    g = 1
    while parts * g * 2 <= plan.pmax and plan.big_n // (g * 2) >= FOLD_MIN:
        g *= 2
    return g


def invertible(plan: _Plan) -> dict[int, int]:
    """Operand -> its (single) sort word, for keys whose word is a bijection of the
    value (integers and bool up to 32 bits, IEEE total-order floats): their sorted values
    are rebuilt from the words instead of gathered."""
    out, w = {}, 0
    for key in plan.keys:
        x = plan.xs[key.operand]
        if word_count(x.dtype) == 1 and key.order != "float" and key.operand not in out:
            out[key.operand] = w
        w += word_count(x.dtype)
    return out


def _rebuild(kb: KernelBuilder, plan: _Plan, group, word: isa.Tile, key: Key,
             tmp: isa.Tile, scratch: isa.Tile, out: DramTensor) -> None:
    """The inverse of `_group_words` for one invertible key, DMAed out."""
    offset, (pstride, parts), _ = group
    x = plan.xs[key.operand]
    v = sub(tmp, parts, plan.n)
    kb.emit(isa.TensorScalar, dst=v, data=word, op0="bitwise_xor",
            operand0=-1 if key.descending else 0)
    if x.dtype == "uint32":
        kb.emit(isa.TensorScalar, dst=v, data=v, op0="bitwise_xor", operand0=SIGN)
    elif x.dtype in FLOATS:         # w ^ ((w >> 31) & 0x7fffffff) is its own inverse
        s = sub(scratch, parts, plan.n)
        kb.emit(isa.TensorScalar, dst=s, data=v, op0="shift_right_arithmetic", operand0=31,
                op1="bitwise_and", operand1=INT32_MAX)
        kb.emit(isa.TensorTensor, dst=v, data1=v, data2=s, op="bitwise_xor")
        v = v.with_(dtype="float32")
    kb.dma(plan.line_ap(kb, out, offset, pstride, parts), v)


def _emit_sbuf(kb: KernelBuilder, plan: _Plan, outs, g: int) -> None:
    big, n = plan.big_n, plan.n
    words = plan.nwords + len(plan.passive)
    line = _Layout(kb, words, big, plan.pmax, plan.nwords)
    fold = _Layout(kb, words, big // g, plan.pmax, plan.nwords) if g > 1 else None
    base = kb.tile(1, "int32")
    ws = _WordsScratch(kb, plan, line.masks)
    for group in plan.groups:
        parts = group[1][1]
        gg = g if parts * g <= plan.pmax else 1
        _group_words(kb, plan, group, line.xs, ws, plan.passive)
        _network(kb, line, fold if gg > 1 else None, parts, gg, big)
        rebuilt = invertible(plan)
        for key in plan.keys:
            if key.operand in rebuilt:
                word = sub(line.xs[rebuilt[key.operand]], parts, n)
                _rebuild(kb, plan, group, word, key, line.ys[0], line.masks[0],
                         outs[key.operand])
        for w, i in enumerate(plan.passive, plan.nwords):
            word = sub(line.xs[w], parts, n)
            if plan.xs[i].dtype in FLOATS:
                word = word.with_(dtype="float32")
            kb.dma(plan.line_ap(kb, outs[i], group[0], group[1][0], parts), word)
        _gather_group(kb, plan, group, sub(line.xs[plan.nwords - 1], parts, n), line.t,
                      base, ws.load, outs, set(rebuilt) | set(plan.passive))
    ws.close()
    kb.release(base)
    line.close()
    if fold is not None:
        fold.close()


@register_lowering("sort")
def _sort_lower(ctx: LowerCtx, *xs: DramTensor, dimension, is_stable=False) -> None:
    ks = keys(ctx.op)
    for x in xs:
        if ir.is_float(x.dtype) and x.dtype not in FLOATS:
            raise LoweringError(f"sort of {x.dtype} is not supported ({ctx.op.describe()})")
    shape = tuple(xs[0].shape)
    if math.prod(shape) == 0:
        return
    n = shape[dimension]
    if n == 1:
        for x, out in zip(xs, ctx.outs):
            copy(ctx.kb, out, x)
        return
    if 1 << max(1, (n - 1).bit_length()) > MAX_LEN:
        raise LoweringError(f"sort along an axis of {n} > {MAX_LEN} elements is not "
                            f"supported ({ctx.op.describe()})")
    a, c = math.prod(shape[:dimension]), math.prod(shape[dimension + 1:])
    if c >= TRANSPOSE_MIN and n >= TRANSPOSE_MIN:
        return _sort_transposed(ctx, xs, ks, (a, n, c))
    _sort(ctx, xs, ctx.outs, ks, dimension)


def _sort_transposed(ctx: LowerCtx, xs, ks: list[Key], shape3) -> None:
    """A sort along a strided axis: the operands are transposed so that the axis is
    contiguous (relayout: TensorE transposes for 2- and 4-byte types), sorted, and the
    results transposed back; the lines' DMAs then move whole rows, not 1-element runs."""
    a, n, c = shape3
    swapped = ((c * n, a), (1, n), (n, c))          # (a, n, c) read from (a, c, n)
    strided = ((n * c, a), (1, c), (c, n))          # (a, c, n) read from (a, n, c)
    ins = []
    for x in xs:        # relayout transposes on chip when the source is the swapped side
        t = ctx.temp((a, c, n), x.dtype)
        relayout(ctx.kb, View.of(t), View(x, strided))
        ins.append(t)
    outs = [ctx.temp((a, c, n), o.dtype) for o in ctx.outs]
    ctx.next_kernel("lines")
    _sort(ctx, ins, outs, ks, 2)
    kb = ctx.next_kernel("back")
    for o, t in zip(ctx.outs, outs):
        relayout(kb, View(o, row_major(shape3)), View(t, swapped))


def _sort(ctx: LowerCtx, xs, outs, ks: list[Key], dimension: int) -> None:
    plan = _Plan(ctx, xs, ks, dimension)
    steps = plan.big_n.bit_length() - 1
    ctx.kb.flops += plan.rows * plan.big_n // 2 * steps * (steps + 1) // 2
    budget = ctx.target.sbuf_bytes - SBUF_SLACK
    g = _fold(plan, max(p for _, (_, p), _ in plan.groups))
    rebuilt = invertible(plan)
    carry = [i for i, x in enumerate(xs) if i not in rebuilt and word_count(x.dtype) == 1]
    for passive, fold in ((carry, g), ([], g), (carry, 1), ([], 1)):
        plan.passive = passive
        if plan.sbuf_bytes(fold) <= budget:
            return _emit_sbuf(ctx.kb, plan, outs, fold)
    plan.passive = []
    plan.words = ctx.temp((plan.nwords, plan.rows, plan.big_n), "int32")
    _emit_words(ctx.kb, plan)
    kb = ctx.next_kernel("network")
    if g > 1 and _fold_bytes(plan, g) <= HYBRID_FOLD_BYTES:
        _emit_hybrid(kb, plan, g)
    else:
        _emit_network(kb, plan)
    _emit_gather(ctx.next_kernel("gather"), plan, outs)


def _fold_bytes(plan: _Plan, g: int) -> int:
    return (2 * plan.nwords + 5) * 4 * (plan.big_n // g)


def _emit_hybrid(kb: KernelBuilder, plan: _Plan, g: int) -> None:
    """Few lines too long for SBUF whole: each group's words come from HBM folded ([g x
    lines, N / g], contiguous rows); steps of distance j < N / g run on chip (`_step`),
    the others through HBM (`_exchange`: pairs of runs of >= N / g elements, long DMA
    descriptors), the words written back before and reloaded after them."""
    big, seg = plan.big_n, plan.big_n // g
    fold = _Layout(kb, plan.nwords, seg, plan.pmax, plan.nwords)
    ch = _pair_chunk(plan, SBUF_BUDGET - _fold_bytes(plan, g))
    lo_r = [kb.ring(2, ch, "int32") for _ in range(plan.nwords)]
    hi_r = [kb.ring(2, ch, "int32") for _ in range(plan.nwords)]
    tmp_r = kb.ring(2, ch, "int32")
    masks = tuple(kb.tile(ch, "int32") for _ in range(3))
    for _, (_, parts), row in plan.groups:
        fp = parts * g

        def move(to_chip: bool, row=row, fp=fp) -> None:
            for w, x in enumerate(fold.xs):
                ap = kb.ap(plan.words, plan.word_offset(w, row), ((seg, fp), (1, seg)))
                tile = sub(x, fp, seg)
                kb.dma(*((tile, ap) if to_chip else (ap, tile)))
        move(True)
        on_chip = True
        s = 2
        while s <= big:
            j = s // 2
            while j >= 1:
                if j < seg:
                    if not on_chip:
                        move(True)
                        on_chip = True
                    _step(kb, fold, fp, s, j, big)
                else:
                    if on_chip:
                        move(False)
                        on_chip = False
                    for lo_off, free, blocks, d in _chunks(big, j, s, ch):
                        _exchange(kb, plan, row, parts, lo_off, j, free, blocks, s, d,
                                  [r.next() for r in lo_r], [r.next() for r in hi_r],
                                  tmp_r, masks, ch)
                j //= 2
            s *= 2
        if on_chip:
            move(False)
    fold.close()
    kb.release(*lo_r, *hi_r, tmp_r, *masks)
