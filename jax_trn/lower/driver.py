"""`lower_module`: one kernel per op of the entry function, in program order; `StepCtx`,
the state of that walk and the public face step rules see.

Each op is lowered by its rule in the registry (registry.py): a kernel rule becomes
one kernel (or a few, `LowerCtx.next_kernel`), a step rule (control flow, collectives)
adds steps through the `StepCtx`.

A `fusion` op is one kernel named after its hero ("dot_general_fusion.2"), whose
`ops` are the fused ops and whose `notes` carry the fusion kind and the pass's
decisions; if the fusion rule cannot emit it (LoweringError, e.g. `Unsupported`), its
ops are lowered one by one instead, each kernel noted "fallback: <why>" (a "rows"
fusion's ops are first re-fused without row fusion: loop and reduction kernels).

Buffers: parameters are `arg0..`, results `out0..` (every output its own buffer: a result
that is a parameter, a non-splat constant or a repeated value gets a copy kernel), and
other op results are HBM temporaries `t0..`. Constants never run as ops: a splat
constant becomes a Memset kernel just before its first use; any other constant is
initial data, a DRAM tensor named "const:<i>" whose array is in `program.constants`
(the runtime loads it into HBM once per executable).

Control flow (`while`, `case`, a surviving `func.call`) is lowered by control.py's step
rules into nested step lists (`hw.program.While` / `Case`): the ops of each region are
lowered like the function body, into the step list being built (`StepCtx.append` adds
to the current one; `StepCtx.nested()` switches to a fresh one).
"""
from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np

from hlo_passes import ir
from hlo_passes.passes.fusion import refuse_without_rows
from jax_trn.hw import isa
from jax_trn.hw.dtypes import DEVICE_TYPES
from jax_trn.hw.program import (Collective, DramTensor, HostCallback, Program, Step, walk_kernels,
                                walk_steps)
from jax_trn.hw.spec import ChipSpec, CoreSpec

from . import buffers, movement
from .builder import KernelBuilder
from .errors import LoweringError
from .fusion import dominant_first, fusion_notes
from .listing import format_program
from .registry import LowerCtx, Rule, RuleKind, rule_for
from .registry import op_label as _label
from .target import Target

PRECISIONS = ("default", "high", "highest")      # what DEFAULT may mean (dot.py)
RETURNS = ("return", "func.return")


def check_dtypes(op: ir.Op) -> None:
    for v in (*op.operands, *op.results):
        if v.dtype not in DEVICE_TYPES:
            raise LoweringError(f"{v.dtype} is not supported by the Trainium hardware "
                                f"({op.describe()})")


def splat_value(value: np.ndarray) -> Any | None:
    """The single value of an all-equal (bitwise) array, else None."""
    flat = np.ascontiguousarray(value).reshape(-1)
    if flat.size == 0:
        return 0
    as_bytes = flat.view(np.uint8).reshape(flat.size, -1)
    return flat[0] if (as_bytes == as_bytes[0]).all() else None


