"""The joint forward + backward attention graph that `jax.grad` makes of
`softmax(mask(q @ k^T * scale)) @ v`: what the attention-bwd-fusion pass
(passes/attention_bwd_fusion.py) replaces by a flash forward that also writes the rows'
logsumexp and one flash backward kernel.

The forward is attention_pattern.py's pattern (its `o` may be dead: `jax.grad` of a
loss that does not need it). Its probabilities `p` (f32, or rounded to the p @ v dtype)
and the softmax's inner values are also used by the backward, as JAX's autodiff writes
it (names are the values; `[b]` the leading batch dims, nb of them):

    dv = dot_general(do, p)   contracting Sq, then transpose(.., Sk, Dv)   [b, Sk, Dv]
         (or dot_general(p, do) contracting Sq)
    dp = dot_general(do, v)   contracting Dv                               [b, Sq, Sk]
    ds = softmax VJP of dp    any graph of elementwise ops, row reductions and views
                              over dp and the forward's values that computes
                              p * (dp - rowsum(dp * p)) (checked by evaluation, below)
    ds' = convert / select(mask, ds, 0) / multiply(ds, scale), in any order
    dq = dot_general(ds', k)  contracting Sk                               [b, Sq, D]
    dk = dot_general(ds', q)  contracting Sq                               [b, Sk, D]

The softmax VJP takes several forms (the quotient rule of `e / l` when JAX's softmax is
differentiated op by op, `p * (dp - sum(p * dp))` from its custom JVP); rather than
matching each, its ops are collected (the cone of `ds` down to dp and the forward's
values) and evaluated with numpy on random scores and `dp` with every dim shrunk to at
most 3 elements: the cone must compute p * (dp - rowsum(dp * p)) there.

Every value made inside the joint graph is used only inside it, but for `o`, dq, dk, dv
and views / converts (which the regions clone).

The forward matches any layout (attention_axes.py); the backward kernel reads q, k, v, o
as [b.., S, D] row-major and one compile-time [Sq, Sk] mask, so other layouts, GQA
groups, biases and runtime / per-head masks are near misses (`check_layout`,
`check_mask`). The forward's output is p @ v's result (`own_output`): transposes after
it stay in the program.
"""
from __future__ import annotations

import numpy as np

from hlo_passes import attention_pattern as fwd_pattern
from hlo_passes import ir
from hlo_passes.attention_fold import splat
from hlo_passes.attention_layout import row_major

_CONE = frozenset({"multiply", "divide", "add", "subtract", "negate", "convert",
                   "broadcast_in_dim", "reshape", "reduce", "constant", "exponential",
                   "maximum"})
SCALE_RTOL = 2.0 ** -8      # the backward's scale may be the forward's rounded to bf16
SHRINK = 3                  # dims longer than this are evaluated with this many elements


class NoMatch(Exception):
    """Not the joint graph; the message says why (a fusion decision's reason)."""


class BwdMatch:
    """One joint graph: the forward match, the backward's ops, inputs and outputs."""

    def __init__(self, fwd: fwd_pattern.Match, o_live: bool):
        self.fwd = fwd
        self.o_live = o_live             # the forward's p @ v is in the program
        self.do: ir.Value | None = None
        self.dq = self.dk = self.dv = None   # ir.Op producing each output
        self.ops: list[ir.Op] = []       # the backward's ops
        self.scale = 1.0                 # the scale the backward multiplies ds by
        self.shared: set[ir.Op] = set()

    @property
    def outputs(self) -> list[ir.Value]:
        return [self.dq.result, self.dk.result, self.dv.result]


def _dims(op: ir.Op, name: str) -> tuple[int, ...]:
    return tuple(op.attrs.get(name, ()))


def dot_is(op: ir.Op, lhs_c: int, rhs_c: int) -> bool:
    """`op` a dot_general with the leading dims batched, contracting lhs dim `lhs_c` and
    rhs dim `rhs_c` (counted from the first non-batch dim)."""
    if op is None or op.kind != "dot_general":
        return False
    nb = op.operands[0].type.rank - 2
    batch = tuple(range(nb))
    return nb >= 0 and op.operands[1].type.rank == nb + 2 and \
        _dims(op, "lhs_batching_dimensions") == batch and \
        _dims(op, "rhs_batching_dimensions") == batch and \
        _dims(op, "lhs_contracting_dimensions") == (nb + lhs_c,) and \
        _dims(op, "rhs_contracting_dimensions") == (nb + rhs_c,)


