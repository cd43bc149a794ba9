"""Groups ops into `fusion` ops; which producer joins which region is the policy's call.

Mechanism (the policy is hlo_passes/fusion_policy.py). Roots are visited last op
first; a root that is not yet in a region grows one: its producers are offered to
`policy.should_fuse(producer, consumer, region)` in decreasing program order, so when a
producer is decided every user that will ever be in the region already is. Allowed
producers join (a `duplicate` decision fuses a copy and leaves the original for its
other users); forbidden ones stay outside and become region inputs. A region with at
least one decision becomes

    %r0, ... = fusion(%in0, ...) {fusion_kind="loop"|"reduction"|"matmul_epilogue",
                                   decisions=("<producer> -> <consumer>: <reason>", ...)}
      ^bb(%a0, ...):                       # one block argument per input
        ...fused ops, in program order...  # isolated: they use only the arguments
        return(%v, ...)                    # the root's results, then extra outputs

placed where the root was. Before regions grow, a reduce over dims of extent 1 only
becomes a reshape, as in XLA (a view, so it fuses; a reduce as a producer never does),
a transpose that swaps a dot_general's free dims becomes the dot with its operands
swapped (C^T = B^T A^T: the same products, no transpose kernel), and attention patterns (passes/attention.py) become fusions of kind
"attention" if the policy allows. A fused value that is also used outside the region (only
the function's return may be, by the policy) is an extra result. Every non-root member
has all its users inside the region, so fusing never creates a cycle. Originals left
without users by duplication are removed.
"""
from __future__ import annotations

import heapq
import itertools
from collections import defaultdict

from hlo_passes import ir
from hlo_passes.effects import TERMINATORS
from hlo_passes.fusion_policy import FusionPolicy, is_root, region_shape, root_kind
from hlo_passes.passes import attention, dce

name = "fusion"


class Fusion:
    """The pass, configurable with a `FusionPolicy`."""

    name = name

    def __init__(self, policy: FusionPolicy | None = None):
        self.policy = policy or FusionPolicy()

    def run(self, module: ir.Module) -> bool:
        changed = False
        for fn in module.functions.values():
            for block in _control_blocks(fn.body):
                changed |= _degenerate_reduces(block)
                changed |= _transposed_dots(block)
                changed |= _attention_fusions(block, self.policy)
                changed |= _BlockFusion(block, self.policy).run()
        if changed:
            dce.run(module)
        return changed


CONTROL_KINDS = ("while", "case")


def _control_blocks(block: ir.Block):
    """`block` and, recursively, the cond / body / branch blocks of its loops and
    conditionals: each is a sequence of kernels of its own, fused on its own (values
    from enclosing blocks are inputs, like function arguments)."""
    yield block
    for op in list(block.ops):
        if op.kind in CONTROL_KINDS:
            for region in op.regions:
                for inner in region.blocks:
                    yield from _control_blocks(inner)


def run(module: ir.Module) -> bool:
    return Fusion().run(module)


class _Graph:
    """Producers, users and program positions of one block's top-level ops."""

    def __init__(self, block: ir.Block):
        self.index = {op: i for i, op in enumerate(block.ops)}
        self.producer = {v: op for op in block.ops for v in op.results}
        self.users: dict[ir.Value, list[ir.Op]] = defaultdict(list)
        for op in block.ops:
            for v in _used_values(op):
                if op not in self.users[v]:
                    self.users[v].append(op)


def _used_values(op: ir.Op):
    """Operands of `op` and of everything nested in it."""
    yield from op.operands
    for region in op.regions:
        for block in region.blocks:
            for inner in ir.walk(block):
                yield from inner.operands


class _Region:
    """A region being grown from `root` (what the policy sees as `RegionView`)."""

    def __init__(self, root: ir.Op, graph: _Graph, owner: dict):
        self.root, self.graph, self.owner = root, graph, owner
        self.shape = region_shape(root)
        self.kind = root_kind(root)
        self.members: list[ir.Op] = [root]
        self.order = {root: graph.index[root]}
        self.decisions: list[str] = []
        self.dup_cost = 0.0
        self.originals: list[ir.Op] = []        # duplicated producers

    @property
    def size(self) -> int:
        return len(self.members)

    def outside_users(self, op: ir.Op) -> list[ir.Op]:
        return [u for v in op.results for u in self.graph.users[v] if u not in self.order]

    def inside_users(self, op: ir.Op) -> list[ir.Op]:
        return [u for v in op.results for u in self.graph.users[v] if u in self.order]

    def settled(self, op: ir.Op) -> bool:
        return op in self.owner


