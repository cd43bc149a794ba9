"""convolution on TensorE: one matmul per kernel tap (or tap group), accumulated in PSUM.

For every output image and output-channel tile, each kernel tap t = (kh, kw) is a
TensorE matmul over input channels (the contraction, on partitions, §2.2):

    psum[co, f] (+)= W[ci, t, co].T @ X[ci, f + offset(t)]

where the moving operand is a *contiguous* run of the input held in SBUF. That works
because the input sits in SBUF in a layout where every tap is a constant shift of a
flat index ("wide" output grid): rows of the padded, dilated input of width Qw, output
position (oh, ow) at flat index oh * Qw + ow, tap (kh, kw) at + kh * Qw + kw. The
Qw - OW columns past each output row are computed and dropped when PSUM is evacuated.
A stride s splits the input into s x s phases (polyphase): tap k reads phase
(k * rd) % s shifted by (k * rd) // s, so strided taps are contiguous runs too.

The input (`_source`) is read in place, band by band, its rows DMAed in (channel-minor
NHWC rows by dma_transpose when no cast is needed, §3.4; else from a channel-major
copy made by relayout), then
- stride 1 without lhs dilation (`Padded`): copied row by row past the zero columns
  of the padding (set once per buffer; pad rows memset per band);
- a stride or lhs dilation (`Phased`, 1-D/2-D): each row transposed on TensorE and
  multiplied by a 0/1 selection matrix that scatters it into its padded phase rows;
- otherwise (3-D strided, phase rows wider than a PSUM bank: `Staged`): a DMA kernel
  first writes an HBM temporary [N, C, phases..., Q...] in the matmul dtype,
  zero-filled where padding or lhs dilation leaves holes, the input copied in with
  strided access patterns (slow: 2-4 byte DMA runs).

The weights stay resident per group block: read directly (HWIO: rows of co; OIHW: a
dma_transpose of [co, ci] per tap) or, for grouped convs with small groups (depthwise)
packed block-diagonally into 128 partitions (one matmul serves many groups), staged
as [ci, taps, co] blocks by a DMA kernel.

Tap packing (`Packing`): when input channels fill <= 64 partitions, R copies of the
band, shifted by the offsets of R consecutive taps, fill R * ct partitions (SBUF ->
SBUF DMA), so one matmul contracts over R taps at once (3 -> 64 channels, 3x3: one
matmul instead of nine; 64 -> 64: six instead of nine).

The conv kernel: per band of output rows the input band is loaded (triple-buffered,
band k + 1 emitted before band k's matmuls so its padding copies overlap them), split
in chunks of at most 512 flat positions (one PSUM bank of FP32, §3.2); per chunk the
(ci tile, tap group) matmuls accumulate into one bank, VectorE/ScalarE copy the valid
columns of each output row to SBUF in the result dtype, and one DMA per band writes
the rows out (a DMA has a fixed cost of ~2 us, §2.6). A channel-minor output (NHWC)
is written channel-major to a temporary and swapped into place on TensorE.

Transposed convolutions (lhs dilation) and the input gradient (lhs dilation +
padding) are the same conv with other attributes. The weight gradient (batch and
feature dims swapped by dimension_numbers, the forward output as a large kernel
window, the forward stride as rhs dilation) contracts over the window instead
(conv_wgrad.py) when the window is >= 16x the output; otherwise (grouped: batch
groups) the tap loop runs it, contracting over the batch with tap packing.
batch_group_count splits the batch: output-channel group b reads input images
b * N / B + n. Precision follows dot_general (dot.py `matmul_types`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw.program import DramTensor

from .dot import matmul_types
from .errors import LoweringError
from .layout import Axes, P, View, row_major, tiles
from .matmul import MOVING_MAX
from .movement import fill
from .registry import LowerCtx, register_lowering
from .relayout import relayout

SBUF_SHARE = 0.75          # of SBUF the conv kernel plans for
PSUM_ACCS = 4               # accumulation banks in flight (of 8, §3.2)
OUT_BUFS = 3                # evacuated bands in flight to the output DMA
BAND_BUFS = 3               # input bands in flight per ci tile
MAX_INSTRUCTIONS = 400_000  # beyond this a conv would take minutes to compile


# --- the conv's geometry ---------------------------------------------------------------

@dataclass(frozen=True)
class Dim:
    """One spatial dimension: input size, kernel size, output size and window attrs."""
    size: int
    kernel: int
    out: int
    stride: int = 1
    lo: int = 0
    hi: int = 0
    ld: int = 1                 # lhs (input) dilation
    rd: int = 1                 # rhs (kernel) dilation

    def tap(self, k: int) -> tuple[int, int]:
        """(phase, shift) of kernel index k: it reads phase row q + shift for output q.

        >>> Dim(8, 3, 4, stride=2, lo=1, hi=1).tap(2)
        (0, 1)
        """
        off = k * self.rd
        return off % self.stride, off // self.stride

    @property
    def phases(self) -> tuple[int, ...]:
        return tuple(sorted({self.tap(k)[0] for k in range(self.kernel)}))

    @property
    def shift(self) -> int:
        return max(self.tap(k)[1] for k in range(self.kernel))

    @property
    def q(self) -> int:
        """Rows of each phase that some output reads."""
        return self.out + self.shift

    @property
    def exact(self) -> bool:
        """The input itself, cropped, is the staged layout (one phase, no holes)."""
        return self.stride == 1 and self.ld == 1 and self.lo <= 0 and self.hi <= 0

    def interior(self, a: int) -> tuple[int, int, int, int, int] | None:
        """Input indices that land on phase a: (i0, count, istep, q0, qstep), or None.

        >>> Dim(5, 3, 9, ld=2, lo=2, hi=2).interior(0)
        (0, 5, 1, 2, 2)
        """
        hits = [i for i in range(self.size)
                if (h := self.lo + i * self.ld) >= 0 and h % self.stride == a
                and h // self.stride < self.q]
        if not hits:
            return None
        istep = hits[1] - hits[0] if len(hits) > 1 else 1
        q0 = (self.lo + hits[0] * self.ld) // self.stride
        return hits[0], len(hits), istep, q0, istep * self.ld // self.stride


@dataclass(frozen=True)
class Block:
    """Input channels [c0, +cn) against output channels [o0, +on) of one group block:
    `groups` groups of (cg in, og out) channels (block-diagonal weight if > 1);
    output image n reads input image n + `batch_off`."""
    c0: int
    cn: int
    o0: int
    on: int
    groups: int
    cg: int
    og: int
    batch_off: int


@dataclass(frozen=True)
class Conv:
    x: tuple[int, int, Axes]    # (batch stride, feature stride, spatial axes)
    w: tuple[int, int, Axes]    # (output feature, input feature, spatial) strides
    o: tuple[int, int, Axes]
    n_in: int
    c: int
    n_out: int
    dims: tuple[Dim, ...]       # spatial dims, 2 or 3 (1-D gets a leading dummy)
    blocks: tuple[Block, ...]

    @property
    def o_features(self) -> int:
        return sum(b.on for b in self.blocks)

    @property
    def taps(self) -> int:
        return math.prod(d.kernel for d in self.dims)


def _split(shape, batch: int, feature: int, spatial) -> tuple[int, int, Axes]:
    axes = row_major(shape)
    return axes[batch][0], axes[feature][0], tuple(axes[d] for d in spatial)


def _conv(x: DramTensor, w: DramTensor, out: DramTensor, attrs: dict) -> Conv:
    dn = attrs["dimension_numbers"]
    xa = _split(x.shape, dn["input_batch_dimension"], dn["input_feature_dimension"],
                dn["input_spatial_dimensions"])
    wa = _split(w.shape, dn["kernel_output_feature_dimension"],
                dn["kernel_input_feature_dimension"], dn["kernel_spatial_dimensions"])
    oa = _split(out.shape, dn["output_batch_dimension"], dn["output_feature_dimension"],
                dn["output_spatial_dimensions"])
    pads = attrs.get("padding") or ((0, 0),) * len(xa[2])
    dims = tuple(Dim(xs[1], ks[1], os[1], s, int(lo), int(hi), ld, rd) for xs, ks, os, s,
                 (lo, hi), ld, rd in zip(xa[2], wa[2], oa[2], attrs["window_strides"], pads,
                                         attrs["lhs_dilation"], attrs["rhs_dilation"]))
    if len(dims) == 1:                      # 1-D: a dummy leading dim of size 1
        dims, one = (Dim(1, 1, 1), *dims), ((0, 1),)
        xa, wa, oa = ((a, b, one + s) for a, b, s in (xa, wa, oa))
    n_in, c = x.shape[dn["input_batch_dimension"]], x.shape[dn["input_feature_dimension"]]
    o = out.shape[dn["output_feature_dimension"]]
    blocks = _blocks(c, o, int(attrs.get("feature_group_count", 1)),
                     int(attrs.get("batch_group_count", 1)), n_in)
    n_out = out.shape[dn["output_batch_dimension"]]
    return Conv(xa, wa, oa, n_in, c, n_out, dims, blocks)


def _blocks(c: int, o: int, groups: int, batch_groups: int, n_in: int) -> tuple[Block, ...]:
    """Feature groups packed into blocks of <= 128 input and output channels (one
    block-diagonal matmul each) or, for big groups, one block per group; batch groups
    one block each (then feature_group_count is 1, as XLA requires)."""
    if batch_groups > 1:
        ob = o // batch_groups
        return tuple(Block(0, c, b * ob, ob, 1, c, ob, b * (n_in // batch_groups))
                     for b in range(batch_groups))
    cg, og = c // groups, o // groups
    per = max(1, min(P // cg, P // og)) if cg <= P and og <= P else 1
    return tuple(Block(g * cg, gn * cg, g * og, gn * og, gn, cg, og, 0)
                 for g, gn in tiles(groups, per))


# --- staging: the input -----------------------------------------------------------------

@dataclass(frozen=True)
class Staged:
    """The input as the conv kernel reads it: element offset, batch and channel
    strides, and per spatial dim its phases' stride and its rows' stride."""
    t: DramTensor
    offset: int
    n: int
    c: int
    phase: tuple[int, ...]
    row: tuple[int, ...]


@dataclass(frozen=True)
class Padded:
    """The input read in place and padded in SBUF (stride 1, no lhs dilation, rows
    contiguous): a band's rows are DMAed in, then copied row by row to their padded
    place if the padding or cropping of the last dim moves them (zero columns between
    rows are set once per buffer, pad rows per band)."""
    t: DramTensor
    n: int
    c: int
    row: tuple[int, ...]        # the input's spatial strides
    transposed: bool = False    # channel-minor rows: loaded by dma_transpose (§3.4)

    def cols(self, w: Dim) -> tuple[int, int]:
        """The padded columns [c_lo, c_hi) that hold input columns."""
        return max(0, w.lo), min(w.q, w.lo + w.size)

    def gaps(self, w: Dim) -> bool:
        return self.cols(w) != (0, w.q)


@dataclass(frozen=True)
class Phased(Padded):
    """The input read in place and split into phases in SBUF (a stride or lhs
    dilation, 1-D/2-D): each input row is transposed on TensorE and multiplied by a
    0/1 selection matrix S[col, (phase, j)] = [lo + col * ld == s * j + phase], which
    scatters it into its padded phase rows (zeros included) in one PSUM bank; strided
    element reads would cost a 2-4 byte DMA descriptor each (§3.4)."""


def _source(ctx: LowerCtx, x: DramTensor, cv: Conv, dtype: str) -> Staged | Padded:
    ns, cs, sp = cv.x
    rows = sp[-1][0] == 1
    if rows or _transposable(ctx, x, cv, dtype):
        kind = Padded if _unit(cv) else Phased if _phased(cv) else None
        if kind is not None:
            return kind(x, ns, cs, tuple(st for st, _ in sp), transposed=not rows)
    return _stage_input(ctx, x, cv, dtype)


def _unit(cv: Conv) -> bool:
    return all(d.stride == 1 and d.ld == 1 for d in cv.dims)


def _phased(cv: Conv) -> bool:
    """2-D (or 1-D) with each input row's phase rows in one PSUM bank (§3.2)."""
    w = cv.dims[-1]
    return len(cv.dims) == 2 and len(w.phases) * w.q <= MOVING_MAX


