"""The attention pattern `softmax(mask(q @ k^T * scale + bias)) @ v`, as libraries write
it: what the attention-fusion pass (passes/attention_fusion.py) finds and replaces by
one `fusion` op of kind "attention", so the backend runs it flash-attention style (the
[Sq, Sk] scores never leave the chip).

The pattern (names are the values; "views" are converts, transposes and reshapes of
unit dims, anywhere between the dots; labels follow the dims, attention_layout.py):

    s  = dot_general(q', k')      any batch / free dim order, either operand first
         q', k' = q, k through reshapes / transposes and a splat scale (read in place)
    z  = s * c, s / c             optional, c a splat constant (sqrt(d) folds)
    z  = z + bias                 optional, a broadcast of a runtime value
    y  = select(mask, z, fill)    optional; fill -inf or a large negative finite
                                  (<= FILL_LIMIT), mask boolean (iotas fold, inputs stay)
    m  = reduce_max(y, key dim) [then maximum(-inf, m)]
    e  = exponential(y - broadcast(m))
    l  = reduce_add(e or convert(e), key dim)
    p  = e / broadcast(l)
    o  = dot_general(p, v) or dot_general(v, p), contracting the key dim
    out = o through transposes / reshapes (written in place)

Every intermediate value must be used only inside the pattern. The match records the
canonical axes (batch, GQA groups, Sq, Sk, D, Dv) with the strides of every operand,
so the kernel reads q / k / v and writes the result in the program's layout. A mask
computed from iotas and constants only (jnp.tril, causal masks) is evaluated at compile
time by `fold` (the backend then skips fully masked tiles). The region holds the
original ops (cloned): a backend that cannot run it as attention lowers them one by one.
"""
from __future__ import annotations

import numpy as np

from hlo_passes import ir
from hlo_passes import attention_axes as axes
from hlo_passes import attention_layout as lay
from hlo_passes.attention_fold import FOLDABLE, fold, splat  # noqa: F401 (API)
from hlo_passes.attention_layout import NoMatch as _NoMatch

SHAREABLE = frozenset({"broadcast_in_dim", "reshape", "convert", "constant"})
FILL_LIMIT = -1e6           # a finite fill must be this negative: exp(fill - max) == 0


class Match:
    """One attention pattern: its ops, operands and what the backend needs.

    The stable API (the backward pass builds on it):
        out     the op whose result the fusion replaces (p @ v, or the last transpose /
                reshape after it)
        ops     every op of the pattern (cloned into the fusion's region)
        q, k, v the fusion's inputs (before the views / scale that led to the dots)
        mask    the boolean predicate before its broadcasts, or None
        scale   the scores' scale (1.0 if none; a scale of q or k included)
    and, since layouts are free (issue 15):
        qk, pv  the two dots; probs the softmax's divide
        fill    what masked scores become: -inf or a finite value <= FILL_LIMIT
        bias    an additive bias before its broadcasts, or None
        dropout what the probabilities are multiplied by before p @ v (before its
                broadcasts: flax's keep / keep_prob, or the boolean keep of a
                select(keep, p / keep_prob, 0), then dropout_scale = 1 / keep_prob),
                or None
        axes    [(role, size, {operand: stride})], role in attention_layout.ROLES,
                operands in attention_layout.OPERANDS (attention_axes.py)
        mask_labels, bias_labels   labels of the mask / bias dims (None: broadcast)
    """

    def __init__(self, out: ir.Op):
        self.out = self.pv = out
        self.qk: ir.Op | None = None
        self.probs: ir.Op | None = None         # p = e / l: its operands are score-shaped
        self.ops: list[ir.Op] = [out]
        self.q = self.k = self.v = None
        self.mask: ir.Value | None = None
        self.mask_labels: list = []
        self.mask_value: np.ndarray | None = None
        self.bias: ir.Value | None = None
        self.bias_labels: list = []
        self.dropout: ir.Value | None = None    # p @ v reads p * (dropout * dropout_scale)
        self.dropout_labels: list = []
        self.dropout_scale = 1.0
        self.drop_op: ir.Op | None = None       # the multiply / select dropping p out
        self.drop_x: ir.Value | None = None     # the probabilities it drops out
        self.drop_labels: list = []             # their labels (those of drop_op)
        self.fill = -np.inf
        self.scale = 1.0
        self.axes: list = []
        self.axis_labels: list = []             # the labels of `axes`
        self.shared: set[ir.Op] = set()         # views also used outside: cloned, kept

    def take(self, op: ir.Op | None, kind: str) -> ir.Op:
        if op is None or op.kind != kind:
            raise _NoMatch(f"expected {kind}, got {op.kind if op else 'an argument'}")
        self.ops.append(op)
        return op

    def snapshot(self) -> dict:
        return {**self.__dict__, "ops": list(self.ops)}

    def restore(self, state: dict) -> None:
        self.__dict__.update(state)


