"""Control flow between kernels: `while`, `case` (lax.cond / lax.switch), surviving calls.

Each region is lowered like the function body (fusion ops, splat constants, ...) into a
nested step list, giving `hw.program.While` / `Case` steps; the runtime's control path
runs them between kernels, reading the predicate / branch index from HBM after the
kernel that wrote it completed.

Buffers of a `while` (one DRAM tensor C_i per loop-carried value; the results at exit):
  - C_i is the result's output buffer when the function returns it (claimed); else,
    for a carry the body passes through unchanged (a scan's xs, closed-over weights),
    the init value's own buffer when nothing writes it (a parameter, constant data, a
    temporary of this block that is no enclosing loop's carried buffer; no copy); else the init
    value's own HBM temporary when nothing reads that value after the loop (no copy);
    else a fresh temporary that a copy kernel (a Memset for a splat constant)
    initialises before the loop.
  - cond and body block arguments are C_i. The cond steps write the predicate (bool[]).
  - a body result computed by a body op is written straight into C_i when nothing reads
    C_i after that op (later ops, nested regions, the terminator at another position)
    and the op itself either does not read C_i or reads it tile by tile before writing
    the same tile (`i + 1`, a scan's dynamic_update_slice: `_in_place`); the other
    results are copied into C_i at the end of the body, a source that another of these
    copies overwrites (a swap `(a, b) -> (b, a)`) saved to a temporary first. A result
    that is its own argument costs nothing.
A `case` gets fresh result buffers (or the claimed outputs); each branch writes the
results it computes straight into them and copies (or Memsets) the others.

Loop-invariant ops of the cond and body (no side effects, no control flow, reading only
values from outside the loop or other invariant ops: splat constants, broadcasts of
them, ...) are lowered once, before the loop, instead of on every trip (they also run
when the loop makes no trip). Splat constants the regions use but that are not written
yet are written before the control op (a region may run on only some paths, or many
times).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

from hlo_passes import ir
from hlo_passes.effects import has_side_effects
from jax_trn.hw.program import Case, DramTensor, While

from . import dynslice, elementwise
from .errors import LoweringError
from .registry import get_rule
from .registry import op_label as _label

STRUCTURED: dict[str, Callable] = {}


def _structured(*kinds: str):
    def register(fn):
        for kind in kinds:
            STRUCTURED[kind] = fn
        return fn
    return register



# --- uses -----------------------------------------------------------------------------------

def _walk(ops: Iterable[ir.Op]):
    for op in ops:
        yield op
        for region in op.regions:
            for block in region.blocks:
                yield from ir.walk(block)


def _used(ops: Iterable[ir.Op]) -> set[int]:
    """ids of the values `ops` (and their nested regions) read."""
    return {id(v) for op in _walk(ops) for v in op.operands}


def _region_values(op: ir.Op) -> list[ir.Value]:
    return [v for region in op.regions for block in region.blocks
            for inner in ir.walk(block) for v in inner.operands]


def _bind(lw, values: list[ir.Value], tensors: list[DramTensor]) -> None:
    lw.where.update((id(v), t) for v, t in zip(values, tensors))


# --- while ------------------------------------------------------------------------------------

@_structured("while")
def lower_while(lw, op: ir.Op, claims: dict[int, DramTensor]) -> None:
    """A `While` step: init copies, then the loop of cond steps and body steps."""
    if len(op.regions) != 2:
        raise LoweringError(f"while without cond and body regions ({op.describe()})")
    carried = _carried(lw, op, claims)
    for inner in _invariant(op):
        lw.hoisted.add(id(inner))
        lw.lower_op(inner)
    lw.flush_pending(_region_values(op))
    name = lw.name("while")
    active = _buffers(lw)["active"]
    entered = {t.name for t in carried} - active
    active |= entered
    try:
        cond_steps, pred, body_steps = _regions(lw, op, carried)
    finally:
        active -= entered
    lw.kernels.append(While(name, cond_steps, pred, body_steps, carried, [_label(op)]))
    _bind(lw, op.results, carried)


def _regions(lw, op: ir.Op, carried: list[DramTensor]):
    """The cond steps, the predicate and the body steps of a while."""
    cond, body = op.regions[0].block, op.regions[1].block
    with lw.nested() as cond_steps:
        _bind(lw, cond.args, carried)
        lw.lower_block(cond, {})
        pred = lw.operand(cond.terminator.operands[0])
    if pred.shape != () or pred.dtype != "bool":
        raise LoweringError(f"while predicate of type {pred.dtype}{list(pred.shape)}, "
                            f"expected bool[] ({op.describe()})")
    with lw.nested() as body_steps:
        _bind(lw, body.args, carried)
        body_claims = _body_claims(lw, body, carried)
        lw.lower_block(body, body_claims)
        _move(lw, op, body.terminator.operands, carried, body_claims, body.args)
    return cond_steps, pred, body_steps


def _invariant(op: ir.Op) -> list[ir.Op]:
    """The loop-invariant ops of a while's cond and body blocks, in order."""
    inside = {id(v) for region in op.regions for block in region.blocks
              for v in (*block.args, *(r for o in ir.walk(block) for r in o.results))}
    hoisted: list[ir.Op] = []
    for region in op.regions:
        for inner in region.block.ops[:-1]:
            if inner.kind in STRUCTURED or has_side_effects(inner):
                continue
            own = {id(v) for o in _walk([inner]) for v in o.results}
            own |= {id(a) for o in _walk([inner]) for r in o.regions for b in r.blocks
                    for a in b.args}
            reads = _used([inner]) - own
            if all(r not in inside for r in reads):
                hoisted.append(inner)
                inside -= {id(v) for v in inner.results}
    return hoisted


