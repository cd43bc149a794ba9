"""Groups ops into `fusion` ops; which producer joins which region is the policy's call.

Mechanism (the policy is hlo_passes/fusion_policy.py). Roots are visited last op
first; a root that is not yet in a region grows one: its producers are offered to
`policy.should_fuse(producer, consumer, region)` in decreasing program order, so when a
producer is decided every user that will ever be in the region already is. Allowed
producers join (a `duplicate` decision fuses a copy and leaves the original for its
other users); forbidden ones stay outside and become region inputs. A region with at
least one decision becomes

    %r0, ... = fusion(%in0, ...) {fusion_kind="loop"|"reduction"|"matmul_epilogue"|"rows",
                                   decisions=("<producer> -> <consumer>: <reason>", ...)}
      ^bb(%a0, ...):                       # one block argument per input
        ...fused ops, in program order...  # isolated: they use only the arguments
        return(%v, ...)                    # the root's results, then extra outputs

placed where the root was. A decision names producer and consumer by kind and value
("tanh %v4 -> reduce %v5"), the value as the IR printed before this pass (the previous
dump) names it, so the same program gives the same decisions. A fused value that is
also used outside the region is an extra result: by the policy, only the function's
return may use it, or (in a loop region: a row fusion's statistics, GELU's residuals)
ops that run after the region's kernel: members of regions grown before it (rooted later) or
ops after its root. Every other non-root member has all its users inside the region,
so fusing never creates a cycle. Originals left without users by duplication are
removed (dce). A region that took a row reduction or row values (`rows`: its trailing
row axes) becomes a fusion of kind "rows" with attribute `row_axes`.

The pipeline runs degenerate-reduce, transposed-dot and attention-fusion before this
pass (each its own pass, disabled by its own name): reduces over extent-1 dims arrive
as reshapes, transposed dots as swapped dots, attention patterns as fusions of kind
"attention" (never regrown: a fusion op is neither a root nor fusible). Each loop body
and conditional branch is fused on its own (`graph.control_blocks`).
"""
from __future__ import annotations

import heapq
import itertools

from hlo_passes import ir
from hlo_passes.effects import TERMINATORS
from hlo_passes.fusion_policy import (ELEMENTWISE, VIEWS, FusionPolicy, is_root, region_shape,
                                     root_kind)
from hlo_passes.graph import BlockGraph, clone, control_blocks, free_values
from hlo_passes.passes import dce

name = "fusion"


class Fusion:
    """The pass, configurable with a `FusionPolicy`."""

    name = name

    def __init__(self, policy: FusionPolicy | None = None):
        self.policy = policy or FusionPolicy()

    def run(self, module: ir.Module) -> bool:
        names = ir.value_names(module)      # for the decisions: as the last dump printed
        changed = dce.run(module)   # ops earlier rewrites left unused are no one's users
        for fn in module.functions.values():
            for block in control_blocks(fn.body):
                changed |= _BlockFusion(block, self.policy, names).run()
        if changed:
            dce.run(module)
        return changed


def run(module: ir.Module) -> bool:
    return Fusion().run(module)


def refuse_without_rows(fusion: ir.Op) -> None:
    """Re-fuses the body of a "rows" fusion whose rows the lowering could not hold
    (jax_trn.lower's fallback) with row fusion off: its loop and reduction regions,
    not a kernel per op. The body's ops are rewritten in place."""
    block = fusion.regions[0].block
    if _BlockFusion(block, FusionPolicy(max_row=0), {}).run():
        dce.run_block(block)


class _Region:
    """A region being grown from `root` (what the policy sees as `RegionView`)."""

    def __init__(self, root: ir.Op, graph: BlockGraph, owner: dict):
        self.root, self.graph, self.owner = root, graph, owner
        self.shape = region_shape(root)
        self.kind = root_kind(root)
        self.members: list[ir.Op] = [root]
        self.order = {root: graph.index[root]}
        self.decisions: list[str] = []
        self.dup_cost = 0.0
        self.originals: list[ir.Op] = []        # duplicated producers
        self.rows = 0                           # trailing row axes (fusion_rows.py)

    @property
    def size(self) -> int:
        return len(self.members)

    def outside_users(self, op: ir.Op) -> list[ir.Op]:
        return [u for v in op.results for u in self.graph.users[v] if u not in self.order]

    def inside_users(self, op: ir.Op) -> list[ir.Op]:
        return [u for v in op.results for u in self.graph.users[v] if u in self.order]

    def settled(self, op: ir.Op) -> bool:
        return op in self.owner

    def after_root(self, op: ir.Op) -> bool:
        return op in self.owner or self.graph.index[op] > self.graph.index[self.root]

    def full_inputs(self) -> int:
        made = {v for m in self.members for v in m.results}
        return len({v for m in self.members for v in m.operands
                    if v not in made and tuple(v.type.shape) == self.shape
                    and self._from_memory(v)})

    def _from_memory(self, v: ir.Value) -> bool:
        """Whether `v` is read from HBM whatever is decided later: a block argument
        or the result of an op in another region or of a kind no region takes in."""
        p = self.graph.producer.get(v)
        return p is None or p in self.owner or p.kind not in ELEMENTWISE | VIEWS


