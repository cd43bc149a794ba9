"""Reduction folds: a fused reduce whose per-element work one instruction can do with
its own add-reduction, so the elements are never reduced by a separate TensorReduce.

- sum(exp(x - m)) along the free axis, m one value per row (softmax's and
  logsumexp's denominator): one ScalarE Activation per box, `exp` with bias -m and
  `reduce_res` (§2.4; costs max(MIN_II, N) + MIN_II, §6.3), where the region would run
  a VectorE subtract, a ScalarE exp, a convert and a VectorE TensorReduce. The
  Activation works in FP32 inside (no rounding of x - m or of exp to a 16-bit input
  type before the sum): for f32 the same values, for bf16 / f16 slightly more exact
  than the op-by-op region (within the CPU backend's tolerances).

- sum(convert(x)) of a 16-bit float x to FP32: the TensorReduce reads x itself (it
  widens to FP32 before adding, §2.3), no TensorCopy per box; the same values.

- sum(x) of a loaded float x (the reduce's input tensor, a region's input, or the
  widened x above): the boxes are summed on VectorE (TensorReduce, N cycles, §6.3)
  or on ScalarE (Activation copy with `reduce_res`, N + MIN_II, §2.4), whichever
  engine's running load ends first: both sum the box's FP32 values in the same order
  (the same bits), and ScalarE, otherwise idle, takes ~45% of the boxes.

`fold_source(source)` returns the source to reduce from: an `ExpSumSource` wrapping a
`RegionSource` whose region is exactly that pattern (and stores nothing else), or the
source itself. Only the rows tiling (reduce.py `_rows`) asks for `sum_box`; the other
tilings load the region's values as before.
"""
from __future__ import annotations

from jax_trn.hw import isa

from .builder import sub
from .regions import IotaTensor

_FLOATS = ("float32", "bfloat16", "float16")
NOTE = ("decision: reduce: sum(exp(x - m)) folded into one Activation(exp, bias=-m, "
        "reduce_res) per box (folding_reduce.py)")
WIDEN_NOTE = ("decision: reduce: sum(convert(x, float32)) reads x directly (the "
              "TensorReduce widens; folding_reduce.py)")


def fold_source(source):
    """An `ExpSumSource` for a region summing exp(x - m), a `WidenSumSource` for one
    summing a loaded or widened x (see module doc), else `source`."""
    match = _exp_sum(source)
    if match is not None:
        return ExpSumSource(source, *match)
    x = _widened(source)
    if x is not None or _loaded(source):
        return WidenSumSource(source, x)
    return source


def _loaded(source) -> bool:
    """Whether `source` gives its loaded float values as they are: the reduce's input
    tensor, or a region with no steps reducing a float input."""
    region = getattr(source, "region", None)
    if region is None:
        return not hasattr(source, "sum_box") and source.dtype in _FLOATS
    return not region.steps and not region.outputs and _plain(region, source.vid)


def sums_exp(region, vid: int, alu: str) -> bool:
    """Whether a reduction of `region`'s value `vid` is the sum(exp(x - m)) this module
    folds: fusion.py then leaves the region unfolded by folding.py (whose per-row
    `activation_row` would otherwise take the exp and hide the pattern)."""
    from types import SimpleNamespace
    return alu == "add" and _exp_sum(SimpleNamespace(region=region, vid=vid)) is not None


def _widened(source) -> int | None:
    """The input of a region whose only step widens it to the reduced float32."""
    region = getattr(source, "region", None)
    if region is None or region.outputs or len(region.steps) != 1:
        return None
    step, n = region.steps[0], len(region.inputs)
    if step.kind != "convert" or step.dtype != "float32" or source.vid != n:
        return None
    x = step.args[0]
    return x if _plain(region, x) and region.inputs[x].dtype != "float32" else None


def _plain(region, x: int) -> bool:
    """Whether value `x` is a float input loaded as full tiles."""
    if x >= len(region.inputs):
        return False
    inp = region.inputs[x]
    return not (inp.t is None or isinstance(inp.t, IotaTensor) or inp.is_scalar
                or inp.dtype not in _FLOATS)


def _exp_sum(source):
    """(x input, m input) of a region computing [convert](exp(x - m)) as the reduced
    value, with no other outputs; None otherwise."""
    region = getattr(source, "region", None)
    if region is None or region.outputs:
        return None
    n, steps = len(region.inputs), region.steps
    kinds = [s.kind for s in steps]
    if kinds not in (["subtract", "exponential"], ["subtract", "exponential", "convert"]):
        return None
    sub_, exp_ = steps[0], steps[1]
    if exp_.args != (n,) or source.vid != n + len(steps) - 1 or any(
            not _is_float(region.dtype(v)) for v in range(n + len(steps))):
        return None
    if len(steps) == 3 and (steps[2].args != (n + 1,) or steps[2].dtype != "float32"):
        return None
    x, m = sub_.args
    if x >= n or m >= n or x == m:
        return None
    inp = region.inputs[x]
    if inp.t is None or isinstance(inp.t, IotaTensor) or inp.is_scalar:
        return None
    return x, m


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


