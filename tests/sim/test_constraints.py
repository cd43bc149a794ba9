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
    lambda: isa.NcTranspose(dst=sb(32, 32, start=16), data=sb(32, 32), engine="vector"),
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


def mxt(p, f, dtype="float8_e4m3fn_x4", start=0):
    return Tile("sbuf", start, p, 0, (f,), dtype)


def mx_mm(st=None, mv=None, sts=None, mvs=None, dst=None):
    return isa.NcMatmulMx(dst=dst or ps(128, 512), stationary=st or mxt(128, 128),
                          moving=mv or mxt(128, 512), stationary_scale=sts or mxt(128, 128, "uint8"),
                          moving_scale=mvs or mxt(128, 512, "uint8"))


@pytest.mark.parametrize("build, match", [
    # nc_matmul_mx (§2.2, §6.2)
    (lambda: mx_mm(st=mxt(48, 128), mv=mxt(48, 512)), "multiples of 32"),
    (lambda: mx_mm(st=mxt(128, 127), dst=ps(127, 512)), "even"),
    (lambda: mx_mm(mv=mxt(128, 513), dst=ps(128, 513)), "moving free size 513"),
    (lambda: mx_mm(st=mxt(128, 128, "bfloat16")), "must be one of"),
    (lambda: mx_mm(sts=mxt(128, 64, "uint8")), "stationary_scale"),
    (lambda: mx_mm(sts=mxt(128, 128, "float32")), "E8M0"),
    (lambda: mx_mm(st=mxt(32, 128), mv=mxt(32, 512), sts=mxt(32, 128, "uint8"),
                   mvs=mxt(4, 512, "uint8")), "stationary_scale"),      # 32 rows: 4 scale rows
    # quantize_mx (§2.3, §6.2)
    (lambda: isa.QuantizeMx(dst=mxt(32, 2), src=sb(32, 8, dtype="float32"),
                            dst_scale=mxt(4, 2, "uint8")), "BF16/FP16"),
    (lambda: isa.QuantizeMx(dst=mxt(32, 2, "float4_e2m1fn_x4"), src=sb(32, 8),
                            dst_scale=mxt(4, 2, "uint8")), "float8_e4m3fn_x4"),
    (lambda: isa.QuantizeMx(dst=mxt(16, 2), src=sb(16, 8), dst_scale=mxt(4, 2, "uint8")),
     "multiple of 32"),
    (lambda: isa.QuantizeMx(dst=mxt(32, 2), src=sb(32, 6), dst_scale=mxt(4, 2, "uint8")),
     "multiple of 4"),
    (lambda: isa.QuantizeMx(dst=mxt(64, 2), src=sb(64, 8), dst_scale=mxt(8, 2, "uint8")),
     "dst_scale"),
    # packed MX types only where they are taken (§6.2), never cast by DMA (§3.4)
    (lambda: isa.TensorTensor(dst=mxt(128, 4), data1=mxt(128, 4), data2=mxt(128, 4), op="add"),
     "packed MX"),
    (lambda: isa.TensorCopy(dst=mxt(128, 4, "uint32"), src=mxt(128, 4)), "packed MX"),
    (lambda: isa.DmaCopy(dst=mxt(128, 4, "uint32"),
                         src=DramAP("x", 0, ((4, 128), (1, 4)), "float8_e4m3fn_x4")), "MX"),
    # scalar_tensor_tensor, exponential (§6.2)
    (lambda: isa.ScalarTensorTensor(dst=sb(128, 4), data=ps(128, 4), op0="add", operand0=1.0,
                                    op1="add", operand1=ps(128, 4, offset=2048)), "PSUM"),
    (lambda: isa.ScalarTensorTensor(dst=sb(128, 4), data=sb(128, 4), op0="bitwise_and",
                                    operand0=1, op1="add", operand1=sb(128, 4)), "arithmetic"),
    (lambda: isa.ScalarTensorTensor(dst=sb(128, 4), data=sb(128, 4), op0="add", operand0=1.0,
                                    op1="add", operand1=sb(128, 5)), "operand1"),
    (lambda: isa.Exponential(dst=sb(128, 4), src=sb(128, 4), reduce_res=sb(128, 2)),
     "reduce_res"),
    # GpSimd: no PSUM (§2.5); partition reduce and affine select operands (§6.2)
    (lambda: isa.TensorPartitionReduce(dst=sb(1, 4), data=ps(128, 4), op="add"), "GpSimd"),
    (lambda: isa.TensorPartitionReduce(dst=sb(1, 4), data=sb(128, 4), op="min"), "op must"),
    (lambda: isa.TensorPartitionReduce(dst=sb(2, 4), data=sb(128, 4), op="add"), r"\[1, 4\]"),
    (lambda: isa.TensorPartitionReduce(dst=sb(1, 4), data=sb(128, 4), op="bitwise_or"),
     "integer"),
    (lambda: isa.AffineSelect(dst=ps(128, 4), on_true_tile=sb(128, 4), on_false_value=0.0,
                              pattern=((1, 4),)), "in sbuf"),
    (lambda: isa.AffineSelect(dst=sb(128, 4), on_true_tile=sb(128, 4), on_false_value=0.0,
                              pattern=((1, 5),)), "5 elements"),
    (lambda: isa.AffineSelect(dst=sb(128, 1), on_true_tile=sb(128, 1), on_false_value=0.0,
                              pattern=((1, 1),) * 5), "1-4 dims"),
    (lambda: isa.AffineSelect(dst=sb(128, 4), on_true_tile=sb(128, 4), on_false_value=0.0,
                              pattern=((1, 4),), cmp_op="add"), "comparison"),
    # DMA gather and transpose (§3.4, §6.2)
    (lambda: isa.DmaGather(dst=sb(4, 3, dtype="float32"), indices=sb(4, 1, dtype="float32"),
                           src=DramAP("t", 0, ((3, 5), (1, 3)), "float32")), "int32"),
    (lambda: isa.DmaGather(dst=ps(4, 3), indices=sb(4, 1, dtype="int32"),
                           src=DramAP("t", 0, ((3, 5), (1, 3)), "float32")), "SBUF"),
    (lambda: isa.DmaGather(dst=sb(4, 4, dtype="float32"), indices=sb(4, 1, dtype="int32"),
                           src=DramAP("t", 0, ((3, 5), (1, 3)), "float32")), "cannot hold"),
    (lambda: isa.DmaGather(dst=sb(4, 3, dtype="float32"), indices=sb(4, 1, dtype="int32"),
                           src=sb(5, 3, dtype="float32")), "DRAM table"),
    (lambda: isa.DmaGather(dst=sb(4, 3, dtype="float32"), indices=sb(4, 1, dtype="int32"),
                           src=DramAP("t", 0, ((3, 5), (1, 3)), "float32"), oob_mode="wrap"),
     "oob_mode"),
    (lambda: isa.DmaTranspose(dst=sb(4, 2, dtype="uint8"), src=sb(2, 4, dtype="uint8")),
     "2- or 4-byte"),
    (lambda: isa.DmaTranspose(dst=sb(4, 2, dtype="float32"), src=sb(2, 4)), "bit-exact"),
    (lambda: isa.DmaTranspose(dst=sb(2, 4), src=sb(2, 4)), "cannot be written"),
    (lambda: isa.DmaTranspose(dst=sb(4, 2), src=DramAP("x", 0, ((8, 1), (4, 2), (1, 4)),
                                                       "bfloat16")), "2-D"),
])
def test_new_instructions_reject(build, match):
    with pytest.raises(IsaError, match=match):
        build()


