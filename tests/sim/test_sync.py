"""The semaphore pass: waits for RAW / WAR / WAW across queues, and only those."""
from __future__ import annotations


import numpy as np
import pytest

from jax_trn.hw import DeadlockError, DramAP, Kernel, Tile, insert_semaphores, isa
from tests.sim.helpers import core


def sb(offset, p=128, n=64, start=0, dtype="float32"):
    return Tile("sbuf", start, p, offset, (n,), dtype)


PS = Tile("psum", 0, 128, 0, (64,), "float32")
A, B, C = sb(0), sb(4096), sb(8192)


def waits(instrs):
    return [i.waits for i in insert_semaphores(instrs)]


def test_raw_vector_producer_tensor_consumer():
    w = waits([isa.Memset(dst=sb(0, n=128, dtype="bfloat16"), value=1.0),
               isa.NcMatmul(dst=PS, stationary=sb(0, n=128, dtype="bfloat16"),
                            moving=sb(0, n=64, dtype="bfloat16"))])
    assert w == [(), (("vector", 1),)]


def test_war_writer_waits_for_reader_on_other_queue():
    w = waits([isa.TensorCopy(dst=B, src=A, engine="scalar"),     # reads A
               isa.Memset(dst=A, value=0.0)])                      # then overwrites A
    assert w == [(), (("scalar", 1),)]


def test_waw_and_independent_regions():
    w = waits([isa.Memset(dst=A, value=1.0),
               isa.Memset(dst=B, value=1.0, engine="gpsimd"),      # disjoint: no wait
               isa.TensorCopy(dst=A, src=C, engine="scalar")])     # WAW on A
    assert w == [(), (), (("vector", 1),)]


def test_same_queue_needs_no_wait_and_partitions_are_respected():
    w = waits([isa.Memset(dst=sb(0, p=32), value=1.0),
               isa.Memset(dst=sb(0, p=32), value=2.0),             # same queue
               isa.TensorCopy(dst=sb(8192, p=32), src=sb(0, p=32, start=32), engine="scalar"),
               isa.TensorCopy(dst=sb(4096, p=32), src=sb(0, p=32), engine="scalar")])
    assert w == [(), (), (), (("vector", 2),)]


def test_strongest_wait_per_queue_only():
    w = waits([isa.Memset(dst=A, value=1.0), isa.Memset(dst=B, value=1.0),
               isa.TensorTensor(dst=C, data1=A, data2=B, op="add", engine="gpsimd")])
    assert w[2] == (("vector", 2),)


def test_dram_regions_by_element_range():
    x = np.zeros(1024, np.float32)
    first = DramAP("x", 0, ((64, 128), (1, 64)), "float32")       # elements [0, 8192)
    w = waits([isa.DmaCopy(dst=first, src=A, dma_queue=0),
               isa.DmaCopy(dst=B, src=DramAP("x", 8192, ((64, 128), (1, 64)), "float32"),
                           dma_queue=1),                           # disjoint range
               isa.DmaCopy(dst=C, src=first, dma_queue=2)])        # RAW through DRAM
    assert w == [(), (), (("dma0", 1),)]
    del x


def test_dram_regions_are_bytes_across_dtype_views():
    # A 16-bit view of an FP8 tensor overlaps the FP8 elements of the same bytes.
    fp8 = DramAP("x", 256, ((1, 64),), "float8_e5m2")             # bytes [256, 320)
    w = waits([isa.DmaCopy(dst=fp8, src=sb(0, p=1, n=64, dtype="float8_e5m2"), dma_queue=0),
               isa.DmaCopy(dst=sb(4096, p=1, n=32, dtype="uint16"),
                           src=DramAP("x", 0, ((1, 32),), "uint16"), dma_queue=1),   # [0, 64)
               isa.DmaCopy(dst=sb(8192, p=1, n=32, dtype="uint16"),
                           src=DramAP("x", 150, ((1, 32),), "uint16"), dma_queue=2)])  # [300, 364)
    assert w == [(), (), (("dma0", 1),)]


def test_strided_tiles_conflict_over_their_span():
    pairs = Tile("sbuf", 0, 128, 0, (2, 64), "float8_e5m2", strides=(1, 2))   # bytes [0, 128)
    w = waits([isa.Memset(dst=sb(120, n=2, dtype="float32"), value=0.0, engine="vector"),
               isa.TensorCopy(dst=sb(4096, n=128, dtype="float8_e5m2"), src=pairs, engine="scalar")])
    assert w == [(), (("vector", 1),)]


