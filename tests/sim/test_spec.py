"""Generations as data: each CoreSpec / ChipSpec against the fact sheet (trainium-hardware.md)."""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

from jax_trn.hw import CHIPS, IsaError, Kernel, NeuronCore, Tile, isa

KIB, GIB = 1024, 1024 ** 3
V2, V3, V4 = (CHIPS[g].core for g in ("trn1", "trn2", "trn3"))

# §1.1 chip level: cores, HBM capacity, HBM bandwidth (GB/s; §10.2 choices)
CHIP_TABLE = {
    "trn1": (2, 32 * GIB, 820.0),
    "trn2": (8, 96 * GIB, 2900.0),
    "trn3": (8, 144 * GIB, 4900.0),
}
# §1.2 clocks (GHz): tensor, vector, scalar, gpsimd
CLOCKS = {
    "trn1": (2.8, 1.12, 1.4, 1.4),
    "trn2": (2.4, 0.96, 1.2, 1.2),
    "trn3": (2.4, 1.2, 1.2, 1.2),
}
# §1.2 per-core TensorE peaks (TFLOPS): bf16, fp8, fp32
PEAKS = {"trn1": (92, 92, 23), "trn2": (79, 158, 20), "trn3": (79, 158, 20)}


@pytest.mark.parametrize("gen", list(CHIP_TABLE))
def test_chip_level(gen):
    chip = CHIPS[gen]
    assert (chip.cores, chip.hbm_bytes, chip.hbm_bytes_per_ns) == CHIP_TABLE[gen]
    bf16, fp8, fp32 = PEAKS[gen]
    assert chip.peak_tflops_per_core("bfloat16") == bf16
    assert chip.peak_tflops_per_core("float8_e4m3") == fp8
    assert chip.peak_tflops_per_core("float32") == fp32


@pytest.mark.parametrize("gen", list(CLOCKS))
def test_engine_clocks_and_derived_peak(gen):
    core = CHIPS[gen].core
    clocks = tuple(core.clock(e) for e in ("tensor", "vector", "scalar", "gpsimd"))
    assert clocks == CLOCKS[gen]
    # §1.2 sanity check: 128 x 128 PEs x 2 FLOP x clock ~ the published peak (±1%)
    derived = 128 * 128 * 2 * core.clock("tensor") / 1e3
    assert derived == pytest.approx(PEAKS[gen][0], rel=0.01)


def test_datapath_widths():
    """§1.2 elements per cycle (16-bit floats vs other types)."""
    assert V2.width("vector", "bfloat16") == V2.width("vector", "float32") == 128
    assert (V3.width("vector", "bfloat16"), V3.width("vector", "float32")) == (512, 256)
    assert V3.width("vector", "float8_e4m3") == 256 and V4.width("vector", "float8_e4m3") == 512
    assert V3.width("scalar", "bfloat16") == 128
    assert (V4.width("scalar", "bfloat16"), V4.width("scalar", "float32")) == (256, 128)
    assert all(c.width("gpsimd", "float32") == 128 for c in (V2, V3, V4))
    # v3+ VectorE perf modes are the width ratios (§2.3)
    assert V3.vector_fast_copy == V3.width("vector", "bfloat16") // 128
    assert V3.vector_fast_psum == V3.width("vector", "float32") // 128


def test_memories():
    """§1.1 SBUF 192/224/256 KiB per partition, PSUM 16 KiB in 8 banks (§3.2)."""
    assert [c.sbuf_partition_bytes for c in (V2, V3, V4)] == [192 * KIB, 224 * KIB, 256 * KIB]
    for c in (V2, V3, V4):
        assert c.pmax == 128 and c.psum_partition_bytes == 16 * KIB and c.psum_banks == 8
        assert c.psum_bank_bytes == 2 * KIB
        assert c.sbuf_usable_bytes == c.sbuf_partition_bytes - (16 * KIB + 264)   # §3.1


def test_dma():
    """§3.4: 16 engines x 16 queues per core at 17/23/33 B/ns; ~1.3 us fixed cost."""
    assert [c.dma_bytes_per_ns for c in (V2, V3, V4)] == [272, 368, 528]
    for c in (V2, V3, V4):
        assert (c.dma_engines, c.dma_queues, c.dma_fixed_ns) == (16, 16, 1300.0)
    assert not V2.dma_transpose and V3.dma_transpose and V4.dma_transpose


