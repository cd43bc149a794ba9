"""Instruction costs (trainium-hardware.md §6.3, §2.2-§2.6, §3.4) and generation checks.

One function per instruction, `fn(instr, spec)`: engine cycles; each instruction class
names its own (`cycles = ...`, isa_base.py), so this module knows operands, not
instruction classes. N is elements per partition of the free axes. The §6.3 formulas
are the NC-v2 docstrings [NKI-ISA-2.26]; on v3+ the automatic Vector / Scalar
performance modes (§2.3, §2.4) divide N for the cases listed there. Where the sources
give no rule we say what we chose:

- GpSimd compute (iota, memset, tensor_tensor/scalar/copy/select/reduce and
  tensor_tensor_scan on gpsimd): `gpsimd_startup (150) + N x inputs`, like
  iota/affine_select in §6.3.
- VectorE perf modes (v3+, §2.3): tensor_copy / tensor_scalar with every tile a 16-bit
  float in SBUF run 4x; every other case 2x, which is also what the v3 datapath width
  of 256 elements per cycle for non-16-bit types (§1.2) gives.
- VectorE tensor_tensor / select: §6.3's one-pass case (an input in PSUM, or BF16
  add/mul/sub in SBUF) extends on v3+ to every BF16 SBUF op ("2x for BF16
  tensor_tensor SBUF->SBUF", §2.3).
- TensorE transpose of FP32 data costs 4x on v2 (an FP32 matmul) and 2x on v3+
  (`is_transpose`, "2x faster for FP32", §2.2).

DMA time is not in cycles: see `dma_shape` and `core.NeuronCore` (fixed cost plus bytes
over shared bandwidth).

The `check_*` functions (`check = ...` in a class) raise IsaError for constraints that
depend on the generation (moving free size, PSUM banks, BF16 PSUM, FP8 modes, DMA queue
count). `shares_gpsimd_port`, `stationary` and `load_stationary` serve the timing model
(core.py, tensor_pipe.py).
"""
from __future__ import annotations

import math

from . import dtypes as _dt
from .operands import DramAP, Tile, _check
from .spec import KIB, CoreSpec

_HALF = ("bfloat16", "float16")


def _n(tile: Tile) -> int:
    return tile.free_size


def _gpsimd(spec: CoreSpec, n: int, inputs: int = 1) -> float:
    return spec.gpsimd_startup + n * inputs


def _tiles16_sbuf(*tiles) -> bool:
    return all(isinstance(t, Tile) and t.dtype in _HALF and t.mem == "sbuf"
               for t in tiles)


def nc_matmul(ins, spec: CoreSpec) -> float:
    """max(min(64, N_stat), N_mov), x4 for FP32 (TF32 at the BF16 rate), §6.3, §2.2.
    double_row streams 2 rows per cycle: same cycles for twice the work (§9)."""
    cycles = max(min(spec.mm_init_latency, ins.m), ins.n)
    if ins.stationary.dtype == "float32" and ins.precision != "tf32":
        cycles *= spec.fp32_matmul_factor
    return float(cycles)


def load_stationary(ins, spec: CoreSpec) -> float:
    """LoadStationary of a TensorE instruction's stationary tile (§2.2): "fast LS" is up
    to `ls_speedup` (4x) faster than an MM of the same free size, so M/4 cycles (x the
    FP32 factor). `core` overlaps it with the previous MultiplyMoving ("background
    LoadStationary") and skips it when the stationary is already loaded. Each TensorE
    class names its rule (`load_cycles`: `matmul_load` or `transpose_load`)."""
    return ins.load_cycles(spec)


def matmul_load(ins, spec: CoreSpec) -> float:
    """LoadStationary of a matmul: M = the stationary free size (of one row in
    double_row mode), the FP32 factor unless rounded to TF32."""
    fp32 = ins.stationary.dtype == "float32" and getattr(ins, "precision", "") != "tf32"
    return _load(ins.m, spec.fp32_matmul_factor if fp32 else 1, spec)