def candidates(block: ir.Block, producer: dict, users: dict) -> list[BwdMatch]:
    """Joint graphs of `block` whose forward matches attention_pattern.py, last first,
    with the backward not yet checked (`complete` does that)."""
    found, seen = [], set()
    dots = [op for op in reversed(block.ops) if op.kind == "dot_general"]
    for op in dots:
        try:
            m = BwdMatch(fwd_pattern._match(op, producer, users), True)
            seen.add(probs(m.fwd, producer))
        except (fwd_pattern._NoMatch, NoMatch):
            continue
        found.append(m)
    for op in dots:
        pv = _dead_o(op, producer, users)
        if pv is not None and pv.operands[0] not in seen:
            try:
                found.append(BwdMatch(fwd_pattern._match(pv, producer, users), False))
            except fwd_pattern._NoMatch:
                continue
            seen.add(pv.operands[0])
    return found


def _dead_o(dv: ir.Op, producer: dict, users: dict) -> ir.Op | None:
    """A stand-in p @ v dot (not in the block) for a dv dot (p^T do, p either operand,
    any layout) of a forward whose output is dead: v is the other operand of a dp dot
    that reads the same do; p and v are batched along the dims their dots batch do
    along, and contract p's key dim (free in the dv dot) with v's (free in dp)."""
    if dv.kind != "dot_general":
        return None
    for pi in (0, 1):
        p, do = dv.operands[pi], dv.operands[1 - pi]
        if p.type.rank < 2 or producer.get(p) is None:
            continue
        for u in users.get(do, ()):
            if u is dv or u.kind != "dot_general":
                continue
            for di in (0, 1):
                if u.operands[di] is do:
                    stand_in = _stand_in(dv, pi, u, di)
                    if stand_in is not None:
                        return stand_in
    return None


def _sides(op: ir.Op, i: int) -> tuple[tuple, tuple, list]:
    """(batch dims, contracting dims, other non-unit dims) of operand `i` of dot `op`."""
    side = ("lhs", "rhs")[i]
    b, c = _dims(op, f"{side}_batching_dimensions"), _dims(op, f"{side}_contracting_dimensions")
    shape = op.operands[i].shape
    return b, c, [d for d in range(len(shape)) if d not in b + c and shape[d] != 1]


def _stand_in(dv: ir.Op, pi: int, dp: ir.Op, di: int) -> ir.Op | None:
    p, do, v = dv.operands[pi], dv.operands[1 - pi], dp.operands[1 - di]
    pb, _, pfree = _sides(dv, pi)
    dob_dv = _sides(dv, 1 - pi)[0]
    dob_dp = _sides(dp, di)[0]
    vb, _, vfree = _sides(dp, 1 - di)
    by_do = dict(zip(dob_dp, vb))
    if len(pfree) != 1 or len(vfree) != 1 or any(d not in by_do for d in dob_dv):
        return None
    vbatch = tuple(by_do[d] for d in dob_dv)
    lhs_rest = [d for d in range(p.type.rank) if d not in pb + (pfree[0],)]
    rhs_rest = [d for d in range(v.type.rank) if d not in vbatch + (vfree[0],)]
    shape = tuple(p.shape[d] for d in pb + tuple(lhs_rest)) + \
        tuple(v.shape[d] for d in rhs_rest)
    attrs = {"lhs_batching_dimensions": pb, "rhs_batching_dimensions": vbatch,
             "lhs_contracting_dimensions": (pfree[0],),
             "rhs_contracting_dimensions": (vfree[0],), "precision_config": ()}
    return ir.Op("dot_general", [p, v], [ir.Value(ir.TensorType(shape, do.dtype))], attrs,
                 loc=dv.loc, name=dv.name)


def complete(m: BwdMatch, producer: dict, users: dict) -> None:
    """Finds the backward of `m.fwd`; raises NoMatch with the reason it is not one."""
    f = m.fwd
    own_output(f, producer)
    check_layout(f)
    p = f.pv.operands[0]
    dv_op, trans = _dv(m, p, users)
    m.do = do = dv_op.operands[0] if dv_op.operands[1] is p else dv_op.operands[1]
    dp_op = _only(users, f.v, lambda u: u is not f.pv and dot_is(u, 1, 1) and
                  u.operands[0] is do, "the dp = do @ v^T dot")
    ds_final, dq, dk = _dq_dk(f, users)
    m.dq, m.dk, m.dv = dq, dk, trans or dv_op
    m.ops = [dv_op, dp_op, dq, dk] + ([trans] if trans else [])
    ds = _ds_chain(m, ds_final, producer)
    if abs(m.scale - f.scale) > SCALE_RTOL * abs(f.scale):
        raise NoMatch(f"ds is scaled by {m.scale:.6g}, the scores by {f.scale:.6g}")
    cone = _cone(ds, f, dp_op, producer)
    m.ops += cone
    check_vjp(m, ds, dp_op.result, cone, producer)
    _check_closed(m, users)


