"""Fusion policy: may this producer join that consumer's fusion, and why (or why not).

The fusion pass (passes/fusion.py) is the mechanism: it grows one region per root op,
consumers first, and asks `FusionPolicy.should_fuse(producer, consumer, region)` for
every producer it meets. The answer is a `FusionDecision(ok, reason, duplicate)`; the
pass records every reason on the fusion op, allowed or forbidden (XLA's
`FusionDecision::Allow()` / `Forbid("why")`).

The rules, in the order they are checked:

    region already has `max_ops` ops                    -> forbidden: region is full
                       (splats and scalar broadcasts excepted: they cost nothing)
    an operand of a fused dot_general                   -> forbidden: read from memory
    constant: splat                                     -> fused (duplicated if shared)
              not a splat                               -> forbidden: stays in memory
    iota (not into a reshape, unless 1-D: linear-iota's -> fused: generated per tile
      flat index)                                          (duplicated if shared)
    broadcast_in_dim of a scalar or of one vector axis, -> fused as a view (duplicated
      or whose view reads rows >= MIN_RUN or a column       if shared: views are cheap)
    reshape (operand read from memory)
    elementwise of the region's shape (a same-width    -> fused
      bitcast_convert too), all users inside
              ... other users are only the function's return -> fused, extra output
              ... other users all fusible, few, cheap   -> duplicated (recomputed there)
              ... else, in a loop or row region, when   -> fused, extra output (written
                  every other user runs after it           out: GELU's residuals)
              ... otherwise                             -> forbidden: N users outside
    dot_general into an elementwise region, no other
              users, no reduce, no other dot, at most   -> fused: matmul epilogue
              MAX_EPILOGUE_INPUTS other full-size inputs
    transpose                                           -> forbidden: changes layout
    reduce along the trailing axes, row ops and views   -> fused in a "loop" region:
      of a row shape (hlo_passes/fusion_rows.py)           a row fusion, whole rows on
                                                           chip; a member also read
                                                           later is written out too
    reduce (as a producer), otherwise                   -> forbidden: needs the whole
                                                           reduction first
    anything else                                       -> forbidden: not fusible

Before the fusion pass, the attention-fusion pass (passes/attention_fusion.py) offers
each attention pattern (attention_pattern.py) to `attention(...)`: allowed ones become
one fusion of kind "attention". The pipeline gives both passes the same policy.

The policy never looks at hardware; `cost` (op -> relative per-element compute cost)
is the hook a target can pass to steer duplication.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Protocol

import numpy as np

from hlo_passes import ir
from hlo_passes.fusion_rows import MAX_ROW, reduce_rows, row_axes, row_view
from hlo_passes.verifier import ELEMENTWISE as _ELEMENTWISE

ELEMENTWISE = _ELEMENTWISE | {"abs", "is_finite", "convert", "compare", "select", "clamp"}
VIEWS = frozenset({"broadcast_in_dim", "reshape"})
REDUCE_COMBINERS = frozenset({"add", "maximum", "minimum", "multiply", "and", "or"})
FUSIBLE_USERS = ELEMENTWISE | VIEWS | {"reduce"}
TRANSCENDENTAL = frozenset({
        "exponential", "exponential_minus_one", "log", "log_plus_one", "logistic",
        "tanh", "sqrt", "rsqrt", "cbrt", "sine", "cosine", "tan", "atan2", "power"})
KINDS = ("loop", "reduction", "matmul_epilogue", "attention", "rows")
# Most full-size inputs besides the dot's value a matmul epilogue takes: a residual add
# or a gate; an AdamW update (params, two moments) fused into the gradient's matmul made
# it DMA-bound: LM embedding gradient 3.4 ms + 5.9 ms apart, 15.0 ms fused.
MAX_EPILOGUE_INPUTS = 2


@dataclass(frozen=True)
class FusionDecision:
    ok: bool
    reason: str
    duplicate: bool = False         # fuse a copy; the original stays for other users
    rows: int = 0                   # a row op: the region's trailing row axes (fusion_rows)

    @classmethod
    def allow(cls, reason: str, duplicate: bool = False, rows: int = 0) -> "FusionDecision":
        return cls(True, reason, duplicate, rows)

    @classmethod
    def forbid(cls, reason: str) -> "FusionDecision":
        return cls(False, "forbidden: " + reason)


class RegionView(Protocol):
    """What the policy sees of the region being grown."""
    shape: tuple[int, ...]          # the iteration space (a reduce's input shape)
    kind: str                       # "loop" | "reduction" | "matmul_epilogue"
    size: int                       # ops in the region so far
    dup_cost: float                 # summed cost of duplicated elementwise ops
    rows: int                       # trailing row axes once a row op joined, else 0

    def outside_users(self, op: ir.Op) -> list[ir.Op]: ...

    def inside_users(self, op: ir.Op) -> list[ir.Op]: ...

    def settled(self, op: ir.Op) -> bool:
        """True if `op` already belongs to another region (it will not fuse more)."""
        ...

    def full_inputs(self) -> int:
        """Distinct values of the region's full shape its members read from outside."""
        ...

    def after_root(self, op: ir.Op) -> bool:
        """True if `op` runs after the region's kernel: it is in another region (grown
        earlier, so rooted later) or comes after the root in program order."""
        ...


