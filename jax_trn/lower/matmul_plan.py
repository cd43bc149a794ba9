"""Planning one canonical matmul (matmul.py): its operands as they sit in DRAM, and the
plan -- resident rows, K blocks, column group -- that fits SBUF with the least DMA
cost (bytes over descriptor efficiency, §3.4); the generation's choices: operands
transposed by dma_transpose (v3+, §3.4), FP8 in double_row mode (v3+, §2.2).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw.program import DramTensor

from .errors import LoweringError
from .layout import Axes
from .target import Target

GROUP_COLS = (1024, 512)    # N columns accumulated together, widest first: 1024 bf16
                            # columns load 2 KiB per partition per DMA (§3.4: the
                            # recommended minimum; 512 columns run at ~42% efficiency)
LOOKAHEAD = 1               # strips whose loads are in flight ahead of their use
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


@dataclass(frozen=True)
class Plan:
    mb: int                     # M rows whose stationary strips stay resident
    kb: int                     # K rows per block (all of K unless it is too deep)
    group: int                  # N columns accumulated together
    sbuf_acc: bool = False      # K blocks summed into FP32 accumulators in SBUF for every
                                # row tile (each operand read once per column group)


def _plan_bytes(lhs: Operand, rhs: Operand, out_dtype: str, plan: Plan, k: int,
                target: Target) -> int:
    nk, mt = -(-plan.kb // target.partitions), target.stationary_max
    li, ri = hw_dtypes.itemsize(lhs.dtype), hw_dtypes.itemsize(rhs.dtype)
    strips = -(-plan.mb // mt) if plan.kb == k else 2
    total = strips * nk * mt * li + 2 * nk * plan.group * ri
    total += 2 * plan.group * hw_dtypes.itemsize(out_dtype)
    if plan.sbuf_acc:           # the FP32 sums of every row tile's column group
        total += 4 * -(-lhs.f[1] // mt) * plan.group
    total += sum((LOOKAHEAD + 1) * plan.kb * hw_dtypes.itemsize(op.dtype)
                 for op in (lhs, rhs) if op.pe_transposed)
    return total


def _candidates(m: int, k: int, n: int, target: Target):
    """Plans from best to worst: all of K with as many resident rows as possible, for
    each column group from the widest (longer DMA rows, §3.4) down; then K blocks of
    decreasing depth with the narrowest group. Rows go in whole row tiles (stationary
    tiles), K blocks in whole k-tiles (partitions)."""
    mt, kt = target.stationary_max, target.partitions
    for group in dict.fromkeys(min(n, g) for g in GROUP_COLS):
        mb = m
        while True:
            yield Plan(mb, k, group)
            if mb <= mt:
                break
            mb = max(mt, -(-mb // 2 // mt) * mt)
    kb, group = k, min(n, GROUP_COLS[-1])
    while kb > kt:
        kb = max(kt, (kb // 2) // kt * kt)
        yield Plan(mt, kb, group)


def with_dma_transpose(op: Operand, target: Target, pairs: bool = False) -> Operand:
    """`op`, transposed by dma_transpose if the core has it (v3+) and the load needs no
    cast: the transpose is bit-exact on 2- and 4-byte types only (§3.4). An FP8 lhs of
    a double_row matmul (`pairs`) goes as 16-bit pairs of K (`pair_transposable`);
    other FP8 operands stay on TensorE (through SBUF -- rows DMA-cast to 16 bits,
    SBUF->SBUF dma_transpose at 50% of the DMA rate, cast back -- the first column
    group became DMA-bound: 1037 vs 969 us at 4096^3 fp8 on trn2)."""
    size = hw_dtypes.itemsize(op.dtype)
    ok = (op.transposed and target.dma_transpose and op.t.dtype == op.dtype
          and (size in (2, 4) or pairs and pair_transposable(op, target)))
    return dataclasses.replace(op, via_dma=True) if ok else op


def pair_transposable(op: Operand, target: Target) -> bool:
    """A row-major 1-byte operand viewed as 16-bit words (NKI `view(dtype)`, §6.1):
    whole 256-row blocks of a contiguous K, and every offset a whole word."""
    return (hw_dtypes.itemsize(op.dtype) == 1 and op.k[0] == 1
            and op.k[1] % (2 * target.partitions) == 0
            and op.f[0] % 2 == 0 and all(st % 2 == 0 for st, _ in op.batch))


def interleaved(lhs: Operand, pairs: bool) -> bool:
    """double_row with the lhs transposed as 16-bit pairs (see the module docstring)."""
    return pairs and lhs.via_dma and hw_dtypes.itemsize(lhs.dtype) == 1


def double_row(lhs: Operand, rhs: Operand, precision: str, target: Target) -> bool:
    """FP8 x FP8 in double_row mode (v3+, §2.2): K = 256 per matmul at the BF16 cycle
    count, each operand a [P, 2, F] view of two k-tiles (`KMajor.pair`)."""
    return (target.fp8_double_row and precision == "native"
            and all(op.dtype.startswith("float8") for op in (lhs, rhs)))


def _dma_cost(lhs: Operand, rhs: Operand, out_dtype: str, plan: Plan, target: Target
              ) -> float:
    """Bytes the plan moves over their DMA efficiency (§3.4: per-descriptor size; 90%
    for dma_transpose): what the plan choice minimises among those that fit."""
    m, k, n = lhs.f[1], lhs.k[1], rhs.f[1]
    eff, mt = target.core.dma_efficiency, target.stationary_max

    def load(op: Operand, width: int) -> float:
        if op.via_dma:
            return 0.9
        if op.pe_transposed:
            return eff(plan.kb * hw_dtypes.itemsize(op.dtype))
        return eff(width * hw_dtypes.itemsize(op.t.dtype))
    reloads = -(-m // plan.mb) if plan.kb == k else -(-m // mt)
    # SBUF sums, or one column group: the rhs is loaded once (matmul.py `_rhs`)
    reloads = 1 if plan.sbuf_acc or (plan.kb == k and n <= plan.group) else reloads
    cost = m * k * hw_dtypes.itemsize(lhs.t.dtype) / load(lhs, min(m, mt))
    cost *= 1 if plan.kb == k else -(-n // plan.group)
    cost += reloads * k * n * hw_dtypes.itemsize(rhs.t.dtype) / load(rhs, plan.group)
    return cost + m * n * hw_dtypes.itemsize(out_dtype) / eff(
        plan.group * hw_dtypes.itemsize(out_dtype))


def _sbuf_acc_candidates(m: int, k: int, n: int, target: Target):
    """K blocks of 8 k-tiles down to 1 (long blocks: fewer SBUF additions), for each
    column group, with the sums of all M rows in SBUF (`Plan.sbuf_acc`)."""
    kt = target.partitions
    for group in dict.fromkeys(min(n, g) for g in GROUP_COLS):
        for depth in (8, 4, 2, 1):
            if depth * kt < k:
                yield Plan(target.stationary_max, depth * kt, group, sbuf_acc=True)


def make_plan(lhs: Operand, rhs: Operand, out_dtype: str, sbuf_bytes: int, target: Target,
              reserved: int = 0, sbuf_acc: bool = False) -> Plan:
    """The plan that fits the SBUF share of a matmul kernel (of `sbuf_bytes` free per
    partition, after `reserved` bytes per partition: a fused epilogue's buffers) with
    the least DMA cost on `target`; K blocks only when all of K fits nowhere. Then, if
    `sbuf_acc` (no fused epilogue: it reads PSUM), the K blocks may sum in SBUF instead
    of PSUM when that moves fewer bytes: PSUM holds a few row tiles' sums, so the
    bunched plan reads the rhs once per bunch (a vocabulary gradient [4092, 32000] x
    [32000, 1024] bf16 moved 860 MB, DMA-bound at 4.8 ms on trn2)."""
    budget = int(sbuf_bytes * SBUF_SHARE) - reserved
    k = lhs.k[1]
    fits = [p for p in _candidates(lhs.f[1], k, rhs.f[1], target)
            if _plan_bytes(lhs, rhs, out_dtype, p, k, target) <= budget]
    whole = [p for p in fits if p.kb == k]
    if whole:
        return min(whole, key=lambda p: _dma_cost(lhs, rhs, out_dtype, p, target))
    acc = [p for p in _sbuf_acc_candidates(lhs.f[1], k, rhs.f[1], target)
           if _plan_bytes(lhs, rhs, out_dtype, p, k, target) <= budget] if sbuf_acc else []
    if fits or acc:
        return min(fits[:1] + acc, key=lambda p: _dma_cost(lhs, rhs, out_dtype, p, target))
    raise LoweringError("dot_general tiles do not fit in SBUF")