def test_missing_semaphore_gives_a_wrong_result_but_synced_is_right():
    """Without the wait both start at t=0 and the consumer's queue (vector) wins the
    tie against the producer's (scalar), so it reads A before exp(0) = 1 lands."""
    producer = isa.Activation(dst=A, data=B, func="exp")
    consumer = isa.TensorCopy(dst=C, src=A, engine="vector")
    for synced, expected in ((False, 0.0), (True, 1.0)):
        c = core()
        c.sbuf.view(B)[...] = 0.0
        instrs = [producer, consumer]
        c.run(Kernel("k", insert_semaphores(instrs) if synced else instrs, {}), {})
        assert c.sbuf.view(C)[0, 0] == expected


def test_deadlock_is_reported():
    instr = isa.Memset(dst=A, value=1.0, waits=(("tensor", 1),))
    with pytest.raises(DeadlockError, match="tensor"):
        core().run(Kernel("k", [instr], {}), {})


def test_ten_thousand_instructions_get_their_semaphores():
    """A large kernel (speed is measured by benchmarks, never asserted in tests)."""
    instrs = []
    for i in range(2500):
        t = sb((i % 16) * 4096)
        u = sb((i % 16) * 4096 + 65536)
        instrs += [isa.DmaCopy(dst=t, src=DramAP("x", i * 64, ((0, 128), (1, 64)), "float32"),
                               dma_queue=i % 16),
                   isa.Activation(dst=u, data=t, func="exp"),
                   isa.TensorScalar(dst=t, data=u, op0="add", operand0=1.0),
                   isa.DmaCopy(dst=DramAP("y", i * 8192, ((64, 128), (1, 64)), "float32"),
                               src=t, dma_queue=(i + 8) % 16)]
    out = insert_semaphores(instrs)
    assert len(out) == 10000 and out[1].waits == (("dma0", 1),)


def _issued_out_of_order(kernel, order) -> list[tuple[int, int]]:
    """(i, j), i before j in program order on different queues, whose accesses
    (`sync.accesses`) conflict but which the run issued j first (its `order`)."""
    from jax_trn.hw.sync import accesses
    pos = {index: n for n, index in enumerate(order)}
    acc = [accesses(ins) for ins in kernel.instructions]
    queues = [ins.queue for ins in kernel.instructions]

    def hit(a, b):
        return a[0] == b[0] and a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]
    bad = []
    for j, (rj, wj) in enumerate(acc):
        for i in range(j):
            if queues[i] == queues[j] or pos[i] < pos[j]:
                continue
            ri, wi = acc[i]
            if any(hit(w, x) for w in wi for x in rj + wj) or \
                    any(hit(r, w) for r in ri for w in wj):
                bad.append((i, j))
    return bad


def test_attention_kernels_issue_conflicting_instructions_in_program_order(jax, trn):
    """The flash-attention forward and backward kernels (DMA transposes, PSUM
    accumulation and rings shared by TensorE transposes and matmuls, five queues): every
    conflicting pair the waits order is issued in program order, so the timeline
    applies their effects as the program would. Without the waits it is not."""
    import dataclasses

    import jax_trn
    from tests.e2e.test_attention import causal_attention
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((1, 4, 128, 32)).astype("bfloat16") for _ in range(4)]

    def f(q, k, v, do):
        o, vjp = jax.vjp(causal_attention, q, k, v)
        return (o,) + vjp(do)
    with jax_trn.profile() as prof:
        jax.block_until_ready(jax.jit(f)(*jax.device_put(args, trn)))
    kernels = [r.kernel for r in prof.executions[-1].kernels
               if any("flash-attention" in n for n in r.kernel.notes)]
    assert len(kernels) == 2, [r.kernel.name for r in prof.executions[-1].kernels]
    for kernel in kernels:
        run = core().run(kernel, {}, execute=False)
        assert _issued_out_of_order(kernel, run.order) == [], kernel.name
    stripped = dataclasses.replace(kernels[1], instructions=[
        dataclasses.replace(i, waits=()) for i in kernels[1].instructions])
    run = core().run(stripped, {}, execute=False)
    assert _issued_out_of_order(stripped, run.order)
