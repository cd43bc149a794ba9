"""Multi-device views of a profile: compressed device lists, time per device, and one
row per program.

A program on 128 devices is one SPMD program run 128 times side by side, so the page
reports what one device did (its kernels' time, its time in collectives) and groups
the devices that did the same, as `0-127`, instead of summing 128 devices' kernel time
into a figure larger than the step, or printing 128 ids on one line. A profile of
several programs (`prof.summary()`) gets one row per program: its calls, devices,
time per call, FLOPs and MFU against the peak of all its devices.
"""
from __future__ import annotations

from dataclasses import dataclass


def ranges(ids) -> str:
    """Device ids as runs: [0, 1, 2, 3, 8, 10, 11] -> "0-3, 8, 10-11"."""
    runs: list[list[int]] = []
    for i in sorted(set(ids)):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


@dataclass
class DeviceTime:
    """What one device did over the profiled executions."""
    device: int
    kernel_ns: float = 0.0           # its kernels' durations, summed
    collective_ns: float = 0.0       # its spans in collectives, summed
    span_ns: float = 0.0             # the spans of the executions it took part in

    @property
    def idle_ns(self) -> float:
        return max(0.0, self.span_ns - self.kernel_ns - self.collective_ns)


def device_times(executions) -> list[DeviceTime]:
    """One `DeviceTime` per device that ran, by device id."""
    out: dict[int, DeviceTime] = {}
    for ex in executions:
        for d in ex.devices:
            out.setdefault(d, DeviceTime(d)).span_ns += ex.span_ns
        for k in ex.kernels:
            out.setdefault(k.device, DeviceTime(k.device)).kernel_ns += k.duration_ns
        for c in ex.collectives:
            for d, a, b in (c.spans or [(d, c.start_ns, c.end_ns) for d in c.devices]):
                out.setdefault(d, DeviceTime(d)).collective_ns += b - a
    return [out[d] for d in sorted(out)]


def device_rows(executions, fmt) -> list[dict]:
    """Devices grouped by what they show (`fmt(seconds)` of kernel, collective and idle
    time): one row per group, its devices compressed ("0-127")."""
    groups: dict[tuple[str, str, str], list[DeviceTime]] = {}
    for t in device_times(executions):
        key = (fmt(t.kernel_ns * 1e-9), fmt(t.collective_ns * 1e-9), fmt(t.idle_ns * 1e-9))
        groups.setdefault(key, []).append(t)
    return [_device_row(ts) for ts in groups.values()]


def _device_row(ts: list[DeviceTime]) -> dict:
    n = len(ts)
    return {"devices": ranges(t.device for t in ts), "count": n,
            "kernel_time_s": sum(t.kernel_ns for t in ts) / n * 1e-9,
            "collective_time_s": sum(t.collective_ns for t in ts) / n * 1e-9,
            "idle_s": sum(t.idle_ns for t in ts) / n * 1e-9}


def program_names(executions) -> list[str]:
    """Each execution's program name as JAX gave it (`jit_f`, `jit__lambda`); different
    programs that JAX gave the same name are told apart as `jit__lambda#2`. A program
    is known by its kernels (the objects the compiler made), so calls of one
    executable share a name and two lambdas do not."""
    seen: dict[str, list] = {}
    out = []
    for ex in executions:
        ids = seen.setdefault(ex.name, [])
        key = _program_key(ex)
        if key not in ids:
            ids.append(key)
        n = ids.index(key)
        out.append(ex.name if n == 0 else f"{ex.name}#{n + 1}")
    return out


def _program_key(ex):
    first = ex.kernels[0].kernel if ex.kernels else None
    return id(first) if first is not None else (ex.kernels[0].name if ex.kernels else "")


def program_rows(executions) -> list[dict]:
    """One row per program, in the order they first ran."""
    by_name: dict[str, list] = {}
    for ex, name in zip(executions, program_names(executions)):
        by_name.setdefault(name, []).append(ex)
    return [_program_row(name, exs) for name, exs in by_name.items()]


def _program_row(name: str, exs: list) -> dict:
    span = sum(ex.span_ns for ex in exs)
    devices = sorted({d for ex in exs for d in ex.devices})
    peak = sum(ex.span_ns * 1e-9 * ex.peak_flops_per_s * max(1, len(ex.devices))
               for ex in exs)
    flops = sum(ex.flops for ex in exs)
    return {"name": name, "kind": program_kind(exs[0]), "calls": len(exs),
            "devices": ranges(devices),
            "device_count": len(devices), "time_s": span * 1e-9,
            "time_per_call_s": span * 1e-9 / len(exs), "flops": flops,
            "mfu_percent": 100 * flops / peak if peak else 0.0}


def program_kind(ex) -> str:
    """"pmap" or "jit": how JAX made the program. JAX 0.10 runs `jax.pmap(f)` as
    `jit(shard_map(_fun))` (jax/_src/pmap.py), so JAX itself, on every backend, names
    every pmap program `jit__fun` whatever `f` is; the name PJRT receives (the module's
    sym_name) carries nothing else. A function the user named `_fun` would read as a
    pmap too."""
    return "pmap" if ex.name == PMAP_NAME else "jit"


PMAP_NAME = "jit__fun"
