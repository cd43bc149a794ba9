"""Weight-gradient-shaped convolutions: contract over the kernel window on partitions.

The weight gradient of a conv is itself a conv (JAX's transpose rule): the forward
input x with batch and feature swapped (batch = forward input channels b, feature =
forward batch i) against the forward output gradient as the kernel (kernel window =
the forward output's spatial extent, large; output spatial = the forward kernel, e.g.
3x3). The tap loop (kernel.py) then runs thousands of taps, each a matmul over the
forward batch (a few partitions) into 9 output columns. Here the window is the
contraction instead, 128 window positions per matmul, for each output position p:

    out[o, b] at p (+)= sum over window tiles k:  WT_i[t, o].T @ XT_i[p + t, b]

with t in "wide" coordinates of the padded input (rows of width Qw; the kernel rows
padded with zeros to Qw, so every p is a constant shift of the flat index). Per
contraction feature i both operands sit in SBUF channel-major (padded by row copies
past zero columns and rows set once per buffer: the geometry is the same for every
i) and each [rows, 128] slice is transposed on TensorE (§2.2, ~64 cycles) into the
[128, rows] matmul operands. All output positions accumulate in PSUM across i
(regions of one or two banks); the result goes to an HBM temporary [p, o, b] (rows of
b per partition) and a relayout puts it into the kernel's layout.

A forward stride shows up as the rhs dilation rd: output position p then reads the
input at p + rd * t, i.e. phase p % rd at phase row p // rd + t, so the input is
split into phases while it is placed (row copies; across columns a 0/1 selection
matmul per row, as conv.Phased does) and the window runs over phase rows.

A window too tall for SBUF (ResNet's 7x7 stride-2 stem at 224x224: 112 window rows)
is contracted in blocks of window rows, each loading only the input rows it reads
(`_window_rows`); the bands are then zeroed per load, as the pad rows move.

Applies to ungrouped 2-D (1-D) convs with window stride 1 and no lhs dilation whose
window has at least 16x as many positions as the output (`plan`); everything else
uses the tap loop.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from ..builder import KernelBuilder, sub
from ..layout import View, tiles
from ..registry import LowerCtx
from ..relayout import relayout
from .geometry import Conv, compact

SBUF_SHARE = 0.75           # of SBUF this kernel plans for
MIN_WINDOW_RATIO = 16       # window positions per output position to take this path
TRANSPOSE_BANKS = 4         # PSUM banks (of the target's 8) for TensorE transposes in flight
BUFS = 2                    # operand bands in flight
STAGES = 4                  # transposed tiles in flight (SBUF)


@dataclass(frozen=True)
class Image:
    """An operand as [part, feat, rows, cols] strides: `part` goes on partitions, `feat`
    is the contraction feature; rows of `cols` pixels load by DMA rows or, when the
    partition axis is the contiguous one, by dma_transpose (§3.4)."""
    t: DramTensor
    part: int
    feat: int
    row: int
    col: int
    rows: int
    cols: int
    transposed: bool


def _image(ctx: LowerCtx, t: DramTensor, part: int, feat: int, sp, dtype: str
           ) -> Image | None:
    (rs, rows), (cs, cols) = sp
    if cs == 1:
        return Image(t, part, feat, rs, cs, rows, cols, False)
    if (part == 1 and rs == cs * cols and t.dtype == dtype
            and ctx.target.dma_transpose
            and hw_dtypes.itemsize(dtype) in (2, 4)):
        return Image(t, part, feat, rs, cs, rows, cols, True)
    return None


def plan(ctx: LowerCtx, cv: Conv, x: DramTensor, w: DramTensor, ldt: str, rdt: str
         ) -> tuple[Image, Image] | None:
    """The (input, kernel) operands if this path applies, else None."""
    if len(cv.dims) != 2 or len(cv.blocks) != 1 or cv.blocks[0].groups != 1 or ldt != rdt:
        return None
    h, wd = cv.dims
    if not all(d.stride == 1 and d.ld == 1 for d in cv.dims):
        return None
    if wd.rd > 1 and len(_phases(wd)) * _q(wd) > cv.bank:
        return None
    positions, window = h.out * wd.out, h.kernel * wd.kernel
    nb = min(cv.n_out, cv.pmax)
    if window < MIN_WINDOW_RATIO * positions or \
            -(-positions // (cv.bank // nb)) > cv.target.psum_banks - TRANSPOSE_BANKS:
        return None
    if _window_rows(cv, ldt, ctx.target.sbuf_bytes * SBUF_SHARE) == 0:
        return None
    xi = _image(ctx, x, cv.x[0], cv.x[1], cv.x[2], ldt)
    wi = _image(ctx, w, cv.w[0], cv.w[1], cv.w[2], rdt)
    return (xi, wi) if xi is not None and wi is not None else None


def _window_rows(cv: Conv, dtype: str, budget: float) -> int:
    """Window rows per block (all of them if they fit; 0 if not even one does)."""
    tb = cv.dims[0].kernel
    while tb > 0 and _sbuf_bytes(cv, dtype, tb) > budget:
        tb = tb // 2 if tb > 8 else tb - 1
    return tb


def _in_rows(h, tb: int) -> int:
    """Phase rows of the input a block of tb window rows reads."""
    return min(_q(h), tb + (h.out - 1) // h.rd)


def _sbuf_bytes(cv: Conv, dtype: str, tb: int) -> int:
    """Per partition, for blocks of tb window rows: operand bands and their unpadded
    rows (BUFS each), transposed tiles, selection matrices and the result."""
    h, w = cv.dims
    q, xr = _q(w), _in_rows(h, tb)
    bands = len(_phases(h)) * len(_phases(w)) * xr * q + tb * q
    rows = min(h.size, h.rd * xr + 1) * w.size + tb * w.kernel
    other = (STAGES + 2) * (cv.bank + cv.pmax) + len(_phases(w)) * q * -(-w.size // cv.pmax)
    return (BUFS * (bands + rows) + other) * hw_dtypes.itemsize(dtype) + \
        h.out * w.out * cv.pmax * 4


def _phases(d) -> tuple[int, ...]:
    """Phases of the input an output position p reads from: p % rd (rhs dilation, the
    forward stride); p then reads phase rows p // rd + t for window position t."""
    return tuple(sorted({p % d.rd for p in range(d.out)}))