def _buffers(lw) -> dict[str, set[str]]:
    """Per lowering: the names of the carried buffers of the loops being lowered (the
    enclosing loops: written during the current trip) and of the buffers a pass-through
    carry aliases (never reused as a carried buffer)."""
    state = getattr(lw, "control_buffers", None)
    if state is None:
        state = lw.control_buffers = {"active": set(), "aliased": set()}
    return state


def _carried(lw, op: ir.Op, claims: dict[int, DramTensor]) -> list[DramTensor]:
    """The loop-carried buffers, initialised with the operands (see the module doc)."""
    block, index = lw.cursor
    later = _used(block.ops[index + 1:]) | {id(v) for v in _region_values(op)}
    local = {id(r) for o in block.ops[:index] if o.kind != "constant" for r in o.results}
    temps = {t.name for t in lw.temps}
    body = op.regions[1].block
    ret = body.terminator.operands
    state, carried = _buffers(lw), []
    for i, (v, r) in enumerate(zip(op.operands, op.results)):
        t = claims.get(id(r))
        if t is None and ret[i] is body.args[i] and _immutable(lw, v, local, temps):
            t = lw.where[id(v)]                 # passed through: never written
            state["aliased"].add(t.name)
            carried.append(t)
            continue
        if t is None and _reusable(lw, op, v, local, later, temps, carried):
            t = lw.where[id(v)]
        if t is None:
            t = lw.temp(tuple(r.shape), r.dtype)
        if t is not lw.where.get(id(v)) and not lw.fill_into(v, t):
            lw.copy(op, t, lw.operand(v))
        carried.append(t)
    return carried


def _immutable(lw, v, local, temps) -> bool:
    """Whether `v`'s buffer keeps its value while `v` lives: a parameter, constant data,
    or a temporary computed in this block that is no enclosing loop's carried buffer
    (the only buffers written after their value was computed: a finished loop's
    carried buffer holds its result for good, unless reused, which `aliased` stops);
    a loop carry the body passes through unchanged may then live there, without a copy."""
    t = lw.where.get(id(v))
    if t is None or id(v) in lw.pending:
        return False
    if t.name in {p.name for p in lw.params} or t.name in lw.constants:
        return True
    return (id(v) in local and t.name in temps
            and t.name not in _buffers(lw)["active"])


def _reusable(lw, op, v, local, later, temps, carried) -> bool:
    """Whether init value `v`'s own temporary can be the loop-carried buffer: computed
    in this block, read by nothing after the loop (nor by the loop's regions), not a
    known constant, not aliased by a pass-through carry, passed once."""
    t = lw.where.get(id(v))
    return (t is not None and id(v) in local and id(v) not in later
            and t.name in temps and t.name not in lw.consts
            and t.name not in _buffers(lw)["aliased"]
            and sum(w is v for w in op.operands) == 1 and t not in carried)


def _body_claims(lw, body: ir.Block, carried: list[DramTensor]) -> dict[int, DramTensor]:
    """Body results written in place into their carried buffer (see the module doc)."""
    ops, ret = body.ops[:-1], body.terminator.operands
    producer = {id(r): k for k, o in enumerate(ops) if o.kind != "constant"
                and id(o) not in lw.hoisted for r in o.results}
    claims: dict[int, DramTensor] = {}
    for i, (v, c) in enumerate(zip(ret, carried)):
        k = producer.get(id(v))
        if k is None or id(v) in claims:
            continue
        arg = body.args[i]
        if id(arg) in _used(ops[k + 1:]) or any(w is arg for j, w in enumerate(ret) if j != i):
            continue
        if id(arg) in _used([ops[k]]) and not _in_place(lw, ops[k], arg):
            continue
        claims[id(v)] = c
    return claims


