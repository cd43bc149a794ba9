"""The TensorE loop nest of one canonical matmul: per batch, out[M, N] = lhs[M, K] @ rhs[K, N].

TensorE computes dst[M, N] (+)= stationary[K, M].T @ moving[K, N] with K on partitions
(§2.2): lhs tiles are stationary (M <= 128 per tile: `Target.stationary_max`), rhs
tiles moving (N <= 512, one PSUM bank of FP32: `Target.psum_bank_fp32`). An operand whose K axis is the contiguous one (lhs [M, K]
row-major, rhs [N, K]) must be transposed. Reading it K-major by a plain DMA would move
2-4 byte runs, far below DMA efficiency (§3.4: ~0.2% at 2 bytes in our model), so:

- on v3+ with a 2- or 4-byte SBUF dtype equal to its DRAM dtype, by `dma_transpose`
  straight from DRAM (§3.4: up to 90% of the DMA rate; one DMA per 128-deep k-tile of
  the whole strip). TensorE, PSUM and the evacuation engines do no transpose work;
- otherwise loaded naturally (rows of K: long DMA runs) and transposed on TensorE into
  PSUM, then copied to SBUF in the matmul dtype, as the Neuron compiler does (~128
  cycles per 128x128 tile against 512 per matmul that reuses it);
- on v2 (no dma_transpose), where VectorE and the DMA queues keep pace with TensorE,
  most lhs row tiles are loaded naturally and transposed on VectorE in 32x32 blocks
  of 32-bit words moved across quadrants, k-tiles of every w-th k (matmul_quarters.py;
  loop order in matmul_vector.py, `kperm`).

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
through tile i's matmuls so their PSUM evacuation hides behind TensorE work. Loads and
stores use separate DMA queues (a prefetch never waits behind a store). The kernel's
first column group computes its first few row tiles together, k outer, so each rhs
k-tile feeds several matmuls as it arrives. A K-major lhs ([K, M], M contiguous) loads
the whole block per k-tile (rows of mb elements rather than 128), its DMAs alternating
with the first rhs slice's k-tile by k-tile, and the bunch doubled (two loads per
k-step). With one column group the rhs slice stays resident across M blocks.

The plan (block rows, column group; matmul_plan.py) is the one that fits SBUF with the
least DMA cost (bytes over descriptor efficiency, §3.4). FP8 x FP8 on v3+ runs `double_row` (§2.2):
each matmul contracts 256 rows of K at the BF16 cycle count, both operands [P, 2, F].
dma_transpose is 2/4-byte only (§3.4), so a row-major FP8 lhs is transposed as 16-bit
pairs of K: partition p of a 256-row block then holds rows 2p and 2p + 1, interleaved
byte by byte along M, and the stationary operand reads it as [P, 2, M] through a
stride-2 access pattern (§3.1: strided free-axis patterns, full bandwidth up to 16-byte
strides). The moving tiles take the same rows (2p, 2p + 1) per partition. Otherwise
pairs are k-tiles (j, j + 1), read from the ordinary K-major tiles through a pattern
stepping one k-tile, and an FP8 lhs is transposed on TensorE.

When K is too deep for a strip to fit (`Plan.kb < K`), K is cut in blocks. If every
row tile's FP32 sums fit in SBUF (`Plan.sbuf_acc`, no fused epilogue), each block's
product is added into them (VectorE) and each operand is loaded once per column group;
otherwise bunches of row tiles (as many as PSUM holds) accumulate over the blocks
together, so each rhs block is loaded once per bunch and column group, each lhs strip
once per column group.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Callable

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .layout import tiles
from .matmul_loads import KMajor, Loads
from .matmul_plan import LOOKAHEAD, Operand, Plan, interleaved
from .matmul_vector import WIDE, VectorSchedule
from .target import Target

TRANSPOSE_BANKS = 3         # PSUM banks (of the target's 8) for TensorE transposes when
                            # an operand is transposed there; the rest accumulate
STORE_QUEUE_SHARE = 4       # 1/4 of the DMA queues carry result stores
BUNCH = 2                   # row tiles of the first column group computed together (x the
                            # rhs DMA cast's byte ratio: `_cast_ratio`)


# --- the emitter -----------------------------------------------------------------------------

class MatmulEmitter(Loads, VectorSchedule):
    """Emits the loop nest of one canonical matmul (see the module docstring)."""

    def __init__(self, kb: KernelBuilder, lhs: Operand, rhs: Operand, out: DramTensor,
                 plan: Plan, precision: str = "native", epilogue=None,
                 double_row: bool = False, kperm: int = 0):
        self.kb, self.lhs, self.rhs, self.out, self.plan = kb, lhs, rhs, out, plan
        self.epilogue = epilogue
        self.double_row = double_row    # see `double_row()`
        self.interleaved = interleaved(lhs, double_row)
        self.first_block = True
        self.resident = None            # (batch index, rhs slice) of a single column group
        self.m, self.k, self.n = lhs.f[1], lhs.k[1], rhs.f[1]
        target = kb.target
        self.kt, self.mt = target.partitions, target.stationary_max   # k-tile, row tile
        self.bank = target.psum_bank_fp32       # FP32 columns of one PSUM bank (§3.2)
        self.cols = _moving_cols(target, plan.group, epilogue is None)   # per matmul
        # Loads and stores on separate DMA queues (FIFO each, §3.4): a prefetch never
        # waits behind the store of a tile still being computed.
        nq = target.dma_queues
        split = max(1, nq - max(1, nq // STORE_QUEUE_SHARE))
        self.load_q = itertools.cycle(range(split))
        self.store_q = itertools.cycle(range(split, nq) if split < nq else range(nq))
        self.precision = precision
        nk = -(-plan.kb // self.kt)
        deep = plan.kb < self.k
        # K permuted (w elements per word), lhs row tiles VectorE transposes (their
        # first rows): matmul_quarters.py, matmul_vector.py
        self.kperm, self.vector_rows = kperm, frozenset()
        if kperm and self._wide_applies():
            self.plan = dataclasses.replace(plan, group=WIDE)
            if not self._vector_order():
                self.plan = plan
        plan = self.plan
        if kperm and self._vector_order():
            self.vector_rows = self._vector_tiles()
        self.kperm = kperm if self.vector_rows else 0
        self.vector_busy = False        # VectorE transposes emitted: evacuate on ScalarE
        depths = self._depths() if self.kperm else {}
        self.slices = kb.ring(2, nk * plan.group, rhs.dtype)
        self.stage = {id(op): kb.ring(depths.get("stage", LOOKAHEAD + 1), plan.kb, op.dtype)
                      for op in (lhs, rhs) if op.pe_transposed}
        # A K-major lhs ([K, M], M contiguous) loads a whole block per k-tile: DMA rows
        # of mb elements instead of 128 (§3.4: 256 B runs reach ~10% of the DMA rate).
        self.wide = not (deep or lhs.transposed or double_row) and plan.mb > self.mt
        strips = 2 if deep else -(-plan.mb // self.mt)
        self.strips = kb.ring(1, nk * plan.mb, lhs.dtype) if self.wide else \
            kb.ring(depths.get("strips", strips), nk * self.mt, lhs.dtype)
        self.obuf = kb.ring(depths.get("obuf", 2), plan.group, out.dtype) \
            if epilogue is None else None
        self.sums = (kb.tile(-(-self.m // self.mt) * plan.group, "float32")
                     if plan.sbuf_acc else None)
        # with kperm, TensorE transposes use their tile's accumulator banks (matmul_vector)
        tbanks = TRANSPOSE_BANKS if self.stage and not self.kperm else 0
        self.tps = kb.ring(tbanks, self.bank, "float32", mem="psum") if tbanks else None
        per_acc = -(-self.cols // self.bank)            # banks one accumulator spans
        self.acc = kb.ring((target.psum_banks - tbanks) // per_acc, self.cols, "float32",
                           mem="psum")
        if epilogue is not None:
            epilogue.start(kb, plan.group)

    def run(self) -> None:
        batch = [n for _, n in self.lhs.batch]
        for flat, index in enumerate(itertools.product(*map(range, batch))):
            base = flat * self.m * self.n
            if self.plan.sbuf_acc:
                self._deep_sums(index, base)
                continue
            if self.kperm:
                self._vector_kernel(index, base)
                continue
            if self.plan.kb < self.k:
                self._deep(index, base)
                continue
            for mb0, mbn in tiles(self.m, self.plan.mb):
                self._mblock(index, base, mb0, mbn)
        rings = [self.strips, self.slices, self.acc, *self.stage.values()]
        self.kb.release(*rings, *(r for r in (self.tps, self.obuf, self.sums) if r))
        if self.epilogue is not None:
            self.epilogue.close()

    def _mblock(self, index, base: int, mb0: int, mbn: int) -> None:
        mtiles = [(mb0 + m0, mt) for m0, mt in tiles(mbn, self.mt)]
        whole = (0, self.k)
        if self.wide:
            return self._wide_mblock(index, base, mb0, mbn, mtiles)
        bunch = self._bunch_size(mtiles) if self.first_block else 1
        self.first_block = False
        fetched, strips = [], []
        for mt in mtiles[:bunch]:       # each finished before the next reuses its stage
            fetched.append(self._fetch(self.lhs, index, whole, *mt, self.strips))
            strips.append(self._finish(fetched[-1]))
        for gi, (g0, gn) in enumerate(tiles(self.n, self.plan.group)):
            r = self._rhs(index, g0, gn)
            if gi == 0 and bunch > 1:
                self._bunched(strips, r, mtiles[:bunch], base, g0, gn)
            for i, (m0, mt) in enumerate(mtiles):
                midway = None
                if gi == 0:
                    if i < bunch and bunch > 1:
                        continue
                    while len(fetched) <= min(i + LOOKAHEAD, len(mtiles) - 1):
                        fetched.append(self._fetch(self.lhs, index, whole,
                                                   *mtiles[len(fetched)], self.strips))
                    if len(strips) <= i:
                        strips.append(self._finish(fetched[i]))
                    if i + 1 < len(mtiles) and len(strips) <= i + 1:
                        midway = (lambda p=fetched[i + 1]: strips.append(self._finish(p)),
                                  i > 0)
                accs = self._accs(mt, gn)
                self._matmuls(accs, strips[i], r, self.k, mt, True, midway)
                self._drain(accs, base, m0, mt, g0, gn)

    def _bunch_size(self, mtiles, loads: int = 1) -> int:
        """Row tiles the kernel's first column group computes together, k-steps outer:
        each rhs k-tile then feeds that many matmuls as it arrives (the first group's
        rhs is the only load nothing hides). One set of PSUM banks stays free."""
        per = -(-min(self.n, self.plan.group) // self.cols)
        return max(1, min(len(mtiles), BUNCH * _cast_ratio(self.rhs) * loads,
                          len(self.acc.tiles) // per - 1))

    def _bunched(self, strips, r: KMajor, mtiles, base: int, g0: int, gn: int,
                 accs=None) -> None:
        """k-steps outer over `mtiles` (their accumulators `accs`, else from the ring)."""
        accs = accs or [self._accs(mt, gn) for _, mt in mtiles]
        for i, (j, kt, paired) in enumerate(self._ksteps(self.k)):
            for b, (_, mt) in enumerate(mtiles):
                for c0, ct, acc in accs[b]:
                    self._mm(acc, strips[b], r, j, kt, paired, mt, c0, ct, i > 0)
        for b, (m0, mt) in enumerate(mtiles):
            self._drain(accs[b], base, m0, mt, g0, gn)

    def _wide_mblock(self, index, base: int, mb0: int, mbn: int, mtiles) -> None:
        """The block's lhs [K, mbn] in one DMA per k-tile; strip i is a view into it."""
        g0, gn = tiles(self.n, self.plan.group)[0]
        both = self._plain(self.rhs) and not self._resident(index)
        first = None
        if both:
            block, first = self._fetch_both(index, mb0, mbn, g0, gn)
        else:
            block = self._fetch(self.lhs, index, (0, self.k), mb0, mbn, self.strips).dst
        strips = [KMajor(sub(block.base, self.kt, 1, at=m0 - mb0), mbn) for m0, _ in mtiles]
        bunch = self._bunch_size(mtiles, 2) if both else 1
        for gi, (g0, gn) in enumerate(tiles(self.n, self.plan.group)):
            r = self._rhs(index, g0, gn, first if gi == 0 else None)
            if gi == 0 and bunch > 1:   # k outer: each arriving k-tile pair feeds the bunch
                self._bunched(strips, r, mtiles[:bunch], base, g0, gn)
            for i, (m0, mt) in enumerate(mtiles):
                if gi == 0 and i < bunch and bunch > 1:
                    continue
                accs = self._accs(mt, gn)
                self._matmuls(accs, strips[i], r, self.k, mt, True, None)
                self._drain(accs, base, m0, mt, g0, gn)

    def _resident(self, index) -> bool:
        return (self.n <= self.plan.group and self.resident is not None
                and self.resident[0] == index)

    def _plain(self, op: Operand) -> bool:
        """Loaded k-tile by k-tile as it lies (`_plain_dmas`)."""
        return not (op.transposed or op.via_dma or self.interleaved)

    def _rhs(self, index, g0: int, gn: int, loaded: KMajor | None = None) -> KMajor:
        """The rhs slice R[K, g0:g0+gn], loaded (or `loaded`, fetched by the caller);
        with one column group the same slice serves every M block, so it stays resident
        and is loaded once per batch index (a vocabulary gradient [32000, 4092] x
        [4092, 1024] read it 31 times)."""
        if self._resident(index):
            return self.resident[1]
        r = loaded if loaded is not None else self._finish(
            self._fetch(self.rhs, index, (0, self.k), g0, gn, self.slices))
        self.resident = (index, r) if self.n <= self.plan.group else None
        return r

    def _deep(self, index, base: int) -> None:
        """K in blocks. Row tiles go in bunches that accumulate in PSUM together (as
        many as its banks hold, one set left free for draining), so each rhs K block
        loaded feeds the whole bunch: the rhs is reloaded once per bunch, not per row
        tile (a vocabulary projection's gradient, K = 32000: 2.6 -> ~0.9 GB moved)."""
        mtiles = tiles(self.m, self.mt)
        per = -(-min(self.n, self.plan.group) // self.cols)
        size = max(1, len(self.acc.tiles) // per - 1)
        for b0 in range(0, len(mtiles), size):
            bunch = mtiles[b0:b0 + size]
            for g0, gn in tiles(self.n, self.plan.group):
                accs = [self._accs(mt, gn) for _, mt in bunch]
                for bi, kblock in enumerate(tiles(self.k, self.plan.kb)):
                    r = self._finish(self._fetch(self.rhs, index, kblock, g0, gn, self.slices))
                    for acc, (m0, mt) in zip(accs, bunch):
                        s = self._finish(self._fetch(self.lhs, index, kblock, m0, mt,
                                                     self.strips))
                        self._matmuls(acc, s, r, kblock[1], mt, bi == 0, None)
                for acc, (m0, mt) in zip(accs, bunch):
                    self._drain(acc, base, m0, mt, g0, gn)

    def _deep_sums(self, index, base: int) -> None:
        """K in blocks, every row tile's FP32 sums in SBUF (`Plan.sbuf_acc`): per column
        group, each rhs K block is loaded once and feeds every row tile; a row tile's
        block product (PSUM) is copied into its sums (first block), added to them
        (VectorE, FP32), or added and cast into the result (last block). Each operand
        is read once per column group."""
        mtiles, kblocks = tiles(self.m, self.mt), tiles(self.k, self.plan.kb)
        for g0, gn in tiles(self.n, self.plan.group):
            for bi, kblock in enumerate(kblocks):
                r = self._finish(self._fetch(self.rhs, index, kblock, g0, gn, self.slices))
                for i, (m0, mt) in enumerate(mtiles):
                    s = self._finish(self._fetch(self.lhs, index, kblock, m0, mt,
                                                 self.strips))
                    accs = self._accs(mt, gn)
                    self._matmuls(accs, s, r, kblock[1], mt, True, None)
                    self._sum(accs, sub(self.sums, mt, gn, at=i * self.plan.group),
                              bi, len(kblocks), (base, m0, mt, g0, gn))

    def _sum(self, accs, sums: isa.Tile, bi: int, blocks: int, where) -> None:
        base, m0, mt, g0, gn = where
        last = bi == blocks - 1
        otile = sub(self.obuf.next(), mt, gn) if last else None
        for c0, ct, acc in self._banks(accs, mt):
            part = sub(sums, mt, ct, at=c0)
            dst = sub(otile, mt, ct, at=c0) if last else part
            if bi == 0:
                self.kb.emit(isa.TensorCopy, dst=dst, src=acc, engine=self._evac_engine())
            else:
                self.kb.emit(isa.TensorTensor, dst=dst, data1=part, data2=acc, op="add")
        if last:
            self._store(otile, base, m0, mt, g0, gn)

    # --- compute ---------------------------------------------------------------------------

    def _accs(self, mt: int, gn: int) -> list[tuple[int, int, isa.Tile]]:
        return [(c0, ct, sub(self.acc.next(), mt, ct)) for c0, ct in tiles(gn, self.cols)]

    def _matmuls(self, accs, s: KMajor, r: KMajor, depth: int, mt: int, first: bool,
                 midway: tuple[Callable, bool] | None) -> None:
        """k-steps outer, column tiles inner; `midway` (emit, early) runs after half the
        k-steps if `early`, else after all of them."""
        steps = self._ksteps(depth)
        at = (len(steps) // 2 if midway[1] else len(steps)) if midway else -1
        for i, (j, kt, paired) in enumerate(steps):
            if i == at:
                midway[0]()
            for c0, ct, acc in accs:
                self._mm(acc, s, r, j, kt, paired, mt, c0, ct, not (first and i == 0))
        if at == len(steps):
            midway[0]()

    def _mm(self, acc, s: KMajor, r: KMajor, j: int, kt: int, paired: bool, mt: int,
            c0: int, ct: int, accumulate: bool) -> None:
        if paired:
            operands = dict(stationary=s.pair(j, mt), moving=r.pair(j, ct, at=c0),
                            perf_mode="double_row")
        else:
            operands = dict(stationary=s.tile(j, kt, mt), moving=r.tile(j, kt, ct, at=c0))
        self.kb.emit(isa.NcMatmul, dst=acc, precision=self.precision, accumulate=accumulate,
                     **operands)

    def _ksteps(self, depth: int) -> list[tuple[int, int, bool]]:
        """(first k-tile, its depth, double_row) per matmul along K: full k-tiles in
        pairs in double_row mode (K = 256 per matmul, §2.2), else one k-tile each."""
        ktiles = tiles(depth, self.kt)
        steps, j = [], 0
        while j < len(ktiles):
            paired = (self.double_row and j + 1 < len(ktiles)
                      and ktiles[j][1] == ktiles[j + 1][1] == self.kt)
            steps.append((j, ktiles[j][1], paired))
            j += 2 if paired else 1
        return steps

    def _drain(self, accs, base: int, m0: int, mt: int, g0: int, gn: int) -> None:
        """PSUM -> SBUF in the result dtype, then one DMA of the [mt, gn] block (or the
        fused epilogue's version of it, epilogue.py)."""
        # One bank per evacuation copy, the engines alternating (a wider accumulator is
        # evacuated in bank-wide pieces, as the epilogue's steps expect them).
        accs = self._banks(accs, mt)
        if self.epilogue is not None:
            return self.epilogue.drain(accs, base, m0, mt, g0, gn)
        otile = sub(self.obuf.next(), mt, gn)
        for c0, ct, acc in accs:
            self.kb.emit(isa.TensorCopy, dst=sub(otile, mt, ct, at=c0), src=acc,
                         engine=self._evac_engine())
        self._store(otile, base, m0, mt, g0, gn)

    def _evac_engine(self) -> str:
        """PSUM evacuation copies alternate VectorE / ScalarE; all on ScalarE once
        VectorE transposes lhs tiles (its queue is in order: a copy waiting for TensorE
        would hold back the transposes of tiles ahead)."""
        return "scalar" if self.vector_busy else self.kb.evac_engine()

    def _banks(self, accs, mt: int) -> list[tuple[int, int, isa.Tile]]:
        """`accs` as (column, width, PSUM tile) pieces of at most one bank each."""
        return [(c0 + b0, bn, sub(acc, mt, bn, at=b0)) for c0, ct, acc in accs
                for b0, bn in tiles(ct, self.bank)]

    def _store(self, otile: isa.Tile, base: int, m0: int, mt: int, g0: int, gn: int
               ) -> None:
        """One DMA of the finished [mt, gn] block to the result."""
        ap = self.kb.ap(self.out, base + m0 * self.n + g0, ((self.n, mt), (1, gn)))
        self._dma(ap, otile, self.store_q)


def _cast_ratio(op: Operand) -> int:
    """DRAM bytes per SBUF byte of an operand the DMA casts (§3.4: casts go through
    FP32), e.g. 2 for FP32 weights of a BF16 layer. Its k-tiles arrive that much more
    slowly, so the first column group computes that many times more row tiles on each:
    flax linen's bf16 projections with f32 parameters ([2048, 1024] x [1024, 1024],
    trn2) 77.0 -> 74.6 us; BF16 weights (the 2048^3 GEMM, the transformer block) keep
    BUNCH, where 3 measured slower (227.7 -> 229.7 us)."""
    return max(1, hw_dtypes.itemsize(op.t.dtype) // hw_dtypes.itemsize(op.dtype))


def _moving_cols(target: Target, group: int, plain: bool) -> int:
    """Columns of one matmul: one PSUM bank of FP32 (§2.2: the moving-free maximum on
    v2/v3); on NeuronCore-v4, whose matmul may write several banks, the whole column
    group up to the moving-free maximum (4096 FP32, §2.2) -- for a plain matmul.

    Measured on trn3 (benchmarks/matmul_roofline.py, compiler.py): the same simulated
    time (TensorE does the same MultiplyMoving work; LoadStationary hides behind it
    either way) with half the matmul instructions (4096^3 bf16: 10112 -> 6016
    instructions, lowering + simulation ~35% faster). With a fused epilogue the
    bank-wide epilogue steps then wait for the whole group's matmul (transformer block:
    +1 us), so epilogue matmuls stay one bank wide."""
    if target.matmul_spans_banks and plain:
        return max(target.psum_bank_fp32, min(target.moving_max, group))
    return target.psum_bank_fp32
