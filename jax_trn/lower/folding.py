"""Folding steps of a region into fewer instructions (trainium-hardware.md §2.3-2.4, §6.2).

    act(x * a + b), act(x * a), act(x + b), act(x - b)  -> Activation(x, scale=a, bias=b)
    act(x - m), act(x + m)       (m per row)            -> Activation(x, bias=-m or m)
    (x <op0> a) <op1> b                                 -> TensorScalar(op0, a, op1, b)
    (x <op0> a) <op1> y          (x, y tiles)           -> ScalarTensorTensor
    convert(x <cmp> a) <op1> b   (exact in FP32)        -> TensorScalar(cmp, a, op1, b)
    convert(f(...)) narrowing                           -> f writing the narrow type
    g(convert(x)) widening                              -> g reading x directly

In the first Activation fold `a` and `b` are immediates (constant steps); in the second
`m` is a per-row value (below), negated into a [P, 1] FP32 tile per box (exact), so
softmax's exp(x - max) is one ScalarE instruction. In the two ALU folds
`a` and `b` are immediates or per-row values (`_per_row`: a scalar input, a column
broadcast along the last axis, or a step computed from those), which the tiling usually
loads as [P, 1] tiles (regions.py), the TensorScalar operand; when a box gives a full
tile instead, the step runs op by op (tileops/simple.py), as unfolded. ScalarE computes
func(in * scale + bias) in one instruction ("scale/bias is free, so fusing it saves a
separate tensor_scalar, about 2x", §2.4); a VectorE tensor_scalar takes two ops and a
scalar_tensor_tensor an op and a tensor op (§6.2). A scalar_tensor_tensor costs 2N
(§6.3), a tensor_scalar N / 2 and a tensor_tensor 2N on FP32 tiles from NC-v3 (§2.3):
the fold saves N / 2 and an instruction per FP32 pair; for BF16 (tensor_tensor N, a
tensor_scalar N / 4) it pays only for subtract-then-multiply (N, §6.3), so only FP32
pairs and that one BF16 form fold. Only float steps fold, and only intermediates used
once and not stored.

Converts (§2.3-2.4: engines read any type, compute in FP32 and cast on write): a float
convert that does not widen, of a one-instruction step used only by it, becomes that
step's destination type (one rounding of the same FP32 value: identical results); a
widening float convert (exact) read only by one-instruction steps is read by them
directly; a compare converted to a float type writes 1.0 / 0.0 in it. Either way the
TensorCopy goes.

Numerics: the folded intermediate stays FP32 inside the engine instead of being
rounded to its IR type between the two ops. For float32 nothing changes (the engine
rounds to FP32 anyway); for bf16 / fp16 the result is as or more precise than op by op,
like XLA's excess precision on CPU. No fold reorders arithmetic: a divide stays a divide.

Folded-away steps stay in the list as "folded" (no instruction, no buffer) so value
ids keep their meaning.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hlo_passes import ir
from jax_trn.hw import dtypes as hw_dtypes

from .regions import IotaTensor, Region
from .tileops import ACTIVATION, ALU, COMPARE, Step

FOLDABLE_ALU = frozenset({"add", "subtract", "multiply", "maximum", "minimum"})
# Ops of the two ALU folds' outer step (a divide stays a divide: never rewritten).
OUTER_ALU = FOLDABLE_ALU | {"divide"}
# Steps that are one instruction reading any float type (tileops/simple.py).
ONE_INSTRUCTION = OUTER_ALU | (ACTIVATION.keys() - {"sign"})
_ENGINE_FLOATS = ("float32", "bfloat16", "float16")
FP32_EXACT_INT = 2 ** 24        # integers up to this magnitude are exact in FP32


@dataclass(frozen=True)
class Arg:
    """A folded step's operand that is a value: the step's args[index] (tileops)."""
    index: int


def fold(region: Region) -> Region:
    """`region` with its foldable step pairs merged (a new Region; ids unchanged)."""
    steps = list(region.steps)
    n = len(region.inputs)
    outputs = {vid for vid, _ in region.outputs}
    uses = _use_counts(region)
    for j, step in enumerate(steps):            # ScalarE's free scale/bias first
        if step.kind in ACTIVATION:
            steps[j] = _into_activation(steps, j, n, uses, outputs)
    rows = _per_row(region, steps)
    for j, step in enumerate(steps):
        if step.kind in ACTIVATION and step.kind != "sign":
            steps[j] = _into_activation_row(steps, j, n, uses, outputs, rows)
    for j, step in enumerate(steps):
        if step.kind in OUTER_ALU:
            steps[j] = _into_compare_scalar(region, steps, j, uses, outputs, rows)
    for j, step in enumerate(steps):
        if step.kind in OUTER_ALU:
            steps[j] = _into_tensor_scalar(steps, j, n, uses, outputs, rows)
    for j, step in enumerate(steps):
        if step.kind in OUTER_ALU:
            steps[j] = _into_stt(steps, j, n, uses, outputs, rows)
    out = _fold_converts(region, steps, uses, outputs)
    return replace(region, steps=steps, outputs=out)


def _use_counts(region: Region) -> dict[int, int]:
    counts: dict[int, int] = {}
    for s in region.steps:
        for a in s.args:
            counts[a] = counts.get(a, 0) + 1
    return counts


def _per_row(region: Region, steps) -> set[int]:
    """Value ids with one value per row of the last axis (see the module doc)."""
    n, rows = len(region.inputs), set(region.row_vids)     # a row fusion's statistics
    for i, inp in enumerate(region.inputs):
        if inp.t is not None and inp.axes and inp.axes[-1][0] == 0 and ir.is_float(inp.dtype):
            rows.add(i)
    for j, s in enumerate(steps):
        if s.kind == "constant" or (s.args and all(a in rows for a in s.args)
                                    and ir.is_float(s.dtype)):
            rows.add(n + j)
    return rows


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


def _row_operand(steps, step: Step, n: int, rows: set[int]):
    """(data vid, operand, reversed): the operand an immediate or a per-row vid."""
    found = _imm_operand(steps, step, n)
    if found is not None or len(step.args) != 2 or not ir.is_float(step.dtype):
        return found
    a, b = step.args
    if b in rows and a not in rows:
        return a, ("vid", b), False
    if a in rows and b not in rows:
        return b, ("vid", a), True
    return None


def _imm(steps, vid: int, n: int):
    if vid < n or steps[vid - n].kind != "constant":
        return None
    return steps[vid - n].attrs["value"]


def _single_use(vid: int, n: int, uses, outputs, steps) -> bool:
    return vid >= n and uses.get(vid) == 1 and vid not in outputs and \
        steps[vid - n].kind in OUTER_ALU


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


def _into_activation_row(steps, j: int, n: int, uses, outputs, rows) -> Step:
    """act(x - m), act(x + m), m per-row: one Activation with bias -m or m ("activation_row")."""
    step = steps[j]
    (x,) = step.args
    if not ir.is_float(step.dtype) or not _single_use(x, n, uses, outputs, steps):
        return step
    inner = steps[x - n]
    found = _row_operand(steps, inner, n, rows)
    if inner.kind not in ("add", "subtract") or found is None or \
            not isinstance(found[1], tuple) or found[0] in rows or \
            inner.kind == "subtract" and found[2] or inner.dtype != step.dtype:
        return step             # (op by op, the intermediate is in `step`'s type)
    steps[x - n] = _folded(inner)
    attrs = {"func": step.kind, "negate": inner.kind == "subtract"}
    return Step("activation_row", (found[0], found[1][1]), step.dtype, attrs)


def _operands(found: list, args: list) -> list:
    """The fold's operands: immediates, or `Arg`s indexing the value args appended."""
    out = []
    for _, value, _ in found:
        if isinstance(value, tuple):
            args.append(value[1])
            value = Arg(len(args) - 1)
        out.append(value)
    return out


