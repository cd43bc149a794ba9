"""The joint forward + backward attention graph that `jax.grad` makes of
`softmax(mask(q @ k^T * scale + bias)) @ v`: what the attention-bwd-fusion pass
(passes/attention_bwd_fusion.py) replaces by a flash forward that also writes the rows'
logsumexp and one flash backward kernel.

The forward is attention_pattern.py's pattern in any layout (its `o` may be dead:
`jax.grad` of a loss that does not need it). Its probabilities `p` (f32, or rounded to
the p @ v dtype) and the softmax's inner values are also used by the backward, as JAX's
autodiff writes it (names are the values; each dot may batch, contract and keep its
dims in any order, its operands and result may be views):

    dv = dot_general(p, do)   contracting the query dims (Sq and GQA groups); with a
                              dropout p is the dropped-out p (what p @ v reads)
    dp = dot_general(do, v)   contracting Dv (do: a view of dv's do)
    ds = softmax VJP of dp    any graph of elementwise ops, row reductions and views
                              over dp and the forward's values that computes
                              p * (dp - rowsum(dp * p)) (checked by evaluation, below;
                              with a dropout, dp * W for dp, W its multiplier, and p
                              the undropped softmax)
    ds' = convert / transpose / unit reshape / select(mask, ds, 0) / ds * c, ds / c
    dq = dot_general(ds', k)  contracting Sk
    dk = dot_general(ds', q)  contracting the query dims (GQA: dk summed over groups)

Every dim of these dots is labelled with the forward's labels (attention_bwd_labels.py):
q, k, v views by their strides in the forward's buffers, p as the forward labels it,
do and ds' by pairing with them; dq, dk, dv must come out with exactly q's, k's, v's
labels, and their strides (through the views after each dot) go to the kernel, which
reads and writes in the program's layout.

The softmax VJP takes several forms (the quotient rule of `e / l` when JAX's softmax is
differentiated op by op, `p * (dp - sum(p * dp))` from its custom JVP); rather than
matching each, its ops are collected (the cone of `ds` down to dp and the forward's
values) and evaluated with numpy on random scores and `dp` with every dim shrunk to at
most 3 elements, p, dp and ds put in one dim order by their labels: the cone must
compute p * (dp - rowsum(dp * p)) there.

Every value made inside the joint graph is used only inside it, but for `o`, dq, dk, dv
and views / converts (which the regions clone): a gradient of the bias (ds itself, used
outside) is a near miss.
"""
from __future__ import annotations

from hlo_passes import attention_bwd_labels as L
from hlo_passes import attention_pattern as fwd_pattern
from hlo_passes import ir
from hlo_passes.attention_bwd_labels import NoMatch
from hlo_passes.attention_bwd_vjp import CONE, check_vjp
from hlo_passes.attention_fold import splat
from hlo_passes.attention_layout import forward_strides, row_major, view_back

SCALE_RTOL = 2.0 ** -8      # the backward's scale may be the forward's rounded to bf16


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
        self.labels: dict = {}           # "q" / "k" / "v": the labels of their dims
        self.strides: dict = {}          # "do", "dq", "dk", "dv": {label: stride}
        self.mask_ops: set[ir.Op] = set()   # computing from the mask only (mask_ops)

    @property
    def outputs(self) -> list[ir.Value]:
        return [self.dq.result, self.dk.result, self.dv.result]


