"""The semaphore pass (`hw/sync.py`): the same waits as its definition, in linear work.

`reference_waits` is the definition, written as plainly as possible (every earlier
region of the memory is examined: quadratic): for each access, each other queue's
latest conflicting access among the latest write and the latest reads of every exact
region. It is the pass as it was before issue 11 without its page index, which only
skipped regions that cannot overlap. The pass must give exactly its waits (simulated
times depend on them), on random instruction streams and on the kernels of real
programs, while examining a bounded number of accesses per instruction where the old
pass examined every earlier region (a fill of 2**30 floats: 21.6 s to compile).
"""
from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import pytest

import hlo_passes
from jax_trn.hw import DramAP, Tile, isa, sync
from jax_trn.lower import lower_module
from tests.hlo_passes.helpers import artifact_of

from .runner import SPEC


def _overlap(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]


def reference_waits(instrs) -> list[tuple]:
    writes: dict[tuple, dict[str, int]] = {}      # region -> {queue: count}, latest write
    reads: dict[tuple, dict[str, int]] = {}       # region -> {queue: count} since then
    counts: dict[str, int] = {}
    out = []
    for ins in instrs:
        queue = ins.queue
        counts[queue] = count = counts.get(queue, 0) + 1
        rd, wr = sync.accesses(ins)
        waits = dict(ins.waits)
        for region, is_write in [(r, False) for r in rd] + [(w, True) for w in wr]:
            tables = (writes, reads) if is_write else (writes,)
            for other in set(writes) | set(reads):
                if _overlap(region, other):
                    for table in tables:
                        for q, c in table.get(other, {}).items():
                            if q != queue or (q, c) in ins.waits:
                                waits[q] = max(waits.get(q, 0), c)
        for r in rd:
            reads.setdefault(r, {})[queue] = count
        for w in wr:
            writes[w] = {queue: count}
            reads.pop(w, None)
        out.append(tuple(sorted(waits.items())))
    return out


def _waits(instrs) -> list[tuple]:
    return [i.waits for i in sync.insert_semaphores(instrs)]


# --- random instruction streams ------------------------------------------------------------