def _into_tensor_scalar(steps, j: int, n: int, uses, outputs, rows) -> Step:
    """(x <op0> a) <op1> b as one step ("tensor_scalar")."""
    step = steps[j]
    outer = _row_operand(steps, step, n, rows)
    if outer is None or not _single_use(outer[0], n, uses, outputs, steps):
        return step
    first = steps[outer[0] - n]
    inner = _row_operand(steps, first, n, rows)
    values = any(isinstance(f[1], tuple) for f in (inner, outer) if f is not None)
    if inner is None or values and first.dtype != step.dtype:
        return step                 # run op by op, the intermediate is in `step`'s type
    steps[outer[0] - n] = _folded(first)
    args = [inner[0]]
    a, b = _operands([inner, outer], args)
    ops = ((ALU[first.kind], a, inner[2]), (ALU[step.kind], b, outer[2]))
    return Step("tensor_scalar", tuple(args), step.dtype, {"ops": ops})


def _into_compare_scalar(region: Region, steps, j: int, uses, outputs, rows) -> Step:
    """convert(x <cmp> a) <op1> b as one step ("tensor_scalar"): the compare writes 1.0 /
    0.0 and op1 follows in the same instruction (§6.2: compare ops are ALU ops of a
    tensor_scalar), only where comparing in FP32 is exact (`_fp32_compare_exact`)."""
    step, n = steps[j], len(region.inputs)
    outer = _row_operand(steps, step, n, rows)
    if outer is None or not _single_use_of(outer[0], "convert", n, uses, outputs, steps):
        return step
    conv = steps[outer[0] - n]
    c = conv.args[0]
    if conv.dtype != step.dtype or not _single_use_of(c, "compare", n, uses, outputs, steps):
        return step
    cmp = steps[c - n]
    found = _compare_operand(region, steps, cmp)
    if found is None or not _fp32_compare_exact(region, steps, cmp.args):
        return step
    steps[c - n], steps[outer[0] - n] = _folded(cmp), _folded(conv)
    args = [found[0]]
    a, b = _operands([found, outer], args)
    ops = ((COMPARE[cmp.attrs["comparison_direction"]], a, found[2]),
           (ALU[step.kind], b, outer[2]))
    return Step("tensor_scalar", tuple(args), step.dtype, {"ops": ops})