def _dims(op: ir.Op, name: str) -> tuple[int, ...]:
    return tuple(op.attrs.get(name, ()))


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
                m = BwdMatch(fwd_pattern._match(pv, producer, users), False)
            except fwd_pattern._NoMatch:
                continue
            found.append(m)
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
    """Finds the backward of `m.fwd` and labels its dims (attention_bwd_labels.py);
    raises NoMatch with the reason it is not one."""
    f = m.fwd
    m.labels = {n: set(L.operand_table(f, n).values()) for n in "qkv"}
    p = probs(f, producer)
    plab = p_labels(f, p)
    dv_op = _only(users, p, lambda u: u is not f.pv and u.kind == "dot_general",
                  "the dv = p^T @ do dot")
    dp_op, vi, vlab, do_lab = _dp(m, dv_op, p, plab, producer, users)
    dq, dk, ds_lab, qk_lab = _dq_dk(m, producer, users)
    ds_final = dq.operands[1 - qk_lab[0]]
    lab = {"dq": L.result_labels(dq, *_ordered(qk_lab[0], qk_lab[2], ds_lab)),
           "dk": L.result_labels(dk, *_ordered(qk_lab[1], qk_lab[3], ds_lab))}
    pi = dv_op.operands.index(p)
    lab["dv"] = L.result_labels(dv_op, *_ordered(pi, plab, do_lab[1]))
    dp_lab = L.result_labels(dp_op, *_ordered(vi, vlab, do_lab[0]))
    m.ops += [dv_op, dp_op, dq, dk]
    outs = {}
    for name, op in (("dq", dq), ("dk", dk), ("dv", dv_op)):
        last, chain, strides = L.output_chain(op, users)
        m.ops += chain
        outs[name] = last
        m.strides[name] = L.strides_of(lab[name], strides, m.labels[name[1]], name)
    m.dq, m.dk, m.dv = outs["dq"], outs["dk"], outs["dv"]
    if set(dp_lab) - {None} != set(plab) - {None}:
        raise NoMatch("dp = do @ v^T is not score-shaped")
    ds, dslab = _ds_chain(m, ds_final, ds_lab, producer)
    if abs(m.scale - f.scale) > SCALE_RTOL * abs(f.scale):
        raise NoMatch(f"ds is scaled by {m.scale:.6g}, the scores by {f.scale:.6g}")
    cone = _cone(ds, f, dp_op, producer)
    m.ops += cone
    soft = (p, plab) if f.drop_op is None else (f.drop_x, f.drop_labels)
    check_vjp(f, scores(f, producer), soft, (dp_op.result, dp_lab), (ds, dslab),
              cone, producer)
    _check_closed(m, users)
    for name in ("q", "k", "v"):
        _rebase(m, name, producer, users)


def _rebase(m: BwdMatch, name: str, producer: dict, users: dict) -> None:
    """The forward's operand `name` read further back, through the transposes /
    reshapes that only the joint graph uses (the forward stopped at a view the
    backward's dots also read: jax.nn.dot_product_attention's q reshape, a copy
    kernel of its own otherwise); its axes' strides follow."""
    f, inner = m.fwd, set(m.fwd.ops) | set(m.ops)
    old = v = getattr(f, name)
    chain = []
    while producer.get(v) is not None and producer[v].kind in ("transpose", "reshape") \
            and users.get(v) and all(u in inner for u in users[v]):
        chain.append(producer[v])
        v = producer[v].operands[0]
    while chain:
        try:
            strides = row_major(v.shape)
            for op in reversed(chain):
                strides = forward_strides(op, strides)
            break
        except fwd_pattern._NoMatch:
            v = chain.pop().result
    if not chain:
        return
    by_old = {(s, n): new for s, n, new in zip(row_major(old.shape), old.shape, strides)
              if n != 1}
    for _, n, st in f.axes:
        if name in st and n != 1:
            st[name] = by_old[(st[name], n)]
    f.ops += chain
    setattr(f, name, v)


def _ordered(i: int, mine: list, other: list) -> tuple[list, list]:
    """(lhs labels, rhs labels) of a dot whose operand `i` has labels `mine`."""
    return (mine, other) if i == 0 else (other, mine)


def p_labels(f: fwd_pattern.Match, p: ir.Value) -> list:
    """p's labels as attention_pattern._match_as gives them (("b", j) the p @ v dot's
    j-th batch dim, ("f", d) p's free dim d, "sk"), None for unit dims."""
    pi = f.pv.operands.index(p)
    b, c, _ = L.sides(f.pv, pi)
    labels = [None if n == 1 else ("f", d) for d, n in enumerate(p.shape)]
    for j, d in enumerate(b):
        labels[d] = ("b", j) if p.shape[d] != 1 else None
    labels[c[0]] = "sk"
    return labels


def _closure(root: ir.Value, users: dict) -> set:
    """`root` and the values made from it by views (transposes, reshapes, converts)."""
    out, stack = set(), [root]
    while stack:
        v = stack.pop()
        if v in out:
            continue
        out.add(v)
        stack += [u.result for u in users.get(v, ()) if u.kind in L.VIEWS]
    return out


def _read(m: BwdMatch, value: ir.Value, name: str, producer: dict) -> list:
    """Labels of a view of the forward's operand `name` (its views join the match)."""
    root = getattr(m.fwd, name)
    _, chain, strides = L.view_chain(value, root, producer)
    m.ops += chain
    return L.by_stride(value, strides, L.operand_table(m.fwd, name))