def _in_place(lw, op: ir.Op, arg: ir.Value) -> bool:
    """Whether `op` may write its result over `arg`, an operand it reads (directly only):
    - a plain elementwise op (elementwise.py's rule, `i = i + 1`): each [128, F] tile of
      every operand is read before the same tile of the result is written, tiles are
      disjoint;
    - dynamic_update_slice over its operand 0 (dynslice.py's rule, a scan's stacked
      outputs): each tile of rows is loaded, patched from the update and stored back to
      the same rows, tiles disjoint."""
    if id(arg) in {id(v) for o in _walk([op]) if o is not op for v in o.operands}:
        return False
    rule = get_rule(op.kind, lw.target)
    if isinstance(rule, partial) and rule.func is elementwise._elementwise:
        return all(v.shape == r.shape for v in op.operands for r in op.results)
    if op.kind == "dynamic_update_slice" and rule is dynslice._dynamic_update_slice_lower:
        return all(v is not arg for v in op.operands[1:])
    return False


def _move(lw, op: ir.Op, values: list[ir.Value], dsts: list[DramTensor],
          claims: dict[int, DramTensor], args: list[ir.Value] | None) -> None:
    """Puts `values` into `dsts` as one parallel assignment: values already written in
    place (claimed) or unchanged (`args[i]`) cost nothing; a source that another
    destination overwrites is saved to a temporary first."""
    moves = [(v, d) for i, (v, d) in enumerate(zip(values, dsts))
             if claims.get(id(v)) is not d and not (args is not None and v is args[i])]
    overwritten = {d.name for _, d in moves}
    sources = []
    for v, d in moves:
        if id(v) in lw.pending:
            sources.append(None)            # a splat constant: Memset straight into d
            continue
        src = lw.operand(v)
        if src.name in overwritten and src is not d:
            saved = lw.temp(src.shape, src.dtype)
            lw.copy(op, saved, src)
            src = saved
        sources.append(src)
    for (v, d), src in zip(moves, sources):
        if src is None:
            lw.fill_into(v, d)
        elif src is not d:
            lw.copy(op, d, src)


# --- case -------------------------------------------------------------------------------------

@_structured("case")
def lower_case(lw, op: ir.Op, claims: dict[int, DramTensor]) -> None:
    """A `Case` step: the control path reads the int32 index, runs one branch."""
    lw.flush_pending(_region_values(op))
    index = lw.operand(op.operands[0])
    if index.shape != () or index.dtype != "int32":
        raise LoweringError(f"case index of type {index.dtype}{list(index.shape)}, "
                            f"expected int32[] ({op.describe()})")
    results = [lw.result(r, claims) for r in op.results]
    name, branches = lw.name("case"), []
    for region in op.regions:
        branches.append(_branch(lw, op, region.block, results))
    lw.kernels.append(Case(name, index, branches, results, [_label(op)]))


def _branch(lw, op: ir.Op, block: ir.Block, results: list[DramTensor]) -> list:
    """The steps of one branch (or callee body): its results end in `results`."""
    with lw.nested() as steps:
        claims: dict[int, DramTensor] = {}
        producers = {id(r) for o in block.ops[:-1] if o.kind != "constant" for r in o.results}
        for v, t in zip(block.terminator.operands, results):
            if id(v) in producers and id(v) not in claims:
                claims[id(v)] = t
        lw.lower_block(block, claims)
        _move(lw, op, block.terminator.operands, results, claims, None)
    return steps


# --- calls --------------------------------------------------------------------------------------

@_structured("func.call", "call")
def lower_call(lw, op: ir.Op, claims: dict[int, DramTensor]) -> None:
    """A call the inliner kept (`no_inline`): the callee's body, lowered in place."""
    callee = (lw.module.functions.get(op.attrs.get("callee", ""))
              if lw.module is not None else None)
    if callee is None:
        raise LoweringError(f"call to an unknown function {op.attrs.get('callee')!r} "
                            f"({op.describe()})")
    _bind(lw, callee.body.args, [lw.operand(v) for v in op.operands])
    lw.flush_pending([v for inner in ir.walk(callee.body) for v in inner.operands])
    results = [lw.result(r, claims) for r in op.results]
    lw.kernels.extend(_branch(lw, op, callee.body, results))