def transpose_load(ins, spec: CoreSpec) -> float:
    """LoadStationary of a TensorE transpose (a matmul against the identity, §2.2): its
    data, at the FP32 transpose factor."""
    fp32 = ins.data.dtype == "float32"
    return _load(ins.data.free_size, spec.fp32_transpose_factor if fp32 else 1, spec)


def _load(m: int, factor: int, spec: CoreSpec) -> float:
    return float(math.ceil(m * factor / spec.ls_speedup))


def stationary(ins) -> Tile | None:
    """The tile a TensorE instruction loads into the PE array (None: no LS): the operand
    its class names `pe_weights` (§2.2)."""
    field = getattr(ins, "pe_weights", None) if ins.engine == "tensor" else None
    return getattr(ins, field) if field else None


def nc_transpose(ins, spec: CoreSpec) -> float:
    p, f = ins.data.num_partitions, ins.data.free_size
    if ins.engine == "vector":
        return float(max(spec.min_ii, f))
    cycles = max(p, min(spec.mm_init_latency, f))          # §6.3
    if ins.data.dtype == "float32":
        cycles *= spec.fp32_transpose_factor
    return float(cycles)


def activation(ins, spec: CoreSpec) -> float:
    """max(MIN_II, N), + MIN_II with the add-reduction (activation_reduce), §6.3."""
    cycles = max(spec.min_ii, _n(ins.data))
    return float(cycles + (spec.min_ii if ins.reduce_res is not None else 0))


def _copy_factor(ins, spec: CoreSpec, src: Tile, scalars=()) -> int:
    """tensor_copy / tensor_scalar on VectorE or ScalarE: the performance-mode factor
    (§2.3, §2.4): all tiles 16-bit floats in SBUF, or not."""
    tiles = (ins.dst, src) + tuple(s for s in scalars if isinstance(s, Tile))
    if ins.engine == "scalar":
        return spec.scalar_fast_bf16 if _tiles16_sbuf(*tiles) else 1
    return spec.vector_fast_copy if _tiles16_sbuf(*tiles) else spec.vector_fast_psum


def _copy_like(ins, spec: CoreSpec, src: Tile, scalars=()) -> float:
    """tensor_copy / tensor_scalar: max(MIN_II, N / perf-mode factor), §6.3, §2.3."""
    n = _n(src)
    if ins.engine == "gpsimd":
        return float(_gpsimd(spec, n))
    return float(max(spec.min_ii, n / _copy_factor(ins, spec, src, scalars)))


def tensor_copy(ins, spec: CoreSpec) -> float:
    return _copy_like(ins, spec, ins.src)


def tensor_scalar(ins, spec: CoreSpec) -> float:
    return _copy_like(ins, spec, ins.data, (ins.operand0, ins.operand1))


def _bf16_sbuf(*tiles) -> bool:
    return all(t.dtype == "bfloat16" and t.mem == "sbuf" for t in tiles)


def _two_input(ins, spec: CoreSpec, a: Tile, b: Tile, fast_op: bool) -> float:
    """max(MIN_II, N) if an input is in PSUM or all-BF16 add/mul/sub in SBUF, else
    max(MIN_II, 2N), §6.3."""
    n = _n(a)
    if ins.engine == "gpsimd":
        return float(_gpsimd(spec, n, 2))
    fast_mode = fast_op or spec.vector_fast_psum > 1        # v3+: any BF16 op, §2.3
    one_pass = "psum" in (a.mem, b.mem) or (_bf16_sbuf(ins.dst, a, b) and fast_mode)
    return float(max(spec.min_ii, n if one_pass else 2 * n))


def tensor_tensor(ins, spec: CoreSpec) -> float:
    fast = ins.op in ("add", "multiply", "subtract")
    return _two_input(ins, spec, ins.data1, ins.data2, fast)


