"""DMA instructions (trainium-hardware.md §3.4, §6.2): copy, indirect gather, indirect
scatter (optionally read-modify-write add), transpose.

All of them run on a DMA queue ("dma<i>") and are priced by the DMA model, not in cycles.
For the timing model each exposes `nbytes` (bytes moved), `hbm_bytes` (bytes read from
plus written to DRAM) and `efficiency` (a factor on the achievable DMA rate, 1.0 for a
plain copy); DmaGather and DmaScatter also give `chunk_bytes` (one descriptor per row)
and `descriptor_engine` (their descriptors are generated at run time on GpSimd, swdge).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import costs as _costs
from . import dtypes as _dt
from . import semantics as _sem
from .isa_base import Instr
from .operands import DramAP, Operand, Tile, _check
from .spec import DMA_TRANSPOSE_EFFICIENCY

__all__ = ["DmaCopy", "DmaGather", "DmaScatter", "DmaTranspose"]

_INDEX_TYPES = ("int32", "uint32")
# §3.4 [NKI-ARCH2]: DMA transpose reaches up to 90% of DMA throughput HBM->SBUF, 50%
# SBUF->SBUF.
TRANSPOSE_EFFICIENCY = dict(DMA_TRANSPOSE_EFFICIENCY)


def _size(v: Operand) -> int:
    return v.size if isinstance(v, DramAP) else v.num_partitions * v.free_size


def _side(v, what: str) -> None:
    _check(isinstance(v, (Tile, DramAP)), f"DMA {what} must be a Tile or DramAP")
    _check(not isinstance(v, Tile) or v.mem == "sbuf",
           f"DMA {what} must be in SBUF or DRAM, not PSUM, §3.4")


@dataclass(frozen=True, kw_only=True)
class DmaCopy(Instr):
    dst: Operand
    src: Operand
    dma_queue: int = 0
    engine = "dma"
    semantics = _sem.dma_copy
    cycles = _costs.dma_copy        # 0: timed by the DMA model (costs.dma_shape)
    check = _costs.check_dma

    def __post_init__(self):
        _side(self.dst, "dst")
        _side(self.src, "src")
        _check(self.src_size == self.dst_size, f"DMA moves {self.src_size} elements "
               f"into {self.dst_size}")
        _check(self.dma_queue >= 0, f"bad DMA queue {self.dma_queue}")
        mx = _dt.is_mx(self.src.dtype) or _dt.is_mx(self.dst.dtype)
        _check(not mx or self.src.dtype == self.dst.dtype, f"DMA cannot cast MX type "
               f"{self.src.dtype} -> {self.dst.dtype}, §3.4")

    @property
    def queue(self) -> str:
        return f"dma{self.dma_queue}"

    @property
    def src_size(self) -> int:
        return _size(self.src)

    @property
    def dst_size(self) -> int:
        return _size(self.dst)

    @property
    def nbytes(self) -> int:
        """Bytes moved (the wider side, when the DMA casts)."""
        return max(self.src.nbytes, self.dst.nbytes)

    @property
    def hbm_bytes(self) -> int:
        """Bytes read from plus written to DRAM."""
        return sum(v.nbytes for v in (self.src, self.dst) if isinstance(v, DramAP))

    @property
    def efficiency(self) -> float:
        """Factor on the DMA rate beyond the per-descriptor efficiency (1.0: none)."""
        return 1.0


@dataclass(frozen=True, kw_only=True)
class DmaGather(DmaCopy):
    """Indirect DMA (`dma_copy` with `.ap(vector_offset=...)`, §6.2): row `indices[p, j]`
    of the DRAM table `src` (first pattern pair: rows; the rest: one row) lands in
    partition p, slot j of `dst`, cast through FP32 like DmaCopy. Software DGE only:
    descriptors are generated at run time on GpSimd (§3.4). An index outside the table
    raises IsaError (`oob_mode="error"`) or leaves that slot of `dst` unchanged
    (`"skip"`)."""
    indices: Tile                  # int32/uint32 [P, n] in SBUF
    oob_mode: str = "error"        # "error" | "skip", §6.2 `oob_mode`
    dge_mode = "swdge"             # §3.4: the only mode with indirect gather
    descriptor_engine = "gpsimd"
    semantics = _sem.dma_gather
    cycles = _costs.dma_copy
    check = _costs.check_dma

    def __post_init__(self):
        _check(isinstance(self.src, DramAP), "gather src must be a DRAM table (DramAP)")
        _check(isinstance(self.dst, Tile) and self.dst.mem == "sbuf",
               "gather dst must be an SBUF tile, §3.4")
        _check(self.dma_queue >= 0, f"bad DMA queue {self.dma_queue}")
        _check(self.oob_mode in ("error", "skip"), f"bad oob_mode {self.oob_mode!r}")
        idx = self.indices
        _check(isinstance(idx, Tile) and idx.mem == "sbuf", "gather indices must be an "
               "SBUF tile")
        _check(idx.dtype in _INDEX_TYPES, f"gather indices must be int32/uint32, not "
               f"{idx.dtype}")
        _check(idx.num_partitions == self.dst.num_partitions, f"indices {idx.shape} and "
               f"dst {self.dst.shape} differ in partitions")
        _check(len(self.src.pattern) >= 2, "gather src pattern needs a row dimension "
               "and a row")
        _check(self.dst.free_size == idx.free_size * self.row_size, f"dst {self.dst.shape}"
               f" cannot hold {idx.free_size} rows of {self.row_size} per partition")
        _check(not _dt.is_mx(self.src.dtype) or self.src.dtype == self.dst.dtype,
               "DMA cannot cast MX types, §3.4")

    @property
    def rows(self) -> int:
        return self.src.pattern[0][1]

    @property
    def row_size(self) -> int:
        return self.src.size // self.rows

    @property
    def src_size(self) -> int:
        return self.dst.num_partitions * self.indices.free_size * self.row_size

    @property
    def nbytes(self) -> int:
        return max(self.src_size * _dt.itemsize(self.src.dtype), self.dst.nbytes)

    @property
    def hbm_bytes(self) -> int:
        return self.src_size * _dt.itemsize(self.src.dtype)

    @property
    def chunk_bytes(self) -> int:
        """One descriptor per gathered row (§3.4: each buffer is contiguous)."""
        return self.row_size * _dt.itemsize(self.src.dtype)


@dataclass(frozen=True, kw_only=True)
class DmaScatter(DmaCopy):
    """Indirect DMA write (`dma_copy` with the `vector_offset` on dst, §6.2; with
    `dst_rmw_op=add` / `dma_compute` scatter RMW, §3.4): partition p, slot j of the SBUF
    tile `src` goes to row `indices[p, j]` of the DRAM table `dst` (first pattern pair:
    rows; the rest: one row). `rmw_op=None` overwrites the row (cast through FP32 like
    DmaCopy); `rmw_op="add"` reads the row, adds in FP32 and writes it back cast to the
    table's dtype (the DMA engines compute in FP32, so integer tables are exact only
    while values stay below 2^24). Rows are applied in index order, p-major then j: a
    row named twice takes the last write, or both adds in that order, each rounded to
    the table's dtype (NKI serialises duplicate offsets, `unique_indices=False`). An
    index outside the table raises IsaError (`oob_mode="error"`) or is dropped
    (`"skip"`). Software DGE only (§3.4)."""
    indices: Tile                  # int32/uint32 [P, n] in SBUF
    rmw_op: str | None = None      # None (overwrite) | "add", §6.2 `dst_rmw_op`
    oob_mode: str = "error"        # "error" | "skip", §6.2 `oob_mode`
    dge_mode = "swdge"             # §3.4: the only mode with indirect scatter
    descriptor_engine = "gpsimd"
    semantics = _sem.dma_scatter
    cycles = _costs.dma_copy
    check = _costs.check_dma

    def __post_init__(self):
        _check(isinstance(self.dst, DramAP), "scatter dst must be a DRAM table (DramAP)")
        _check(isinstance(self.src, Tile) and self.src.mem == "sbuf",
               "scatter src must be an SBUF tile, §3.4")
        _check(self.dma_queue >= 0, f"bad DMA queue {self.dma_queue}")
        _check(self.oob_mode in ("error", "skip"), f"bad oob_mode {self.oob_mode!r}")
        _check(self.rmw_op in (None, "add"), f"DMA read-modify-write supports only add, "
               f"not {self.rmw_op!r}, §6.2")
        idx = self.indices
        _check(isinstance(idx, Tile) and idx.mem == "sbuf", "scatter indices must be an "
               "SBUF tile")
        _check(idx.dtype in _INDEX_TYPES, f"scatter indices must be int32/uint32, not "
               f"{idx.dtype}")
        _check(idx.num_partitions == self.src.num_partitions, f"indices {idx.shape} and "
               f"src {self.src.shape} differ in partitions")
        _check(len(self.dst.pattern) >= 2, "scatter dst pattern needs a row dimension "
               "and a row")
        _check(self.src.free_size == idx.free_size * self.row_size, f"src {self.src.shape}"
               f" does not hold {idx.free_size} rows of {self.row_size} per partition")
        _check(not (_dt.is_mx(self.src.dtype) or _dt.is_mx(self.dst.dtype))
               or self.src.dtype == self.dst.dtype, "DMA cannot cast MX types, §3.4")
        _check(self.rmw_op is None or not _dt.is_mx(self.dst.dtype),
               "DMA read-modify-write cannot add MX types, §3.4")

    @property
    def rows(self) -> int:
        return self.dst.pattern[0][1]

    @property
    def row_size(self) -> int:
        return self.dst.size // self.rows

    @property
    def dst_size(self) -> int:
        return self.src.num_partitions * self.indices.free_size * self.row_size

    @property
    def nbytes(self) -> int:
        return max(self.dst_size * _dt.itemsize(self.dst.dtype), self.src.nbytes)

    @property
    def hbm_bytes(self) -> int:
        """The rows written, plus the rows read back for a read-modify-write."""
        return self.dst_size * _dt.itemsize(self.dst.dtype) * (2 if self.rmw_op else 1)

    @property
    def chunk_bytes(self) -> int:
        """One descriptor per scattered row (§3.4: each buffer is contiguous)."""
        return self.row_size * _dt.itemsize(self.dst.dtype)


@dataclass(frozen=True, kw_only=True)
class DmaTranspose(DmaCopy):
    """`dma_transpose` (§3.4, §6.2; Trn2+): dst[B, A] = src[A, B] for a 2-D `src` (a
    DramAP of two pattern pairs, or an SBUF tile with its free axes flattened) into an
    SBUF tile, bit-exact, 2- or 4-byte types. `efficiency`: up to 90% of DMA
    throughput from DRAM, 50% SBUF->SBUF."""
    semantics = _sem.dma_transpose
    cycles = _costs.dma_copy

    def __post_init__(self):
        super().__post_init__()
        src, dst = self.src, self.dst
        _check(isinstance(dst, Tile), "dma_transpose dst must be an SBUF tile, §6.2")
        _check(src.dtype == dst.dtype and _dt.itemsize(src.dtype) in (2, 4)
               and not _dt.is_mx(src.dtype), f"dma_transpose is bit-exact on 2- or "
               f"4-byte types only, got {src.dtype} -> {dst.dtype}, §3.4")
        if isinstance(src, DramAP):
            _check(len(src.pattern) == 2, f"dma_transpose src pattern must be 2-D, got "
                   f"{src.pattern}")
        a, b = self.src_shape
        _check(dst.num_partitions == b and dst.free_size == a,
               f"transpose of [{a}, {b}] cannot be written to {dst.shape}")

    @property
    def src_shape(self) -> tuple[int, int]:
        if isinstance(self.src, Tile):
            return self.src.num_partitions, self.src.free_size
        return self.src.shape

    @property
    def efficiency(self) -> float:
        return TRANSPOSE_EFFICIENCY["sbuf" if isinstance(self.src, Tile) else "dram"]

    @property
    def chunk_bytes(self) -> float:
        """The transpose engine moves whole blocks: its rate is `efficiency` of the DMA
        rate (§3.4), not limited by element-sized descriptors."""
        return float("inf")

    def check(self, spec) -> None:
        _costs.check_dma(self, spec)
        _check(spec.dma_transpose, f"dma_transpose needs NC-v3+, not "
               f"{spec.name}, §3.4")
