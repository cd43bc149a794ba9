"""The softmax VJP of an attention backward (attention_bwd_pattern.py), checked by
evaluation: JAX writes it in several forms (the quotient rule of `e / l` when its
softmax is differentiated op by op, `p * (dp - sum(p * dp))` from its custom JVP), so
rather than matching each, the ops computing ds from dp and the forward's values (the
cone) are evaluated with numpy on random scores and dp, every dim shrunk to at most
SHRINK elements (a non-splat constant, a compile-time mask or bias, to its leading
corner); ds must equal p * (dp - rowsum(dp * p)) there. With a dropout (the
forward's `dropout`: a random keep or multiplier W), dp is the dropped p's gradient
and ds must be p * (dp W - rowsum(dp W p)), p the undropped softmax."""
from __future__ import annotations

import numpy as np

from hlo_passes import ir
from hlo_passes.attention_bwd_labels import NoMatch

CONE = frozenset({"multiply", "divide", "add", "subtract", "negate", "convert",
                  "broadcast_in_dim", "reshape", "reduce", "constant", "exponential",
                  "maximum", "transpose", "select"})
SHRINK = 3                  # dims longer than this are evaluated with this many elements


def check_vjp(f, x: ir.Value, p, dp, ds, cone: list[ir.Op], producer: dict) -> None:
    """The cone computes p * (dp - rowsum(dp * p)) on shrunk random data (`x` the
    scores of forward match `f`); p, dp and ds are (value, labels), compared with
    their dims put in one order by label."""
    inner = set(f.ops)
    while producer.get(x) in inner and producer[x].kind in ("transpose", "convert",
                                                             "reshape"):
        x = producer[x].operands[0]     # the row max may reduce x before its views
    rng = np.random.default_rng(0)
    env = {x: rng.standard_normal(_shrunk(x.shape)),
           dp[0]: rng.standard_normal(_shrunk(dp[0].shape))}
    if f.dropout is not None:       # random keep (bool) or multiplier
        w = rng.random(_shrunk(f.dropout.shape))
        env[f.dropout] = w < 0.7 if f.dropout.dtype == "bool" else 0.5 + w
    order = [op for op in _topo(f.ops, producer) if op is not f.pv] + \
        _topo(cone, producer)
    for op in order:
        if op.results[0] in env or op.kind == "dot_general":
            continue
        args = [_value(a, env, producer) for a in op.operands]
        if any(a is None for a in args) or op.kind not in CONE:
            continue
        env[op.results[0]] = _eval(op, args)
    if env.get(p[0]) is None or env.get(ds[0]) is None:
        raise NoMatch("the softmax VJP could not be evaluated")
    pv, dpv, got = (_canonical(env[v], labels) for v, labels in (p, dp, ds))
    if not pv.shape == dpv.shape == got.shape:
        raise NoMatch("ds, dp and p are not one shape")
    axis = sorted(set(p[1]) - {None}, key=str).index("sk")
    if f.dropout is not None:       # dp of the undropped p: dp * (p_dropped / p)
        dropped = env.get(f.drop_op.results[0])
        if dropped is None:
            raise NoMatch("the dropout could not be evaluated")
        dropped = _canonical(dropped, p[1]).astype(np.float64)
        with np.errstate(all="ignore"):
            dpv = dpv * np.where(pv != 0, dropped / pv, 0.0)
    want = pv * (dpv - (dpv * pv).sum(axis, keepdims=True))
    if not np.allclose(got, want, rtol=1e-6, atol=1e-9):
        raise NoMatch("ds is not p * (dp - rowsum(dp * p))")


def _canonical(a: np.ndarray, labels: list) -> np.ndarray:
    """`a` without its unit dims, its dims in the order of their labels."""
    keep = [i for i, lab in enumerate(labels) if lab is not None]
    a = np.asarray(a).reshape([a.shape[i] for i in keep])
    return a.transpose(sorted(range(len(keep)), key=lambda j: str(labels[keep[j]])))


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
        if value.shape != tuple(op.results[0].shape):
            raise NoMatch("a non-splat constant in the softmax VJP")
        # a compile-time mask or bias: its leading corner, as every dim is shrunk
        return value[tuple(slice(0, n) for n in shape)]
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
    if k == "select":
        return np.where(*args)
    if k == "transpose":
        return np.transpose(args[0], op.attrs["permutation"])
    fn = {"multiply": np.multiply, "divide": np.divide, "add": np.add,
          "subtract": np.subtract, "negate": np.negative, "exponential": np.exp,
          "maximum": np.maximum}[k]
    with np.errstate(all="ignore"):
        return fn(*args)