def default_cost(op: ir.Op) -> float:
    """Relative compute per element: transcendental 4, divide / remainder 2, else 1."""
    if op.kind in TRANSCENDENTAL:
        return 4.0
    return 2.0 if op.kind in ("divide", "remainder") else 1.0


def is_splat(op: ir.Op) -> bool:
    if op.kind != "constant":
        return False
    flat = np.ascontiguousarray(op.attrs["value"]).reshape(-1)
    if flat.size <= 1:
        return True
    as_bytes = flat.view(np.uint8).reshape(flat.size, -1)
    return bool((as_bytes == as_bytes[0]).all())


def is_same_width_bitcast(op: ir.Op) -> bool:
    """A bitcast_convert between types of one width (a uniform draw's mantissa bits seen
    as a float): elementwise, so the PRNG hash producing the bits fuses into the region
    that consumes them and the bits never reach memory."""
    if op.kind != "bitcast_convert":
        return False
    src, dst = op.operands[0].type, op.result.type
    if tuple(src.shape) != tuple(dst.shape) or {src.dtype, dst.dtype} & _SUB_BYTE:
        return False
    return ir.np_dtype(src.dtype).itemsize == ir.np_dtype(dst.dtype).itemsize


# Stored one value per byte on the device (jax_trn/hw/dtypes.py): their bitcasts move
# nibbles (jax_trn/lower/bitcast.py), not bytes.
_SUB_BYTE = frozenset({"int2", "uint2", "int4", "uint4", "float4_e2m1fn"})


def is_fusible_reduce(op: ir.Op) -> bool:
    """One input, one init, one result, and a body of one binary combiner."""
    if op.kind != "reduce" or len(op.operands) != 2 or len(op.regions) != 1:
        return False
    body = [o for o in op.regions[0].block.ops if o.kind not in ("return", "func.return")]
    return len(body) == 1 and body[0].kind in REDUCE_COMBINERS


def is_root(op: ir.Op) -> bool:
    """Ops a fusion region grows from (consumers of everything else fused)."""
    return (op.kind in ELEMENTWISE and len(op.results) == 1) or is_fusible_reduce(op)


def root_kind(op: ir.Op) -> str:
    return "reduction" if op.kind == "reduce" else "loop"


def region_shape(op: ir.Op) -> tuple[int, ...]:
    return tuple(op.operands[0].shape if op.kind == "reduce" else op.result.shape)


