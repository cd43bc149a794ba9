"""The readable listing of a lowered program (`Program.text`, `compiled.as_text()`)."""
from __future__ import annotations

from collections import Counter

import numpy as np

from jax_trn.hw.program import DramTensor, Kernel

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


def format_program(params, outputs, temps, kernels, constants: dict[str, np.ndarray]) -> str:
    lines = [f"trn program: {len(kernels)} kernels, "
             f"{sum(len(k.instructions) for k in kernels)} instructions"]
    for label, ts in (("params", params), ("outputs", outputs), ("temps", temps)):
        if ts:
            lines.append(f"  {label}: " + ", ".join(map(_tensor, ts)))
    if constants:
        lines.append("  constants: " + ", ".join(
            f"{n}: {a.dtype}[{','.join(map(str, a.shape))}]" for n, a in constants.items()))
    lines += [format_kernel(k) for k in kernels]
    return "\n".join(lines) + "\n"
