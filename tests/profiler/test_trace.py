"""Per-instruction traces: attribution to kernel, op and source line; semaphore waits;
DMA sizes; and the Chrome trace-event export."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from jax_trn.profiler import CollectiveRecord
from tests.profiler.helpers import check_trace, layer, layer_inputs, profiled


@pytest.fixture(scope="module")
def prof(jax, trn):
    _, args = layer_inputs(jax, trn)
    return profiled(jax, jax.jit(layer), *args)


@pytest.fixture(scope="module")
def ex(prof):
    return prof.executions[-1]


def test_every_event_becomes_an_attributed_instruction(ex):
    instrs = ex.instructions
    assert len(instrs) == len(ex.events) > 0
    kernels = {k.name: k for k in ex.kernels}
    for i in instrs:
        k = kernels[i.kernel]
        assert i.index >= 0 and k.kernel.instructions[i.index].queue == i.queue
        assert i.ops == tuple(k.ops) and i.op
        assert re.fullmatch(r".+/tests/profiler/\w+\.py:\d+", i.source), i.source
        assert i.device == ex.devices[0] and i.start_ns <= i.end_ns


def test_instruction_names_its_source_line(ex):
    dot = [i for i in ex.instructions if i.opcode == "NcMatmul"]
    assert dot and all(i.op == "dot_general" and "helpers.py" in i.source for i in dot)


def test_semaphore_waits_name_the_queue_that_released_them(ex):
    waited = [i for i in ex.instructions if i.waited_on is not None]
    assert waited, "a matmul kernel waits on its loads"
    assert any(i.engine == "tensor" and i.waited_on.startswith("dma") for i in waited)
    for i in waited:
        assert i.idle_ns > 0 and i.waited_on in dict(i.waits)


def test_dependencies_run_producer_before_consumer(ex):
    deps = ex.dependencies
    assert deps
    for d in deps:
        assert d.producer.end_ns <= d.consumer.start_ns + 1e-6
        assert d.producer.kernel == d.consumer.kernel
        assert d.producer.queue != d.consumer.queue


def test_dma_transfers_carry_bytes_and_descriptor_size(ex):
    dmas = [i for i in ex.instructions if i.engine == "dma"]
    assert dmas and all(i.bytes > 0 and 0 < i.descriptor_bytes <= i.bytes for i in dmas)
    assert sum(i.hbm_bytes for i in dmas) == ex.hbm_bytes


def test_chrome_trace_follows_the_format(ex, tmp_path):
    doc = json.loads(Path(ex.save_trace(tmp_path / "layer.json")).read_text())
    names = check_trace(doc)
    assert {"core 0 TensorE", "core 0 VectorE", "core 0 kernels", "core 0 program",
            "core 0 DMA q0"} <= set(names.values())
    procs = [e for e in doc["traceEvents"] if e["name"] == "process_name"]
    assert [p["args"]["name"] for p in procs] == [f"chip 0 ({ex.generation})"]
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] != "kernel"
              and e["cat"] != "execution"]
    assert len(slices) == len(ex.instructions)
    mm = next(e for e in slices if e["name"] == "NcMatmul")
    assert {"opcode", "kernel", "op", "source", "bytes", "flops"} <= set(mm["args"])
    assert mm["args"]["flops"] > 0
    dma = next(e for e in slices if e["cat"] == "dma")
    assert dma["args"]["bytes"] > 0
    assert sum(e["ph"] == "s" for e in doc["traceEvents"]) == len(ex.dependencies)


def test_profile_trace_lays_executions_end_to_end(jax, trn, tmp_path):
    import numpy as np
    x = jax.device_put(np.ones((128, 64), np.float32), trn)
    prof = profiled(jax, lambda a: jax.jit(lambda v: v * 2)(jax.jit(lambda v: v + 1)(a)), x)
    assert len(prof.executions) == 2
    doc = json.loads(Path(prof.save_trace(tmp_path / "two.json")).read_text())
    check_trace(doc)
    runs = [e for e in doc["traceEvents"] if e.get("cat") == "execution"]
    assert [r["name"] for r in runs] == [ex.name for ex in prof.executions]
    assert runs[0]["ts"] + runs[0]["dur"] < runs[1]["ts"]


def test_collectives_have_their_own_track(ex, tmp_path):
    import copy
    ex2 = copy.copy(ex)
    ex2.collectives = [CollectiveRecord("all-reduce", "psum", [ex.devices[0]], "ring",
                                        4096, 0.0, 1500.0)]
    names = check_trace(ex2.trace_events())
    assert any(n.endswith("collectives") for n in names.values())
    d = ex2.summary_dict()["collectives"]
    assert d["count"] == 1 and d["durations_s"]["all-reduce"] == [1.5e-6]
    assert "all-reduce" in str(ex2.summary())


def test_instructions_know_the_jax_op_name_with_its_scope(jax, trn, tmp_path):
    import numpy as np
    import jax_trn

    def f(x, w):
        with jax.named_scope("attention"):
            return jax.nn.relu(x @ w)

    x = jax.device_put(np.ones((128, 128), np.float32), trn)
    w = jax.device_put(np.ones((128, 64), np.float32), trn)
    with jax_trn.profile() as prof:
        jax.jit(f)(x, w).block_until_ready()
    ex = prof.executions[-1]
    (mm, *_) = [i for i in ex.instructions if i.opcode == "NcMatmul"]
    assert mm.op == "dot_general" and re.search(r"test_trace\.py:\d+$", mm.source)
    assert mm.op_name == "jit(f)/attention/dot_general"
    events = json.load(open(ex.save_trace(tmp_path / "t.json")))["traceEvents"]
    assert any(e.get("args", {}).get("jax_op") == "jit(f)/attention/dot_general" for e in events)