def _tile(rng: random.Random, mem: str = "sbuf") -> Tile:
    parts = rng.choice([1, 32, 64, 128])                  # aligned starts (§3.1)
    start = rng.choice({1: [0, 32, 64, 96], 32: [0, 32, 64, 96], 64: [0, 64], 128: [0]}[parts])
    n = rng.choice([1, 16, 64, 1024, 12288])          # 12288 floats: a wide region (48 KiB)
    limit = 2048 if mem == "psum" else 196608
    n = min(n, limit // 4)
    offset = rng.randrange(0, (limit - 4 * n) // 256 + 1) * 256
    if rng.random() < 0.2 and n >= 16:
        return Tile(mem, start, parts, offset, (n // 2, 2), "float32", strides=(2, 1))
    return Tile(mem, start, parts, offset, (n,), "float32")


def _dram(rng: random.Random, size: int, parts: int) -> DramAP:
    tensor = rng.choice(["x", "y", "out"])
    if rng.random() < 0.5:                       # partition-strided: a conservative span
        stride = rng.choice([size, 4 * size, 1 << 20])
        base = rng.randrange(0, 64) * size
        return DramAP(tensor, base, ((stride, parts), (1, size)), "float32")
    base = rng.randrange(0, 4096) * 64
    return DramAP(tensor, base, ((size, parts), (1, size)), "float32")


def _instruction(rng: random.Random):
    kind = rng.random()
    if kind < 0.15:
        return isa.Memset(dst=_tile(rng), value=0.0, engine=rng.choice(["vector", "gpsimd"]))
    if kind < 0.35:
        src = _tile(rng)
        dst = Tile("sbuf", src.start_partition, src.num_partitions,
                   rng.randrange(0, 64) * 1024, (src.free_size,), "float32")
        return isa.TensorCopy(dst=dst, src=src, engine=rng.choice(["vector", "scalar", "gpsimd"]))
    tile = _tile(rng)
    dram = _dram(rng, tile.free_size, tile.num_partitions)
    queue = rng.randrange(16)
    if kind < 0.7:
        return isa.DmaCopy(dst=tile, src=dram, dma_queue=queue)
    return isa.DmaCopy(dst=dram, src=tile, dma_queue=queue)


@pytest.mark.parametrize("seed", range(12))
def test_random_streams_get_the_defined_waits(seed):
    rng = random.Random(seed)
    instrs = [_instruction(rng) for _ in range(400)]
    expected = reference_waits(instrs)
    assert _waits(instrs) == expected
    assert sum(1 for w in expected if w) > 100          # the streams do conflict


def test_waits_given_by_lowering_are_kept():
    a, b = Tile("sbuf", 0, 128, 0, (64,), "float32"), Tile("sbuf", 0, 128, 4096, (64,), "float32")
    instrs = [isa.Memset(dst=a, value=1.0),
              isa.TensorCopy(dst=b, src=a, engine="scalar", waits=(("gpsimd", 3), ("scalar", 1)))]
    assert _waits(instrs) == reference_waits(instrs) == [(), (("gpsimd", 3), ("scalar", 1),
                                                               ("vector", 1))]


# --- the kernels of real programs ------------------------------------------------------------

def _programs():
    f32, bf16 = jnp.float32, jnp.bfloat16
    x = jax.ShapeDtypeStruct((4096, 4096), f32)
    w = jax.ShapeDtypeStruct((4096, 1024), bf16)
    img, ker = jax.ShapeDtypeStruct((4, 32, 32, 16), f32), jax.ShapeDtypeStruct((3, 3, 16, 32), f32)
    conv = lambda a, k: jax.lax.conv_general_dilated(a, k, (1, 1), "SAME",
                                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return {
        "fill": (lambda: jnp.zeros(2**26, f32) + 1, ()),
        "elementwise": (lambda a: jnp.tanh(a * 2 + 1), (x,)),
        "softmax": (jax.nn.softmax, (x,)),
        "matmul": (lambda a, b: jax.nn.gelu(a.astype(bf16) @ b), (x, w)),
        "reduce": (lambda a: a.sum(0) + a.max(1).sum(), (x,)),
        "transpose": (lambda a: a.T @ a, (jax.ShapeDtypeStruct((512, 1024), f32),)),
        "conv": (conv, (img, ker)),
    }


@pytest.mark.parametrize("name", sorted(_programs()))
def test_kernels_of_real_programs_get_the_defined_waits(name, monkeypatch):
    f, args = _programs()[name]
    seen = []
    insert = sync.insert_semaphores

    def checked(instrs):
        instrs = list(instrs)
        out = insert(instrs)
        seen.append(len(instrs))
        assert [i.waits for i in out] == reference_waits(instrs)
        return out

    from jax_trn.lower import builder
    monkeypatch.setattr(builder, "insert_semaphores", checked)   # the name kernels call
    lower_module(hlo_passes.compile_to_ir(artifact_of(f, *args)), SPEC)
    assert sum(seen) > 50


# --- linear work -------------------------------------------------------------------------------

def _fill(n: int) -> list:
    """The kernel of a large fill: one SBUF tile, stored by 16 DMA queues into
    partition-strided slices of one tensor, so every store's conservative span
    overlaps every other's."""
    tile = Tile("sbuf", 0, 128, 64, (2048,), "float32")
    rows = n * 2048
    return [isa.Memset(dst=tile, value=0.0)] + [
        isa.DmaCopy(dst=DramAP("out", k * 2048, ((rows, 128), (1, 2048)), "float32"),
                    src=tile, dma_queue=1 + k % 16)
        for k in range(n)]


def _overlap_checks(instrs, monkeypatch) -> int:
    calls = [0]
    overlap = sync._overlap

    def counted(a, b):
        calls[0] += 1
        return overlap(a, b)

    monkeypatch.setattr(sync, "_overlap", counted)
    sync.insert_semaphores(instrs)
    monkeypatch.setattr(sync, "_overlap", overlap)
    return calls[0]


def test_a_fill_takes_a_bounded_number_of_overlap_checks_per_instruction(monkeypatch):
    """The old pass checked every earlier store against each new one: 4x the
    instructions, 16x the checks (n = 1000: ~1.5 million)."""
    small, large = (_overlap_checks(_fill(n), monkeypatch) for n in (250, 1000))
    assert large <= 4.2 * small
    assert large <= 40 * 1000            # at most one per queue per page, roughly
    assert _waits(_fill(100)) == reference_waits(_fill(100))
