"""Replaces each attention pattern (hlo_passes/attention_pattern.py) the policy allows by
one `fusion` op of kind "attention":

    %mask = constant(...)                # when the mask folds at compile time
    %o = fusion(%q, %k, %v[, %mask][, %bias][, %drop]) {fusion_kind="attention",
            attention_scale=0.125, attention_mask=True, attention_bias=False,
            attention_fill=-inf, attention_layout=(("batch", 8, (strides...)), ...),
            [attention_dropout=1.111,] decisions=("attention: ...",)}
      ^bb(%a0, %a1, %a2[, %a3][, %a4][, %a5]):  # the pattern's ops, cloned; constants in
        ...
        return(%out)

q, k, v are the values before the views that led to the dots (read in place), %o the
value after those that follow p @ v; `attention_layout` gives the canonical axes and
each operand's strides (attention_layout.layout; with a dropout, the columns
OPERANDS + ("mask_k", "drop")). A dropout on the probabilities (flax's p * keep /
keep_prob, select(keep, p / keep_prob, 0)) is operand %drop, the multiplier (or the
boolean keep, times `attention_dropout`). A folded mask that does not vary
along the batch / group axes is stored with those dims of size 1 (the region
broadcasts it back).

`FusionPolicy.attention(...)` decides (hlo_passes/fusion_policy.py; `attention=False`
forbids them all). Runs before the fusion pass, which then never sees the pattern's ops.
Views and converts of the pattern that other ops also use (a mask or scale broadcast
shared by two layers) stay in place, as do those left without users whose operands
remain (the fusion pass counts them as users, as it always has; the pipeline's `dce`
removes them); those of removed values go with the pattern.
"""
from __future__ import annotations

import numpy as np

from hlo_passes import attention_layout as layout
from hlo_passes import attention_pattern as pattern
from hlo_passes import ir
from hlo_passes.fusion_policy import FusionDecision, FusionPolicy
from hlo_passes.graph import BlockGraph, clone, control_blocks, free_values, used_values
from hlo_passes.attention_outer import OUTER_NOTE, OuterMask, outer_mask

name = "attention-fusion"


class AttentionFusion:
    """The pass, configurable with a `FusionPolicy` (the one the fusion pass uses)."""

    name = name

    def __init__(self, policy: FusionPolicy | None = None):
        self.policy = policy or FusionPolicy()

    def run(self, module: ir.Module) -> bool:
        changed = False
        for fn in module.functions.values():
            for block in control_blocks(fn.body):
                changed |= _fuse_block(block, self.policy)
        return changed


def run(module: ir.Module) -> bool:
    return AttentionFusion().run(module)


def _fuse_block(block: ir.Block, policy: FusionPolicy) -> bool:
    """Each allowed attention pattern of `block` as one fusion op."""
    graph = BlockGraph(block)
    replaced: dict[ir.Op, list[ir.Op]] = {}     # pattern output -> [mask constant,] fusion
    members: set[ir.Op] = set()                 # ops that go with their pattern
    near: list = []
    for m in pattern.find(block, graph.producer, graph.users, near):
        mask_value = _folded_mask(m, graph.producer)
        # the policy names the scores by the shape of `out`'s first operand: p's
        decision = policy.attention(m.probs, m.scale, m.mask is not None, mask_value)
        if decision.ok:
            # with a dropout, l comes from the undropped P: no outer mask's column sums
            outer = outer_mask(m, graph.producer) \
                if mask_value is None and m.dropout is None else None
            replaced[m.out] = _attention_op(m, mask_value, decision, graph, outer)
            members.update(op for op in m.ops if op.kind not in pattern.SHAREABLE)
        else:
            near.append((m.pv, decision.reason))
    for dot, reason in near:
        _record(dot, reason)
    if replaced:
        _rewrite(block, replaced, members)
    return bool(replaced)


def _record(dot: ir.Op, reason: str) -> None:
    """A near miss's reason on its p @ v dot (`decisions`, as fusions carry them): the
    dot's kernel notes show it (lower/dot.py), so the profiler does."""
    dot.attrs["decisions"] = (f"attention: not fused: {reason}",)


