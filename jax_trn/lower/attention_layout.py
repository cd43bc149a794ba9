"""The axes of an attention fusion as the flash kernel (attention.py) walks them: the
fusion's `attention_layout` (hlo_passes/attention_layout.py) read back, and the runs of
consecutive heads whose rows are adjacent in memory ([B, S, N, H]: head n + 1 starts H
elements after head n), which the kernel moves with one DMA (V loads, result stores) so
each descriptor covers several heads' rows (§3.4: DMA efficiency grows with the
descriptor size up to ~2.5 KB)."""
from __future__ import annotations

import itertools
import math

from jax_trn.hw.program import DramTensor


class Axes:
    """The fusion's `attention_layout`: (size, strides) per axis, strides in the order
    q, k, v, out, mask, bias (hlo_passes/attention_layout.OPERANDS)."""

    def __init__(self, layout: tuple):
        by_role: dict = {}
        for role, size, strides in layout:
            by_role.setdefault(role, []).append((size, tuple(strides)))
        self.batch, self.group = by_role.get("batch", []), by_role.get("group", [])
        self.sq, self.sk = by_role["sq"][0], by_role["sk"][0]
        self.d, self.dv = by_role["d"][0], by_role["dv"][0]

    @classmethod
    def canonical(cls, q: DramTensor, k: DramTensor, v: DramTensor) -> "Axes":
        """[..., Sq, D] / [..., Sk, D] / [..., Sk, Dv], a [Sq, Sk] mask (the old form)."""
        (sq, d), (sk, dv) = q.shape[-2:], v.shape[-2:]
        return cls((("batch", math.prod(q.shape[:-2]), (sq * d, sk * d, sk * dv, sq * dv,
                                                          0, 0)),
                    ("sq", sq, (d, 0, 0, dv, sk, 0)), ("sk", sk, (0, d, dv, 0, 1, 0)),
                    ("d", d, (1, 1, 0, 0, 0, 0)), ("dv", dv, (0, 0, 1, 1, 0, 0))))

    def offsets(self, which: list[tuple], operands: tuple[int, ...]) -> list[tuple]:
        """Per index of the axes `which`, the element offset of each operand."""
        out = []
        for idx in itertools.product(*(range(n) for n, _ in which)):
            out.append(tuple(sum(i * s[o] for i, (_, s) in zip(idx, which))
                             for o in operands))
        return out


def unit_blocks(offsets: list[int], step: int, limit: int) -> list[tuple[int, int]]:
    """(slot, size) per unit: runs of up to `limit` consecutive units whose offsets
    step by `step` (one DMA moves a run), else runs of one."""
    out, i = [], 0
    while i < len(offsets):
        n = 1
        while n < limit and i + n < len(offsets) and offsets[i + n] == offsets[i] + n * step:
            n += 1
        out += [(j, n) for j in range(n)]
        i += n
    return out


def heads_per_dma(rows: int, width: int, itemsize: int, budget: int) -> int:
    """How many heads' [rows-tiles, width] buffers (double-buffered) fit `budget`
    bytes per partition (at most 8, at least 1)."""
    per_head = 2 * rows * width * itemsize
    return max(1, min(8, budget // max(1, per_head)))