def test_tensor_engine_features():
    """§2.2: double_row FP8 (v3+), MX 4x (v4), moving F 512 / 4096, BF16 PSUM (v4)."""
    assert [c.fp8_double_row for c in (V2, V3, V4)] == [1, 2, 2]
    assert [c.mx_speedup for c in (V2, V3, V4)] == [1, 1, 4]
    assert [c.max_moving_free for c in (V2, V3, V4)] == [512, 512, 4096]
    assert [c.psum_bf16 for c in (V2, V3, V4)] == [False, False, True]
    assert [c.ocp_fp8 for c in (V2, V3, V4)] == [False, False, True]
    assert [c.fp32_transpose_factor for c in (V2, V3, V4)] == [4, 2, 2]
    assert all(c.fp32_matmul_factor == 4 and c.ls_speedup == 4 for c in (V2, V3, V4))


def test_vector_scalar_features():
    """§2.3-§2.4: v3 perf modes, v4 exponential / quantize_mx / 2x ScalarE BF16."""
    assert [c.vector_fast_copy for c in (V2, V3, V4)] == [1, 4, 4]
    assert [c.scalar_fast_bf16 for c in (V2, V3, V4)] == [1, 1, 2]
    assert [c.vector_exponential for c in (V2, V3, V4)] == [0, 0, 4]
    assert [c.quantize_mx for c in (V2, V3, V4)] == [0, 0, 4]


def test_overheads_and_throttle():
    """§2.6 overheads; §2.2 power throttling on Trn2/Trn3 only."""
    for c in (V2, V3, V4):
        assert (c.min_ii, c.mm_init_latency, c.static_overhead, c.gpsimd_startup) == \
            (64, 64, 100, 150)
        assert c.dynamic_address_cycles == 600 and c.hwdge_ns == 600.0
    assert [c.pe_throttle_floor for c in (V2, V3, V4)] == [1.0, 0.5, 0.5]
    assert V3.pe_throttle_ramp_ns == V3.pe_throttle_window_ns == 3000.0


def test_no_generation_checks_in_code_paths():
    """Generations are data: the timing and cost code never names one."""
    hw = pathlib.Path(isa.__file__).parent
    pattern = re.compile(r"generation\s*==|\.generation\b|['\"]trn[123]['\"]|NC_V[234]|"
                         r"version\(")
    for name in ("core.py", "costs.py", "bandwidth.py", "tensor_pipe.py", "sync.py"):
        code = (hw / name).read_text()
        assert not pattern.search(code), f"{name} branches on a generation"


def _sbuf_tile(nbytes):
    return Tile("sbuf", 0, 128, 0, (nbytes // 4,), "float32")


@pytest.mark.parametrize("gen", ["trn1", "trn2", "trn3"])
def test_sbuf_capacity_is_enforced_per_generation(gen):
    core = CHIPS[gen].core
    usable = core.sbuf_usable_bytes
    ok = isa.TensorCopy(dst=_sbuf_tile(usable), src=_sbuf_tile(usable))
    NeuronCore(core).validate(Kernel("ok", [ok], {}))
    past = isa.TensorCopy(dst=_sbuf_tile(usable + 4), src=_sbuf_tile(usable + 4))
    with pytest.raises(IsaError, match="outside"):
        NeuronCore(core).validate(Kernel("past", [past], {}))


def test_trn2_sbuf_tile_does_not_fit_trn1():
    tile = _sbuf_tile(200 * KIB)
    copy = isa.TensorCopy(dst=tile, src=tile)
    NeuronCore(V3).validate(Kernel("k", [copy], {}))
    with pytest.raises(IsaError):
        NeuronCore(V2).validate(Kernel("k", [copy], {}))


def test_psum_capacity_is_enforced():
    past = Tile("psum", 0, 128, 16 * KIB - 1024, (512,), "float32")
    copy = isa.TensorCopy(dst=Tile("sbuf", 0, 128, 0, (512,), "float32"), src=past)
    with pytest.raises(IsaError, match="psum"):
        NeuronCore(V3).validate(Kernel("k", [copy], {}))


def test_hardware_numbers_live_in_the_spec():
    """No hw module but spec.py writes the partition count or the PSUM geometry: they
    read spec.PMAX, PSUM_BANKS, ... (issue 11). fidelity.py holds published figures and
    the published benchmarks' shapes, not model constants."""
    hw = pathlib.Path(isa.__file__).parent
    for path in sorted(hw.glob("*.py")):
        if path.name in ("spec.py", "fidelity.py"):
            continue
        consts = {n.value for n in ast.walk(ast.parse(path.read_text()))
                  if isinstance(n, ast.Constant) and type(n.value) is int}
        assert not consts & {128, 2048, 16384}, f"{path.name} writes a hardware number"