def find(block: ir.Block, producer: dict, users: dict,
         near: list | None = None) -> list[Match]:
    """The attention patterns of `block`, last first, sharing no ops but views of
    constants / the mask (each region clones those; dead originals go to DCE).
    `near` (optional) gets (p @ v dot, reason) for each near miss: a softmax(...) @ v
    that does not fit the pattern."""
    found, used = [], set()
    for op in reversed(block.ops):
        if op.kind != "dot_general" or op in used:
            continue
        try:
            m = _match(op, producer, users)
        except _NoMatch as e:
            if near is not None and getattr(e, "close", False):
                near.append((op, str(e)))
            continue
        inner = set(m.ops)
        if any(op.kind not in SHAREABLE for op in inner & used) or \
                not _closed(m, inner, users):
            if near is not None:
                near.append((op, DROPOUT if m.dropout is not None else
                             "a value inside the pattern is also used outside it"))
            continue
        used |= inner
        found.append(m)
    return found


def _match(pv: ir.Op, producer: dict, users: dict) -> Match:
    """`pv` as the p @ v dot of a pattern, p either operand."""
    errors = []
    for pi in (0, 1):
        try:
            return _match_as(pv, pi, producer, users)
        except _NoMatch as e:
            errors.append(e)
    close = [e for e in errors if getattr(e, "close", False)]
    raise (close or errors)[0]


def _match_as(pv: ir.Op, pi: int, producer: dict, users: dict) -> Match:
    """`pv` with p its operand `pi`: labels p's dims, walks back through the softmax
    and the scores to q @ k^T, then lays out the axes (attention_axes.py)."""
    m = Match(pv)
    p = pv.operands[pi]
    sides = ("lhs", "rhs") if pi == 0 else ("rhs", "lhs")
    pb, pc = _dims(pv, f"{sides[0]}_batching_dimensions"), \
        _dims(pv, f"{sides[0]}_contracting_dimensions")
    if len(pc) != 1 or len(_dims(pv, f"{sides[1]}_contracting_dimensions")) != 1:
        raise _NoMatch("p @ v contracts more than the key dim")
    labels = [None if n == 1 else ("f", d) for d, n in enumerate(p.shape)]
    for j, d in enumerate(pb):
        labels[d] = ("b", j) if p.shape[d] != 1 else None
    labels[pc[0]] = "sk"
    x, lx = _softmax(m, p, labels, producer)
    try:                                # a softmax @ v: a miss from here on is close
        qk, lqk = _scores(m, x, lx, producer, frozenset())
        m.qk = qk
        axes.build(m, qk, lqk, pi, producer, users)
        if m.scale <= 0:
            raise _NoMatch("a non-positive scale")
    except _NoMatch as e:
        e.close = True
        raise
    return m


def _score_views(m: Match, v: ir.Value, labels: list, producer: dict):
    """`v` and its labels before converts / transposes / unit reshapes (recorded)."""
    op = producer.get(v)
    while op is not None and op.kind in ("convert", "transpose", "reshape"):
        labels = lay.view_back(op, labels)
        m.ops.append(op)
        v = op.operands[0]
        op = producer.get(v)
    return v, labels


def _softmax(m: Match, p: ir.Value, labels: list, producer: dict):
    """(x, labels): p = softmax(x) over the key dim."""
    p, labels = _score_views(m, p, labels, producer)
    kept = _dropout(m, producer.get(p), p, labels, producer)
    if kept is not p:
        p, labels = _score_views(m, kept, labels, producer)
    div = m.probs = m.take(producer.get(p), "divide")
    e, lb = div.operands
    _reduced(m, lb, e, labels, "add", 0.0, producer)
    exp = m.take(producer.get(e), "exponential")
    sub = m.take(producer.get(exp.operands[0]), "subtract")
    x, mb = sub.operands
    _reduced(m, mb, x, labels, "maximum", -np.inf, producer)
    return x, labels


DROPOUT = ("the dropped-out probabilities are also used outside the pattern, by a "
           "backward the flash backward did not take (attention_bwd_decisions say why)")


