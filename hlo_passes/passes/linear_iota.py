"""Turns a sum of iotas scaled by the row-major strides of their shape (an element's
linear index) into one iota over the flat shape, reshaped.

    %i0 = iota() {iota_dimension=0}  : u64[4,1024,1024]
    %i1 = iota() {iota_dimension=1}          (and %i2)
    %m0 = multiply(broadcast(1048576), %i0)  (%m1: 1024 * %i1, %m2: 1 * %i2)
    %n  = add(add(%m0, %m1), %m2)
 -> %f  = iota() {iota_dimension=0}  : u64[4194304]
    %n  = reshape(%f)                        : u64[4,1024,1024]

JAX's threefry counters are this sum (`iota_2x32_shape`: the linear index of each draw
as a u64, split into two u32 words), so every random draw computes it per element:
three iotas, three multiplies and two adds in 64-bit integers on GpSimd. A fused
region generates the flat iota per tile as one affine `iota` instruction, and its
view is the region's own row-major one, so it tiles wherever a stored tensor of the
region's shape would (a matmul epilogue's rows over [B, S] included, which per-dim
iotas over two M axes are not).

Exact: each index is below the element count, which the type must hold (else the sum
would wrap where the flat iota would not). Dims of extent 1 may appear with any factor
or not at all (their iota is 0). Adds whose trees are part of a larger match are left
to dce.
"""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from hlo_passes import ir
from hlo_passes.graph import BlockGraph, rewrite_blocks

name = "linear-iota"


def run(module: ir.Module) -> bool:
    return rewrite_blocks(module, _rewrite_block)


def _rewrite_block(block: ir.Block) -> bool:
    graph = BlockGraph(block)
    inserts: dict[ir.Op, list[ir.Op]] = {}
    mapping: dict[ir.Value, ir.Value] = {}
    covered: set[ir.Op] = set()
    for op in reversed(block.ops):
        if op.kind != "add" or op in covered:
            continue
        tree: list[ir.Op] = []
        if not is_linear_index(op, graph, tree):
            continue
        covered.update(tree)
        shape, dtype = tuple(op.result.shape), op.result.dtype
        flat = ir.Op("iota", [], [ir.Value(ir.TensorType((math.prod(shape),), dtype))],
                     {"iota_dimension": 0}, loc=op.loc)
        view = ir.Op("reshape", [flat.result], [ir.Value(ir.TensorType(shape, dtype))],
                     loc=op.loc)
        inserts[op] = [flat, view]
        mapping[op.result] = view.result
    if not mapping:
        return False
    block.ops = [new for op in block.ops for new in inserts.get(op, [op])]
    block.replace_all_uses(mapping)
    return True


def is_linear_index(op: ir.Op, graph: BlockGraph, tree: list[ir.Op] | None = None) -> bool:
    """Whether `op` (an add) computes each element's row-major linear index of its
    shape from iotas (module doc); `tree` collects the adds it is made of."""
    shape, dtype = tuple(op.result.shape), op.result.dtype
    if not ir.is_int(dtype) or not shape or math.prod(shape) - 1 > _max(dtype):
        return False
    terms: dict[int, int] = {}
    if not _terms(op.result, graph, terms, tree if tree is not None else []):
        return False
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    return all(terms.get(d) == strides[d] for d, n in enumerate(shape) if n > 1)


def _terms(v: ir.Value, graph: BlockGraph, terms: dict[int, int], tree: list) -> bool:
    """Adds `v`'s (dim -> factor) to `terms`: False if `v` is not a sum of distinct
    scaled iotas."""
    op = graph.producer.get(v)
    if op is None:
        return False
    if op.kind == "add":
        tree.append(op)
        return all(_terms(x, graph, terms, tree) for x in op.operands)
    if op.kind == "iota":
        return _term(op, 1, terms)
    if op.kind == "multiply":
        for a, b in (op.operands, op.operands[::-1]):
            iota, factor = graph.producer.get(a), _splat(b, graph)
            if iota is not None and iota.kind == "iota" and factor is not None:
                return _term(iota, factor, terms)
    return False


def _term(iota: ir.Op, factor: int, terms: dict[int, int]) -> bool:
    d = iota.attrs["iota_dimension"]
    if d in terms:
        return False
    terms[d] = factor
    return True


def _splat(v: ir.Value, graph: BlockGraph) -> int | None:
    """The integer every element of `v` holds: a splat constant or its broadcast."""
    op = graph.producer.get(v)
    if op is not None and op.kind == "broadcast_in_dim" and not op.operands[0].shape:
        op = graph.producer.get(op.operands[0])
    if op is None or op.kind != "constant":
        return None
    flat = np.ascontiguousarray(op.attrs["value"]).reshape(-1)
    if flat.size == 0 or not (flat == flat[0]).all():
        return None
    return int(flat[0])


def _max(dtype: str) -> int:
    return int(ml_dtypes.iinfo(ir.np_dtype(dtype)).max)     # int4 too (numpy: no)