def select(ins, spec: CoreSpec) -> float:
    return _two_input(ins, spec, ins.on_true, ins.on_false, False)


def shares_gpsimd_port(ins, spec: CoreSpec) -> bool:
    """Whether `ins` holds the SBUF access VectorE and GpSimd share for its duration
    (`CoreSpec.gpsimd_port`): every GpSimd instruction touching SBUF; on NC-v2 every
    VectorE one touching SBUF (§2.6); from NC-v3 the VectorE instructions that run in a
    performance mode (§2.3: the 2x/4x modes "use a bus shared with GpSimd"), i.e. those
    the cost functions above price below one element per cycle and input
    (`ins.vector_fast_mode`: the `*_fast_mode` functions below)."""
    engine = getattr(ins, "engine", None)
    if engine not in ("vector", "gpsimd"):
        return False
    tiles = [v for v in ins.__dict__.values() if isinstance(v, Tile)]
    if not any(t.mem == "sbuf" for t in tiles):
        return False
    if engine == "gpsimd" or spec.gpsimd_port == "sbuf":
        return True
    return ins.vector_fast_mode(spec)


def tensor_copy_fast_mode(ins, spec: CoreSpec) -> bool:
    return _copy_factor(ins, spec, ins.src) > 1


def tensor_scalar_fast_mode(ins, spec: CoreSpec) -> bool:
    return _copy_factor(ins, spec, ins.data, (ins.operand0, ins.operand1)) > 1


def _two_input_fast_mode(ins, spec: CoreSpec, a: Tile, b: Tile) -> bool:
    return (spec.vector_fast_psum > 1 and "psum" not in (a.mem, b.mem)
            and _bf16_sbuf(ins.dst, a, b))


def tensor_tensor_fast_mode(ins, spec: CoreSpec) -> bool:
    return _two_input_fast_mode(ins, spec, ins.data1, ins.data2)


def select_fast_mode(ins, spec: CoreSpec) -> bool:
    return _two_input_fast_mode(ins, spec, ins.on_true, ins.on_false)


def tensor_reduce(ins, spec: CoreSpec) -> float:
    """N, or N/2 for BF16 in/out with add or max, §6.3; on GpSimd start-up + N."""
    n = _n(ins.data)
    if ins.engine == "gpsimd":
        return float(_gpsimd(spec, n))
    bf16 = ins.data.dtype == ins.dst.dtype == "bfloat16" and ins.op in ("add", "max")
    return float(n / 2 if bf16 else n)


def bn_stats(ins, spec: CoreSpec) -> float:
    """max(MIN_II, N), §6.3 [NKI-ISA]."""
    return float(max(spec.min_ii, _n(ins.data)))


def bn_aggr(ins, spec: CoreSpec) -> float:
    """max(MIN_II, 13 N / 3), §6.3 [NKI-ISA]."""
    return float(max(spec.min_ii, 13 * _n(ins.data) / 3))


def memset(ins, spec: CoreSpec) -> float:
    """max(MIN_II, N/2) for zero in BF16/FP16, else max(MIN_II, N), §6.3."""
    n = _n(ins.dst)
    if ins.engine == "gpsimd":
        return float(_gpsimd(spec, n))
    fast = ins.value == 0 and ins.dst.dtype in _HALF
    return float(max(spec.min_ii, n / 2 if fast else n))


def iota(ins, spec: CoreSpec) -> float:
    return float(_gpsimd(spec, _n(ins.dst)))        # 150 + N, §6.3


def dma_copy(ins, spec: CoreSpec) -> float:
    return 0.0          # DMA engines are not clocked compute engines; see dma_shape


# --- DMA shape -------------------------------------------------------------------------

