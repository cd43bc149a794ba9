"""The timing model: per-instruction costs (§6.3), DMA (§3.4), overlap, determinism."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.hw import (CHIPS, DramAP, Hbm, Kernel, NeuronCore, Tile, chip_cores,
                        insert_semaphores, isa)
from jax_trn.hw import costs

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


def test_bf16_matmul_is_512_cycles_213ns_on_trn2():
    assert matmul().cycles(TRN2) == 512
    r = run([matmul()])
    assert r.events[0].end_ns == pytest.approx(512 / 2.4)        # 213 ns, §9
    assert r.flops == 2 * 128 * 128 * 512


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
    """~1.3 us fixed + 512 KiB / 368 GB/s (x 1/efficiency(4 KiB) = 1/0.94)."""
    t = Tile("sbuf", 0, 128, 0, (1024,), "float32")
    dma = isa.DmaCopy(dst=t, src=DramAP("x", 0, ((1024, 128), (1, 1024)), "float32"))
    r = run([dma], dram={"x": np.zeros(128 * 1024, np.float32)})
    expected = 1300 + 512 * 1024 / 368
    assert r.end_ns == pytest.approx(expected, rel=0.05)
    assert r.hbm_bytes == 512 * 1024 and r.events[0].bytes == 512 * 1024


def test_dma_efficiency_is_monotone_and_small_chunks_are_slow():
    eff = [TRN2.dma_efficiency(b) for b in (64, 256, 2048, 4096, 65536)]
    assert eff == sorted(eff) and eff[1] <= 0.5 and eff[2] > 0.85 and eff[3] > 0.9


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


def test_chip_cores_share_one_hbm():
    cores = chip_cores(CHIPS["trn2"])
    assert len(cores) == 8 and len({id(c.hbm) for c in cores}) == 1
    assert cores[0].hbm.capacity == 2900.0 and cores[7].core_id == 7
