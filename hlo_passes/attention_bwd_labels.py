"""Labels and strides for the backward's dots of a matched attention
(attention_bwd_pattern.py), in whatever layout the program wrote them.

`jax.grad` writes dq, dk, dv, dp as dot_generals whose batch and free dims sit wherever
the forward's layout put them (jax.nn.dot_product_attention: [B, T, N, H] operands, 5-D
unit group dims, transposes after the dots). Each dim is named by the forward's labels
(attention_layout.py: ("b", j) batch, ("f", i) query dims, "sk", "d", "dv"):

    q, k, v views    by their strides in the forward's q / k / v buffer (attention_axes)
    p                as attention_pattern labels p @ v's operand
    do               by pairing its dims with v's (the dp dot) and p's (the dv dot)
    ds'              by pairing with k's (dq contracts Sk) and q's (dk contracts Sq)
    dot results      batch dims, then the lhs's free dims, then the rhs's

and each output is written through the views after its dot (transposes, reshapes,
converts), so the kernel writes dq / dk / dv in the program's layout.
"""
from __future__ import annotations

from hlo_passes import ir
from hlo_passes.attention_layout import NoMatch as _LayoutMiss
from hlo_passes.attention_layout import forward_strides, row_major, user_views

VIEWS = frozenset({"transpose", "reshape", "convert"})


class NoMatch(Exception):
    """Not the joint graph; the message says why (a fusion decision's reason)."""


def sides(op: ir.Op, i: int) -> tuple[tuple, tuple, list]:
    """(batch dims, contracting dims, free dims) of operand `i` of dot `op`."""
    side = ("lhs", "rhs")[i]
    b = tuple(op.attrs.get(f"{side}_batching_dimensions", ()))
    c = tuple(op.attrs.get(f"{side}_contracting_dimensions", ()))
    rank = op.operands[i].type.rank
    return b, c, [d for d in range(rank) if d not in b + c]


def result_labels(op: ir.Op, lhs: list, rhs: list) -> list:
    """Labels of dot `op`'s result given its operands' labels."""
    b0, _, f0 = sides(op, 0)
    _, _, f1 = sides(op, 1)
    return [lhs[d] for d in b0] + [lhs[d] for d in f0] + [rhs[d] for d in f1]


def pair(op: ir.Op, known: int, labels: list, other: list) -> None:
    """Labels the other operand's batch and contracting dims of dot `op` (list `other`,
    None where unknown) from operand `known`'s labels; a clash is a NoMatch."""
    kb, kc, _ = sides(op, known)
    ob, oc, _ = sides(op, 1 - known)
    for a, b in zip(kb + kc, ob + oc):
        merge(other, b, labels[a])


def merge(labels: list, d: int, lab) -> None:
    if lab is None:
        return
    if labels[d] is not None and labels[d] != lab:
        raise NoMatch("the backward's dots do not line up with the forward's dims")
    labels[d] = lab


def view_chain(v: ir.Value, stop: ir.Value | None, producer: dict) -> tuple:
    """(root, view ops, strides of `v`'s dims in the root's buffer) for `v` a view
    (transposes, reshapes, converts) of `stop` (the root); with `stop` None, the deepest value
    reached through transposes and reshapes whose buffer `v` reads in place."""
    chain, root = [], v
    while root is not stop:
        op = producer.get(root)
        kinds = VIEWS if stop is not None else ("transpose", "reshape")
        if op is None or op.kind not in kinds:
            if stop is None:
                break
            raise NoMatch("a backward dot reads q, k or v through more than views")
        chain.append(op)
        root = op.operands[0]
    while True:
        try:
            strides = row_major(root.shape)
            for op in reversed(chain):
                strides = forward_strides(op, strides)
            return root, chain, strides
        except _LayoutMiss:
            if stop is not None or not chain:
                raise NoMatch("a backward dot's operand cannot be read in place")
            root = chain.pop().result


def by_stride(v: ir.Value, strides, table: dict) -> list:
    """Labels of `v`'s dims from {(stride, size): label} (None for unit dims)."""
    out = []
    for n, s in zip(v.shape, strides):
        if n == 1:
            out.append(None)
        elif (s, n) in table:
            out.append(table[(s, n)])
        else:
            raise NoMatch("a backward dot reads a dim the forward's does not")
    return out


def operand_table(f, name: str) -> dict:
    """{(stride, size): label} of the forward's operand `name` ("q", "k", "v")."""
    return {(st[name], n): lab for (_, n, st), lab in zip(f.axes, f.axis_labels)
            if name in st and n != 1}


def output_chain(op: ir.Op, users: dict) -> tuple[ir.Op, list, tuple]:
    """(last op, views after `op`, strides of `op`'s result dims in the last one's
    buffer): transposes, reshapes and converts with one user each."""
    return user_views(op, users, VIEWS)


def strides_of(labels: list, strides, want: set, what: str) -> dict:
    """{label: stride} of an operand or output whose dims carry `labels`; every label
    of `want` exactly once."""
    got = {lab: s for lab, s in zip(labels, strides) if lab is not None}
    if len(got) != sum(lab is not None for lab in labels) or set(got) != want:
        raise NoMatch(f"{what}'s dims are not the forward's")
    return got