def _dp(m: BwdMatch, dv_op: ir.Op, p: ir.Value, plab: list, producer: dict,
        users: dict) -> tuple:
    """(dp dot, index of v's view in it, [do's labels in dp, in dv]): dp reads a view of
    v and a view of the do that dv reads; do's dims are labelled by pairing with v's
    (dp contracts Dv) and p's (dv contracts the query dims)."""
    f = m.fwd
    do2 = dv_op.operands[1 - dv_op.operands.index(p)]
    m.do, chain2, st2 = L.view_chain(do2, None, producer)
    found = []
    for v in _closure(f.v, users):
        for u in users.get(v, ()):
            if u is f.pv or u.kind != "dot_general" or u is dv_op:
                continue
            for vi in (0, 1):
                if u.operands[vi] is v and L.view_chain(u.operands[1 - vi], None,
                                                        producer)[0] is m.do:
                    found.append((u, vi))
    if len(found) != 1:
        raise NoMatch(f"{len(found)} candidates for the dp = do @ v^T dot")
    dp_op, vi = found[0]
    do1 = dp_op.operands[1 - vi]
    _, chain1, st1 = L.view_chain(do1, None, producer)
    vlab = _read(m, dp_op.operands[vi], "v", producer)
    lab1, lab2 = [None] * do1.type.rank, [None] * do2.type.rank
    L.pair(dp_op, vi, vlab, lab1)
    L.pair(dv_op, dv_op.operands.index(p), plab, lab2)
    table: dict = {}
    for labs, sts, shape in ((lab1, st1, do1.shape), (lab2, st2, do2.shape)):
        for lab, s, n in zip(labs, sts, shape):
            if lab is not None and n != 1:
                if table.setdefault((s, n), lab) != lab:
                    raise NoMatch("do's dims do not line up with v's and p's")
    lab1, lab2 = L.by_stride(do1, st1, table), L.by_stride(do2, st2, table)
    m.strides["do"] = L.strides_of(lab1, st1, _o_labels(f), "do")
    m.ops += chain1 + chain2
    return dp_op, vi, vlab, (lab1, lab2)


def _o_labels(f: fwd_pattern.Match) -> set:
    return {lab for (_, n, st), lab in zip(f.axes, f.axis_labels) if "out" in st and n != 1}


def _dq_dk(m: BwdMatch, producer: dict, users: dict) -> tuple:
    """(dq dot, dk dot, ds' labels, (k index in dq, q index in dk, k's labels, q's)):
    dq = ds' @ k contracting Sk, dk = ds'^T @ q contracting the query dims, one ds'."""
    f = m.fwd
    qk = f.qk
    reads = {}
    for name in ("q", "k"):
        reads[name] = [(u, i) for v in _closure(getattr(f, name), users)
                       for u in users.get(v, ()) if u is not qk and
                       u.kind == "dot_general" for i in (0, 1) if u.operands[i] is v]
    error = NoMatch("no dq = ds @ k and dk = ds^T @ q dots sharing ds")
    for dq, ki in reads["k"]:
        for dk, qi in reads["q"]:
            if dq is dk or dq.operands[1 - ki] is not dk.operands[1 - qi]:
                continue
            state = (list(m.ops), dict(m.strides))
            try:
                return (dq, dk) + _label_ds(m, dq, ki, dk, qi, producer)
            except NoMatch as e:
                m.ops, m.strides = state
                error = e
    raise error


def _label_ds(m: BwdMatch, dq: ir.Op, ki: int, dk: ir.Op, qi: int, producer: dict):
    klab = _read(m, dq.operands[ki], "k", producer)
    qlab = _read(m, dk.operands[qi], "q", producer)
    ds = dq.operands[1 - ki]
    dslab = [None] * ds.type.rank
    L.pair(dq, ki, klab, dslab)
    L.pair(dk, qi, qlab, dslab)
    if any(lab is None and n != 1 for lab, n in zip(dslab, ds.shape)):
        raise NoMatch("ds has a dim neither dq nor dk contracts or batches")
    return dslab, (ki, qi, klab, qlab)


def probs(f: fwd_pattern.Match, producer: dict) -> ir.Value:
    """The operand of p @ v that is p (the softmax's divide through views and the
    dropout, if any)."""
    for v in f.pv.operands:
        op = producer.get(v)
        while op is not None and op is not f.probs and (
                op.kind in ("convert", "transpose", "reshape") or op is f.drop_op):
            op = producer.get(f.drop_x if op is f.drop_op else op.operands[0])
        if op is f.probs:
            return v
    raise NoMatch("p @ v reads no softmax")