def _dropout(m: Match, op: ir.Op | None, p: ir.Value, labels: list,
             producer: dict) -> ir.Value:
    """The probabilities: `p` itself, or what `op` drops out when it is a dropout
    of a softmax whose scores are q @ k^T -- flax's `p * (keep / keep_prob)` (either
    operand; recorded as `m.dropout`, its root before broadcasts) or nn.Dropout's /
    jnp.where's `select(keep, p / keep_prob, 0)` (the boolean keep, `dropout_scale`
    1 / keep_prob)."""
    if op is None or op.kind not in ("multiply", "select", "divide"):
        return p
    outer = _scaled_select(op, producer)
    if outer is not None:                   # select(keep, p, 0) / keep_prob
        select, factor = outer
        pred, kept, zero = select.operands
        options = [(kept, pred, [select], factor)]
        scaled = op
    elif op.kind == "divide":
        return p
    elif op.kind == "select":
        pred, kept, zero = op.operands
        scaled = producer.get(kept)
        factor = None if scaled is None or scaled.kind not in ("divide", "multiply") \
            else splat(scaled.operands[1], producer)
        if splat(zero, producer) != 0.0 or not factor:
            return p
        options = [(scaled.operands[0], pred, [scaled],
                    1.0 / factor if scaled.kind == "divide" else factor)]
    else:
        a, b = op.operands
        options = [(a, b, [], 1.0), (b, a, [], 1.0)]
    for x, w, more, factor in options:
        probe = Match(m.pv)
        try:
            y, ly = _softmax(probe, x, labels, producer)
            _scores(probe, y, ly, producer, frozenset())
        except _NoMatch:
            continue
        root, rl, views = lay.side_root(w, labels, producer)
        if any(lab is not None and lab not in labels for lab in rl):
            continue
        m.ops += [op, *more, *views]
        if op.kind == "select":             # the zero and keep_prob's views
            splat(op.operands[2], producer, m)
            splat(scaled.operands[1], producer, m)
        elif more:                          # (select(keep, p, 0) / keep_prob)'s
            splat(more[0].operands[2], producer, m)
            splat(op.operands[1], producer, m)
        m.dropout, m.dropout_labels, m.dropout_scale = root, rl, factor
        m.drop_op, m.drop_x, m.drop_labels = op, x, list(labels)
        return x
    return p


def _scaled_select(op: ir.Op, producer: dict):
    """(select, factor) when `op` is `select(keep, p, 0)` divided or multiplied by a
    splat (the scaling after the select: `jnp.where(keep, p, 0) / keep_prob`), else
    None; factor is what the kept values are multiplied by."""
    if op.kind not in ("divide", "multiply"):
        return None
    inner = producer.get(op.operands[0])
    f = splat(op.operands[1], producer)
    if inner is None or inner.kind != "select" or not f:
        return None
    if splat(inner.operands[2], producer) != 0.0:
        return None
    return inner, (1.0 / f if op.kind == "divide" else f)


def _reduced(m: Match, v: ir.Value, elem: ir.Value, labels: list, combiner: str,
             init: float, producer: dict) -> ir.Op:
    """The reduce (over the key dim) of `elem` (labels `labels`), or of a view of it,
    whose result `v` broadcasts back to `labels`."""
    root, rl, ops = lay.side_root(v, labels, producer)
    m.ops.extend(ops)
    op = producer.get(root)
    if combiner == "maximum" and op is not None and op.kind == "maximum":
        for a, b in (op.operands, op.operands[::-1]):
            if splat(a, producer, m) == -np.inf:
                m.ops.append(op)
                root, rl, ops = lay.side_root(b, rl, producer)
                m.ops.extend(ops)
                op = producer.get(root)
                break
    red = m.take(op, "reduce")
    dims = tuple(red.attrs.get("dimensions", ()))
    body = red.regions[0].block.ops if red.regions else []
    if len(red.operands) != 2 or len(dims) != 1 or not body or body[0].kind != combiner:
        raise _NoMatch(f"not a reduce_{combiner} over one dim")
    src = _source_labels(m, red.operands[0], elem, labels, producer)
    if src[dims[0]] != "sk" or splat(red.operands[1], producer) != init:
        raise _NoMatch(f"reduce_{combiner} over another dim or from another init")
    kept = [lab for i, lab in enumerate(src) if i != dims[0]]
    if any(r != k and n != 1 for r, k, n in zip(rl, kept, root.shape)):
        raise _NoMatch("the reduction broadcasts back along other dims")
    return red


def _source_labels(m: Match, src: ir.Value, elem: ir.Value, labels: list,
                   producer: dict) -> list:
    """The labels of a reduce's operand `src`: `elem` itself, a view `elem` was made
    from (XLA reduces before a transpose), or convert(elem) (a bf16 softmax sums in f32)."""
    v, lab = elem, labels
    while v is not src:
        op = producer.get(v)
        if op is None or op.kind not in ("convert", "transpose", "reshape"):
            break
        lab, v = lay.view_back(op, lab), op.operands[0]
    if v is src:
        return lab
    op = producer.get(src)
    if op is not None and op.kind == "convert" and op.operands[0] is elem:
        m.ops.append(op)
        return labels
    raise _NoMatch("the reduce is of another value")


