"""The canonical axes of a matched attention pattern (attention_pattern.py): which dims
of q, k, v, the result, the mask and the bias are the batch axes, the GQA groups, Sq,
Sk, D and Dv, and their strides, following the views (reshapes, transposes, a splat
scale) that lead from the fusion's inputs to the dots and from p @ v to its result.

    build(m, qk, labels, pi, producer, users)   fills m.q, m.k, m.v, m.out, m.axes

GQA as libraries write it needs nothing special: q viewed as [.., K, G, T, H] against k
[.., K, S, H] has K as a batch axis of both dots and G as a second query axis ("group")
that k and v do not have, so the kernel reuses each k / v tile for the whole group.
"""
from __future__ import annotations

from collections import defaultdict

from hlo_passes import ir
from hlo_passes.attention_fold import splat
from hlo_passes.attention_layout import NoMatch, forward_strides, row_major, user_views


def build(m, qk: ir.Op, labels: list, pi: int, producer: dict, users: dict) -> None:
    sides = {s: _side(qk, s) for s in ("lhs", "rhs")}
    nb = len(sides["lhs"][1])
    rest = iter(labels[nb:])
    free = {s: {d: next(rest) for d in sides[s][3]} for s in ("lhs", "rhs")}
    kside = "lhs" if "sk" in free["lhs"].values() else "rhs"
    qside = "rhs" if kside == "lhs" else "lhs"
    if "sk" not in free[kside].values() or \
            any(lab not in (None, "sk") for lab in free[kside].values()) or \
            any(lab is not None and lab[0] != "f" for lab in free[qside].values()) or \
            any(lab is not None and lab[0] != "b" for lab in labels[:nb]):
        raise NoMatch("q @ k^T does not line up with p @ v")
    q, qb, qc, _ = sides[qside]
    k, kb, kc, _ = sides[kside]
    if len(qc) != 1:
        raise NoMatch("q @ k^T contracts more than one dim")
    st, size = defaultdict(dict), {}
    m.q, qs = _input(m, q, producer, users, scalable=True)
    m.k, ks = _input(m, k, producer, users, scalable=True)
    for i, lab in enumerate(labels[:nb]):
        if lab is not None:
            st[lab].update(q=qs[qb[i]], k=ks[kb[i]])
            size[lab] = qk.result.shape[i]
    for d, lab in free[qside].items():
        if lab is not None:
            st[lab]["q"], size[lab] = qs[d], q.shape[d]
    sk = next(d for d, lab in free[kside].items() if lab == "sk")
    st["sk"]["k"], size["sk"] = ks[sk], k.shape[sk]
    st["d"].update(q=qs[qc[0]], k=ks[kc[0]])
    size["d"] = q.shape[qc[0]]
    _pv(m, pi, st, size, producer, users)
    for name, column in (("mask", "mask"), ("bias", "bias"), ("dropout", "drop")):
        value = getattr(m, name)
        if value is not None:
            for lab, s, n in zip(getattr(m, f"{name}_labels"), row_major(value.shape),
                                 value.shape):
                if lab is not None and n != 1:
                    st[lab][column] = s
    m.axes, m.axis_labels = _roles(st, size)


def _side(dot: ir.Op, side: str):
    operand = dot.operands[0 if side == "lhs" else 1]
    b = tuple(dot.attrs.get(f"{side}_batching_dimensions", ()))
    c = tuple(dot.attrs.get(f"{side}_contracting_dimensions", ()))
    return operand, b, c, [d for d in range(operand.type.rank) if d not in b + c]


def _pv(m, pi: int, st, size, producer, users) -> None:
    """Strides of v and of the result (through the views after p @ v)."""
    pside, vside = ("lhs", "rhs") if pi == 0 else ("rhs", "lhs")
    _, pb, _, pfree = _side(m.pv, pside)
    v, vb, vc, vfree = _side(m.pv, vside)
    dv = [d for d in vfree if v.shape[d] != 1]
    if len(dv) != 1:
        raise NoMatch("v has no single head dim")
    m.v, vs = _input(m, v, producer, users, scalable=False)
    outs = _output(m, users)
    nb = len(pb)
    pos = {("f", d): nb + i for i, d in enumerate(pfree)} if pi == 0 else \
        {("f", d): nb + len(vfree) + i for i, d in enumerate(pfree)}
    vpos = nb + (len(pfree) if pi == 0 else 0) + vfree.index(dv[0])
    for j, d in enumerate(vb):
        if v.shape[d] != 1:
            if ("b", j) not in st:
                raise NoMatch("v has a batch dim that q @ k^T has not")
            st[("b", j)].update(v=vs[d], out=outs[j])
    for lab, at in pos.items():
        if lab in st:
            st[lab]["out"] = outs[at]
    st["sk"]["v"] = vs[vc[0]]
    st["dv"].update(v=vs[dv[0]], out=outs[vpos])
    size["dv"] = v.shape[dv[0]]


def _roles(st: dict, size: dict) -> tuple[list, list]:
    """([(role, size, strides)], [label]): ("b", j) batch axes in order; of the query
    axes ("f", i) the longest is Sq (the last of equals), the others GQA groups."""
    queries = sorted((lab for lab in st if isinstance(lab, tuple) and lab[0] == "f"),
                     key=lambda lab: lab[1])
    if not queries:
        raise NoMatch("no query dim")
    sq = max(reversed(queries), key=lambda lab: size[lab])
    labels = sorted(lab for lab in st if isinstance(lab, tuple) and lab[0] == "b")
    roles = ["batch"] * len(labels) + ["group"] * (len(queries) - 1) + \
        ["sq", "sk", "d", "dv"]
    labels += [lab for lab in queries if lab != sq] + [sq, "sk", "d", "dv"]
    return [(r, size[lab], st[lab]) for r, lab in zip(roles, labels)], labels


def _input(m, v: ir.Value, producer: dict, users: dict, scalable: bool):
    """(root, strides of v's dims in the root's buffer): back through reshapes,
    transposes and (q, k) a splat scale, while each value has no other user."""
    chain = []
    while len(users.get(v, ())) == 1 and producer.get(v) is not None:
        op = producer[v]
        if op.kind in ("transpose", "reshape") or _upcast(op):
            chain.append(op)
            v = op.operands[0]
            continue
        if scalable and op.kind in ("multiply", "divide"):
            a, b = op.operands
            hit = next(((c, x) for c, x in ((b, a), (a, b))[:1 + (op.kind == "multiply")]
                        if splat(c, producer) is not None), None)
            if hit is not None:
                value = splat(hit[0], producer, m)
                m.scale *= value if op.kind == "multiply" else 1.0 / value
                chain.append(op)
                v = hit[1]
                continue
        break
    strides = row_major(v.shape)
    for op in reversed(chain):
        strides = forward_strides(op, strides)
    m.ops.extend(chain)
    return v, strides


def _upcast(op: ir.Op) -> bool:
    """A 16-bit value converted to float32 (the softmax's p @ v in f32): the kernel
    reads the 16-bit value and multiplies in 16 bits."""
    return op.kind == "convert" and op.result.dtype == "float32" and \
        op.operands[0].dtype in ("bfloat16", "float16")


def _output(m, users: dict) -> tuple[int, ...]:
    """Strides of p @ v's dims in the buffer of the last transpose / reshape after it
    (which becomes `m.out`)."""
    m.out, chain, strides = user_views(m.pv, users, ("transpose", "reshape"))
    m.ops.extend(chain)
    return strides
