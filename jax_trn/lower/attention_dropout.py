"""The dropout operand of the flash-attention kernels (attention.py, attention_bwd.py):
what multiplies the probabilities before P @ V (flax's keep / keep_prob, or the boolean
keep of a select), [.., Sq, Sk] with the unit's strides (stride 0 along what the draw
broadcasts over: flax draws one [Sq, Sk] for every head).

Both kernels take each job's [q-tile, keys] block of it. Read per job, a block of the
backward is 128 rows of 128 keys: 256-byte descriptors, far below the DMA's efficient
size (§3.4; the LM-sized MHA backward's DMA queues were busy 491 us of its 493).
So a unit's rows are kept in SBUF when they fit ROWS_BYTES per partition ([P, nq x Sk]:
q-tile i's rows at i x Sk, each row one descriptor of Sk elements), loaded once per
distinct unit offset (a broadcast draw: once for every head) into a ring of two (the
next unit's load overlaps this one's work); else each job's block is DMAed."""
from __future__ import annotations

from jax_trn.hw.dtypes import itemsize
from jax_trn.hw.program import DramTensor

from .builder import sub
from .layout import tiles

ROWS_BYTES = 32 * 1024          # SBUF per partition for one unit's rows (two are kept)


class DropoutBlocks:
    def __init__(self, kb, t: DramTensor, sq: int, sk: int, strides: tuple[int, int],
                 dma, depth: int, width: int):
        """`depth` blocks of up to `width` keys in flight when read per job."""
        self.kb, self.t, self.sq, self.sk, self.dma = kb, t, sq, sk, dma
        self.rows, self.cols = strides
        self.pmax = kb.target.partitions
        nq = -(-sq // self.pmax)
        self.whole = nq * sk * itemsize(t.dtype) <= ROWS_BYTES
        self.ring = kb.ring(2, nq * sk, t.dtype) if self.whole else \
            kb.ring(depth, width, t.dtype)
        self.last: tuple | None = None           # (unit offset, its rows' tile)

    def block(self, at: int, q0: int, qt: int, k0: int, width: int):
        """The [qt, width] block at rows q0, keys k0 of the unit at offset `at`."""
        if not self.whole:
            w = sub(self.ring.next(), qt, width)
            self.dma(w, self.kb.ap(self.t, at + q0 * self.rows + k0 * self.cols,
                                   ((self.rows, qt), (self.cols, width))))
            return w
        return sub(self.unit(at), qt, width, at=(q0 // self.pmax) * self.sk + k0)

    def unit(self, at: int):
        """The unit's rows, loaded unless the last unit loaded had the same offset."""
        if self.last is not None and self.last[0] == at:
            return self.last[1]
        tile = self.ring.next()
        for i, (q0, qt) in enumerate(tiles(self.sq, self.pmax)):
            self.dma(sub(tile, qt, self.sk, at=i * self.sk),
                     self.kb.ap(self.t, at + q0 * self.rows,
                                ((self.rows, qt), (self.cols, self.sk))))
        self.last = (at, tile)
        return tile
