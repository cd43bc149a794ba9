"""The axes of an attention fusion as the flash kernel (attention.py) walks them: the
fusion's `attention_layout` (hlo_passes/attention_layout.py) read back, and the runs of
consecutive heads whose rows are adjacent in memory ([B, S, N, H]: head n + 1 starts H
elements after head n), which the kernel moves with one DMA (V loads, result stores) so
each descriptor covers several heads' rows (§3.4: DMA efficiency grows with the
descriptor size up to ~2.5 KB)."""
from __future__ import annotations

import itertools
import math

from jax_trn.hw import isa
from jax_trn.hw.dtypes import itemsize
from jax_trn.hw.program import DramTensor

from .builder import sub


class Axes:
    """The fusion's `attention_layout`: (size, strides) per axis, strides in the order
    q, k, v, out, mask, bias (hlo_passes/attention_layout.OPERANDS)."""

    def __init__(self, layout: tuple, starts: tuple = ()):
        self.starts = tuple(starts)     # operand starts (`attention_offsets`), layout order
        by_role: dict = {}
        for role, size, strides in layout:
            by_role.setdefault(role, []).append((size, tuple(strides)))
        self.batch, self.group = by_role.get("batch", []), by_role.get("group", [])
        self.sq, self.sk = by_role["sq"][0], by_role["sk"][0]
        self.d, self.dv = by_role["d"][0], by_role["dv"][0]

    @classmethod
    def canonical(cls, q: DramTensor, k: DramTensor, v: DramTensor) -> "Axes":
        """[..., Sq, D] / [..., Sk, D] / [..., Sk, Dv], a [Sq, Sk] mask (the old form)."""
        (sq, d), (sk, dv) = q.shape[-2:], v.shape[-2:]
        return cls((("batch", math.prod(q.shape[:-2]), (sq * d, sk * d, sk * dv, sq * dv,
                                                          0, 0)),
                    ("sq", sq, (d, 0, 0, dv, sk, 0)), ("sk", sk, (0, d, dv, 0, 1, 0)),
                    ("d", d, (1, 1, 0, 0, 0, 0)), ("dv", dv, (0, 0, 1, 1, 0, 0))))

    def offsets(self, which: list[tuple], operands: tuple[int, ...],
                start: bool = False) -> list[tuple]:
        """Per index of the axes `which`, the element offset of each operand; with
        `start`, from where the operand starts in its buffer (the batch axes' offsets
        carry it, the group axes' add to them)."""
        base = [self.starts[o] if start and o < len(self.starts) else 0 for o in operands]
        out = []
        for idx in itertools.product(*(range(n) for n, _ in which)):
            out.append(tuple(b + sum(i * s[o] for i, (_, s) in zip(idx, which))
                             for b, o in zip(base, operands)))
        return out


def unit_blocks(offsets: list[int], step: int, limit: int) -> list[tuple[int, int]]:
    """(slot, size) per unit: runs of up to `limit` consecutive units whose offsets
    step by `step` (one DMA moves a run), else runs of one."""
    out, i = [], 0
    while i < len(offsets):
        n = 1
        while n < limit and i + n < len(offsets) and offsets[i + n] == offsets[i] + n * step:
            n += 1
        out += [(j, n) for j in range(n)]
        i += n
    return out


