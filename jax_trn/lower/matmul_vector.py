"""The loop order of a matmul whose lhs row tiles VectorE transposes (matmul_quarters.py,
`MatmulEmitter.kperm`), mixed into matmul.py's `MatmulEmitter`.

VectorE takes longer per row tile than TensorE's first column group does (trn1, N =
2048: ~7.3 us of 32x32 transposes against 5.9 us of matmuls), so rather than column
groups outer (matmul.py `_mblock`), every row tile after the start computes all its
column groups in turn, the rhs resident (all of its column groups fit the slices
ring), and VectorE works `AHEAD` tiles ahead of TensorE:

    start: tiles 0..b-1 (TensorE transposes, natural rows; the last tile's k-tiles from
           SPLIT_PE on VectorE) join the first column group
           one by one as their rows and the rhs k-tiles arrive (DMAs alternating), each
           catching up on the k-steps it missed, so TensorE works while the first rhs
           slice streams in (the one load nothing hides)
    then:  the other column groups over tiles 0..b-1, k outer, their slices streaming
    rest:  per row tile, every column group from the resident rhs; VectorE tiles'
           rows loaded and transposed AHEAD tiles ahead (a partial last
           tile is transposed on TensorE, in its own accumulators' banks); the last
           tile one PSUM bank (or narrower piece) at a time, each stored when done
           (`_last`)

The start's tiles cost TensorE ~0.7 us of transposes each and the start is DMA-bound
(their rows and the first rhs slice before TensorE has enough work): on trn1 at
2048^3 (199.7 us) the kernel is ~7.1 us idle there, ~2.8 us in the last store, 2.5 us
in transposes, against 187.2 us of matmuls. VectorE evacuates nothing once it has
transposes queued (its queue is in order); ScalarE does.

Why the start stays DMA-bound (trn1 2048^3, §3.4 descriptor costs): the 8 PSUM banks
hold 4 tiles x 1024 columns, so a k-step is 1.46 us of matmuls against 1.18 us for its
rhs k-tile (rows of 2 KiB: 82% of the rate), and the 4 tiles' rows (1.93 us each) must
come first. TensorE waits 3.2 us for the first rows (1.3 us fixed cost + 1.93), and
the start's DMA (27.8 us) exceeds its TensorE work (26.3 us with the transposes): no
order of those loads idles TensorE less than ~7 us (fewer start tiles or narrower rhs
slices only raise DMA per matmul; half-K row loads save ~1 us of idle for 1.7 us more
DMA). Before the last start tile arrives, TensorE transposes fill time it would
otherwise wait for DMAs: VectorE transposes for a whole start tile joining later
measured 201.0 -> 201.1 us and worse; only the last tile's are split (`_split_at`).

Wide start (`_wide_kernel`, N in (1280, 2560], M >= 1024, K >= 2048): the first
column group is WIDE = 1280 columns, so 3 row tiles fill PSUM (2.5 banks each, the
256-column pieces of two tiles sharing a bank: `_packed`) and a k-step of the start is
1.37 us of matmuls against 1.2 us for its rhs k-tile (rows of 2560 B: the full DMA
rate). TensorE keeps up with the rhs once 3 row tiles are in, not 4:

    start:  (`_wide_start`) the rows of tiles 0..1, rhs k-tiles 0..1, the first CUT
            k-tiles of tile 2's rows (2560 B: the full rate), rhs k-tiles up to LATE_AT,
            the rest of tile 2's rows, the other rhs k-tiles, then tile 3's rows
            (PRE_AT). TensorE transposes tiles 0..1 while it waits for rhs k-tile 0,
            and WIDE_SPLIT k-tiles of tile 2 (into the PSUM columns no accumulator
            uses, `_spare`); VectorE the rest of tile 2. Before the start's last
            matmuls TensorE transposes tile 3's first PRE_SPLIT k-tiles there too
            (VectorE copies them, then transposes the rest), so it goes on with tile 3
            without waiting for VectorE (`_fetch_split`)
    then:   the first group of tiles 3..4 (tile 4's rows load after the start), while
            the second group's rhs slice streams in behind them
    second: the second group (768 columns) over tiles 0..4, k outer (5 x 1.5 banks)
    rest:   the other tiles, every column group (`_rest`)

The second group's pass waits for no rhs k-tile: its slice (18.9 us of DMA) streams in
behind the first while TensorE finishes the start and runs the first group of tiles
3..4 (14.6 us). With a 1280-column second group no tile follows the start in the first
group, the pass after it is DMA-bound, and tile 2's rows load whole.
trn1 2048^3 bf16: 199.7 -> 198.0 us with the wide start (tiles joining one per rhs
k-tile as in `_start`), 198.0 -> 197.3 us (94.3% -> 94.6% MFU) with the load order
above and tile 3's split; 4096 x 2048^2 385.3 -> 384.5 us; N = 2304 221.5 -> 220.8 us.

Where the time goes (trn1 2048^3, 197.3 us): 187.25 us of matmuls; TensorE busy without
a break from 9.1 us on, having done 1.83 us of matmuls before (7.27 us lost at the
start), 0.09 us on tile 3's two transposes, 2.66 us after the last matmul.

The best span this model allows (trn1 2048^3 bf16; §1.2, §2.6, §3.2, §3.4, §6.3):

- matmuls: 16 row tiles x 16 k-tiles x 2048 columns at one column per cycle, 2.8 GHz:
  187.25 us (MFU counts the 92 TFLOPS peak: 186.74 us; 95% is 196.57 us);
- tail: the last store waits for its accumulator's evacuation (a static overhead of
  100 cycles plus the copy: >= ~0.15 us, split over VectorE and ScalarE), then costs
  the 1.3 us DMA fixed cost and 128 descriptors, each >= 2500 B of the 272 B/ns line:
  1.18 us at any width up to 1250 columns. Fewer rows need 64-row stationaries, which
  cost TensorE as much as 128-row ones (§6.3), and the store before it holds the line
  for another 1.18 us: the tail is >= ~2.6 us;
- start: nothing is computed before rows and rhs k-tiles both arrive, and the DMA line
  is one FIFO (§3.4; every 128-row load costs >= 1.18 us). The loss X is the largest
  (arrival time - matmul work enabled by the loads before it) over the loads; a k-step
  of the 3 start tiles gains only 0.17 us on its rhs k-tile (1.37 vs 1.2 us), so the
  worst point is early: in the order above the rhs k-tile 2 arrives at 1.3 + 2 x 1.93
  (rows) + 1.2 (tile 2's first part) + 3 x 1.2 = 9.97 us with 6 x 0.457 = 2.74 us of
  matmuls enabled: X >= 7.23 us. Enumerating the orders of the 3 tiles' rows (whole or
  in two column ranges of 8..12 k-tiles, any interleaving with the rhs k-tiles) finds
  no X below 7.07 us, 7.20 us with tile 3's rows and the second group's rhs after
  them; 4 tiles x 1024 columns: 7.77 us. (The continuous relaxation, loads of any
  size, gives 6.4 us, but no single order meets its bound at every arrival.)

So >= 187.25 + 7.2 + 2.6 ~= 197.05 us (94.8% MFU) with these loads (196.9 us with the
looser 7.07): 95% would need a start below ~6.7 us or a tail below ~2.1 us, neither of
which the DMA line's fixed cost and descriptor rate allow here.
"""
from __future__ import annotations

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa

from .builder import Ring, sub
from .layout import tiles
from .matmul_loads import KMajor, _Load
from .matmul_plan import SBUF_SHARE

AHEAD = 2                   # row tiles whose lhs loads (and VectorE transposes) are in
                            # flight ahead of the tile TensorE computes
PACE_SHARE = 0.9            # of TensorE's time per row tile VectorE's transposes and
                            # the DMAs may take (the rest: slack for their latencies)
SPLIT_PE = 4                # k-tiles of the start's last tile TensorE transposes (one
                            # PSUM bank of them); VectorE, idle then, the rest
EARLY = 4                   # rhs k-tiles of the second column group loaded before the
                            # first VectorE tile's rows
WIDE = 1280                 # columns of the wide start's first group (`_wide_kernel`):
                            # rhs rows of 2560 B (the full DMA rate, §3.4), and 3 row
                            # tiles x 2.5 PSUM banks fill the 8 banks (§3.2)
WIDE_K, WIDE_M = 2048, 8    # the wide start from this K and M / 128 on: below them it
                            # measured slower (768 x 2048 x 2048: 82.7 -> 84.3 us;
                            # 2048 x 1024 x 2048: 106.6 -> 108.2 us)
EXTRA = 2                   # row tiles after the wide start whose first group runs
                            # before the second group's pass over all of them