def _scores(m: Match, x: ir.Value, labels: list, producer: dict, seen: frozenset):
    """(q @ k^T dot, its labels), recording scale, bias and mask on the way back."""
    x, labels = _score_views(m, x, labels, producer)
    op = producer.get(x)
    kind = op.kind if op is not None else None
    if kind == "dot_general":
        m.ops.append(op)
        return op, labels
    if kind == "select" and "mask" not in seen:
        return _select(m, op, labels, producer, seen)
    if kind in ("multiply", "divide") and "scale" not in seen:
        a, b = op.operands
        for c, z in ((b, a), (a, b))[:1 + (kind == "multiply")]:
            value = splat(c, producer, m)
            if value is not None:
                m.ops.append(op)
                m.scale *= value if kind == "multiply" else 1.0 / value
                return _scores(m, z, labels, producer, seen | {"scale"})
        raise _NoMatch("the scale is not a splat constant")
    if kind == "add" and "bias" not in seen:
        return _add(m, op, labels, producer, seen)
    raise _NoMatch(f"{kind or 'an argument'} before the softmax")


def _select(m: Match, op: ir.Op, labels: list, producer: dict, seen: frozenset):
    pred, z, fill = op.operands
    value = splat(fill, producer, m)
    if value is None or value > FILL_LIMIT:
        raise _NoMatch("the mask's fill is not -inf or a large negative constant")
    if "bias" in seen and value != -np.inf:
        raise _NoMatch("a bias added after a finite mask fill")
    m.ops.append(op)
    m.fill = value * m.scale if "scale" in seen else value
    m.mask, m.mask_labels = _mask_root(m, pred, labels, producer)
    if m.mask.dtype != "bool":
        raise _NoMatch("a mask that is not boolean")
    return _scores(m, z, labels, producer, seen | {"mask"})


def _mask_root(m: Match, pred: ir.Value, labels: list, producer: dict):
    """The predicate before its broadcasts and `and`s with all-true constants (as
    jax.nn.dot_product_attention combines a mask= with its default one)."""
    while True:
        root, labels, ops = lay.side_root(pred, labels, producer)
        m.ops.extend(ops)
        op = producer.get(root)
        if op is not None and _bool_roundtrip(op, producer):
            m.ops.append(op)
            splat(op.operands[1], producer, m)
            pred = producer[op.operands[0]].operands[0]
            m.ops.append(producer[op.operands[0]])
            continue
        if op is None or op.kind != "and":
            return root, labels
        a, b = op.operands
        if splat(a, producer) == 1.0:
            pred = b
        elif splat(b, producer) == 1.0:
            pred = a
        else:
            return root, labels
        m.ops.append(op)
        splat(a if pred is b else b, producer, m)


def _bool_roundtrip(op: ir.Op, producer: dict) -> bool:
    """compare(convert(b), 0, NE) of a boolean b (flax's masks go through floats)."""
    if op.kind != "compare" or op.attrs.get("comparison_direction") != "NE":
        return False
    conv = producer.get(op.operands[0])
    return conv is not None and conv.kind == "convert" and \
        conv.operands[0].dtype == "bool" and splat(op.operands[1], producer) == 0.0


def _add(m: Match, op: ir.Op, labels: list, producer: dict, seen: frozenset):
    """An additive bias: either operand may be the scores."""
    if "scale" in seen:
        raise _NoMatch("a bias under the scale")
    m.ops.append(op)
    error = None
    for zi in (0, 1):
        state = m.snapshot()
        try:
            m.bias, m.bias_labels, ops = lay.side_root(op.operands[1 - zi], labels, producer)
            m.ops.extend(ops)
            return _scores(m, op.operands[zi], labels, producer, seen | {"bias"})
        except _NoMatch as e:
            m.restore(state)
            error = error or e
    raise error


def _dims(op: ir.Op, name: str) -> tuple[int, ...]:
    return tuple(op.attrs.get(name, ()))


def _closed(m: Match, inner: set, users: dict) -> bool:
    """Every value made inside is used only inside (the output excepted), but for
    views and converts (of the mask, the scale, the -inf fill), which the region
    clones and leaves in place for their other users (`m.shared`). A view of an inner
    value (p's convert read by a hand-written backward) is not shareable: it goes
    with the pattern."""
    made = inner_made(inner)
    for op in inner:
        if op is m.out:
            continue
        for v in op.results:
            if any(u not in inner for u in users.get(v, ())):
                if op.kind not in SHAREABLE or v in made:
                    return False
                m.shared.add(op)
    return True


def inner_made(inner: set) -> set:
    """Results of the ops `inner` that depend on one of them that is not SHAREABLE:
    removing the pattern's ops removes these values."""
    producer = {v: op for op in inner for v in op.results}
    memo: dict = {}

    def made(op) -> bool:
        if op not in memo:
            memo[op] = False
            memo[op] = op.kind not in SHAREABLE or any(
                made(producer[v]) for v in op.operands if v in producer)
        return memo[op]
    return {v for op in inner if made(op) for v in op.results}

