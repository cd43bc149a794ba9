"""TensorE instructions (trainium-hardware.md §2.2, §6.2): matmul, MX matmul, transpose.

NcMatmul's and NcTranspose's costs and generation checks are in costs.py; NcMatmulMx
carries its own. Each names the operand LoadStationary puts in the PE array
(`pe_weights`) and its LoadStationary cost (`load_cycles`), for tensor_pipe.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import costs as _costs
from . import dtypes as _dt
from . import mx as _mx
from . import semantics as _sem
from . import semantics_mx as _sem_mx
from .isa_base import Instr, _engine, _tile
from .operands import Tile, _check
from .spec import MX_MOVING_MAX, PARTITION_QUADRANT, PMAX, VECTOR_TRANSPOSE_MAX

__all__ = ["NcMatmul", "NcMatmulMx", "NcTranspose"]

_MATMUL_DTYPES = ("float8_e4m3", "float8_e5m2", "float8_e4m3fn", "bfloat16", "float16",
                  "float32")


@dataclass(frozen=True, kw_only=True)
class NcMatmul(Instr):
    dst: Tile
    stationary: Tile
    moving: Tile
    accumulate: bool = False      # False: overwrite the PSUM region; True: add into it
    perf_mode: str = "none"       # "none" | "double_row" (v3+ FP8)
    precision: str = "native"     # "native" | "tf32": round FP32 operands to TF32 first
    engine = "tensor"
    matmul_output = True
    pe_weights = "stationary"
    semantics = _sem.nc_matmul
    cycles = _costs.nc_matmul
    load_cycles = _costs.matmul_load
    check = _costs.check_matmul

    def __post_init__(self):
        st, mv, dst = self.stationary, self.moving, self.dst
        _tile(st, "stationary", "tensor", "sbuf")
        _tile(mv, "moving", "tensor", "sbuf")
        _tile(dst, "dst", "tensor", "psum")
        _check(st.num_partitions == mv.num_partitions, f"contraction (partition) sizes "
               f"differ: stationary {st.shape}, moving {mv.shape}")
        _check(st.dtype in _MATMUL_DTYPES and mv.dtype in _MATMUL_DTYPES,
               f"TensorE takes float inputs only, got {st.dtype} x {mv.dtype}, §2.2")
        _check((st.dtype == "float32") == (mv.dtype == "float32"),
               f"if one matmul operand is FP32/TF32 the other must be too, §2.2 "
               f"({st.dtype} x {mv.dtype})")
        _check(self.precision in ("native", "tf32"), f"bad precision {self.precision!r}")
        _check(self.precision == "native" or st.dtype == "float32",
               "precision='tf32' needs FP32 operands")
        self._check_mode()
        _check(self.m <= PMAX, f"stationary free size {self.m} > {PMAX}, §2.2")
        _check(dst.num_partitions == self.m and dst.free_size == self.n,
               f"dst {dst.shape} is not [{self.m}, {self.n}]")
        _check(dst.dtype in ("float32", "bfloat16"), f"matmul dst must be FP32 (v4: or "
               f"BF16), got {dst.dtype}, §2.2")

    def _check_mode(self) -> None:
        st, mv = self.stationary, self.moving
        _check(self.perf_mode in ("none", "double_row"), f"bad perf_mode {self.perf_mode!r}")
        if self.perf_mode == "double_row":
            _check(st.dtype.startswith("float8") and mv.dtype.startswith("float8"),
                   "double_row needs FP8 operands, §2.2")
            _check(st.free[0] == 2 and mv.free[0] == 2, "double_row operands are "
                   "[K, 2, M] and [K, 2, N], §2.2")

    @property
    def rows(self) -> int:
        """Contraction length: partitions, x2 in double_row mode."""
        return self.stationary.num_partitions * (2 if self.perf_mode == "double_row" else 1)

    @property
    def m(self) -> int:
        return self.stationary.free_size // (2 if self.perf_mode == "double_row" else 1)

    @property
    def n(self) -> int:
        return self.moving.free_size // (2 if self.perf_mode == "double_row" else 1)

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.m * self.n


_MX_DATA = tuple(_dt.PACKED)
_MX_MOVING_MAX = dict(MX_MOVING_MAX)


@dataclass(frozen=True, kw_only=True)
class NcMatmulMx(Instr):
    """`nc_matmul_mx` (§2.2, v4): dst[M, N] (+)= A.T @ B over K = 4 x partitions, where
    A[(p, i), m] = stationary[p, m][i] x scale and B likewise from moving: x4-packed
    MXFP8/MXFP4 data (dtypes.py), one E8M0 scale per group of 8 partitions x 4 packed
    values, in the scale layout of mx.py. MXFP8 and MXFP4 may mix. FP32 accumulation;
    dst FP32 or BF16 (rounded at the write)."""
    dst: Tile
    stationary: Tile
    moving: Tile
    stationary_scale: Tile
    moving_scale: Tile
    accumulate: bool = False
    engine = "tensor"
    matmul_output = True
    pe_weights = "stationary"
    semantics = _sem_mx.nc_matmul_mx
    load_cycles = _costs.matmul_load

    def __post_init__(self):
        st, mv, dst = self.stationary, self.moving, self.dst
        for what, t in (("stationary", st), ("moving", mv)):
            _tile(t, what, "tensor", "sbuf", mx=True)
            _check(t.dtype in _MX_DATA, f"nc_matmul_mx {what} must be one of "
                   f"{', '.join(_MX_DATA)}, got {t.dtype}, §2.2")
        _tile(dst, "dst", "tensor", "psum")
        p = st.num_partitions
        _check(p == mv.num_partitions and p % PARTITION_QUADRANT == 0, f"nc_matmul_mx "
               f"partitions must be equal multiples of {PARTITION_QUADRANT}: {st.shape} x "
               f"{mv.shape}, §6.2")
        _check(self.m <= PMAX and self.m % 2 == 0, f"nc_matmul_mx stationary free size "
               f"{self.m} must be even and <= {PMAX}, §6.2")
        _check(dst.dtype in _MX_MOVING_MAX, f"matmul dst must be FP32 or BF16, got "
               f"{dst.dtype}, §2.2")
        limit = _MX_MOVING_MAX[dst.dtype]
        _check(self.n <= limit, f"nc_matmul_mx moving free size {self.n} > {limit} "
               f"for a {dst.dtype} dst, §2.2")
        _check(dst.num_partitions == self.m and dst.free_size == self.n,
               f"dst {dst.shape} is not [{self.m}, {self.n}]")
        self._check_scale("stationary_scale", st)
        self._check_scale("moving_scale", mv)

    def _check_scale(self, what: str, data: Tile) -> None:
        s = getattr(self, what)
        _tile(s, what, "tensor", "sbuf")
        _check(s.dtype in _dt.MX_SCALE_TYPES, f"{what} must be uint8/float8_e8m0fnu "
               f"(E8M0), got {s.dtype}, §2.2")
        rows = _mx.scale_partitions(data.num_partitions)
        _check(s.num_partitions == rows and s.free_size == data.free_size
               and s.start_partition == data.start_partition, f"{what} {s.shape} at "
               f"partition {s.start_partition} does not fit data {data.shape} at "
               f"{data.start_partition} ([{rows}, {data.free_size}], same quadrants)")

    @property
    def rows(self) -> int:
        """Contraction length: 4 packed values per partition."""
        return 4 * self.stationary.num_partitions

    @property
    def m(self) -> int:
        return self.stationary.free_size

    @property
    def n(self) -> int:
        return self.moving.free_size

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.m * self.n

    def cycles(self, spec) -> float:
        """As a BF16 matmul, max(min(64, M), N) (§6.3), for 4x the rows: each PE does
        4 MACs per cycle, so MX runs at `mx_speedup` (4) x the BF16 rate (§2.2)."""
        cycles = max(min(spec.mm_init_latency, self.m), self.n)
        return float(cycles * 4 / max(spec.mx_speedup, 1))

    def check(self, spec) -> None:
        _check(spec.mx_speedup > 1, f"nc_matmul_mx needs NC-v4, not {spec.name}, §2.2")
        _check(self.dst.dtype != "bfloat16" or spec.psum_bf16, f"BF16 matmul dst needs "
               f"NC-v4, not {spec.name}, §2.2")
        _costs.check_psum_banks(self, spec)


@dataclass(frozen=True, kw_only=True)
class NcTranspose(Instr):
    """dst[F, P] = data[P, F]: on TensorE an identity matmul into PSUM (<= 128 x 128,
    §2.2); on VectorE one 32-partition bank's transpose (<= 32 x 32, §2.3, §6.2).
    A VectorE transpose touches <= 32 partitions per side, so by §2.3 it may read one
    quadrant and write another (cross-quadrant moves are allowed at <= 32 partitions;
    only instructions over 64 partitions keep data on its partitions): the 32 limit
    and the quadrant alignment of `_tile` (§3.1) are the whole check."""
    dst: Tile
    data: Tile
    engine: str = "tensor"
    pe_weights = "data"           # an identity matmul: the data is the stationary, §2.2
    semantics = _sem.nc_transpose
    cycles = _costs.nc_transpose
    load_cycles = _costs.transpose_load

    def __post_init__(self):
        _engine(self, ("tensor", "vector"))
        d, dst = self.data, self.dst
        _tile(d, "data", self.engine, "sbuf" if self.engine == "tensor" else None)
        _tile(dst, "dst", self.engine, "psum" if self.engine == "tensor" else None)
        limit = PMAX if self.engine == "tensor" else VECTOR_TRANSPOSE_MAX   # §6.2
        _check(d.num_partitions <= limit and d.free_size <= limit,
               f"{self.engine} transpose is limited to {limit}x{limit}, got {d.shape}")
        _check(dst.num_partitions == d.free_size and dst.free_size == d.num_partitions,
               f"transpose of {d.shape} cannot be written to {dst.shape}")

    @property
    def matmul_output(self) -> bool:
        """TensorE transposes are identity matmuls (§2.2)."""
        return self.engine == "tensor"
