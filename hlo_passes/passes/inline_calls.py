"""Inlines `func.call` and `composite` ops, then drops unreachable private functions.

JAX lowers jitted helpers (`jnp.where`, `jnp.clip`, `jax.random`, ...) to private
functions whose ops carry relative names ("select_n") and no file location; inlined ops
get the call's name as a prefix and the call's location. Calls marked `no_inline` and
composites named in `keep_composites` stay.
"""
from __future__ import annotations

from hlo_passes import ir
from hlo_passes.errors import VerifyError

name = "inline-calls"
MAX_DEPTH = 64


class InlineCalls:
    """The pass, configurable: composites named in `keep_composites` are kept."""

    name = name

    def __init__(self, keep_composites: frozenset[str] = frozenset()):
        self.keep_composites = frozenset(keep_composites)

    def run(self, module: ir.Module) -> bool:
        changed = False
        for _ in range(MAX_DEPTH):
            if not _inline_once(module, self.keep_composites):
                return _drop_unreachable(module) or changed
            changed = True
        raise VerifyError(f"calls nested deeper than {MAX_DEPTH} (recursion?)")


def run(module: ir.Module) -> bool:
    return InlineCalls().run(module)


def _inline_once(module: ir.Module, keep: frozenset[str]) -> bool:
    changed = False
    for fn in module.functions.values():
        changed |= _inline_block(fn.body, module, keep)
    return changed


def _callee(op: ir.Op, module: ir.Module, keep: frozenset[str]) -> ir.Function | None:
    if op.kind == "func.call" and not op.attrs.get("no_inline"):
        target = op.attrs.get("callee")
    elif op.kind == "composite" and op.attrs.get("name") not in keep:
        target = op.attrs.get("decomposition")
    else:
        return None
    return module.functions.get(target)


def _inline_block(block: ir.Block, module: ir.Module, keep: frozenset[str]) -> bool:
    changed, ops, mapping = False, [], {}
    for op in block.ops:
        for region in op.regions:
            for inner in region.blocks:
                changed |= _inline_block(inner, module, keep)
        callee = _callee(op, module, keep)
        if callee is None:
            ops.append(op)
            continue
        body, results = _clone_body(callee, op)
        ops.extend(body)
        # A callee that returns its argument maps the call's result to an operand,
        # which may itself be the result of an earlier inlined call: resolve it now,
        # so one `replace_all_uses` leaves no use of a removed value.
        mapping.update(zip(op.results, (mapping.get(r, r) for r in results)))
        changed = True
    block.ops = ops
    block.replace_all_uses(mapping)
    return changed


def _clone_body(fn: ir.Function, call: ir.Op) -> tuple[list[ir.Op], list[ir.Value]]:
    vmap = dict(zip(fn.args, call.operands))
    ops = [_clone_op(op, vmap, call) for op in fn.body.ops[:-1]]
    return ops, [vmap.get(v, v) for v in fn.body.terminator.operands]


def _clone_op(op: ir.Op, vmap: dict, call: ir.Op) -> ir.Op:
    results = [ir.Value(r.type) for r in op.results]
    regions = [ir.Region([_clone_block(b, vmap, call) for b in r.blocks])
               for r in op.regions]
    vmap.update(zip(op.results, results))
    loc, name = (op.loc, op.name) if op.loc else (call.loc, _join(call.name, op.name))
    return op.replace(operands=[vmap.get(v, v) for v in op.operands], results=results,
                      attrs=dict(op.attrs), regions=regions, loc=loc, name=name)


def _clone_block(block: ir.Block, vmap: dict, call: ir.Op) -> ir.Block:
    args = [ir.Value(a.type) for a in block.args]
    vmap.update(zip(block.args, args))
    return ir.Block(args, [_clone_op(op, vmap, call) for op in block.ops])


def _join(outer: str, inner: str) -> str:
    return f"{outer}/{inner}" if outer and inner else outer or inner


def _drop_unreachable(module: ir.Module) -> bool:
    live = {n for n, f in module.functions.items() if f.visibility != "private"}
    work = list(live)
    while work:
        for op in ir.walk(module.functions[work.pop()].body):
            for target in (op.attrs.get("callee"), op.attrs.get("decomposition")):
                if isinstance(target, str) and target in module.functions and target not in live:
                    live.add(target)
                    work.append(target)
    dead = [n for n in module.functions if n not in live]
    for n in dead:
        del module.functions[n]
    return bool(dead)
