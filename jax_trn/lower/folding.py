"""Folding steps of a region into fewer instructions (trainium-hardware.md §2.3-2.4).

    act(x * a + b), act(x * a), act(x + b), act(x - b)  -> Activation(x, scale=a, bias=b)
    (x <op0> a) <op1> b                                 -> TensorScalar(op0, a, op1, b)

`a` and `b` are immediates (constant steps). ScalarE computes func(in * scale + bias) in
one instruction ("scale/bias is free, so fusing it saves a separate tensor_scalar,
about 2x", §2.4) and a VectorE tensor_scalar takes two ops (§6.2). Only float steps
fold, and only intermediates used once and not stored.

Numerics: the folded intermediate stays FP32 inside the engine instead of being
rounded to its IR type between the two ops. For float32 nothing changes (the engine
rounds to FP32 anyway); for bf16 / fp16 the result is as or more precise than op by op,
like XLA's excess precision on CPU.

Folded-away steps stay in the list as "folded" (no instruction, no buffer) so value
ids keep their meaning.
"""
from __future__ import annotations

from dataclasses import replace

from hlo_passes import ir

from .regions import Region
from .tileops import ACTIVATION, ALU, Step

FOLDABLE_ALU = frozenset({"add", "subtract", "multiply", "maximum", "minimum"})


def fold(region: Region) -> Region:
    """`region` with its foldable step pairs merged (a new Region; ids unchanged)."""
    steps = list(region.steps)
    n = len(region.inputs)
    outputs = {vid for vid, _ in region.outputs}
    uses = _use_counts(region)
    for j, step in enumerate(steps):            # ScalarE's free scale/bias first
        if step.kind in ACTIVATION:
            steps[j] = _into_activation(steps, j, n, uses, outputs)
    for j, step in enumerate(steps):
        if step.kind in FOLDABLE_ALU:
            steps[j] = _into_tensor_scalar(steps, j, n, uses, outputs)
    return replace(region, steps=steps)


def _use_counts(region: Region) -> dict[int, int]:
    counts: dict[int, int] = {}
    for s in region.steps:
        for a in s.args:
            counts[a] = counts.get(a, 0) + 1
    return counts


def _imm_operand(steps, step: Step, n: int):
    """(data vid, immediate, reversed) of a binary float step with one immediate."""
    if len(step.args) != 2 or not ir.is_float(step.dtype):
        return None
    a, b = step.args
    imm_a, imm_b = (_imm(steps, v, n) for v in (a, b))
    if imm_b is not None and imm_a is None:
        return a, imm_b, False
    if imm_a is not None and imm_b is None:
        return b, imm_a, True
    return None


def _imm(steps, vid: int, n: int):
    if vid < n or steps[vid - n].kind != "constant":
        return None
    return steps[vid - n].attrs["value"]


def _single_use(vid: int, n: int, uses, outputs, steps) -> bool:
    return vid >= n and uses.get(vid) == 1 and vid not in outputs and \
        steps[vid - n].kind in FOLDABLE_ALU


def _into_activation(steps, j: int, n: int, uses, outputs) -> Step:
    """act(x * a + b) and its sub-forms as one step ("activation")."""
    step = steps[j]
    x, scale, bias = step.args[0], 1.0, None
    if not ir.is_float(step.dtype) or not _single_use(x, n, uses, outputs, steps):
        return step
    inner = steps[x - n]
    found = _imm_operand(steps, inner, n)
    if found is None or inner.kind == "subtract" and found[2]:
        return step
    data, value, _ = found
    if inner.kind in ("add", "subtract"):
        bias = float(value) if inner.kind == "add" else -float(value)
        if _single_use(data, n, uses, outputs, steps):
            deeper = _imm_operand(steps, steps[data - n], n)
            if deeper is not None and steps[data - n].kind == "multiply":
                steps[data - n] = _folded(steps[data - n])
                data, scale = deeper[0], float(deeper[1])
    elif inner.kind == "multiply":
        scale = float(value)
    else:
        return step
    steps[x - n] = _folded(inner)
    attrs = {"func": step.kind, "scale": scale, "bias": bias}
    return Step("activation", (data,), step.dtype, attrs)


def _into_tensor_scalar(steps, j: int, n: int, uses, outputs) -> Step:
    """(x <op0> a) <op1> b as one step ("tensor_scalar")."""
    step = steps[j]
    outer = _imm_operand(steps, step, n)
    if outer is None or not _single_use(outer[0], n, uses, outputs, steps):
        return step
    first = steps[outer[0] - n]
    inner = _imm_operand(steps, first, n)
    if inner is None or first.kind not in FOLDABLE_ALU:
        return step
    steps[outer[0] - n] = _folded(first)
    ops = ((ALU[first.kind], inner[1], inner[2]), (ALU[step.kind], outer[1], outer[2]))
    return Step("tensor_scalar", (inner[0],), step.dtype, {"ops": ops})


def _folded(step: Step) -> Step:
    return Step("folded", (), step.dtype)