def _transposable(ctx: LowerCtx, x: DramTensor, cv: Conv, dtype: str) -> bool:
    """Channel-minor input rows (NHWC) that dma_transpose (v3+, bit-exact, no cast,
    §3.4) can load as [channels, pixels] for the in-place paths."""
    _ns, cs, sp = cv.x
    return (getattr(ctx.spec, "dma_transpose", False) and x.dtype == dtype
            and hw_dtypes.itemsize(dtype) in (2, 4) and cs == 1
            and sp[-2][0] == sp[-1][0] * sp[-1][1] and (_unit(cv) or _phased(cv)))


def _stage_input(ctx: LowerCtx, x: DramTensor, cv: Conv, dtype: str) -> Staged:
    ns, cs, sp = cv.x
    dims = cv.dims
    shape = (cv.n_in, cv.c, *(len(d.phases) for d in dims),
             *(d.q for d in dims))
    xp = ctx.temp(shape, dtype)
    axes = row_major(shape)
    k = len(dims)
    if any(d.lo > 0 or d.hi > 0 or d.ld > 1 or d.stride > 1 for d in dims):
        fill(ctx.kb, xp, 0)
    for combo in itertools.product(*(d.phases for d in dims)):
        parts = [d.interior(a) for d, a in zip(dims, combo)]
        if any(p is None for p in parts):
            continue
        doff = sum(dims[j].phases.index(a) * axes[2 + j][0] for j, a in enumerate(combo))
        doff += sum(p[3] * axes[2 + k + j][0] for j, p in enumerate(parts))
        soff = sum(p[0] * st for p, (st, _) in zip(parts, sp))
        n, cc = shape[0], shape[1]
        # (n, outer spatial..., h, c, w): a channel-minor input is a TensorE swap of
        # the last two axes (relayout.py), a channel-major one plain row copies.
        dst = [(axes[0][0], n)] + [(axes[2 + k + j][0] * p[4], p[1])
                                   for j, p in enumerate(parts)]
        src = [(ns, n)] + [(st * p[2], p[1]) for p, (st, _) in zip(parts, sp)]
        dst.insert(len(dst) - 1, (axes[1][0], cc))
        src.insert(len(src) - 1, (cs, cc))
        relayout(ctx.kb, View(xp, tuple(dst), doff), View(x, tuple(src), soff))
    return Staged(xp, 0, axes[0][0], axes[1][0], tuple(a[0] for a in axes[2:2 + k]),
                  tuple(a[0] for a in axes[2 + k:]))