def _q(d) -> int:
    """Phase rows read: (O - 1) // rd + K (the padded size when rd = 1)."""
    return (d.out - 1) // d.rd + d.kernel


def lower(ctx: LowerCtx, cv: Conv, xi: Image, wi: Image, out: DramTensor, precision: str,
          dtype: str) -> None:
    h, w = cv.dims
    positions, o = h.out * w.out, cv.o_features
    temp = ctx.temp((positions, o, cv.n_out), out.dtype)
    tb = _window_rows(cv, dtype, ctx.target.sbuf_bytes * SBUF_SHARE)
    _Emitter(ctx.kb, cv, xi, wi, temp, precision, dtype, tb).run()
    ctx.next_kernel("relayout")
    # Logical axes (b, o, ph, pw) in the output's own order: its innermost is then the
    # contiguous one, and relayout swaps it with the temporary's on TensorE.
    ns, os_, sp = cv.o
    logical = [(ns, 1, cv.n_out), (os_, cv.n_out, o),
               (sp[0][0], o * cv.n_out * w.out, h.out), (sp[1][0], o * cv.n_out, w.out)]
    logical.sort(key=lambda a: -a[0])
    relayout(ctx.kb, View(out, tuple((a[0], a[2]) for a in logical)),
             View(temp, tuple((a[1], a[2]) for a in logical)))


