"""Trainium generations as data (trainium-hardware.md §1, §2, §3, §9, §10).

`CoreSpec` holds everything the NeuronCore model needs: engine clocks and datapath
widths (§1.2), memories (§1.1, §3), TensorE modes and their speedups (§2.2), the
Vector/Scalar performance modes and v4 instructions (§2.3, §2.4), instruction
overheads (§2.6, §6.3), the TensorE power throttle (§2.2), DMA engines, queues and
bandwidth (§3.4). `ChipSpec` adds the chip-level numbers (cores, HBM capacity and
bandwidth shared by the cores, published peak rates) and the chip's `LinkSpec`
(NeuronLink, EFA, collective DMA, §1.3, §5). `CHIPS` maps "trn1" / "trn2" / "trn3" to
their `ChipSpec`. Generations differ only in these numbers, never in code paths
(tests/sim/test_spec.py checks both). The module-level limits below are the ISA's, the
same on every generation; no other hw module writes a hardware number of its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

KIB = 1024
GIB = 1024 ** 3

# --- ISA-wide limits: the same on every generation, checked when an instruction is built
PMAX = 128                      # SBUF/PSUM partitions = PE rows, §3.3 `pmax`, §2.2
PARTITION_QUADRANT = 32         # start-partition granularity, §3.1; VectorE bank, §2.3
PARTITION_MOVE_MAX = 64         # data changes partitions only within <= 64 of them, §2.3
AP_DIMS_MAX = 4                 # free-axis dims of an access pattern, §3.1
INNER_STRIDE_MAX_BYTES = 16     # a longer innermost stride halves bandwidth, §3.1
VECTOR_TRANSPOSE_MAX = 32       # VectorE transposes <= 32 x 32 (one bank), §2.3, §6.2
# nc_matmul_mx moving free size by dst dtype (the NC-v4 instruction's docstring), §6.2
MX_MOVING_MAX = (("float32", 512), ("bfloat16", 1024))
MAX8_FREE_MIN, MAX8_FREE_MAX = 8, 16384   # max8 / find_index8 elements per partition, §6.2
MX_GROUP_PARTITIONS = 8         # an MX scale group: 8 partitions x 4 packed values, §2.2
PSUM_PARTITION_BYTES = 16 * KIB  # PSUM bytes per partition, §3.2 [NKI-ARCH1]
PSUM_BANKS = 8                  # 2 KiB banks, §3.2 [NKI-ARCH1]
# dma_transpose reaches up to 90% of DMA throughput HBM->SBUF, 50% SBUF->SBUF, §3.4
# [NKI-ARCH2] (by where the source is).
DMA_TRANSPOSE_EFFICIENCY = (("dram", 0.9), ("sbuf", 0.5))
# ScalarE activation functions are valid only on these inputs (outside: "invalid
# results"), §2.4 [NKI-SHARED]: func -> (low, high, on |x|); bounds inclusive, as FP32.
_PI = 3.1415927410125732        # float(np.float32(np.pi))
ACTIVATION_RANGES = (
    ("log", (2.0 ** -64, 2.0 ** 64, False)),
    ("sin", (-_PI, _PI, False)),
    ("arctan", (-_PI / 2, _PI / 2, False)),
    ("sqrt", (2.0 ** -116, 2.0 ** 118, False)),
    ("rsqrt", (2.0 ** -87, 2.0 ** 97, False)),
    ("reciprocal", (2.0 ** -42, 2.0 ** 42, True)),
)


@dataclass(frozen=True)
class CoreSpec:
    name: str                        # "NeuronCore-v2" | "-v3" | "-v4"
    generation: str                  # "trn1" | "trn2" | "trn3"
    clock_ghz: tuple[tuple[str, float], ...]   # engine -> GHz, §1.2 [NKI-ARCH1/2/3]
    sbuf_partition_bytes: int        # physical bytes per partition, §1.1
    sbuf_reserved_bytes: int         # kept back by the NKI library, §3.1 [NKILIB]
    max_moving_free: int             # nc_matmul moving F limit (FP32 dst), §2.2
    matmul_spans_banks: bool         # v4: one matmul may write several PSUM banks, §2.2
    fp8_double_row: int              # FP8 double_row speedup (1 = no such mode), §2.2
    mx_speedup: int                  # MX matmul speedup over BF16 (1 = none), §2.2
    dma_engine_bytes_per_ns: float   # per DMA engine, §3.4 [NKI-DMABW]
    vector_fast_copy: int            # v3+ perf mode: SBUF bf16 copy/tensor_scalar, §2.3
    vector_fast_psum: int            # v3+ perf mode: PSUM / bf16 tensor_tensor, §2.3
    scalar_fast_bf16: int            # v4 ScalarE 2x BF16 tensor_scalar/copy, §2.4
    psum_bf16: bool                  # v4 allows BF16 data/dst in PSUM, §3.2
    ocp_fp8: bool                    # v4 takes float8_e4m3fn matmul inputs, §2.2
    fp32_transpose_factor: int       # TensorE FP32 transpose cost factor, §2.2
    scalar_ts_ops: tuple[str, ...] | None   # ScalarE tensor_scalar ops (None: all), §6.2
    # Datapath widths in elements per cycle, §1.2: (16-bit floats, other types).
    vector_width: tuple[int, int] = (128, 128)
    scalar_width: tuple[int, int] = (128, 128)
    gpsimd_width: int = 128
    fp8_is_narrow: bool = False      # FP8 runs at the 16-bit width (v4 Vector/Scalar), §1.2
    # The SBUF access VectorE and GpSimd share (§2.6 [NKI-ARCH1], §2.3 [NKI-ARCH2]):
    # "sbuf" -- they cannot access SBUF at the same time (NC-v2); "fast_modes" -- only
    # VectorE's performance modes use a bus shared with GpSimd (NC-v3; kept on v4).
    gpsimd_port: str = "fast_modes"
    # Features that only some generations have (the ISA checks read these), §2-§3.
    transpose_mode: bool = False     # v3+ bit-exact `is_transpose` matmul, §2.2
    dma_transpose: bool = False      # v3+ dma_transpose, §3.4 [NKI-ARCH2]
    vector_exponential: int = 0      # v4 VectorE `exponential`: x ScalarE exp rate; 0 = none, §2.3
    quantize_mx: int = 0             # v4 `quantize_mx` elements/partition/cycle; 0 = none, §2.3
    psum_accumulate_any: bool = False   # v4: accumulate onto non-matmul PSUM data, §2.2
    pmax: int = PMAX                 # PE rows / partitions, §2.2, §3.3
    pe_cols: int = 128               # PE columns = stationary F limit, §2.2
    fp32_matmul_factor: int = 4      # FP32 matmul costs 4x, §2.2 [NKI-ARCH1]
    ls_speedup: int = 4              # "fast LS": LoadStationary up to 4x an MM, §2.2
    min_ii: int = 64                 # Vector/Scalar MIN_II cycles, §6.3 [NKI-ISA-2.26]
    mm_init_latency: int = 64        # TensorE MM_INIT_LATENCY cycles, §2.6 [NKI-ARCH1]
    static_overhead: int = 100       # cycles, tiny/dependent instructions, §2.6 [NKI-ARCH1]
    gpsimd_startup: int = 150        # cycles, §2.5/§6.3 [NKI-ISA-2.26]
    gpsimd_processors: int = 8       # each serves pmax / 8 = 16 partitions, §2.5 [NKI-ARCH1]
    gpsimd_port_bytes: int = 64      # 512 bits per cycle per direction, §2.5 [NKI-ARCH1]
    dynamic_address_cycles: int = 600   # register-addressed instructions, §2.6
    act_read_accumulator: int = 64   # ActReadAccumulator cycles, §2.4/§2.6 [NKI-ARCH1]
    # TensorE power throttling, §2.2 [NX-SUMMARY]: starts at `pe_throttle_floor` of the
    # peak rate, ramps linearly to full over `pe_throttle_ramp_ns`; re-engages when
    # utilisation falls below `pe_throttle_util` over a `pe_throttle_window_ns` window.
    # Floor 1.0 = no throttling (Trn1: none documented).
    pe_throttle_floor: float = 1.0
    pe_throttle_ramp_ns: float = 3000.0
    pe_throttle_window_ns: float = 3000.0
    pe_throttle_util: float = 0.5
    psum_partition_bytes: int = PSUM_PARTITION_BYTES   # §3.2 [NKI-ARCH1]
    psum_banks: int = PSUM_BANKS                       # §3.2 [NKI-ARCH1]
    dma_engines: int = 16            # per NC, §3.4 [NKI-DMA]
    dma_queues: int = 16             # queue IDs per engine, §3.4 [NKI-DMA]
    dma_fixed_ns: float = 1300.0     # descriptor + semaphore-to-start, §2.6 [NKI-DMABW]
    dma_packet_bytes: int = 4 * KIB  # default DMA packetisation, §3.4 [CC-OVERLAP]
    dma_full_rate_bytes: float = 2500.0   # descriptor size reaching full rate, see below
    hwdge_ns: float = 600.0          # hardware-DGE DMA instruction, §2.6 [NKI-ARCH2]
    vector_transpose_max: int = VECTOR_TRANSPOSE_MAX   # §2.3 [NKI-ARCH1]

    def clock(self, engine: str) -> float:
        """GHz of a compute engine, i.e. cycles per ns."""
        return dict(self.clock_ghz)[engine]

    def width(self, engine: str, dtype: str) -> int:
        """Elements per cycle of `engine` for `dtype` (§1.2 datapath widths)."""
        if engine == "gpsimd":
            return self.gpsimd_width
        wide, other = self.vector_width if engine == "vector" else self.scalar_width
        narrow = dtype in ("bfloat16", "float16") or (
            self.fp8_is_narrow and dtype.startswith("float8"))
        return wide if narrow else other

    @property
    def psum_bank_bytes(self) -> int:
        return self.psum_partition_bytes // self.psum_banks    # 2 KiB, §3.2

    @property
    def sbuf_usable_bytes(self) -> int:
        """SBUF bytes per partition a kernel may allocate (the SBUF model's size)."""
        return self.sbuf_partition_bytes - self.sbuf_reserved_bytes

    sbuf_usable_bytes_per_partition = sbuf_usable_bytes

    @property
    def dma_bytes_per_ns(self) -> float:
        """Aggregate DMA bandwidth of one core: 272 / 368 / 528 GB/s, §3.4, §9."""
        return self.dma_engines * self.dma_engine_bytes_per_ns

    def dma_efficiency(self, chunk_bytes: float) -> float:
        """Fraction of a DMA engine's peak rate reached with contiguous chunks
        (descriptors) of `chunk_bytes`: min(1, chunk / 2500 B).

        §3.4 [NKI-DMABW] names the cause, the DMA packet rate: an engine needs a
        minimum time per descriptor (2500 B / 23 B/ns = 109 ns on Trn2), overlapped with
        moving its bytes, so a descriptor takes max(that, bytes / rate). The knee comes
        from the throughput-vs-bytes-per-partition figure of [NKI-DMA]
        (nki-dma-overview.rst, P=128, unlabelled y axis; read relative to its 32 KiB
        point): 32 B 1.4%, 128 B 5.1%, 256 B 10%, 512 B 21%, 1 KiB 42%, 2 KiB 81%,
        4 KiB 97%, 8 KiB 98% -- linear up to ~2.5 KiB, then flat. This fits every point
        within 4%. We keep the knee in bytes on every generation, as the guidance
        (>=2 KiB recommended, >=4 KiB saturates) is the same for all."""
        return min(1.0, max(chunk_bytes, 1.0) / self.dma_full_rate_bytes)


def _clocks(tensor: float, vector: float, scalar: float, gpsimd: float):
    return (("tensor", tensor), ("vector", vector), ("scalar", scalar), ("gpsimd", gpsimd))


# §3.1 [NKILIB]: the NKI library keeps 16 KiB + 8 + 256 bytes per partition back on
# Trn2 (runtime/compiler scratch). We keep the same amount back on every generation.
_SBUF_RESERVED = 16 * KIB + 8 + 256
# §6.2 [NKI-ISA]: "Trn2 ScalarE only supports mult/add combos" for tensor_scalar.
_SCALAR_TS_OPS = ("add", "subtract", "multiply", "bypass")

NC_V2 = CoreSpec(
    name="NeuronCore-v2", generation="trn1",
    clock_ghz=_clocks(2.8, 1.12, 1.4, 1.4),        # §1.2 [NKI-ARCH1]
    sbuf_partition_bytes=192 * KIB,                 # §1.1 [NKI-ARCH1]
    sbuf_reserved_bytes=_SBUF_RESERVED,             # §3.1 [NKILIB]
    max_moving_free=512,                            # §2.2 [NKI-ISA]
    matmul_spans_banks=False,                       # §3.2 [NKI-ARCH1]
    fp8_double_row=1, mx_speedup=1,                 # §2.2: no fast FP8 on v2
    dma_engine_bytes_per_ns=17.0,                   # §3.4 [NKI-DMABW]
    vector_fast_copy=1, vector_fast_psum=1,         # §2.3: perf modes are v3+
    scalar_fast_bf16=1, psum_bf16=False,            # §2.4, §3.2
    ocp_fp8=False, fp32_transpose_factor=4,         # §2.2: FP32 matmul, 4x
    scalar_ts_ops=_SCALAR_TS_OPS,                   # §6.2 (Trn2 rule, assumed on Trn1)
    vector_width=(128, 128), scalar_width=(128, 128),   # §1.2 [NKI-ARCH1]
    gpsimd_width=128,                               # §1.2 [NKI-ARCH1]
    gpsimd_port="sbuf",                             # §2.6 [NKI-ARCH1]: v2 exclusive
)

NC_V3 = CoreSpec(
    name="NeuronCore-v3", generation="trn2",
    clock_ghz=_clocks(2.4, 0.96, 1.2, 1.2),        # §1.2 [NKI-ARCH2]
    sbuf_partition_bytes=224 * KIB,                 # §1.1 [NKI-ARCH2]
    sbuf_reserved_bytes=_SBUF_RESERVED,             # §3.1 [NKILIB]
    max_moving_free=512,                            # §2.2 [NKI-ISA]
    matmul_spans_banks=False,                       # §3.2 [NKI-ARCH1]
    fp8_double_row=2, mx_speedup=1,                 # §2.2 [NKI-ARCH2]
    dma_engine_bytes_per_ns=23.0,                   # §3.4 [NKI-DMABW]
    vector_fast_copy=4, vector_fast_psum=2,         # §2.3 [NKI-ARCH2]
    scalar_fast_bf16=1, psum_bf16=False,            # §2.4, §3.2
    ocp_fp8=False, fp32_transpose_factor=2,         # §2.2: is_transpose 2x for FP32
    scalar_ts_ops=_SCALAR_TS_OPS,                   # §6.2 [NKI-ISA]
    vector_width=(512, 256), scalar_width=(128, 128),   # §1.2 [NKI-ARCH2]
    gpsimd_width=128,                               # §1.2: not given; v2/v4 value, §11
    transpose_mode=True, dma_transpose=True,        # §2.2, §3.4 [NKI-ARCH2]
    pe_throttle_floor=0.5,                          # §2.2 [NX-SUMMARY]
)

NC_V4 = CoreSpec(
    name="NeuronCore-v4", generation="trn3",
    clock_ghz=_clocks(2.4, 1.2, 1.2, 1.2),         # §1.2 [NKI-ARCH3]
    sbuf_partition_bytes=256 * KIB,                 # §1.1 [NKI-ARCH3]
    sbuf_reserved_bytes=_SBUF_RESERVED,             # §3.1 [NKILIB]
    max_moving_free=4096,                           # §2.2 [NKI-ISA] (FP32 dst)
    matmul_spans_banks=True,                        # §2.2 [NKI-ISA]
    fp8_double_row=2, mx_speedup=4,                 # §2.2, §10.5 [NKI-ARCH3]
    dma_engine_bytes_per_ns=33.0,                   # §3.4 [NKI-DMABW]
    vector_fast_copy=4, vector_fast_psum=2,         # §2.3 (v3 modes kept on v4)
    scalar_fast_bf16=2, psum_bf16=True,             # §2.4, §3.2 [NKI-ARCH3]
    ocp_fp8=True, fp32_transpose_factor=2,          # §2.2 [NKI-ISA]
    scalar_ts_ops=None,                             # §2.4: Activation2 on v4
    vector_width=(512, 256), scalar_width=(256, 128),   # §1.2 [NKI-ARCH3]
    gpsimd_width=128, fp8_is_narrow=True,           # §1.2 [NKI-ARCH3]
    transpose_mode=True, dma_transpose=True,        # §2.2, §3.4 (v3 features kept)
    vector_exponential=4, quantize_mx=4,            # §2.3 [NKI-ARCH3][NCv4]
    psum_accumulate_any=True,                       # §2.2 [NKI-ISA]: UB on v2/v3 only
    pe_throttle_floor=0.5,                          # §2.2 [NX-SUMMARY]
)


# --- Interconnect (trainium-hardware.md §1.1, §1.3, §3.4, §5) -------------------------

@dataclass(frozen=True)
class LinkSpec:
    """Chip-to-chip links and collective-engine facts of one generation.

    Bandwidths are GB/s == B/ns. The per-chip NeuronLink figures of §1.1/§1.3 are read as
    the sum over a chip's links *and both directions* (the Trn3 link table says
    "bidirectional" explicitly [TRN3-INST]); one direction of one link therefore gets
    `chip / links / 2`. Latencies are per traversal of a link (a torus hop, a switch, an
    EFA hop), and include the semaphore write that follows each remote write (§1.3)."""
    neuronlink_bytes_per_ns: float   # intra-server NeuronLink per chip, §1.1 [TRN1/2/3-CHIP]
    links_per_chip: int              # NeuronLink ports, §1.1 [NKI-ARCH1/2/3]
    z_bytes_per_ns: float            # inter-instance (UltraServer Z ring) per chip, §1.3
    efa_bytes_per_ns: float          # EFA per chip, §1.3
    chip_dma_bytes_per_ns: float     # chip DMA bandwidth moving collective data, §1.1
    cc_reduce_rate: float            # DMA-side accumulation rate vs DMA rate, §5.2
    hop_ns: float = 1500.0           # NeuronLink hop "~1-2 us", §5.3 [CC-INTRA] (midpoint)
    # One NeuronSwitch traversal: not published (§11). Derived from the one published
    # relation, [SEED-AIM201] "all-gather ... up to 6x the reduction in latency" vs the
    # torus: a small all-gather's latency is the launch (onchip_ns) plus its longest
    # route, 6 NeuronLink hops on a 4x4x4 torus against one switch traversal, so
    # (1300 + 6 x 1500) / (1300 + s) = 6 gives s = 417 ns (a PCIe Gen6 switch, §1.3,
    # forwards by address without the HBM write a torus hop's ~1-2 us includes).
    # benchmarks/collectives.py shows that row as a calibration; the all-reduce "2x"
    # claim is then a prediction.
    switch_hop_ns: float = 417.0
    efa_hop_ns: float = 15000.0      # inter-node hop ~15 us, §5.3 [CC-INTER][CC-ABOUT]
    onchip_ns: float = 1300.0        # core-to-core on a chip: one DMA fixed cost, §3.4/§9
    dma_compute_sources: int = 16    # dma_compute sums <= 16 sources in FP32, §3.4 [NKI-ISA]
    # The chip's link to the host CPU (host memory <-> HBM, §3.1), one direction: not
    # published (§11). Assumed one PCIe x16 link per chip at its generation's rate:
    # Gen4 on Trn1 (32 GB/s), Gen5 on Trn2 (64), Gen6 on Trn3 (128; §1.3 names PCIe
    # Gen6 for Trn3's fabric). Host callbacks move their operands and results over it.
    host_bytes_per_ns: float = 32.0

    def link_bytes_per_ns(self, chip_bytes_per_ns: float | None = None,
                          links: int | None = None) -> float:
        """One direction of one link: the per-chip figure over links and 2 directions."""
        chip = self.neuronlink_bytes_per_ns if chip_bytes_per_ns is None else chip_bytes_per_ns
        return chip / (links or self.links_per_chip) / 2


_LINKS = {
    # §1.1: 384 GB/s NeuronLink-v2 per chip (trn1.32xlarge; trn1n 768); §1.3: 800 Gbps
    # EFA per 16-chip instance = 6.25 GB/s per chip; DMA 1 TB/s per chip;
    # §5.2 [NKI-ARCH3]: before NC-v4 DMA-side accumulation runs at 50% of DMA rate.
    "trn1": LinkSpec(neuronlink_bytes_per_ns=384.0, links_per_chip=4, z_bytes_per_ns=0.0,
                     efa_bytes_per_ns=800 / 8 / 16, chip_dma_bytes_per_ns=1000.0,
                     cc_reduce_rate=0.5),
    # §1.3: 1,024 GB/s intra-instance + 256 GB/s inter-instance (Z) per chip [TRN2-INST];
    # one 200 Gbps EFA NIC per chip; DMA 3.5 TB/s per chip (§1.1).
    "trn2": LinkSpec(neuronlink_bytes_per_ns=1024.0, links_per_chip=4, z_bytes_per_ns=256.0,
                     efa_bytes_per_ns=200 / 8, chip_dma_bytes_per_ns=3500.0,
                     cc_reduce_rate=0.5, host_bytes_per_ns=64.0),
    # §1.1: 2,560 GB/s NeuronLink-v4 per chip [TRN3-CHIP] (the chip page, like HBM above;
    # §10.6 lists the lower PCIe-link sum); EFA 200 Gbps per chip (derived, §1.3);
    # DMA 4.9 TB/s; NC-v4 accumulates at full DMA rate (§5.2 [NKI-ARCH3]).
    "trn3": LinkSpec(neuronlink_bytes_per_ns=2560.0, links_per_chip=4, z_bytes_per_ns=0.0,
                     efa_bytes_per_ns=200 / 8, chip_dma_bytes_per_ns=4900.0,
                     cc_reduce_rate=1.0, host_bytes_per_ns=128.0),
}


@dataclass(frozen=True)
class ChipSpec:
    """One Trainium chip: its NeuronCores, HBM, published peaks and chip-to-chip links.
    A `jax_trn.systems.System` holds one and builds its topology from it."""
    name: str                        # "trn1" | "trn2" | "trn3"
    core: CoreSpec
    cores: int                       # NeuronCores per chip, §1.1
    hbm_bytes: int                   # §1.1
    hbm_bytes_per_ns: float          # chip HBM bandwidth (GB/s == B/ns), §1.1, §10.2
    peak_tflops: tuple[tuple[str, float], ...] = field(default=())  # per core, §1.2
    links: LinkSpec = field(kw_only=True)   # chip-to-chip links, collective engine, §1.3

    def peak_tflops_per_core(self, dtype: str) -> float:
        """Published dense TensorE peak per core for an input dtype (for MFU)."""
        table = dict(self.peak_tflops)
        if dtype.endswith("_x4") and "mx" in table:     # packed MX: nc_matmul_mx, §1.2
            return table["mx"]
        if dtype.startswith("float8"):
            return table["fp8"]
        return table["fp32"] if dtype == "float32" else table["bf16"]


# HBM bandwidth choices (§1.1, §10.2): Trn1 820 GB/s [NKI-ARCH1] (the GiB/s variant is
# 7% more; loads alone, 2 cores x 272 GB/s, never reach either, HBM -> HBM copies do).
# Trn2 2.9 TB/s [TRN2-CHIP][SEED-CMP333], consistent with 8 cores x ~362 GB/s (§9).
# Trn3 4.9 TB/s [TRN3-CHIP], the chip page, like Trn2 (the NKI guide's 4.7 is the
# conservative one).
CHIPS = {
    "trn1": ChipSpec(
        name="trn1", core=NC_V2, cores=2,           # §1.1 [TRN1-CHIP]
        hbm_bytes=32 * GIB,                         # §1.1 [TRN1-CHIP]
        hbm_bytes_per_ns=820.0,                     # §1.1 [NKI-ARCH1], §10.2
        peak_tflops=(("bf16", 92.0), ("fp8", 92.0), ("fp32", 23.0)),   # §1.2
        links=_LINKS["trn1"],                       # §1.1, §1.3, §5.2 (above)
    ),
    "trn2": ChipSpec(
        name="trn2", core=NC_V3, cores=8,           # §1.1 [TRN2-CHIP]
        hbm_bytes=96 * GIB,                         # §1.1 [TRN2-CHIP]
        hbm_bytes_per_ns=2900.0,                    # §1.1 [TRN2-CHIP], §10.2
        peak_tflops=(("bf16", 79.0), ("fp8", 158.0), ("fp32", 20.0)),  # §1.2
        links=_LINKS["trn2"],                       # §1.1, §1.3, §5.2 (above)
    ),
    "trn3": ChipSpec(
        name="trn3", core=NC_V4, cores=8,           # §1.1 [TRN3-CHIP]
        hbm_bytes=144 * GIB,                        # §1.1 [TRN3-CHIP]
        hbm_bytes_per_ns=4900.0,                    # §1.1 [TRN3-CHIP], §10.2
        # §1.2: 315 is MX only; plain FP8 is double_row = 2x BF16 (§10.5).
        peak_tflops=(("bf16", 79.0), ("fp8", 158.0), ("fp32", 20.0), ("mx", 315.0)),
        links=_LINKS["trn3"],                       # §1.1, §1.3, §5.2 (above)
    ),
}


# The link facts of each preset chip (kept by generation name for older callers).
LINKS = {name: chip.links for name, chip in CHIPS.items()}