def _single_use_of(vid: int, kind: str, n: int, uses, outputs, steps) -> bool:
    return vid >= n and uses.get(vid) == 1 and vid not in outputs and \
        steps[vid - n].kind == kind


def _compare_operand(region: Region, steps, cmp: Step):
    """(data vid, operand, reversed) of a compare with one per-row or immediate side
    (of any type: token ids are integers), like `_row_operand`."""
    n = len(region.inputs)
    def row(v):
        if v >= n:
            return steps[v - n].kind == "constant"
        inp = region.inputs[v]
        return inp.t is not None and bool(inp.axes) and inp.axes[-1][0] == 0
    def operand(v):
        return ("vid", v) if v < n else steps[v - n].attrs["value"]
    a, b = cmp.args
    if row(b) and not row(a):
        return a, operand(b), False
    if row(a) and not row(b):
        return b, operand(a), True
    return None


def _fp32_compare_exact(region: Region, steps, args) -> bool:
    """Whether comparing `args` in FP32 (an engine's datapath, §2.3) gives the exact
    result: both floats (every engine float widens exactly), or one an iota of at most
    2**24 values (exact in FP32) and the other an integer of at most 32 bits: FP32
    rounding is monotone and moves no integer past an exactly representable one, so
    every comparison with the iota's values keeps its outcome."""
    n = len(region.inputs)
    dtypes = [region.dtype(v) for v in args]
    if all(d in _ENGINE_FLOATS for d in dtypes):
        return True
    def small_iota(v):
        t = region.inputs[v].t if v < n else None
        return isinstance(t, IotaTensor) and math.prod(t.shape) <= FP32_EXACT_INT
    def narrow(d):
        return d in _ENGINE_FLOATS or ir.is_int(d) and hw_dtypes.itemsize(d) <= 4
    return any(small_iota(v) and narrow(dtypes[1 - k]) for k, v in enumerate(args))


def _into_stt(steps, j: int, n: int, uses, outputs, rows) -> Step:
    """(x <op0> a) <op1> y, y a tile, as one step ("scalar_tensor_tensor")."""
    step = steps[j]
    if len(step.args) != 2 or not ir.is_float(step.dtype) or any(a in rows for a in step.args):
        return step
    for k, (x, y) in enumerate((step.args, step.args[::-1])):
        if not _single_use(x, n, uses, outputs, steps):
            continue
        first = steps[x - n]
        inner = _row_operand(steps, first, n, rows)
        if inner is None or inner[0] in rows or first.dtype != step.dtype or \
                not _pays(first.kind, step.kind, step.dtype, bool(k)):
            continue
        steps[x - n] = _folded(first)
        args = [inner[0], y]
        (a,) = _operands([inner], args)
        attrs = {"op0": ALU[first.kind], "operand0": a, "reverse0": inner[2],
                 "op1": ALU[step.kind], "reverse1": bool(k)}
        return Step("scalar_tensor_tensor", tuple(args), step.dtype, attrs)
    return step


