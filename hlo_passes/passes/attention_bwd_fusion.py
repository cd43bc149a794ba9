"""Replaces each joint forward + backward attention graph (hlo_passes/
attention_bwd_pattern.py) by two fusions, so no [Sq, Sk] tensor reaches memory:

    %o, %lse = fusion(%q, %k, %v[, %mask][, %bias]) {fusion_kind="attention", ...}
        the forward (attention_fusion.py's, in the program's layout), which also returns
        the rows' logsumexp (f32, one row per batch x group x Sq): its region is the
        forward's ops plus lse = rowmax + log(rowsum)
    %dq, %dk, %dv = fusion(%q, %k, %v, %o, %lse, %do[, %mask][, %bias][, %drop])
                      {fusion_kind="attention_bwd", attention_scale=.., attention_mask=..,
                       attention_layout=(the forward's + do, dq, dk, dv strides)}
        the backward, lowered as one flash backward kernel (jax_trn/lower/attention_bwd.py);
        its region recomputes the forward's values from q, k (o and lse unused) and holds
        the backward's ops, for a backend that runs the ops one by one

Runs before attention-fusion (which then finds only forward-only attentions). A graph
whose forward matches and whose p is also read elsewhere, but whose backward is not the
pattern, gets a decision "attention-bwd: not fused: <why>" in
`module.attrs["attention_bwd_decisions"]`; so do graphs the policy forbids.
"""
from __future__ import annotations

import numpy as np

from hlo_passes import attention_bwd_pattern as pattern
from hlo_passes import attention_layout as layout
from hlo_passes import attention_pattern as fwd_pattern
from hlo_passes import ir
from hlo_passes.fusion_policy import FusionPolicy
from hlo_passes.graph import BlockGraph, clone, control_blocks, free_values
from hlo_passes.passes.attention_fusion import (_attention_op, _clone_constant,
                                                _folded_mask, _without_dangling)

name = "attention-bwd-fusion"
DECISIONS = "attention_bwd_decisions"


class AttentionBwdFusion:
    """The pass, with the `FusionPolicy` the other fusion passes use."""

    name = name

    def __init__(self, policy: FusionPolicy | None = None):
        self.policy = policy or FusionPolicy()

    def run(self, module: ir.Module) -> bool:
        changed, notes = False, []
        for fn in module.functions.values():
            for block in control_blocks(fn.body):
                changed |= _fuse_block(block, self.policy, notes)
        if notes:
            module.attrs[DECISIONS] = tuple(module.attrs.get(DECISIONS, ())) + tuple(notes)
        return changed


def run(module: ir.Module) -> bool:
    return AttentionBwdFusion().run(module)


def _fuse_block(block: ir.Block, policy: FusionPolicy, notes: list[str]) -> bool:
    graph = BlockGraph(block)
    used: set[ir.Op] = set()
    plans = []
    for m in pattern.candidates(block, graph.producer, graph.users):
        f = m.fwd
        try:
            p = pattern.probs(f, graph.producer)
        except pattern.NoMatch:
            continue
        if not [u for u in graph.users.get(p, ()) if u is not f.pv]:
            continue                    # a forward only: attention-fusion's
        where = f" at {f.out.loc}" if f.out.loc else ""
        mask_value = _folded_mask(f, graph.producer)
        if _masks_a_whole_row(f, mask_value):
            notes.append(f"attention-bwd: not fused{where}: the compile-time mask leaves a "
                         "query row no key (its softmax is uniform and its gradient masked "
                         "out; the flash backward takes no such row)")
            continue
        try:
            pattern.complete(m, graph.producer, graph.users)
            _check_order(m, graph)
        except pattern.NoMatch as e:
            notes.append(f"attention-bwd: not fused{where}: {e}")
            continue
        members = set(f.ops) | set(m.ops)
        if any(op.kind not in fwd_pattern.SHAREABLE and op not in m.mask_ops
               for op in members & used):
            notes.append(f"attention-bwd: not fused{where}: overlaps another attention")
            continue
        decision = policy.attention(f.probs, f.scale, f.mask is not None, mask_value)
        if not decision.ok:
            notes.append(f"attention-bwd: not fused{where}: {decision.reason}")
            continue
        used |= members
        plans.append((m, mask_value, decision))
    if plans:
        _rewrite(block, graph, plans)
    return bool(plans)


