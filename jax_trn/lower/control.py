"""Control flow between kernels: `while`, `case` (lax.cond / lax.switch), surviving calls.

A `while` with a static trip count whose body is kernels only becomes a loop on chip
(`hw.program.Loop`, built by loop_on_chip.py: counter in registers, carries resident in
SBUF where they fit); the others stay host-driven `While` steps, described below, with
the reason in their notes.

Each region is lowered like the function body (fusion ops, splat constants, ...) into a
nested step list, giving `hw.program.While` / `Case` steps; the runtime's control path
runs them between kernels, reading the predicate / branch index from HBM after the
kernel that wrote it completed.

Buffers of a `while` (one DRAM tensor C_i per loop-carried value; the results at exit):
  - C_i is the result's output buffer when the function returns it (claimed); else,
    for a carry the body passes through unchanged (a scan's xs, closed-over weights),
    the init value's own buffer when nothing writes it (a parameter, constant data, a
    temporary of this block that is no enclosing loop's carried buffer; no copy); else the init
    value's own HBM temporary when nothing reads that value after the loop (no copy;
    not when its op was hoisted out of an enclosing loop: every trip of that loop
    reads it again); else a fresh temporary that a copy kernel (a Memset for a splat constant)
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

from collections.abc import Iterable

from hlo_passes import ir
from hlo_passes.effects import has_side_effects
from jax_trn.hw.program import Case, DramTensor, Loop, While

from . import loop_on_chip
from .driver import StepCtx
from .errors import LoweringError
from .registry import RuleKind, register_step
from .registry import op_label as _label


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


# --- while ------------------------------------------------------------------------------------

@register_step("while")
def lower_while(ctx: StepCtx, op: ir.Op, claims: dict[int, DramTensor]) -> None:
    """A `While` step: init copies, then the loop of cond steps and body steps."""
    if len(op.regions) != 2:
        raise LoweringError(f"while without cond and body regions ({op.describe()})")
    carried = _carried(ctx, op, claims)
    for inner in _invariant(ctx, op):
        ctx.hoist(inner)
    ctx.write_pending(_region_values(op))
    name = ctx.name("while")
    active = _buffers(ctx)["active"]
    entered = {t.name for t in carried} - active
    active |= entered
    try:
        cond_steps, pred, body_steps = _regions(ctx, op, carried)
    finally:
        active -= entered
    loop = _on_chip(ctx, op, name, carried, body_steps)
    if isinstance(loop, Loop):
        ctx.append(loop)
    else:
        ctx.append(While(name, cond_steps, pred, body_steps, carried, [_label(op)],
                         notes=[f"host-driven loop: {loop}"]))
    ctx.bind(op.results, carried)


def _on_chip(ctx: StepCtx, op: ir.Op, name: str, carried: list[DramTensor],
             body_steps: list) -> Loop | str:
    """The while as a `Loop` run on chip (loop_on_chip.py), or why it cannot be one."""
    def known(v):
        t = ctx.location(v)
        return ctx.constant(t) if t is not None else None
    count = loop_on_chip.counted(op, known, ctx.is_hoisted)
    if isinstance(count, str):
        return count
    return loop_on_chip.build(name, count, carried, body_steps, ctx.target.sbuf_bytes,
                              [_label(op)])


def _regions(ctx: StepCtx, op: ir.Op, carried: list[DramTensor]):
    """The cond steps, the predicate and the body steps of a while."""
    cond, body = op.regions[0].block, op.regions[1].block
    with ctx.nested() as cond_steps:
        ctx.bind(cond.args, carried)
        ctx.lower_block(cond, {})
        pred = ctx.operand(cond.terminator.operands[0])
    if pred.shape != () or pred.dtype != "bool":
        raise LoweringError(f"while predicate of type {pred.dtype}{list(pred.shape)}, "
                            f"expected bool[] ({op.describe()})")
    with ctx.nested() as body_steps:
        ctx.bind(body.args, carried)
        body_claims = _body_claims(ctx, body, carried)
        ctx.lower_block(body, body_claims)
        _move(ctx, op, body.terminator.operands, carried, body_claims, body.args)
    return cond_steps, pred, body_steps


def _invariant(ctx: StepCtx, op: ir.Op) -> list[ir.Op]:
    """The loop-invariant ops of a while's cond and body blocks, in order."""
    inside = {id(v) for region in op.regions for block in region.blocks
              for v in (*block.args, *(r for o in ir.walk(block) for r in o.results))}
    hoisted: list[ir.Op] = []
    for region in op.regions:
        for inner in region.block.ops[:-1]:
            if _is_step(ctx, inner) or has_side_effects(inner):
                continue
            own = {id(v) for o in _walk([inner]) for v in o.results}
            own |= {id(a) for o in _walk([inner]) for r in o.regions for b in r.blocks
                    for a in b.args}
            reads = _used([inner]) - own
            if all(r not in inside for r in reads):
                hoisted.append(inner)
                inside -= {id(v) for v in inner.results}
    return hoisted