def _rewrite(block: ir.Block, replaced: dict[ir.Op, list[ir.Op]],
             members: set[ir.Op]) -> None:
    """Each pattern output replaced by its fusion, the members dropped."""
    ops, mapping = [], {}
    for op in block.ops:
        if op in replaced:
            ops.extend(replaced[op])
            mapping[op.result] = replaced[op][-1].result
        elif op not in members:
            ops.append(op)
    block.ops = ops
    block.replace_all_uses(mapping)
    block.ops = _without_dangling(ops, {v for op in members for v in op.results})


def _without_dangling(ops: list[ir.Op], gone: set[ir.Value]) -> list[ir.Op]:
    """`ops` but those that use a value of a removed op (views and converts of the
    pattern's inner values that only the pattern used), transitively: they are dead, and
    would use undefined values. Nothing the fusion pass looks at uses them."""
    kept = []
    for op in ops:
        if any(v in gone for v in used_values(op)):
            gone.update(op.results)
        else:
            kept.append(op)
    return kept


def _block_args(inputs: list[ir.Value], vmap: dict) -> list[ir.Value]:
    """One block argument per fusion operand. An operand repeated (self-attention with
    q = k = v = x, as `dot_product_attention(x, x, x)`) gets its mapped argument at its
    first position and a fresh, unused one at the others (was: one value defined as
    three arguments, which the verifier refused)."""
    seen: set = set()
    args = []
    for v in inputs:
        args.append(vmap[v] if v not in seen else ir.Value(v.type))
        seen.add(v)
    return args


def _attention_op(m: pattern.Match, mask_value, decision: FusionDecision,
                  graph: BlockGraph, outer: "OuterMask | None" = None) -> list[ir.Op]:
    """[mask constant,] fusion: the pattern's ops cloned into an isolated region whose
    inputs are q, k, v [and the mask, or its row and column vectors]; constants it
    uses are cloned in."""
    pre, inputs = _inputs(m, mask_value, outer)
    vmap = {v: ir.Value(v.type) for v in inputs}
    body: list[ir.Op] = []
    if m.bias is not None:
        vmap[m.bias] = vmap[inputs[-1 - (m.dropout is not None)]]
    if m.dropout is not None:
        vmap[m.dropout] = vmap[inputs[-1]]
    if outer is not None:                   # the mask computed in the region
        for op in sorted(set(outer.ops), key=lambda o: graph.index[o]):
            body.append(clone(op, vmap))
    elif m.mask is not None:
        mask_arg = vmap[inputs[3]]
        if mask_arg.type != m.mask.type:
            bcast = ir.Op("broadcast_in_dim", [mask_arg], [ir.Value(m.mask.type)],
                          {"broadcast_dimensions": tuple(range(m.mask.type.rank))},
                          loc=m.out.loc)
            body.append(bcast)
            mask_arg = bcast.result
        vmap[m.mask] = mask_arg
    inside = {v for op in m.ops for v in op.results}
    for op in sorted(set(m.ops), key=lambda o: graph.index[o]):
        for v in free_values(op, inside):
            _clone_constant(v, graph, vmap, body)
        body.append(clone(op, vmap))
    body.append(ir.Op("return", [vmap[m.out.result]], [], loc=m.out.loc))
    args = _block_args(inputs, vmap)
    reason = decision.reason if outer is None else decision.reason + OUTER_NOTE
    if m.dropout is not None:
        reason += (f"; dropout: P * {m.dropout.type}" + (
            f" * {m.dropout_scale:.6g}" if m.dropout_scale != 1.0 else "") +
            " per tile after its row sums (read per job, as a runtime mask)")
    attrs = {"fusion_kind": "attention", "decisions": (reason,),
             "attention_scale": m.scale, "attention_mask": m.mask is not None,
             "attention_bias": m.bias is not None, "attention_fill": float(m.fill),
             "attention_layout": _layout(m, inputs, outer)}
    if m.dropout is not None:
        attrs["attention_dropout"] = float(m.dropout_scale)
    if outer is not None:
        attrs["attention_mask_outer"] = True
    fusion = ir.Op("fusion", inputs, [ir.Value(m.out.result.type)], attrs,
                   [ir.Region([ir.Block(args, body)])], loc=m.out.loc, name=m.out.name)
    return pre + [fusion]