class StepCtx:
    """The state of lowering one function, and what step rules (registry.py) may do
    with it: where every value lives, the step list being built, the walk.

    Step rules use only the public methods below. Buffers: `operand` (where a value
    lives, written first if it is a pending splat constant), `result` (the buffer a
    result is computed into), `bind`, `location`, `temp`; kinds of buffers:
    `is_param`, `is_constant_data`, `temp_names`, `constant`,
    `is_pending`; steps: `append`, `name`, `copy`, `fill_into`, `write_pending`; the
    walk: `position`, `lower_block`, `nested`, `hoist`, `is_hoisted`, `rule_for`,
    `function`; per-rule state: `state`."""

    def __init__(self, fn: ir.Function, target: Target, precision: str,
                 module: ir.Module | None = None):
        self._fn, self._target, self._precision = fn, target, precision
        self._module = module
        self._where: dict[int, DramTensor] = {}
        self._pending: dict[int, ir.Op] = {}        # splat constants not yet written
        self._consts: dict[str, np.ndarray] = {}    # known values, by DRAM name
        self._constants: dict[str, np.ndarray] = {}  # initial data for the runtime
        self._steps: list[Step] = []                # the step list being built
        self._cursor: tuple[ir.Block, int] | None = None   # the op being lowered
        self._hoisted: set[int] = set()             # ids of ops lowered out of a loop
        self._temps: list[DramTensor] = []
        self._rule_state: dict[str, Any] = {}
        self._ids = itertools.count()
        self._params = [self._param(i, a) for i, a in enumerate(fn.args)]
        self._outputs = [DramTensor(f"out{i}", tuple(t.shape), t.dtype)
                         for i, t in enumerate(fn.result_types)]

    def _param(self, i: int, arg: ir.Value) -> DramTensor:
        t = DramTensor(f"arg{i}", tuple(arg.shape), arg.dtype)
        self._where[id(arg)] = t
        return t

    # --- buffers ------------------------------------------------------------------------

    def operand(self, v: ir.Value) -> DramTensor:
        """Where `v` lives, writing it first if it is a splat constant not yet written."""
        if id(v) in self._pending:
            self._fill(self._pending.pop(id(v)))
        return self._where[id(v)]

    def result(self, v: ir.Value, claims: dict[int, DramTensor]) -> DramTensor:
        """The buffer `v` is computed into: its claimed buffer, else a fresh temporary."""
        t = claims.get(id(v))
        if t is None:
            t = self.temp(tuple(v.shape), v.dtype)
        self._where[id(v)] = t
        return t

    def bind(self, values, tensors) -> None:
        """`values[i]` lives in `tensors[i]` (block arguments, a loop's results)."""
        self._where.update((id(v), t) for v, t in zip(values, tensors))

    def location(self, v: ir.Value) -> DramTensor | None:
        """Where `v` lives (None: not lowered yet); unlike `operand`, writes nothing."""
        return self._where.get(id(v))

    def temp(self, shape: tuple[int, ...], dtype: str) -> DramTensor:
        """A fresh HBM temporary."""
        t = DramTensor(f"t{len(self._temps)}", tuple(shape), dtype)
        self._temps.append(t)
        return t

    def is_param(self, t: DramTensor) -> bool:
        return t.name in {p.name for p in self._params}

    def is_constant_data(self, t: DramTensor) -> bool:
        """A non-splat constant: initial data the runtime loads, never written."""
        return t.name in self._constants

    def temp_names(self) -> set[str]:
        """The names of the HBM temporaries made so far."""
        return {t.name for t in self._temps}

    def constant(self, t: DramTensor) -> np.ndarray | None:
        """The compile-time value of the buffer `t` if it is known."""
        return self._consts.get(t.name)

    def is_pending(self, v: ir.Value) -> bool:
        """`v` is a splat constant whose buffer is not written yet."""
        return id(v) in self._pending

    # --- steps --------------------------------------------------------------------------

    def append(self, *steps: Step) -> None:
        """Adds steps (a While, Case, Collective, ...) to the current step list."""
        self._steps.extend(steps)

    def name(self, kind: str) -> str:
        """A fresh step name: "while.4"."""
        return f"{kind}.{next(self._ids)}"

    def copy(self, op: ir.Op, dst: DramTensor, src: DramTensor) -> None:
        """A copy kernel `src` -> `dst`, attributed to `op`."""
        self._run(op, self.name("copy"), lambda ctx: movement.copy(ctx.kb, dst, src), [dst])

    def fill_into(self, v: ir.Value, dst: DramTensor) -> bool:
        """Writes the not-yet-written splat constant `v` straight into `dst` (leaving
        `v`'s own buffer pending); False if `v` is not such a constant."""
        op = self._pending.get(id(v))
        if op is None:
            return False
        self._fill(op, dst)
        return True

    def write_pending(self, values) -> None:
        """Writes the pending splat constants among `values` now (before control flow,
        whose regions may use them on only some paths)."""
        for v in values:
            if id(v) in self._pending:
                self._fill(self._pending.pop(id(v)))

    @property
    def target(self) -> Target:
        """What the compiler may assume about the core (SBUF bytes, ...)."""
        return self._target

    # --- the walk -----------------------------------------------------------------------

    @property
    def position(self) -> tuple[ir.Block, int]:
        """The op being lowered: (its block, its index in the block)."""
        return self._cursor

    def lower_block(self, block: ir.Block, claims: dict[int, DramTensor]) -> None:
        """Lowers the ops of `block` (not its terminator) into the current step list."""
        outer = self._cursor
        for i, op in enumerate(block.ops[:-1]):
            if id(op) not in self._hoisted:
                self._cursor = (block, i)
                self._lower(op, claims)
        self._cursor = outer

    @contextmanager
    def nested(self):
        """Lowers into a fresh step list (a loop's cond or body, a branch): yields it."""
        outer, self._steps = self._steps, []
        try:
            yield self._steps
        finally:
            self._steps = outer

    def hoist(self, op: ir.Op) -> None:
        """Lowers `op` now, into the current step list (its results into temporaries),
        and skips it when its own block is lowered (a loop-invariant op)."""
        self._hoisted.add(id(op))
        self._lower(op, {})

    def is_hoisted(self, op: ir.Op) -> bool:
        return id(op) in self._hoisted

    def rule_for(self, op: ir.Op) -> Rule | None:
        """The registry's rule for `op` on this target."""
        return rule_for(op, self._target.generation)

    def function(self, name: str) -> ir.Function | None:
        """A function of the module by name (the callee of a call), if there is one."""
        return self._module.functions.get(name) if self._module is not None else None

    def state(self, owner: str, make: Callable[[], Any]) -> Any:
        """Per-function state a step rule keeps across ops (made by `make()` on first
        use), e.g. control.py's buffers of the loops being lowered."""
        if owner not in self._rule_state:
            self._rule_state[owner] = make()
        return self._rule_state[owner]

    # --- the function -------------------------------------------------------------------

    def run(self) -> Program:
        body = self._fn.body
        if not body.ops or body.terminator.kind not in RETURNS:
            raise LoweringError(f"function {self._fn.name} does not end in a return")
        self._check_dtypes()
        claims = self._claim_outputs(body.terminator)
        self.lower_block(body, claims)
        self._copy_unclaimed(body.terminator, claims)
        return self._program()

    def _check_dtypes(self) -> None:
        """Ops first (their error names a source location), then unused arguments."""
        for op in ir.walk(self._fn.body):
            if op.kind not in RETURNS:
                check_dtypes(op)
        for i, arg in enumerate(self._fn.args):
            if arg.dtype not in DEVICE_TYPES:
                raise LoweringError(f"{arg.dtype} is not supported by the Trainium hardware "
                                    f"(argument {i} of {self._fn.name}: {arg.type})")

    def _claim_outputs(self, ret: ir.Op) -> dict[int, DramTensor]:
        """Results computed by an op write straight into their output buffer (first use)."""
        claims: dict[int, DramTensor] = {}
        args = {id(a) for a in self._fn.args}
        for v, out in zip(ret.operands, self._outputs):
            if id(v) not in args and id(v) not in claims:
                claims[id(v)] = out
        return claims

    def _lower(self, op: ir.Op, claims: dict[int, DramTensor]) -> None:
        """One op, by its rule. Constants and fusion ops are the driver's own: a
        constant is no step but a buffer binding (splats are written just before their
        first use, `_write_used_constants`), and a fusion whose kernel rule fails falls
        back to lowering its ops one by one, i.e. to this walk (`_unfuse`)."""
        if op.kind == "constant":
            return self._constant(op, claims)
        if op.kind == "fusion":
            return self._fusion(op, claims)
        rule = self.rule_for(op)
        if rule is None:
            raise LoweringError(f"no lowering for {op.describe()}")
        if rule.kind is RuleKind.STEP:
            return rule.fn(self, op, claims)
        ins = [self._where[id(v)] for v in op.operands]
        outs = [self.result(v, claims) for v in op.results]
        start = len(self._steps)
        self._run(op, self.name(op.kind), lambda ctx: rule.fn(ctx, *ins, **op.attrs), outs)
        self._write_used_constants(op, start)

    def _write_used_constants(self, op: ir.Op, start: int) -> None:
        """Splat constants the op's kernels read are written just before them (a rule
        may not read one at all, e.g. a reduce's identity init)."""
        used = {name for k in self._steps[start:] for name in k.dram}
        for v in op.operands:
            if id(v) in self._pending and self._where[id(v)].name in used:
                mine = self._steps[start:]
                del self._steps[start:]
                self._fill(self._pending.pop(id(v)))
                self._steps.extend(mine)

    # --- fusions --------------------------------------------------------------------------

    def _fusion(self, op: ir.Op, claims: dict[int, DramTensor]) -> None:
        """One kernel for the fusion op; if its rule cannot, its ops one by one."""
        ins = [self._where[id(v)] for v in op.operands]
        outs = [self.result(v, claims) for v in op.results]
        block = op.regions[0].block
        ops = [_label(o) for o in dominant_first(block.ops[:-1]) if o.kind != "constant"]
        rule, notes = self.rule_for(op), fusion_notes(op)
        steps, temps = len(self._steps), len(self._temps)
        try:
            self._run(op, f"{_hero(block)}_fusion.{next(self._ids)}",
                      lambda ctx: rule.fn(ctx, *ins, **op.attrs), outs, ops, notes)
        except LoweringError as e:
            del self._steps[steps:], self._temps[temps:]
            return self._unfuse(op, ins, outs, notes + [f"fallback: {_reason(e, op)}"])
        self._write_used_constants(op, steps)

    def _unfuse(self, op: ir.Op, ins: list[DramTensor], outs: list[DramTensor],
                notes: list[str]) -> None:
        """Lowers the fusion's ops one by one (each its own kernel), tagged `notes`."""
        self.write_pending(op.operands)
        if op.attrs.get("fusion_kind") == "rows":
            refuse_without_rows(op)         # rows too long for SBUF: loop/reduction kernels
        block, start = op.regions[0].block, len(self._steps)
        self.bind(block.args, ins)
        args = {id(a) for a in block.args}
        claims: dict[int, DramTensor] = {}
        for v, out in zip(block.terminator.operands, outs):
            if id(v) not in args and id(v) not in claims:
                claims[id(v)] = out
        self.lower_block(block, claims)
        self._copy_unclaimed(block.terminator, claims, outs)
        for k in self._steps[start:]:
            k.notes[:0] = notes

    # --- constants ------------------------------------------------------------------------

    def constant_tensor(self, value: np.ndarray, dtype: str) -> DramTensor:
        """A DRAM tensor holding `value` from the start of every call (a program
        constant): what a hand-written kernel's `nl.shared_constant` reads."""
        t = DramTensor(f"const:{len(self._constants)}", tuple(value.shape), dtype)
        self._constants[t.name] = value
        self._consts[t.name] = value
        return t

    def _constant(self, op: ir.Op, claims: dict[int, DramTensor]) -> None:
        v = op.result
        value = np.asarray(op.attrs["value"]).astype(ir.np_dtype(v.dtype)).reshape(v.shape)
        if splat_value(value) is None:
            t = DramTensor(f"const:{len(self._constants)}", tuple(v.shape), v.dtype)
            self._constants[t.name] = value
            self._where[id(v)] = t
            self._consts[t.name] = value
            claims.pop(id(v), None)             # outputs get a copy of the data
            return
        self._pending[id(v)] = op
        t = self.result(v, claims)
        self._consts[t.name] = np.broadcast_to(splat_value(value), v.shape)
        if id(v) in claims:
            self.operand(v)

    def _fill(self, op: ir.Op, into: DramTensor | None = None) -> None:
        t = into or self._where[id(op.result)]
        value = splat_value(np.asarray(op.attrs["value"]).astype(ir.np_dtype(t.dtype)))
        self._run(op, self.name("constant"), lambda ctx: movement.fill(ctx.kb, t, value), [t])

    def _copy_unclaimed(self, ret: ir.Op, claims: dict[int, DramTensor],
                        outputs: list[DramTensor] | None = None) -> None:
        for v, out in zip(ret.operands, self._outputs if outputs is None else outputs):
            if claims.get(id(v)) is out:
                continue
            self.copy(ret, out, self.operand(v))

    # --- kernels ---------------------------------------------------------------------------

    def _run(self, op: ir.Op, name: str, emit, outs: list[DramTensor],
             ops: list[str] | None = None, notes: list[str] = ()) -> None:
        label = ops or [_label(op)]
        ctx = LowerCtx(self._target, self._builder(name, notes), op, outs, self._consts,
                       self._precision, self.temp, None,
                       lambda v: self._where.get(id(v)), self.constant_tensor)
        ctx.split = lambda suffix: self._split(ctx, name, suffix, label, notes)
        try:
            emit(ctx)
        except isa.IsaError as e:
            raise LoweringError(f"internal error lowering {op.describe()}: {e}") from e
        except LoweringError as e:
            if op.describe() in str(e):
                raise
            raise type(e)(f"{e} ({op.describe()})") from e     # a subclass stays one
        self._steps.append(ctx.kb.finish(label))

    def _builder(self, name: str, notes) -> KernelBuilder:
        kb = KernelBuilder(name, self._target)
        kb.notes.extend(notes)
        return kb

    def _split(self, ctx: LowerCtx, name: str, suffix: str, label: list[str],
               notes) -> KernelBuilder:
        self._steps.append(ctx.kb.finish(label))
        return self._builder(f"{name}.{suffix}", notes)

    def _program(self) -> Program:
        steps = self._steps
        used = {name for k in walk_kernels(steps) for name in k.dram}
        used |= {t.name for s in walk_steps(steps) if isinstance(s, (Collective, HostCallback))
                 for t in (*s.operands, *s.results)}
        temps = [t for t in self._temps if t.name in used]   # e.g. unwritten splats
        text = format_program(self._params, self._outputs, temps, steps, self._constants)
        slot_bytes, temp_slot = buffers.assign(temps, steps)
        return Program(self._params, self._outputs, temps, steps, text, self._constants,
                       slot_bytes, temp_slot)


