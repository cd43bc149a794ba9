"""Hardware constraints raise IsaError, at construction or (per generation) at run."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.hw import DramAP, IsaError, Kernel, Tile, isa
from tests.sim.helpers import core, tile


def sb(p, *free, dtype="bfloat16", offset=0, start=0):
    return Tile("sbuf", start, p, offset, free, dtype)


def ps(p, *free, dtype="float32", offset=0):
    return Tile("psum", 0, p, offset, free, dtype)


def run(instr, gen="trn2"):
    core(gen).run(Kernel("k", [instr], {}), {})


@pytest.mark.parametrize("build", [
    lambda: isa.TensorCopy(dst=sb(128, 4), src=ps(128, 4), engine="gpsimd"),
    lambda: isa.Memset(dst=ps(128, 4), value=0, engine="gpsimd"),
    lambda: isa.TensorTensor(dst=sb(128, 4), data1=ps(128, 4), data2=ps(128, 4, offset=2048),
                             op="add"),
    lambda: isa.NcMatmul(dst=ps(129 - 1, 4), stationary=sb(128, 129), moving=sb(128, 4)),
    lambda: isa.NcMatmul(dst=ps(128, 4), stationary=sb(64, 128), moving=sb(128, 4)),
    lambda: isa.NcMatmul(dst=ps(128, 4), stationary=sb(128, 128, dtype="float32"),
                         moving=sb(128, 4)),                       # FP32 x BF16
    lambda: isa.NcMatmul(dst=sb(128, 4, dtype="float32"), stationary=sb(128, 128),
                         moving=sb(128, 4)),                       # dst not in PSUM
    lambda: isa.NcMatmul(dst=ps(4, 4), stationary=sb(4, 4, dtype="int8"),
                         moving=sb(4, 4, dtype="int8")),
    lambda: isa.NcTranspose(dst=sb(33, 2), data=sb(2, 33), engine="vector"),
    lambda: isa.NcTranspose(dst=ps(129 - 1, 129), data=sb(129, 128)),
    lambda: isa.TensorReduce(dst=sb(128, 1), data=sb(128, 4), op="add", axis=(0,)),
    lambda: isa.TensorTensor(dst=sb(128, 4), data1=sb(128, 4), data2=sb(128, 5), op="add"),
    lambda: isa.TensorTensor(dst=sb(128, 4), data1=sb(128, 4), data2=sb(128, 4), op="frob"),
    lambda: isa.Activation(dst=sb(128, 4), data=sb(128, 4), func="frob"),
    lambda: isa.TensorCopy(dst=sb(16, 4, start=16), src=sb(16, 4)),   # start partition 16
    lambda: isa.TensorCopy(dst=sb(100, 4), src=sb(100, 4), engine="tensor"),
    lambda: isa.DmaCopy(dst=ps(128, 4), src=DramAP("x", 0, ((4, 128), (1, 4)), "float32")),
    lambda: isa.DmaCopy(dst=sb(128, 4), src=DramAP("x", 0, ((4, 128), (1, 3)), "bfloat16")),
    lambda: isa.Iota(dst=sb(128, 4, dtype="int32"), pattern=((1, 5),)),
])
def test_construction_rejects(build):
    with pytest.raises(IsaError):
        build()


def test_moving_free_513_is_rejected_on_trn2_but_not_trn3():
    instr = isa.NcMatmul(dst=ps(128, 513), stationary=sb(128, 128), moving=sb(128, 513))
    with pytest.raises(IsaError, match="moving free size 513"):
        run(instr, "trn2")
    run(instr, "trn3")


def test_matmul_dst_must_stay_in_one_psum_bank_before_v4():
    instr = isa.NcMatmul(dst=ps(128, 512, offset=1024), stationary=sb(128, 128),
                         moving=sb(128, 512))
    with pytest.raises(IsaError, match="PSUM bank"):
        run(instr, "trn2")


def test_double_row_needs_v3():
    instr = isa.NcMatmul(dst=ps(128, 512), stationary=sb(128, 2, 128, dtype="float8_e4m3"),
                         moving=sb(128, 2, 512, dtype="float8_e4m3"), perf_mode="double_row")
    with pytest.raises(IsaError, match="double_row"):
        run(instr, "trn1")
    run(instr, "trn2")


def test_bf16_psum_dst_needs_v4():
    instr = isa.NcMatmul(dst=ps(128, 4, dtype="bfloat16"), stationary=sb(128, 128),
                         moving=sb(128, 4))
    with pytest.raises(IsaError, match="BF16"):
        run(instr, "trn2")
    run(instr, "trn3")


def test_sbuf_capacity_is_checked_per_generation():
    t = sb(128, 8, dtype="float32", offset=190 * 1024)       # beyond Trn1's usable SBUF
    instr = isa.Memset(dst=t, value=0.0)
    with pytest.raises(IsaError, match="Memset"):
        run(instr, "trn1")
    run(instr, "trn2")


def test_dma_queue_limit():
    with pytest.raises(IsaError, match="queue 16"):
        run(isa.DmaCopy(dst=sb(1, 4, dtype="float32"),
                        src=DramAP("x", 0, ((4, 1), (1, 4)), "float32"), dma_queue=16))


def test_scalar_engine_tensor_scalar_ops_on_trn2():
    instr = isa.TensorScalar(dst=sb(128, 4), data=sb(128, 4), op0="max", operand0=0.0,
                             engine="scalar")
    with pytest.raises(IsaError, match="ScalarE"):
        run(instr, "trn2")
    run(instr, "trn3")


def test_dram_access_out_of_bounds():
    instr = isa.DmaCopy(dst=tile((2, 4)), src=DramAP("x", 2, ((4, 2), (1, 4)), "float32"))
    with pytest.raises(IsaError, match="outside"):
        core().run(Kernel("k", [instr], {}), {"x": np.zeros(8, np.float32)})


def test_overlapping_dram_write_is_rejected():
    instr = isa.DmaCopy(dst=DramAP("y", 0, ((0, 2), (1, 4)), "float32"), src=tile((2, 4)))
    with pytest.raises(IsaError, match="more than once"):
        core().run(Kernel("k", [instr], {}), {"y": np.zeros(8, np.float32)})


@pytest.mark.parametrize("build, match", [
    (lambda: isa.TensorCopy(dst=sb(128, 4), src=ps(128, 4), engine="gpsimd"), "GpSimd"),
    (lambda: isa.TensorTensor(dst=sb(128, 4), data1=ps(128, 4), data2=ps(128, 4), op="add"),
     "both be in PSUM"),
    (lambda: isa.NcMatmul(dst=ps(128, 4), stationary=sb(128, 129), moving=sb(128, 4)),
     "stationary free size 129"),
    (lambda: isa.NcMatmul(dst=ps(128, 4), stationary=sb(128, 128, dtype="float32"),
                          moving=sb(128, 4)), "FP32/TF32"),
])
def test_named_violations(build, match):
    with pytest.raises(IsaError, match=match):
        build()
