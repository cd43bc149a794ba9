"""Values computed from constants and iotas only, evaluated at compile time (numpy):
causal / sliding-window masks built from iota comparisons, and splat scales such as
`1 / sqrt(d)` (attention_pattern.py)."""
from __future__ import annotations

import numpy as np

from hlo_passes import ir
from hlo_passes import attention_layout as lay
from hlo_passes.attention_layout import NoMatch

FOLD_LIMIT = 1 << 24        # elements of a mask evaluated at compile time
FOLDABLE = frozenset({"constant", "iota", "broadcast_in_dim", "add", "subtract",
                       "multiply", "divide", "compare", "select", "and", "or", "not",
                       "convert", "maximum", "minimum", "sqrt", "rsqrt", "negate",
                       "reshape"})


def splat(v: ir.Value, producer: dict, m=None) -> float | None:
    """The value of `v` if it is a splat computed from constants (through broadcasts
    and converts; sqrt, divide... fold), else None. Records the views in `m`."""
    root, _, ops = lay.side_root(v, [None] * v.type.rank, producer)
    if root.type.size > 64:
        return None
    value = fold(root, producer)
    if value is None or value.size == 0:
        return None
    flat = np.asarray(value, np.float64).reshape(-1)
    if not np.all(flat == flat[0]):
        return None
    if m is not None:
        m.ops.extend(ops)
    return float(flat[0])


# --- compile-time masks ------------------------------------------------------------------

def fold(v: ir.Value, producer: dict) -> np.ndarray | None:
    """The value of `v` if it is computed from iotas and constants only (small enough)."""
    if v.type.size > FOLD_LIMIT:
        return None
    memo: dict = {}
    try:
        return _eval(v, producer, memo)
    except NoMatch:
        return None


def _eval(v: ir.Value, producer: dict, memo: dict) -> np.ndarray:
    if v in memo:
        return memo[v]
    op = producer.get(v)
    if op is None or op.kind not in FOLDABLE:
        raise NoMatch("not foldable")
    args = [_eval(a, producer, memo) for a in op.operands]
    memo[v] = out = _apply(op, args).astype(ir.np_dtype(v.dtype)).reshape(v.shape)
    return out


def _apply(op: ir.Op, args: list[np.ndarray]) -> np.ndarray:
    shape = op.results[0].shape
    k = op.kind
    if k == "constant":
        return np.broadcast_to(np.asarray(op.attrs["value"]), shape)
    if k == "iota":
        dim = op.attrs["iota_dimension"]
        return np.broadcast_to(np.arange(shape[dim]).reshape(
            [-1 if i == dim else 1 for i in range(len(shape))]), shape)
    if k == "broadcast_in_dim":
        x, dims = args[0], op.attrs["broadcast_dimensions"]
        view = [1] * len(shape)
        for i, d in enumerate(dims):
            view[d] = x.shape[i]
        return np.broadcast_to(x.reshape(view), shape)
    if k == "compare":
        fn = {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal,
              "GT": np.greater, "GE": np.greater_equal}[op.attrs["comparison_direction"]]
        return fn(*args)
    if k == "select":
        return np.where(*args)
    if k in ("convert", "reshape"):
        return args[0]
    fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
          "divide": np.divide, "sqrt": np.sqrt, "negate": np.negative,
          "rsqrt": lambda x: 1 / np.sqrt(x),
          "and": np.logical_and, "or": np.logical_or, "not": np.logical_not,
          "maximum": np.maximum, "minimum": np.minimum}[k]
    if k in ("and", "or", "not") and args[0].dtype != bool:
        raise NoMatch("bitwise integer ops")
    return fn(*args)
