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

The input (`_source`):
- stride 1 without lhs dilation (`Padded`): read in place, band by band; rows are
  DMAed in (channel-minor NHWC rows by dma_transpose when no cast is needed, §3.4;
  else from a channel-major copy made by relayout) and copied row by row past the
  zero columns of the padding (set once per buffer; pad rows memset per band).
- otherwise (`Staged`): a DMA kernel first writes an HBM temporary [N, C, phases...,
  Q...] in the matmul dtype, zero-filled where padding or lhs dilation leaves holes,
  the input copied in with strided access patterns (lhs dilation = a destination
  stride, negative padding = a cropped source).

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

Transposed convolutions (lhs dilation), the input gradient (lhs dilation + padding)
and the weight gradient (batch and feature dims swapped by dimension_numbers, the
forward stride as rhs dilation) are the same conv with other attributes; the weight
gradient contracts over the batch (few partitions: tap packing stacks up to 128 / N
taps) with the forward output's spatial extent as its kernel window.
batch_group_count splits the batch: output-channel group b reads input images
b * N / B + n. Precision follows dot_general (dot.py `matmul_types`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .dot import matmul_types
from .errors import LoweringError
from .layout import P, Axes, View, row_major, tiles
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


def _source(ctx: LowerCtx, x: DramTensor, cv: Conv, dtype: str) -> Staged | Padded:
    ns, cs, sp = cv.x
    if all(d.stride == 1 and d.ld == 1 for d in cv.dims) and sp[-1][0] == 1:
        return Padded(x, ns, cs, tuple(st for st, _ in sp))
    if _transposable(ctx, x, cv, dtype):
        return Padded(x, ns, cs, tuple(st for st, _ in sp), transposed=True)
    return _stage_input(ctx, x, cv, dtype)


def _transposable(ctx: LowerCtx, x: DramTensor, cv: Conv, dtype: str) -> bool:
    """Channel-minor input rows (NHWC) that dma_transpose (v3+, bit-exact, no cast,
    §3.4) can load as [channels, pixels] for the stride-1 path."""
    ns, cs, sp = cv.x
    return (getattr(ctx.spec, "dma_transpose", False) and x.dtype == dtype
            and hw_dtypes.itemsize(dtype) in (2, 4) and cs == 1
            and sp[-2][0] == sp[-1][0] * sp[-1][1]
            and all(d.stride == 1 and d.ld == 1 for d in cv.dims))


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
        shifts = tuple(r * w.rd for r in range(reps))
    else:
        m = min(reps // w.kernel, h.kernel)
        runs = [tuple((kh, kw) for kh in range(r0, r0 + rn) for kw in range(w.kernel))
                for r0, rn in tiles(h.kernel, m)]
        reps = m * w.kernel
        shifts = tuple((r // w.kernel) * h.rd * w.q + (r % w.kernel) * w.rd
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
    from .conv_wgrad import lower as lower_wgrad, plan as plan_wgrad
    if (wgrad := plan_wgrad(ctx, cv, x, w, ldt, rdt)) is not None:
        return lower_wgrad(ctx, cv, *wgrad, out, precision, ldt)
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
    _Emitter(ctx.kb, cv_out, plan, pk, staged, (wsrc, wt), units, dst, precision, ldt,
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
    """A stride-1 conv whose input rows are not contiguous (channel-minor, NHWC) reads a
    channel-major copy, made by TensorE transposes of [pixels, channels] blocks
    (relayout.py), so its bands load with long DMA rows."""
    ns, cs, sp = cv.x
    if sp[-1][0] == 1 or not all(d.stride == 1 and d.ld == 1 for d in cv.dims):
        return x, cv
    if _transposable(ctx, x, cv, dtype):
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
    ns, os_, sp = cv.o
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
        per_row += 2 * w.size * hw_dtypes.itemsize(ldt)
    per_row += OUT_BUFS * w.out * hw_dtypes.itemsize(odt)
    fit = budget // per_row - h.shift if budget > 0 else 0
    if fit < 1:
        raise LoweringError(f"convolution tiles do not fit in SBUF (weights {wbytes} B, "
                            f"input rows {per_row} B per partition): {what}")
    band = min(h.out, fit if fit < rows else fit // rows * rows)
    plan = Plan(band, rows, wbytes)
    count = _matmuls(cv, plan, slots)
    if count > MAX_INSTRUCTIONS:
        raise LoweringError(f"convolution needs {count} matmuls (more than "
                            f"{MAX_INSTRUCTIONS}); a weight-gradient-shaped conv (large "
                            f"kernel window, small output) has no better lowering yet: {what}")
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


# --- the conv kernel ---------------------------------------------------------------------------

class _Emitter:
    """Emits the conv kernel (see the module docstring)."""

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
        self.per_ko = _phases(cv) * self.band_rows * self.w.q
        self.inner = [(kh, kw) for kh in range(self.h.kernel) for kw in range(self.w.kernel)]
        self.queues = itertools.cycle(range(kb.limits.dma_queues))

    def run(self) -> None:
        kb = self.kb
        ncit = max(len(tiles(b.cn, P)) for b in self.cv.blocks)
        bands = kb.ring(BAND_BUFS * ncit, len(self.ko) * self.per_ko, self.ldt)
        self.stage = None
        if isinstance(self.x, Padded):
            if self.x.gaps(self.w):         # zero columns between rows, set once
                for t in bands.tiles:
                    kb.emit(isa.Memset, dst=t, value=0, engine="vector")
            if self.x.gaps(self.w) or self.x.row[-2] != self.w.size or (
                    self.x.transposed and self.w.q != self.w.size):
                self.stage = kb.ring(2, self.band_rows * self.w.size, self.ldt)
        accs = kb.ring(PSUM_ACCS, MOVING_MAX, "float32", mem="psum")
        obuf = kb.ring(OUT_BUFS, self.plan.band * self.w.out, self.out.dtype)
        for b, us in zip(self.cv.blocks, self.units):
            weights = [self._load_weights(b, u) for u in us]
            jobs = [(n, od, r0, rn) for n in range(self.cv.n_out)
                    for od in itertools.product(*(range(d.out) for d in self.outer))
                    for r0, rn in tiles(self.h.out, self.plan.band)]
            load = lambda n, od, r0, rn: [self._replicate(self._load_band(
                bands.next(), b, ci0, ct, n, od, r0)) for ci0, ct in tiles(b.cn, P)]
            # Band k + 1 is emitted before band k's matmuls: the engines run their
            # queues in order, so its padding copies then overlap band k's matmuls.
            ahead = load(*jobs[0])
            for k, job in enumerate(jobs):
                xs, ahead = ahead, load(*jobs[k + 1]) if k + 1 < len(jobs) else None
                self._compute(b, weights, xs, accs, obuf, *job)
            kb.release(*weights)
        kb.release(bands, accs, obuf, *([self.stage] if self.stage else []))

    def _compute(self, b: Block, weights, xs, accs, obuf, n: int, od, r0: int, rn: int
                 ) -> None:
        cots = tiles(b.on, P)
        for m, (co0, cot) in enumerate(cots):
            ws = weights[m::len(cots)]
            otile = sub(obuf.next(), cot, rn * self.w.out)
            for chunk in _chunks(self.cv, self.plan.rows, r0, rn):
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
                src = ((cs, u.ct), *_compact(((step, cnt), (os_, u.cot))))
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
                for ph in range(_phases(self.cv)):
                    ih, iw = divmod(ph, len(w.phases))
                    at = i * self.per_ko + ph * self.band_rows * w.q
                    src = off + ih * x.phase[-2] + iw * x.phase[-1]
                    self.kb.dma(sub(tile, ct, rows * w.q, at=at),
                                self.kb.ap(x.t, src, ((x.c, ct), *pattern[2:])))
                continue
            self.kb.dma(sub(tile, ct, self.per_ko, at=i * self.per_ko),
                        self.kb.ap(x.t, off, ((x.c, ct), *_compact(pattern))))
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
                self._load_rows(sub(tile, ct, (hi - lo) * q), off, ct, hi - lo, c_hi - c_lo)
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
        pattern = _compact(((x.row[-2], rows), (x.row[-1], width)))
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
                   *_compact(((sp[-2][0], rn), (sp[-1][0], self.w.out))))
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