LAST_AFTER = 2              # rhs k-tiles of the wide start before its last tile's rows
                            # (trn1 2048^3: 1 197.44, 2 197.30, 3 197.57 us)
CUT = 10                    # k-tiles of the wide start's last tile in its first load
                            # (2560 B rows: the full DMA rate, §3.4; 8 197.71, 12 197.54)
WIDE_SPLIT = 2              # k-tiles of the wide start's last tile TensorE transposes
                            # (4: 197.39 us)
PRE_SPLIT = 2               # k-tiles of the tile of PRE_AT TensorE transposes before the
                            # start's last matmuls (0: 197.75 us; 4 do not fit `_spare`)
LATE_AT = 9                 # rhs k-tile before which the rest of its rows load (8
                            # 197.45, 9..10 197.30, 11 197.41 us)
PRE_AT = (15,)              # rhs k-tiles of the wide start after which the rows of the
                            # first EXTRA tiles load (the others' right after the start):
                            # the start's rhs k-tiles come first (trn1 2048^3: after
                            # k-tile 13 198.38, 14 198.21, 15 197.30 us)


class VectorSchedule:
    """`MatmulEmitter._vector_kernel` and its phases (see the module docstring)."""

    def _wide_applies(self) -> bool:
        """The wide start (`_wide_kernel`) applies: two column groups, the first WIDE
        columns, the second in pieces of at least half a bank, K in one block, M and K
        large enough (WIDE_K, WIDE_M), no fused epilogue."""
        return (self.plan.kb == self.k and WIDE < self.n <= 2 * WIDE
                and (self.n - WIDE) % (self.bank // 2) == 0
                and self.k >= WIDE_K and -(-self.m // self.mt) >= WIDE_M
                and self.epilogue is None)

    def _vector_order(self) -> bool:
        """The rhs stays resident (its column groups fit the two slices), the buffers
        of `_depths` fit SBUF, and VectorE and the DMA queues keep up with TensorE
        row tile after row tile (`_paces`)."""
        plan, kb = self.plan, self.kb
        if not (plan.kb == self.k
                and len(tiles(self.n, plan.group)) <= 2 and self.epilogue is None):
            return False
        tensor, vector, dma = self._paces()
        if max(vector, dma) > PACE_SHARE * tensor:
            return False
        d, nk = self._depths(), -(-self.k // self.kt)
        size = {op: hw_dtypes.itemsize(op.dtype) for op in (self.lhs, self.rhs)}
        need = ((d["stage"] * self.k + d["strips"] * nk * self.mt) * size[self.lhs]
                + 2 * nk * plan.group * size[self.rhs]
                + d["obuf"] * plan.group * hw_dtypes.itemsize(self.out.dtype))
        top = max((off + n for off, n in kb.sbuf.live.items()), default=0)
        return need <= (kb.sbuf.capacity - top) * SBUF_SHARE

    def _paces(self) -> tuple[float, float, float]:
        """ns per row tile after the start, from the hardware's cost model: TensorE's
        matmuls, VectorE's transposes (matmul_quarters.vector_transposes), and the
        DMA of its rows and its results (per-descriptor efficiency, §3.4)."""
        target, lhs = self.kb.target, self.lhs
        spec, lanes = target.core, target.vector_transpose_max
        words = isa.Tile("sbuf", 0, lanes, 0, (lanes,), "uint32")
        vector = isa.NcTranspose(name="pace", engine="vector", data=words, dst=words)
        count = self.k // (lanes * self.kperm) * (self.mt // lanes)
        stat = isa.Tile("sbuf", 0, self.kt, 0, (self.mt,), lhs.dtype)
        out, eff = hw_dtypes.itemsize(self.out.dtype), spec.dma_efficiency
        tensor = dma = 0.0
        for _, gn in tiles(self.n, self.plan.group):
            dma += self.mt * gn * out / eff(gn * out)
            for _, ct in tiles(gn, self.cols):
                mm = isa.NcMatmul(name="pace", stationary=stat,
                                  moving=stat.with_(free=(ct,)), precision=self.precision,
                                  dst=isa.Tile("psum", 0, self.mt, 0, (ct,), "float32"))
                tensor += -(-self.k // self.kt) * mm.cycles(spec)
        item = hw_dtypes.itemsize(lhs.t.dtype)
        dma += self.mt * self.k * item / eff(self.k * item)
        return (tensor / spec.clock("tensor"), count * vector.cycles(spec) / spec.clock("vector"),
                dma / (spec.dma_engines * spec.dma_engine_bytes_per_ns))

    def _depths(self) -> dict[str, int]:
        """Ring depths: staging for the start's tiles at once (their loads all start
        at t = 0, §3.4: DMAs share the rate first come, first served) or AHEAD + 1;
        strips for the start and the tiles ahead; results of the start, whose stores
        wait behind the streaming rhs."""
        b = second = self._start_size()
        if self.plan.group == WIDE:
            second = self._wide_sizes(tiles(self.n, WIDE))[1]
        return {"stage": max(b, AHEAD + 1), "obuf": second + 1,
                "strips": min(-(-self.m // self.mt), second + AHEAD + 1)}

    def _vector_kernel(self, index, base: int) -> None:
        if self.plan.group == WIDE:
            return self._wide_kernel(index, base)
        mtiles, groups = tiles(self.m, self.mt), tiles(self.n, self.plan.group)
        bunch = mtiles[:self._start_size()]
        strips = self._start(index, base, bunch, groups[0])
        rest, loads, rs = mtiles[len(bunch):], [], [self.start_rhs]
        for g0, gn in groups[1:]:
            r = KMajor(self.slices.next(), gn)
            rbase = self.rhs.batch_offset(index) + g0 * self.rhs.f[0]
            rdmas = self._plain_dmas(self.rhs, _Load(r), rbase, (0, self.k), gn)
            for emit in rdmas[:EARLY]:
                emit()
            if not loads and rest:      # the first VectorE tile's rows, needed next
                loads.append(self._fetch_rest(index, rest[0]))
            for emit in rdmas[EARLY:]:
                emit()
            rs.append(r)
            self._bunched(strips, r, bunch, base, g0, gn)
        self._rest(index, base, rest, groups, rs, loads)

    def _start(self, index, base: int, bunch, group) -> list:
        """The first column group over `bunch`, its tiles joining one per k-step."""
        g0, gn = group
        r = self.start_rhs = KMajor(self.slices.next(), gn)
        rbase = self.rhs.batch_offset(index) + g0 * self.rhs.f[0]
        rdmas = self._plain_dmas(self.rhs, _Load(r), rbase, (0, self.k), gn)
        steps = self._ksteps(self.k)
        accs = [self._accs(mt, gn) for _, mt in bunch]
        strips = []

        def step(t: int, i: int) -> None:
            j, kt, paired = steps[i]
            for c0, ct, acc in accs[t]:
                self._mm(acc, strips[t], r, j, kt, paired, bunch[t][1], c0, ct, i > 0)

        def join(t: int, load, upto: int) -> None:
            """Tile t's transposes (in the banks of the accumulators not used yet: its
            own and those of the tiles joining after it), then the k-steps it missed."""
            self.tps = self._free_banks(accs, t)
            split = t == len(bunch) - 1 and t > 0 and bunch[t][1] == self.mt
            strips.append(self._finish_split(load, self._split_at()) if split
                          else self._finish(load))
            self.tps = None
            for i in range(upto):
                step(t, i)

        for i in range(max(len(steps), len(bunch))):
            load = None
            if i < len(bunch):      # tile i joins: its rows before rhs k-tile i
                load = self._fetch(self.lhs, index, (0, self.k), *bunch[i], self.strips)
            if i < len(steps):
                rdmas[i]()
            if load is not None:
                join(i, load, min(i, len(steps)))
            for t in range(min(i + 1, len(bunch)) if i < len(steps) else 0):
                step(t, i)
        for t, (m0, mt) in enumerate(bunch):
            self._drain(accs[t], base, m0, mt, g0, gn)
        return strips

    def _fetch_split(self, index, mtile):
        """A row tile's rows loaded (DMA only), staged for TensorE's transposes of its
        first PRE_SPLIT k-tiles (`pe_upto`) and VectorE's of the rest, which
        `_wide_start` emits before the start's last matmuls (or `_finish`, if the
        spare PSUM columns do not hold them); without PRE_SPLIT, a VectorE tile."""
        if not PRE_SPLIT:
            return self._fetch_rest(index, mtile)
        load, (dma,) = self._fetch_parts(self.lhs, index, *mtile, [])
        dma()
        load.pe_upto = PRE_SPLIT
        return load

    def _fetch_rest(self, index, mtile):
        """A row tile's load; a VectorE tile's transposes too (they run as its data
        arrives, VectorE's queue holding nothing else)."""
        load = self._fetch(self.lhs, index, (0, self.k), *mtile, self.strips)
        return self._finish(load) if load.vector_stage is not None else load

    def _rest(self, index, base: int, mtiles, groups, rs, loads, first=None,
              last: bool = True) -> None:
        """Per row tile, every column group from the resident rhs slices `rs` (the
        first `len(first)` tiles only the groups `first[i]`); `loads` (strips, or
        TensorE tiles' loads) fetched ahead."""
        first, held = first or [], None
        for i, (m0, mt) in enumerate(mtiles):
            while len(loads) <= min(i + AHEAD, len(mtiles) - 1):
                loads.append(self._fetch_rest(index, mtiles[len(loads)]))
            gis = first[i] if i < len(first) else range(len(groups))
            wide = self.plan.group == WIDE
            if last and i == len(mtiles) - 1 and wide:
                pieces = [(gi, c0, ct, acc) for gi in gis
                          for c0, ct, acc in self._accs(mt, groups[gi][1])]
                if isinstance(loads[i], _Load):     # TensorE: in its accumulators' banks
                    self.tps = self._bank_ring([p[1:] for p in pieces])
                    loads[i], self.tps = self._finish(loads[i]), None
                self._last(pieces, loads[i], rs, groups, base, m0, mt, held)
                continue
            for gi in gis:
                g0, gn = groups[gi]
                accs = self._accs(mt, gn)
                if isinstance(loads[i], _Load):     # TensorE: in its accumulators' banks
                    self.tps = self._bank_ring(accs)
                    loads[i], self.tps = self._finish(loads[i]), None
                if last and i == len(mtiles) - 1 and gi == gis[-1]:
                    self._last([(gi, c0, ct, acc) for c0, ct, acc in accs], loads[i], rs,
                               groups, base, m0, mt, sort=False)
                    continue
                if (wide and last and i == len(mtiles) - 2 and gi == gis[-1]
                        and len(accs) > 1):
                    # its last piece waits: it goes before the kernel's last (`_last`)
                    held = (loads[i], rs[gi], m0, mt, g0, accs[-1])
                    accs = accs[:-1]
                self._matmuls(accs, loads[i], rs[gi], self.k, mt, True, None)
                self._drain(accs, base, m0, mt, g0, gn)

    def _last(self, pieces, s, rs, groups, base: int, m0: int, mt: int,
              held=None, sort: bool = True) -> None:
        """The kernel's last accumulators one at a time (`pieces`: group, column, width,
        PSUM tile; of the last column group, or with the wide start of the whole last
        row tile), each stored when done: the store of the last (§3.4: ~2.5 us, fixed
        cost and descriptors) follows the matmuls of one PSUM bank, not of the column
        group. VectorE is done with its transposes: the evacuations alternate again,
        and the very last is split in halves, one per engine (~0.37 -> ~0.23 us before
        the store on trn1).

        With `sort`, the narrow pieces first: the stores of one row tile go one after
        another (their DRAM spans overlap), and a bank-wide piece's matmuls (2.9 us at
        K = 2048 on trn1) outlast the store before it, a 256-column one's (1.46 us) do
        not. `held` (the row tile before's last piece) goes before the narrowest, which
        comes last: its store need not wait for another of the same rows, and its
        evacuation is half as long (trn1 2048^3: 198.16 -> 198.05 us)."""
        self.vector_busy = False
        if sort:
            pieces = sorted(pieces, key=lambda p: p[2])
        if held is not None:    # the narrowest last, after the row tile before's piece
            pieces = pieces[1:] + [pieces[0]]
        for i, (gi, c0, ct, acc) in enumerate(pieces):
            if held is not None and i == len(pieces) - 1:
                hs, hr, hm0, hmt, hg0, (hc0, hct, hacc) = held
                self._matmuls([(0, hct, hacc)], hs, hr.shifted(hc0), self.k, hmt, True, None)
                self._drain([(0, hct, hacc)], base, hm0, hmt, hg0 + hc0, hct)
            self._matmuls([(0, ct, acc)], s, rs[gi].shifted(c0), self.k, mt, True, None)
            if i == len(pieces) - 1 and 1 < ct <= self.bank:
                self._split_drain(acc, base, m0, mt, groups[gi][0] + c0, ct)
            else:
                self._drain([(0, ct, acc)], base, m0, mt, groups[gi][0] + c0, ct)

    def _split_drain(self, acc, base: int, m0: int, mt: int, g0: int, ct: int) -> None:
        """The kernel's last accumulator evacuated by VectorE and ScalarE at once, split
        so both finish together (each starts a static overhead after the matmul, §2.6,
        and copies at its clock, §6.3), then stored."""
        spec = self.kb.target.core
        otile = sub(self.obuf.next(), mt, ct)

        def copy(engine: str, c0: int, n: int):
            return dict(dst=sub(otile, mt, n, at=c0), src=sub(acc, mt, n, at=c0),
                        engine=engine)

        def done(engine: str, n: int) -> float:
            cycles = isa.TensorCopy(name="pace", **copy(engine, 0, n)).cycles(spec)
            return (spec.static_overhead + cycles) / spec.clock(engine)

        def end(h: int) -> float:
            return max(done("vector", h), done("scalar", ct - h))
        h = min(range(1, ct), key=lambda h: (end(h), h))
        for engine, c0, n in (("vector", 0, h), ("scalar", h, ct - h)):
            self.kb.emit(isa.TensorCopy, **copy(engine, c0, n))
        self._store(otile, base, m0, mt, g0, ct)

    def _wide_kernel(self, index, base: int) -> None:
        """The first column group WIDE columns wide: 3 row tiles fill PSUM; then the
        first group of the next tiles (VectorE-transposed: rows of the first loaded at
        the start's end, `PRE_AT`, `_fetch_split`; of the others after it) while the
        second group's rhs slice streams in; then the second group over all those
        tiles, k outer; then the other tiles as in `_rest`."""
        mtiles, groups = tiles(self.m, self.mt), tiles(self.n, self.plan.group)
        start, second = self._wide_sizes(groups)
        bunch, extra, rest = mtiles[:start], mtiles[start:second], mtiles[second:]
        accs = self._packed([mt for _, mt in bunch], groups[0][1])
        strips = self._wide_start(index, base, bunch, groups[0], accs, extra[:len(PRE_AT)])
        strips += [self._fetch_rest(index, t) for t in extra[len(PRE_AT):]]
        g0, gn = groups[1]
        r = KMajor(self.slices.next(), gn)
        rbase = self.rhs.batch_offset(index) + g0 * self.rhs.f[0]
        for emit in self._plain_dmas(self.rhs, _Load(r), rbase, (0, self.k), gn):
            emit()
        loads = [self._fetch_rest(index, rest[0])] if rest else []
        rs = [self.start_rhs, r]
        later = strips[start:]          # `_rest` finishes TensorE parts in place
        self._rest(index, base, extra, groups, rs, later, [[0]] * len(extra),
                   last=not rest)
        strips[start:] = later
        both = mtiles[:second]
        self._bunched(strips, r, both, base, g0, gn,
                      self._packed([mt for _, mt in both], gn))
        self._rest(index, base, rest, groups, rs, loads)

    def _wide_start(self, index, base: int, bunch, group, accs, pre=()) -> list:
        """The wide start's first column group over `bunch` (see the module
        docstring), its loads in the order: the rows of all tiles but the last, rhs
        k-tiles 0..LAST_AFTER-1, the last tile's first CUT k-tiles, rhs k-tiles up to
        LATE_AT, the rest of its rows, the other rhs k-tiles; the rows of `pre` after
        rhs k-tiles PRE_AT (`_fetch_split`). TensorE transposes the first tiles (while
        it waits for rhs k-tile 0) and the last one's first WIDE_SPLIT k-tiles,
        VectorE the rest of the last. A tile's k-step is emitted once its rhs k-tile
        is loaded and its stationary's rows are."""
        g0, gn = group
        r = self.start_rhs = KMajor(self.slices.next(), gn)
        rbase = self.rhs.batch_offset(index) + g0 * self.rhs.f[0]
        rdmas = self._plain_dmas(self.rhs, _Load(r), rbase, (0, self.k), gn)
        steps, last = self._ksteps(self.k), len(bunch) - 1
        nk = len(steps)
        # the last tile's rows in two parts only if tiles `pre` follow: with none, the
        # second group's pass after the start is DMA-bound and pays for the extra
        # descriptors (§3.4; 1024 x 2048 x 2560: 128.35 -> 128.78 us split)
        cut = min(CUT if pre else nk, nk) // self.kperm * self.kperm
        strips, early = [None] * len(bunch), []
        ready, done = [0] * len(bunch), [0] * len(bunch)   # k-steps loaded, emitted
        arrived = 0
        at = dict(zip(PRE_AT, pre))

        def work() -> None:
            for t in range(len(bunch)):
                while done[t] < min(ready[t], arrived):
                    i = done[t]
                    if t == last and i == nk - 1:
                        split_early()
                    j, kt, paired = steps[i]
                    for c0, ct, acc in accs[t]:
                        self._mm(acc, strips[t], r, j, kt, paired, bunch[t][1], c0, ct,
                                 i > 0)
                    done[t] += 1

        def split_early() -> None:
            """The transposes of the rows of `pre` loaded so far: TensorE's (in the
            spare PSUM columns, copied by VectorE) before the start's last matmuls
            (TensorE need not wait for them after), then VectorE's."""
            for e, load in enumerate(early):
                if isinstance(load, _Load) and load.pe_upto is not None:
                    self.tps = self._spare(accs, load.pe_upto)
                    if self.tps is None:
                        self._finish_vector(load, load.pe_upto)
                    else:
                        early[e] = self._pe_part(load, load.pe_upto, engine="vector")
                        self._finish_vector(load, load.pe_upto)
                        load.staged.clear()
                    self.tps, self.vector_busy = None, True

        def rhs(i: int) -> None:
            nonlocal arrived
            rdmas[i]()
            if i in at:
                early.append(self._fetch_split(index, at[i]))
            arrived = i + 1
            work()

        for t in range(last):           # whole rows, transposed while rhs k-tile 0 loads
            load = self._fetch(self.lhs, index, (0, self.k), *bunch[t], self.strips)
            self.tps = self._free_banks(accs, t)
            strips[t], self.tps = self._finish(load), None
            ready[t] = nk
        for i in range(min(LAST_AFTER, nk)):
            rhs(i)
        load, parts = self._fetch_parts(self.lhs, index, *bunch[last],
                                         [cut] if cut < nk else [])
        parts[0]()
        split = max(self.kperm, min(WIDE_SPLIT, cut) // self.kperm * self.kperm)
        self.tps = self._spare(accs, split) or self._free_banks(accs, last)
        strips[last] = self._finish_split(load, split, cut)
        self.tps = None
        ready[last] = cut
        late = min(max(LATE_AT, LAST_AFTER), nk)
        work()
        for i in range(min(LAST_AFTER, nk), nk + 1):
            if i == late:
                for emit in parts[1:]:
                    emit()
                self._finish_vector(load, cut)
                ready[last] = nk
            if i < nk:
                rhs(i)
        work()
        for mtile in pre[len(early):]:
            early.append(self._fetch_split(index, mtile))
        split_early()
        for t, (m0, mt) in enumerate(bunch):
            self._drain(accs[t], base, m0, mt, g0, gn)
        return strips + early

    def _wide_sizes(self, groups) -> tuple[int, int]:
        """Row tiles of the wide start (as many as PSUM holds of the first group) and
        of the second group's pass (as many as PSUM holds, at most EXTRA more, and one
        tile left for `_rest`: the kernel's last goes through `_last`)."""
        count, banks = -(-self.m // self.mt), self.kb.target.psum_banks
        start = max(n for n in range(1, count + 1)
                    if self._banks_for(n, groups[0][1]) <= banks)
        second = max(n for n in range(start, max(start, min(count - 1, start + EXTRA)) + 1)
                     if self._banks_for(n, groups[1][1]) <= banks)
        return start, second

    def _banks_for(self, count: int, gn: int) -> int:
        """PSUM banks `_packed` takes for `count` row tiles of `gn` columns."""
        whole, part = divmod(gn, self.bank)
        return count * whole + (-(-count // (self.bank // part)) if part else 0)

    def _packed(self, mts, gn):
        """Accumulators of row tiles of heights `mts` by `gn` columns in the PSUM banks
        (in the ring's order from its next one: the banks used last come last):
        whole-bank pieces one bank each, the narrower last pieces of several tiles
        sharing a bank (a matmul writes within one bank, §3.2); None if they do not
        fit."""
        if self._banks_for(len(mts), gn) > len(self.acc.tiles):
            return None
        banks = iter([self.acc.next() for _ in self.acc.tiles])
        out, shared, used = [], None, 0
        for mt in mts:
            accs = []
            for c0, ct in tiles(gn, self.cols):
                if ct == self.bank:
                    accs.append((c0, ct, sub(next(banks), mt, ct)))
                    continue
                if shared is None or used + ct > self.bank:
                    shared, used = next(banks), 0
                accs.append((c0, ct, sub(shared, mt, ct, at=used)))
                used += ct
            out.append(accs)
        return out

    def _free_banks(self, accs, t: int) -> Ring:
        """Whole PSUM banks of the accumulators of tiles t.. that no tile before t
        uses (`_packed` tiles share banks), for tile t's TensorE transposes."""
        size = self.bank * 4                            # bytes of a bank of FP32
        live = {a.offset // size for later in accs[:t] for _, _, a in later}
        banks = {}
        for later in accs[t:]:
            for _, _, a in later:
                if a.offset // size not in live:
                    banks.setdefault(a.offset // size, a)
        return Ring([a.with_(num_partitions=self.kt, free=(self.bank,), offset=b * size)
                     for b, a in banks.items()])

    def _spare(self, accs, ktiles: int) -> Ring | None:
        """The columns of the last PSUM bank `accs` use that no accumulator takes (the
        last tile's narrow piece alone in its bank, `_packed`), if they hold `ktiles`
        transposed k-tiles: TensorE transposes there need not wait for the copies out
        of a bank its next matmuls write."""
        size = self.bank * 4                            # bytes of a bank of FP32
        _, ct, acc = accs[-1][-1]
        bank = acc.offset // size
        used = sum(a.free_size for tile in accs for _, _, a in tile
                   if a.offset // size == bank)
        if self.bank - used < ktiles * self.mt:
            return None
        return Ring([acc.with_(num_partitions=self.kt, free=(self.bank - used,),
                               offset=bank * size + used * 4)])

    def _bank_ring(self, accs) -> Ring:
        """The PSUM banks of accumulators `accs`, whole, for TensorE transposes."""
        return Ring([acc.with_(num_partitions=self.kt, free=(self.bank,))
                     for _, _, acc in accs])

    def _vector_tiles(self) -> frozenset[int]:
        """First rows of the row tiles VectorE transposes: the full tiles after the
        start's bunch."""
        return frozenset(m0 for m0, mt in tiles(self.m, self.mt)[self._start_size():]
                         if mt == self.mt)

    def _split_at(self) -> int:
        """The first k-tile of the start's last tile VectorE transposes (a multiple of
        w). TensorE is the bottleneck from that tile's arrival on, so its transposes
        cost kernel time there (on trn1 2048^3: 16 of them 0.74 us, plus ~0.4 us
        waiting for its two banks' evacuation between two rounds), while VectorE is
        idle until the first VectorE row tile; TensorE keeps the first SPLIT_PE,
        each evacuated alone, so the tile's catch-up starts at once. 201.0 -> 199.9
        us (1, 2 or 3 start tiles split: 199.9, 200.8, 201.8)."""
        w, nk = self.kperm, self.k // self.kt
        return max(w, min(nk, SPLIT_PE) // w * w)

    def _start_size(self) -> int:
        """Row tiles of the start: as many as the accumulator banks hold at once."""
        if self.plan.group == WIDE:
            return self._wide_sizes(tiles(self.n, WIDE))[0]
        per_acc = -(-self.cols // self.bank)            # banks one accumulator spans
        accs = self.kb.target.psum_banks // per_acc
        per = -(-min(self.n, self.plan.group) // self.cols)     # accumulators per tile
        return max(1, min(-(-self.m // self.mt), accs // per))
