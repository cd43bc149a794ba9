"""What a plan computes (trainium-hardware.md §3.4, §4, §5.2), vectorized over all ranks of
all groups with numpy.

Buffers hold the element dtype between steps. A reducing transfer computes
cast(fp32(own) + fp32(incoming)): the CC engine's DMA-side accumulation goes through
FP32 like every DMA compute (§3.4 [NKI-ISA], §4) and writes the element type back, so
bf16 sums round once per step, in the algorithm's order. A `LocalReduce` sums up to
`sources` (16) ranges in FP32 before rounding (dma_compute, §3.4), chaining batches of
16. max / min are exact; bool combines by or. Integer sums go through FP32 too (§4
[DTYPES]: integer all-reduce / reduce-scatter are converted to FP32 by the compiler),
exact below 2^24.
"""
from __future__ import annotations

import numpy as np

from jax_trn.hw import numerics as _num

from .plan import Plan, Xfer

__all__ = ["execute", "combine", "local_reduce"]


def combine(a: np.ndarray, b: np.ndarray, op: str) -> np.ndarray:
    """One reducing transfer: `b` into `a` (sum through FP32, rounded to a's dtype)."""
    if op == "max":
        return np.maximum(a, b)
    if op == "min":
        return np.minimum(a, b)
    if a.dtype.kind == "b":
        return a | b
    return _num.cast(_num.to_fp32(a) + _num.to_fp32(b), a.dtype)


def _slots(starts, length):
    return np.asarray(starts)[:, None] + np.arange(length)[None, :]


def execute(plan: Plan, buf: np.ndarray, op: str, sources: int) -> np.ndarray:
    """Run `plan` on `buf` (ranks x slots x chunk elements) in place; `sources`: the
    sources one dma_compute sums (`LinkSpec.dma_compute_sources`)."""
    for st in plan.steps:
        if isinstance(st, Xfer):
            vals = buf[st.src[:, None], _slots(st.sstart, st.length)]
            rows, cols = st.dst[:, None], _slots(st.dstart, st.length)
            buf[rows, cols] = combine(buf[rows, cols], vals, op) if st.reduce else vals
        else:
            buf[st.rank[:, None], _slots(st.dstart, st.length)] = _local_reduce(buf, st, op, sources)
    return buf


def _local_reduce(buf, st, op, sources):
    rows = st.rank[:, None]
    parts = [buf[rows, _slots(st.sstarts[:, k], st.length)] for k in range(st.sstarts.shape[1])]
    return local_reduce(parts, op, sources, buf.dtype)


def local_reduce(parts: list, op: str, sources: int, dtype) -> np.ndarray:
    """Sum (or max/min) `parts` in k order: FP32 over batches of `sources`
    (dma_compute, §3.4), the running partial rounded to the element type between
    batches and counted as one of the next batch's sources."""
    if op in ("max", "min") or np.dtype(dtype).kind == "b":
        acc = parts[0]
        for x in parts[1:]:
            acc = combine(acc, x, op)
        return acc
    acc, k = None, 0
    while k < len(parts):
        batch = parts[k:k + (sources if acc is None else sources - 1)]
        k += len(batch)
        s = _num.to_fp32(acc) if acc is not None else np.zeros(batch[0].shape, np.float32)
        for x in batch:
            s = s + _num.to_fp32(x)
        acc = _num.cast(s, dtype)
    return acc
