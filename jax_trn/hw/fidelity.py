"""The model against the published figures (trainium-hardware.md §1.2, §2, §3.4, §9).

Each `Row` is one published number and a measurement that reproduces it on the
simulated hardware, built directly from hw instructions on `NeuronCore`s (no JAX):
long chains of back-to-back instructions for rates, DMAs for bandwidths.
`table()` measures every row; `benchmarks/fidelity.py` prints it and
`tests/sim/test_fidelity.py` fails when a row drifts past `TOLERANCE`.

Conventions (see `NOTES`, printed under the table):
- Rates are measured over the whole chain, including the first LoadStationary and the
  Trn2/Trn3 TensorE power-throttle ramp (§2.2): a long chain makes them small.
- DMA bandwidth is bytes over the transfer time, i.e. the run's span less the ~1.3 us
  fixed DMA latency (§2.6) paid once before the bytes move: the published bandwidths
  are for the transfer, as in the [NKI-DMA] "1,416 ns for 32 KiB" profile.
- A row whose instruction does not exist yet is reported as pending, not failed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import isa
from .core import NeuronCore, chip_cores
from .program import Kernel
from .spec import CHIPS, PMAX, PSUM_BANKS, PSUM_PARTITION_BYTES, ChipSpec

__all__ = ["Row", "ROWS", "NOTES", "TOLERANCE", "Pending", "table", "measure"]

TOLERANCE = 0.10        # every row within +-10% of the published figure
KIB = 1024


class Pending(Exception):
    """The instruction a row needs is not in the ISA yet."""


@dataclass(frozen=True)
class Row:
    figure: str                    # what is published
    chip: str                      # "trn1" | "trn2" | "trn3"
    published: float
    unit: str
    measure: Callable[[ChipSpec], float]
    source: str                    # fact-sheet section and tag


# --- building blocks --------------------------------------------------------------------

def _sb(offset: int, free: tuple[int, ...], dtype: str, p: int = PMAX) -> isa.Tile:
    return isa.Tile("sbuf", 0, p, offset, free, dtype)


def _psum(i: int, n: int = 512) -> isa.Tile:
    """PSUM bank i % 8 (§3.2), so consecutive matmuls never wait on each other's bank."""
    bank = PSUM_PARTITION_BYTES // PSUM_BANKS
    return isa.Tile("psum", 0, PMAX, (i % PSUM_BANKS) * bank, (n,), "float32")


def _run(chip: ChipSpec, instrs: list, dram: dict | None = None, core=None):
    """Timing only (`execute=False`): the figures are about time, not values."""
    core = core or NeuronCore(chip.core)
    return core.run(Kernel("fidelity", list(instrs), {}), dram or {}, execute=False)


def _chain_tflops(chip: ChipSpec, make: Callable[[int], object], n: int) -> float:
    """TFLOP/s of `n` back-to-back TensorE instructions `make(i)` (FLOP per ns / 1e3)."""
    r = _run(chip, [make(i) for i in range(n)])
    return r.flops / r.duration_ns / 1e3


def _matmul(dtype: str) -> Callable[[int], isa.Instr]:
    """128x128x512 matmuls; the stationary alternates between two tiles, so every
    instruction loads its stationary (in the background of the previous MM)."""
    size = 4 if dtype == "float32" else 2
    def make(i: int) -> isa.Instr:
        return isa.NcMatmul(dst=_psum(i), stationary=_sb((i % 2) * 128 * size, (128,), dtype),
                            moving=_sb(4096, (512,), dtype))
    return make


def _double_row(i: int) -> isa.Instr:
    """FP8 double_row: [128, 2, 128] x [128, 2, 512], K = 256 (§2.2)."""
    return isa.NcMatmul(dst=_psum(i), perf_mode="double_row",
                        stationary=_sb((i % 2) * 256, (2, 128), "float8_e4m3"),
                        moving=_sb(4096, (2, 512), "float8_e4m3"))