class _Emitter:
    def __init__(self, kb: KernelBuilder, cv: Conv, xi: Image, wi: Image, temp: DramTensor,
                 precision: str, dtype: str, tb: int):
        self.kb, self.cv, self.xi, self.wi, self.temp = kb, cv, xi, wi, temp
        self.tb, self.xr = tb, _in_rows(cv.dims[0], tb)     # window rows, input rows
        self.precision, self.dtype = precision, dtype
        self.h, self.w = cv.dims
        h, w = self.h, self.w
        self.q, self.qh = _q(w), _q(h)                       # phase row width, rows
        self.phw, self.phh = _phases(w), _phases(h)
        self.offs = [((self.phh.index(ph % h.rd) * len(self.phw) + self.phw.index(pw % w.rd))
                      * self.xr + ph // h.rd) * self.q + pw // w.rd
                     for ph in range(h.out) for pw in range(w.out)]
        self.queues = itertools.cycle(range(kb.target.dma_queues))

    def run(self) -> None:
        kb, h, w = self.kb, self.h, self.w
        xsize = len(self.phh) * len(self.phw) * self.xr * self.q
        wsize = self.tb * self.q
        self.blocks = tiles(h.kernel, self.tb)
        self.sel_mats = self._selections() if w.rd > 1 else []
        self.xsel = kb.ring(2, self.cv.pmax, self.dtype)
        self.xbands = self._bands(xsize)
        self.wbands = self._bands(wsize)
        self.xstage = kb.ring(BUFS, min(h.size, h.rd * self.xr + 1) * w.size, self.dtype)
        self.wstage = kb.ring(BUFS, self.tb * self.wi.cols, self.dtype)
        self.tps = kb.ring(TRANSPOSE_BANKS, self.cv.bank, "float32", mem="psum")
        self.xts = kb.ring(STAGES, self.cv.bank, self.dtype)
        self.wts = kb.ring(STAGES, self.cv.pmax, self.dtype)
        for (b0, nb), (o0, ot) in itertools.product(tiles(self.cv.n_out, self.cv.pmax),
                                                    tiles(self.cv.o_features, self.cv.pmax)):
            self._tile(b0, nb, o0, ot)
        kb.release(self.xbands, self.wbands, self.xstage, self.wstage, self.tps, self.xts,
                   self.wts, self.xsel, *(m for *_, m in self.sel_mats))

    def _bands(self, size: int):
        ring = self.kb.ring(BUFS, size, self.dtype)
        for t in ring.tiles:        # pads and zero columns: the same for every feature
            self.kb.emit(isa.Memset, dst=t, value=0, engine="vector")
        return ring

    def _fresh(self, ring) -> isa.Tile:
        """The next band; zeroed again if window blocks change which rows are pads."""
        t = ring.next()
        if len(self.blocks) > 1:
            self.kb.emit(isa.Memset, dst=t, value=0, engine="gpsimd")
        return t

    def _tile(self, b0: int, nb: int, o0: int, ot: int) -> None:
        kb, per = self.kb, self.cv.bank // nb
        banks = [kb.tile(self.cv.bank, "float32", mem="psum")
                 for _ in range(-(-len(self.offs) // per))]
        accs = [sub(banks[p // per], ot, nb, at=(p % per) * nb) for p in range(len(self.offs))]
        pending = None
        steps = itertools.product(range(self.cv.c), self.blocks)
        for i, (t0, tn) in steps:       # contraction features (the forward batch), blocks
            nq = min(self.xr, self.qh - t0)
            if self.h.rd == self.w.rd == 1:
                xb = self._load(self.xi, self._fresh(self.xbands), self.xstage, b0, nb, i,
                                self.h, self.w, t0, nq)
            else:
                xb = self._load_phases(self._fresh(self.xbands), b0, nb, i, t0, nq)
            wb = self._load(self.wi, self._fresh(self.wbands), self.wstage, o0, ot, i,
                            _Span(self.h.kernel), _Span(self.w.kernel), t0, tn)
            window = (tn - 1) * self.q + self.w.kernel
            for k, (k0, kt) in enumerate(tiles(window, self.cv.pmax)):
                # Step k's transposes are emitted before step k - 1's matmuls, so
                # TensorE transposes while VectorE/ScalarE evacuate the previous ones.
                ready = self._transposes(xb, wb, k0, kt, nb, ot)
                if pending is not None:
                    self._matmuls(accs, *pending)
                pending = (ready, nb, i == 0 and t0 == 0 and k == 0)
        self._matmuls(accs, *pending)
        res = kb.tile(len(self.offs) * nb, self.temp.dtype, parts=ot)
        for j, bank in enumerate(banks):
            n = min(per, len(self.offs) - j * per) * nb
            kb.emit(isa.TensorCopy, dst=sub(res, ot, n, at=j * per * nb), src=sub(bank, ot, n),
                    engine=kb.evac_engine())
        o, nbt = self.cv.o_features, self.cv.n_out
        pattern = ((nbt, ot), *compact(((o * nbt, len(self.offs)), (1, nb))))
        kb.dma(kb.ap(self.temp, o0 * nbt + b0, pattern), res)
        kb.release(res, *banks)

    def _transposes(self, xb, wb, k0: int, kt: int, nb: int, ot: int):
        """Window tile [k0, +kt): the kernel slice and every shifted input slice
        transposed to [kt, *] (TensorE into PSUM, copied to SBUF)."""
        kb = self.kb
        bank = self.tps.next()
        kb.emit(isa.NcTranspose, dst=sub(bank, kt, ot), data=sub(wb, ot, kt, at=k0))
        wt = sub(self.wts.next(), kt, ot)
        kb.emit(isa.TensorCopy, dst=wt, src=sub(bank, kt, ot), engine=kb.evac_engine())
        xts = []
        for g0, gn in tiles(len(self.offs), self.cv.bank // nb):
            bank = self.tps.next()
            for j in range(gn):
                kb.emit(isa.NcTranspose, dst=sub(bank, kt, nb, at=j * nb),
                        data=sub(xb, nb, kt, at=self.offs[g0 + j] + k0))
            xt = sub(self.xts.next(), kt, gn * nb)
            kb.emit(isa.TensorCopy, dst=xt, src=sub(bank, kt, gn * nb), engine=kb.evac_engine())
            xts.append(xt)
        return wt, xts

    def _matmuls(self, accs, ready, nb: int, first: bool) -> None:
        """One matmul per output position: accs[p] (+)= wt.T @ xt[p]."""
        wt, xts = ready
        kt, per = wt.num_partitions, self.cv.bank // nb
        for p, acc in enumerate(accs):
            moving = sub(xts[p // per], kt, nb, at=(p % per) * nb)
            self.kb.emit(isa.NcMatmul, dst=acc, stationary=wt, moving=moving,
                         precision=self.precision, accumulate=not first)

    # --- loads ---------------------------------------------------------------------------------

    def _load(self, im: Image, band, stage, p0: int, pn: int, i: int, h, w, q0: int,
              nq: int) -> isa.Tile:
        """Padded rows [q0, +nq) of feature i, partitions [p0, +pn), into their place in
        `band` ([pn, nq rows of width q]); pads are zero."""
        q = self.q
        lo, hi = max(q0, h.lo), min(q0 + nq, h.lo + h.size)
        c_lo, c_hi = max(0, w.lo), min(q, w.lo + w.size)
        tile = sub(band, pn)
        if hi <= lo or c_hi <= c_lo:
            return tile
        r_in, c_in = lo - h.lo, c_lo - w.lo
        base = p0 * im.part + i * im.feat + r_in * im.row
        rows = hi - lo
        if c_lo == 0 and c_hi == q == im.cols and not im.transposed:
            self._rows(im, sub(tile, pn, rows * q, at=(lo - q0) * q), base, pn, rows)
            return tile
        staged = sub(stage.next(), pn, rows * im.cols)
        self._rows(im, staged, base, pn, rows)
        for r in range(rows):
            self.kb.emit(isa.TensorCopy, dst=sub(tile, pn, c_hi - c_lo,
                                                  at=(lo - q0 + r) * q + c_lo),
                         src=sub(staged, pn, c_hi - c_lo, at=r * im.cols + c_in),
                         engine=self.kb.evac_engine())
        return tile

    def _selections(self) -> list:
        """0/1 matrices S[col, (phase, j)] = [col + lo == rd * j + phase] per block of
        128 input columns (TensorE scatters a transposed row into its phase rows)."""
        kb, w, out = self.kb, self.w, []
        width = len(self.phw) * self.q
        for c0, cn in tiles(w.size, self.cv.pmax):
            idx = kb.tile(width, "int32", parts=cn)
            for bi, a in enumerate(self.phw):
                kb.emit(isa.Iota, dst=sub(idx, cn, self.q, at=bi * self.q),
                        pattern=((-w.rd, self.q),), offset=c0 + w.lo - a, channel_multiplier=1)
            sel = kb.tile(width, self.dtype, parts=cn)
            kb.emit(isa.TensorScalar, dst=sel, data=idx, op0="is_equal", operand0=0,
                    engine="gpsimd")
            kb.release(idx)
            out.append((c0, cn, sel))
        return out

    def _load_phases(self, band, b0: int, nb: int, i: int, q0: int, nq: int) -> isa.Tile:
        """Input rows of feature i into their phase rows [q0, +nq) (rhs dilation rd > 1):
        row r lands in phase (lo + r) % rd, row (lo + r) // rd; columns likewise, by row
        copies (rd = 1 across) or a selection matmul per row."""
        kb, im, h, w, q = self.kb, self.xi, self.h, self.w, self.q
        tile = sub(band, nb)
        hits = [(r, self.phh.index((h.lo + r) % h.rd), (h.lo + r) // h.rd - q0)
                for r in range(h.size) if h.lo + r >= 0 and (h.lo + r) % h.rd in self.phh
                and 0 <= (h.lo + r) // h.rd - q0 < nq]
        if not hits:
            return tile
        first, nrows = hits[0][0], hits[-1][0] - hits[0][0] + 1
        staged = sub(self.xstage.next(), nb, nrows * w.size)
        self._rows(im, staged, b0 * im.part + i * im.feat + first * im.row, nb, nrows)
        c_lo, c_hi = max(0, w.lo), min(q, w.lo + w.size)
        npw = len(self.phw)
        for r, ih, qrow in hits:
            src_at = (r - first) * w.size
            if w.rd == 1:
                if c_hi > c_lo:
                    kb.emit(isa.TensorCopy, dst=sub(tile, nb, c_hi - c_lo,
                                                    at=(ih * self.xr + qrow) * q + c_lo),
                            src=sub(staged, nb, c_hi - c_lo, at=src_at + c_lo - w.lo),
                            engine=kb.evac_engine())
                continue
            sel = sub(self.tps.next(), nb, npw * q)
            for k, (c0, cn, mat) in enumerate(self.sel_mats):
                tp = sub(self.tps.next(), cn, nb)
                kb.emit(isa.NcTranspose, dst=tp, data=sub(staged, nb, cn, at=src_at + c0))
                # Its own ring: the xts tiles of the previous feature's last window
                # tile are still to be read by matmuls emitted after this load.
                xt = sub(self.xsel.next(), cn, nb)
                kb.emit(isa.TensorCopy, dst=xt, src=tp, engine=kb.evac_engine())
                kb.emit(isa.NcMatmul, dst=sel, stationary=xt, moving=mat, precision="native",
                        accumulate=k > 0)
            for iw in range(npw):
                kb.emit(isa.TensorCopy, dst=sub(tile, nb, q, at=((ih * npw + iw) * self.xr
                                                                 + qrow) * q),
                        src=sub(sel, nb, q, at=iw * q), engine=kb.evac_engine())
        return tile

    def _rows(self, im: Image, dst: isa.Tile, off: int, parts: int, rows: int) -> None:
        if im.transposed:
            src = self.kb.ap(im.t, off, ((im.col, rows * im.cols), (im.part, parts)))
            self.kb.emit(isa.DmaTranspose, dst=dst, src=src, dma_queue=next(self.queues))
            return
        pattern = compact(((im.row, rows), (im.col, im.cols)))
        self.kb.dma(dst, self.kb.ap(im.t, off, ((im.part, parts), *pattern)))


@dataclass(frozen=True)
class _Span:
    """A kernel dim seen as an unpadded image dim of `size` (rows/cols [0, size))."""
    size: int
    lo: int = 0

    @property
    def q(self) -> int:
        return self.size
