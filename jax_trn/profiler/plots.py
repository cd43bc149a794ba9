"""Plots for notebooks (matplotlib, the optional `plots` extra: pip install 'jax-trn[plots]').

- `timeline`: engines and DMA queues x simulated time, instructions coloured by kernel;
- `utilization`: active % per engine, MFU and MBU, with the §7 bound thresholds;
- `roofline`: achieved TFLOP/s against arithmetic intensity per kernel, under the
  generation's compute peak and memory ceiling;
- `collectives`: duration against payload per collective (multi-chip runs).

Each takes a list of executions (laid end to end, like the trace export) and an
optional `ax`, and returns the matplotlib Axes.
"""
from __future__ import annotations

from . import metrics
from .chrome import GAP_US
from .engines import COMPUTE_ENGINES, ENGINE_NAMES, ENGINES

MAX_LEGEND = 10


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("jax_trn plots need matplotlib: pip install 'jax-trn[plots]'") from e
    return plt


def _axes(ax, size):
    if ax is not None:
        return ax
    _, ax = _pyplot().subplots(figsize=size, layout="constrained")
    return ax


def _rows(executions) -> list[tuple[int, int, str]]:
    """(device, core, queue) rows: compute engines first, then DMA queues by number."""
    rows = {(i.device, i.core, i.queue) for ex in executions for i in ex.instructions}

    def order(r):
        q = r[2]
        rank = COMPUTE_ENGINES.index(q) if q in COMPUTE_ENGINES else 10 + int(q[3:])
        return (r[0], rank)
    return sorted(rows, key=order)


def _row_label(row, many_devices: bool) -> str:
    device, _, q = row
    name = ENGINE_NAMES[q] if q in COMPUTE_ENGINES else f"DMA q{q[3:]}"
    return f"trn:{device} {name}" if many_devices else name


def _kernel_colors(executions, plt) -> dict[str, tuple]:
    stats = metrics.kernel_stats(executions)
    cmap = plt.get_cmap("tab20")
    return {s.name: cmap(i % 20) for i, s in enumerate(stats)}


