"""The attention pattern `softmax(mask(q @ k^T * scale)) @ v`: what the attention-fusion
pass (passes/attention_fusion.py) finds and replaces by one `fusion` op of kind
"attention", so the backend can run it flash-attention style (the [Sq, Sk] scores never
leave the chip).

The pattern, as `jax.nn.softmax` and einsum lower it (names are the values):

    s  = dot_general(q, k)        batch dims leading, contracting the last of both
    z  = s * broadcast(c)         optional, c a splat constant (the scale)
    y  = select(broadcast(mask), z, broadcast(-inf))     optional
    x  = convert(y)               optional (softmax in float32)
    m  = reduce_max(x, last dim, init -inf) [then maximum(-inf, m)]
    e  = exponential(x - broadcast(m))
    l  = reduce_add(e, last dim, init 0)
    p  = e / broadcast(l)
    p' = convert(p)               optional
    o  = dot_general(p', v)       same batch dims, contracting Sk (v's second last)

Every intermediate value must be used only inside the pattern. A mask computed from
iotas and constants only (jnp.tril, causal masks) is evaluated here, at compile time,
and becomes a `constant` operand: the backend then knows which tiles are fully masked.
The region holds the original ops (cloned), so a backend that cannot run it as
attention lowers them one by one.
"""
from __future__ import annotations

import numpy as np

from hlo_passes import ir

SHAREABLE = frozenset({"broadcast_in_dim", "reshape", "convert", "constant"})
FOLD_LIMIT = 1 << 24        # elements of a mask evaluated at compile time
_FOLDABLE = frozenset({"constant", "iota", "broadcast_in_dim", "add", "subtract",
                       "multiply", "compare", "select", "and", "or", "not", "convert",
                       "maximum", "minimum"})


class Match:
    """One attention pattern: its ops, operands and what the backend needs."""

    def __init__(self, out: ir.Op):
        self.out = out
        self.ops: list[ir.Op] = [out]
        self.q = self.k = self.v = None
        self.mask: ir.Value | None = None       # the un-broadcast [Sq, Sk] predicate
        self.mask_value: np.ndarray | None = None
        self.scale = 1.0
        self.shared: set[ir.Op] = set()         # views also used outside: cloned, kept

    def take(self, op: ir.Op | None, kind: str) -> ir.Op:
        if op is None or op.kind != kind:
            raise _NoMatch(f"expected {kind}, got {op.kind if op else 'an argument'}")
        self.ops.append(op)
        return op


class _NoMatch(Exception):
    pass


def find(block: ir.Block, producer: dict, users: dict) -> list[Match]:
    """The attention patterns of `block`, last first, sharing no ops but views of
    constants / the mask (each region clones those; dead originals go to DCE)."""
    found, used = [], set()
    for op in reversed(block.ops):
        if op.kind != "dot_general" or op in used:
            continue
        try:
            m = _match(op, producer)
        except _NoMatch:
            continue
        inner = set(m.ops)
        if any(op.kind not in SHAREABLE for op in inner & used) or \
                not _closed(m, inner, users):
            continue
        used |= inner
        found.append(m)
    return found


def _match(out: ir.Op, producer: dict) -> Match:
    m = Match(out)
    prod = lambda v: producer.get(v)  # noqa: E731
    p, m.v = out.operands
    _check_pv(out)
    p_op = prod(p)
    if p_op is not None and p_op.kind == "convert":
        p = m.take(p_op, "convert").operands[0]
    div = m.take(prod(p), "divide")
    e, lb = div.operands
    l_red = m.take(prod(_unbroadcast(m, lb, producer)), "reduce")
    summed = l_red.operands[0]
    if summed is not e and prod(summed) is not None and prod(summed).kind == "convert":
        summed = m.take(prod(summed), "convert").operands[0]     # a bf16 softmax sums in f32
    _check_reduce(l_red, e, "add", 0.0, producer, summed)
    exp = m.take(prod(e), "exponential")
    sub = m.take(prod(exp.operands[0]), "subtract")
    x, mb = sub.operands
    mv = _unbroadcast(m, mb, producer)
    mop = prod(mv)
    if mop is not None and mop.kind == "maximum":
        a, b = mop.operands
        if _splat(prod(_unbroadcast(m, a, producer, record=False)), producer) == -np.inf:
            m.take(mop, "maximum")
            _unbroadcast(m, a, producer)
            mv = b
        elif _splat(prod(_unbroadcast(m, b, producer, record=False)), producer) == -np.inf:
            m.take(mop, "maximum")
            _unbroadcast(m, b, producer)
            mv = a
    _check_reduce(m.take(prod(mv), "reduce"), x, "maximum", -np.inf, producer)
    y = x
    if prod(y) is not None and prod(y).kind == "convert":
        y = m.take(prod(y), "convert").operands[0]
    z = y
    if prod(z) is not None and prod(z).kind == "select":
        sel = m.take(prod(z), "select")
        pred, z, neg = sel.operands
        if _splat(prod(_unbroadcast(m, neg, producer)), producer) != -np.inf:
            raise _NoMatch("the select's other branch is not -inf")
        m.mask = _unbroadcast(m, pred, producer)
        _check_mask(m.mask, x.shape)
    if prod(z) is not None and prod(z).kind == "multiply":
        mul = m.take(prod(z), "multiply")
        a, b = mul.operands
        for s, other in ((b, a), (a, b)):
            c = _splat(prod(_unbroadcast(m, s, producer, record=False)), producer)
            if c is not None:
                _unbroadcast(m, s, producer)
                m.scale, z = float(c), other
                break
        else:
            raise _NoMatch("the scale is not a splat constant")
    qk = m.take(prod(z), "dot_general")
    m.q, m.k = qk.operands
    _check_qk(qk, m)
    if m.scale <= 0:
        raise _NoMatch("a non-positive scale")
    return m