_OPERAND_AXES = {"q": ("sq", "d"), "k": ("sk", "d"), "v": ("sk", "dv"), "out": ("sq", "dv")}


def own_output(f: fwd_pattern.Match, producer: dict) -> None:
    """Makes p @ v's result the forward's output ([b.., Sq, Dv], as the backward reads
    o): the transposes / reshapes the forward match wrote it through
    (attention_axes._output) leave the match and stay in the program."""
    if f.out is f.pv:
        return
    chain, op = set(), f.out
    while op is not f.pv:
        chain.add(op)
        op = producer[op.operands[0]]
    f.ops = [op for op in f.ops if op not in chain]
    f.out = f.pv
    sizes = [n for role, n, _ in f.axes if role in ("batch", "group", "sq", "dv")]
    strides = iter(row_major(sizes))
    for role, _, st in f.axes:
        st.pop("out", None)
        if role in ("batch", "group", "sq", "dv"):
            st["out"] = next(strides)


def check_layout(f: fwd_pattern.Match) -> None:
    """The layout the backward kernel (jax_trn/lower/attention_bwd.py) reads: q @ k^T
    and p @ v as dots of [b.., S, D] operands with the batch dims leading, q, k, v and o
    row-major in that order, no GQA group axis, no bias. The forward matches any layout
    (`f.axes`, attention_axes.py); until the backward reads strides, other layouts
    (jax.nn.dot_product_attention's [B, S, N, H]) are near misses and run op by op."""
    if f.bias is not None:
        raise NoMatch("an additive bias (the backward kernel has none)")
    if any(role == "group" for role, _, _ in f.axes):
        raise NoMatch("grouped (GQA) heads (the backward kernel has no group axis)")
    if f.out is not f.pv or not dot_is(f.qk, 1, 1) or not dot_is(f.pv, 1, 0) or \
            f.qk.operands != [f.q, f.k] or f.pv.operands[1] is not f.v:
        raise NoMatch("not q @ k^T and p @ v on [b.., S, D] operands (the backward "
                      "kernel reads no other layout yet)")
    batch = [(n, st) for role, n, st in f.axes if role == "batch"]
    by_role = {role: (n, st) for role, n, st in f.axes if role != "batch"}
    for name, value in (("q", f.q), ("k", f.k), ("v", f.v), ("out", f.pv.result)):
        axes = batch + [by_role[role] for role in _OPERAND_AXES[name]]
        sizes = tuple(n for n, _ in axes)
        if tuple(st.get(name, 0) for _, st in axes) != row_major(sizes) or \
                tuple(value.shape[-2:]) != sizes[-2:]:
            raise NoMatch(f"{name} is not laid out [b.., S, D] row-major (the backward "
                          "kernel reads no other layout yet)")


def probs(f: fwd_pattern.Match, producer: dict) -> ir.Value:
    """The operand of p @ v that is p (the softmax's divide through views)."""
    for v in f.pv.operands:
        op = producer.get(v)
        while op is not None and op is not f.probs and op.kind in ("convert", "transpose",
                                                                    "reshape"):
            op = producer.get(op.operands[0])
        if op is f.probs:
            return v
    raise NoMatch("p @ v reads no softmax")


def check_mask(f: fwd_pattern.Match, value) -> None:
    """The mask the backward kernel reads: known at compile time (`value`, folded and
    without the batch dims it does not vary along: attention_fusion._folded_mask), one
    [Sq, Sk] for every batch index."""
    if f.mask is None:
        return
    if value is None:
        raise NoMatch("a mask computed at run time (the backward kernel needs a "
                      "compile-time one)")
    roles = dict(zip(f.axis_labels, (role for role, _, _ in f.axes)))
    kept = [roles.get(lab) for lab, n in zip(f.mask_labels, value.shape) if n != 1]
    if kept != ["sq", "sk"]:
        raise NoMatch("a mask that is not one [Sq, Sk] for every batch index")


def scores(f: fwd_pattern.Match, producer: dict) -> ir.Value:
    """The value the softmax subtracts its row max from (the masked, scaled scores)."""
    exp = producer[f.probs.operands[0]]
    return producer[exp.operands[0]].operands[0]


