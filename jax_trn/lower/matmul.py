"""The TensorE loop nest of one canonical matmul: per batch, out[M, N] = lhs[M, K] @ rhs[K, N].

TensorE computes dst[M, N] (+)= stationary[K, M].T @ moving[K, N] with K on partitions
(§2.2): lhs tiles are stationary (M <= 128 per tile), rhs tiles moving (N <= 512, one
PSUM bank of FP32). An operand whose K axis is the contiguous one (lhs [M, K]
row-major, rhs [N, K]) must be transposed. Reading it K-major by a plain DMA would move
2-4 byte runs, far below DMA efficiency (§3.4: ~0.2% at 2 bytes in our model), so:

- on v3+ with a 2- or 4-byte SBUF dtype equal to its DRAM dtype, by `dma_transpose`
  straight from DRAM (§3.4: up to 90% of the DMA rate; one DMA per 128-deep k-tile of
  the whole strip). TensorE, PSUM and the evacuation engines do no transpose work;
- otherwise loaded naturally (rows of K: long DMA runs) and transposed on TensorE into
  PSUM, then copied to SBUF in the matmul dtype, as the Neuron compiler does (~128
  cycles per 128x128 tile against 512 per matmul that reuses it).

Loop order (`Plan.kb == K`, the usual case):

    for each block of M rows (as many as fit):   # stationary strips S[K, 128] resident,
        for each group of N columns (512/1024):   #   transposed once, during group 0
            load the rhs slice R[K, group]         # double-buffered: streams during
            for each 128-row tile of the block:    #   the previous group
                for each 128-deep k-tile:          # k outer: the first matmul needs
                    for each 512-column tile:      #   only the first k-tile of R
                        matmul into its PSUM bank, accumulate=(k > 0)
                copy PSUM -> SBUF casting to the result dtype (VectorE/ScalarE in turn)
                DMA the [128, group] result out

Each operand is read from HBM once (rhs once per M block). DMAs are issued in program
order, which is also the order the data is needed: strip 0 first, then the R slice,
then strip i+1 while tile i computes; strip i+1's transposes are emitted halfway
through tile i's matmuls so their PSUM evacuation hides behind TensorE work.

When K is too deep for a strip to fit (`Plan.kb < K`), K is cut in blocks and every
(row tile, column group) accumulates over the blocks in PSUM, reloading both operands.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Callable

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .errors import LoweringError
from .layout import P, Axes, tiles

MOVING_MAX = 512            # moving free size: one PSUM bank of FP32 (§2.2)
GROUP_COLS = (1024, 512)    # N columns accumulated together, widest first: 1024 bf16
                            # columns load 2 KiB per partition per DMA (§3.4: the
                            # recommended minimum; 512 columns run at ~42% efficiency)
PSUM_BANKS = 8              # accumulation groups in flight ...
TRANSPOSE_BANKS = 2         # ... minus these when an operand is transposed on TensorE
SBUF_SHARE = 0.95           # of the kernel's free SBUF a matmul may plan for: the
                            # rest is slack for the allocator's alignment


@dataclass(frozen=True)
class Operand:
    """One matmul operand in DRAM: batch axes, then K and its free axis F (M or N)."""
    t: DramTensor
    batch: Axes
    k: tuple[int, int]          # (stride, K)
    f: tuple[int, int]          # (stride, F)
    dtype: str                  # SBUF dtype of its tiles (the DMA casts to it)
    transposed: bool            # K is its contiguous axis: it must be transposed
    via_dma: bool = False       # ... by dma_transpose (else on TensorE)

    @property
    def pe_transposed(self) -> bool:
        """Loaded as [F, K] rows and transposed on TensorE."""
        return self.transposed and not self.via_dma

    def batch_offset(self, index: tuple[int, ...]) -> int:
        return sum(s * i for (s, _), i in zip(self.batch, index))


# --- planning ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    mb: int                     # M rows whose stationary strips stay resident
    kb: int                     # K rows per block (all of K unless it is too deep)
    group: int                  # N columns accumulated together


def _plan_bytes(lhs: Operand, rhs: Operand, out_dtype: str, plan: Plan, k: int) -> int:
    nk = -(-plan.kb // P)
    li, ri = hw_dtypes.itemsize(lhs.dtype), hw_dtypes.itemsize(rhs.dtype)
    strips = -(-plan.mb // P) if plan.kb == k else 2
    total = strips * nk * P * li + 2 * nk * plan.group * ri
    total += 2 * plan.group * hw_dtypes.itemsize(out_dtype)
    total += sum(2 * plan.kb * hw_dtypes.itemsize(op.dtype) for op in (lhs, rhs)
                 if op.pe_transposed)
    return total


def _candidates(m: int, k: int, n: int):
    """Plans from best to worst: all of K with as many resident rows as possible, for
    each column group from the widest (longer DMA rows, §3.4) down; then K blocks of
    decreasing depth with the narrowest group."""
    for group in dict.fromkeys(min(n, g) for g in GROUP_COLS):
        mb = m
        while True:
            yield Plan(mb, k, group)
            if mb <= P:
                break
            mb = max(P, -(-mb // 2 // P) * P)
    kb, group = k, min(n, GROUP_COLS[-1])
    while kb > P:
        kb = max(P, (kb // 2) // P * P)
        yield Plan(P, kb, group)


def with_dma_transpose(op: Operand, spec) -> Operand:
    """`op`, transposed by dma_transpose if the core has it (v3+) and the load needs no
    cast: the transpose is bit-exact on 2- and 4-byte types only (§3.4)."""
    size = hw_dtypes.itemsize(op.dtype)
    ok = (op.transposed and getattr(spec, "dma_transpose", False)
          and op.t.dtype == op.dtype and size in (2, 4))
    return dataclasses.replace(op, via_dma=True) if ok else op


def make_plan(lhs: Operand, rhs: Operand, out_dtype: str, sbuf_bytes: int,
              reserved: int = 0) -> Plan:
    """The first candidate plan that fits the SBUF share of a matmul kernel (of
    `sbuf_bytes` free per partition), after `reserved` bytes per partition (a fused
    epilogue's buffers)."""
    budget = int(sbuf_bytes * SBUF_SHARE) - reserved
    k = lhs.k[1]
    for plan in _candidates(lhs.f[1], k, rhs.f[1]):
        if _plan_bytes(lhs, rhs, out_dtype, plan, k) <= budget:
            return plan
    raise LoweringError("dot_general tiles do not fit in SBUF")


# --- loads ---------------------------------------------------------------------------------

@dataclass
class KMajor:
    """Operand tiles with K on partitions: k-tile j is [kt, width] at element j*stride."""
    base: isa.Tile
    stride: int

    def tile(self, j: int, kt: int, free: int, at: int = 0) -> isa.Tile:
        return sub(self.base, kt, free, at=j * self.stride + at)


@dataclass
class _Load:
    """A K-major load in flight: its DMAs are issued; transposes still to emit."""
    dst: KMajor
    staged: list[tuple[isa.Tile, int, int]] = field(default_factory=list)  # rows, c0, fc


# --- the emitter -----------------------------------------------------------------------------

class MatmulEmitter:
    """Emits the loop nest of one canonical matmul (see the module docstring)."""

    def __init__(self, kb: KernelBuilder, lhs: Operand, rhs: Operand, out: DramTensor,
                 plan: Plan, precision: str = "native", epilogue=None):
        self.kb, self.lhs, self.rhs, self.out, self.plan = kb, lhs, rhs, out, plan
        self.epilogue = epilogue
        self.m, self.k, self.n = lhs.f[1], lhs.k[1], rhs.f[1]
        self.precision = precision
        nk = -(-plan.kb // P)
        deep = plan.kb < self.k
        self.stage = {id(op): kb.ring(2, plan.kb, op.dtype) for op in (lhs, rhs)
                      if op.pe_transposed}
        self.strips = kb.ring(2 if deep else -(-plan.mb // P), nk * P, lhs.dtype)
        self.slices = kb.ring(2, nk * plan.group, rhs.dtype)
        self.obuf = kb.ring(2, plan.group, out.dtype) if epilogue is None else None
        tbanks = TRANSPOSE_BANKS if self.stage else 0
        self.tps = kb.ring(tbanks, MOVING_MAX, "float32", mem="psum") if tbanks else None
        self.acc = kb.ring(PSUM_BANKS - tbanks, MOVING_MAX, "float32", mem="psum")
        if epilogue is not None:
            epilogue.start(kb, plan.group)

    def run(self) -> None:
        batch = [n for _, n in self.lhs.batch]
        for flat, index in enumerate(itertools.product(*map(range, batch))):
            base = flat * self.m * self.n
            if self.plan.kb < self.k:
                self._deep(index, base)
                continue
            for mb0, mbn in tiles(self.m, self.plan.mb):
                self._mblock(index, base, mb0, mbn)
        rings = [self.strips, self.slices, self.acc, *self.stage.values()]
        self.kb.release(*rings, *(r for r in (self.tps, self.obuf) if r))
        if self.epilogue is not None:
            self.epilogue.close()

    def _mblock(self, index, base: int, mb0: int, mbn: int) -> None:
        mtiles = [(mb0 + m0, mt) for m0, mt in tiles(mbn, P)]
        whole = (0, self.k)
        strips = [self._finish(self._fetch(self.lhs, index, whole, *mtiles[0], self.strips))]
        for gi, (g0, gn) in enumerate(tiles(self.n, self.plan.group)):
            r = self._finish(self._fetch(self.rhs, index, whole, g0, gn, self.slices))
            for i, (m0, mt) in enumerate(mtiles):
                midway = None
                if gi == 0 and i + 1 < len(mtiles):
                    pending = self._fetch(self.lhs, index, whole, *mtiles[i + 1], self.strips)
                    midway = (lambda p=pending: strips.append(self._finish(p)), i > 0)
                accs = self._accs(mt, gn)
                self._matmuls(accs, strips[i], r, self.k, mt, True, midway)
                self._drain(accs, base, m0, mt, g0, gn)

    def _deep(self, index, base: int) -> None:
        """K in blocks: both operands reloaded per (row tile, column group, K block)."""
        for m0, mt in tiles(self.m, P):
            for g0, gn in tiles(self.n, self.plan.group):
                accs = self._accs(mt, gn)
                for bi, kblock in enumerate(tiles(self.k, self.plan.kb)):
                    s = self._finish(self._fetch(self.lhs, index, kblock, m0, mt, self.strips))
                    r = self._finish(self._fetch(self.rhs, index, kblock, g0, gn, self.slices))
                    self._matmuls(accs, s, r, kblock[1], mt, bi == 0, None)
                self._drain(accs, base, m0, mt, g0, gn)

    # --- compute ---------------------------------------------------------------------------

    def _accs(self, mt: int, gn: int) -> list[tuple[int, int, isa.Tile]]:
        return [(c0, ct, sub(self.acc.next(), mt, ct)) for c0, ct in tiles(gn, MOVING_MAX)]

    def _matmuls(self, accs, s: KMajor, r: KMajor, depth: int, mt: int, first: bool,
                 midway: tuple[Callable, bool] | None) -> None:
        """k-tiles outer, column tiles inner; `midway` (emit, early) runs after half the
        k-tiles if `early`, else after all of them."""
        ktiles = tiles(depth, P)
        at = (len(ktiles) // 2 if midway[1] else len(ktiles)) if midway else -1
        for j, (_, kt) in enumerate(ktiles):
            if j == at:
                midway[0]()
            for c0, ct, acc in accs:
                self.kb.emit(isa.NcMatmul, dst=acc, stationary=s.tile(j, kt, mt),
                             moving=r.tile(j, kt, ct, at=c0), precision=self.precision,
                             accumulate=not (first and j == 0))
        if at == len(ktiles):
            midway[0]()

    def _drain(self, accs, base: int, m0: int, mt: int, g0: int, gn: int) -> None:
        """PSUM -> SBUF in the result dtype, then one DMA of the [mt, gn] block (or the
        fused epilogue's version of it, epilogue.py)."""
        if self.epilogue is not None:
            return self.epilogue.drain(accs, base, m0, mt, g0, gn)
        otile = sub(self.obuf.next(), mt, gn)
        for c0, ct, acc in accs:
            self.kb.emit(isa.TensorCopy, dst=sub(otile, mt, ct, at=c0), src=acc,
                         engine=self.kb.evac_engine())
        ap = self.kb.ap(self.out, base + m0 * self.n + g0, ((self.n, mt), (1, gn)))
        self.kb.dma(ap, otile)

    # --- K-major loads -----------------------------------------------------------------------

    def _fetch(self, op: Operand, index, kblock, f0: int, fsize: int, ring) -> _Load:
        """Issues the DMAs of op[kblock, f0:f0+fsize] as K-major tiles."""
        load = _Load(KMajor(ring.next(), fsize))
        base = op.batch_offset(index) + kblock[0] * op.k[0] + f0 * op.f[0]
        if op.via_dma:
            for j, (k0, kt) in enumerate(tiles(kblock[1], P)):
                src = self.kb.ap(op.t, base + k0 * op.k[0], ((op.f[0], fsize), (op.k[0], kt)))
                self.kb.emit(isa.DmaTranspose, dst=load.dst.tile(j, kt, fsize), src=src,
                             dma_queue=next(self.kb._queues))
            return load
        if op.transposed:
            stage = self.stage[id(op)]
            for c0, fc in tiles(fsize, P):
                if len(load.staged) == len(stage.tiles):
                    # The ring wraps onto a chunk not transposed yet: transpose it first.
                    self._transpose_staged(load.staged.pop(0), load.dst)
                rows = sub(stage.next(), fc, kblock[1])
                src = ((op.f[0], fc), (op.k[0], kblock[1]))
                self.kb.dma(rows, self.kb.ap(op.t, base + c0 * op.f[0], src))
                load.staged.append((rows, c0, fc))
            return load
        for j, (k0, kt) in enumerate(tiles(kblock[1], P)):
            src = self.kb.ap(op.t, base + k0 * op.k[0], ((op.k[0], kt), (op.f[0], fsize)))
            self.kb.dma(load.dst.tile(j, kt, fsize), src)
        return load

    def _finish(self, load: _Load) -> KMajor:
        """Emits the TensorE transposes of a staged load (none for a direct one)."""
        for staged in load.staged:
            self._transpose_staged(staged, load.dst)
        load.staged.clear()
        return load.dst

    def _transpose_staged(self, staged: tuple[isa.Tile, int, int], dst: KMajor) -> None:
        rows, c0, fc = staged
        for group in _runs(tiles(rows.free_size, P), MOVING_MAX // fc):
            self._transpose(rows, group, fc, c0, dst)

    def _transpose(self, rows: isa.Tile, group, fc: int, c0: int, dst: KMajor) -> None:
        """Transposes k-tiles of `rows` [fc, K] into one PSUM bank, then copies them to
        `dst`: with one copy when they are adjacent there (a full-width strip)."""
        bank = self.tps.next()
        kt = group[0][1][1]
        for g, (_, (k0, _)) in enumerate(group):
            self.kb.emit(isa.NcTranspose, dst=sub(bank, kt, fc, at=g * fc),
                         data=sub(rows, fc, kt, at=k0))
        if dst.stride == fc:
            self.kb.emit(isa.TensorCopy, dst=dst.tile(group[0][0], kt, len(group) * fc),
                         src=sub(bank, kt, len(group) * fc), engine=self.kb.evac_engine())
            return
        for g, (j, _) in enumerate(group):
            self.kb.emit(isa.TensorCopy, dst=dst.tile(j, kt, fc, at=c0),
                         src=sub(bank, kt, fc, at=g * fc), engine=self.kb.evac_engine())


def _runs(ktiles: list[tuple[int, int]], size: int) -> list[list]:
    """Consecutive (j, (k0, kt)) runs of equal kt, at most `size` long."""
    out: list[list] = []
    for j, kt in enumerate(ktiles):
        if out and len(out[-1]) < size and out[-1][-1][1][1] == kt[1]:
            out[-1].append((j, kt))
        else:
            out.append([(j, kt)])
    return out
