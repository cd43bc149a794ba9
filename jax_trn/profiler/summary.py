"""The summary page of one execution or a whole profile (trainium-hardware.md §7).

`Summary(executions)` computes once; `str(summary)` is the terminal page and
`summary.to_dict()` the same numbers for programs (key names follow Neuron Explorer's
summary metrics where one exists: `total_time`, `mfu_estimated_percent`, ...).
Definitions of every ratio are in metrics.py.
"""
from __future__ import annotations

import os

from jax_trn.hw.trace import merged

from . import metrics
from .devices import device_rows, program_kind, program_rows, ranges  # noqa: F401
from .insights import insights
from .lines import kernel_lines
from .engines import ENGINE_NAMES, ENGINES

TOP_KERNELS = 8


class Summary:
    def __init__(self, executions):
        self.executions = list(executions)
        self.totals = metrics.totals(self.executions)
        self.kernels = metrics.kernel_stats(self.executions)
        self.insights = insights(self.executions, self.kernels)
        self.lines = kernel_lines(self.executions)

    def to_dict(self) -> dict:
        t, exs = self.totals, self.executions
        bound, share = metrics.program_bound(self.kernels)
        return {
            **_header(exs),
            "peak_tflops": t.peak_flop / (t.time_ns * 1e-9) / 1e12 if t.time_ns else 0.0,
            "total_time_s": t.time_ns * 1e-9,
            "flops": t.flops,
            "tensor_flops": t.tensor_flops,
            "achieved_tflops": t.flops_per_s / 1e12,
            "achieved_tflops_per_device": (t.flops / (t.device_ns * 1e-9) / 1e12
                                           if t.device_ns else 0.0),
            "mfu_estimated_percent": 100 * t.mfu,
            "hfu_estimated_percent": 100 * t.hfu,
            "mm_arithmetic_intensity": t.arithmetic_intensity,
            "hbm_bytes": t.hbm_bytes,
            "dma_bytes": t.dma_bytes,
            "hbm_gbps": t.hbm_bytes_per_s / 1e9,
            "mbu_estimated_percent": 100 * t.mbu,
            "dma_bandwidth_percent": 100 * t.dma_utilization,
            "hbm_bandwidth_percent": 100 * t.hbm_utilization,
            **_dma_sizes(exs),
            "engine_active_percent": {e: 100 * t.active(e) for e in ENGINES},
            "semaphore_wait_percent": _waits(exs, t.device_ns),
            "tensor_busy_breakdown_percent": _tensor_breakdown(exs),
            "bound": bound,
            "bound_time_percent": 100 * share,
            "kernels": [_kernel_row(s, t.device_ns) for s in self.kernels],
            "collectives": _collectives(exs, t.time_ns),
            "programs": program_rows(exs),
            "per_device": device_rows(exs, _time),
            "insights": [i.to_dict() for i in self.insights],
            "kernel_lines": [r.to_dict() for r in self.lines],
        }

    def __str__(self) -> str:
        return format_summary(self.to_dict())

    def _repr_pretty_(self, p, cycle) -> None:          # IPython
        p.text(str(self))

    def __repr__(self) -> str:
        return str(self)


def _header(exs) -> dict:
    """Who ran: `devices` every device id, `device_list` the same compressed ("0-127");
    `peak_tflops_per_core` one core's peak (the page's `peak_tflops` is the peak of all
    the devices that ran, which MFU is measured against)."""
    first = exs[0] if exs else None
    spec = first.chip_spec if first else None
    peak = first.peak_flops_per_s / 1e12 if first else 0.0
    devices = sorted({d for ex in exs for d in ex.devices})
    return {
        "name": first.name if len(exs) == 1 else f"{len(exs)} executions",
        "kind": program_kind(first) if len(exs) == 1 else "",
        "system": first.system if first else "",
        "generation": first.generation if first else "",
        "core": spec.core.name if spec else "",
        "dtype": first.dtype if first else "",
        "executions": len(exs),
        "devices": devices,
        "device_list": ranges(devices),
        "peak_tflops_per_core": peak,
        "dma_gbps_per_core": spec.core.dma_bytes_per_ns if spec else 0.0,
        "hbm_gbps_per_chip": spec.hbm_bytes_per_ns if spec else 0.0,
    }