def test_packed_mx_tiles_copy_bit_exactly():
    isa.TensorCopy(dst=mxt(128, 4), src=mxt(128, 4, start=0).with_(offset=64))
    isa.DmaCopy(dst=mxt(128, 4), src=DramAP("x", 0, ((4, 128), (1, 4)), "float8_e4m3fn_x4"))


@pytest.mark.parametrize("build, first, name", [
    (lambda: mx_mm(), "trn3", "nc_matmul_mx"),
    (lambda: isa.QuantizeMx(dst=mxt(32, 2), src=sb(32, 8), dst_scale=mxt(4, 2, "uint8")),
     "trn3", "quantize_mx"),
    (lambda: isa.Exponential(dst=sb(128, 4), src=sb(128, 4)), "trn3", "exponential"),
    (lambda: isa.DmaTranspose(dst=sb(4, 2), src=sb(2, 4)), "trn2", "dma_transpose"),
])
def test_generation_features(build, first, name):
    gens = ["trn1", "trn2", "trn3"]
    for gen in gens:
        if gens.index(gen) < gens.index(first):
            with pytest.raises(IsaError, match=f"{name} needs"):
                run(build(), gen)
        else:
            run(build(), gen)


def test_double_row_needs_fp8_on_both_sides_and_two_rows():
    with pytest.raises(IsaError, match="FP8"):
        isa.NcMatmul(dst=ps(128, 512), stationary=sb(128, 2, 128, dtype="float8_e4m3"),
                     moving=sb(128, 2, 512), perf_mode="double_row")
    with pytest.raises(IsaError, match=r"\[K, 2, M\]"):
        isa.NcMatmul(dst=ps(128, 512), stationary=sb(128, 128, dtype="float8_e4m3"),
                     moving=sb(128, 512, dtype="float8_e5m2"), perf_mode="double_row")


