"""The IR spec, checked: SSA scoping, types, terminators, and per-op shape rules.

`verify(module)` raises `VerifyError` naming the op (`op.describe()`) and values as the
IR dump prints them (`ir.value_names`). Scoping follows MLIR: a block sees its own args,
earlier results in the block, and everything its enclosing blocks defined before the op
that holds the region (JAX artifacts do use outer values inside reduce/while/sort
bodies: the serializer hoists constants).
"""
from __future__ import annotations

import re
from typing import Callable

from hlo_passes import ir
from hlo_passes.effects import TERMINATORS
from hlo_passes.errors import VerifyError

Rule = Callable[[ir.Op], "str | None"]


def verify(module: ir.Module) -> None:
    """Raises VerifyError at the first broken invariant."""
    if module.entry not in module.functions:
        raise VerifyError(f"entry function @{module.entry} is missing")
    try:
        for fn in module.functions.values():
            _verify_function(fn)
    except VerifyError as e:
        raise VerifyError(_printed_names(str(e), module)) from None


def _printed_names(message: str, module: ir.Module) -> str:
    """`message` with each value's id (`Value.name`) replaced by its printed name."""
    printed = {v.name: name for v, name in ir.value_names(module).items()}
    return re.sub(r"%([\w.]+)", lambda m: "%" + printed.get(m.group(1), m.group(1)), message)


def _verify_function(fn: ir.Function) -> None:
    where = f"function @{fn.name}"
    _verify_block(fn.body, set(), set(), where)
    ret = fn.body.terminator
    if ret.kind != "func.return":
        raise VerifyError(f"{where}: ends with {ret.kind}, not func.return")
    got = [v.type for v in ret.operands]
    if got != list(fn.result_types):
        raise VerifyError(f"{where}: returns {_types(got)}, declared {_types(fn.result_types)}")
    for attrs, n, what in ((fn.arg_attrs, len(fn.args), "arg_attrs"),
                           (fn.result_attrs, len(fn.result_types), "result_attrs")):
        if attrs and len(attrs) != n:
            raise VerifyError(f"{where}: {len(attrs)} {what} for {n} values")


def _types(types) -> str:
    return "(" + ", ".join(map(str, types)) + ")"


def _verify_block(block: ir.Block, scope: set, defined: set, where: str) -> None:
    if not block.ops:
        raise VerifyError(f"{where}: empty block (no terminator)")
    local = []
    for arg in block.args:
        _define(arg, scope, defined, local, where)
    last = len(block.ops) - 1
    for i, op in enumerate(block.ops):
        _verify_op(op, scope, defined, is_last=i == last)
        for r in op.results:
            _define(r, scope, defined, local, op.describe())
    scope.difference_update(local)


def _define(v: ir.Value, scope: set, defined: set, local: list, where: str) -> None:
    if not isinstance(v.type, ir.TensorType):
        raise VerifyError(f"{where}: value %{v.name} has no TensorType")
    if v.type.dtype not in ir.DTYPES and v.type != ir.TOKEN:
        raise VerifyError(f"{where}: value %{v.name} has unknown dtype {v.type.dtype}")
    if v in defined:
        raise VerifyError(f"{where}: value %{v.name} is defined twice")
    defined.add(v)
    scope.add(v)
    local.append(v)


def _verify_op(op: ir.Op, scope: set, defined: set, is_last: bool) -> None:
    for v in op.operands:
        if v not in scope:
            raise VerifyError(f"{op.describe()}: operand %{v.name} is not defined "
                              "before its use in this scope")
    if (op.kind in TERMINATORS) != is_last:
        what = "terminator is not last" if is_last is False else "block has no terminator"
        raise VerifyError(f"{op.describe()}: {what}")
    for region in op.regions:
        for block in region.blocks:
            _verify_block(block, scope, defined, op.describe())
    rule = SHAPE_RULES.get(op.kind)
    problem = rule(op) if rule else None
    if problem:
        raise VerifyError(f"{op.describe()}: {problem}")


# ---- per-op shape rules: each returns a problem description or None ---------------