def _run_bytes(v) -> int:
    """Bytes of the longest contiguous run of one DMA side (a descriptor's size)."""
    if isinstance(v, Tile) and v.strides is None:
        return v.bytes_per_partition          # each partition is its own buffer, §3.4
    pattern = v.pattern if isinstance(v, DramAP) else tuple(zip(v.strides, v.free))
    run = 1
    for stride, num in reversed(pattern):
        if num == 1:
            continue
        if stride != run:
            break
        run *= num
    return run * _dt.itemsize(v.dtype)


def dma_shape(ins, spec: CoreSpec) -> tuple[float, int]:
    """(chunk bytes, DMA engines used). A transfer is split into contiguous chunks
    (descriptors) of the shorter contiguous run of its two sides (§3.4). With an SBUF
    side, each engine serves pmax / 16 = 8 partitions ("a [4, 4096] load uses one
    engine", [NKI-DMA]); DRAM to DRAM, the chunks packetised at 4 KiB spread over up
    to 16 engines."""
    chunk = getattr(ins, "chunk_bytes", None)     # set by DmaGather / DmaTranspose
    if chunk is None:
        chunk = min(_run_bytes(ins.src), _run_bytes(ins.dst))
    chunk = max(1, chunk)
    tiles = [v for v in (ins.src, ins.dst) if isinstance(v, Tile)]
    if tiles:
        per_engine = spec.pmax // spec.dma_engines
        parts = max(t.num_partitions for t in tiles)
        return float(chunk), max(1, min(spec.dma_engines, -(-parts // per_engine)))
    packets = math.ceil(ins.nbytes / chunk) * math.ceil(chunk / spec.dma_packet_bytes)
    return float(chunk), max(1, min(spec.dma_engines, packets))


# --- generation-dependent checks ---------------------------------------------------

def check_matmul(ins, spec: CoreSpec) -> None:
    bf16_dst = ins.dst.dtype == "bfloat16"
    _check(not bf16_dst or spec.psum_bf16, f"BF16 matmul dst needs NC-v4, not "
           f"{spec.name}, §2.2")
    limit = spec.max_moving_free * (2 if bf16_dst else 1)
    _check(ins.n <= limit, f"moving free size {ins.n} > {limit} on {spec.name}, §2.2")
    check_psum_banks(ins, spec)
    _check(ins.perf_mode == "none" or spec.fp8_double_row > 1,
           f"double_row needs NC-v3+, not {spec.name}, §2.2")
    dts = {ins.stationary.dtype, ins.moving.dtype}
    _check("float8_e4m3fn" not in dts or (spec.ocp_fp8 and "float8_e4m3" not in dts),
           "float8_e4m3fn matmul inputs need NC-v4 and cannot mix with float8_e4m3, §2.2")


def check_psum_banks(ins, spec: CoreSpec) -> None:
    """Before NC-v4 a matmul's dst lies in one PSUM bank (§3.2)."""
    bank = spec.psum_bank_bytes
    first, last = ins.dst.offset // bank, (ins.dst.offset + ins.dst.bytes_per_partition - 1) // bank
    _check(spec.matmul_spans_banks or first == last, f"matmul dst bytes "
           f"[{ins.dst.offset}, +{ins.dst.bytes_per_partition}) cross a {bank // KIB} KiB "
           f"PSUM bank, §3.2")


def check_dma(ins, spec: CoreSpec) -> None:
    _check(ins.dma_queue < spec.dma_queues,
           f"DMA queue {ins.dma_queue} >= {spec.dma_queues}, §3.4")


def check_tensor_scalar(ins, spec: CoreSpec) -> None:
    """§6.2: on Trn2 ScalarE tensor_scalar supports only mult/add combos."""
    allowed = spec.scalar_ts_ops
    if ins.engine != "scalar" or allowed is None:
        return
    for op in (ins.op0, ins.op1):
        _check(op is None or op in allowed, f"ScalarE tensor_scalar cannot do "
               f"{op!r} on {spec.name} (only {', '.join(allowed)}), §6.2")
