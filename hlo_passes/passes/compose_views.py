"""Chains of layout ops outside fusions become one strided view of their source.

    %r = reshape(%qkv)            [S, 3H*D] -> [S, 3, H, D]     (a fused q/k/v projection
    %t = transpose(%r)            -> [3, H, S, D]                split into heads, as a
    %s = slice(%t)[1]             -> [1, H, S, D]                transformer block writes
    %k = reshape(%s)              -> [H, S, D]                   it)
 -> %k = trn.view(%qkv) {axes = ((D, H), (3H*D, S), (1, D)), offset = H*D}

Each op of such a chain left outside a fusion (its user is an attention kernel, a
matmul, a collective) is a kernel copying the whole array through HBM: the chain above
is 4 kernels for each of q, k and v, ~120 us in the transformer block's forward. Every
one of them only renames elements, so their composition is one affine map from the
result's index to an element of the source: strides per result axis and an offset
(the lowering's `layout.View`). `trn.view` reads it in one relayout (lower/relayout.py:
one DMA pattern, or a staged transpose where rows are short).

Composed, when the result's rows stay contiguous in the source: reshape (where the strided view allows it without a copy, numpy's rule),
transpose, static slice, broadcast_in_dim. A chain starts at the first op whose operand
is not such an op's result (that op is left as it is: a chain of one is already one
kernel); a reshape that needs a copy starts a new chain. Intermediates whose users are
all composed are left for dce. Runs after fusion: views a region reads are the
region's business (fusion_policy).
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from hlo_passes import ir
from hlo_passes.graph import rewrite_blocks

name = "compose-views"

VIEWS = frozenset({"reshape", "transpose", "slice", "broadcast_in_dim"})
VIEW = "trn.view"


def run(module: ir.Module) -> bool:
    return rewrite_blocks(module, _rewrite_block)


def row_major(shape) -> tuple[tuple[int, int], ...]:
    """(stride, size) per axis of a contiguous array of `shape`, in elements."""
    out, stride = [], 1
    for n in reversed(shape):
        out.append((stride, n))
        stride *= n
    return tuple(reversed(out))


def _rewrite_block(block: ir.Block) -> bool:
    views: dict[ir.Value, tuple] = {}      # value -> (source, axes, offset)
    out, changed = [], False
    for op in block.ops:
        composed = None
        if op.kind in VIEWS and len(op.operands) == 1 and len(op.results) == 1:
            base = views.get(op.operands[0])
            src, axes, offset = base or (op.operands[0], row_major(op.operands[0].shape), 0)
            composed = compose(op, axes, offset)
            if composed is not None:
                views[op.result] = (src, *composed)
            if base is not None and composed is not None and _rows_contiguous(composed[0]):
                op = ir.Op(VIEW, [src], [op.result],
                           {"axes": composed[0], "offset": composed[1]},
                           loc=op.loc, name=op.name)
                changed = True
        out.append(op)
    block.ops = out
    return changed


def _rows_contiguous(axes) -> bool:
    """Whether the view's innermost non-unit axis is contiguous (or broadcast) in the
    source: else one DMA would move single elements (§3.4), and the chain is better
    left to the transpose lowering's two passes (lower/relayout.py `permute`)."""
    inner = [st for st, n in axes if n != 1]
    return not inner or inner[-1] in (0, 1)


def compose(op: ir.Op, axes, offset: int):
    """(axes, offset) of `op`'s result as a view of the chain's source, given its
    operand's; None where no strided view can express it."""
    attrs, shape = op.attrs, op.result.shape
    if op.kind == "transpose":
        return tuple(axes[p] for p in attrs["permutation"]), offset
    if op.kind == "slice":
        starts, steps = attrs["start_indices"], attrs["strides"]
        offset += sum(st * s for (st, _), s in zip(axes, starts))
        return tuple((st * k, n) for (st, _), k, n in zip(axes, steps, shape)), offset
    if op.kind == "broadcast_in_dim":
        strides = [0] * len(shape)
        for i, j in enumerate(attrs["broadcast_dimensions"]):
            if axes[i][1] == shape[j]:
                strides[j] = axes[i][0]
        return tuple(zip(strides, shape)), offset
    return _reshape(axes, shape, offset)


def _reshape(axes, shape, offset: int):
    """The strides of `shape` over the same elements, in order, as the strided view
    `axes` (numpy's reshape without a copy), or None if that needs a copy."""
    if 0 in shape:
        return None
    if not axes or not shape:              # from or to a single element
        return tuple((0, n) for n in shape), offset
    probe = as_strided(np.zeros(1, np.uint8), shape=[n for _, n in axes],
                       strides=[s for s, _ in axes])
    try:
        got = np.reshape(probe, shape, copy=False)
    except ValueError:
        return None
    return tuple(zip(got.strides, shape)), offset