def test_moving_free_on_trn3_bf16_dst_reaches_8192():
    ok = isa.NcMatmul(dst=ps(128, 8192, dtype="bfloat16"), stationary=sb(128, 128),
                      moving=sb(128, 8192))
    run(ok, "trn3")
    big = isa.NcMatmul(dst=ps(128, 4097), stationary=sb(128, 128), moving=sb(128, 4097))
    with pytest.raises(IsaError, match="moving free size 4097 > 4096"):
        run(big, "trn3")


def test_ocp_e4m3fn_matmul_needs_trn3_and_cannot_mix_with_e4m3():
    fn = isa.NcMatmul(dst=ps(128, 4), stationary=sb(128, 128, dtype="float8_e4m3fn"),
                      moving=sb(128, 4, dtype="float8_e5m2"))
    with pytest.raises(IsaError, match="float8_e4m3fn"):
        run(fn, "trn2")
    run(fn, "trn3")
    mixed = isa.NcMatmul(dst=ps(128, 4), stationary=sb(128, 128, dtype="float8_e4m3fn"),
                         moving=sb(128, 4, dtype="float8_e4m3"))
    with pytest.raises(IsaError, match="cannot mix"):
        run(mixed, "trn3")


def _accumulate_after(first, gen):
    mm = isa.NcMatmul(dst=ps(128, 4), stationary=sb(128, 128), moving=sb(128, 4),
                      accumulate=True)
    core(gen).run(Kernel("k", [first, mm] if first else [mm], {}), {})


@pytest.mark.parametrize("first", [
    None,                                                       # PSUM nobody wrote
    isa.Memset(dst=ps(128, 4), value=0.0),                      # VectorE wrote it
    isa.TensorCopy(dst=ps(128, 2, offset=8), src=sb(128, 2), engine="scalar"),   # partly
])
def test_accumulating_onto_non_matmul_psum_is_undefined_on_v2_v3(first):
    for gen in ("trn1", "trn2"):
        with pytest.raises(IsaError, match="did not write"):
            _accumulate_after(first, gen)
    _accumulate_after(first, "trn3")                            # defined on v4


def test_accumulating_after_a_matmul_or_tensor_transpose_is_fine():
    _accumulate_after(isa.NcMatmul(dst=ps(128, 4), stationary=sb(128, 128), moving=sb(128, 4)),
                      "trn2")
    _accumulate_after(isa.NcTranspose(dst=ps(128, 4), data=sb(4, 128)), "trn2")


def test_every_instruction_class_names_its_own_semantics_and_cost():
    """A subclass never inherits its parent's effect or cost silently (isa_base.py): a
    DmaGather is not a DmaCopy to the hardware."""
    import dataclasses

    with pytest.raises(TypeError, match="semantics and cycles"):
        @dataclasses.dataclass(frozen=True, kw_only=True)
        class Gather2(isa.DmaCopy):
            pass
    for cls in (isa.DmaCopy, isa.DmaGather, isa.NcMatmul, isa.NcTranspose, isa.Max8):
        assert {"semantics", "cycles"} <= set(vars(cls))