class _BlockFusion:
    def __init__(self, block: ir.Block, policy: FusionPolicy):
        self.block, self.policy = block, policy
        self.graph = _Graph(block)
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
        member = self._duplicate(region, producer) if decision.duplicate else producer
        region.members.append(member)
        region.order[member] = self.graph.index[producer]
        if producer.kind == "dot_general":
            region.kind = "matmul_epilogue"
        self._push_producers(member, heap)

    def _label(self, op: ir.Op) -> str:
        op = self.origin.get(op, op)
        return f"{op.kind} %{op.results[0].name}" if op.results else op.kind

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


def _build(region: _Region, graph: _Graph) -> tuple[ir.Op, list[ir.Value]]:
    """The fusion op of `region` and the outer values its results replace."""
    members = sorted(region.members, key=lambda m: region.order[m])
    inside = {v for m in members for v in m.results}
    outputs = [v for m in [region.root] + members for v in m.results
               if any(u not in region.order for u in graph.users[v])]
    outputs = list(dict.fromkeys(outputs))
    inputs = list(dict.fromkeys(v for m in members for v in _free_values(m, inside)))
    vmap = {v: ir.Value(v.type) for v in inputs}
    body = [_clone(m, vmap) for m in members]
    body.append(ir.Op("return", [vmap[v] for v in outputs], [], loc=region.root.loc))
    attrs = {"fusion_kind": region.kind, "decisions": tuple(region.decisions)}
    fusion = ir.Op("fusion", inputs, [ir.Value(v.type) for v in outputs], attrs,
                   [ir.Region([ir.Block([vmap[v] for v in inputs], body)])],
                   loc=region.root.loc, name=region.root.name)
    return fusion, outputs


def _free_values(op: ir.Op, inside: set[ir.Value]):
    """Values `op` (and its nested regions) use that the region does not define."""
    defined = set(inside)
    for r in op.regions:
        for b in r.blocks:
            defined.update(b.args)
            defined.update(v for inner in ir.walk(b) for v in inner.results)
    return [v for v in _used_values(op) if v not in defined]


def _clone(op: ir.Op, vmap: dict) -> ir.Op:
    results = [ir.Value(r.type) for r in op.results]
    regions = [ir.Region([_clone_block(b, vmap) for b in r.blocks]) for r in op.regions]
    copy = op.replace(operands=[vmap.get(v, v) for v in op.operands], results=results,
                      attrs=dict(op.attrs), regions=regions)
    vmap.update(zip(op.results, results))
    return copy


def _clone_block(block: ir.Block, vmap: dict) -> ir.Block:
    args = [ir.Value(a.type) for a in block.args]
    vmap.update(zip(block.args, args))
    return ir.Block(args, [_clone(op, vmap) for op in block.ops])


# --- attention ------------------------------------------------------------------------------

def _attention_fusions(block: ir.Block, policy: FusionPolicy) -> bool:
    """Each attention pattern of `block` (passes/attention.py) as one fusion op."""
    graph = _Graph(block)
    matches = attention.find(block, graph.producer, graph.users)
    replaced: dict[ir.Op, list[ir.Op]] = {}
    members: set[ir.Op] = set()
    for m in matches:
        mask_value = attention.fold(m.mask, graph.producer) if m.mask is not None else None
        decision = policy.attention(m.out, m.scale, m.mask is not None, mask_value)
        if not decision.ok:
            continue
        replaced[m.out] = _attention_op(m, mask_value, decision, graph)
        members.update(op for op in m.ops if op.kind not in attention.SHAREABLE)
    if not replaced:
        return False
    ops, mapping = [], {}
    for op in block.ops:
        if op in replaced:
            ops.extend(replaced[op])
            mapping[op.result] = replaced[op][-1].result
        elif op not in members:
            ops.append(op)
    block.ops = ops
    block.replace_all_uses(mapping)
    return True


def _attention_op(m, mask_value, decision, graph: _Graph) -> list[ir.Op]:
    """[mask constant,] fusion: the pattern's ops cloned into an isolated region whose
    inputs are q, k, v [and the mask]; constants it uses are cloned in."""
    pre, inputs = [], [m.q, m.k, m.v]
    if m.mask is not None:
        mask = m.mask
        if mask_value is not None:
            const = ir.Op("constant", [], [ir.Value(m.mask.type)], {"value": mask_value},
                          loc=m.out.loc, name=m.out.name)
            pre.append(const)
            mask = const.result
        inputs.append(mask)
    vmap = {v: ir.Value(v.type) for v in inputs}
    if m.mask is not None:
        vmap[m.mask] = vmap[inputs[-1]]
    inside = {v for op in m.ops for v in op.results}
    body: list[ir.Op] = []
    for op in sorted(set(m.ops), key=lambda o: graph.index[o]):
        for v in _free_values(op, inside):
            _clone_constant(v, graph, vmap, body)
        body.append(_clone(op, vmap))
    body.append(ir.Op("return", [vmap[m.out.result]], [], loc=m.out.loc))
    args = [vmap[v] for v in inputs]
    attrs = {"fusion_kind": "attention", "decisions": (decision.reason,),
             "attention_scale": m.scale, "attention_mask": m.mask is not None}
    fusion = ir.Op("fusion", inputs, [ir.Value(m.out.result.type)], attrs,
                   [ir.Region([ir.Block(args, body)])], loc=m.out.loc, name=m.out.name)
    return pre + [fusion]