def _masks_a_whole_row(f, mask_value) -> bool:
    """Whether a compile-time boolean mask leaves some query row with no key
    (jax_trn/lower/attention_bwd.py refuses such a row)."""
    if mask_value is None or np.asarray(mask_value).dtype != bool:
        return False
    keep = np.asarray(mask_value)
    labels = list(f.mask_labels)
    if "sk" in labels:
        keep = keep.any(axis=labels.index("sk"))
    return not keep.all()


def _check_order(m: pattern.BwdMatch, graph: BlockGraph) -> None:
    """The backward fusion goes where its first output was computed: do must be
    computed before, and (o live) the forward's p @ v too."""
    first = min(graph.index[op] for op in (m.dq, m.dk, m.dv))
    do = graph.producer.get(m.do)
    if do is not None and graph.index[do] >= first:
        raise pattern.NoMatch("do is computed after the first gradient")
    if m.o_live and graph.index[m.fwd.out] >= first:
        raise pattern.NoMatch("the forward's p @ v comes after the first gradient")


def _rewrite(block: ir.Block, graph: BlockGraph, plans) -> None:
    at: dict[ir.Op, list[ir.Op]] = {}       # original op -> the ops that go before it
    mapping: dict[ir.Value, ir.Value] = {}
    members: set[ir.Op] = set()
    for m, mask_value, decision in plans:
        *pre, fwd = _fwd_fusion(m, mask_value, decision, graph)
        o, lse = fwd.results
        bwd = _bwd_fusion(m, fwd, decision.reason, graph)
        first = min((m.dq, m.dk, m.dv), key=lambda op: graph.index[op])
        if m.o_live:
            at.setdefault(m.fwd.out, []).extend(pre + [fwd])
            mapping[m.fwd.out.result] = o
            at.setdefault(first, []).append(bwd)
        else:
            at.setdefault(first, []).extend(pre + [fwd, bwd])
        mapping.update(zip(m.outputs, bwd.results))
        members.update(op for op in (*m.fwd.ops, *m.ops)
                       if op.kind not in fwd_pattern.SHAREABLE and op not in m.mask_ops)
    ops = []
    for op in block.ops:
        ops.extend(at.get(op, ()))
        if op not in members:
            ops.append(op)
    block.ops = ops
    block.replace_all_uses(mapping)
    block.ops = _without_dangling(ops, {v for op in members for v in op.results})


def _region(ops, inputs: list[ir.Value], f: fwd_pattern.Match, graph: BlockGraph,
            extra_args=()) -> tuple[list[ir.Value], dict, list[ir.Op]]:
    """(block args, vmap, body): `ops` cloned in program order over fresh arguments
    for `inputs` (q, k, v[, mask]: the forward fusion's operands; a folded mask stored
    without its batch dims is broadcast back to the forward's mask)."""
    args = [ir.Value(v.type) for v in inputs]
    vmap = dict(zip((f.q, f.k, f.v), args[:3]))
    body: list[ir.Op] = []
    if f.mask is not None:
        mask = args[3]
        if mask.type != f.mask.type:
            body.append(ir.Op("broadcast_in_dim", [mask], [ir.Value(f.mask.type)],
                              {"broadcast_dimensions": tuple(range(f.mask.type.rank))},
                              loc=f.out.loc))
            mask = body[-1].result
        vmap[f.mask] = mask
    at = 3 + (f.mask is not None)           # inputs: q, k, v[, mask][, bias][, drop]
    if f.bias is not None:
        vmap[f.bias] = args[at]
    if f.dropout is not None:
        vmap[f.dropout] = args[at + (f.bias is not None)]
    ea = [ir.Value(v.type) for v in extra_args]
    vmap.update(zip(extra_args, ea))
    inside = {v for op in ops for v in op.results}
    order = {op: graph.index.get(op, len(graph.index)) for op in ops}
    for op in sorted(set(ops), key=order.__getitem__):
        for v in free_values(op, inside):
            if v not in vmap:
                _clone_constant(v, graph, vmap, body)
        body.append(clone(op, vmap))
    block_args = args[:3] + ea + args[3:]
    return block_args, vmap, body