def _mx(i: int) -> isa.Instr:
    """nc_matmul_mx: MXFP8 [128, 128] x4 stationary, [128, 512] x4 moving, K = 512."""
    cls = getattr(isa, "NcMatmulMx", None)
    if cls is None:
        raise Pending("isa.NcMatmulMx")
    from . import mx
    rows = mx.scale_partitions(128)
    st = _sb((i % 2) * 512, (128,), "float8_e4m3fn_x4")
    mv = _sb(4096, (512,), "float8_e4m3fn_x4")
    return cls(dst=_psum(i), stationary=st, moving=mv,
               stationary_scale=_sb(8192 + (i % 2) * 128, (128,), "uint8", rows),
               moving_scale=_sb(8192 + 256, (512,), "uint8", rows))


CHAIN = 256     # matmuls per rate measurement: ~55 us on Trn2, 0.2 s of wall clock


def bf16_tflops(chip: ChipSpec) -> float:
    return _chain_tflops(chip, _matmul("bfloat16"), CHAIN)


def fp32_tflops(chip: ChipSpec) -> float:
    return _chain_tflops(chip, _matmul("float32"), CHAIN // 4)


def fp8_double_row_tflops(chip: ChipSpec) -> float:
    return _chain_tflops(chip, _double_row, CHAIN)


def mx_tflops(chip: ChipSpec) -> float:
    return _chain_tflops(chip, _mx, CHAIN)


def matmul_cycles(chip: ChipSpec) -> float:
    """TensorE cycles per 128x128x512 BF16 matmul at steady state (second half)."""
    make, n = _matmul("bfloat16"), 64
    ends = [e.end_ns for e in _run(chip, [make(i) for i in range(n)]).events]
    return (ends[-1] - ends[n // 2]) / (n - 1 - n // 2) * chip.core.clock("tensor")


def _min_cost_cycles(chip: ChipSpec, make: Callable[[int], isa.Instr], engine: str) -> float:
    """Cycles per tiny independent instruction, back to back on one engine."""
    n = 32
    ends = [e.end_ns for e in _run(chip, [make(i) for i in range(n)]).events]
    return (ends[-1] - ends[0]) / (n - 1) * chip.core.clock(engine)


def vector_min_cycles(chip: ChipSpec) -> float:
    def make(i):
        return isa.TensorScalar(dst=_sb(4096 + (i % 4) * 64, (8,), "float32"),
                                data=_sb(0, (8,), "float32"), op0="add", operand0=1.0)
    return _min_cost_cycles(chip, make, "vector")


def scalar_min_cycles(chip: ChipSpec) -> float:
    def make(i):
        return isa.Activation(dst=_sb(4096 + (i % 4) * 64, (8,), "float32"),
                              data=_sb(0, (8,), "float32"), func="copy")
    return _min_cost_cycles(chip, make, "scalar")


# --- DMA ----------------------------------------------------------------------------------

def _load(bytes_per_partition: int, p: int = 128, queue: int = 0,
          offset: int = 0) -> isa.DmaCopy:
    """HBM -> SBUF of [p, bytes_per_partition] bytes, contiguous rows."""
    n = bytes_per_partition
    return isa.DmaCopy(dst=_sb(offset, (n,), "uint8", p),
                       src=isa.DramAP("x", 0, ((n, p), (1, n)), "uint8"), dma_queue=queue)


def _copy(nbytes: int, queue: int) -> isa.DmaCopy:
    """HBM -> HBM, contiguous."""
    return isa.DmaCopy(dst=isa.DramAP("y", 0, ((1, nbytes),), "uint8"),
                       src=isa.DramAP("x", 0, ((1, nbytes),), "uint8"), dma_queue=queue)


def _transfer_gbps(chip: ChipSpec, runs, fixed: float) -> float:
    """Bytes moved per ns (GB/s) over the transfer: span less the fixed DMA latency."""
    start = min(r.start_ns for r in runs)
    end = max(r.end_ns for r in runs)
    nbytes = sum(e.bytes for r in runs for e in r.events)
    return nbytes / (end - start - fixed)


def _dma_gbps(chip: ChipSpec, instrs: list, nbytes: int) -> float:
    dram = {"x": np.zeros(nbytes, np.uint8), "y": np.zeros(nbytes, np.uint8)}
    return _transfer_gbps(chip, [_run(chip, instrs, dram)], chip.core.dma_fixed_ns)


def dma_gbps_at(bytes_per_partition: int) -> Callable[[ChipSpec], float]:
    """One [128, B] load: its throughput (GB/s) at B bytes per partition."""
    def measure(chip: ChipSpec) -> float:
        b = bytes_per_partition
        return _dma_gbps(chip, [_load(b)], 128 * b)
    return measure


def dma_fraction_at(bytes_per_partition: int) -> Callable[[ChipSpec], float]:
    """Throughput at B bytes per partition relative to 32 KiB (the figure's reference)."""
    def measure(chip: ChipSpec) -> float:
        return 100 * dma_gbps_at(bytes_per_partition)(chip) / dma_gbps_at(32 * KIB)(chip)
    return measure


def dma_ceiling(chip: ChipSpec) -> float:
    """Four [128, 8 KiB] loads on four queues at once: the core's DMA ceiling (GB/s)."""
    loads = [_load(8 * KIB, queue=q) for q in range(4)]
    return _dma_gbps(chip, loads, 128 * 8 * KIB)


def one_engine_32kib_ns(chip: ChipSpec) -> float:
    """A [4, 4096] BF16 load uses one DMA engine ([NKI-DMA] example 1): transfer ns."""
    r = _run(chip, [_load(8 * KIB, p=4)], {"x": np.zeros(32 * KIB, np.uint8)})
    return r.duration_ns - chip.core.dma_fixed_ns


def _chip_stream(chip: ChipSpec, make: Callable[[int], isa.DmaCopy], nbytes: int) -> float:
    """Every core of the chip runs 16 DMAs `make(queue)` at once; HBM GB/s."""
    cores = chip_cores(chip)
    dram = {"x": np.zeros(nbytes, np.uint8), "y": np.zeros(nbytes, np.uint8)}
    runs = [_run(chip, [make(q) for q in range(16)], dram, c) for c in cores]
    span = max(r.end_ns for r in runs) - min(r.start_ns for r in runs)
    return sum(r.hbm_bytes for r in runs) / (span - chip.core.dma_fixed_ns)


def chip_hbm_copies(chip: ChipSpec) -> float:
    """All cores stream HBM -> HBM copies (2 bytes of HBM traffic per byte moved)."""
    return _chip_stream(chip, lambda q: _copy(256 * KIB, q), 256 * KIB)


def chip_hbm_loads(chip: ChipSpec) -> float:
    """All cores stream [128, 4 KiB] HBM -> SBUF loads."""
    return _chip_stream(chip, lambda q: _load(4 * KIB, queue=q), 128 * 4 * KIB)


# --- the table ----------------------------------------------------------------------------

def _rows() -> list[Row]:
    rows = []
    peak = {"trn1": 92.0, "trn2": 79.0, "trn3": 79.0}          # §1.2 [NKI-ARCH1/2/3]
    fp32 = {"trn1": 23.0, "trn2": 20.0, "trn3": 20.0}          # §1.2
    for gen in ("trn1", "trn2", "trn3"):
        rows.append(Row("BF16 matmul peak per core", gen, peak[gen], "TFLOP/s",
                        bf16_tflops, "§1.2 [NKI-ARCH]"))
        rows.append(Row("FP32 matmul (1/4 rate)", gen, fp32[gen], "TFLOP/s",
                        fp32_tflops, "§1.2, §2.2"))
    rows.append(Row("FP8 double_row matmul (2x)", "trn2", 158.0, "TFLOP/s",
                    fp8_double_row_tflops, "§1.2, §2.2 [NKI-ARCH2]"))
    rows.append(Row("MXFP8 nc_matmul_mx (4x)", "trn3", 315.0, "TFLOP/s",
                    mx_tflops, "§1.2, §2.2 [NKI-ARCH3]"))
    for gen in ("trn1", "trn2", "trn3"):
        rows.append(Row("128x128x512 BF16 matmul", gen, 512.0, "cycles",
                        matmul_cycles, "§9, §6.3"))
    for gen in ("trn1", "trn2", "trn3"):
        rows.append(Row("VectorE minimum instruction", gen, 64.0, "cycles",
                        vector_min_cycles, "§6.3 MIN_II [NKI-ISA-2.26]"))
        rows.append(Row("ScalarE minimum instruction", gen, 64.0, "cycles",
                        scalar_min_cycles, "§6.3 MIN_II [NKI-ISA-2.26]"))
    # Read off the [NKI-DMA] throughput-vs-bytes-per-partition figure (P=128), relative
    # to its 32 KiB point; see spec.CoreSpec.dma_efficiency and NOTES.
    for b, pct, label in ((128, 5.1, "<256 B"), (2 * KIB, 81.3, "2 KiB"),
                          (4 * KIB, 96.5, ">=4 KiB")):
        rows.append(Row(f"DMA at {label} per partition", "trn2", pct, "% of 32 KiB",
                        dma_fraction_at(b), "§3.4 [NKI-DMA] figure"))
    rows.append(Row("one DMA engine, 32 KiB", "trn2", 1416.0, "ns",
                    one_engine_32kib_ns, "§3.4 [NKI-DMA]"))
    for gen, gbps in (("trn1", 272.0), ("trn2", 368.0), ("trn3", 528.0)):
        rows.append(Row("DMA ceiling per core", gen, gbps, "GB/s", dma_ceiling,
                        "§3.4, §9 [NKI-DMABW]"))
    for gen in ("trn1", "trn2", "trn3"):
        rows.append(Row("chip HBM, all cores copying", gen, CHIPS[gen].hbm_bytes_per_ns,
                        "GB/s", chip_hbm_copies, "§1.1, §10.2"))
    rows.append(Row("chip HBM, all cores loading", "trn2", 2900.0, "GB/s",
                    chip_hbm_loads, "§1.1, §9 [TRN2-CHIP]"))
    return rows


ROWS = _rows()

NOTES = """\
Notes
- Rates: 256 back-to-back 128x128x512 matmuls (64 for FP32), the stationary
  alternating between two tiles so every LoadStationary runs in the background of the
  previous MultiplyMoving. Measured over the whole chain, so the first LS and the
  Trn2/Trn3 power-throttle ramp (50% -> 100% over ~3 us, §2.2) are included (~1.5%).
- Trn1 peak: 92 TFLOPS is the per-core figure [NKI-ARCH1] ("over 90" in [NCv2]);
  per-chip figures are not 2x/8x the per-core ones (§10.3): we use the per-core ones.
- FP8 on Trn3 is not listed: plain FP8 is double_row (2x) there too, 4x is MX only
  (§10.5). MX uses MXFP8 (float8_e4m3fn x4) operands with E8M0 scales.
- Minimum instruction: tiny independent instructions back to back on one engine;
  64 cycles is 53-67 ns at 0.96-1.2 GHz (Trn2/Trn3), 46-57 ns on Trn1 (§9).
- DMA vs bytes per partition: the published guidance is qualitative (<256 B "severely
  overhead-bound", 2 KiB "approaches peak", >=4 KiB "saturates", [NKI-DMABW]); the
  numbers are read off the [NKI-DMA] figure (nki-dma-overview.rst, P=128, no y-axis
  labels, so relative to its 32 KiB point): 128 B 5.1%, 2 KiB 81.3%, 4 KiB 96.5%.
  DMA bandwidths exclude the ~1.3 us fixed latency paid before the bytes move.
- DMA ceilings: the effective per-engine table (17/23/33 B/ns x 16, [NKI-DMABW]), not
  the "theoretical" 27.2/38.4 GB/s per engine (§10.7).
- Chip HBM: 820 GB/s Trn1 [NKI-ARCH1] (not 820 GiB/s), 2.9 TB/s Trn2 [TRN2-CHIP] (not
  3 TB/s), 4.9 TB/s Trn3 [TRN3-CHIP] (not 4.7), §10.2. Loads alone cannot reach it on
  Trn1 (2 x 272 GB/s) or Trn3 (8 x 528 GB/s), so the cores copy HBM -> HBM (two bytes
  of HBM traffic per byte moved); on Trn2, 8 x 368 GB/s of loads already exceed it.
"""


def measure(row: Row) -> float | None:
    """The simulated value of `row`, or None while its instruction is pending."""
    try:
        return row.measure(CHIPS[row.chip])
    except Pending:
        return None


def table(rows: list[Row] | None = None) -> list[tuple[Row, float | None, float | None]]:
    """(row, simulated value or None if pending, relative error or None)."""
    out = []
    for row in rows if rows is not None else ROWS:
        value = measure(row)
        err = None if value is None else value / row.published - 1.0
        out.append((row, value, err))
    return out
