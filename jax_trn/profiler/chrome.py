"""Chrome trace-event JSON (ui.perfetto.dev, chrome://tracing) of executions.

Layout, like Neuron Explorer's device view (trainium-hardware.md §7):
- one process per chip ("chip 0 (trn2)");
- per core, one thread each for: the executions ("core 3 program"), the kernels
  ("core 3 kernels"), the four compute engines ("core 3 TensorE", ...), every DMA
  queue used ("core 3 DMA q0") and, in multi-device runs, the collectives the core
  took part in ("core 3 collectives": one slice per collective over its span on that
  device, its group's start to end, with the algorithm, bytes, its group, the
  participants, its arrival and wait in args);
- one "X" (complete) event per instruction, kernel and execution, with args: opcode,
  kernel, op, source, bytes, flops, semaphore wait;
- flow events ("s" -> "f") from the instruction that satisfied a semaphore to the one
  that waited on it;
- "M" metadata events name and order processes and threads.

Timestamps are microseconds. The executions of a profile are laid end to end, in the
order they ran (each starts at simulated time 0 on its own), with `GAP_US` between.
"""
from __future__ import annotations

import json
import os

from .engines import COMPUTE_ENGINES, ENGINE_NAMES

GAP_US = 1.0
_PROGRAM, _KERNELS, _COLLECTIVES = 0, 1, 99
_STRIDE = 100                          # thread ids: core * _STRIDE + track


def _tid(core: int, queue: str) -> int:
    if queue in COMPUTE_ENGINES:
        return core * _STRIDE + 2 + COMPUTE_ENGINES.index(queue)
    return core * _STRIDE + 10 + int(queue[3:])


def _track_name(core: int, queue: str) -> str:
    if queue in COMPUTE_ENGINES:
        return f"core {core} {ENGINE_NAMES[queue]}"
    return f"core {core} DMA q{queue[3:]}"


def _us(ns: float) -> float:
    return round(ns / 1e3, 6)


class _Writer:
    def __init__(self):
        self.events: list[dict] = []
        self.threads: dict[tuple[int, int], str] = {}
        self.processes: dict[int, str] = {}
        self.flow_id = 0

    def slice(self, pid, tid, name, start_us, end_us, cat, args) -> None:
        self.events.append({"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
                            "ts": start_us, "dur": round(end_us - start_us, 6),
                            "args": args})

    def flow(self, src: tuple, dst: tuple, name: str) -> None:
        """src/dst: (pid, tid, ts) inside the slices to bind."""
        self.flow_id += 1
        common = {"name": name, "cat": "semaphore", "id": self.flow_id}
        self.events.append({**common, "ph": "s", "pid": src[0], "tid": src[1], "ts": src[2]})
        self.events.append({**common, "ph": "f", "bp": "e", "pid": dst[0], "tid": dst[1],
                            "ts": dst[2]})

    def metadata(self) -> list[dict]:
        meta = []
        for pid, name in sorted(self.processes.items()):
            meta.append(_meta("process_name", pid, 0, {"name": name}))
            meta.append(_meta("process_sort_index", pid, 0, {"sort_index": pid}))
        for (pid, tid), name in sorted(self.threads.items()):
            meta.append(_meta("thread_name", pid, tid, {"name": name}))
            meta.append(_meta("thread_sort_index", pid, tid, {"sort_index": tid}))
        return meta


