"""How the ranks' arrays map onto a plan's slots, and back (trainium-hardware.md §5.1).

A rank's buffer is `plan.total_slots` chunks of `chunk` elements (zero-padded). all_reduce
lays the flattened input over the main slots; all_gather / reduce_scatter put each
block in its leaf (the slots a rank owns at the last level, `plan.leaf`); all_to_all
puts input block j in slot j and receives into slots n..2n-1.
"""
from __future__ import annotations

import numpy as np

__all__ = ["message_bytes", "chunk_elems", "load", "unload", "restore"]


def message_bytes(kind, shape, itemsize, n) -> int:
    """The message size the algorithm choice uses: the larger of a rank's input and
    output buffers."""
    size = int(np.prod(shape)) * itemsize
    return size * n if kind == "all_gather" else size


def chunk_elems(kind, shape, plan, n) -> int:
    """Elements of one slot for a rank input of `shape`."""
    size = int(np.prod(shape))
    if kind == "all_reduce":
        return -(-size // plan.slots)
    if kind == "all_to_all":
        return -(-size // n)
    block = size // n if kind == "reduce_scatter" else size
    return -(-block // plan.leaf_span)


def load(kind, blocks, plan, n, chunk, ranks=None) -> np.ndarray:
    """The ranks' buffers (ranks x total slots x chunk) holding `blocks` (one row per rank,
    the moved axis first). `ranks`: which of the plan's ranks the blocks are (default
    all, in order)."""
    rows = blocks.shape[0]
    pick = slice(None) if ranks is None else np.asarray(ranks)
    if kind == "all_reduce":                          # main slots first, scratch after
        flat = blocks.reshape(rows, -1)
        buf = np.zeros((rows, plan.total_slots * chunk), blocks.dtype)
        buf[:, :flat.shape[1]] = flat
        return buf.reshape(rows, plan.total_slots, chunk)
    buf = np.zeros((rows, plan.total_slots, chunk), blocks.dtype)
    if kind == "all_to_all":
        per = blocks.reshape(rows, n, -1)
        buf[:, :n, :per.shape[2]] = per
        return buf
    per = blocks.reshape(rows, n, -1) if kind == "reduce_scatter" else blocks.reshape(rows, 1, -1)
    span = plan.leaf_span
    leaf = plan.leaf.reshape(-1, n)                   # (G, n): leaf slot of each group position
    for q in range(per.shape[1]):
        pad = np.zeros((rows, span * chunk), blocks.dtype)
        pad[:, :per.shape[2]] = per[:, q]
        if kind == "reduce_scatter":                  # block q -> leaf of group position q
            cols = np.repeat(leaf[:, q], n)[pick]
        else:                                         # own block -> own leaf
            cols = plan.leaf[pick]
        buf[np.arange(rows)[:, None], cols[:, None] + np.arange(span)[None, :]] = pad.reshape(rows, span, chunk)
    return buf


def unload(kind, buf, plan, blocks, g, n, chunk, ranks=None) -> np.ndarray:
    """Each rank's result from its buffer, one row per rank (moved axis first).
    `ranks`: which of the plan's ranks the buffers are (default all, in order)."""
    rows = buf.shape[0]
    pick = slice(None) if ranks is None else np.asarray(ranks)
    if kind == "all_reduce":
        size = int(np.prod(blocks.shape[1:]))
        return buf[:, :plan.slots].reshape(rows, -1)[:, :size].reshape(blocks.shape)
    if kind == "all_to_all":
        per = int(np.prod(blocks.shape[1:])) // n
        return buf[:, n:2 * n, :per].reshape(blocks.shape)
    span = plan.leaf_span
    size = int(np.prod(blocks.shape[1:]))
    if kind == "reduce_scatter":
        per = size // n
        cols = plan.leaf[pick][:, None] + np.arange(span)[None, :]
        got = buf[np.arange(rows)[:, None], cols].reshape(rows, -1)[:, :per]
        return got.reshape((rows, blocks.shape[1] // n) + blocks.shape[2:])
    leaf = plan.leaf.reshape(g, n)
    outs = []
    for q in range(n):
        cols = np.repeat(leaf[:, q], n)[pick][:, None] + np.arange(span)[None, :]
        outs.append(buf[np.arange(rows)[:, None], cols].reshape(rows, -1)[:, :size].reshape(blocks.shape))
    return np.concatenate(outs, axis=1)


def restore(kind, y, x0, n, axis, split_axis, concat_axis):
    """One rank's result back in the caller's layout."""
    if not x0.ndim:
        return y.reshape(())
    if kind in ("all_gather", "reduce_scatter"):
        return np.moveaxis(y, 0, axis)
    if kind == "all_to_all":
        return _a2a_result(y.reshape((n, y.shape[0] // n) + y.shape[1:]), split_axis, concat_axis)
    return y


def _a2a_result(y, split_axis, concat_axis):
    """y: (n, *moved_block) with the split axis first; back to XLA's all_to_all layout."""
    blocks = [np.moveaxis(b, 0, split_axis) for b in y]
    return np.concatenate(blocks, axis=concat_axis)