def _only(users: dict, v: ir.Value, pred, what: str) -> ir.Op:
    found = [u for u in users.get(v, ()) if pred(u)]
    if len(found) != 1:
        raise NoMatch(f"{len(found)} candidates for {what}")
    return found[0]


def _dv(m: BwdMatch, p: ir.Value, users: dict) -> tuple[ir.Op, ir.Op | None]:
    """The dv dot (dot(do, p) then a transpose, or dot(p, do)) reading p."""
    cands = [u for u in users.get(p, ()) if u is not m.fwd.pv and u.kind == "dot_general"]
    if len(cands) != 1 or not dot_is(cands[0], 0, 0):
        raise NoMatch("p is not read by one dv = p^T @ do dot")
    dv = cands[0]
    if dv.operands[0] is p:
        return dv, None
    nb = p.type.rank - 2
    t = users.get(dv.result, [])
    perm = tuple(range(nb)) + (nb + 1, nb)
    if len(t) == 1 and t[0].kind == "transpose" and tuple(t[0].attrs["permutation"]) == perm:
        return dv, t[0]
    raise NoMatch("dv = do^T @ p is not transposed to [.., Sk, Dv]")


def _dq_dk(f: fwd_pattern.Match, users: dict) -> tuple[ir.Value, ir.Op, ir.Op]:
    """(ds', dq dot, dk dot): dot(ds', k) contracting Sk and dot(ds', q) contracting Sq."""
    qk = f.qk
    dqs = [u for u in users.get(f.k, ()) if u is not qk and dot_is(u, 1, 0) and
           u.operands[1] is f.k]
    for dq in dqs:
        ds = dq.operands[0]
        dks = [u for u in users.get(f.q, ()) if u is not qk and dot_is(u, 0, 0) and
               u.operands == [ds, f.q]]
        if len(dks) == 1:
            return ds, dq, dks[0]
    raise NoMatch("no dq = ds @ k and dk = ds^T @ q dots sharing ds")


def _ds_chain(m: BwdMatch, v: ir.Value, producer: dict) -> ir.Value:
    """`v` before converts, a select(mask, ., 0) and multiplies by a splat (m.scale)."""
    while True:
        op = producer.get(v)
        if op is None:
            return v
        if op.kind == "convert":
            nxt = op.operands[0]
        elif op.kind == "select" and splat(op.operands[2], producer) == 0.0 and \
                m.fwd.mask is not None and _under_views(op.operands[0], producer) is m.fwd.mask:
            splat(op.operands[2], producer, m)
            _view_src(op.operands[0], producer, m)
            nxt = op.operands[1]
        elif op.kind == "multiply":
            a, b = op.operands
            ca, cb = splat(a, producer), splat(b, producer)
            if cb is None and ca is None:
                return v
            c, nxt = (cb, a) if cb is not None else (ca, b)
            splat(b if cb is not None else a, producer, m)
            m.scale *= c
        else:
            return v
        m.ops.append(op)
        v = nxt


def _under_views(v: ir.Value, producer: dict) -> ir.Value:
    """`v` before broadcasts / reshapes / converts (as attention_pattern finds the mask)."""
    op = producer.get(v)
    while op is not None and op.kind in ("broadcast_in_dim", "reshape", "convert"):
        v = op.operands[0]
        op = producer.get(v)
    return v


def _view_src(v: ir.Value, producer: dict, m: BwdMatch | None) -> ir.Op | None:
    """The op under broadcasts / reshapes / converts of `v` (recorded in `m.ops`)."""
    op = producer.get(v)
    while op is not None and op.kind in ("broadcast_in_dim", "reshape", "convert"):
        if m is not None:
            m.ops.append(op)
        op = producer.get(op.operands[0])
    return op


def _cone(ds: ir.Value, f: fwd_pattern.Match, dp: ir.Op, producer: dict) -> list[ir.Op]:
    """The ops computing `ds` from dp and the forward's values (and constants)."""
    fwd_ops, seen, out = set(f.ops), set(), []
    stack = [ds]
    while stack:
        v = stack.pop()
        op = producer.get(v)
        if op is None or op is dp or op in fwd_ops or op in seen:
            if op is None:
                raise NoMatch("ds depends on a value outside the attention")
            continue
        if op.kind not in _CONE or (op.kind == "reduce" and len(op.operands) != 2):
            raise NoMatch(f"the softmax VJP uses {op.kind}")
        seen.add(op)
        out.append(op)
        stack.extend(op.operands)
    return out


