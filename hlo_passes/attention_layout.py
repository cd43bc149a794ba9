"""Axes of an attention pattern in whatever layout the program wrote it
(attention_pattern.py): labels for the dims of the values between the two dots, and
strides of the fusion's operands and result for the canonical axes the flash kernel
iterates over.

Labels name the dims of the scores / probabilities by what they are, so transposes and
unit-dim reshapes between the dots only move labels around:

    ("b", j)    the j-th batch dim of the p @ v dot (also a batch dim of q @ k^T)
    ("f", i)    the i-th dim of p that p @ v keeps (a query dim: Sq, or a GQA group)
    "sk"        the key dim (contracted by p @ v, reduced by the softmax)
    None        a unit dim (or, for a broadcast side operand, a broadcast one)

Strides are in elements of a row-major buffer: a fusion operand is read in place through
the views (reshapes, transposes) that led from it to the dot, and the result is written
through those that follow p @ v, so no transpose kernel runs before or after.
"""
from __future__ import annotations

import math

from hlo_passes import ir

VIEWS = frozenset({"broadcast_in_dim", "reshape", "transpose", "convert"})
ROLES = ("batch", "group", "sq", "sk", "d", "dv")
OPERANDS = ("q", "k", "v", "out", "mask", "bias")


class NoMatch(Exception):
    """The values do not have the shape of attention; the message says why."""


def row_major(shape) -> tuple[int, ...]:
    out, step = [], 1
    for n in reversed(tuple(shape)):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def reshape_strides(old_shape, old_strides, new_shape) -> tuple[int, ...] | None:
    """Strides that view a buffer of `old_shape` / `old_strides` as `new_shape`
    without a copy, or None (numpy's no-copy reshape rule). Unit dims get stride 0."""
    old = [(n, s) for n, s in zip(old_shape, old_strides) if n != 1]
    new = [n for n in new_shape if n != 1]
    if math.prod(n for n, _ in old) != math.prod(new) or 0 in new:
        return None
    strides, oi = [], 0
    ni = 0
    while ni < len(new):
        oj, nj = oi + 1, ni + 1
        po, pn = old[oi][0], new[ni]
        while po != pn:
            if pn < po:
                pn *= new[nj]
                nj += 1
            else:
                po *= old[oj][0]
                oj += 1
        if any(old[i][1] != old[i + 1][0] * old[i + 1][1] for i in range(oi, oj - 1)):
            return None
        group = [old[oj - 1][1]]
        for n in reversed(new[ni + 1:nj]):
            group.append(group[-1] * n)
        strides.extend(reversed(group))
        oi, ni = oj, nj
    it = iter(strides)
    return tuple(0 if n == 1 else next(it) for n in new_shape)


def view_back(op: ir.Op, labels: list) -> list:
    """Labels of the operand of view `op` (transpose, reshape of unit dims, convert),
    given the labels of its result."""
    if op.kind == "convert":
        return list(labels)
    if op.kind == "transpose":
        out = [None] * len(labels)
        for i, p in enumerate(op.attrs["permutation"]):
            out[p] = labels[i]
        return out
    if op.kind == "reshape":
        kept = [lab for lab, n in zip(labels, op.result.shape) if n != 1]
        sizes = [n for n in op.result.shape if n != 1]
        if [n for n in op.operands[0].shape if n != 1] != sizes:
            raise NoMatch("a reshape that merges or splits dims between the dots")
        it = iter(kept)
        return [None if n == 1 else next(it) for n in op.operands[0].shape]
    raise NoMatch(f"{op.kind} between the dots")


def side_root(v: ir.Value, labels: list, producer: dict) -> tuple[ir.Value, list, list]:
    """(root, its labels, the view ops walked) of a side operand `v` (a mask, a bias,
    a row max or sum) broadcast to labels `labels`: through broadcast_in_dim, reshape,
    transpose and convert. Broadcast dims of the root get None."""
    ops = []
    op = producer.get(v)
    while op is not None and op.kind in VIEWS:
        if op.kind == "broadcast_in_dim":
            src = op.operands[0].shape
            labels = [labels[d] if src[i] == op.result.shape[d] else None
                      for i, d in enumerate(op.attrs["broadcast_dimensions"])]
        elif op.kind == "reshape" and not _unit_reshape(op):
            break
        else:
            labels = view_back(op, labels)
        ops.append(op)
        v = op.operands[0]
        op = producer.get(v)
    return v, labels, ops


def _unit_reshape(op: ir.Op) -> bool:
    drop = lambda s: [n for n in s if n != 1]  # noqa: E731
    return drop(op.operands[0].shape) == drop(op.result.shape)


def forward_strides(op: ir.Op, strides) -> tuple[int, ...]:
    """The strides of view `op`'s result given those of its operand (in the same
    buffer), or NoMatch."""
    if op.kind in ("convert", "multiply", "divide"):
        return tuple(strides)
    if op.kind == "transpose":
        return tuple(strides[p] for p in op.attrs["permutation"])
    out = reshape_strides(op.operands[0].shape, strides, op.result.shape)
    if out is None:
        raise NoMatch("a reshape that cannot be read in place")
    return out


def backward_strides(op: ir.Op, strides) -> tuple[int, ...]:
    """The strides of view `op`'s operand given those of its result, or NoMatch."""
    if op.kind == "transpose":
        out = [0] * len(strides)
        for i, p in enumerate(op.attrs["permutation"]):
            out[p] = strides[i]
        return tuple(out)
    out = reshape_strides(op.result.shape, strides, op.operands[0].shape)
    if out is None:
        raise NoMatch("a reshape of the output that cannot be written in place")
    return out


def user_views(op: ir.Op, users: dict, kinds) -> tuple[ir.Op, list, tuple[int, ...]]:
    """(last op, the views of `kinds` after `op`, each the only user of the one
    before, strides of `op`'s result dims in the last one's buffer; converts move no
    dims). The chain is cut back to the longest prefix whose strides follow."""
    chain, v = [], op.result
    while True:
        us = users.get(v, ())
        if len(us) != 1 or us[0].kind not in kinds:
            break
        chain.append(us[0])
        v = us[0].result
    while True:
        try:
            strides = row_major(v.shape)
            for c in reversed(chain):
                if c.kind != "convert":
                    strides = backward_strides(c, strides)
            return (chain[-1] if chain else op), chain, strides
        except NoMatch:
            chain.pop()
            v = chain[-1].result if chain else op.result


def strides_by_label(labels: list, strides) -> dict:
    """{label: stride} of the labelled dims."""
    return {lab: s for lab, s in zip(labels, strides) if lab is not None}


def layout(axes: list[tuple[str, int, dict]], operands: tuple = OPERANDS) -> tuple:
    """The fusion's `attention_layout` attribute: one (role, size, strides) per axis,
    strides in the order of `operands` (OPERANDS, + "mask_k" for a mask given as row
    and column vectors; 0 where an operand has no such axis, or is broadcast along it),
    roles in ROLES order (batch axes outermost first)."""
    axes = sorted(axes, key=lambda a: ROLES.index(a[0]))
    return tuple((role, size, tuple(int(s.get(o, 0)) for o in operands))
                 for role, size, s in axes)
