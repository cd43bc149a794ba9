"""Lhs transposes on VectorE for cores without dma_transpose (NC-v2, §3.4).

A row-major lhs [M, K] must reach TensorE with K on partitions (§2.2). Without
dma_transpose it is transposed on TensorE (identity matmuls, §2.2), which takes TensorE
time from the matmuls: 128 cycles per 128x128 tile against 4 x 512 for the matmuls
that use it at N = 2048 (a ~94% cap). VectorE transposes 32x32 blocks in parallel with
TensorE (`nc_transpose(engine=vector)`, §2.3, §6.2); touching 32 partitions, each
block may land in any quadrant (§2.3: cross-quadrant moves are allowed at <= 32).

The contraction does not care which k sits on which partition, as long as the
stationary and the moving tiles of a matmul use the same map. With w elements per
32-bit word (2 for 16-bit types), k-tile j = w u + h holds on partition p

    k(j, p) = 128 w u + w p + h          (every w-th k of a 128 w run)

- The lhs rows of one 128-row tile load naturally (`staging_src`): partition l holds
  row l, all of K (one descriptor of K elements per row, 4 KiB at K = 2048 bf16: the
  full DMA rate, §3.4).
- VectorE transposes 32x32 blocks of 32-bit words (`vector_transposes`): word block
  b = 4 u + q (k from 32 w b) of row quadrant c lands on quadrant q, at word block u,
  column block c. A word holds w k-tiles, so the stationary of k-tile j is block u
  read with stride w from element h (`WordStrip.tile`; strides of 4 bytes read at full
  rate, §3.1). One VectorE instruction moves 32 x 32 words: 2048 bf16 per
  max(MIN_II, 32) = 64 cycles (§6.3).
- The rhs k-tile j loads every w-th row from 128 w u + h (`rhs_pattern`): whole rows,
  so its DMA runs are as long as before.
- A tile transposed on TensorE in the same kernel reads its natural rows through the
  same map (`pe_data`: stride w), so the rhs serves every row tile.

The map changes which k a matmul sums and the order PSUM accumulates them in (FP32):
results may differ from the TensorE path in the last bits (bf16 640 x 2048 x 2048 with
normal random inputs, against the quartered layout this replaced: 99.98% of the bf16
outputs equal, the others one ulp apart except where the sum cancels to ~1e-6 of the
row scale).
"""
from __future__ import annotations

from dataclasses import dataclass

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa

from .layout import Axes
from .matmul_plan import Operand, Plan
from .target import Target

WORD = 4                    # bytes of the VectorE transpose element (FP32 lanes, §2.3)


def word_elems(op: Operand) -> int:
    """Elements of `op`'s SBUF dtype per 32-bit word (w)."""
    return WORD // hw_dtypes.itemsize(op.dtype)


def applies(lhs: Operand, rhs: Operand, plan: Plan, target: Target, pairs: bool) -> bool:
    """Whether the lhs may be transposed on VectorE: a row-major lhs TensorE would
    transpose on a core without dma_transpose (where it has it, TensorE keeps the FP8
    operands dma_transpose cannot take), a K-major rhs whose rows can load in any
    order, all of K in one block of whole k-tiles of 32-bit words, row tiles of a full
    quadrant set (stationary_max == partitions). matmul_vector.py then decides whether
    VectorE keeps up."""
    size = hw_dtypes.itemsize(lhs.dtype)
    k = lhs.k[1]
    return (lhs.pe_transposed and not target.dma_transpose and not rhs.transposed
            and not pairs
            and size in (1, 2, 4) and plan.kb == k and not plan.sbuf_acc
            and target.stationary_max == target.partitions
            and k % (target.partitions * (WORD // size)) == 0)


@dataclass
class WordStrip:
    """A stationary strip written by `vector_transposes` (a `KMajor` for the matmuls):
    k-tile j = w u + h is word block u (w * stride elements) read with stride w from
    element h."""
    base: isa.Tile
    stride: int
    word: int

    def tile(self, j: int, kt: int, free: int, at: int = 0) -> isa.Tile:
        u, h = divmod(j, self.word)
        base = self.base
        offset = base.offset + (u * self.word * self.stride + h + self.word * at) \
            * hw_dtypes.itemsize(base.dtype)
        strides = (self.word,) if self.word > 1 else None
        return base.with_(num_partitions=kt, free=(free,), strides=strides, offset=offset)


@dataclass
class Split:
    """A stationary strip whose k-tiles before `first` TensorE transposes (`pe`, a
    `KMajor`: k-tile j at j * stride) and the rest VectorE (`vector`, `WordStrip`:
    word block u at u * w * stride, so the two never overlap when w divides `first`)."""
    pe: object
    vector: WordStrip
    first: int

    def tile(self, j: int, kt: int, free: int, at: int = 0) -> isa.Tile:
        return (self.pe if j < self.first else self.vector).tile(j, kt, free, at)


def _k0(j: int, w: int, target: Target) -> int:
    """k of partition 0 of k-tile j."""
    u, h = divmod(j, w)
    return target.partitions * w * u + h


def rhs_pattern(op: Operand, j: int, k: int, w: int, target: Target, fsize: int
                ) -> tuple[int, Axes]:
    """(element offset, pattern) of the rhs rows of k-tile j: every w-th row."""
    ks = op.k[0]
    return _k0(j, w, target) * ks, ((w * ks, target.partitions), (op.f[0], fsize))


def pe_data(rows: isa.Tile, j: int, k: int, w: int, target: Target) -> isa.Tile:
    """The natural rows [fc, K] of k-tile j (every w-th column), for a TensorE
    transpose."""
    offset = rows.offset + _k0(j, w, target) * hw_dtypes.itemsize(rows.dtype)
    return rows.with_(free=(target.partitions,), strides=(w,), offset=offset)


def staging_src(op: Operand, base: int, k: int, target: Target) -> tuple[int, Axes]:
    """(offset, pattern) of one row tile's natural load (from row offset `base`):
    partition l <- row l, all of K (one descriptor per row, §3.4)."""
    return base, ((op.f[0], target.stationary_max), (op.k[0], k))


def vector_transposes(stage: isa.Tile, dst: WordStrip, k: int, target: Target,
                      first: int = 0, stop: int | None = None) -> list[dict]:
    """The NcTranspose operands (engine="vector") turning a staged row tile into `dst`,
    k-tile pair by k-tile pair: word block b = quads u + q of row quadrant c moves to
    quadrant q at block u, column block c (a <= 32-partition transpose may write any
    quadrant, §2.3). K-tiles from `first` to `stop` (multiples of w; None: all)."""
    lanes, w = target.vector_transpose_max, dst.word
    quads, blocks = target.partitions // lanes, target.stationary_max // lanes
    block = lanes * w                           # elements per word block
    end = k // (quads * block) if stop is None else stop // w
    out = []
    for u in range(first // w, end):
        for q in range(quads):
            b = quads * u + q
            for c in range(blocks):
                src = _words(stage, c * lanes, lanes, b * block)
                dst_at = u * w * dst.stride + c * block
                out.append(dict(data=src, dst=_words(dst.base, q * lanes, lanes, dst_at)))
    return out


def _words(t: isa.Tile, p0: int, lanes: int, at: int) -> isa.Tile:
    """`lanes` partitions from `p0`, `lanes` 32-bit words from element `at`."""
    return t.with_(start_partition=t.start_partition + p0, num_partitions=lanes,
                   offset=t.offset + at * hw_dtypes.itemsize(t.dtype), free=(lanes,),
                   dtype="uint32", strides=None)
