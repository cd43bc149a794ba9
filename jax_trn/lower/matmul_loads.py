"""The operand loads of a matmul kernel (matmul.py's `MatmulEmitter` mixes them in):
K-major tiles in SBUF, by plain DMAs of k-tiles, dma_transpose (v3+, §3.4), 16-bit word
pairs for FP8 double_row, rows transposed on TensorE through PSUM (§2.2), or rows
transposed on VectorE with k-tiles of every w-th k (matmul_quarters.py,
`MatmulEmitter.kperm`)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa

from .builder import sub
from .layout import tiles
from . import matmul_quarters as quarters
from .matmul_plan import Operand



@dataclass
class KMajor:
    """Operand tiles with K on partitions: k-tile j is [kt, width] at element j*stride."""
    base: isa.Tile
    stride: int

    def tile(self, j: int, kt: int, free: int, at: int = 0) -> isa.Tile:
        return sub(self.base, kt, free, at=j * self.stride + at)

    def shifted(self, at: int) -> "KMajor":
        """The same tiles from column `at` on."""
        return KMajor(self.base.with_(offset=self.base.offset
                                      + at * hw_dtypes.itemsize(self.base.dtype)), self.stride)

    def pair(self, j: int, free: int, at: int = 0) -> isa.Tile:
        """k-tiles j and j + 1 (columns [at, at + free)) as one [P, 2, free] double_row
        operand (§2.2): contiguous in a stationary strip (stride == free), else through
        an access pattern stepping `stride` between the two (§3.1)."""
        view = sub(self.base, self.base.num_partitions, self.stride + free,
                   at=j * self.stride + at)
        if self.stride == free:
            return view.with_(free=(2, free))
        return view.with_(free=(2, free), strides=(self.stride, 1))


@dataclass
class WordPairs(KMajor):
    """A stationary strip transposed as 16-bit words of 1-byte elements: the pair
    (k-tiles j, j + 1) is [P, M] words, i.e. bytes [P, M, 2] holding rows 2p, 2p + 1 of
    the 256-row block; double_row reads it as [P, 2, M] with element strides (1, 2).
    The moving tiles of such a matmul hold the same rows (`MatmulEmitter._fetch`)."""

    def tile(self, j: int, kt: int, free: int, at: int = 0) -> isa.Tile:
        raise AssertionError("a word-pair strip has no single k-tiles")

    def words(self, j: int, free: int) -> isa.Tile:
        """The pair's SBUF region as [P, free] 16-bit words (the dma_transpose target)."""
        return self._bytes(j, free).with_(free=(free,), dtype="uint16")

    def pair(self, j: int, free: int, at: int = 0) -> isa.Tile:
        assert at == 0, "a word-pair strip is read whole"
        return self._bytes(j, free).with_(free=(2, free), strides=(1, 2))

    def _bytes(self, j: int, free: int) -> isa.Tile:
        assert self.stride == free, "k-tiles are not adjacent"
        return sub(self.base, self.base.num_partitions, 2 * free, at=j * self.stride)


@dataclass
class _Load:
    """A K-major load in flight: its DMAs are issued; transposes still to emit."""
    dst: KMajor | quarters.WordStrip
    staged: list[tuple[isa.Tile, int, int]] = field(default_factory=list)  # rows, c0, fc
    vector_stage: isa.Tile | None = None    # natural rows VectorE transposes
    pe_upto: int | None = None              # staged rows whose k-tiles from here on
                                            # VectorE transposes (emitted): `_finish`
                                            # transposes the others on TensorE