def _dma_sizes(exs) -> dict:
    dmas = [i for ex in exs for i in ex.instructions if i.engine == "dma"]
    n = len(dmas)
    return {
        "dma_transfers": n,
        "average_dma_size": sum(i.bytes for i in dmas) / n if n else 0.0,
        "average_descriptor_bytes": sum(i.descriptor_bytes for i in dmas) / n if n else 0.0,
    }


def _waits(exs, device_ns: float) -> dict:
    """Per compute engine: time at the head of its queue waiting on a semaphore."""
    waits = dict.fromkeys(ENGINES[:-1], 0.0)
    for ex in exs:
        for i in ex.instructions:
            if i.engine in waits and i.waited_on is not None:
                waits[i.engine] += i.idle_ns
    return {e: (100 * w / device_ns if device_ns else 0.0) for e, w in waits.items()}


def _tensor_breakdown(exs) -> dict:
    """TensorE busy time by instruction kind (matmul, transpose, other), in %."""
    parts = {"matmul": 0.0, "transpose": 0.0, "other": 0.0}
    for ex in exs:
        for i in ex.instructions:
            if i.engine == "tensor":
                kind = ("transpose" if "Transpose" in i.opcode
                        else "matmul" if "Matmul" in i.opcode else "other")
                parts[kind] += i.duration_ns
    total = sum(parts.values())
    return {k: (100 * v / total if total else 0.0) for k, v in parts.items()}


def _kernel_row(s: metrics.KernelStats, total_ns: float) -> dict:
    """`time_s` is per device (the kernel runs side by side on each device that ran
    it), `device_time_s` summed over them; `total_ns`: device time (span x devices),
    so the share is of all devices' time (<= 100%). `calls`: runs per device."""
    t = s.totals
    bound, why = s.bound
    return {
        "name": s.name, "execution": s.key[0], "ops": s.ops, "calls": s.calls,
        "devices": ranges(s.devices), "device_count": len(s.devices),
        "time_s": t.time_ns * 1e-9, "device_time_s": t.device_ns * 1e-9,
        "time_percent": 100 * t.device_ns / total_ns if total_ns else 0.0,
        "bound": bound, "bound_reason": why,
        "engine_active_percent": {e: 100 * t.active(e) for e in ENGINES},
        "mbu_percent": 100 * t.mbu, "mfu_percent": 100 * t.mfu,
        "flops": t.flops, "hbm_bytes": t.hbm_bytes,
    }


def _collectives(exs, total_ns: float) -> dict:
    """Count, time (sum of durations) and share of the span; `exposed_s`: the time a
    device spends in collectives while none of its kernels runs (the device with the
    most, summed over executions; collectives overlap independent compute, see
    runtime/spmd.py); per kind durations; and each collective's row."""
    cols = [c for ex in exs for c in ex.collectives]
    ns = sum(c.duration_ns for c in cols)
    by_kind: dict[str, list[float]] = {}
    for c in cols:
        by_kind.setdefault(c.kind, []).append(c.duration_ns * 1e-9)
    exposed = sum(_exposed_ns(ex) for ex in exs)
    rows = [{"name": c.name, "kind": c.kind, "algorithm": c.algorithm, "bytes": c.bytes,
             "participants": len(c.devices), "groups": len(c.groups) or 1,
             "start_s": c.start_ns * 1e-9, "duration_s": c.duration_ns * 1e-9}
            for c in cols]
    return {"count": len(cols), "time_s": ns * 1e-9,
            "time_percent": 100 * ns / total_ns if total_ns else 0.0,
            "exposed_s": exposed * 1e-9,
            "exposed_percent": 100 * exposed / total_ns if total_ns else 0.0,
            "durations_s": by_kind, "list": rows}


def _exposed_ns(ex) -> float:
    """max over devices of |union of its collective spans minus union of its kernels|."""
    spans: dict[int, list] = {}
    for c in ex.collectives:
        for d, a, b in (c.spans or [(d, c.start_ns, c.end_ns) for d in c.devices]):
            spans.setdefault(d, []).append((a, b))
    kernels: dict[int, list] = {}
    for k in ex.kernels:
        kernels.setdefault(k.device, []).append((k.start_ns, k.end_ns))
    worst = 0.0
    for d, iv in spans.items():
        busy = merged(kernels.get(d, []))
        total = 0.0
        for a, b in merged(iv):
            total += (b - a) - sum(max(0.0, min(b, y) - max(a, x)) for x, y in busy)
        worst = max(worst, total)
    return worst