def _is_step(ctx: StepCtx, op: ir.Op) -> bool:
    """Lowered by a step rule (control flow, a collective): never hoisted."""
    rule = ctx.rule_for(op)
    return rule is not None and rule.kind is RuleKind.STEP


def _buffers(ctx: StepCtx) -> dict[str, set[str]]:
    """Per lowering: the names of the carried buffers of the loops being lowered (the
    enclosing loops: written during the current trip) and of the buffers a pass-through
    carry aliases (never reused as a carried buffer)."""
    return ctx.state("control", lambda: {"active": set(), "aliased": set()})


def _carried(ctx: StepCtx, op: ir.Op, claims: dict[int, DramTensor]) -> list[DramTensor]:
    """The loop-carried buffers, initialised with the operands (see the module doc)."""
    block, index = ctx.position
    later = _used(block.ops[index + 1:]) | {id(v) for v in _region_values(op)}
    local = {id(r) for o in block.ops[:index] if o.kind != "constant" for r in o.results}
    # hoisted out of an enclosing loop: computed once, read again on every trip
    once = {id(r) for o in block.ops[:index] if ctx.is_hoisted(o) for r in o.results}
    temps = ctx.temp_names()
    body = op.regions[1].block
    ret = body.terminator.operands
    state, carried = _buffers(ctx), []
    for i, (v, r) in enumerate(zip(op.operands, op.results)):
        t = claims.get(id(r))
        if t is None and ret[i] is body.args[i] and _immutable(ctx, v, local, temps):
            t = ctx.location(v)                 # passed through: never written
            state["aliased"].add(t.name)
            carried.append(t)
            continue
        if t is None and _reusable(ctx, op, v, local - once, later, temps, carried):
            t = ctx.location(v)
        if t is None:
            t = ctx.temp(tuple(r.shape), r.dtype)
        if t is not ctx.location(v) and not ctx.fill_into(v, t):
            ctx.copy(op, t, ctx.operand(v))
        carried.append(t)
    return carried


def _immutable(ctx: StepCtx, v, local, temps) -> bool:
    """Whether `v`'s buffer keeps its value while `v` lives: a parameter, constant data,
    or a temporary computed in this block that is no enclosing loop's carried buffer
    (the only buffers written after their value was computed: a finished loop's
    carried buffer holds its result for good, unless reused, which `aliased` stops);
    a loop carry the body passes through unchanged may then live there, without a copy."""
    t = ctx.location(v)
    if t is None or ctx.is_pending(v):
        return False
    if ctx.is_param(t) or ctx.is_constant_data(t):
        return True
    return (id(v) in local and t.name in temps
            and t.name not in _buffers(ctx)["active"])


def _reusable(ctx: StepCtx, op, v, local, later, temps, carried) -> bool:
    """Whether init value `v`'s own temporary can be the loop-carried buffer: computed
    in this block, read by nothing after the loop (nor by the loop's regions), not a
    known constant, not aliased by a pass-through carry, passed once."""
    t = ctx.location(v)
    return (t is not None and id(v) in local and id(v) not in later
            and t.name in temps and ctx.constant(t) is None
            and t.name not in _buffers(ctx)["aliased"]
            and sum(w is v for w in op.operands) == 1 and t not in carried)