ELEMENTWISE = frozenset({
        "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum",
        "power", "atan2", "and", "or", "xor", "shift_left", "shift_right_arithmetic",
        "shift_right_logical", "negate", "exponential", "exponential_minus_one", "log",
        "log_plus_one", "logistic", "tanh", "sqrt", "rsqrt", "cbrt", "sine", "cosine",
        "tan", "floor", "ceil", "round_nearest_afz", "round_nearest_even", "sign", "not",
        "popcnt", "count_leading_zeros",
})


def _arity(op: ir.Op, n_in: int, n_out: int = 1) -> str | None:
    if len(op.operands) != n_in or len(op.results) != n_out:
        return f"expected {n_in} operands and {n_out} results"
    return None


def _elementwise(op: ir.Op) -> str | None:
    if len(op.results) != 1 or not op.operands:
        return "expected operands and one result"
    if any(v.type != op.result.type for v in op.operands):
        return "operands and result must have the same shape and dtype"
    return None


def _same_shape(op: ir.Op) -> str | None:
    return _arity(op, 1) or (None if op.operands[0].shape == op.result.shape
                             else "operand and result shapes differ")


def _compare(op: ir.Op) -> str | None:
    a, b = op.operands if len(op.operands) == 2 else (None, None)
    if a is None or len(op.results) != 1 or a.type != b.type:
        return "expected two operands of the same type"
    if op.result.type != ir.TensorType(a.shape, "bool"):
        return "result must be bool with the operands' shape"
    return None


def _select(op: ir.Op) -> str | None:
    if _arity(op, 3):
        return _arity(op, 3)
    pred, on_true, on_false = op.operands
    if pred.dtype != "bool" or pred.shape not in ((), op.result.shape):
        return "predicate must be bool, scalar or of the result shape"
    if on_true.type != op.result.type or on_false.type != op.result.type:
        return "both branches must have the result type"
    return None


def _clamp(op: ir.Op) -> str | None:
    if _arity(op, 3):
        return _arity(op, 3)
    lo, x, hi = op.operands
    if x.type != op.result.type or any(b.shape not in ((), x.shape) for b in (lo, hi)):
        return "bounds must be scalars or of the operand shape"
    return None


def _broadcast_in_dim(op: ir.Op) -> str | None:
    if _arity(op, 1):
        return _arity(op, 1)
    src, out = op.operands[0].shape, op.result.shape
    dims = tuple(op.attrs.get("broadcast_dimensions", ()))
    if len(dims) != len(src) or len(set(dims)) != len(dims):
        return f"broadcast_dimensions {dims} must map each of the {len(src)} operand dims once"
    for i, d in enumerate(dims):
        if not 0 <= d < len(out) or src[i] not in (1, out[d]):
            return f"operand dim {i} (size {src[i]}) cannot broadcast to result dim {d}"
    return None


def _dot_general(op: ir.Op) -> str | None:
    if _arity(op, 2):
        return _arity(op, 2)
    lhs, rhs = (v.shape for v in op.operands)
    lb, rb = op.attrs["lhs_batching_dimensions"], op.attrs["rhs_batching_dimensions"]
    lc, rc = op.attrs["lhs_contracting_dimensions"], op.attrs["rhs_contracting_dimensions"]
    if len(lb) != len(rb) or len(lc) != len(rc):
        return "batching/contracting dimension lists differ in length"
    for ls, rs, what in ((lb, rb, "batching"), (lc, rc, "contracting")):
        if any(not (0 <= l < len(lhs) and 0 <= r < len(rhs)) or lhs[l] != rhs[r]
               for l, r in zip(ls, rs)):
            return f"{what} dimensions {ls} x {rs} do not match in size"
    free_l = [lhs[i] for i in range(len(lhs)) if i not in lb and i not in lc]
    free_r = [rhs[i] for i in range(len(rhs)) if i not in rb and i not in rc]
    expected = tuple([lhs[i] for i in lb] + free_l + free_r)
    return None if op.result.shape == expected else f"result shape must be {expected}"


