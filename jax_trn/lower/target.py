"""What the compiler may assume about one NeuronCore: the `Target`.

The code generator reads hardware limits and features from a `Target` and keeps no
copies of hardware constants. A Target is derived from the model's `CoreSpec`
(`jax_trn/hw/spec.py`, trainium-hardware.md §1-§3), typed and frozen, so a rule reads
`ctx.target.psum_banks` instead of guessing at spec fields:

    target = Target.of(CHIPS["trn2"].core)      # cached: one Target per CoreSpec
    target.partitions, target.moving_max        # 128, 512 (4096 on NeuronCore-v4)

Tile sizes the compiler chooses (elements per elementwise tile, column groups, ring
depths) are compiler choices and stay named constants in their modules; the limits
they must respect come from here.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

from jax_trn.hw.spec import ACTIVATION_RANGES, ChipSpec, CoreSpec

FP32_BYTES = 4      # PSUM accumulates in FP32 (§2.2, §3.2)


@dataclass(frozen=True)
class Target:
    """Limits and features of one NeuronCore generation, as codegen needs them."""
    name: str                   # "NeuronCore-v3"
    generation: str             # "trn1" | "trn2" | "trn3": selects per-generation rules
    # Geometry (§2.2, §3.1-§3.3).
    partitions: int             # SBUF/PSUM partitions = PE rows = contraction tile
    stationary_max: int         # nc_matmul stationary free size (PE columns)
    moving_max: int             # nc_matmul moving free size, FP32 dst (v4: 4096)
    psum_banks: int             # accumulation groups in flight (8)
    psum_bank_bytes: int        # bytes per partition of one bank (2 KiB)
    psum_bytes: int             # PSUM bytes per partition (16 KiB)
    sbuf_bytes: int             # SBUF bytes per partition a kernel may allocate
    vector_transpose_max: int   # VectorE transpose block (32 x 32), §2.3
    # DMA (§3.4).
    dma_engines: int            # DMA engines per core
    dma_queues: int             # queue IDs a DMA instruction may use
    # Features (§2.2-§2.4, §3.2, §3.4): what lowering checks before using an instruction.
    matmul_spans_banks: bool    # v4: one matmul may write several PSUM banks
    transpose_mode: bool        # v3+: bit-exact `is_transpose` matmul
    dma_transpose: bool         # v3+: DmaTranspose (2- and 4-byte types)
    psum_bf16: bool             # v4: BF16 data and matmul dst in PSUM
    fp8_double_row: bool        # v3+: FP8 double_row matmuls (K = 256 per matmul)
    ocp_fp8: bool               # v4: float8_e4m3fn matmul inputs
    mx_matmul: bool             # v4: nc_matmul_mx (MXFP8 / MXFP4)
    psum_accumulate_any: bool   # v4: accumulate onto PSUM data a non-matmul wrote
    vector_exponential: bool    # v4: VectorE `exponential`
    quantize_mx: bool           # v4: VectorE `quantize_mx`
    # The CoreSpec itself, for the cost model's estimates only (spread.py, the matmul
    # plan's DMA cost): limits and features are read from the fields above.
    core: CoreSpec = field(repr=False, compare=False)

    @staticmethod
    def of(spec: CoreSpec | ChipSpec | Target) -> Target:
        """The Target of a core (a chip's core for a ChipSpec); the same object for
        equal specs."""
        if isinstance(spec, Target):
            return spec
        if isinstance(spec, ChipSpec):
            spec = spec.core
        if not isinstance(spec, CoreSpec):
            raise TypeError(f"a Target is made from a CoreSpec or a ChipSpec, not "
                            f"{type(spec).__name__}")
        return _target_of(spec)

    @staticmethod
    def activation_range(func: str) -> tuple[float, float, bool] | None:
        """ScalarE's valid inputs of `func`: (low, high, on |x|), bounds inclusive; None
        for a function valid everywhere. ISA-wide, the same on every generation (§2.4)."""
        return _RANGES.get(func)

    @property
    def psum_bank_fp32(self) -> int:
        """FP32 elements per partition of one PSUM bank (512): the moving free size of
        a matmul that stays in one bank (§2.2, §3.2)."""
        return self.psum_bank_bytes // FP32_BYTES


_RANGES = dict(ACTIVATION_RANGES)


@functools.lru_cache(maxsize=None)
def _target_of(core: CoreSpec) -> Target:
    target = _derive(core)
    _check_supported(target)
    return target


def _check_supported(t: Target) -> None:
    """What the code generator assumes of every core, said once: a square PE array (a
    TensorE transpose swaps partitions and PE columns, §2.2) and matmuls that may fill
    at least one PSUM bank (§2.2, §3.2)."""
    if t.stationary_max != t.partitions:
        raise ValueError(f"{t.name}: {t.stationary_max} PE columns for {t.partitions} "
                         f"partitions; lowering assumes a square PE array")
    if t.moving_max < t.psum_bank_fp32 or t.psum_bytes != t.psum_banks * t.psum_bank_bytes:
        raise ValueError(f"{t.name}: a matmul cannot fill a PSUM bank of "
                         f"{t.psum_bank_fp32} FP32 (moving free <= {t.moving_max})")


def _derive(core: CoreSpec) -> Target:
    return Target(
        name=core.name, generation=core.generation,
        partitions=core.pmax, stationary_max=core.pe_cols,
        moving_max=core.max_moving_free, psum_banks=core.psum_banks,
        psum_bank_bytes=core.psum_bank_bytes, psum_bytes=core.psum_partition_bytes,
        sbuf_bytes=core.sbuf_usable_bytes,
        vector_transpose_max=core.vector_transpose_max,
        dma_engines=core.dma_engines, dma_queues=core.dma_queues,
        matmul_spans_banks=core.matmul_spans_banks, transpose_mode=core.transpose_mode,
        dma_transpose=core.dma_transpose, psum_bf16=core.psum_bf16,
        fp8_double_row=core.fp8_double_row > 1, ocp_fp8=core.ocp_fp8,
        mx_matmul=core.mx_speedup > 1, psum_accumulate_any=core.psum_accumulate_any,
        vector_exponential=core.vector_exponential > 0,
        quantize_mx=core.quantize_mx > 0, core=core)
