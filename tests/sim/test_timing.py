"""The timing model: per-instruction costs (§6.3), DMA (§3.4), overlap, determinism."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.hw import (CHIPS, DramAP, Hbm, Kernel, NeuronCore, Tile, chip_cores,
                        insert_semaphores, isa)
from jax_trn.hw import costs
from jax_trn.hw import dtypes as dt

TRN2 = CHIPS["trn2"].core


def sb(offset, p=128, n=512, dtype="bfloat16"):
    return Tile("sbuf", 0, p, offset, (n,), dtype)


def ps(offset=0, n=512):
    return Tile("psum", 0, 128, offset, (n,), "float32")


def run(instrs, gen="trn2", dram=None, **kw):
    core = NeuronCore(CHIPS[gen].core, **kw)
    return core.run(Kernel("k", list(instrs), {}), dram or {})


def matmul(dtype="bfloat16", n=512, **kw):
    return isa.NcMatmul(dst=ps(n=n), stationary=sb(0, n=128, dtype=dtype),
                        moving=sb(4096, n=n, dtype=dtype), **kw)


def test_bf16_matmul_is_512_cycles_plus_a_32_cycle_load_stationary():
    """Trn1 (no power throttle): LS of 128 columns (fast LS, M/4) then 512 MM cycles."""
    assert matmul().cycles(TRN2) == 512
    assert costs.load_stationary(matmul(), TRN2) == 32
    r = run([matmul()], gen="trn1")
    assert r.events[0].end_ns == pytest.approx((32 + 512) / 2.8)     # §2.2, §9
    assert r.flops == 2 * 128 * 128 * 512


def _chain(n, stationary_offsets, gen="trn1"):
    return run([isa.NcMatmul(dst=ps(2048 * (i % 8)), moving=sb(4096),
                             stationary=sb(stationary_offsets[i % len(stationary_offsets)], n=128))
                for i in range(n)], gen=gen)


def test_background_load_stationary_hides_behind_the_previous_multiply():
    """Only the first LS is exposed, whether the stationary changes or not (§2.2)."""
    for offsets in ((0,), (0, 256)):
        r = _chain(4, offsets)
        assert r.end_ns == pytest.approx((32 + 4 * 512) / 2.8)
        assert r.busy_ns["tensor"] == pytest.approx(r.end_ns)


def _after_vector(write_stationary: bool, same_stationary: bool, gen="trn1"):
    """matmul A; a vector op B (writing A's stationary or not); matmul C waiting on B."""
    a = isa.NcMatmul(dst=ps(0), stationary=sb(0, n=128), moving=sb(4096))
    b = isa.TensorCopy(dst=sb(0 if write_stationary else 12288, n=512, dtype="float32"),
                       src=sb(8192, n=512, dtype="float32"))
    c = isa.NcMatmul(dst=ps(2048), stationary=sb(0 if same_stationary else 256, n=128),
                     moving=sb(4096), waits=(("vector", 1),))
    r = run([a, b, c], gen=gen)
    ready = r.events[1].end_ns + 100 / CHIPS[gen].core.clock("tensor")   # §2.6
    return r.events[2].end_ns - ready


def test_same_stationary_skips_load_stationary_unless_written():
    assert 512 / 1.12 > (32 + 512) / 2.8       # B ends after A's MM: C's LS is exposed
    assert _after_vector(False, True) == pytest.approx(512 / 2.8)
    assert _after_vector(False, False) == pytest.approx((32 + 512) / 2.8)
    assert _after_vector(True, True) == pytest.approx((32 + 512) / 2.8)


def _ramp_ns(work_ns, floor=0.5, ramp=3000.0):
    """Time to do `work_ns` of full-rate work from the start of the throttle ramp."""
    slope = (1 - floor) / ramp
    return (np.sqrt(floor ** 2 + 2 * slope * work_ns) - floor) / slope


def test_trn2_tensor_engine_starts_throttled_and_ramps_over_3us():
    """§2.2 [NX-SUMMARY]: 50% at first, full rate after ~3 us of work."""
    r = _chain(40, (0, 256), gen="trn2")
    ls, mm = 32 / 2.4, 512 / 2.4
    first = r.events[0]
    assert first.end_ns == pytest.approx(ls + _ramp_ns(mm))
    assert r.events[-1].duration_ns == pytest.approx(mm)          # past the ramp
    ramp_loss = 3000 - 3000 * 0.75                                 # 0.75 us of work
    assert r.end_ns == pytest.approx(ls + 40 * mm + ramp_loss, rel=1e-9)
    assert _chain(1, (0,), gen="trn1").end_ns == pytest.approx((32 + 512) / 2.8)


def test_throttle_reengages_after_an_idle_window():
    warm = [isa.NcMatmul(dst=ps(2048 * (i % 8)), moving=sb(4096), stationary=sb(0, n=128))
            for i in range(30)]
    gap = isa.Activation(dst=sb(8192, n=4096), data=sb(40960, n=4096), func="exp",
                         waits=(("tensor", 30),))                 # TensorE idle 3.4 us
    late = isa.NcMatmul(dst=ps(0), moving=sb(4096), stationary=sb(0, n=128),
                        waits=(("scalar", 1),))
    r = run(warm + [gap, late], gen="trn2")
    assert r.events[-1].duration_ns == pytest.approx(_ramp_ns(512 / 2.4))
    assert r.events[29].duration_ns == pytest.approx(512 / 2.4)


def test_fp32_matmul_costs_4x_and_tf32_1x():
    assert matmul("float32").cycles(TRN2) == 4 * 512
    assert matmul("float32", precision="tf32").cycles(TRN2) == 512


def test_small_matmul_pays_the_64_cycle_floor():
    small = isa.NcMatmul(dst=ps(n=8), stationary=sb(0, n=128), moving=sb(4096, n=8))
    assert small.cycles(TRN2) == 64


def test_double_row_fp8_same_cycles_twice_the_flops():
    fp8 = isa.NcMatmul(dst=ps(), perf_mode="double_row",
                       stationary=Tile("sbuf", 0, 128, 0, (2, 128), "float8_e4m3"),
                       moving=Tile("sbuf", 0, 128, 4096, (2, 512), "float8_e4m3"))
    assert fp8.cycles(TRN2) == matmul().cycles(TRN2)
    assert fp8.flops == 2 * matmul().flops


@pytest.mark.parametrize("instr, cycles", [
    (isa.Activation(dst=sb(0), data=sb(4096), func="exp"), 512),
    (isa.Activation(dst=sb(0, n=16), data=sb(4096, n=16), func="exp"), 64),      # MIN_II
    (isa.Activation(dst=sb(0), data=sb(4096), func="exp", reduce_res=sb(8192, n=1)), 576),
    (isa.TensorTensor(dst=sb(0), data1=sb(4096), data2=sb(8192), op="add"), 512),  # bf16
    (isa.TensorTensor(dst=sb(0), data1=sb(4096), data2=sb(8192), op="max"), 512),  # v3 2x
    (isa.TensorTensor(dst=sb(0, dtype="float32"), data1=sb(4096, dtype="float32"),
                      data2=sb(8192, dtype="float32"), op="add"), 1024),
    (isa.TensorTensor(dst=sb(0), data1=ps(), data2=sb(8192), op="max"), 512),     # PSUM
    (isa.TensorReduce(dst=sb(0, n=1), data=sb(4096), op="add"), 256),             # bf16
    (isa.TensorReduce(dst=sb(0, n=1, dtype="float32"), data=sb(4096, dtype="float32"),
                      op="add"), 512),
    (isa.Memset(dst=sb(0), value=0), 256),
    (isa.Memset(dst=sb(0), value=1), 512),
    (isa.Iota(dst=sb(0, dtype="int32"), pattern=((1, 512),)), 662),               # 150+N
    (isa.TensorCopy(dst=sb(0), src=sb(4096)), 128),              # v3 4x bf16 SBUF mode
    (isa.TensorCopy(dst=sb(0), src=ps()), 256),                  # v3 2x PSUM mode
    (isa.NcTranspose(dst=ps(n=128), data=sb(0, n=128)), 128),
    (isa.NcTranspose(dst=Tile("sbuf", 0, 32, 0, (32,), "float32"),
                     data=Tile("sbuf", 0, 32, 4096, (32,), "float32"), engine="vector"), 64),
])
def test_cycles(instr, cycles):
    assert instr.cycles(TRN2) == cycles


def test_trn1_has_no_perf_modes():
    copy = isa.TensorCopy(dst=sb(0), src=sb(4096))
    assert copy.cycles(CHIPS["trn1"].core) == 512
    bf16_max = isa.TensorTensor(dst=sb(0), data1=sb(4096), data2=sb(8192), op="max")
    assert bf16_max.cycles(CHIPS["trn1"].core) == 1024


def test_dma_128_partitions_x_4kib():
    """~1.3 us fixed + 512 KiB / 368 GB/s: 4 KiB per partition is past the knee."""
    t = Tile("sbuf", 0, 128, 0, (1024,), "float32")
    dma = isa.DmaCopy(dst=t, src=DramAP("x", 0, ((1024, 128), (1, 1024)), "float32"))
    r = run([dma], dram={"x": np.zeros(128 * 1024, np.float32)})
    assert r.end_ns == pytest.approx(1300 + 512 * 1024 / 368)
    assert r.hbm_bytes == 512 * 1024 and r.events[0].bytes == 512 * 1024


def test_dma_efficiency_follows_the_published_curve():
    """§3.4 [NKI-DMA] figure: linear in bytes per descriptor up to ~2.5 KiB, then flat."""
    eff = [TRN2.dma_efficiency(b) for b in (2, 64, 128, 256, 2048, 2500, 4096, 65536)]
    assert eff == sorted(eff)
    assert eff[2] == pytest.approx(0.051, abs=0.005) and eff[3] < 0.11     # <256 B
    assert eff[4] == pytest.approx(0.82, abs=0.01) and eff[5:] == [1.0] * 3


def test_one_dma_engine_serves_eight_partitions():
    """[NKI-DMA] example 1: a [4, 4096] BF16 load runs on one engine, 32 KiB in 1,416 ns."""
    t = Tile("sbuf", 0, 4, 0, (4096,), "bfloat16")
    dma = isa.DmaCopy(dst=t, src=DramAP("x", 0, ((4096, 4), (1, 4096)), "bfloat16"))
    assert costs.dma_shape(dma, TRN2) == (8192.0, 1)
    r = run([dma], dram={"x": np.zeros(4 * 4096, dt.np_dtype("bfloat16"))})
    assert r.end_ns - 1300 == pytest.approx(1416, rel=0.01)


def test_concurrent_dmas_share_the_cores_dma_bandwidth():
    def load(q, off):
        return isa.DmaCopy(dst=Tile("sbuf", 0, 128, off, (1024,), "float32"),
                           src=DramAP("x", 0, ((1024, 128), (1, 1024)), "float32"),
                           dma_queue=q)
    dram = {"x": np.zeros(128 * 1024, np.float32)}
    one = run([load(0, 0)], dram=dram).end_ns
    two = run([load(0, 0), load(1, 8192)], dram=dram).end_ns
    transfer = one - 1300
    assert two == pytest.approx(1300 + 2 * transfer, rel=1e-6)


def test_hbm_is_shared_between_cores_of_a_chip():
    """Trn1 cores' DMA (272 GB/s each) never saturate 820 GB/s; a tiny HBM does."""
    def load():
        return isa.DmaCopy(dst=Tile("sbuf", 0, 128, 0, (1024,), "float32"),
                           src=DramAP("x", 0, ((1024, 128), (1, 1024)), "float32"))
    dram = {"x": np.zeros(128 * 1024, np.float32)}
    hbm = Hbm(100.0)
    a = run([load()], dram=dram, hbm=hbm, core_id=0).end_ns
    b = run([load()], dram=dram, hbm=hbm, core_id=1).end_ns
    assert a == pytest.approx(1300 + 512 * 1024 / 100)
    assert b == pytest.approx(1300 + 2 * 512 * 1024 / 100)


def test_independent_engines_overlap_and_same_engine_serializes():
    act = isa.Activation(dst=sb(0), data=sb(4096), func="exp")
    add = isa.TensorTensor(dst=sb(8192), data1=sb(12288), data2=sb(16384), op="max")
    both = run([act, add])
    assert both.end_ns == pytest.approx(max(512 / 1.2, 512 / 0.96))
    two = run([act, act.__class__(dst=sb(8192), data=sb(4096), func="exp")])
    assert two.end_ns == pytest.approx(2 * 512 / 1.2)
    assert two.busy_ns["scalar"] == pytest.approx(2 * 512 / 1.2)


def test_dependent_instruction_pays_static_overhead():
    producer = isa.Activation(dst=sb(0), data=sb(4096), func="exp")
    consumer = isa.TensorTensor(dst=sb(8192), data1=sb(0), data2=sb(12288), op="add")
    r = run(insert_semaphores([producer, consumer]))
    p, c = r.events
    assert c.start_ns == pytest.approx(p.end_ns + 100 / 0.96)     # §2.6
    assert c.wait_start_ns == 0.0


def test_determinism():
    instrs = insert_semaphores([
        isa.DmaCopy(dst=sb(0), src=DramAP("x", 0, ((512, 128), (1, 512)), "bfloat16")),
        isa.DmaCopy(dst=sb(4096), src=DramAP("x", 0, ((512, 128), (1, 512)), "bfloat16"),
                    dma_queue=1),
        matmul(), isa.TensorCopy(dst=sb(8192, dtype="float32"), src=ps()),
        isa.Activation(dst=sb(16384), data=sb(8192, dtype="float32"), func="gelu"),
    ])
    import ml_dtypes
    x = np.random.default_rng(0).normal(size=128 * 512).astype(ml_dtypes.bfloat16)
    a = run(instrs, dram={"x": x})
    b = run(instrs, dram={"x": x})
    assert a.events == b.events and a.busy_ns == b.busy_ns


def test_dma_shape_uses_the_shorter_contiguous_run():
    t = Tile("sbuf", 0, 128, 0, (64,), "float32")
    column = isa.DmaCopy(dst=t, src=DramAP("x", 0, ((1, 128), (128, 64)), "float32"))
    assert costs.dma_shape(column, TRN2) == (4.0, 16)
    rows = isa.DmaCopy(dst=t, src=DramAP("x", 0, ((64, 128), (1, 64)), "float32"))
    assert costs.dma_shape(rows, TRN2) == (256.0, 16)
    flat = isa.DmaCopy(dst=DramAP("y", 0, ((1, 65536),), "float32"),
                       src=DramAP("x", 0, ((1, 65536),), "float32"))
    assert costs.dma_shape(flat, TRN2) == (262144.0, 16)     # 64 packets of 4 KiB


def test_chip_cores_share_one_hbm():
    cores = chip_cores(CHIPS["trn2"])
    assert len(cores) == 8 and len({id(c.hbm) for c in cores}) == 1
    assert cores[0].hbm.capacity == 2900.0 and cores[7].core_id == 7
    assert cores[0].hbm.share == pytest.approx(2900 / 8)


def test_cores_streaming_together_get_fair_hbm_shares():
    """Simulated one after another, the cores of a chip still finish together."""
    def load(q):
        return isa.DmaCopy(dst=Tile("sbuf", 0, 128, 0, (1024,), "float32"),
                           src=DramAP("x", 0, ((1024, 128), (1, 1024)), "float32"),
                           dma_queue=q)
    dram = {"x": np.zeros(128 * 1024, np.float32)}
    ends = [c.run(Kernel("k", [load(q) for q in range(4)], {}), dram).end_ns
            for c in chip_cores(CHIPS["trn2"])]
    assert ends == [ends[0]] * 8
    assert ends[0] == pytest.approx(1300 + 4 * 512 * 1024 / (2900 / 8))


def test_timing_only_runs_match_executed_runs():
    instrs = [matmul(), isa.Activation(dst=sb(16384), data=sb(4096), func="exp")]
    a, b = run(instrs), NeuronCore(TRN2).run(Kernel("k", instrs, {}), {}, execute=False)
    assert a.events == b.events


def test_a_run_that_starts_earlier_starts_a_new_timeline():
    core = NeuronCore(TRN2)
    first = core.run(Kernel("k", [matmul()], {}), {})
    again = core.run(Kernel("k", [matmul()], {}), {})
    assert again.events == first.events


def test_dma_transpose_runs_at_its_share_of_the_dma_rate():
    """§3.4: DMA transpose reaches ~90% of DMA throughput HBM->SBUF."""
    from jax_trn.hw import isa
    from jax_trn.hw.core import NeuronCore
    from jax_trn.hw.program import DramTensor, Kernel
    from jax_trn.hw.spec import CHIPS
    import ml_dtypes
    import numpy as np
    spec = CHIPS["trn2"].core
    n = 128
    dst = isa.Tile("sbuf", 0, n, 0, (n * 16,), "bfloat16")
    src = isa.DramAP("x", 0, ((n * 16, n), (1, n * 16)), "bfloat16")
    tsrc = isa.DramAP("x", 0, ((n, n * 16), (1, n)), "bfloat16")

    def data_ns(instr):
        core = NeuronCore(spec)
        run = core.run(Kernel("k", [instr], {"x": DramTensor("x", (n * n * 16,), "bfloat16")}),
                       {"x": np.zeros(n * n * 16, ml_dtypes.bfloat16)}, 0.0)
        return run.end_ns - spec.dma_fixed_ns

    copy = data_ns(isa.DmaCopy(dst=dst, src=src))
    transpose = data_ns(isa.DmaTranspose(dst=isa.Tile("sbuf", 0, n, 0, (n * 16,), "bfloat16"),
                                         src=tsrc))
    assert 1.05 < transpose / copy < 1.2    # ~1/0.9 of a full-rate (4 KiB per partition) copy


# --- the SBUF access VectorE and GpSimd share (§2.3, §2.6) --------------------------------

def _pair(vector_dtype: str, gen: str):
    """An independent VectorE copy and GpSimd copy of 512 elements per partition."""
    v = isa.TensorCopy(dst=sb(0, dtype=vector_dtype), src=sb(4096, dtype=vector_dtype))
    g = isa.TensorCopy(dst=sb(8192, dtype="float32"), src=sb(12288, dtype="float32"),
                       engine="gpsimd")
    r = run([v, g], gen=gen)
    (ev,), (eg,) = ([e for e in r.events if e.queue == q] for q in ("vector", "gpsimd"))
    return ev, eg


def test_vector_fast_modes_hold_the_bus_gpsimd_uses():
    """NC-v3: a BF16 SBUF copy runs in VectorE's 4x mode, which uses GpSimd's bus, so
    GpSimd starts when it ends (§2.3); an FP32 tensor_tensor (no fast mode) overlaps."""
    ev, eg = _pair("bfloat16", "trn2")
    assert ev.start_ns == 0 and eg.start_ns == pytest.approx(ev.end_ns)
    tt = isa.TensorTensor(dst=sb(0, dtype="float32"), data1=sb(4096, dtype="float32"),
                          data2=sb(16384, dtype="float32"), op="add")
    g = isa.TensorCopy(dst=sb(8192, dtype="float32"), src=sb(12288, dtype="float32"),
                       engine="gpsimd")
    r = run([tt, g], gen="trn2")
    assert [e.start_ns for e in r.events] == [0, 0]
    assert not costs.shares_gpsimd_port(tt, TRN2) and costs.shares_gpsimd_port(g, TRN2)


def test_on_nc_v2_vector_and_gpsimd_never_touch_sbuf_together():
    """§2.6 [NKI-ARCH1]: on NC-v2 VectorE and GpSimd cannot access SBUF at once."""
    tt = isa.TensorTensor(dst=sb(0, dtype="float32"), data1=sb(4096, dtype="float32"),
                          data2=sb(16384, dtype="float32"), op="add")
    g = isa.TensorCopy(dst=sb(8192, dtype="float32"), src=sb(12288, dtype="float32"),
                       engine="gpsimd")
    r = run([tt, g], gen="trn1")
    first, second = sorted(r.events, key=lambda e: e.start_ns)
    assert second.start_ns == pytest.approx(first.end_ns)