def _reduce(op: ir.Op) -> str | None:
    n = len(op.operands) // 2
    if len(op.operands) != 2 * n or len(op.results) != n or len(op.regions) != 1:
        return "expected N inputs, N inits, N results and one body"
    dims = tuple(op.attrs.get("dimensions", ()))
    shape = op.operands[0].shape
    if len(set(dims)) != len(dims) or any(not 0 <= d < len(shape) for d in dims):
        return f"dimensions {dims} out of range for rank {len(shape)}"
    kept = tuple(s for i, s in enumerate(shape) if i not in dims)
    if any(r.shape != kept for r in op.results):
        return f"result shape must be {kept}"
    if len(op.regions[0].block.args) != 2 * n:
        return f"body must take {2 * n} arguments"
    return None


def _transpose(op: ir.Op) -> str | None:
    if _arity(op, 1):
        return _arity(op, 1)
    perm = tuple(op.attrs.get("permutation", ()))
    shape = op.operands[0].shape
    if sorted(perm) != list(range(len(shape))):
        return f"permutation {perm} is not a permutation of rank {len(shape)}"
    expected = tuple(shape[p] for p in perm)
    return None if op.result.shape == expected else f"result shape must be {expected}"


def _reshape(op: ir.Op) -> str | None:
    if _arity(op, 1):
        return _arity(op, 1)
    if op.operands[0].type.size != op.result.type.size:
        return "reshape must keep the number of elements"
    return None if op.operands[0].dtype == op.result.dtype else "reshape changes dtype"


def _constant(op: ir.Op) -> str | None:
    value = op.attrs.get("value")
    t = op.result.type
    if getattr(value, "shape", None) != t.shape or value.dtype != ir.np_dtype(t.dtype):
        return "value does not match the result type"
    return None


def _iota(op: ir.Op) -> str | None:
    dim = op.attrs.get("iota_dimension", -1)
    return None if 0 <= dim < op.result.type.rank else f"iota_dimension {dim} out of range"


def _concatenate(op: ir.Op) -> str | None:
    dim, out = op.attrs.get("dimension", -1), op.result.shape
    if not 0 <= dim < len(out):
        return f"dimension {dim} out of range"
    shapes = [v.shape[:dim] + v.shape[dim + 1:] for v in op.operands]
    if any(s != out[:dim] + out[dim + 1:] for s in shapes):
        return "operands differ from the result outside the concatenated dimension"
    return None if sum(v.shape[dim] for v in op.operands) == out[dim] else "sizes do not add up"


FUSION_KINDS = ("loop", "reduction", "matmul_epilogue", "attention", "attention_bwd", "rows")


def _fusion(op: ir.Op) -> str | None:
    """One isolated region: arguments typed like the operands, returns like the results."""
    if len(op.regions) != 1 or len(op.regions[0].blocks) != 1:
        return "expected one region of one block"
    block = op.regions[0].block
    if [a.type for a in block.args] != [v.type for v in op.operands]:
        return "block arguments must have the operand types"
    if [v.type for v in block.terminator.operands] != [r.type for r in op.results]:
        return "the region must return the result types"
    if op.attrs.get("fusion_kind") not in FUSION_KINDS:
        return f"fusion_kind must be one of {FUSION_KINDS}"
    decisions = op.attrs.get("decisions", ())
    if not isinstance(decisions, tuple) or not all(isinstance(d, str) for d in decisions):
        return "decisions must be a tuple of strings"
    defined = set(block.args) | {v for inner in ir.walk(block) for v in inner.results}
    defined |= {a for inner in ir.walk(block) for r in inner.regions
                for b in r.blocks for a in b.args}
    outer = [v for inner in ir.walk(block) for v in inner.operands if v not in defined]
    return f"uses %{outer[0].name} from outside its region" if outer else None


SHAPE_RULES: dict[str, Rule] = {
        **{kind: _elementwise for kind in ELEMENTWISE},
        "abs": _same_shape, "is_finite": _same_shape, "convert": _same_shape,
        "compare": _compare, "select": _select, "clamp": _clamp,
        "broadcast_in_dim": _broadcast_in_dim, "dot_general": _dot_general,
        "reduce": _reduce, "transpose": _transpose, "reshape": _reshape,
        "constant": _constant, "iota": _iota, "concatenate": _concatenate,
        "fusion": _fusion,
}