def _meta(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def chrome_trace(executions) -> dict:
    """The trace-event JSON object (a dict) of `executions`, laid end to end."""
    w, offset_ns = _Writer(), 0.0
    for ex in executions:
        _execution(w, ex, offset_ns)
        offset_ns += ex.span_ns + GAP_US * 1e3
    events = sorted(w.events, key=lambda e: (e["ts"], e["ph"] != "X"))
    first = executions[0] if executions else None
    return {"traceEvents": w.metadata() + events, "displayTimeUnit": "ns",
            "otherData": {"generator": "jax-trn profiler",
                          "system": first.system if first else "",
                          "executions": [ex.name for ex in executions]}}


def save_trace(executions, path) -> str:
    path = os.fspath(path)
    with open(path, "w") as f:
        json.dump(chrome_trace(executions), f)
    return path


def _execution(w: _Writer, ex, offset_ns: float) -> None:
    gen = f" ({ex.generation})" if ex.generation else ""
    cores = {}
    for k in ex.kernels:
        w.processes.setdefault(k.chip, f"chip {k.chip}{gen}")
        cores[(k.chip, k.core)] = k.device
        _kernel(w, ex, k, offset_ns)
    for (chip, core), device in cores.items():
        tid = core * _STRIDE + _PROGRAM
        w.threads[(chip, tid)] = f"core {core} program"
        w.slice(chip, tid, ex.name, _us(offset_ns), _us(offset_ns + ex.span_ns), "execution",
                {"system": ex.system, "device": device, "dtype": ex.dtype,
                 "simulated_time_us": ex.span_ns / 1e3})
    _instructions(w, ex, offset_ns)
    _collectives(w, ex, offset_ns)


def _kernel(w: _Writer, ex, k, offset_ns: float) -> None:
    tid = k.core * _STRIDE + _KERNELS
    w.threads[(k.chip, tid)] = f"core {k.core} kernels"
    w.slice(k.chip, tid, k.name, _us(offset_ns + k.start_ns), _us(offset_ns + k.end_ns),
            "kernel", {"ops": list(k.ops), "flops": k.flops, "hbm_bytes": k.hbm_bytes,
                       "device": k.device})


def _instructions(w: _Writer, ex, offset_ns: float) -> None:
    where = {}
    for i in ex.instructions:
        tid = _tid(i.core, i.queue)
        w.threads[(i.chip, tid)] = _track_name(i.core, i.queue)
        start, end = _us(offset_ns + i.start_ns), _us(offset_ns + i.end_ns)
        w.slice(i.chip, tid, i.opcode, start, end, i.engine, _args(i))
        where[id(i)] = (i.chip, tid, round((start + end) / 2, 6))
    for d in ex.dependencies:
        src, dst = where.get(id(d.producer)), where.get(id(d.consumer))
        if src and dst:
            w.flow(src, dst, f"semaphore {d.producer.queue}")


def _args(i) -> dict:
    args = {"opcode": i.opcode, "kernel": i.kernel, "op": i.op, "source": i.source,
            "jax_op": i.op_name,
            "ops": list(i.ops), "index": i.index, "bytes": i.bytes, "flops": i.flops}
    if i.engine == "dma":
        args.update(hbm_bytes=i.hbm_bytes, descriptor_bytes=i.descriptor_bytes)
    if i.idle_ns > 0:
        args.update(semaphore_wait_ns=round(i.idle_ns, 3), waited_on=i.waited_on or "")
    if i.waits:
        args["waits"] = [f"{q}>={n}" for q, n in i.waits]
    return args


def _collectives(w: _Writer, ex, offset_ns: float) -> None:
    """One slice per collective on each participant's "core N collectives" thread, over
    that device's span of it (records without per-device spans: the whole collective)."""
    where = {k.device: (k.chip, k.core) for k in ex.kernels}
    cores = ex.chip_spec.cores if ex.chip_spec else 1
    gen = f" ({ex.generation})" if ex.generation else ""
    for c in ex.collectives:
        spans = c.spans or tuple((d, c.start_ns, c.end_ns) for d in c.devices)
        arrival = dict(zip(c.devices, c.arrival_ns))
        group_of = {d: g for g in c.groups for d in g}
        for device, start, end in spans:
            chip, core = where.get(device, (device // cores, device % cores))
            tid = core * _STRIDE + _COLLECTIVES
            w.processes.setdefault(chip, f"chip {chip}{gen}")
            w.threads[(chip, tid)] = f"core {core} collectives"
            args = {"name": c.name, "kind": c.kind, "algorithm": c.algorithm,
                    "bytes": c.bytes, "device": device,
                    "group": list(group_of.get(device, c.devices)),
                    "participants": len(c.devices), "steps": len(c.steps)}
            if device in arrival:
                args.update(arrival_us=_us(arrival[device]),
                            wait_us=_us(max(0.0, start - arrival[device])))
            if c.ops:
                args["ops"] = list(c.ops)
            w.slice(chip, tid, c.kind, _us(offset_ns + start), _us(offset_ns + end),
                    "collective", args)
