"""lower/loop_on_chip.py on hand-built kernels: which carries stay resident in SBUF, the
semaphore counts of a body kernel whose loads and stores moved out of the loop, the
hazards that keep a carry in HBM, and the numerics of the Loop against the kernels it
came from (run on one NeuronCore)."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.hw.core import NeuronCore
from jax_trn.hw.isa import DmaCopy, DramAP, TensorCopy, TensorScalar, Tile
from jax_trn.hw.program import DramTensor, Kernel, Loop
from jax_trn.hw.spec import NC_V3
from jax_trn.lower import loop_on_chip as loc

C = DramTensor("c", (128, 16), "float32")
W = DramTensor("w", (128, 16), "float32")
T = DramTensor("t", (128, 16), "float32")
N = DramTensor("n", (), "int32")
AP = DramAP("c", 0, ((16, 128), (1, 16)), "float32")


def _tile(offset):
    return Tile("sbuf", 0, 128, offset, (16,), "float32")


def _body(store_to="c", load_waits=(), extra=()):
    """load c -> A; load w -> X (same queue); A * X -> B on vector; store B."""
    a, x, b = _tile(0), _tile(64), _tile(128)
    ins = [DmaCopy(name="ld", dst=a, src=AP, dma_queue=0, waits=load_waits),
           DmaCopy(name="ldw", dst=x, src=DramAP("w", 0, AP.pattern, "float32"), dma_queue=0),
           TensorScalar(name="mul", dst=b, data=a, op0="multiply", operand0=0.5,
                        waits=(("dma0", 2),)),
           DmaCopy(name="st", dst=DramAP(store_to, 0, AP.pattern, "float32"), src=b,
                   dma_queue=1, waits=(("vector", 1),)), *extra]
    dram = {"c": C, "w": W, store_to: {"c": C, "t": T}[store_to]}
    return Kernel("body", ins, dram, sbuf_bytes=192)


def _copy_kernel():
    ap = ((1, T.size),)
    return Kernel("copy", [DmaCopy(name="cp", dst=DramAP("c", 0, ap, "float32"),
                                   src=DramAP("t", 0, ap, "float32"))], {"c": C, "t": T})


def _loop(body, trips=3):
    return loc.build("w.1", loc.Counted(0, 0, trips, 1), [N, C], body, 1 << 16, ["op"])


def test_resident_carry_moves_its_load_and_store_out_of_the_body():
    loop = _loop([_body()])
    assert isinstance(loop, Loop) and loop.resident == ["c"]
    body = loop.body[0].instructions
    assert [i.name for i in body] == ["ldw", "mul"]
    assert body[1].waits == (("dma0", 1),)              # 2 loads on dma0 -> 1 left
    assert body[1].data.offset == body[1].dst.offset == 192   # in place, resident region
    assert [i.name for i in loop.enter[0].instructions] == ["w.1/enter/dma_copy"]
    assert loop.exit[0].instructions[0].dst.tensor == "c"


def test_carry_read_twice_is_copied_into_its_region_at_the_trips_end():
    peek = TensorScalar(name="peek", dst=_tile(64), data=_tile(0), op0="add", operand0=1.0,
                        waits=(("dma0", 2),))
    loop = _loop([_body(extra=(peek,))])
    body = loop.body[0].instructions
    assert [i.name for i in body] == ["ldw", "mul", "peek", "body/carry"]
    assert body[1].dst.offset == 128 and body[2].data.offset == 192
    assert isinstance(body[3], TensorCopy) and body[3].dst.offset == 192
    assert dict(body[3].waits) == {"dma0": 1}     # after the whole trip (vector: in order)


def test_store_into_a_temporary_then_copied_is_folded():
    loop = _loop([_body(store_to="t"), _copy_kernel()])
    assert loop.resident == ["c"] and len(loop.body) == 1
    assert loop.exit[0].instructions[0].dst == AP


@pytest.mark.parametrize("why, body", [
    ("waits for other", lambda: _body(load_waits=(("vector", 1),))),
    ("waits for its store", lambda: _body(extra=(
        TensorScalar(name="reuse", dst=_tile(128), data=_tile(64), op0="add", operand0=1.0,
                     waits=(("dma1", 1),)),))),
    ("last instruction of its DMA queue", lambda: _body(extra=(
        DmaCopy(name="ld2", dst=_tile(128), src=DramAP("w", 0, AP.pattern, "float32"),
                dma_queue=1),))),
])
def test_hazards_keep_the_carry_in_hbm(why, body):
    loop = _loop([body()])
    assert loop.resident == [] and any(why in n for n in loop.notes)


def test_carry_read_by_another_kernel_stays_in_hbm():
    other = Kernel("other", [DmaCopy(name="x", dst=_tile(0), src=AP)], {"c": C})
    loop = _loop([_body(), other])
    assert loop.resident == [] and "2 kernels" in loop.notes[0]


def test_too_little_sbuf_keeps_the_carry_in_hbm():
    loop = loc.build("w.1", loc.Counted(0, 0, 3, 1), [N, C], [_body()], 300, ["op"])
    assert loop.resident == [] and any("needs SBUF up to 256" in n for n in loop.notes)
    assert loop.exit[0].instructions[0].dst.offset == 0     # the counter's tile
    full = loc.build("w.1", loc.Counted(0, 0, 3, 1), [N, C], [_body()], 320, ["op"])
    assert full.resident == ["c"] and full.exit[0].sbuf_bytes <= 320


def test_counted_trip_counts():
    assert loc.Counted(0, 0, 10, 3).trips == 4
    assert loc.Counted(0, 5, 5, 1).trips == 0
    assert loc.Counted(0, 7, 2, 1).trips == 0
    assert loc.Counted(0, 2**31 - 2, 2**31 - 1, 4).final == -(2**31) + 2


def _run(core, kernels, dram):
    for k in kernels:
        core.run(k, dram)


@pytest.mark.parametrize("extra", [(), (TensorScalar(
    name="peek", dst=_tile(64), data=_tile(0), op0="add", operand0=1.0, waits=(("dma0", 2),)),)])
def test_loop_computes_what_the_kernels_it_came_from_compute(extra):
    rng = np.random.default_rng(0)
    c0, w = rng.normal(size=C.size).astype(np.float32), rng.normal(size=W.size).astype(np.float32)
    body = _body(extra=extra)
    ref = {"c": c0.copy(), "w": w.copy(), "n": np.zeros(1, np.int32)}
    core = NeuronCore(NC_V3)
    for _ in range(3):
        _run(core, [body], ref)
    loop = _loop([body])
    got = {"c": c0.copy(), "w": w.copy(), "n": np.zeros(1, np.int32)}
    core = NeuronCore(NC_V3)
    _run(core, loop.enter, got)
    for _ in range(loop.trips):
        _run(core, loop.body, got)
    _run(core, loop.exit, got)
    np.testing.assert_array_equal(got["c"], ref["c"])
    assert got["n"][0] == 3