# --- text --------------------------------------------------------------------------

def _time(s: float) -> str:
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.2f} us"


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _source(ops: list[str]) -> str:
    """"dot_general at /p/f.py:7" -> "dot_general f.py:7" (the dominant op, which a
    fused kernel lists first, +n more)."""
    if not ops:
        return ""
    from .trace import parse_op
    kind, loc = parse_op(ops[0])
    text = f"{kind} {os.path.basename(loc)}".strip()
    return text + (f" +{len(ops) - 1}" if len(ops) > 1 else "")


def format_summary(d: dict) -> str:
    return "\n".join([*_overview(d), "", *_engines(d), "", *_program_lines(d),
                      *_device_lines(d), *_kernel_table(d), *_collective_lines(d), "",
                      *_line_table(d), *_insight_lines(d)]).rstrip() + "\n"


def _line_table(d: dict) -> list[str]:
    """Hand-written kernels (jax_trn.kernels): their busiest source lines."""
    rows = d.get("kernel_lines") or []
    if not rows:
        return []
    top = rows[:TOP_KERNELS]
    width = max(len(f"{r['kernel']} {r['line']}") for r in top)
    lines = [f"hand-written kernel lines ({len(top)} of {len(rows)}, by busy time)",
             f"  {'kernel line':<{width}}  {'engine':<8} {'instrs':>6}  {'busy':>10}  "
             f"{'waiting':>10}  on"]
    for r in top:
        lines.append(f"  {r['kernel'] + ' ' + r['line']:<{width}}  "
                     f"{ENGINE_NAMES.get(r['engine'], r['engine']):<8} {r['instructions']:>6}  "
                     f"{_time(r['busy_s']):>10}  {_time(r['wait_s']):>10}  "
                     f"{ENGINE_NAMES.get(r['waited_on'], r['waited_on'])}")
    return lines + [""]


def _overview(d: dict) -> list[str]:
    many = len(d["devices"]) > 1
    return [
        f"{d['name']}{' (pmap)' if d['kind'] == 'pmap' else ''} on {d['system']} "
        f"({d['core']}), device{'s' if many else ''}"
        f" {d['device_list']}" + (f", {d['executions']} executions" if d["executions"] > 1
                                  else ""),
        f"  simulated time      {_time(d['total_time_s'])}",
        f"  MFU ({d['dtype'] or '?'})".ljust(22) + f"{d['mfu_estimated_percent']:.1f}%  "
        f"({_peak_text(d)}; {d['flops'] / 1e6:.1f} model MFLOP)",
        f"  HFU / TensorE       {d['hfu_estimated_percent']:.1f}% of peak "
        f"({d['tensor_flops'] / 1e6:.1f} MFLOP executed), "
        f"{d['engine_active_percent']['tensor']:.1f}% active "
        f"(matmul {d['tensor_busy_breakdown_percent']['matmul']:.0f}%, transpose "
        f"{d['tensor_busy_breakdown_percent']['transpose']:.0f}%)",
        f"  MBU                 {d['mbu_estimated_percent']:.1f}%  (DMA "
        f"{d['dma_bandwidth_percent']:.1f}% of {d['dma_gbps_per_core']:.0f} GB/s per core, "
        f"HBM {d['hbm_bandwidth_percent']:.1f}% of {d['hbm_gbps_per_chip']:.0f} GB/s per chip)",
        f"  HBM traffic         {_bytes(d['hbm_bytes'])} at {d['hbm_gbps']:.1f} GB/s; "
        f"{d['mm_arithmetic_intensity']:.1f} FLOP/byte",
        f"  DMA                 {d['dma_transfers']} transfers, avg "
        f"{_bytes(d['average_dma_size'])}, {d['average_descriptor_bytes']:.0f} B per descriptor",
        f"  bound               {d['bound']} ({d['bound_time_percent']:.0f}% of kernel time)",
    ]


def _peak_text(d: dict) -> str:
    """Achieved against the peak of every device that ran, not one core's."""
    if len(d["devices"]) <= 1:
        return (f"{d['achieved_tflops']:.2f} of {d['peak_tflops_per_core']:.0f} TFLOP/s "
                f"per core")
    return (f"{d['achieved_tflops']:.2f} of {d['peak_tflops']:.0f} TFLOP/s on "
            f"{len(d['devices'])} devices x {d['peak_tflops_per_core']:.0f}; "
            f"{d['achieved_tflops_per_device']:.2f} per device")