def _clone_constant(v: ir.Value, graph: _Graph, vmap: dict, body: list) -> None:
    """Clones the constant (through converts / broadcasts) computing `v` into `body`."""
    if v in vmap:
        return
    op = graph.producer.get(v)
    if op is None or op.kind not in ("constant", "convert", "broadcast_in_dim"):
        raise AssertionError(f"attention region uses %{v.name}, not a constant")
    for u in op.operands:
        _clone_constant(u, graph, vmap, body)
    body.append(_clone(op, vmap))


# --- degenerate reduces ----------------------------------------------------------------------

def _degenerate_reduces(block: ir.Block) -> bool:
    """reduce(x, init) over dims of extent 1 only -> reshape(x). XLA's reduce assumes
    init is the combiner's identity and its simplifier drops it here (the CPU backend
    keeps a -0.0 and ignores a non-identity init), so we match it; a reshape fuses."""
    ops, mapping = [], {}
    for op in block.ops:
        if _degenerate(op):
            x, out = op.operands[0], op.result
            view = ir.Op("reshape", [x], [ir.Value(ir.TensorType(out.shape, x.dtype))],
                         loc=op.loc, name=op.name)
            ops.append(view)
            mapping[out] = view.result
        else:
            ops.append(op)
    if mapping:
        block.ops = ops
        block.replace_all_uses(mapping)
    return bool(mapping)


def _degenerate(op: ir.Op) -> bool:
    if op.kind != "reduce" or len(op.operands) != 2 or len(op.results) != 1:
        return False
    x, init = op.operands
    return (not init.shape and x.dtype == op.result.dtype
            and all(x.shape[d] == 1 for d in op.attrs.get("dimensions", ())))


# --- transposed dots ------------------------------------------------------------------------

_SWAP = (("lhs_batching_dimensions", "rhs_batching_dimensions"),
         ("lhs_contracting_dimensions", "rhs_contracting_dimensions"))


def _transposed_dots(block: ir.Block) -> bool:
    """transpose(dot_general(a, b)) that puts b's free dims before a's -> dot_general(b,
    a) with the dimension numbers swapped, when the transpose is the dot's only user."""
    users: dict = defaultdict(list)
    for op in block.ops:
        for v in _used_values(op):
            users[v].append(op)
    producer = {v: op for op in block.ops for v in op.results}
    swapped: dict[ir.Op, ir.Op] = {}
    for op in block.ops:
        dot = producer.get(op.operands[0]) if op.kind == "transpose" else None
        if dot is None or dot.kind != "dot_general" or users[dot.result] != [op] or \
                tuple(op.attrs["permutation"]) != _swap_permutation(dot):
            continue
        attrs = dict(dot.attrs)
        for a, b in _SWAP:
            attrs[a], attrs[b] = dot.attrs.get(b, ()), dot.attrs.get(a, ())
        if dot.attrs.get("precision_config"):
            attrs["precision_config"] = tuple(reversed(dot.attrs["precision_config"]))
        swapped[op] = dot.replace(operands=list(reversed(dot.operands)),
                                  results=[ir.Value(op.result.type)], attrs=attrs)
    if not swapped:
        return False
    dead = {producer[op.operands[0]] for op in swapped}
    block.ops = [swapped.get(op, op) for op in block.ops if op not in dead]
    block.replace_all_uses({op.result: new.result for op, new in swapped.items()})
    return True


def _swap_permutation(dot: ir.Op) -> tuple[int, ...]:
    lhs, rhs = dot.operands
    nb = len(dot.attrs.get("lhs_batching_dimensions", ()))
    fl = lhs.type.rank - nb - len(dot.attrs.get("lhs_contracting_dimensions", ()))
    fr = rhs.type.rank - nb - len(dot.attrs.get("rhs_contracting_dimensions", ()))
    return (*range(nb), *range(nb + fl, nb + fl + fr), *range(nb, nb + fl))