class FusionPolicy:
    """The default rules (module docstring); override methods or pass `cost`."""

    def __init__(self, max_ops: int = 256, max_dup_users: int = 3, dup_budget: float = 8.0,
                 cost: Callable[[ir.Op], float] | None = None, attention: bool = True,
                 max_row: int = MAX_ROW):
        self.max_ops, self.max_dup_users = max_ops, max_dup_users
        self.dup_budget, self.cost = dup_budget, cost or default_cost
        self.fuse_attention = attention
        self.max_row = max_row              # 0: no row fusion (fusion_rows.py)

    def attention(self, out: ir.Op, scale: float, masked: bool,
                  mask_value: np.ndarray | None) -> FusionDecision:
        """May the attention pattern ending at `out` (attention_pattern.py) become one
        "attention" fusion? `mask_value` is the mask when known at compile time."""
        if not self.fuse_attention:
            return FusionDecision.forbid("attention fusion is off")
        shape = "x".join(map(str, out.operands[0].shape))
        mask = "no mask"
        if masked:
            mask = "runtime mask"
            if mask_value is not None:
                dead = 1 - np.count_nonzero(mask_value) / max(1, mask_value.size)
                mask = f"compile-time mask, {dead:.0%} masked"
        return FusionDecision.allow(f"attention: softmax(q @ k^T * {scale:.6g}, {mask}) @ v, "
                                    f"scores {shape} stay on chip")

    def should_fuse(self, producer: ir.Op, consumer: ir.Op,
                    region: RegionView) -> FusionDecision:
        if region.size >= self.max_ops and not _free(producer):
            return FusionDecision.forbid(f"region is full ({self.max_ops} ops)")
        if any(u.kind == "dot_general" for u in region.inside_users(producer)):
            return FusionDecision.forbid("dot_general reads its operands from memory")
        kind = producer.kind
        if kind == "constant":
            return self._constant(producer, region)
        if kind == "iota":
            return self._iota(producer, consumer, region)
        if kind in VIEWS:
            return self._view(producer, consumer, region)
        if kind in ELEMENTWISE or is_same_width_bitcast(producer):
            return self._elementwise(producer, consumer, region)
        if kind == "dot_general":
            return self._dot(producer, consumer, region)
        if kind == "reduce" and self._rows_ok(region):
            return self._row_reduce(producer, region)
        return FusionDecision.forbid(_WHY_NOT.get(kind, f"{kind} is not fusible"))

    # --- per producer class ------------------------------------------------------------

    def _constant(self, op: ir.Op, region: RegionView) -> FusionDecision:
        if not is_splat(op):
            return FusionDecision.forbid("non-splat constant stays in memory")
        return _shared("splat constant", len(region.outside_users(op)))

    def _iota(self, op: ir.Op, consumer: ir.Op, region: RegionView) -> FusionDecision:
        if consumer.kind == "reshape":
            if op.result.type.rank == 1:        # arange(n) reshaped: the linear index
                return _shared("flat iota: generated in the region (GpSimd)",
                               len(region.outside_users(op)))
            return FusionDecision.forbid("a reshaped iota is generated in memory")
        if tuple(op.result.shape) != region.shape and consumer.kind not in VIEWS:
            return _wrong_shape(op, region)
        return _shared("iota: generated in the region (GpSimd)",
                       len(region.outside_users(op)))

    def _view(self, op: ir.Op, consumer: ir.Op, region: RegionView) -> FusionDecision:
        if self._rows_ok(region) and (consumer.kind == "reshape" or tuple(
                op.result.shape) != region.shape):
            if self._row_view(op, region):
                return _shared("row view: one value per partition",
                               len(region.outside_users(op)))
            if _free(op) and self._row_shape(op, region):
                return _shared("broadcast of scalar", len(region.outside_users(op)))
        if consumer.kind == "reshape":
            return FusionDecision.forbid("a fused reshape reads its operand from memory")
        if tuple(op.result.shape) != region.shape and consumer.kind not in VIEWS:
            return _wrong_shape(op, region)
        what = "reshape" if op.kind == "reshape" else _broadcast_kind(op)
        if what is None:
            return FusionDecision.forbid(
                f"broadcast of {op.operands[0].type} (only scalars, vectors, rows of "
                f">= {MIN_RUN} and columns fuse)")
        return _shared(what, len(region.outside_users(op)))

    def _elementwise(self, op: ir.Op, consumer: ir.Op, region: RegionView) -> FusionDecision:
        rows = self._row_shape(op, region)
        for user in (consumer, *region.inside_users(op)):
            if user.kind in VIEWS and not (rows and self._row_view(user, region)):
                return FusionDecision.forbid(f"{op.kind} feeds a {user.kind} "
                                             "(computed values are not re-laid out)")
        if tuple(op.result.shape) != region.shape and not rows:
            return _wrong_shape(op, region)
        what = "row elementwise: on [P, 1]" if rows else "elementwise"
        outside = region.outside_users(op)
        if not outside:
            return FusionDecision.allow(f"{what}: fused", rows=rows)
        if all(u.kind in ("return", "func.return") for u in outside):
            return FusionDecision.allow("fused; also a function result (extra output)",
                                        rows=rows)
        decision = self._duplicate(op, outside, region)
        if decision.ok:
            return replace(decision, rows=rows)
        if region.kind == "loop":
            return self._written_out(what, outside, region, rows) or decision
        return decision

    # --- rows (fusion_rows.py) ------------------------------------------------------------

    def _rows_ok(self, region: RegionView) -> bool:
        return bool(self.max_row) and region.kind == "loop"

    def _row_shape(self, op: ir.Op, region: RegionView) -> int:
        if not self._rows_ok(region) or tuple(op.result.shape) == region.shape:
            return 0
        return row_axes(tuple(op.result.shape), region.shape, region.rows, self.max_row)

    def _row_view(self, op: ir.Op, region: RegionView) -> int:
        return row_view(op, region.shape, region.rows, self.max_row)

    def _row_reduce(self, op: ir.Op, region: RegionView) -> FusionDecision:
        k = reduce_rows(op, region.shape, region.rows, self.max_row) \
            if is_fusible_reduce(op) else 0
        if not k:
            return FusionDecision.forbid(_WHY_NOT["reduce"])
        what = f"row reduction: rows of {math.prod(region.shape[-k:])} on chip"
        outside = region.outside_users(op)
        if not outside:
            return FusionDecision.allow(f"{what}: fused", rows=k)
        return self._written_out(what, outside, region, k) or FusionDecision.forbid(
            f"reduce result has {len(outside)} user(s) before the region")

    @staticmethod
    def _written_out(what: str, outside: list[ir.Op], region: RegionView,
                     rows: int) -> FusionDecision | None:
        """A loop region's member other kernels also read, when they all run after it
        (multi-output fusion): written out instead of ending the region."""
        if not all(region.after_root(u) for u in outside):
            return None
        n = len(outside)
        return FusionDecision.allow(f"{what}; also written out for {n} later "
                                    f"user{'s' * (n != 1)} (extra output)", rows=rows)

    def _duplicate(self, op: ir.Op, outside: list[ir.Op], region: RegionView
                   ) -> FusionDecision:
        n, cost = len(outside), self.cost(op)
        if region.rows and op.kind == "convert":
            cost = 0.0      # engines cast on read (§2.3): recomputing it reads the narrow type
        if n > self.max_dup_users or any(u.kind not in FUSIBLE_USERS or region.settled(u)
                                         for u in outside):
            return FusionDecision.forbid(f"producer has {n} user{'s' * (n != 1)} "
                                         "outside the region")
        if region.dup_cost + cost > self.dup_budget:
            return FusionDecision.forbid(f"producer has {n} user(s) outside the region "
                                         f"and the duplication budget is spent")
        return FusionDecision.allow(f"duplicated: recomputed here for {n} other fusible "
                                    f"user{'s' * (n != 1)} (cost {cost:g})", duplicate=True)

    def _dot(self, op: ir.Op, consumer: ir.Op, region: RegionView) -> FusionDecision:
        if region.kind == "reduction":
            return FusionDecision.forbid("a reduction does not take a matmul epilogue")
        if region.kind == "matmul_epilogue":
            return FusionDecision.forbid("region already has a dot_general")
        if region.rows:
            return FusionDecision.forbid("a row fusion does not take a matmul epilogue")
        if consumer.kind not in ELEMENTWISE or tuple(op.result.shape) != region.shape:
            return _wrong_shape(op, region)
        n = len(region.outside_users(op))
        if n:
            return FusionDecision.forbid(f"dot_general result has {n} user"
                                         f"{'s' * (n != 1)} outside the epilogue")
        extra = region.full_inputs() - 1          # the dot's own result is one
        if extra > MAX_EPILOGUE_INPUTS:
            return FusionDecision.forbid(
                f"the epilogue reads {extra} full-size inputs (> {MAX_EPILOGUE_INPUTS}): "
                "streamed through the matmul's SBUF they shrink its tiles and it turns "
                "DMA-bound (an optimizer update: params and moments)")
        return FusionDecision.allow("matmul epilogue: applied while evacuating PSUM")