def scores(f: fwd_pattern.Match, producer: dict) -> ir.Value:
    """The value the softmax subtracts its row max from (the masked, scaled scores)."""
    exp = producer[f.probs.operands[0]]
    return producer[exp.operands[0]].operands[0]


def _only(users: dict, v: ir.Value, pred, what: str) -> ir.Op:
    found = [u for u in users.get(v, ()) if pred(u)]
    if len(found) != 1:
        raise NoMatch(f"{len(found)} candidates for {what}")
    return found[0]


def _ds_chain(m: BwdMatch, v: ir.Value, labels: list, producer: dict) -> tuple:
    """(ds, its labels): `v` (labelled `labels`) before converts, transposes, unit
    reshapes, a select(mask, ., 0) and multiplies or divides by a splat (m.scale)."""
    while True:
        op = producer.get(v)
        if op is None:
            return v, labels
        if op.kind in ("convert", "transpose", "reshape"):
            try:
                labels = view_back(op, labels)
            except fwd_pattern._NoMatch:
                return v, labels
            nxt = op.operands[0]
        elif op.kind == "select" and splat(op.operands[2], producer) == 0.0 and \
                m.fwd.mask is not None and _is_mask(m, op.operands[0], labels, producer):
            splat(op.operands[2], producer, m)
            nxt = op.operands[1]
        elif op.kind in ("multiply", "divide"):
            a, b = op.operands
            ca, cb = splat(a, producer), splat(b, producer)
            if op.kind == "divide":
                ca = None
            if cb is None and ca is None:
                return v, labels
            c, nxt = (cb, a) if cb is not None else (ca, b)
            splat(b if cb is not None else a, producer, m)
            m.scale *= c if op.kind == "multiply" else 1.0 / c
        else:
            return v, labels
        m.ops.append(op)
        v = nxt


def _is_mask(m: BwdMatch, pred: ir.Value, labels: list, producer: dict) -> bool:
    """`pred` is the forward's mask, found as attention_pattern finds it (its views
    and `and`s with all-true join the match)."""
    scratch = fwd_pattern.Match(m.fwd.pv)
    scratch.ops = []
    root, _ = fwd_pattern._mask_root(scratch, pred, labels, producer)
    if root is not m.fwd.mask:
        return False
    m.ops += scratch.ops
    return True


def _cone(ds: ir.Value, f: fwd_pattern.Match, dp: ir.Op, producer: dict) -> list[ir.Op]:
    """The ops computing `ds` from dp and the forward's values (and constants)."""
    fwd_ops, seen, out = set(f.ops), set(), []
    stack = [ds]
    while stack:
        v = stack.pop()
        if v is f.dropout:              # the dropout's multiplier / keep: an input
            continue
        op = producer.get(v)
        if op is None or op is dp or op in fwd_ops or op in seen:
            if op is None:
                raise NoMatch("ds depends on a value outside the attention")
            continue
        if op.kind not in CONE or (op.kind == "reduce" and len(op.operands) != 2):
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
    m.mask_ops = mask_ops(m.fwd.mask, inner)
    made = fwd_pattern.inner_made(inner - m.mask_ops)
    for op in inner:
        if op in outs:
            continue
        for v in op.results:
            if any(u not in inner for u in users.get(v, ())):
                if v in made or (op.kind not in fwd_pattern.SHAREABLE and
                                 op not in m.mask_ops):
                    raise NoMatch(f"%{v.name} ({op.kind}) is also used outside")
                m.shared.add(op)


MASK_KINDS = frozenset({"broadcast_in_dim", "reshape", "transpose", "convert", "and",
                        "compare", "constant"})


def mask_ops(mask: ir.Value | None, inner: set) -> set:
    """The ops of `inner` that compute from the mask and constants only (its views, an
    `and` with all-true, a bool round trip): the layers of a model share them (one mask
    broadcast to every layer's scores), so they stay in the program for their other
    users and are cloned into the regions, like views."""
    if mask is None:
        return set()
    producer = {v: op for op in inner for v in op.results}
    memo: dict = {}

    def derived(op) -> bool:
        if op not in memo:
            memo[op] = False
            memo[op] = op.kind in MASK_KINDS and all(
                v is mask or (v in producer and derived(producer[v])) or
                (v not in producer and v.type.size <= 64) for v in op.operands)
        return memo[op]
    return {op for op in inner if derived(op)}