def _check_closed(m: BwdMatch, users: dict) -> None:
    """Values made inside are used only inside, but for the outputs and views /
    converts of what comes from outside (the mask, constants), which stay for their
    other users; a view of an inner value (p's convert) used outside is not allowed."""
    inner = set(m.fwd.ops) | set(m.ops)
    outs = {m.fwd.out, m.dq, m.dk, m.dv}
    made = fwd_pattern.inner_made(inner)
    for op in inner:
        if op in outs:
            continue
        for v in op.results:
            if any(u not in inner for u in users.get(v, ())):
                if v in made or op.kind not in fwd_pattern.SHAREABLE:
                    raise NoMatch(f"%{v.name} ({op.kind}) is also used outside")
                m.shared.add(op)


# --- the softmax VJP, checked by evaluation -------------------------------------------

def check_vjp(m: BwdMatch, ds: ir.Value, dp: ir.Value, cone: list[ir.Op],
              producer: dict) -> None:
    """The cone computes p * (dp - rowsum(dp * p)) on shrunk random data."""
    f = m.fwd
    x = scores(f, producer)
    rng = np.random.default_rng(0)
    env = {x: rng.standard_normal(_shrunk(x.shape)),
           dp: rng.standard_normal(_shrunk(dp.shape))}
    order = [op for op in _topo(f.ops, producer) if op is not f.pv] + \
        _topo(cone, producer)
    for op in order:
        if op.results[0] in env or op.kind == "dot_general":
            continue
        args = [_value(a, env, producer) for a in op.operands]
        if any(a is None for a in args) or op.kind not in _CONE:
            continue
        env[op.results[0]] = _eval(op, args)
    p = env.get(f.pv.operands[0])
    got = env.get(ds)
    if p is None or got is None:
        raise NoMatch("the softmax VJP could not be evaluated")
    p = p.reshape(got.shape)
    dpv = env[dp].reshape(got.shape)
    want = p * (dpv - (dpv * p).sum(-1, keepdims=True))
    if not np.allclose(got, want, rtol=1e-6, atol=1e-9):
        raise NoMatch("ds is not p * (dp - rowsum(dp * p))")


def _value(v: ir.Value, env: dict, producer: dict):
    """`v` from `env`, or evaluated if it is a constant."""
    if v not in env:
        op = producer.get(v)
        if op is None or op.kind != "constant":
            return None
        env[v] = _eval(op, [])
    return env[v]


def _topo(ops, producer: dict) -> list[ir.Op]:
    """`ops` with every op after the ops of the list that produce its operands."""
    ops, done, out = list(dict.fromkeys(ops)), set(), []
    inside = set(ops)

    def visit(op):
        if op in done:
            return
        done.add(op)
        for a in op.operands:
            prod = producer.get(a)
            if prod in inside:
                visit(prod)
        out.append(op)
    for op in ops:
        visit(op)
    return out


def _shrunk(shape) -> tuple[int, ...]:
    return tuple(min(n, SHRINK) for n in shape)


def _eval(op: ir.Op, args: list) -> np.ndarray:
    shape = _shrunk(op.results[0].shape)
    k = op.kind
    if k == "constant":
        value = np.asarray(op.attrs["value"], np.float64)
        if value.size and np.all(value == value.reshape(-1)[0]):
            return np.full(shape, value.reshape(-1)[0])
        raise NoMatch("a non-splat constant in the softmax VJP")
    if k == "broadcast_in_dim":
        view = [1] * len(shape)
        for i, d in enumerate(op.attrs["broadcast_dimensions"]):
            view[d] = args[0].shape[i]
        return np.broadcast_to(args[0].reshape(view), shape)
    if k == "reshape":
        if args[0].size != int(np.prod(shape)):
            raise NoMatch("a reshape that is not of unit dims")
        return args[0].reshape(shape)
    if k == "reduce":
        body = op.regions[0].block.ops[0].kind if op.regions else ""
        fn = {"add": np.sum, "maximum": np.max}.get(body)
        if fn is None:
            raise NoMatch(f"a reduce of {body}")
        dims = tuple(op.attrs["dimensions"])
        return fn(args[0], axis=dims) if fn is np.max else args[1] + fn(args[0], axis=dims)
    if k == "convert":
        return args[0]
    fn = {"multiply": np.multiply, "divide": np.divide, "add": np.add,
          "subtract": np.subtract, "negate": np.negative, "exponential": np.exp,
          "maximum": np.maximum}[k]
    with np.errstate(all="ignore"):
        return fn(*args)