def heads_per_dma(rows: int, width: int, itemsize: int, budget: int) -> int:
    """How many heads' [rows-tiles, width] buffers (double-buffered) fit `budget`
    bytes per partition (at most 8, at least 1)."""
    per_head = 2 * rows * width * itemsize
    return max(1, min(8, budget // max(1, per_head)))


class LseRows:
    """The rows' logsumexp (f32 [units, Sq], the forward's second result when the
    gradient is taken) computed and stored per P q-tiles: each q-tile's last chunk
    writes its row sums l and negated row max -m straight into column c of two FP32
    [P, P] SBUF tiles (`reserve`); every P columns (and at the end) lse = ln(l) - (-m)
    is two instructions over [P, c], one SBUF -> SBUF dma_transpose (§3.4, not limited
    by descriptor size) makes the columns rows, stored as runs of 512-byte rows. Before,
    each q-tile had its own log, subtract and [qt, 1] store: 4-byte descriptors, at
    4 / 2500 of the DMA rate (§3.4) each held the queues like a 320 KB transfer (LM row,
    D64: 448 of them, the forward kernel 911 us, DMA-bound)."""

    def __init__(self, kb, out: DramTensor, dma, transposer):
        self.kb, self.out, self.dma, self.tr = kb, out, dma, transposer
        self.p = kb.target.partitions
        self.l, self.negm = kb.ring(2, self.p, "float32"), kb.ring(2, self.p, "float32")
        for t in self.l.tiles + self.negm.tiles:    # a tail tile's rows past qt are
            kb.emit(isa.Memset, dst=t, value=1.0, engine="gpsimd")  # computed too
        self.lse, self.rows = kb.ring(2, self.p, "float32"), kb.ring(2, self.p, "float32")
        self.tiles, self.pending = None, []     # (DRAM offset, rows) per column

    def reserve(self, offset: int, qt: int) -> tuple[isa.Tile, isa.Tile]:
        """The [qt, 1] columns (l, -m) of rows [offset, offset + qt)."""
        if self.tiles is None:
            self.tiles = self.l.next(), self.negm.next()
        at = len(self.pending)
        self.pending.append((offset, qt))
        return tuple(sub(t, qt, 1, at=at) for t in self.tiles)

    def after(self) -> None:
        """Stores the columns once the tiles are full (their l and -m written)."""
        if len(self.pending) == self.p:
            self.flush()

    def flush(self) -> None:
        n, p = len(self.pending), self.p
        if not n:
            return
        kb, (l, negm) = self.kb, (sub(t, p, n) for t in self.tiles)
        lse = sub(self.lse.next(), p, n)
        kb.emit(isa.Activation, dst=lse, data=l, func="log")
        kb.emit(isa.TensorTensor, dst=lse, data1=lse, data2=negm, op="subtract")
        rows = sub(self.rows.next(), n, p)
        self.tr.load_tile(rows, lse)
        i = 0
        while i < n:
            at, qt = self.pending[i]
            run = 1
            while qt == p and i + run < n and self.pending[i + run] == (at + run * p, p):
                run += 1
            src = rows.with_(start_partition=rows.start_partition + i, num_partitions=run,
                             free=(qt,))
            self.dma(self.kb.ap(self.out, at, ((p, run), (1, qt))), src)
            i += run
        self.tiles, self.pending = None, []


class HeadStores:
    """Result tiles of runs of adjacent heads (unit offsets stepping by `width`: [B, S,
    N, H]) staged side by side, tile i of the run's units in one SBUF tile, and stored
    by the run's last unit in one DMA: rows of size x width elements, not width (D64
    bf16: 128-byte descriptors at 5% of the DMA rate, §3.4; 8 heads: 1 KiB, 41%)."""

    def __init__(self, kb, offsets: list[int], width: int, ntiles: int, dtype: str,
                 budget: int, dma):
        self.kb, self.width, self.dma = kb, width, dma
        limit = heads_per_dma(ntiles, width, itemsize(dtype), budget)
        self.blocks = unit_blocks(offsets, width, limit)
        size = max(s for _, s in self.blocks)
        self.ring = kb.ring(2 * ntiles, size * width, dtype) if size > 1 else None
        self.stage: dict = {}

    def tile(self, unit: int, i: int, rows: int) -> isa.Tile | None:
        """Where unit `unit`'s result tile i goes (None: a run of one, not staged)."""
        slot, size = self.blocks[unit]
        if size == 1:
            return None
        if slot == 0:
            self.stage[i] = self.ring.next()
        return sub(self.stage[i], rows, self.width, at=slot * self.width)

    def store(self, unit: int, i: int, out: DramTensor, at: int, stride: int,
              rows: int, tile: isa.Tile) -> None:
        """After unit `unit` wrote its tile i (`tile`; its rows at `at`, `stride`
        apart): the run's store once its last unit has (a run of one: `tile`'s)."""
        slot, size = self.blocks[unit]
        if size == 1:
            self.dma(self.kb.ap(out, at, ((stride, rows), (1, self.width))), tile)
        elif slot == size - 1:
            w = size * self.width
            self.dma(self.kb.ap(out, at - slot * self.width, ((stride, rows), (1, w))),
                     sub(self.stage[i], rows, w))