def timeline(executions, ax=None, max_legend: int = MAX_LEGEND):
    """Engines (rows) x simulated time (us); each instruction a bar in its kernel's
    colour; the slowest kernels in the legend."""
    plt = _pyplot()
    rows = _rows(executions)
    ax = _axes(ax, (12, 0.35 * len(rows) + 1.5))
    colors = _kernel_colors(executions, plt)
    index = {r: n for n, r in enumerate(rows)}
    offset = 0.0
    for ex in executions:
        bars: dict[tuple[int, str], list] = {}
        for i in ex.instructions:
            key = (index[(i.device, i.core, i.queue)], i.kernel)
            bars.setdefault(key, []).append(((offset + i.start_ns) / 1e3,
                                             max(i.duration_ns / 1e3, 1e-4)))
        for (row, kernel), spans in bars.items():
            ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=colors[kernel])
        offset += ex.span_ns + GAP_US * 1e3
    many = len({r[0] for r in rows}) > 1
    ax.set_yticks(range(len(rows)), [_row_label(r, many) for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (us)")
    ax.set_title(_title(executions, "engine timeline"))
    top = list(colors)[:max_legend]
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[k]) for k in top]
    ax.legend(handles, top, title="kernels (slowest first)", fontsize="small",
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax


def utilization(executions, ax=None):
    """Active % per engine, then MFU and MBU, with the compute (90%) and memory (60%)
    bound thresholds."""
    ax = _axes(ax, (7, 3.5))
    t = metrics.totals(executions)
    labels = [ENGINE_NAMES[e] for e in ENGINES] + ["MFU", "MBU"]
    values = [100 * t.active(e) for e in ENGINES] + [100 * t.mfu, 100 * t.mbu]
    colors = ["tab:blue"] * len(ENGINES) + ["tab:orange", "tab:green"]
    bars = ax.bar(labels, values, color=colors)
    ax.bar_label(bars, fmt="%.1f%%", fontsize="small")
    ax.axhline(100 * metrics.COMPUTE_BOUND, color="gray", ls="--", lw=0.8)
    ax.axhline(100 * metrics.MEMORY_BOUND, color="gray", ls=":", lw=0.8)
    ax.set_ylim(0, 105)
    ax.set_ylabel("% of simulated time / of peak")
    ax.set_title(_title(executions, "utilization"))
    return ax


def roofline(executions, ax=None):
    """Per kernel with FLOPs: achieved TFLOP/s vs FLOPs per HBM byte (log-log),
    under min(peak, intensity x memory ceiling); marker area ~ kernel time."""
    ax = _axes(ax, (7, 4.5))
    ex0 = executions[0]
    spec = ex0.chip_spec
    peak = ex0.peak_flops_per_s / 1e12
    memory = min(spec.core.dma_bytes_per_ns, spec.hbm_bytes_per_ns) if spec else 0.0
    stats = [s for s in metrics.kernel_stats(executions)
             if s.totals.flops and s.totals.hbm_bytes]
    if not stats:
        ax.set_title(_title(executions, "roofline: no kernel does FLOPs"))
        return ax
    xs = [s.totals.arithmetic_intensity for s in stats]
    lo, hi = min(xs + [1.0]) / 4, max(xs + [peak * 1e3 / memory if memory else 1.0]) * 4
    grid = [lo * (hi / lo) ** (k / 100) for k in range(101)]
    ax.plot(grid, [min(peak, x * memory / 1e3) for x in grid], color="black", lw=1.2,
            label=f"roof: {peak:.0f} TFLOP/s, {memory:.0f} GB/s")
    total = sum(s.totals.time_ns for s in stats)
    points = [(x, s.totals.flops_per_s / 1e12) for s, x in zip(stats, xs)]
    for s, (x, y) in zip(stats, points):
        ax.scatter([x], [y], s=20 + 400 * s.totals.time_ns / total, alpha=0.7)
    for (x, y), label in _labels(points, [s.name for s in stats]):
        ax.annotate(label, (x, y), fontsize="x-small", xytext=(4, 4),
                    textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per HBM byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(_title(executions, "roofline"))
    ax.legend(fontsize="small", loc="lower right")
    return ax


def _labels(points, names, near: float = 0.15):
    """One label per cluster of points within `near` decades: "name +n more"."""
    import math
    anchors: list[list] = []            # [x, y, name, others]
    for (x, y), name in zip(points, names):
        lx, ly = math.log10(x), math.log10(max(y, 1e-30))
        for a in anchors:
            if abs(math.log10(a[0]) - lx) < near and abs(math.log10(max(a[1], 1e-30)) - ly) < near:
                a[3] += 1
                break
        else:
            anchors.append([x, y, name, 0])
    return [((x, y), name + (f" +{n}" if n else "")) for x, y, name, n in anchors]


def collectives(executions, ax=None):
    """Duration (us) against payload bytes, one colour per collective kind."""
    ax = _axes(ax, (7, 4))
    by_kind: dict[str, list] = {}
    for ex in executions:
        for c in ex.collectives:
            by_kind.setdefault(c.kind, []).append((c.bytes, c.duration_ns / 1e3))
    for kind, points in sorted(by_kind.items()):
        ax.scatter([p[0] for p in points], [p[1] for p in points], label=kind, alpha=0.7)
    ax.set_xlabel("bytes per participant")
    ax.set_ylabel("duration (us)")
    ax.set_title(_title(executions, "collectives" if by_kind else "no collectives"))
    if by_kind:
        ax.set_xscale("log")
        ax.legend(fontsize="small")
    return ax


def _title(executions, what: str) -> str:
    if not executions:
        return what
    ex = executions[0]
    name = ex.name if len(executions) == 1 else f"{len(executions)} executions"
    return f"{name} on {ex.system}: {what}"