_WHY_NOT = {
        "transpose": "transpose changes layout",
        "reduce": "reduce result feeds the region (needs the whole reduction first)",
}


def _shared(what: str, outside: int) -> FusionDecision:
    if not outside:
        return FusionDecision.allow(f"{what}: fused")
    return FusionDecision.allow(f"{what}: duplicated (cheap, {outside} other "
                                f"user{'s' * (outside != 1)})", duplicate=True)


def _wrong_shape(op: ir.Op, region: RegionView) -> FusionDecision:
    dims = ",".join(map(str, region.shape))
    return FusionDecision.forbid(f"shape {op.result.type} differs from the region [{dims}]")


def _free(op: ir.Op) -> bool:
    """A splat constant or a broadcast of a scalar: an immediate or a per-partition
    scalar operand inside a region, never a computed tile, so a full region still takes
    it (left out, it would be materialized in HBM at the region's full shape: threefry's
    shift amounts and key words, 10^8-sample PRNG calls)."""
    if op.kind == "constant":
        return is_splat(op)
    return op.kind == "broadcast_in_dim" and _broadcast_kind(op) == "broadcast of scalar"


def _broadcast_kind(op: ir.Op) -> str | None:
    """'broadcast of scalar', 'broadcast of vector along dim d', 'broadcast of rows of
    n' / 'broadcast of a column', or None when the region would read the source in
    short runs.

    What a region reads is the broadcast's view of its source (stride 0 along new
    dims) merged with the result's row-major axes: a [8, 128] bias over [B, S, 8, 128]
    is rows of 1024 (one long DMA run per partition), a [B, S, 1] statistic over
    [B, S, V] one value per row, like the vectors. A view whose innermost run is
    shorter than MIN_RUN elements (a [2, 3] over [4, 2, 3]) stays a kernel."""
    src = op.operands[0].shape
    big = [i for i, n in enumerate(src) if n != 1]
    if not big:
        return "broadcast of scalar"
    if len(big) == 1:
        dim = op.attrs["broadcast_dimensions"][big[0]]
        return f"broadcast of vector along dim {dim}"
    out = op.result.shape
    view = [(0, n) for n in out]
    for (stride, _), i, d in zip(_row_major(src), range(len(src)),
                                 op.attrs["broadcast_dimensions"]):
        if src[i] != 1:
            view[d] = (stride, out[d])
    merged = _merge(view, _row_major(out))
    (inner, run) = merged[-1]
    if inner == 1 and run >= MIN_RUN:
        return f"broadcast of rows of {run}"
    if inner == 0 and len(merged) == 2 and merged[0][0] == 1:
        return "broadcast of a column"
    return None


MIN_RUN = 64     # elements: shorter DMA runs are far below the DMA rate (jax_trn.hw, §3.4)


def _row_major(shape) -> list[tuple[int, int]]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append((acc, n))
        acc *= n
    return strides[::-1]


def _merge(view, out) -> list[tuple[int, int]]:
    """`view` without size-1 axes, neighbours fused where both `view` and `out` are
    contiguous across them (the region's tilings merge the same way)."""
    keep = [i for i, (_, n) in enumerate(out) if n != 1]
    merged, last = [], None
    for i in keep:
        if last is not None and view[last][0] == view[i][0] * view[i][1] and \
                out[last][0] == out[i][0] * out[i][1]:
            merged[-1] = (view[i][0], merged[-1][1] * view[i][1])
        else:
            merged.append(view[i])
        last = i
    return merged