class _BlockFusion:
    """Grows the regions of one block, then rewrites it."""

    def __init__(self, block: ir.Block, policy: FusionPolicy, names: dict[ir.Value, str]):
        self.block, self.policy, self.names = block, policy, names
        self.graph = BlockGraph(block)
        self.owner: dict[ir.Op, _Region] = {}
        self.origin: dict[ir.Op, ir.Op] = {}     # duplicate -> the op it copies
        self._seq = itertools.count()

    def run(self) -> bool:
        regions = []
        for op in reversed(self.block.ops):
            if op in self.owner or not is_root(op):
                continue
            region = self._grow(op)
            if region.decisions:
                regions.append(region)
                self.owner.update((m, region) for m in region.members)
        if regions:
            self._rewrite(regions)
        return bool(regions)

    # --- growing ------------------------------------------------------------------------

    def _grow(self, root: ir.Op) -> _Region:
        region = _Region(root, self.graph, self.owner)
        heap: list = []
        self._push_producers(root, heap)
        seen: set[ir.Op] = set()
        while heap:
            _, _, producer = heapq.heappop(heap)
            if producer in seen or producer in region.order:
                continue
            seen.add(producer)
            self._offer(region, producer, heap)
        return region

    def _push_producers(self, op: ir.Op, heap: list) -> None:
        if op.kind == "dot_general":
            return                      # its operands are read from memory
        for v in op.operands:
            p = self.graph.producer.get(v)
            if p is not None and p.kind not in TERMINATORS:
                heapq.heappush(heap, (-self.graph.index[p], next(self._seq), p))

    def _offer(self, region: _Region, producer: ir.Op, heap: list) -> None:
        consumer = self._consumer(region, producer)
        decision = self.policy.should_fuse(producer, consumer, region)
        region.decisions.append(f"{self._label(producer)} -> {self._label(consumer)}: "
                                f"{decision.reason}")
        if not decision.ok:
            return
        region.rows = region.rows or decision.rows
        member = self._duplicate(region, producer) if decision.duplicate else producer
        region.members.append(member)
        region.order[member] = self.graph.index[producer]
        if producer.kind == "dot_general":
            region.kind = "matmul_epilogue"
        self._push_producers(member, heap)

    def _label(self, op: ir.Op) -> str:
        op = self.origin.get(op, op)
        if not op.results:
            return op.kind
        return f"{op.kind} %{self.names.get(op.results[0], '?')}"

    def _consumer(self, region: _Region, producer: ir.Op) -> ir.Op:
        """The member that uses `producer` (the earliest, for the record)."""
        return min(region.inside_users(producer), key=lambda u: region.order[u])

    def _duplicate(self, region: _Region, producer: ir.Op) -> ir.Op:
        """A copy of `producer` for the region's members; the original stays."""
        copy = producer.replace(operands=list(producer.operands),
                                results=[ir.Value(r.type) for r in producer.results],
                                attrs=dict(producer.attrs))
        mapping = dict(zip(producer.results, copy.results))
        for member in region.members:
            if any(v in mapping for v in member.operands):
                member.operands = [mapping.get(v, v) for v in member.operands]
        for old, new in mapping.items():
            users = self.graph.users[old]
            self.graph.users[new] = [u for u in users if u in region.order]
            self.graph.users[old] = [u for u in users if u not in region.order]
        for v in copy.operands:
            self.graph.users[v].append(copy)
        self.graph.index[copy] = self.graph.index[producer]
        self.graph.producer.update((r, copy) for r in copy.results)
        if producer.kind not in ("constant", "broadcast_in_dim", "reshape"):
            region.dup_cost += self.policy.cost(producer)
        region.originals.append(producer)
        self.origin[copy] = self.origin.get(producer, producer)
        return copy

    # --- rewriting ------------------------------------------------------------------------

    def _rewrite(self, regions: list[_Region]) -> None:
        by_root = {r.root: r for r in regions}
        mapping: dict[ir.Value, ir.Value] = {}
        ops = []
        for op in self.block.ops:
            region = self.owner.get(op)
            if region is None:
                ops.append(op)
            elif op is region.root:
                fusion, outputs = _build(by_root[op], self.graph)
                mapping.update(zip(outputs, fusion.results))
                ops.append(fusion)
        self.block.ops = ops
        self.block.replace_all_uses(mapping)


def _build(region: _Region, graph: BlockGraph) -> tuple[ir.Op, list[ir.Value]]:
    """The fusion op of `region` and the outer values its results replace."""
    members = sorted(region.members, key=lambda m: region.order[m])
    inside = {v for m in members for v in m.results}
    outputs = [v for m in [region.root] + members for v in m.results
               if any(u not in region.order for u in graph.users[v])]
    outputs = list(dict.fromkeys(outputs))
    inputs = list(dict.fromkeys(v for m in members for v in free_values(m, inside)))
    vmap = {v: ir.Value(v.type) for v in inputs}
    body = [clone(m, vmap) for m in members]
    body.append(ir.Op("return", [vmap[v] for v in outputs], [], loc=region.root.loc))
    attrs = {"fusion_kind": "rows" if region.rows else region.kind,
             "decisions": tuple(region.decisions)}
    if region.rows:
        attrs["row_axes"] = region.rows
    fusion = ir.Op("fusion", inputs, [ir.Value(v.type) for v in outputs], attrs,
                   [ir.Region([ir.Block([vmap[v] for v in inputs], body)])],
                   loc=region.root.loc, name=region.root.name)
    return fusion, outputs