class Loads:
    """K-major loads of the emitter's operands (its rings, queues and builder)."""


    def _fetch(self, op: Operand, index, kblock, f0: int, fsize: int, ring) -> _Load:
        """Issues the DMAs of op[kblock, f0:f0+fsize] as K-major tiles."""
        base = op.batch_offset(index) + kblock[0] * op.k[0] + f0 * op.f[0]
        if op.transposed and self._on_vector(op, f0):
            return self._fetch_for_vector(op, base, kblock[1], ring)
        words = self.interleaved and op is self.lhs
        load = _Load((WordPairs if words else KMajor)(ring.next(), fsize))
        pmax = self.kt
        if words:
            # One 16-bit dma_transpose per 256-row block: [fsize, 128 words] -> [128, fsize].
            for q, k0 in enumerate(range(0, kblock[1], 2 * pmax)):
                src = self.kb.ap(op.t, (base + k0) // 2, ((op.f[0] // 2, fsize), (1, pmax)),
                                 view="uint16")
                self.kb.emit(isa.DmaTranspose, dst=load.dst.words(2 * q, fsize), src=src,
                             dma_queue=next(self.load_q))
            return load
        if self.interleaved and op is self.rhs:
            # Rows (2p, 2p + 1) of each 256-row block on partition p, as the stationary
            # holds them; each row's `fsize` columns one DMA run, as plain k-tiles.
            for q, k0 in enumerate(range(0, kblock[1], 2 * pmax)):
                src = self.kb.ap(op.t, base + k0 * op.k[0],
                                 ((2 * op.k[0], pmax), (op.k[0], 2), (op.f[0], fsize)))
                self._dma(sub(load.dst.base, pmax, (2, fsize), at=2 * q * fsize), src)
            return load
        if op.via_dma:
            for j, (k0, kt) in enumerate(tiles(kblock[1], pmax)):
                src = self.kb.ap(op.t, base + k0 * op.k[0], ((op.f[0], fsize), (op.k[0], kt)))
                self.kb.emit(isa.DmaTranspose, dst=load.dst.tile(j, kt, fsize), src=src,
                             dma_queue=next(self.load_q))
            return load
        if op.transposed:
            stage = self.stage[id(op)]
            for c0, fc in tiles(fsize, pmax):
                if len(load.staged) == len(stage.tiles):
                    # The ring wraps onto a chunk not transposed yet: transpose it first.
                    self._transpose_staged(load.staged.pop(0), load.dst)
                rows = sub(stage.next(), fc, kblock[1])
                src = ((op.f[0], fc), (op.k[0], kblock[1]))
                self._dma(rows, self.kb.ap(op.t, base + c0 * op.f[0], src))
                load.staged.append((rows, c0, fc))
            return load
        for emit in self._plain_dmas(op, load, base, kblock, fsize):
            emit()
        return load

    def _plain_dmas(self, op: Operand, load: _Load, base: int, kblock, fsize: int) -> list:
        """The DMAs of a K-major operand's k-tiles, one closure each, in K order (with
        `kperm`, each k-tile's rows in the permuted order, matmul_quarters.py)."""
        def dma(j: int, k0: int, kt: int):
            if self.kperm:
                at, pattern = quarters.rhs_pattern(op, j, kblock[1], self.kperm,
                                                   self.kb.target, fsize)
                src = self.kb.ap(op.t, base + at, pattern)
            else:
                src = self.kb.ap(op.t, base + k0 * op.k[0], ((op.k[0], kt), (op.f[0], fsize)))
            return lambda: self._dma(load.dst.tile(j, kt, fsize), src)
        return [dma(j, k0, kt) for j, (k0, kt) in enumerate(tiles(kblock[1], self.kt))]

    def _on_vector(self, op: Operand, f0: int) -> bool:
        """The lhs row tile at `f0` is transposed on VectorE (`MatmulEmitter.vector_rows`)."""
        return op is self.lhs and f0 in self.vector_rows

    def _fetch_for_vector(self, op: Operand, base: int, k: int, ring) -> _Load:
        """One DMA of a full row tile into staging, rows on partitions
        (matmul_quarters.staging_src); `_finish` transposes it on VectorE."""
        target = self.kb.target
        stage = self.stage[id(op)].next()
        load = _Load(quarters.WordStrip(ring.next(), self.mt, self.kperm), vector_stage=stage)
        at, pattern = quarters.staging_src(op, base, k, target)
        self._dma(stage, self.kb.ap(op.t, at, pattern))
        return load

    def _fetch_both(self, index, mb0: int, mbn: int, g0: int, gn: int) -> tuple:
        """A wide lhs block and its first rhs slice with their k-tiles' DMAs alternating,
        so the first matmul waits for one k-tile of each, not for the whole lhs block
        (flax's weight gradients, [4092, 1024]^T x [4092, 1024]: 30 us before the first
        matmul). Both operands must load plainly (no transpose, no pairs)."""
        loads = []
        for op, f0, fsize, ring in ((self.lhs, mb0, mbn, self.strips),
                                    (self.rhs, g0, gn, self.slices)):
            load = _Load(KMajor(ring.next(), fsize))
            base = op.batch_offset(index) + f0 * op.f[0]
            loads.append((load, self._plain_dmas(op, load, base, (0, self.k), fsize)))
        for pair in itertools.zip_longest(loads[0][1], loads[1][1]):
            for emit in pair:
                emit()
        return loads[0][0].dst, loads[1][0].dst

    def _dma(self, dst, src, queues=None) -> None:
        self.kb.emit(isa.DmaCopy, dst=dst, src=src, dma_queue=next(queues or self.load_q))

    def _finish(self, load: _Load) -> KMajor:
        """Emits the TensorE (VectorE: `vector_stage`) transposes of a staged load (none
        for a direct one)."""
        if load.vector_stage is not None:
            for operands in quarters.vector_transposes(load.vector_stage, load.dst, self.k,
                                                       self.kb.target):
                self.kb.emit(isa.NcTranspose, engine="vector", **operands)
            load.vector_stage, self.vector_busy = None, True
        if load.pe_upto is not None:
            split = self._pe_part(load, load.pe_upto)
            load.staged.clear()
            return split
        for staged in load.staged:
            self._transpose_staged(staged, load.dst)
        load.staged.clear()
        return load.dst

    def _fetch_parts(self, op: Operand, index, f0: int, fsize: int, cuts) -> tuple:
        """A TensorE-staged row tile (`fsize` <= 128 rows) whose rows load in column
        ranges split at k-tiles `cuts` (multiples of w: a k-tile's columns are one
        range, matmul_quarters.py): the `_Load` and one DMA closure per range, in K
        order, so the first k-tiles can be transposed before the rest arrive."""
        base = op.batch_offset(index) + f0 * op.f[0]
        rows = sub(self.stage[id(op)].next(), fsize, self.k)
        load = _Load(KMajor(self.strips.next(), fsize), staged=[(rows, 0, fsize)])
        bounds = [0, *(c * self.kt for c in cuts), self.k]

        def dma(a: int, b: int):
            src = self.kb.ap(op.t, base + a * op.k[0], ((op.f[0], fsize), (op.k[0], b - a)))
            return lambda: self._dma(sub(rows, fsize, b - a, at=a), src)
        return load, [dma(a, b) for a, b in zip(bounds, bounds[1:])]

    def _finish_split(self, load: _Load, first: int, stop: int | None = None
                      ) -> quarters.Split:
        """A staged row tile's k-tiles before `first` transposed on TensorE, those from
        `first` to `stop` (None: all) on VectorE (matmul_quarters.Split): for a tile
        TensorE needs at once while VectorE is idle, with too few free PSUM banks for
        all its transposes. With `stop`, the load stays staged for `_finish_vector`.
        Leaves `vector_busy` alone: the next evacuations (the start's drains) come
        after VectorE is done with these."""
        split = self._pe_part(load, first)
        self._finish_vector(load, first, stop)
        return split

    def _pe_part(self, load: _Load, first: int, engine: str | None = None
                 ) -> quarters.Split:
        """TensorE transposes of a staged row tile's k-tiles before `first` (one copy
        each, the first arrives sooner; on `engine`, else alternating); the tile as a
        Split (VectorE's k-tiles from `first` on)."""
        (rows, c0, fc), = load.staged
        pe = load.dst
        for group in _runs(tiles(rows.free_size, self.kt)[:first], self.bank // fc):
            self._transpose(rows, group, fc, c0, pe, each=True, engine=engine)
        return quarters.Split(pe, quarters.WordStrip(pe.base, self.mt, self.kperm), first)

    def _finish_vector(self, load: _Load, first: int, stop: int | None = None) -> None:
        """VectorE transposes of a staged row tile's k-tiles from `first` to `stop`
        (None: all; then the load is done but for a TensorE part, `pe_upto`)."""
        (rows, _, _), = load.staged
        vector = quarters.WordStrip(load.dst.base, self.mt, self.kperm)
        for operands in quarters.vector_transposes(rows, vector, self.k, self.kb.target,
                                                   first, stop):
            self.kb.emit(isa.NcTranspose, engine="vector", **operands)
        if stop is None and load.pe_upto is None:
            load.staged.clear()

    def _transpose_staged(self, staged: tuple[isa.Tile, int, int], dst: KMajor) -> None:
        rows, c0, fc = staged
        for group in _runs(tiles(rows.free_size, self.kt), self.bank // fc):
            self._transpose(rows, group, fc, c0, dst)

    def _transpose(self, rows: isa.Tile, group, fc: int, c0: int, dst: KMajor,
                   each: bool = False, engine: str | None = None) -> None:
        """Transposes k-tiles of `rows` [fc, K] into one PSUM bank, then copies them to
        `dst`: with one copy when they are adjacent there (a full-width strip) unless
        `each` (one copy per k-tile, alternating engines: the first arrives sooner)."""
        bank = self.tps.next()
        kt = group[0][1][1]
        for g, (j, (k0, _)) in enumerate(group):
            data = quarters.pe_data(rows, j, rows.free_size, self.kperm, self.kb.target) \
                if self.kperm else sub(rows, fc, kt, at=k0)
            self.kb.emit(isa.NcTranspose, dst=sub(bank, kt, fc, at=g * fc), data=data)
        if dst.stride == fc and not each:
            self.kb.emit(isa.TensorCopy, dst=dst.tile(group[0][0], kt, len(group) * fc),
                         src=sub(bank, kt, len(group) * fc), engine=self._evac_engine())
            return
        for g, (j, _) in enumerate(group):
            self.kb.emit(isa.TensorCopy, dst=dst.tile(j, kt, fc, at=c0),
                         src=sub(bank, kt, fc, at=g * fc),
                         engine=engine or self._evac_engine())


def _runs(ktiles: list[tuple[int, int]], size: int) -> list[list]:
    """Consecutive (j, (k0, kt)) runs of equal kt, at most `size` long."""
    out: list[list] = []
    for j, kt in enumerate(ktiles):
        if out and len(out[-1]) < size and out[-1][-1][1][1] == kt[1]:
            out[-1].append((j, kt))
        else:
            out.append([(j, kt)])
    return out