def _hero(block: ir.Block) -> str:
    """What names a fusion's kernel, as XLA names fusions: its dot_general or reduce,
    else the op computing its first result ("multiply_fusion.3")."""
    kinds = [o.kind for o in block.ops]
    for kind in ("dot_general", "reduce"):
        if kind in kinds:
            return kind
    root = block.terminator.operands[0]
    return next((o.kind for o in block.ops if root in o.results), "loop")


def _reason(e: Exception, op: ir.Op) -> str:
    return str(e).replace(f" ({op.describe()})", "")


def lower_module(module: ir.Module, spec: CoreSpec | ChipSpec | Target, *,
                 matmul_precision: str = "default") -> Program:
    """Lowers the entry function of `module` to a Program for one NeuronCore of `spec`.

    Args:
      module: the per-device IR (after hlo_passes).
      spec: the `Target` to compile for, or the `hw.spec.CoreSpec` (or `ChipSpec`) it
        is derived from (`Target.of`); its generation selects per-generation rules.
      matmul_precision: what a dot_general at precision DEFAULT runs as: "default" (bf16
        operands), "high" (tf32) or "highest" (fp32). The canonical names only: the
        caller maps the user's spellings (the options, $JAX_TRN_MATMUL_PRECISION).

    Returns:
      The Program; non-splat constants are in `program.constants` (name -> array).

    Raises:
      LoweringError: an op without a rule, a dtype the hardware lacks, or a kernel that
        does not fit the core; the message names the op and its source location. Also an
        unknown `matmul_precision`.
    """
    if matmul_precision not in PRECISIONS:
        raise LoweringError(f"unknown matmul precision {matmul_precision!r}; expected one "
                            f"of {', '.join(PRECISIONS)}")
    return StepCtx(module.main, Target.of(spec), matmul_precision, module).run()