def _pays(op0: str, op1: str, dtype: str, reverse1: bool) -> bool:
    """Whether one scalar_tensor_tensor beats its two instructions (module doc)."""
    if dtype == "float32":
        return True
    return dtype == "bfloat16" and (op0, op1) == ("subtract", "multiply")


# --- converts ------------------------------------------------------------------------------

def _fold_converts(region: Region, steps, uses, outputs) -> list:
    """Folds converts in place (module doc); returns the region's outputs remapped."""
    n, alias = len(region.inputs), {}
    for j, step in enumerate(steps):
        if step.kind != "convert":
            continue
        (x,) = step.args
        src = region.dtype(x) if x < n else steps[x - n].dtype
        if src == "bool" and _compare_only_for(steps, x, n, uses, outputs, step.dtype):
            steps[x - n] = replace(steps[x - n], dtype=step.dtype)   # writes 1.0 / 0.0
            steps[j], alias[n + j] = _folded(step), x
            continue
        if src not in _ENGINE_FLOATS or step.dtype not in _ENGINE_FLOATS or \
                n + j not in outputs and not uses.get(n + j):
            continue
        if _narrows(src, step.dtype) and _retypable(steps, x, n, uses, outputs):
            steps[x - n] = _retyped(steps[x - n], step.dtype)
            steps[j], alias[n + j] = _folded(step), x
        elif not _narrows(src, step.dtype) and n + j not in outputs and \
                _readers_take_any(steps, n + j):
            steps[j], alias[n + j] = _folded(step), x
    def resolve(vid: int) -> int:           # convert(convert(x)): both folded
        while vid in alias:
            vid = alias[vid]
        return vid
    for j, step in enumerate(steps):
        if any(a in alias for a in step.args):
            steps[j] = replace(step, args=tuple(resolve(a) for a in step.args))
    return [(resolve(vid), t) for vid, t in region.outputs]


def _compare_only_for(steps, x: int, n: int, uses, outputs, dtype: str) -> bool:
    """`x` a compare read only by its convert to the float `dtype`: the compare's
    instruction writes 1.0 / 0.0 in that type itself (engines cast on write, §2.3),
    no TensorCopy of the bool (one-hot labels: `convert(iota == t)`)."""
    return (x >= n and steps[x - n].kind == "compare" and uses.get(x) == 1
            and x not in outputs and dtype in _ENGINE_FLOATS)


def _narrows(src: str, dst: str) -> bool:
    return hw_dtypes.itemsize(dst) <= hw_dtypes.itemsize(src)


def _retypable(steps, x: int, n: int, uses, outputs) -> bool:
    """`x` a one-instruction float step read only by the convert (a folded
    tensor_scalar too: op by op it keeps its intermediate in `via`, `_retyped`)."""
    if x < n or uses.get(x) != 1 or x in outputs:
        return False
    s = steps[x - n]
    return ir.is_float(s.dtype) and (s.kind in ONE_INSTRUCTION or
                                     s.kind in ("activation", "tensor_scalar"))


def _retyped(step: Step, dtype: str) -> Step:
    """`step` writing `dtype`; a folded tensor_scalar notes the type its intermediate
    had ("via"), which it keeps when a box makes it run op by op (tileops/simple.py)."""
    if step.kind != "tensor_scalar":
        return replace(step, dtype=dtype)
    return replace(step, dtype=dtype, attrs={**step.attrs, "via": step.dtype})


def _readers_take_any(steps, vid: int) -> bool:
    """Every reader of `vid` is one instruction (reads any float type, §2.3-2.4)."""
    readers = [s for s in steps if vid in s.args]
    return bool(readers) and all(
        s.kind in ONE_INSTRUCTION | {"activation", "activation_row", "tensor_scalar",
                                     "scalar_tensor_tensor"}
        for s in readers)


def _folded(step: Step) -> Step:
    return Step("folded", (), step.dtype)
