"""A kernel's numerics for a batch of devices at once (hw/batch.py) give every device
the bits it gets alone: instruction by instruction on memories full of random bytes
(test_plan's cases, every compiled kind and the per-device fallback), and kernel by
kernel against `NeuronCore.replay`."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.hw import CHIPS, Kernel, NeuronCore, Numerics, isa, plan
from jax_trn.hw.batch import BatchCore, span

from .test_plan import CASES, P, _s, _t

B = 3
SBUF, PSUM = 20480, 8192


def _device(gen: str, seed: int) -> NeuronCore:
    c = NeuronCore(CHIPS[gen].core, numerics=Numerics())
    rng = np.random.default_rng(seed)
    c.sbuf.data[:, :SBUF] = rng.integers(0, 256, (c.sbuf.data.shape[0], SBUF), np.uint8)
    c.psum.data[:, :PSUM] = rng.integers(0, 256, (c.psum.data.shape[0], PSUM), np.uint8)
    c.psum.by_matmul[:, :PSUM] = True
    c.dram = {"x": rng.normal(size=P * 128).astype(np.float32) * 100,
              "y": np.zeros(P * 128, np.float32)}
    return c


def _batch_of(devices, spans=None) -> BatchCore:
    spec = devices[0].spec
    bc = BatchCore(spec, devices[0].numerics, len(devices),
                   spans or {"sbuf": ((0, SBUF),), "psum": ((0, PSUM),)})
    for d, c in enumerate(devices):
        for name, mem in (("sbuf", c.sbuf), ("psum", c.psum)):
            bm = bc.mem(_t(name, 0, (1,), "uint8"))
            (lo, hi), = bm.ranges
            bm.data[d] = mem.data[:, lo:hi]
    bc.drams = [{k: v.copy() for k, v in c.dram.items()} for c in devices]
    return bc


def _check(devices, bc, spans=None):
    for d, c in enumerate(devices):
        for name, mem in (("sbuf", c.sbuf), ("psum", c.psum)):
            bm = bc.mem(_t(name, 0, (1,), "uint8"))
            (lo, hi), = bm.ranges
            np.testing.assert_array_equal(bm.data[d], mem.data[:, lo:hi],
                                          err_msg=f"device {d} {name}")
        for k, v in c.dram.items():
            np.testing.assert_array_equal(bc.drams[d][k].view(np.uint8), v.view(np.uint8),
                                          err_msg=f"device {d} dram {k}")


@pytest.mark.parametrize("ins", CASES, ids=[f"{i}-{type(c).__name__}" for i, c in
                                            enumerate(CASES)])
def test_batched_instruction_gives_each_device_its_bits(ins):
    devices = [_device("trn2", seed) for seed in range(B)]
    bc = _batch_of(devices)
    step = plan.kernel_plan(Kernel("k", [ins], {}), bc)[0]
    with np.errstate(all="ignore"):         # random bytes: NaN / inf arithmetic is the point
        try:
            for c in devices:
                ins.execute(c)
        except Exception as e:              # noqa: BLE001 - then the batch fails alike
            with pytest.raises(type(e)):
                step()
            return
        step()
    _check(devices, bc)


def test_fallback_instruction_runs_per_device():
    """An instruction without a batched compiler (Memset, Iota, ...) runs its semantics
    on each device's slice."""
    kinds = [isa.Memset(dst=_s(8192, "float32"), value=2.5),
             isa.Iota(dst=_s(8192, "int32"), offset=3, channel_multiplier=5,
                      pattern=((1, 32),))]
    devices = [_device("trn2", 10 + seed) for seed in range(B)]
    bc = _batch_of(devices)
    for ins in kinds:
        for c in devices:
            ins.execute(c)
        plan.kernel_plan(Kernel("k", [ins], {}), bc)[0]()
    _check(devices, bc)


def test_kernel_replay_batched_matches_each_device_on_a_span():
    """A small kernel (DMA in, matmul, evacuation, DMA out) replayed per device and in
    one batch whose memories hold only the kernel's span."""
    ins = [isa.DmaCopy(dst=_s(1024, "bfloat16", (128,)),
                       src=DramAP_("x", "bfloat16")),
           isa.DmaCopy(dst=_s(2048, "bfloat16", (64,)),
                       src=DramAP_("x", "bfloat16", 64, 64)),
           isa.NcMatmul(dst=_t("psum", 2048, (128,), "float32"),
                        stationary=_s(2048, "bfloat16", (64,)),
                        moving=_s(1024, "bfloat16", (128,)), accumulate=False),
           isa.NcMatmul(dst=_t("psum", 2048, (128,), "float32"),
                        stationary=_s(2048, "bfloat16", (64,)),
                        moving=_s(1024, "bfloat16", (128,)), accumulate=True),
           isa.Activation(dst=_s(4096, "bfloat16", (128,)),
                          data=_t("psum", 2048, (128,), "float32"), func="gelu"),
           isa.DmaCopy(dst=DramAP_("z", "bfloat16"), src=_s(4096, "bfloat16", (128,)))]
    kernel = Kernel("k", ins, {})
    spans = span(kernel)
    assert spans == {"sbuf": ((1024, 1280), (2048, 2176), (4096, 4352)),
                     "psum": ((2048, 2560),)}
    devices = []
    for seed in range(B):
        c = NeuronCore(CHIPS["trn2"].core, numerics=Numerics())
        rng = np.random.default_rng(seed)
        c.dram = {"x": rng.normal(size=P * 128).astype(np.float32).view(np.uint16)[::2]
                  .copy().view(_bf16()),
                  "z": np.zeros(P * 128, _bf16())}
        devices.append(c)
    bc = BatchCore(devices[0].spec, devices[0].numerics, B, spans)
    bc.drams = [{k: v.copy() for k, v in c.dram.items()} for c in devices]
    for c in devices:
        for i in ins:
            i.execute(c)
    for step in plan.kernel_plan(kernel, bc):
        step()
    for d, c in enumerate(devices):
        np.testing.assert_array_equal(bc.drams[d]["z"].view(np.uint16),
                                      c.dram["z"].view(np.uint16))
    assert not all(np.array_equal(bc.drams[0]["z"], bc.drams[d]["z"]) for d in range(1, B))


def _bf16():
    import ml_dtypes
    return ml_dtypes.bfloat16


def DramAP_(tensor, dtype, offset=0, width=128):   # noqa: N802 - [P, width] row-major
    from jax_trn.hw.operands import DramAP
    return DramAP(tensor, offset, ((width, P), (1, width)), dtype)
