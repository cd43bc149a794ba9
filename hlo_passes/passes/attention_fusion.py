"""Replaces each attention pattern (hlo_passes/attention_pattern.py) the policy allows by
one `fusion` op of kind "attention":

    %mask = constant(...)                # when the mask folds at compile time
    %o = fusion(%q, %k, %v[, %mask]) {fusion_kind="attention", attention_scale=0.125,
                                      attention_mask=True, decisions=("attention: ...",)}
      ^bb(%a0, %a1, %a2[, %a3]):         # the pattern's ops, cloned; constants cloned in
        ...
        return(%out)

`FusionPolicy.attention(...)` decides (hlo_passes/fusion_policy.py; `attention=False`
forbids them all). Runs before the fusion pass, which then never sees the pattern's ops.
Views and converts of the pattern that other ops also use (a mask or scale broadcast
shared by two layers) stay in place, as do those left without users whose operands
remain (the fusion pass counts them as users, as it always has; the pipeline's `dce`
removes them); those of removed values go with the pattern.
"""
from __future__ import annotations

from hlo_passes import attention_pattern as pattern
from hlo_passes import ir
from hlo_passes.fusion_policy import FusionDecision, FusionPolicy
from hlo_passes.graph import BlockGraph, clone, control_blocks, free_values, used_values

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
    for m in pattern.find(block, graph.producer, graph.users):
        mask_value = pattern.fold(m.mask, graph.producer) if m.mask is not None else None
        decision = policy.attention(m.out, m.scale, m.mask is not None, mask_value)
        if decision.ok:
            replaced[m.out] = _attention_op(m, mask_value, decision, graph)
            members.update(op for op in m.ops if op.kind not in pattern.SHAREABLE)
    if replaced:
        _rewrite(block, replaced, members)
    return bool(replaced)


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


def _attention_op(m: pattern.Match, mask_value, decision: FusionDecision,
                  graph: BlockGraph) -> list[ir.Op]:
    """[mask constant,] fusion: the pattern's ops cloned into an isolated region whose
    inputs are q, k, v [and the mask]; constants it uses are cloned in."""
    pre, inputs = _inputs(m, mask_value)
    vmap = {v: ir.Value(v.type) for v in inputs}
    if m.mask is not None:
        vmap[m.mask] = vmap[inputs[-1]]
    inside = {v for op in m.ops for v in op.results}
    body: list[ir.Op] = []
    for op in sorted(set(m.ops), key=lambda o: graph.index[o]):
        for v in free_values(op, inside):
            _clone_constant(v, graph, vmap, body)
        body.append(clone(op, vmap))
    body.append(ir.Op("return", [vmap[m.out.result]], [], loc=m.out.loc))
    args = [vmap[v] for v in inputs]
    attrs = {"fusion_kind": "attention", "decisions": (decision.reason,),
             "attention_scale": m.scale, "attention_mask": m.mask is not None}
    fusion = ir.Op("fusion", inputs, [ir.Value(m.out.result.type)], attrs,
                   [ir.Region([ir.Block(args, body)])], loc=m.out.loc, name=m.out.name)
    return pre + [fusion]


def _inputs(m: pattern.Match, mask_value) -> tuple[list[ir.Op], list[ir.Value]]:
    """([the folded mask's constant op], [q, k, v, mask]) of the fusion."""
    pre, inputs = [], [m.q, m.k, m.v]
    if m.mask is None:
        return pre, inputs
    mask = m.mask
    if mask_value is not None:
        const = ir.Op("constant", [], [ir.Value(m.mask.type)], {"value": mask_value},
                      loc=m.out.loc, name=m.out.name)
        pre.append(const)
        mask = const.result
    return pre, inputs + [mask]


def _clone_constant(v: ir.Value, graph: BlockGraph, vmap: dict, body: list) -> None:
    """Clones the constant (through converts / broadcasts) computing `v` into `body`."""
    if v in vmap:
        return
    op = graph.producer.get(v)
    if op is None or op.kind not in ("constant", "convert", "broadcast_in_dim"):
        raise AssertionError(f"attention region uses %{v.name}, not a constant")
    for u in op.operands:
        _clone_constant(u, graph, vmap, body)
    body.append(clone(op, vmap))