def _fwd_fusion(m: pattern.BwdMatch, mask_value, decision, graph: BlockGraph) -> list:
    """[mask constant,] the forward fusion (attention_fusion.py's, in the program's
    layout), its region also returning the rows' logsumexp rowmax + log(rowsum), f32."""
    f = m.fwd
    if not m.o_live:        # the stand-in p @ v (attention_bwd_pattern._dead_o) goes last
        graph.index.setdefault(f.pv, len(graph.index))
    *pre, fusion = _attention_op(f, mask_value, decision, graph)
    body = fusion.regions[0].block.ops
    ret = body.pop()
    reds = [next(op for op in body if op.kind == "reduce" and
                 op.regions[0].block.ops[0].kind == kind) for kind in ("maximum", "add")]
    stats = [op.result for op in reds]
    if stats[0].type.shape != stats[1].type.shape:
        body.append(_max_like_sum(body, reds))
        stats[0] = body[-1].result
    rtype = ir.TensorType(stats[1].type.shape, "float32")
    for i, v in enumerate(stats):           # a 16-bit softmax: statistics in f32
        if v.dtype != "float32":
            body.append(ir.Op("convert", [v], [ir.Value(rtype)], loc=f.out.loc))
            stats[i] = body[-1].result
    log = ir.Op("log", [stats[1]], [ir.Value(rtype)], loc=f.out.loc)
    lse = ir.Op("add", [stats[0], log.result], [ir.Value(rtype)], loc=f.out.loc)
    body += [log, lse, ir.Op("return", ret.operands + [lse.result], [], loc=f.out.loc)]
    fusion.results.append(ir.Value(rtype))
    fusion.attrs["decisions"] = (fusion.attrs["decisions"][0] + "; writes row logsumexp",)
    return pre + [fusion]


def _max_like_sum(body: list[ir.Op], reds: list[ir.Op]) -> ir.Op:
    """The row max in the layout of the row sum (XLA may reduce the max before a
    transpose, the sum after): the max's broadcast that exp subtracts, reduced over
    the sum's key dim (an [Sq, Sk] pass, in the region only: the kernel has its own)."""
    exp = next(op for op in body if op.kind == "exponential")
    sub = next(op for op in body if exp.operands[0] in op.results)
    vmap = {reds[0].operands[0]: sub.operands[1]}
    red = clone(reds[0], vmap)
    red.attrs["dimensions"] = reds[1].attrs["dimensions"]
    red.results[0] = ir.Value(ir.TensorType(reds[1].result.type.shape,
                                            reds[0].result.dtype))
    return red


def _bwd_fusion(m: pattern.BwdMatch, fwd: ir.Op, reason: str, graph: BlockGraph) -> ir.Op:
    f, inputs = m.fwd, fwd.operands
    o, lse = fwd.results
    ops = [op for op in f.ops if op is not f.out] + m.ops
    extra = [o, lse, m.do]
    args, vmap, body = _region(ops, inputs, f, graph, extra)
    body.append(ir.Op("return", [vmap[v] for v in m.outputs], [], loc=m.dq.loc))
    ins = list(inputs[:3]) + extra + list(inputs[3:])
    attrs = {"fusion_kind": "attention_bwd",
             "decisions": ("attention-bwd: dq, dk, dv by a flash backward (p recomputed "
                           "per tile from q, k and lse; " + reason + ")" +
                           ("; dropout: dV from the dropped P, dP times its block"
                            if f.dropout is not None else ""),),
             "attention_scale": f.scale, "attention_mask": f.mask is not None,
             "attention_layout": bwd_layout(m, fwd.attrs["attention_layout"])}
    if f.dropout is not None:
        attrs["attention_dropout"] = float(f.dropout_scale)
    return ir.Op("fusion", ins, [ir.Value(v.type) for v in m.outputs], attrs,
                 [ir.Region([ir.Block(args, body)])], loc=m.dq.loc, name=m.dq.name)


BWD_OPERANDS = ("do", "dq", "dk", "dv")   # after attention_layout.OPERANDS (o is "out")


def bwd_layout(m: pattern.BwdMatch, fwd_layout: tuple) -> tuple:
    """The backward fusion's `attention_layout`: the forward fusion's (q, k, v, o, mask,
    bias strides per axis) with the strides of do, dq, dk, dv appended (0 where one
    has no such axis), then a dropout's (the forward's "drop" column), axes in the
    forward's order."""
    f = m.fwd
    order = sorted(zip(f.axes, f.axis_labels), key=lambda a: layout.ROLES.index(a[0][0]))
    out = []
    n = len(layout.OPERANDS)
    for (role, size, strides), (_, lab) in zip(fwd_layout, order):
        extra = tuple(int(m.strides[name].get(lab, 0)) for name in BWD_OPERANDS)
        drop = tuple(strides[n + 1:n + 2])          # after "mask_k"
        out.append((role, size, tuple(strides[:n]) + extra + drop))
    return tuple(out)