class ExpSumSource:
    """A `RegionSource` of sum(exp(x - m)) that can also sum a box in one Activation."""

    def __init__(self, base, x: int, m: int):
        self.base, self.x, self.m = base, x, m
        self.kb, self.dtype, self.views, self.chunk = base.kb, base.dtype, base.views, \
            base.chunk
        self.bias = self.kb.ring(2, 1, "float32")
        self.scratch = self.kb.ring(2, base.chunk, "bfloat16")
        self.note = NOTE

    def load(self, boxes) -> isa.Tile:
        return self.base.load(boxes)

    def sum_box(self, boxes, dst: isa.Tile) -> None:
        """dst[p] = sum over the box's free axis of exp(x - m[p])."""
        _note(self)
        parts = boxes[0][1][0][1]
        free = _free(boxes[0])
        loaded = self.base.ev.load(boxes[1:])
        x, m = loaded[self.x], loaded[self.m]
        if not m.scalar:                    # m varies along the row: the region's way
            self.base.kb.emit(isa.TensorReduce, dst=dst, data=self.load(boxes), op="add")
            return
        negm = sub(self.bias.next(), parts, 1)
        if m.tile is None:
            self.kb.emit(isa.Memset, dst=negm, value=-float(m.imm))
        else:
            self.kb.emit(isa.TensorScalar, dst=negm, data=sub(m.tile, parts, 1),
                         op0="multiply", operand0=-1.0)
        self.kb.emit(isa.Activation, dst=sub(self.scratch.next(), parts, free),
                     data=sub(x.tile, parts, free), func="exp", bias=negm, reduce_res=dst)

    def close(self) -> None:
        self.kb.release(self.bias, self.scratch)
        self.base.close()


def _note(source) -> None:
    """The fold's kernel note, once, when a box is first summed by it (the rows tiling;
    other tilings load the region's values and say nothing)."""
    if source.note not in source.kb.notes:
        source.kb.notes.append(source.note)


def _free(box) -> int:
    n = 1
    for _, k in box[1][1:]:
        n *= k
    return n


class WidenSumSource:
    """A source of sum(x) or sum(convert(x, float32)) (`x` the region's input, or None:
    the source's own values): boxes summed from x itself, each on VectorE or ScalarE
    (module doc)."""

    def __init__(self, base, x: int | None):
        self.base, self.x = base, x
        self.kb, self.dtype, self.views, self.chunk = base.kb, base.dtype, base.views, \
            base.chunk
        self.note = WIDEN_NOTE if x is not None else None
        self.scratch = None             # ScalarE's copy of a box (its dst), lazily
        self.busy = {"vector": 0.0, "scalar": 0.0}      # ns, this kernel's boxes

    def load(self, boxes) -> isa.Tile:
        return self.base.load(boxes)

    def sum_box(self, boxes, dst: isa.Tile) -> None:
        if self.note is not None:
            _note(self)
        parts, free = boxes[0][1][0][1], _free(boxes[0])
        if self.x is None:
            data = sub(self.base.load(boxes), parts, free)
        else:
            data = sub(self.base.ev.load(boxes[1:])[self.x].tile, parts, free)
        spec = self.kb.target.core
        ends = {e: self.busy[e] + _box_cycles(e, free, spec) / spec.clock(e)
                for e in self.busy}
        engine = min(ends, key=lambda e: (ends[e], e))
        self.busy[engine] = ends[engine]
        if engine == "vector":
            self.kb.emit(isa.TensorReduce, dst=dst, data=data, op="add")
            return
        if self.scratch is None:
            self.scratch = self.kb.ring(2, self.chunk, "bfloat16")
        self.kb.emit(isa.Activation, dst=sub(self.scratch.next(), parts, free), data=data,
                     func="copy", reduce_res=dst)

    def close(self) -> None:
        if self.scratch is not None:
            self.kb.release(self.scratch)
        self.base.close()


def _box_cycles(engine: str, n: int, spec) -> float:
    """A box's sum on `engine` (§6.3): VectorE's TensorReduce N and the MIN_II combine
    of its partial; ScalarE's activation_reduce max(MIN_II, N) + MIN_II."""
    if engine == "vector":
        return n + spec.min_ii
    return max(spec.min_ii, n) + spec.min_ii
