"""The conv kernel (the tap loop, see conv/__init__.py): per group block, resident weights; per output band, the
input band (padded in SBUF or read from the staged layout, replicated for tap
packing), then for each output-channel tile and PSUM chunk the (ci tile, tap group)
matmuls, the evacuation of valid columns and one store per band."""
from __future__ import annotations

import itertools

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from ..builder import KernelBuilder, sub
from ..layout import tiles
from .geometry import Block, Conv, Packing, Padded, Phased, Staged, Unit, compact
from .plan import BAND_BUFS, OUT_BUFS, PSUM_ACCS, Plan, chunks, phase_count


class ConvEmitter:
    """Emits the conv kernel (see conv/__init__.py)."""

    def __init__(self, kb: KernelBuilder, cv: Conv, plan: Plan, pk: Packing,
                 staged: Staged | Padded, wts: tuple[str, DramTensor], units,
                 out: DramTensor, precision: str, ldt: str, rdt: str):
        self.kb, self.cv, self.plan, self.x, self.pk = kb, cv, plan, staged, pk
        self.wsrc, self.wt = wts
        self.units, self.out, self.precision, self.ldt, self.rdt = units, out, precision, ldt, rdt
        self.h, self.w = cv.dims[-2:]
        self.outer = cv.dims[:-2]
        self.ko = list(itertools.product(*(range(d.kernel) for d in self.outer)))
        self.band_rows = plan.band + self.h.shift
        self.per_ko = phase_count(cv) * self.band_rows * self.w.q
        self.inner = [(kh, kw) for kh in range(self.h.kernel) for kw in range(self.w.kernel)]
        self.queues = itertools.cycle(range(kb.target.dma_queues))

    def run(self) -> None:
        kb = self.kb
        ncit = max(len(tiles(b.cn, self.cv.pmax)) for b in self.cv.blocks)
        bands = kb.ring(BAND_BUFS * ncit, len(self.ko) * self.per_ko, self.ldt)
        self.stage = None
        if isinstance(self.x, Phased):
            self._phased_setup()
        elif isinstance(self.x, Padded):
            if self.x.gaps(self.w):         # zero columns between rows, set once
                for t in bands.tiles:
                    kb.emit(isa.Memset, dst=t, value=0, engine="vector")
            if self.x.gaps(self.w) or self.x.row[-2] != self.w.size or (
                    self.x.transposed and self.w.q != self.w.size):
                self.stage = kb.ring(2, self.band_rows * self.w.size, self.ldt)
        accs = kb.ring(PSUM_ACCS, self.cv.bank, "float32", mem="psum")
        obuf = kb.ring(OUT_BUFS, self.plan.band * self.w.out, self.out.dtype)
        for b, us in zip(self.cv.blocks, self.units):
            weights = [self._load_weights(b, u) for u in us]
            jobs = [(n, od, r0, rn) for n in range(self.cv.n_out)
                    for od in itertools.product(*(range(d.out) for d in self.outer))
                    for r0, rn in tiles(self.h.out, self.plan.band)]
            # Band k + 1 is prepared before band k's matmuls: the engines run their
            # queues in order, so its padding copies then overlap band k's matmuls;
            # a phased band's DMA is issued one band earlier still, as its TensorE
            # work would otherwise wait for it at the head of TensorE's queue.
            lead = 2 if isinstance(self.x, Phased) else 1
            fetched = [self._fetch_bands(bands, b, *job) for job in jobs[:lead]]
            ahead = self._prepare_bands(fetched.pop(0))
            for k, job in enumerate(jobs):
                if k + lead < len(jobs) and lead > 1:
                    fetched.append(self._fetch_bands(bands, b, *jobs[k + lead]))
                xs = ahead
                if k + 1 < len(jobs):
                    if lead == 1:
                        fetched.append(self._fetch_bands(bands, b, *jobs[k + 1]))
                    ahead = self._prepare_bands(fetched.pop(0))
                self._compute(b, weights, xs, accs, obuf, *job)
            kb.release(*weights)
        kb.release(bands, accs, obuf, *([self.stage] if self.stage else []),
                   *getattr(self, "phased_bufs", ()))

    def _fetch_bands(self, bands, b: Block, n: int, od, r0: int, rn: int) -> list:
        """Per ci tile of block b: the band's DMAs issued (phased input) or what to load."""
        out = []
        for ci0, ct in tiles(b.cn, self.cv.pmax):
            buf = bands.next()
            if isinstance(self.x, Phased):
                out.append(self._fetch_phased(buf, b, ci0, ct, n, r0))
            else:
                out.append(lambda buf=buf, ci0=ci0, ct=ct: self._load_band(
                    buf, b, ci0, ct, n, od, r0))
        return out

    def _prepare_bands(self, fetched: list) -> list[isa.Tile]:
        """The (replicated) input bands, one per ci tile."""
        if isinstance(self.x, Phased):
            return [self._replicate(self._place_phased(*f)) for f in fetched]
        return [self._replicate(load()) for load in fetched]

    # --- phased input (stride / lhs dilation), conv.Phased ------------------------------

    def _phased_setup(self) -> None:
        """Selection matrices per column block of 128 input columns, and the rings."""
        kb, w = self.kb, self.w
        width = len(w.phases) * w.q
        self.sel_mats = []
        for c0, cn in tiles(w.size, self.cv.pmax):
            idx = kb.tile(width, "int32", parts=cn)
            for bi, a in enumerate(w.phases):   # ld * (c0 + p) + lo - a - s * j
                kb.emit(isa.Iota, dst=sub(idx, cn, w.q, at=bi * w.q), pattern=((-w.stride, w.q),),
                        offset=w.ld * c0 + w.lo - a, channel_multiplier=w.ld)
            sel = kb.tile(width, self.ldt, parts=cn)
            kb.emit(isa.TensorScalar, dst=sel, data=idx, op0="is_equal", operand0=0,
                    engine="gpsimd")
            kb.release(idx)
            self.sel_mats.append((c0, cn, sel))
        # Rows of bands k + 1 and k + 2 are in flight (DMAed, not yet placed).
        ncit = max(len(tiles(b.cn, self.cv.pmax)) for b in self.cv.blocks)
        self.stage = kb.ring(BAND_BUFS * ncit, self.band_rows * self.h.stride * w.size,
                             self.ldt)
        self.tps = kb.ring(2, self.cv.bank, "float32", mem="psum")
        self.sels = kb.ring(2, self.cv.bank, "float32", mem="psum")
        self.xts = kb.ring(3, self.cv.bank, self.ldt)
        self.phased_bufs = (self.tps, self.sels, self.xts, *(m for *_, m in self.sel_mats))

    def _fetch_phased(self, buf: isa.Tile, b: Block, ci0: int, ct: int, n: int, r0: int):
        """DMAs the input rows that land in the band's phase rows q in [r0, +rows)."""
        h, x = self.h, self.x
        rows = min(self.band_rows, h.q - r0)
        hits = []                               # (input row, phase index, phase row)
        for ah, a in enumerate(h.phases):
            for q in range(r0, r0 + rows):
                hp = h.stride * q + a - h.lo
                if hp % h.ld == 0 and 0 <= hp // h.ld < h.size:
                    hits.append((hp // h.ld, ah, q))
        hits.sort()
        staged = None
        if hits:
            first, nrows = hits[0][0], hits[-1][0] - hits[0][0] + 1
            staged = sub(self.stage.next(), ct, nrows * self.w.size)
            off = (n + b.batch_off) * x.n + (b.c0 + ci0) * x.c + first * x.row[-2]
            self._load_rows(staged, off, ct, nrows, self.w.size)
        return buf, ct, r0, hits, staged

    def _place_phased(self, buf: isa.Tile, ct: int, r0: int, hits, staged) -> isa.Tile:
        """Input rows -> TensorE transposes -> selection matmuls -> their phase rows, a
        group of rows per PSUM bank (one evacuation copy per group, and TensorE runs
        the group's transposes and matmuls back to back)."""
        kb, w, q = self.kb, self.w, self.w.q
        tile = sub(buf, ct, self.per_ko)
        kb.emit(isa.Memset, dst=tile, value=0, engine="gpsimd")
        width = len(w.phases) * q
        group = max(1, min(self.cv.bank // ct, self.cv.bank // width))
        for g0 in range(0, len(hits), group):
            rows = hits[g0:g0 + group]
            sel = self.sels.next()
            for i, (c0, cn, mat) in enumerate(self.sel_mats):
                tp = self.tps.next()
                for g, (r, _, _) in enumerate(rows):
                    at = (r - hits[0][0]) * w.size + c0
                    kb.emit(isa.NcTranspose, dst=sub(tp, cn, ct, at=g * ct),
                            data=sub(staged, ct, cn, at=at))
                xt = sub(self.xts.next(), cn, len(rows) * ct)
                kb.emit(isa.TensorCopy, dst=xt, src=sub(tp, cn, len(rows) * ct),
                        engine=kb.evac_engine())
                for g in range(len(rows)):
                    kb.emit(isa.NcMatmul, dst=sub(sel, ct, width, at=g * width),
                            stationary=sub(xt, cn, ct, at=g * ct), moving=mat,
                            precision="native", accumulate=i > 0)
            for g, (_, ah, qrow) in enumerate(rows):
                for bi in range(len(w.phases)):
                    at = ((ah * len(w.phases) + bi) * self.band_rows + qrow - r0) * q
                    kb.emit(isa.TensorCopy, dst=sub(tile, ct, q, at=at),
                            src=sub(sel, ct, q, at=g * width + bi * q),
                            engine=kb.evac_engine())
        return tile

    def _compute(self, b: Block, weights, xs, accs, obuf, n: int, od, r0: int, rn: int
                 ) -> None:
        cots = tiles(b.on, self.cv.pmax)
        for m, (co0, cot) in enumerate(cots):
            ws = weights[m::len(cots)]
            otile = sub(obuf.next(), cot, rn * self.w.out)
            for chunk in chunks(self.cv, self.plan.rows, r0, rn):
                acc = accs.next()
                self._matmuls(acc, xs, ws, cot, r0, chunk)
                self._evacuate(acc, otile, r0, chunk)
            self._store(otile, b, n, od, co0, r0, rn)

    def _load_weights(self, b: Block, u: Unit) -> isa.Tile:
        """[reps * ct, slots * cot]: partition r * ct + ci, column g * cot + co holds
        W[ci, tap r of slot g, co] (slot g: outer tap, then tap group)."""
        pk, taps, ng = self.pk, self.cv.taps, len(self.pk.groups)
        t = self.kb.tile(len(self.ko) * ng * u.cot, self.rdt, parts=pk.reps * u.ct)
        if self.wsrc == "staged":   # [ct, taps, cot] blocks at u.offset
            base, (cs, os_) = u.offset, (taps * u.cot, 1)
            tap_at = [i * u.cot for i in range(taps)]
        else:
            os_, cs, sp = self.cv.w
            base = u.ci0 * cs + (b.o0 + u.co0) * os_
            tap_at = [sum(k * st for k, (st, _) in zip(idx, sp)) for idx in
                      itertools.product(*(range(d.kernel) for d in self.cv.dims))]
        inner = self.h.kernel * self.w.kernel
        isz = hw_dtypes.itemsize(self.rdt)
        for r in range(pk.reps):
            slots = [(i * ng + g, tap_at[i * inner + kh * self.w.kernel + kw])
                     for i in range(len(self.ko)) for g, grp in enumerate(pk.groups)
                     if r < len(grp) for kh, kw in grp[r:r + 1]]
            part = t.with_(start_partition=r * u.ct, num_partitions=u.ct)
            if self.wsrc == "transpose":    # [cot, ct] -> [ct, cot] per tap
                for g, at in slots:
                    src = self.kb.ap(self.wt, base + at, ((os_, u.cot), (cs, u.ct)))
                    self.kb.emit(isa.DmaTranspose, dst=part.with_(
                        free=(u.cot,), offset=t.offset + g * u.cot * isz), src=src,
                        dma_queue=next(self.queues))
                continue
            for g0, at0, step, cnt in _runs(slots):
                dst = part.with_(free=(cnt * u.cot,), offset=t.offset + g0 * u.cot * isz)
                src = ((cs, u.ct), *compact(((step, cnt), (os_, u.cot))))
                self.kb.dma(dst, self.kb.ap(self.wt, base + at0, src))
        return t

    def _replicate(self, band: isa.Tile) -> isa.Tile:
        """Replicas 1.. of a band (SBUF -> SBUF DMAs), each shifted by its tap offset."""
        ct, total = band.num_partitions, band.free_size
        for r, shift in enumerate(self.pk.shifts[1:], 1):
            size = total - shift
            src = band.with_(free=(size,),
                             offset=band.offset + shift * hw_dtypes.itemsize(band.dtype))
            self.kb.dma(band.with_(start_partition=r * ct, free=(size,)), src)
        return band.with_(num_partitions=ct * self.pk.reps) if self.pk.reps > 1 else band

    def _load_band(self, buf: isa.Tile, b: Block, ci0: int, ct: int, n: int, od, r0: int
                   ) -> isa.Tile:
        """Input rows [r0, r0 + band + shift) of every phase, per outer tap, for
        channels [ci0, +ct) of block b and output image n."""
        if isinstance(self.x, Padded):
            return self._load_padded(buf, b, ci0, ct, n, od, r0)
        x, h, w = self.x, self.h, self.w
        base = x.offset + (n + b.batch_off) * x.n + (b.c0 + ci0) * x.c + r0 * x.row[-2]
        rows = min(self.band_rows, h.q - r0)
        tile = sub(buf, ct, len(self.ko) * self.per_ko)
        for i, ko in enumerate(self.ko):
            off = base
            for d, k, o, ps, rs in zip(self.outer, ko, od, x.phase, x.row):
                a, s = d.tap(k)
                off += d.phases.index(a) * ps + (o + s) * rs
            pattern = ((x.phase[-2], len(h.phases)), (x.phase[-1], len(w.phases)),
                       (x.row[-2], rows), (x.row[-1], w.q))
            if rows < self.band_rows:       # the last band: its phase blocks stay apart
                for ph in range(phase_count(self.cv)):
                    ih, iw = divmod(ph, len(w.phases))
                    at = i * self.per_ko + ph * self.band_rows * w.q
                    src = off + ih * x.phase[-2] + iw * x.phase[-1]
                    self.kb.dma(sub(tile, ct, rows * w.q, at=at),
                                self.kb.ap(x.t, src, ((x.c, ct), *pattern[2:])))
                continue
            self.kb.dma(sub(tile, ct, self.per_ko, at=i * self.per_ko),
                        self.kb.ap(x.t, off, ((x.c, ct), *compact(pattern))))
        return tile

    def _load_padded(self, buf: isa.Tile, b: Block, ci0: int, ct: int, n: int, od, r0: int
                     ) -> isa.Tile:
        x, h, w, q = self.x, self.h, self.w, self.w.q
        tile = sub(buf, ct, len(self.ko) * self.per_ko)
        rows = min(self.band_rows, h.q - r0)
        c_lo, c_hi = x.cols(w)
        lo, hi = max(r0, h.lo), min(r0 + rows, h.lo + h.size)    # rows with input data
        base = (n + b.batch_off) * x.n + (b.c0 + ci0) * x.c + (lo - h.lo) * x.row[-2]
        if self.stage is None:
            base += c_lo - w.lo
        for i, ko in enumerate(self.ko):
            at = i * self.per_ko
            iq = [o + k * d.rd - d.lo for d, k, o in zip(self.outer, ko, od)]
            if hi <= lo or not all(0 <= v < d.size for v, d in zip(iq, self.outer)):
                self._zero(tile, ct, at, rows * q)
                continue
            self._zero(tile, ct, at, (lo - r0) * q)
            self._zero(tile, ct, at + (hi - r0) * q, (r0 + rows - hi) * q)
            off = base + sum(v * st for v, st in zip(iq, x.row))
            at += (lo - r0) * q
            if self.stage is None:
                self._load_rows(sub(tile, ct, (hi - lo) * q, at=at), off, ct, hi - lo,
                                c_hi - c_lo)
                continue
            wc, width = c_hi - c_lo, w.size
            rows_in = sub(self.stage.next(), ct, (hi - lo) * width)
            self._load_rows(rows_in, off, ct, hi - lo, width)
            for r in range(hi - lo):
                self.kb.emit(isa.TensorCopy, dst=sub(tile, ct, wc, at=at + r * q + c_lo),
                             src=sub(rows_in, ct, wc, at=r * width + c_lo - w.lo),
                             engine=self.kb.evac_engine())
        return tile

    def _load_rows(self, dst: isa.Tile, off: int, ct: int, rows: int, width: int) -> None:
        """`rows` input rows of `width` pixels from element `off`, channels on partitions."""
        x = self.x
        if x.transposed:        # [pixels, channels] -> [channels, pixels]
            src = self.kb.ap(x.t, off, ((x.row[-1], rows * width), (x.c, ct)))
            self.kb.emit(isa.DmaTranspose, dst=dst, src=src, dma_queue=next(self.queues))
            return
        pattern = compact(((x.row[-2], rows), (x.row[-1], width)))
        self.kb.dma(dst, self.kb.ap(x.t, off, ((x.c, ct), *pattern)))

    def _zero(self, tile: isa.Tile, ct: int, at: int, size: int) -> None:
        if size > 0:
            self.kb.emit(isa.Memset, dst=sub(tile, ct, size, at=at), value=0, engine="gpsimd")

    def _matmuls(self, acc: isa.Tile, xs, ws, cot: int, r0: int, chunk) -> None:
        a, rows, c0, cn = chunk
        h, w, q = self.h, self.w, self.w.q
        length = (rows - 1) * q + cn
        dst = sub(acc, cot, length)
        ng = len(self.pk.groups)
        steps = [(x, wt, i, g, grp) for x, wt in zip(xs, ws) for i in range(len(self.ko))
                 for g, grp in enumerate(self.pk.groups)]
        for j, (x, wt, i, g, grp) in enumerate(steps):
            (kh, kw), ct = grp[0], x.num_partitions // self.pk.reps
            (ah, sh), (aw, sw) = h.tap(kh), w.tap(kw)
            ph = h.phases.index(ah) * len(w.phases) + w.phases.index(aw)
            at = i * self.per_ko + (ph * self.band_rows + a - r0 + sh) * q + c0 + sw
            parts = len(grp) * ct
            self.kb.emit(isa.NcMatmul, dst=dst, stationary=sub(wt, parts, cot,
                                                                 at=(i * ng + g) * cot),
                         moving=sub(x, parts, length, at=at),
                         precision=self.precision, accumulate=j > 0)

    def _evacuate(self, acc: isa.Tile, otile: isa.Tile, r0: int, chunk) -> None:
        """The valid columns of a chunk, PSUM -> the band's output tile [cot, rows, OW]
        in the result dtype (one copy per output row unless the rows are contiguous)."""
        a, rows, c0, cn = chunk
        q, ow, cot = self.w.q, self.w.out, otile.num_partitions
        at = (a - r0) * ow + c0
        if rows == 1 or cn == q:
            self.kb.emit(isa.TensorCopy, dst=sub(otile, cot, rows * cn, at=at),
                         src=sub(acc, cot, rows * cn), engine=self.kb.evac_engine())
            return
        for r in range(rows):
            self.kb.emit(isa.TensorCopy, dst=sub(otile, cot, cn, at=at + r * ow),
                         src=sub(acc, cot, cn, at=r * q), engine=self.kb.evac_engine())

    def _store(self, otile: isa.Tile, b: Block, n: int, od, co0: int, r0: int, rn: int
               ) -> None:
        """One DMA of a band's output rows (DMAs have a fixed cost of ~2 us, §2.6)."""
        ns, os_, sp = self.cv.o
        off = n * ns + (b.o0 + co0) * os_ + r0 * sp[-2][0]
        off += sum(o * st for o, (st, _) in zip(od, sp[:-2]))
        pattern = ((os_, otile.num_partitions),
                   *compact(((sp[-2][0], rn), (sp[-1][0], self.w.out))))
        self.kb.dma(self.kb.ap(self.out, off, pattern), otile)


def _runs(slots: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """(first slot, its offset, offset step, count) of runs of consecutive slots whose
    weight offsets step evenly.

    >>> _runs([(0, 0), (1, 2), (2, 4), (3, 5), (5, 6)])
    [(0, 0, 2, 3), (3, 5, 1, 1), (5, 6, 1, 1)]
    """
    out: list[list[int]] = []
    for g, t in slots:
        if out and out[-1][0] + out[-1][3] == g and (
                out[-1][3] == 1 or out[-1][1] + out[-1][2] * out[-1][3] == t):
            run = out[-1]
            run[2] = t - run[1] if run[3] == 1 else run[2]
            run[3] += 1
        else:
            out.append([g, t, 1, 1])
    return [tuple(r) for r in out]
