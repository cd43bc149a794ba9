"""The readable listing of a lowered program (`Program.text`, `compiled.as_text()`).

Control flow shows as indented blocks:

    while while.4 (carried t0, t1) [while at f.py:3]
      cond -> pred t3:
        kernel compare.5 ...
      body:
        kernel add.6 ...
    case case.9 (index t7) -> t8
      branch 0:
        ...
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from jax_trn.hw.program import (Case, Collective, DramTensor, HostCallback, Kernel, Loop,
                                While, walk_kernels, walk_steps)

ENGINE_ORDER = ("dma", "tensor", "vector", "scalar", "gpsimd")


def _tensor(t: DramTensor) -> str:
    return f"{t.name}: {t.dtype}[{','.join(map(str, t.shape))}]"


def _bytes(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n} B"


def engine_counts(k: Kernel) -> Counter:
    return Counter(getattr(i, "engine", "?") for i in k.instructions)


def format_kernel(k: Kernel) -> str:
    counts = engine_counts(k)
    engines = ", ".join(f"{e} {counts[e]}" for e in ENGINE_ORDER if counts[e])
    ops = "; ".join(k.ops)
    notes = "".join(f"\n    // {n}" for n in getattr(k, "notes", ()))
    return (f"kernel {k.name}  [{ops}]\n"
            f"    {len(k.instructions)} instrs ({engines or 'none'})  "
            f"sbuf {_bytes(k.sbuf_bytes)}/partition  psum {_bytes(k.psum_bytes)}/partition  "
            f"flops {k.flops}{notes}")


def format_steps(steps, indent: str = "") -> list[str]:
    """The listing of a step list: kernels, and loops / conditionals as nested blocks."""
    lines = []
    for step in steps:
        if isinstance(step, Kernel):
            lines += [indent + line for line in format_kernel(step).split("\n")]
        elif isinstance(step, While):
            carried = ", ".join(t.name for t in step.carried)
            lines.append(f"{indent}while {step.name} (carried {carried})  "
                         f"[{'; '.join(step.ops)}]")
            lines += [f"{indent}  // {n}" for n in step.notes]
            lines.append(f"{indent}  cond -> pred {step.pred.name}:")
            lines += format_steps(step.cond, indent + "    ")
            lines.append(f"{indent}  body:")
            lines += format_steps(step.body, indent + "    ")
        elif isinstance(step, Loop):
            lines += _format_loop(step, indent)
        elif isinstance(step, Case):
            results = ", ".join(t.name for t in step.results)
            lines.append(f"{indent}case {step.name} (index {step.index.name}) -> "
                         f"{results or '()'}  [{'; '.join(step.ops)}]")
            for i, branch in enumerate(step.branches):
                lines.append(f"{indent}  branch {i}:")
                lines += format_steps(branch, indent + "    ")
        elif isinstance(step, Collective):
            lines.append(f"{indent}{format_collective(step)}")
        elif isinstance(step, HostCallback):
            lines.append(f"{indent}{format_host_callback(step)}")
    return lines


def _format_loop(step: Loop, indent: str) -> list[str]:
    """An on-chip loop: its trip count, resident carries, notes and kernels."""
    carried = ", ".join(t.name for t in step.carried)
    lines = [f"{indent}loop on chip {step.name} ({step.trips} trips, carried {carried}; "
             f"resident {', '.join(step.resident) or 'none'})  [{'; '.join(step.ops)}]"]
    lines += [f"{indent}  // {n}" for n in step.notes]
    for part, kernels in (("enter", step.enter), ("body", step.body), ("exit", step.exit)):
        lines.append(f"{indent}  {part}:")
        lines += format_steps(kernels, indent + "    ")
    return lines


def format_host_callback(step: HostCallback) -> str:
    """One line: the registry key, who calls it, operands -> results."""
    who = "every device" if step.device is None else f"partition {step.device} for all"
    ins = ", ".join(t.name for t in step.operands)
    outs = ", ".join(t.name for t in step.results)
    return (f"host_callback {step.name} (callback {step.key}, {who}): {ins} -> {outs}"
            f"  [{'; '.join(step.ops)}]")


def format_collective(step: Collective) -> str:
    """One line: kind, combiner / dims, groups or pairs, operands -> results."""
    extra = {"all_reduce": f"{step.op}", "reduce_scatter": f"{step.op}, dim {step.dim}",
             "all_gather": f"dim {step.dim}",
             "all_to_all": f"split {step.split_dim}, concat {step.concat_dim}",
             "collective_permute": f"pairs {list(step.pairs)}"}[step.kind]
    groups = "" if step.kind == "collective_permute" else (
            f" groups {[list(g) for g in step.groups]}" if step.groups else " all devices")
    ins = ", ".join(t.name for t in step.operands)
    outs = ", ".join(t.name for t in step.results)
    return f"collective {step.name} ({extra}){groups}: {ins} -> {outs}  [{'; '.join(step.ops)}]"


def format_program(params, outputs, temps, steps, constants: dict[str, np.ndarray]) -> str:
    kernels = list(walk_kernels(steps))
    loops = sum(isinstance(s, (While, Loop)) for s in walk_steps(steps))
    cases = sum(isinstance(s, Case) for s in walk_steps(steps))
    colls = sum(isinstance(s, Collective) for s in walk_steps(steps))
    calls = sum(isinstance(s, HostCallback) for s in walk_steps(steps))
    control = ((f", {loops} loops" if loops else "") + (f", {cases} conditionals" if cases else "")
               + (f", {colls} collectives" if colls else "")
               + (f", {calls} host callbacks" if calls else ""))
    lines = [(f"trn program: {len(kernels)} kernels{control}, "
              f"{sum(len(k.instructions) for k in kernels)} instructions")]
    for label, ts in (("params", params), ("outputs", outputs), ("temps", temps)):
        if ts:
            lines.append(f"  {label}: " + ", ".join(map(_tensor, ts)))
    if constants:
        lines.append("  constants: " + ", ".join(
            f"{n}: {a.dtype}[{','.join(map(str, a.shape))}]" for n, a in constants.items()))
    lines += format_steps(steps)
    return "\n".join(lines) + "\n"

