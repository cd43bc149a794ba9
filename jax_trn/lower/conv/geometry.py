"""The geometry of a convolution: dims, group blocks, the input layouts the kernel reads,
tap packing and weight units (see conv/__init__.py for the algorithm)."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from jax_trn.hw.program import DramTensor

from ..layout import Axes, row_major, tiles
from ..target import Target


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
    target: Target              # the core it is lowered for

    @property
    def pmax(self) -> int:
        """Channels per tile: the target's partitions (input channels are the matmul
        contraction, output channels its stationary free size, §2.2)."""
        return self.target.partitions

    @property
    def bank(self) -> int:
        """FP32 elements per partition of one PSUM bank: the flat output positions one
        matmul accumulates (§2.2, §3.2)."""
        return self.target.psum_bank_fp32

    @property
    def o_features(self) -> int:
        return sum(b.on for b in self.blocks)

    @property
    def taps(self) -> int:
        return math.prod(d.kernel for d in self.dims)


def _split(shape, batch: int, feature: int, spatial) -> tuple[int, int, Axes]:
    axes = row_major(shape)
    return axes[batch][0], axes[feature][0], tuple(axes[d] for d in spatial)


def conv_of(x: DramTensor, w: DramTensor, out: DramTensor, attrs: dict,
            target: Target) -> Conv:
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
                     int(attrs.get("batch_group_count", 1)), n_in, target.partitions)
    n_out = out.shape[dn["output_batch_dimension"]]
    return Conv(xa, wa, oa, n_in, c, n_out, dims, blocks, target)


def _blocks(c: int, o: int, groups: int, batch_groups: int, n_in: int, pmax: int
            ) -> tuple[Block, ...]:
    """Feature groups packed into blocks of <= pmax (128) input and output channels
    (one block-diagonal matmul each) or, for big groups, one block per group; batch
    groups one block each (then feature_group_count is 1, as XLA requires)."""
    if batch_groups > 1:
        ob = o // batch_groups
        return tuple(Block(0, c, b * ob, ob, 1, c, ob, b * (n_in // batch_groups))
                     for b in range(batch_groups))
    cg, og = c // groups, o // groups
    per = max(1, min(pmax // cg, pmax // og)) if cg <= pmax and og <= pmax else 1
    return tuple(Block(g * cg, gn * cg, g * og, gn * og, gn, cg, og, 0)
                 for g, gn in tiles(groups, per))


# --- the input as the kernel reads it -----------------------------------------------------

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


def is_unit(cv: Conv) -> bool:
    return all(d.stride == 1 and d.ld == 1 for d in cv.dims)


def is_phased(cv: Conv) -> bool:
    """2-D (or 1-D) with each input row's phase rows in one PSUM bank (§3.2)."""
    w = cv.dims[-1]
    return len(cv.dims) == 2 and len(w.phases) * w.q <= cv.bank


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


def packing(cv: Conv) -> Packing:
    h, w = cv.dims[-2:]
    ct = max(min(b.cn, cv.pmax) for b in cv.blocks)
    single = len(h.phases) == len(w.phases) == 1
    reps = min(cv.pmax // ct, h.kernel * w.kernel) if single else 1
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


# --- the weights -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Unit:
    """The weights of one (block, ci tile, co tile): [ct, taps, cot] at `offset`."""
    offset: int
    ci0: int
    ct: int
    co0: int
    cot: int


def weight_units(cv: Conv) -> list[list[Unit]]:
    """Per block, its units in (ci tile, co tile) order, laid out one after another."""
    out, at = [], 0
    for b in cv.blocks:
        units = []
        for (ci0, ct), (co0, cot) in itertools.product(tiles(b.cn, cv.pmax),
                                                       tiles(b.on, cv.pmax)):
            units.append(Unit(at, ci0, ct, co0, cot))
            at += ct * cv.taps * cot
        out.append(units)
    return out


def compact(pattern: Axes) -> Axes:
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