def _program_lines(d: dict) -> list[str]:
    """One row per program, when the profile ran several."""
    rows = d["programs"]
    if len(rows) < 2:
        return []
    width = max(len(r["name"]) for r in rows)
    lines = [f"programs ({len(rows)})",
             f"  {'program':<{width}}  {'calls':>5}  {'time/call':>10}  {'total':>10}  "
             f"{'MFU':>5}  devices"]
    for r in rows:
        lines.append(f"  {r['name']:<{width}}  {r['calls']:>5}  "
                     f"{_time(r['time_per_call_s']):>10}  {_time(r['time_s']):>10}  "
                     f"{r['mfu_percent']:4.1f}%  {r['devices']}")
    return lines + [""]


def _device_lines(d: dict) -> list[str]:
    """Time per device (devices that show the same times share a row)."""
    rows = d["per_device"]
    if len(d["devices"]) < 2:
        return []
    lines = ["per device", f"  {'devices':<16} {'kernels':>10}  {'collectives':>11}  "
                           f"{'idle':>10}"]
    for r in rows[:TOP_KERNELS]:
        lines.append(f"  {r['devices']:<16} {_time(r['kernel_time_s']):>10}  "
                     f"{_time(r['collective_time_s']):>11}  {_time(r['idle_s']):>10}")
    if len(rows) > TOP_KERNELS:
        lines.append(f"  ... {len(rows) - TOP_KERNELS} more groups")
    return lines + [""]


def _engines(d: dict) -> list[str]:
    lines = ["  engine     active  semaphore wait"]
    for e in ENGINES:
        wait = d["semaphore_wait_percent"].get(e)
        lines.append(f"  {ENGINE_NAMES[e]:<9}{d['engine_active_percent'][e]:7.1f}%"
                     + (f"{wait:15.1f}%" if wait is not None else ""))
    return lines


def _kernel_table(d: dict) -> list[str]:
    """The slowest kernels; on several devices, time per device ("time/dev")."""
    rows = d["kernels"][:TOP_KERNELS]
    width = max([len(r["name"]) for r in rows] + [6])
    many = len(d["devices"]) > 1
    head = (f"  {'kernel':<{width}}  {'time/dev' if many else 'time':>10}  {'%':>5}  "
            f"{'bound':<8} {'Tensor':>6} {'Vector':>6} {'Scalar':>6} {'GpSimd':>6} "
            f"{'DMA':>5} {'MBU':>5}  op")
    lines = [f"top kernels ({min(len(rows), TOP_KERNELS)} of {len(d['kernels'])})", head]
    for r in rows:
        a = r["engine_active_percent"]
        where = f"  (devices {r['devices']})" if many and r["devices"] != d["device_list"] else ""
        lines.append(
            f"  {r['name']:<{width}}  {_time(r['time_s']):>10}  {r['time_percent']:4.1f}%  "
            f"{r['bound']:<8} {a['tensor']:5.0f}% {a['vector']:5.0f}% {a['scalar']:5.0f}% "
            f"{a['gpsimd']:5.0f}% {a['dma']:4.0f}% {r['mbu_percent']:4.0f}%  "
            f"{_source(r['ops'])}{where}")
    return lines


def _collective_lines(d: dict) -> list[str]:
    c = d["collectives"]
    if not c["count"]:
        return []
    lines = ["", f"collectives: {c['count']}, {_time(c['time_s'])} "
                 f"({c['time_percent']:.1f}% of time; exposed, with no kernel beside it: "
                 f"{_time(c['exposed_s'])}, {c['exposed_percent']:.1f}%)"]
    for kind, ds in sorted(c["durations_s"].items()):
        lines.append(f"  {kind:<16} x{len(ds):<4} mean {_time(sum(ds) / len(ds))}, "
                     f"max {_time(max(ds))}")
    for r in sorted(c["list"], key=lambda r: -r["duration_s"])[:TOP_KERNELS]:
        lines.append(f"  {r['name']:<20} {_time(r['duration_s']):>10}  {_bytes(r['bytes']):>9}  "
                     f"{r['participants']} devices in {r['groups']} groups  {r['algorithm']}")
    return lines


def _insight_lines(d: dict) -> list[str]:
    if not d["insights"]:
        return ["insights: none"]
    return ["insights"] + [f"  - {i['message']}" for i in d["insights"]]