# --- tap packing ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Packing:
    """Taps stacked on the contraction axis when input channels fill at most half the
    partitions (ct <= 64): replica r of the input band (partitions [r*ct, +ct)) holds
    the band shifted by `shifts[r]` flat elements, so one matmul over len(group) * ct
    partitions covers a group of taps whose offsets are those shifts. Groups are runs
    of kw (or whole kernel rows when a row is shorter than the replicas) of the 2
    inner dims; full groups come first, then the shorter ones."""
    reps: int
    shifts: tuple[int, ...]
    groups: tuple[tuple[tuple[int, int], ...], ...]     # inner taps (kh, kw) per group


def _packing(cv: Conv) -> Packing:
    h, w = cv.dims[-2:]
    ct = max(min(b.cn, P) for b in cv.blocks)
    single = len(h.phases) == len(w.phases) == 1
    reps = min(P // ct, h.kernel * w.kernel) if single else 1
    if reps <= 1:
        taps = tuple(((kh, kw),) for kh in range(h.kernel) for kw in range(w.kernel))
        return Packing(1, (0,), taps)
    if w.kernel >= reps:
        runs = [tuple((kh, kw) for kw in range(k0, k0 + kn)) for kh in range(h.kernel)
                for k0, kn in tiles(w.kernel, reps)]
        shifts = tuple(w.tap(r)[1] for r in range(reps))     # one phase: r * rd / s
    else:
        m = min(reps // w.kernel, h.kernel)
        runs = [tuple((kh, kw) for kh in range(r0, r0 + rn) for kw in range(w.kernel))
                for r0, rn in tiles(h.kernel, m)]
        reps = m * w.kernel
        shifts = tuple(h.tap(r // w.kernel)[1] * w.q + w.tap(r % w.kernel)[1]
                       for r in range(reps))
    full = [g for g in runs if len(g) == reps]
    return Packing(reps, shifts, tuple(full + [g for g in runs if len(g) < reps]))


# --- staging: the weights ----------------------------------------------------------------

@dataclass(frozen=True)
class Unit:
    """The weights of one (block, ci tile, co tile): [ct, taps, cot] at `offset`."""
    offset: int
    ci0: int
    ct: int
    co0: int
    cot: int


def _units(cv: Conv) -> list[list[Unit]]:
    """Per block, its units in (ci tile, co tile) order, laid out one after another."""
    out, at = [], 0
    for b in cv.blocks:
        units = []
        for (ci0, ct), (co0, cot) in itertools.product(tiles(b.cn, P), tiles(b.on, P)):
            units.append(Unit(at, ci0, ct, co0, cot))
            at += ct * cv.taps * cot
        out.append(units)
    return out


def _stage_weights(ctx: LowerCtx, w: DramTensor, cv: Conv, units, dtype: str) -> DramTensor:
    """Copies the kernel into [ci, taps, co] blocks (block-diagonal for packed groups)."""
    total = sum(u.ct * cv.taps * u.cot for us in units for u in us)
    wt = ctx.temp((total,), dtype)
    os_, is_, sp = cv.w
    taps = tuple((st * u, n) for (st, n), u in zip(
        row_major([d.kernel for d in cv.dims]), [1] * len(cv.dims)))
    if any(b.groups > 1 for b in cv.blocks):
        fill(ctx.kb, wt, 0)
    for b, us in zip(cv.blocks, units):
        for u in us:
            tap_d = tuple((st * u.cot, n) for st, n in taps)
            if b.groups > 1:
                dst = ((b.cg * cv.taps * u.cot + b.og, b.groups), (cv.taps * u.cot, b.cg),
                       *tap_d, (1, b.og))
                src = ((b.og * os_, b.groups), (is_, b.cg), *sp, (os_, b.og))
                soff = b.o0 * os_
            else:
                dst = ((cv.taps * u.cot, u.ct), *tap_d, (1, u.cot))
                src = ((is_, u.ct), *sp, (os_, u.cot))
                soff = u.ci0 * is_ + (b.o0 + u.co0) * os_
            relayout(ctx.kb, View(wt, dst, u.offset), View(w, src, soff))
    return wt


def _weight_source(ctx: LowerCtx, w: DramTensor, cv: Conv, dtype: str) -> str:
    """How the conv kernel reads weights: "direct" (output features contiguous, HWIO:
    DMA rows of co), "transpose" (dma_transpose of [co, ci] per tap, no cast, §3.4) or
    "staged" (block-diagonal groups, or a cast of a co-strided kernel: a DMA kernel
    first copies them to [ci, taps, co] blocks)."""
    if any(b.groups > 1 for b in cv.blocks):
        return "staged"
    if cv.w[0] == 1:
        return "direct"
    if (getattr(ctx.spec, "dma_transpose", False) and w.dtype == dtype
            and hw_dtypes.itemsize(dtype) in (2, 4)):
        return "transpose"
    return "staged"


# --- the rule ------------------------------------------------------------------------------

@register_lowering("convolution")
def _convolution_lower(ctx: LowerCtx, x: DramTensor, w: DramTensor, **attrs) -> None:
    out = ctx.outs[0]
    cv = _conv(x, w, out, attrs)
    ctx.kb.flops += 2 * out.size * (w.size // max(1, cv.o_features))
    if out.size == 0:
        return
    if x.size == 0 or w.size == 0:
        return fill(ctx.kb, out, 0)
    if len(cv.dims) > 3:
        raise LoweringError(f"convolution with {len(cv.dims)} spatial dims (1-3 supported): "
                            f"{ctx.op.describe()}")
    ldt, rdt, precision = matmul_types(x.dtype, w.dtype, attrs.get("precision_config", ()),
                                       ctx.matmul_precision)
    if (wgrad := conv_wgrad.plan(ctx, cv, x, w, ldt, rdt)) is not None:
        return conv_wgrad.lower(ctx, cv, *wgrad, out, precision, ldt)
    units, x_in = _units(cv), x
    x, cv = _channel_major_input(ctx, x, cv, ldt)
    staged = _source(ctx, x, cv, ldt)
    pk = _packing(cv)
    plan = _plan(cv, units, staged, pk, ldt, rdt, out.dtype, ctx.limits.sbuf_bytes,
                 ctx.op.describe())
    wsrc = _weight_source(ctx, w, cv, rdt)
    wt = _stage_weights(ctx, w, cv, units, rdt) if wsrc == "staged" else w
    if wsrc == "staged" or isinstance(staged, Staged) or x is not x_in:
        ctx.next_kernel("conv")
    dst, cv_out = _channel_major_output(ctx, out, cv)
    ConvEmitter(ctx.kb, cv_out, plan, pk, staged, (wsrc, wt), units, dst, precision, ldt,
                rdt).run()
    if dst is not out:
        ctx.next_kernel("relayout")
        # (batch, spatial..., feature): the feature axis is the output's contiguous one
        # and the temporary's pixels are, so relayout swaps them on TensorE.
        sizes = (cv.n_out, *(n for _, n in cv.o[2]), cv.o_features)
        tmp = row_major(dst.shape)
        relayout(ctx.kb, View(out, _sized(((cv.o[0], 0), *cv.o[2], (cv.o[1], 0)), sizes)),
                 View(dst, _sized((tmp[0], *tmp[2:], tmp[1]), sizes)))


def _channel_major_input(ctx: LowerCtx, x: DramTensor, cv: Conv, dtype: str
                         ) -> tuple[DramTensor, Conv]:
    """A conv read in place whose input rows are not contiguous (channel-minor, NHWC)
    and that dma_transpose cannot load reads a channel-major copy, made by TensorE transposes of [pixels, channels] blocks
    (relayout.py), so its bands load with long DMA rows."""
    ns, cs, sp = cv.x
    if sp[-1][0] == 1 or not (_unit(cv) or _phased(cv)) or _transposable(ctx, x, cv, dtype):
        return x, cv
    shape = (cv.n_in, cv.c, *(d.size for d in cv.dims))
    xt = ctx.temp(shape, x.dtype)
    axes = row_major(shape)
    relayout(ctx.kb, View(xt, _sized(axes, shape)),
             View(x, _sized(((ns, 0), (cs, 0), *sp), shape)))
    return xt, replace(cv, x=(axes[0][0], axes[1][0], axes[2:]))


def _channel_major_output(ctx: LowerCtx, out: DramTensor, cv: Conv
                          ) -> tuple[DramTensor, Conv]:
    """A channel-minor output (NHWC) is written channel-major to a temporary (rows of
    pixels per output channel: long DMA runs) and transposed into place afterwards."""
    _ns, os_, sp = cv.o
    pixels = math.prod(n for _, n in sp)
    if os_ != 1 or pixels == 1 or cv.o_features == 1:
        return out, cv
    shape = (cv.n_out, cv.o_features, *(n for _, n in sp))
    t = ctx.temp(shape, out.dtype)
    axes = row_major(shape)
    return t, replace(cv, o=(axes[0][0], axes[1][0], axes[2:]))


def _sized(axes: Axes, shape) -> Axes:
    return tuple((st, n) for (st, _), n in zip(axes, shape))


# --- planning --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    band: int                   # output rows per input band
    rows: int                   # output rows per PSUM chunk (1 if a row is cut)
    weight_bytes: int           # per partition, the largest block's resident weights


def _chunks(cv: Conv, rows: int, r0: int, rn: int) -> list[tuple[int, int, int, int]]:
    """(first row, rows, first column, columns) of each PSUM chunk of a band."""
    ow = cv.dims[-1].out
    if ow > MOVING_MAX:
        return [(r, 1, c0, cn) for r in range(r0, r0 + rn) for c0, cn in tiles(ow, MOVING_MAX)]
    return [(r0 + a0, an, 0, ow) for a0, an in tiles(rn, rows)]


def _plan(cv: Conv, units, src, pk: Packing, ldt: str, rdt: str, odt: str, sbuf: int,
          what: str) -> Plan:
    h, w = cv.dims[-2:]
    rows = max(1, (MOVING_MAX - w.out) // w.q + 1) if w.out <= MOVING_MAX else 1
    slots = _outer_taps(cv) * len(pk.groups)
    wbytes = max(sum(slots * u.cot for u in us) for us in units) * hw_dtypes.itemsize(rdt)
    budget = int(sbuf * SBUF_SHARE) - wbytes
    ncit = max(len(tiles(b.cn, P)) for b in cv.blocks)
    per_row = BAND_BUFS * ncit * _outer_taps(cv) * _phases(cv) * w.q * hw_dtypes.itemsize(ldt)
    if isinstance(src, Padded):         # + the staging ring of unpadded rows
        per_row += BAND_BUFS * ncit * h.stride * w.size * hw_dtypes.itemsize(ldt)
    per_row += OUT_BUFS * w.out * hw_dtypes.itemsize(odt)
    fit = budget // per_row - h.shift if budget > 0 else 0
    if fit < 1:
        raise LoweringError(f"convolution tiles do not fit in SBUF (weights {wbytes} B, "
                            f"input rows {per_row} B per partition): {what}")
    band = min(h.out, fit if fit < rows else fit // rows * rows)
    plan = Plan(band, rows, wbytes)
    count = _matmuls(cv, plan, slots)
    if count > MAX_INSTRUCTIONS:
        raise LoweringError(f"convolution needs {count} matmuls in its tap loop (more than "
                            f"{MAX_INSTRUCTIONS}, minutes to compile); a huge kernel window "
                            f"outside conv_wgrad's cases (grouped, 3-D, strided window): {what}")
    return plan


def _outer_taps(cv: Conv) -> int:
    return math.prod(d.kernel for d in cv.dims[:-2])


def _phases(cv: Conv) -> int:
    return len(cv.dims[-2].phases) * len(cv.dims[-1].phases)


def _matmuls(cv: Conv, plan: Plan, slots: int) -> int:
    h = cv.dims[-2]
    chunks = sum(len(_chunks(cv, plan.rows, r0, rn)) for r0, rn in tiles(h.out, plan.band))
    per_image = chunks * slots * math.prod(d.out for d in cv.dims[:-2])
    return cv.n_out * per_image * sum(len(tiles(b.cn, P)) * len(tiles(b.on, P))
                                      for b in cv.blocks)


def _compact(pattern: Axes) -> Axes:
    """Drops count-1 axes and fuses contiguous neighbours (at least one axis)."""
    out: list[tuple[int, int]] = []
    for st, n in pattern:
        if n == 1:
            continue
        if out and out[-1][0] == st * n:
            out[-1] = (st, out[-1][1] * n)
        else:
            out.append((st, n))
    return tuple(out) or ((1, 1),)


# The kernel emitters use the geometry above, so they are imported last.
from . import conv_wgrad
from .conv_kernel import ConvEmitter
