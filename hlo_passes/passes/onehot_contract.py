"""Contracts one-hot products algebraically: a row sum of (smoothed) one-hot labels
times X becomes X gathered at the label, so the labels are never read per element.

    %oh = convert(compare EQ(broadcast(%t), broadcast(iota along d)))  # one_hot(t)
    %l  = add(multiply(%oh, a), b)          # optax.smooth_labels: a, b constant along d
    %r  = reduce_sum(f(multiply(%l, %y)), dims=(d,))   # f: negates and float converts
 -> %r  = f(select(0 <= t < V, a * y[t], 0) + b * reduce_sum(y, dims=(d,)))

`y[t]` pushes the gather through the elementwise graph of `y`: a value constant along
`d` (a broadcast of a per-row value) is that value, an elementwise op is computed on
the gathered operands, anything else is gathered (one DmaGather of N elements,
lower/gather.py). `sum(y)` distributes over y's linear graph (`row_sum`): a value
constant along `d` sums to `V * y` without a pass, x - max - logsumexp to one plain
row sum of x. So optax.softmax_cross_entropy's label term (sum(labels * log_softmax)) becomes a gather
and a plain row sum, and its gradient's row sum (sum(labels * g)) a per-row product:
two passes over the [N, V] logits fewer, and the f32 labels are left with one
elementwise user, which the fusion pass fuses (no [N, V] labels written). The gather
carries a `decisions` attribute saying why it is there (its rule ignores it).

Not rewritten: other combiners, a reduce over several dims or a non-zero init, a label
axis other than the reduced one, compares other than EQ, labels that are not affine in
the one-hot, and a `y` whose gathered graph would exceed `MAX_CLONED` ops.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from hlo_passes import ir
from hlo_passes.effects import has_side_effects
from hlo_passes.fusion_policy import ELEMENTWISE
from hlo_passes.graph import BlockGraph, rewrite_blocks, used_values

name = "onehot-contract"
MAX_CLONED = 32      # gathered ops per rewrite: beyond that, y's graph is not elementwise
DECISION = "onehot-contract: sum(onehot(t) * y) over the label axis as y[t]"


def run(module: ir.Module) -> bool:
    return rewrite_blocks(module, _rewrite_block)


def _rewrite_block(block: ir.Block) -> bool:
    graph = BlockGraph(block)
    ops, mapping, seeds = [], {}, []
    for op in block.ops:
        new = _contract(op, graph.producer)
        if new is None:
            ops.append(op)
            continue
        ops.extend(new)
        mapping[op.result] = new[-1].result
        seeds.extend(op.operands)
    if mapping:
        block.ops = ops
        block.replace_all_uses(mapping)
        _drop_dead(block, seeds)
    return bool(mapping)


def _drop_dead(block: ir.Block, seeds: list[ir.Value]) -> None:
    """Removes the ops only the replaced reduces used (the label products): the fusion
    pass counts every user, and a dead one would keep the [N, V] labels materialized.
    Local, so a pipeline without `dce` keeps everything else."""
    graph = BlockGraph(block)
    uses = Counter(v for op in block.ops for v in used_values(op))
    dead: set[ir.Op] = set()
    while seeds:
        op = graph.producer.get(seeds.pop())
        if op is None or op in dead or has_side_effects(op) \
                or any(uses[r] for r in op.results):
            continue
        dead.add(op)
        uses.subtract(used_values(op))
        seeds.extend(op.operands)
    block.ops = [op for op in block.ops if op not in dead]


# --- matching ------------------------------------------------------------------------------

def _contract(op: ir.Op, producer: dict) -> list[ir.Op] | None:
    """The ops replacing the reduce `op`, or None when it is not a one-hot contraction."""
    dims = op.attrs.get("dimensions", ())
    if op.kind != "reduce" or len(op.operands) != 2 or len(dims) != 1 \
            or not _sum_from_zero(op, producer):
        return None
    d, chain, v = dims[0], [], op.operands[0]
    while (p := producer.get(v)) is not None and _linear(p):
        chain.append(p)
        v = p.operands[0]
    p = producer.get(v)
    if p is None or p.kind != "multiply" or not ir.is_float(v.dtype):
        return None
    for lab, y in (p.operands, p.operands[::-1]):
        if (m := _affine_onehot(lab, d, producer)) is not None:
            b = _Builder(op, d, producer)
            try:
                return b.build(y, *m, chain[::-1])
            except _TooBig:
                return None
    return None


def _sum_from_zero(op: ir.Op, producer: dict) -> bool:
    body = [o for o in op.regions[0].block.ops if o.kind not in ("return", "func.return")]
    init = producer.get(op.operands[1])
    return (len(body) == 1 and body[0].kind == "add" and ir.is_float(op.result.dtype)
            and init is not None and init.kind == "constant"
            and not np.any(np.asarray(init.attrs["value"])))


def _linear(op: ir.Op) -> bool:
    """negate, or a float -> float convert: f(sum) = sum(f) up to rounding."""
    if op.kind == "negate":
        return True
    return op.kind == "convert" and ir.is_float(op.operands[0].dtype) \
        and ir.is_float(op.result.dtype)


def _affine_onehot(v: ir.Value, d: int, producer: dict):
    """(t, a, b) when `v` is a * onehot(t) + b along `d` (a, b per-row values or None)."""
    found = {}
    for kind in ("add", "multiply"):            # (... * a) + b, outermost first
        p = producer.get(v)
        if p is not None and p.kind == kind:
            split = _row_const_operand(p, d, producer)
            if split is None:
                return None
            v, found[kind] = split
    t = _onehot(v, d, producer)
    return None if t is None else (t, found.get("multiply"), found.get("add"))


def _row_const_operand(p: ir.Op, d: int, producer: dict):
    """(other operand, the operand constant along `d`) of a binary op, the first
    operand taken as the constant only if the second is not; None if neither is."""
    for x, c in (p.operands, p.operands[::-1]):
        if _row_const(c, d, producer) is not None:
            return x, c
    return None


def _onehot(v: ir.Value, d: int, producer: dict) -> ir.Value | None:
    """t when `v` is convert(t == iota along d) to a float, t constant along d."""
    p = producer.get(v)
    if p is None or p.kind != "convert" or p.operands[0].dtype != "bool" \
            or not ir.is_float(v.dtype):
        return None
    cmp = producer.get(p.operands[0])
    if cmp is None or cmp.kind != "compare" or cmp.attrs.get("comparison_direction") != "EQ":
        return None
    for t, i in (cmp.operands, cmp.operands[::-1]):
        if ir.is_int(t.dtype) and _row_const(t, d, producer) is not None \
                and _iota_along(i, d, producer):
            return t
    return None


def _iota_along(v: ir.Value, d: int, producer: dict) -> bool:
    """Whether `v` counts 0..V-1 along `d` (an iota, through broadcasts)."""
    while (p := producer.get(v)) is not None and p.kind == "broadcast_in_dim":
        dims = p.attrs["broadcast_dimensions"]
        if d not in dims or p.operands[0].shape[dims.index(d)] != v.shape[d]:
            return False
        v, d = p.operands[0], dims.index(d)
    return p is not None and p.kind == "iota" and p.attrs.get("iota_dimension") == d


def _row_const(v: ir.Value, d: int, producer: dict) -> tuple | None:
    """(source, its dims in v) when `v` is a broadcast constant along `d`, else None."""
    p = producer.get(v)
    if p is None or p.kind != "broadcast_in_dim":
        return None
    src, dims = p.operands[0], p.attrs["broadcast_dimensions"]
    if d in dims and src.shape[dims.index(d)] != 1:
        return None
    return src, dims


# --- building -------------------------------------------------------------------------------

class _TooBig(Exception):
    pass


class _Builder:
    """New ops on the reduced shape, in program order, at the reduce's position."""

    def __init__(self, op: ir.Op, d: int, producer: dict):
        self.op, self.d, self.producer = op, d, producer
        shape = op.operands[0].shape
        self.rshape = tuple(n for i, n in enumerate(shape) if i != d)
        self.size = shape[d]
        self.ops: list[ir.Op] = []
        self.memo: dict[ir.Value, ir.Value] = {}
        self.cloned = 0

    def emit(self, kind, operands, dtype, shape=None, **attrs) -> ir.Value:
        shape = self.rshape if shape is None else shape
        op = ir.Op(kind, list(operands), [ir.Value(ir.TensorType(tuple(shape), dtype))],
                   dict(attrs), loc=self.op.loc, name=self.op.name)
        self.ops.append(op)
        return op.result

    def const(self, value, dtype) -> ir.Value:
        c = self.emit("constant", [], dtype, (), value=np.asarray(value, ir.np_dtype(dtype)))
        return self.emit("broadcast_in_dim", [c], dtype, broadcast_dimensions=())

    def row(self, v: ir.Value, dtype: str | None = None) -> ir.Value:
        """The per-row value of `v` (constant along d) on the reduced shape."""
        src, dims = _row_const(v, self.d, self.producer)
        keep = [i for i, k in enumerate(dims) if k != self.d]
        if len(keep) != len(dims):
            src = self.emit("reshape", [src], src.dtype, tuple(src.shape[i] for i in keep))
        new_dims = tuple(k - (k > self.d) for k in (dims[i] for i in keep))
        out = self.emit("broadcast_in_dim", [src], src.dtype, broadcast_dimensions=new_dims)
        return out if dtype in (None, out.dtype) else self.emit("convert", [out], dtype)

    def at_t(self, v: ir.Value, t: ir.Value) -> ir.Value:
        """`v` at (row, t[row]) on the reduced shape: pushed through elementwise ops."""
        if v in self.memo:
            return self.memo[v]
        p = self.producer.get(v)
        if _row_const(v, self.d, self.producer) is not None:
            out = self.row(v)
        elif p is not None and p.kind in ELEMENTWISE and len(p.results) == 1 \
                and not p.regions and all(o.shape == v.shape for o in p.operands):
            self.cloned += 1
            if self.cloned > MAX_CLONED:
                raise _TooBig
            args = [self.at_t(o, t) for o in p.operands]
            out = self.emit(p.kind, args, v.dtype, **{k: a for k, a in p.attrs.items()
                                                      if k != "decisions"})
        else:
            out = self.gather(v, t)
        self.memo[v] = out
        return out

    def gather(self, v: ir.Value, t: ir.Value) -> ir.Value:
        r = len(self.rshape)
        idx = self.emit("reshape", [t], t.dtype, self.rshape + (1,))
        kept = tuple(i for i in range(v.type.rank) if i != self.d)
        dn = {"offset_dims": (), "collapsed_slice_dims": (self.d,),
              "operand_batching_dims": kept, "start_indices_batching_dims": tuple(range(r)),
              "start_index_map": (self.d,), "index_vector_dim": r}
        return self.emit("gather", [v, idx], v.dtype, dimension_numbers=dn,
                         slice_sizes=(1,) * v.type.rank, indices_are_sorted=False,
                         decisions=(DECISION,))

    def build(self, y, t, a, b, chain) -> list[ir.Op]:
        dt = y.dtype
        t = self.row(t)
        inside = self.emit("and", [
            self.emit("compare", [t, self.const(0, t.dtype)], "bool",
                      comparison_direction="GE", compare_type="SIGNED"),
            self.emit("compare", [t, self.const(self.size, t.dtype)], "bool",
                      comparison_direction="LT", compare_type="SIGNED")], "bool")
        picked = self.at_t(y, t)
        if a is not None:
            picked = self.emit("multiply", [picked, self.row(a, dt)], dt)
        total = self.emit("select", [inside, picked, self.const(0, dt)], dt)
        if b is not None:
            total = self.emit("add", [total, self.emit(
                "multiply", [self.row_sum(y), self.row(b, dt)], dt)], dt)
        for link in chain:
            total = self.emit(link.kind, [total], link.result.dtype)
        return self.ops

    def row_sum(self, y: ir.Value, dtype: str | None = None) -> ir.Value:
        """sum(y) along d in `dtype` (y's by default), distributed over y's linear
        graph: sum(u - w) = sum(u) - sum(w), sum(c) = V * c and sum(c * u) = c * sum(u)
        for c per-row, negates and float converts; what is left is summed by a reduce
        (x - max - logsumexp: one plain row sum of x, not three ops per element)."""
        dtype = dtype or y.dtype
        p = self.producer.get(y)
        if _row_const(y, self.d, self.producer) is not None:
            return self.emit("multiply", [self.row(y, dtype), self.const(self.size, dtype)],
                             dtype)
        if p is not None and (p.kind in ("add", "subtract") or p.kind == "negate"
                              or _linear(p)) and self.cloned < MAX_CLONED:
            self.cloned += 1
            args = [self.row_sum(o, dtype) for o in p.operands]
            return args[0] if p.kind == "convert" else self.emit(p.kind, args, dtype)
        if p is not None and p.kind == "multiply" and self.cloned < MAX_CLONED:
            for c, u in (p.operands, p.operands[::-1]):
                if _row_const(c, self.d, self.producer) is not None:
                    self.cloned += 1
                    return self.emit("multiply", [self.row(c, dtype),
                                                  self.row_sum(u, dtype)], dtype)
        if y.dtype != dtype:
            y = self._full_convert(y, dtype)
        return self.reduce_sum(y)

    def _full_convert(self, y: ir.Value, dtype: str) -> ir.Value:
        op = ir.Op("convert", [y], [ir.Value(ir.TensorType(y.shape, dtype))],
                   loc=self.op.loc, name=self.op.name)
        self.ops.append(op)
        return op.result

    def reduce_sum(self, y: ir.Value) -> ir.Value:
        zero = self.emit("constant", [], y.dtype, (), value=np.zeros((), ir.np_dtype(y.dtype)))
        scalar = ir.TensorType((), y.dtype)
        lhs, rhs, res = ir.Value(scalar), ir.Value(scalar), ir.Value(scalar)
        body = ir.Block([lhs, rhs], [ir.Op("add", [lhs, rhs], [res], loc=self.op.loc),
                                      ir.Op("return", [res], [], loc=self.op.loc)])
        out = ir.Value(ir.TensorType(self.rshape, y.dtype))
        self.ops.append(ir.Op("reduce", [y, zero], [out], {"dimensions": (self.d,)},
                              [ir.Region([body])], loc=self.op.loc, name=self.op.name))
        return out
