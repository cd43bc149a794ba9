"""Row fusions: whole rows on chip, one per partition (hlo_passes/fusion_rows.py).

A "rows" fusion's region (translate.py) runs over the index space S whose last k axes
(`row_axes`) form a row of L elements. The tiling puts P rows on partitions and a
whole row on the free axis, so every box holds complete rows:

    for each tile of P rows:                      (layout.line_tiles over S[:-k])
        load each input's box                      full rows, or a [P, 1] column for
                                                   an input of a row shape
        run every step                             a "row_reduce" step is one
                                                   TensorReduce along F into [P, 1];
                                                   the steps that use it take it as
                                                   their per-partition operand
        store the full outputs, and the row        (statistics a backward pass reads)
        outputs as [P, 1] columns

So a LayerNorm reads its input once and writes its output once; its mean, variance
and their row-wise arithmetic never leave SBUF. Rows must fit: every live value of a
box is L elements per partition, in rings deep enough to overlap the loads of the next
tile with the work on this one (regions.py's budget, half of SBUF). A region whose
rows do not fit raises `Unsupported` and the driver lowers its ops one by one.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

from .builder import KernelBuilder
from .elementwise import _compute
from .layout import box_offset, box_pattern, line_tiles, merge_axes
from .regions import Evaluator, Region, _itemsize, assign_slots
from .spread import spreader
from .tileops import Step
from .translate import Unsupported

DEPTHS = ((3, 2), (2, 2), (2, 1))
BUDGET_MARGIN = 16 * 1024     # SBUF bytes per partition left to [P, 1] values and constants


def emit_rows(kb: KernelBuilder, region: Region, row_axes: int) -> int:
    """Emits the row-tiled loop of `region` into `kb`; returns its FLOP count."""
    lead_n = len(region.shape) - row_axes
    row = math.prod(region.shape[lead_n:])
    if region.size == 0:
        return 0
    region = _fold_sums(region)
    depths = _depths(kb, region, lead_n, row)
    views = region.views()
    lead = merge_axes(*(v[:lead_n] for v in views))
    trail = merge_axes(*(v[lead_n:] for v in views))
    whole = ((0,) * len(trail[0]), tuple(n for _, n in trail[0]))
    row_outs = [(vid, out) for vid, out in region.outputs if vid in region.row_vids]
    ev = Evaluator(kb, region, row, depths=depths)
    spread = spreader(kb, reduces=True)
    for rbox in line_tiles([n for _, n in lead[0]], kb.target.partitions):
        boxes = [(box_offset(a, rbox), box_pattern(a, rbox)[-1:] + box_pattern(t, whole))
                 for a, t in zip(lead, trail)]
        (pstride, parts) = boxes[0][1][0]
        vals = _compute(ev, ev.load(boxes[1:]), parts, row, spread)
        ev.store(vals, boxes[0], row)
        for vid, out in row_outs:
            kb.dma(kb.ap(out, boxes[0][0] // row, ((pstride // row, parts), (1, 1))),
                   vals[vid].tile)
    ev.close()
    n_rows = region.size // row
    return sum(n_rows if len(region.inputs) + j in region.row_vids else region.size
               for j, s in enumerate(region.steps) if s.kind != "constant")


def _fold_sums(region: Region) -> Region:
    """The row sums (add reductions of a computed value), folded:

    - of a negated value used only by it: one TensorReduce with its `negate` flag
      (-(sum x) = sum(-x) exactly in FP32), the negation gone (a LayerNorm backward's
      two `-sum(...)` rows save a [P, F] instruction each);
    - of a product (x * c, c per row or an immediate; x * x), in FP32: also one ScalarE
      Activation (copy with scale c, or square) whose add-reduction gives the sum (§2.4,
      activation_reduce): the product is still written for its other readers, the
      VectorE TensorReduce goes and the multiply leaves the VectorE/GpSimd port, which
      bounds a row kernel (a LayerNorm's sum of squares, its backward's sums). The
      multiply is marked `sum_into` its reduction; regions.py emits the pair that way
      when the operands allow (FP32 [P, 1] or immediate scale)."""
    n, steps = len(region.inputs), list(region.steps)
    uses = Counter(a for s in steps for a in s.args)
    uses.update(vid for vid, _ in region.outputs)
    for j, step in enumerate(steps):
        if step.kind != "row_reduce" or step.args[0] < n or step.attrs["alu"] != "add":
            continue
        a = step.args[0]
        if steps[a - n].kind == "negate" and uses[a] == 1:
            steps[j] = step = replace(step, args=steps[a - n].args,
                                      attrs={**step.attrs, "negate": True})
            steps[a - n] = Step("folded", (), steps[a - n].dtype)
            a = step.args[0]
        prod = steps[a - n] if a >= n else None
        if prod is not None and prod.kind == "multiply" and step.dtype == prod.dtype == \
                "float32" and "sum_into" not in prod.attrs:
            steps[a - n] = replace(prod, attrs={**prod.attrs, "sum_into": n + j})
    return replace(region, steps=steps)


def _depths(kb: KernelBuilder, region: Region, lead_n: int, row: int) -> tuple[int, int]:
    """Ring depths (per input, per step slot) whose buffers of whole rows fit SBUF
    (all but BUDGET_MARGIN of it: the [P, 1] values are small): loads and compute
    overlapping across three tiles if they fit, two, or only loads ahead."""
    full = [i for i in region.inputs
            if i.t is not None and any(st for st, _ in i.axes[lead_n:])]
    ins = sum(_itemsize(i.dtype) for i in full)
    slots = len(set(assign_slots(region).values()))
    steps = slots * region.max_itemsize() + region.scratch_bytes()
    budget = kb.target.sbuf_bytes - BUDGET_MARGIN
    for in_depth, step_depth in DEPTHS:
        if (in_depth * ins + step_depth * steps) * row <= budget:
            return in_depth, step_depth
    raise Unsupported(f"rows of {row} elements do not fit SBUF ({ins} input and "
                      f"{steps} step bytes per element, one buffer each)")
