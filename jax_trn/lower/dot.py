"""dot_general on TensorE.

Canonical form: for every batch index, out[M, N] = lhs[M, K] @ rhs[K, N], where M, K
and N are single strided axes of the operands in DRAM (batch may stay multi-axis). When
a group of dims cannot be read as one strided axis, that operand is first copied into
[B, M, K] / [B, K, N] order by a DMA kernel. The result [B, M, N] is XLA's dot_general
result order (batch, lhs free, rhs free), so it is written directly.

TensorE computes dst[M, N] (+)= stationary[K, M].T @ moving[K, N] with K on partitions
(§2.2): lhs tiles are stationary (M <= 128), rhs tiles moving (N <= 512, one PSUM bank).
An operand whose K axis is the contiguous one (lhs [M, K] row-major, rhs [N, K]) is
loaded naturally (rows of K, long DMA runs) and transposed on TensorE into PSUM, then
copied to SBUF in the matmul dtype (what the Neuron compiler does): a DMA reading it
K-major would move 2-4 byte runs, far below DMA efficiency (§3.4), while a TensorE
transpose costs ~128 cycles per 128x128 tile against 512 per matmul that reuses it.

Loop order, per batch and block of N columns (<= 6 PSUM banks):
    load rhs block R[K, Nb] once (resident in SBUF)        # unless K is blocked
    for each 128-row tile of M:        # stationary strip S[K, 128], double-buffered
        for each 512-column tile of Nb:     # one PSUM bank, ring of 6
            for each 128-deep tile of K: matmul, accumulate=(not first)
            copy PSUM -> SBUF (casting to the result dtype), alternating VectorE/ScalarE
        DMA the [128, Nb] result rows out
rhs is read once, lhs once per N block. When K is too deep for R to stay resident, K is
split in blocks and R is reloaded per M tile (accumulating across blocks in PSUM).

Precision (decided): float32 operands at DEFAULT run as bf16 (DMA casts through FP32,
RNE) with FP32 accumulation; HIGH as tf32 (when the hardware model has the type, else
fp32); HIGHEST as fp32 at the FP32 rate. What DEFAULT means is set by
`lower_module(matmul_precision=)` / $JAX_TRN_MATMUL_PRECISION. bf16/fp16/fp8 run
natively; mixed types are cast to the wider one. Integer dots compute in FP32, exact
while every partial sum stays below 2**24 (the Neuron compiler converts integer matmuls
to FP32, §4).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from hlo_passes import ir
from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import PSUM_BANK_BYTES, KernelBuilder, sub
from .errors import LoweringError
from .layout import P, Axes, merge_axes, row_major, tiles
from .movement import dram_copy, fill
from .registry import LowerCtx, register_lowering

MOVING_MAX = 512            # moving free size: one PSUM bank of FP32 (§2.2)
ACC_BANKS = 6               # accumulation groups in flight; 2 banks stay for transposes
TRANSPOSE_BANKS = 2
SBUF_SHARE = 0.75           # of SBUF a dot kernel may plan for
LEVELS = {"default": 0, "high": 1, "highest": 2}
PRECISION_DTYPE = {0: "bfloat16", 1: "tfloat32", 2: "float32"}


# --- dtypes and precision ----------------------------------------------------------

def _has_dtype(name: str) -> bool:
    try:
        hw_dtypes.np_dtype(name)
    except TypeError:
        return False
    return True


def _level(precision_config, default: str) -> int:
    names = [p.lower() for p in precision_config or ()] or ["default"]
    return max(LEVELS[default] if p == "default" else LEVELS[p] for p in names)


def operand_dtypes(lhs: str, rhs: str, precision_config, default: str) -> tuple[str, str]:
    """The SBUF dtypes the matmul reads, after the precision rule.

    >>> operand_dtypes("float32", "float32", (), "default")
    ('bfloat16', 'bfloat16')
    >>> operand_dtypes("bfloat16", "float32", ("HIGHEST", "DEFAULT"), "default")
    ('float32', 'float32')
    >>> operand_dtypes("float8_e4m3", "float8_e5m2", (), "default")
    ('float8_e4m3', 'float8_e5m2')
    """
    if not (ir.is_float(lhs) and ir.is_float(rhs)):
        return "float32", "float32"          # integer dot: FP32, exact below 2**24
    if lhs.startswith("float8") and rhs.startswith("float8"):
        return lhs, rhs
    size = {d: hw_dtypes.itemsize(d) for d in (lhs, rhs)}
    common = lhs if lhs == rhs else max(lhs, rhs, key=size.get)
    if lhs != rhs and size[lhs] == size[rhs]:
        common = "float32"
    if common == "float32":
        common = PRECISION_DTYPE[_level(precision_config, default)]
        common = common if _has_dtype(common) else "float32"
    return common, common


# --- canonical form --------------------------------------------------------------------

@dataclass(frozen=True)
class Operand:
    """One matmul operand in DRAM: batch axes, then K and its free axis F (M or N)."""
    t: DramTensor
    batch: Axes
    k: tuple[int, int]          # (stride, K)
    f: tuple[int, int]          # (stride, F)
    dtype: str                  # SBUF dtype of its tiles
    transposed: bool            # load [F, K] rows and transpose on TensorE

    def batch_offset(self, index: tuple[int, ...]) -> int:
        return sum(s * i for (s, _), i in zip(self.batch, index))


def _single(axes: Axes) -> tuple[int, int] | None:
    """`axes` as one (stride, num) axis, or None."""
    if len(axes) > 1:
        return None
    return axes[0] if axes else (1, 1)


def _groups(shape, batch, contract) -> tuple[Axes, Axes, Axes]:
    axes = row_major(shape)
    free = [d for d in range(len(shape)) if d not in (*batch, *contract)]
    return tuple(axes[d] for d in batch), tuple(axes[d] for d in free), \
        tuple(axes[d] for d in contract)


def _operand(t: DramTensor, b: Axes, f: Axes, k: Axes, dtype: str) -> Operand | None:
    ks, fs = _single(merge_axes(k)[0] if k else ()), _single(merge_axes(f)[0] if f else ())
    if ks is None or fs is None:
        return None
    transposed = ks[0] == 1 and fs[0] != 1 and ks[1] > 1
    return Operand(t, b, ks, fs, dtype, transposed)


def _canonical(ctx: LowerCtx, t: DramTensor, b: Axes, f: Axes, k: Axes, dtype: str,
               lhs: bool) -> Operand:
    """The operand as single K/F axes, copied into [B, M, K] / [B, K, N] if need be."""
    op = _operand(t, b, f, k, dtype)
    if op is not None:
        return op
    order = (*b, *f, *k) if lhs else (*b, *k, *f)
    copy = ctx.temp(tuple(n for _, n in order), t.dtype)
    dram_copy(ctx.kb, copy, row_major(copy.shape), t, order)
    nb = len(b)
    axes = row_major(copy.shape)
    bb = axes[:nb]
    ff, kk = (axes[nb:nb + len(f)], axes[nb + len(f):]) if lhs else \
        (axes[nb + len(k):], axes[nb:nb + len(k)])
    return _operand(copy, bb, ff, kk, dtype)


# --- planning ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    nb: int                     # N columns per block (<= ACC_BANKS * 512)
    kb: int                     # K rows per block (multiple of 128, or all of K)
    r_depth: int                # buffers of the resident rhs block

    def blocks_k(self, k: int) -> list[tuple[int, int]]:
        return tiles(k, self.kb)


def _plan_bytes(lhs: Operand, rhs: Operand, out_dtype: str, nb: int, kb: int,
                depth: int) -> int:
    nk = -(-kb // P)
    li, ri = hw_dtypes.itemsize(lhs.dtype), hw_dtypes.itemsize(rhs.dtype)
    total = depth * nk * nb * ri + 2 * nk * P * li + 2 * nb * hw_dtypes.itemsize(out_dtype)
    total += 2 * kb * li if lhs.transposed else 0
    total += 2 * kb * ri if rhs.transposed else 0
    return total


def make_plan(lhs: Operand, rhs: Operand, out_dtype: str, batches: int,
              sbuf_bytes: int) -> Plan:
    """Block sizes that fit SBUF: all of K if possible, N blocks of <= 6 banks."""
    k, n = lhs.k[1], rhs.f[1]
    nb, kb = min(n, ACC_BANKS * MOVING_MAX), k
    budget = int(sbuf_bytes * SBUF_SHARE)
    depth = 1 if batches * -(-n // nb) == 1 else 2
    while _plan_bytes(lhs, rhs, out_dtype, nb, kb, depth) > budget:
        if nb > MOVING_MAX:
            nb = max(MOVING_MAX, nb // 2)
        elif kb > P:
            kb = max(P, (kb // 2) // P * P)
            depth = 2
        else:
            raise LoweringError("dot_general tiles do not fit in SBUF")
    return Plan(nb, kb, depth)


# --- emission ------------------------------------------------------------------------------

@dataclass
class KMajor:
    """Operand tiles with K on partitions: k-tile j is [kt, width] at j*stride."""
    base: isa.Tile
    stride: int

    def tile(self, j: int, kt: int, free: int, at: int = 0) -> isa.Tile:
        return sub(self.base, kt, free, at=j * self.stride + at)


class _DotEmitter:
    """Emits the loop nest of one canonical dot_general (see the module docstring)."""

    def __init__(self, kb: KernelBuilder, lhs: Operand, rhs: Operand, out: DramTensor,
                 plan: Plan):
        self.kb, self.lhs, self.rhs, self.out, self.plan = kb, lhs, rhs, out, plan
        self.m, self.k, self.n = lhs.f[1], lhs.k[1], rhs.f[1]
        nk = -(-min(self.k, plan.kb) // P)
        self.rbuf = kb.ring(plan.r_depth, nk * plan.nb, rhs.dtype)
        self.sbuf = kb.ring(2, nk * P, lhs.dtype)
        self.obuf = kb.ring(2, plan.nb, out.dtype)
        self.acc = kb.ring(ACC_BANKS, MOVING_MAX, "float32", mem="psum")
        self.stage = {id(op): kb.ring(2, min(self.k, plan.kb), op.dtype)
                      for op in (lhs, rhs) if op.transposed}
        self.tps = kb.ring(TRANSPOSE_BANKS, MOVING_MAX, "float32", mem="psum") \
            if self.stage else None

    def run(self) -> None:
        for index in itertools.product(*(range(n) for _, n in self.lhs.batch)):
            flat = sum(i * math.prod(n for _, n in self.lhs.batch[d + 1:])
                       for d, i in enumerate(index))
            for n0, nb in tiles(self.n, self.plan.nb):
                self._block(index, flat * self.m * self.n, n0, nb)
        self.kb.release(self.rbuf, self.sbuf, self.obuf, self.acc,
                        *([self.tps] if self.tps else []), *self.stage.values())

    def _block(self, index, out_base: int, n0: int, nb: int) -> None:
        kblocks = self.plan.blocks_k(self.k)
        resident = self._load_rhs(index, kblocks[0], n0, nb) if len(kblocks) == 1 else None
        for m0, mt in tiles(self.m, P):
            self._mtile(index, kblocks, resident, m0, mt, n0, nb, out_base)

    def _mtile(self, index, kblocks, resident, m0, mt, n0, nb, out_base) -> None:
        accs = [(c0, ct, sub(self.acc.next(), mt, ct)) for c0, ct in tiles(nb, MOVING_MAX)]
        for bi, (k0, kbs) in enumerate(kblocks):
            r = resident or self._load_rhs(index, (k0, kbs), n0, nb)
            s = self._load_lhs(index, (k0, kbs), m0, mt)
            for c0, ct, acc in accs:
                self._matmuls(acc, s, r, kbs, mt, c0, ct, first=bi == 0)
        otile = sub(self.obuf.next(), mt, nb)
        for c0, ct, acc in accs:
            self._evacuate(sub(otile, mt, ct, at=c0), acc)
        self._store(otile, out_base, m0, mt, n0, nb)

    def _matmuls(self, acc, s: KMajor, r: KMajor, kbs, mt, c0, ct, first: bool) -> None:
        for j, (_, kt) in enumerate(tiles(kbs, P)):
            self.kb.emit(isa.NcMatmul, dst=acc, stationary=s.tile(j, kt, mt),
                         moving=r.tile(j, kt, ct, at=c0), accumulate=not (first and j == 0))

    def _evacuate(self, dst: isa.Tile, acc: isa.Tile) -> None:
        self.kb.emit(isa.TensorCopy, dst=dst, src=acc, engine=self.kb.evac_engine())

    def _store(self, otile, out_base, m0, mt, n0, nb) -> None:
        ap = self.kb.ap(self.out, out_base + m0 * self.n + n0, ((self.n, mt), (1, nb)))
        self.kb.dma(ap, otile)

    # --- K-major loads -----------------------------------------------------------------------

    def _load_rhs(self, index, kblock, n0, nb) -> KMajor:
        dst = KMajor(self.rbuf.next(), nb)
        self._load(self.rhs, index, kblock, n0, nb, dst)
        return dst

    def _load_lhs(self, index, kblock, m0, mt) -> KMajor:
        dst = KMajor(self.sbuf.next(), mt)
        self._load(self.lhs, index, kblock, m0, mt, dst)
        return dst

    def _load(self, op: Operand, index, kblock, f0, fsize, dst: KMajor) -> None:
        base = op.batch_offset(index) + kblock[0] * op.k[0] + f0 * op.f[0]
        if op.transposed:
            return self._load_transposed(op, base, kblock[1], fsize, dst)
        for j, (k0, kt) in enumerate(tiles(kblock[1], P)):
            src = self.kb.ap(op.t, base + k0 * op.k[0], ((op.k[0], kt), (op.f[0], fsize)))
            self.kb.dma(dst.tile(j, kt, fsize), src)

    def _load_transposed(self, op: Operand, base, kbs, fsize, dst: KMajor) -> None:
        """Rows [fc, K] by DMA, then TensorE transposes to [kt, fc] via PSUM."""
        ring = self.stage[id(op)]
        for c0, fc in tiles(fsize, P):
            stage = sub(ring.next(), fc, kbs)
            src = self.kb.ap(op.t, base + c0 * op.f[0], ((op.f[0], fc), (op.k[0], kbs)))
            self.kb.dma(stage, src)
            for group in _groups_of(tiles(kbs, P), MOVING_MAX // fc):
                self._transpose_group(stage, group, fc, c0, dst)

    def _transpose_group(self, stage, group, fc, c0, dst: KMajor) -> None:
        bank = self.tps.next()
        kt = group[0][1][1]
        for g, (j, (k0, kt)) in enumerate(group):
            self.kb.emit(isa.NcTranspose, dst=sub(bank, kt, fc, at=g * fc),
                         data=sub(stage, fc, kt, at=k0))
        if dst.stride == fc:      # the group's k-tiles are adjacent in dst: one copy
            src = sub(bank, kt, len(group) * fc)
            self.kb.emit(isa.TensorCopy, dst=dst.tile(group[0][0], kt, len(group) * fc),
                         src=src, engine=self.kb.evac_engine())
            return
        for g, (j, _) in enumerate(group):
            self.kb.emit(isa.TensorCopy, dst=dst.tile(j, kt, fc, at=c0),
                         src=sub(bank, kt, fc, at=g * fc), engine=self.kb.evac_engine())


def _groups_of(ktiles: list[tuple[int, int]], size: int) -> list[list]:
    """Consecutive (j, (k0, kt)) runs of equal kt, at most `size` long."""
    out: list[list] = []
    for j, kt in enumerate(ktiles):
        if out and len(out[-1]) < size and out[-1][-1][1][1] == kt[1]:
            out[-1].append((j, kt))
        else:
            out.append([(j, kt)])
    return out


# --- the rule ---------------------------------------------------------------------------------

@register_lowering("dot_general")
def _dot_general_lower(ctx: LowerCtx, lhs: DramTensor, rhs: DramTensor, *,
                       lhs_batching_dimensions=(), rhs_batching_dimensions=(),
                       lhs_contracting_dimensions=(), rhs_contracting_dimensions=(),
                       precision_config=(), **_) -> None:
    out = ctx.outs[0]
    lb, lf, lc = _groups(lhs.shape, lhs_batching_dimensions, lhs_contracting_dimensions)
    rb, rf, rc = _groups(rhs.shape, rhs_batching_dimensions, rhs_contracting_dimensions)
    k = math.prod(n for _, n in lc)
    ctx.kb.flops += 2 * out.size * k
    if out.size == 0 or k == 0:
        return fill(ctx.kb, out, 0)
    ldt, rdt = operand_dtypes(lhs.dtype, rhs.dtype, precision_config, ctx.matmul_precision)
    lb, rb = merge_axes(lb, rb) if lb else ((), ())
    lop = _canonical(ctx, lhs, lb, lf, lc, ldt, lhs=True)
    rop = _canonical(ctx, rhs, rb, rf, rc, rdt, lhs=False)
    if lop.t is not lhs or rop.t is not rhs:
        ctx.next_kernel("dot")
    batches = math.prod(n for _, n in lop.batch)
    plan = make_plan(lop, rop, out.dtype, batches, ctx.limits.sbuf_bytes)
    _DotEmitter(ctx.kb, lop, rop, out, plan).run()