def _inputs(m: pattern.Match, mask_value,
            outer: "OuterMask | None" = None) -> tuple[list[ir.Op], list[ir.Value]]:
    """([the folded mask's constant op], [q, k, v, mask (or its rows, its columns),
    bias]) of the fusion."""
    pre, inputs = [], [m.q, m.k, m.v]
    if outer is not None:
        inputs += [outer.rows, outer.cols]
    elif m.mask is not None:
        mask = m.mask
        if mask_value is not None:
            mtype = ir.TensorType(tuple(mask_value.shape), "bool")
            const = ir.Op("constant", [], [ir.Value(mtype)], {"value": mask_value},
                          loc=m.out.loc, name=m.out.name)
            pre.append(const)
            mask = const.result
        inputs.append(mask)
    if m.bias is not None:
        inputs.append(m.bias)
    if m.dropout is not None:
        inputs.append(m.dropout)
    return pre, inputs


def _folded_mask(m: pattern.Match, producer: dict):
    """The mask's value if it folds, without the batch / group dims it does not vary
    along (kept as size 1), else None."""
    if m.mask is None:
        return None
    value = pattern.fold(m.mask, producer)
    if value is None:
        return None
    roles = dict(zip(m.axis_labels, (role for role, _, _ in m.axes)))
    for i, lab in enumerate(m.mask_labels):
        first = value.take([0], axis=i)
        if roles.get(lab) in ("batch", "group") and (value == first).all():
            value = first
    return np.ascontiguousarray(value)


def _layout(m: pattern.Match, inputs: list[ir.Value],
            outer: "OuterMask | None" = None) -> tuple:
    """The `attention_layout` attribute, the mask's strides those of the operand (of an
    outer mask: "mask" those of its row vector, "mask_k" those of its column vector)."""
    axes = [(role, size, dict(s)) for role, size, s in m.axes]
    if m.dropout is not None:       # its strides after the outer mask's column (zeros)
        if m.mask is not None:
            _side_strides(m, axes, "mask", m.mask_labels, inputs[3].type.shape)
        return layout.layout(axes, layout.OPERANDS + ("mask_k", "drop"))
    if outer is not None:
        _side_strides(m, axes, "mask", outer.row_labels, outer.rows.type.shape)
        _side_strides(m, axes, "mask_k", outer.col_labels, outer.cols.type.shape)
        return layout.layout(axes, layout.OPERANDS + ("mask_k",))
    if m.mask is not None:
        _side_strides(m, axes, "mask", m.mask_labels, inputs[3].type.shape)
    return layout.layout(axes)


def _side_strides(m: pattern.Match, axes: list, key: str, labels: list, shape) -> None:
    """Strides `key` of a side operand of `shape` whose dims have `labels`: those of
    its row-major buffer along the axes it does not broadcast."""
    strides = dict(zip(labels, layout.row_major(shape)))
    sizes = dict(zip(labels, shape))
    for (_, _, s), lab in zip(axes, m.axis_labels):
        s.pop(key, None)
        if sizes.get(lab, 1) != 1:
            s[key] = strides[lab]


def _clone_constant(v: ir.Value, graph: BlockGraph, vmap: dict, body: list) -> None:
    """Clones the constant (through converts / broadcasts) computing `v` into `body`."""
    if v in vmap:
        return
    op = graph.producer.get(v)
    if op is None or op.kind not in pattern.FOLDABLE or op.regions:
        raise AssertionError(f"attention region uses %{v.name}, not a constant")
    for u in op.operands:
        _clone_constant(u, graph, vmap, body)
    body.append(clone(op, vmap))