def _unbroadcast(m: Match, v: ir.Value, producer: dict, record: bool = True) -> ir.Value:
    """`v` before any broadcast_in_dim / reshape / convert (the ops recorded)."""
    op = producer.get(v)
    while op is not None and op.kind in ("broadcast_in_dim", "reshape", "convert"):
        if record:
            m.ops.append(op)
        v = op.operands[0]
        op = producer.get(v)
    return v


def _splat(op: ir.Op | None, producer: dict):
    """The value of a splat constant (through converts), else None."""
    while op is not None and op.kind == "convert":
        op = producer.get(op.operands[0])
    if op is None or op.kind != "constant":
        return None
    value = np.asarray(op.attrs.get("value"))
    if value.size == 0 or not np.all(value == value.reshape(-1)[0]):
        return None
    return float(value.reshape(-1)[0])


def _check_reduce(op: ir.Op, src: ir.Value, combiner: str, init: float, producer: dict,
                  through: ir.Value | None = None) -> None:
    if len(op.operands) != 2 or (through or op.operands[0]) is not src:
        raise _NoMatch("reduce of another value")
    if tuple(op.attrs.get("dimensions", ())) != (src.type.rank - 1,):
        raise _NoMatch("reduce over other dims")
    body = op.regions[0].block.ops if op.regions else []
    if not body or body[0].kind != combiner:
        raise _NoMatch(f"reduce is not {combiner}")
    if _splat(producer.get(op.operands[1]), producer) != init:
        raise _NoMatch("reduce init")


def _dims(op: ir.Op, name: str) -> tuple[int, ...]:
    return tuple(op.attrs.get(name, ()))


def _check_qk(op: ir.Op, m: Match) -> None:
    q, k = op.operands
    nb = q.type.rank - 2
    if nb < 0 or k.type.rank != q.type.rank:
        raise _NoMatch("q, k ranks")
    batch = tuple(range(nb))
    if (_dims(op, "lhs_batching_dimensions"), _dims(op, "rhs_batching_dimensions")) != \
            (batch, batch) or _dims(op, "lhs_contracting_dimensions") != (nb + 1,) or \
            _dims(op, "rhs_contracting_dimensions") != (nb + 1,):
        raise _NoMatch("q @ k^T dimension numbers")
    if m.v.type.shape[:nb] != q.type.shape[:nb] or m.v.type.shape[nb] != k.type.shape[nb]:
        raise _NoMatch("v does not match k")


def _check_pv(op: ir.Op) -> None:
    p, v = op.operands
    nb = p.type.rank - 2
    batch = tuple(range(nb))
    if nb < 0 or v.type.rank != p.type.rank or \
            (_dims(op, "lhs_batching_dimensions"), _dims(op, "rhs_batching_dimensions")) != \
            (batch, batch) or _dims(op, "lhs_contracting_dimensions") != (nb + 1,) or \
            _dims(op, "rhs_contracting_dimensions") != (nb,):
        raise _NoMatch("p @ v dimension numbers")


def _check_mask(mask: ir.Value, shape: tuple[int, ...]) -> None:
    """The predicate broadcast along the batch dims only: [..., Sq, Sk] trailing."""
    if mask.dtype != "bool" or mask.shape[-2:] != shape[-2:] or \
            any(d != 1 for d in mask.shape[:-2]):
        raise _NoMatch("mask shape")


def _closed(m: Match, inner: set, users: dict) -> bool:
    """Every value made inside is used only inside (the output excepted), but for
    views and converts (of the mask, the scale, the -inf fill), which the region
    clones and leaves in place for their other users (`m.shared`)."""
    for op in inner:
        if op is m.out:
            continue
        for v in op.results:
            if any(u not in inner for u in users.get(v, ())):
                if op.kind not in SHAREABLE:
                    return False
                m.shared.add(op)
    return True


# --- compile-time masks ------------------------------------------------------------------

def fold(v: ir.Value, producer: dict) -> np.ndarray | None:
    """The value of `v` if it is computed from iotas and constants only (small enough)."""
    if v.type.size > FOLD_LIMIT:
        return None
    memo: dict = {}
    try:
        return _eval(v, producer, memo)
    except _NoMatch:
        return None


def _eval(v: ir.Value, producer: dict, memo: dict) -> np.ndarray:
    if v in memo:
        return memo[v]
    op = producer.get(v)
    if op is None or op.kind not in _FOLDABLE:
        raise _NoMatch("not foldable")
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
    if k == "convert":
        return args[0]
    fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
          "and": np.logical_and, "or": np.logical_or, "not": np.logical_not,
          "maximum": np.maximum, "minimum": np.minimum}[k]
    if k in ("and", "or", "not") and args[0].dtype != bool:
        raise _NoMatch("bitwise integer ops")
    return fn(*args)