def _body_claims(ctx: StepCtx, body: ir.Block, carried: list[DramTensor]
                 ) -> dict[int, DramTensor]:
    """Body results written in place into their carried buffer (see the module doc)."""
    ops, ret = body.ops[:-1], body.terminator.operands
    producer = {id(r): k for k, o in enumerate(ops) if o.kind != "constant"
                and not ctx.is_hoisted(o) for r in o.results}
    claims: dict[int, DramTensor] = {}
    for i, (v, c) in enumerate(zip(ret, carried)):
        k = producer.get(id(v))
        if k is None or id(v) in claims:
            continue
        arg = body.args[i]
        if id(arg) in _used(ops[k + 1:]) or any(w is arg for j, w in enumerate(ret) if j != i):
            continue
        if id(arg) in _used([ops[k]]) and not _in_place(ctx, ops[k], arg):
            continue
        claims[id(v)] = c
    return claims


def _in_place(ctx: StepCtx, op: ir.Op, arg: ir.Value) -> bool:
    """Whether `op` may write its result over `arg`, an operand it reads (directly
    only): its rule says so (`registry.Rule.in_place`: the plain elementwise rule, a
    scan's dynamic_update_slice)."""
    if id(arg) in {id(v) for o in _walk([op]) if o is not op for v in o.operands}:
        return False
    rule = ctx.rule_for(op)
    return rule is not None and rule.writes_in_place(op, arg)


def _move(ctx: StepCtx, op: ir.Op, values: list[ir.Value], dsts: list[DramTensor],
          claims: dict[int, DramTensor], args: list[ir.Value] | None) -> None:
    """Puts `values` into `dsts` as one parallel assignment: values already written in
    place (claimed) or unchanged (`args[i]`) cost nothing; a source that another
    destination overwrites is saved to a temporary first."""
    moves = [(v, d) for i, (v, d) in enumerate(zip(values, dsts))
             if claims.get(id(v)) is not d and not (args is not None and v is args[i])]
    overwritten = {d.name for _, d in moves}
    sources = []
    for v, d in moves:
        if ctx.is_pending(v):
            sources.append(None)            # a splat constant: Memset straight into d
            continue
        src = ctx.operand(v)
        if src.name in overwritten and src is not d:
            saved = ctx.temp(src.shape, src.dtype)
            ctx.copy(op, saved, src)
            src = saved
        sources.append(src)
    for (v, d), src in zip(moves, sources):
        if src is None:
            ctx.fill_into(v, d)
        elif src is not d:
            ctx.copy(op, d, src)


# --- case -------------------------------------------------------------------------------------

@register_step("case")
def lower_case(ctx: StepCtx, op: ir.Op, claims: dict[int, DramTensor]) -> None:
    """A `Case` step: the control path reads the int32 index, runs one branch."""
    ctx.write_pending(_region_values(op))
    index = ctx.operand(op.operands[0])
    if index.shape != () or index.dtype != "int32":
        raise LoweringError(f"case index of type {index.dtype}{list(index.shape)}, "
                            f"expected int32[] ({op.describe()})")
    results = [ctx.result(r, claims) for r in op.results]
    name, branches = ctx.name("case"), []
    for region in op.regions:
        branches.append(_branch(ctx, op, region.block, results))
    ctx.append(Case(name, index, branches, results, [_label(op)]))


def _branch(ctx: StepCtx, op: ir.Op, block: ir.Block, results: list[DramTensor]) -> list:
    """The steps of one branch (or callee body): its results end in `results`."""
    with ctx.nested() as steps:
        claims: dict[int, DramTensor] = {}
        producers = {id(r) for o in block.ops[:-1] if o.kind != "constant" for r in o.results}
        for v, t in zip(block.terminator.operands, results):
            if id(v) in producers and id(v) not in claims:
                claims[id(v)] = t
        ctx.lower_block(block, claims)
        _move(ctx, op, block.terminator.operands, results, claims, None)
    return steps


# --- calls --------------------------------------------------------------------------------------

@register_step("func.call", "call")
def lower_call(ctx: StepCtx, op: ir.Op, claims: dict[int, DramTensor]) -> None:
    """A call the inliner kept (`no_inline`): the callee's body, lowered in place."""
    callee = ctx.function(op.attrs.get("callee", ""))
    if callee is None:
        raise LoweringError(f"call to an unknown function {op.attrs.get('callee')!r} "
                            f"({op.describe()})")
    ctx.bind(callee.body.args, [ctx.operand(v) for v in op.operands])
    ctx.write_pending([v for inner in ir.walk(callee.body) for v in inner.operands])
    results = [ctx.result(r, claims) for r in op.results]
    ctx.append(*_branch(ctx, op, callee.body, results))
