"""A runtime attention mask that is the outer `and` of a query vector and a key vector,
as flax's `nn.make_attention_mask(valid_q, valid_k)` builds a padding mask:

    mask[.., i, j] = rows[.., i] & cols[.., j]

(each side broadcast from a value that varies along Sq, or Sk, and batch / group axes,
never both). The attention fusion then takes the two vectors as operands instead of the
[.., Sq, Sk] mask, so no [Sq, Sk] boolean is materialized in HBM (a kernel of its own
before the attention, DMA-bound), and the flash kernel (jax_trn/lower/attention.py)
applies it without an [Sq, Sk] bias pass: the key vector weights V's rows, the query
vector selects the rows' result. The region keeps the `and` (cloned from the program),
so its ops compute the same value one by one.
"""
from __future__ import annotations

from dataclasses import dataclass

from hlo_passes import attention_layout as lay
from hlo_passes import attention_pattern as pattern
from hlo_passes import ir

OUTER_NOTE = "; mask = rows & columns (padding), generated on chip"


@dataclass
class OuterMask:
    rows: ir.Value          # the query-side vector (bool), before its broadcasts
    row_labels: list        # labels of its dims (attention_layout.py)
    cols: ir.Value          # the key-side vector
    col_labels: list
    ops: list               # the views of both and the `and`, cloned into the region


def outer_mask(m: pattern.Match, producer: dict) -> OuterMask | None:
    """The outer form of `m`'s runtime mask, or None (any other mask: read whole)."""
    op = producer.get(m.mask) if m.mask is not None else None
    if op is None or op.kind != "and":
        return None
    roles = dict(zip(m.axis_labels, (role for role, _, _ in m.axes)))
    sides: dict = {}
    ops = [op]
    for v in op.operands:
        root, labels, views = lay.side_root(v, m.mask_labels, producer)
        kinds = {roles.get(lab) for lab in labels if lab is not None}
        if root.dtype != "bool" or None in kinds or ("sq" in kinds) == ("sk" in kinds):
            return None
        side = "sq" if "sq" in kinds else "sk"
        if side in sides:
            return None
        sides[side] = (root, labels)
        ops += views
    (rows, row_labels), (cols, col_labels) = sides["sq"], sides["sk"]
    return OuterMask(rows, row_labels, cols, col_labels, ops)
