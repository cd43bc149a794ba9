"""`lower_module`: one kernel per op of the entry function, in program order.

A `fusion` op is one kernel named after its hero ("dot_general_fusion.2"), whose
`ops` are the fused ops and whose `notes` carry the fusion kind and the pass's
decisions; if the fusion rule cannot emit it (LoweringError, e.g. `Unsupported`), its
ops are lowered one by one instead, each kernel noted "fallback: <why>".

Buffers: parameters are `arg0..`, results `out0..` (every output its own buffer: a result
that is a parameter, a non-splat constant or a repeated value gets a copy kernel), and
other op results are HBM temporaries `t0..`. Constants never run as ops: a splat
constant becomes a Memset kernel just before its first use; any other constant is
initial data, a DRAM tensor named "const:<i>" whose array is in `program.constants`
(the runtime loads it into HBM once per executable).

Control flow (`while`, `case`, a surviving `func.call`) is lowered by control.py into
nested step lists (`hw.program.While` / `Case`): the ops of each region are lowered like
the function body, into the step list being built (`self.kernels` is always the
current one; `nested()` switches to a fresh one).
"""
from __future__ import annotations

import itertools
import os
from contextlib import contextmanager
from typing import Any

import numpy as np

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import Collective, DramTensor, Program, Step, walk_kernels, walk_steps

from . import control, movement
from .builder import KernelBuilder, Limits
from .errors import LoweringError
from .fusion import fusion_notes
from .listing import format_program
from .registry import LowerCtx, get_rule
from .registry import op_label as _label

UNSUPPORTED_DTYPES = ("float64", "complex64", "complex128", "token")
PRECISIONS = {"default": "default", "bfloat16": "default", "high": "high",
              "tensorfloat32": "high", "highest": "highest", "float32": "highest"}
RETURNS = ("return", "func.return")


def resolve_precision(matmul_precision: str | None) -> str:
    """What precision DEFAULT means: the argument, else $JAX_TRN_MATMUL_PRECISION."""
    name = matmul_precision or os.environ.get("JAX_TRN_MATMUL_PRECISION") or "default"
    try:
        return PRECISIONS[name.lower()]
    except KeyError:
        raise LoweringError(f"unknown matmul precision {name!r}; expected one of "
                            f"{sorted(PRECISIONS)}") from None


def check_dtypes(op: ir.Op) -> None:
    for v in (*op.operands, *op.results):
        if v.dtype in UNSUPPORTED_DTYPES or v.dtype not in ir.DTYPES:
            raise LoweringError(f"{v.dtype} is not supported by the Trainium hardware "
                                f"({op.describe()})")


def splat_value(value: np.ndarray) -> Any | None:
    """The single value of an all-equal (bitwise) array, else None."""
    flat = np.ascontiguousarray(value).reshape(-1)
    if flat.size == 0:
        return 0
    as_bytes = flat.view(np.uint8).reshape(flat.size, -1)
    return flat[0] if (as_bytes == as_bytes[0]).all() else None


class _Lowering:
    """The state of lowering one function: where every value lives, kernels so far."""

    def __init__(self, fn: ir.Function, spec: Any, precision: str, target: str | None,
                 module: ir.Module | None = None):
        self.fn, self.spec, self.precision, self.target = fn, spec, precision, target
        self.module = module
        self.limits = Limits.of(spec)
        self.where: dict[int, DramTensor] = {}
        self.pending: dict[int, ir.Op] = {}         # splat constants not yet written
        self.consts: dict[str, np.ndarray] = {}     # known values, by DRAM name
        self.constants: dict[str, np.ndarray] = {}  # initial data for the runtime
        self.kernels: list[Step] = []              # the step list being built
        self.cursor: tuple[ir.Block, int] | None = None   # the op being lowered
        self.hoisted: set[int] = set()              # ids of ops lowered out of a loop
        self.temps: list[DramTensor] = []
        self._ids = itertools.count()
        self.params = [self._param(i, a) for i, a in enumerate(fn.args)]
        self.outputs = [DramTensor(f"out{i}", tuple(t.shape), t.dtype)
                        for i, t in enumerate(fn.result_types)]

    def _param(self, i: int, arg: ir.Value) -> DramTensor:
        t = DramTensor(f"arg{i}", tuple(arg.shape), arg.dtype)
        self.where[id(arg)] = t
        return t

    # --- the walk ---------------------------------------------------------------------

    def run(self) -> Program:
        body = self.fn.body
        if not body.ops or body.terminator.kind not in RETURNS:
            raise LoweringError(f"function {self.fn.name} does not end in a return")
        self._check_dtypes()
        claims = self._claim_outputs(body.terminator)
        self.lower_block(body, claims)
        self._copy_unclaimed(body.terminator, claims)
        return self._program()

    def lower_block(self, block: ir.Block, claims: dict[int, DramTensor]) -> None:
        """Lowers the ops of `block` (not its terminator) into the current step list."""
        outer = self.cursor
        for i, op in enumerate(block.ops[:-1]):
            if id(op) not in self.hoisted:
                self.cursor = (block, i)
                self._lower(op, claims)
        self.cursor = outer

    @contextmanager
    def nested(self):
        """Lowers into a fresh step list (a loop's cond or body, a branch): yields it."""
        outer, self.kernels = self.kernels, []
        try:
            yield self.kernels
        finally:
            self.kernels = outer

    def _check_dtypes(self) -> None:
        """Ops first (their error names a source location), then unused arguments."""
        for op in ir.walk(self.fn.body):
            if op.kind not in RETURNS:
                check_dtypes(op)
        for i, arg in enumerate(self.fn.args):
            if arg.dtype in UNSUPPORTED_DTYPES or arg.dtype not in ir.DTYPES:
                raise LoweringError(f"{arg.dtype} is not supported by the Trainium hardware "
                                    f"(argument {i} of {self.fn.name}: {arg.type})")

    def _claim_outputs(self, ret: ir.Op) -> dict[int, DramTensor]:
        """Results computed by an op write straight into their output buffer (first use)."""
        claims: dict[int, DramTensor] = {}
        args = {id(a) for a in self.fn.args}
        for v, out in zip(ret.operands, self.outputs):
            if id(v) not in args and id(v) not in claims:
                claims[id(v)] = out
        return claims

    def _lower(self, op: ir.Op, claims: dict[int, DramTensor]) -> None:
        if op.kind == "constant":
            return self._constant(op, claims)
        if op.kind == "fusion":
            return self._fusion(op, claims)
        if op.kind in control.STRUCTURED:
            return control.STRUCTURED[op.kind](self, op, claims)
        ins = [self.where[id(v)] for v in op.operands]
        outs = [self._result(v, claims) for v in op.results]
        rule = get_rule(op.kind, self.target)
        if rule is None:
            raise LoweringError(f"no lowering for {op.describe()}")
        start = len(self.kernels)
        self._run(op, f"{op.kind}.{next(self._ids)}",
                  lambda ctx: rule(ctx, *ins, **op.attrs), outs)
        self._write_used_constants(op, start)

    def _write_used_constants(self, op: ir.Op, start: int) -> None:
        """Splat constants the op's kernels read are written just before them (a rule
        may not read one at all, e.g. a reduce's identity init)."""
        used = {name for k in self.kernels[start:] for name in k.dram}
        for v in op.operands:
            if id(v) in self.pending and self.where[id(v)].name in used:
                mine = self.kernels[start:]
                del self.kernels[start:]
                self._fill(self.pending.pop(id(v)))
                self.kernels.extend(mine)

    # --- fusions --------------------------------------------------------------------------

    def _fusion(self, op: ir.Op, claims: dict[int, DramTensor]) -> None:
        """One kernel for the fusion op; if its rule cannot, its ops one by one."""
        ins = [self.where[id(v)] for v in op.operands]
        outs = [self._result(v, claims) for v in op.results]
        block = op.regions[0].block
        ops = [_label(o) for o in block.ops[:-1] if o.kind != "constant"]
        rule, notes = get_rule("fusion", self.target), fusion_notes(op)
        kernels, temps = len(self.kernels), len(self.temps)
        try:
            self._run(op, f"{_hero(block)}_fusion.{next(self._ids)}",
                      lambda ctx: rule(ctx, *ins, **op.attrs), outs, ops, notes)
        except LoweringError as e:
            del self.kernels[kernels:], self.temps[temps:]
            return self._unfuse(op, ins, outs, notes + [f"fallback: {_reason(e, op)}"])
        self._write_used_constants(op, kernels)

    def _unfuse(self, op: ir.Op, ins: list[DramTensor], outs: list[DramTensor],
                notes: list[str]) -> None:
        """Lowers the fusion's ops one by one (each its own kernel), tagged `notes`."""
        for v in op.operands:
            if id(v) in self.pending:
                self._fill(self.pending.pop(id(v)))
        block, start = op.regions[0].block, len(self.kernels)
        self.where.update((id(a), t) for a, t in zip(block.args, ins))
        args = {id(a) for a in block.args}
        claims: dict[int, DramTensor] = {}
        for v, out in zip(block.terminator.operands, outs):
            if id(v) not in args and id(v) not in claims:
                claims[id(v)] = out
        self.lower_block(block, claims)
        self._copy_unclaimed(block.terminator, claims, outs)
        for k in self.kernels[start:]:
            k.notes[:0] = notes

    def lower_op(self, op: ir.Op) -> None:
        """Lowers one op into the current step list (its results into temporaries)."""
        self._lower(op, {})

    def operand(self, v: ir.Value) -> DramTensor:
        """Where `v` lives, writing it first if it is a splat constant not yet written."""
        return self._operand(v)

    def _operand(self, v: ir.Value) -> DramTensor:
        if id(v) in self.pending:
            self._fill(self.pending.pop(id(v)))
        return self.where[id(v)]

    def result(self, v: ir.Value, claims: dict[int, DramTensor]) -> DramTensor:
        """The buffer `v` is computed into: its claimed buffer, else a fresh temporary."""
        return self._result(v, claims)

    def _result(self, v: ir.Value, claims: dict[int, DramTensor]) -> DramTensor:
        t = claims.get(id(v))
        if t is None:
            t = DramTensor(f"t{len(self.temps)}", tuple(v.shape), v.dtype)
            self.temps.append(t)
        self.where[id(v)] = t
        return t

    # --- constants ------------------------------------------------------------------------

    def _constant(self, op: ir.Op, claims: dict[int, DramTensor]) -> None:
        v = op.result
        value = np.asarray(op.attrs["value"]).astype(ir.np_dtype(v.dtype)).reshape(v.shape)
        if splat_value(value) is None:
            t = DramTensor(f"const:{len(self.constants)}", tuple(v.shape), v.dtype)
            self.constants[t.name] = value
            self.where[id(v)] = t
            self.consts[t.name] = value
            claims.pop(id(v), None)             # outputs get a copy of the data
            return
        self.pending[id(v)] = op
        t = self._result(v, claims)
        self.consts[t.name] = np.broadcast_to(splat_value(value), v.shape)
        if id(v) in claims:
            self._operand(v)

    def _fill(self, op: ir.Op, into: DramTensor | None = None) -> None:
        t = into or self.where[id(op.result)]
        value = splat_value(np.asarray(op.attrs["value"]).astype(ir.np_dtype(t.dtype)))
        self._run(op, f"constant.{next(self._ids)}",
                  lambda ctx: movement.fill(ctx.kb, t, value), [t])

    def fill_into(self, v: ir.Value, dst: DramTensor) -> bool:
        """Writes the not-yet-written splat constant `v` straight into `dst` (leaving
        `v`'s own buffer pending); False if `v` is not such a constant."""
        op = self.pending.get(id(v))
        if op is None:
            return False
        self._fill(op, dst)
        return True

    def flush_pending(self, values) -> None:
        """Writes the pending splat constants among `values` now (before control flow,
        whose regions may use them on only some paths)."""
        for v in values:
            if id(v) in self.pending:
                self._fill(self.pending.pop(id(v)))

    def copy(self, op: ir.Op, dst: DramTensor, src: DramTensor) -> None:
        """A copy kernel `src` -> `dst`, attributed to `op`."""
        self._run(op, f"copy.{next(self._ids)}",
                  lambda ctx: movement.copy(ctx.kb, dst, src), [dst])

    def name(self, kind: str) -> str:
        return f"{kind}.{next(self._ids)}"

    def _copy_unclaimed(self, ret: ir.Op, claims: dict[int, DramTensor],
                        outputs: list[DramTensor] | None = None) -> None:
        for v, out in zip(ret.operands, self.outputs if outputs is None else outputs):
            if claims.get(id(v)) is out:
                continue
            self.copy(ret, out, self._operand(v))

    # --- kernels ---------------------------------------------------------------------------

    def _run(self, op: ir.Op, name: str, emit, outs: list[DramTensor],
             ops: list[str] | None = None, notes: list[str] = ()) -> None:
        label = ops or [_label(op)]
        ctx = LowerCtx(self.spec, self.limits, self._builder(name, notes), op, outs,
                       self.consts, self.precision, self._temp, None)
        ctx.split = lambda suffix: self._split(ctx, name, suffix, label, notes)
        try:
            emit(ctx)
        except isa.IsaError as e:
            raise LoweringError(f"internal error lowering {op.describe()}: {e}") from e
        except LoweringError as e:
            if op.describe() in str(e):
                raise
            raise LoweringError(f"{e} ({op.describe()})") from e
        self.kernels.append(ctx.kb.finish(label))

    def _builder(self, name: str, notes) -> KernelBuilder:
        kb = KernelBuilder(name, self.limits, self.spec)
        kb.notes.extend(notes)
        return kb

    def _split(self, ctx: LowerCtx, name: str, suffix: str, label: list[str],
               notes) -> KernelBuilder:
        self.kernels.append(ctx.kb.finish(label))
        return self._builder(f"{name}.{suffix}", notes)

    def temp(self, shape: tuple[int, ...], dtype: str) -> DramTensor:
        return self._temp(shape, dtype)

    def _temp(self, shape: tuple[int, ...], dtype: str) -> DramTensor:
        t = DramTensor(f"t{len(self.temps)}", tuple(shape), dtype)
        self.temps.append(t)
        return t

    def _program(self) -> Program:
        used = {name for k in walk_kernels(self.kernels) for name in k.dram}
        used |= {t.name for s in walk_steps(self.kernels) if isinstance(s, Collective)
                 for t in (*s.operands, *s.results)}
        self.temps = [t for t in self.temps if t.name in used]   # e.g. unwritten splats
        text = format_program(self.params, self.outputs, self.temps, self.kernels,
                              self.constants)
        return Program(self.params, self.outputs, self.temps, self.kernels, text,
                       self.constants)



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


def lower_module(module: ir.Module, spec: Any, *, matmul_precision: str | None = None,
                 target: str | None = None) -> Program:
    """Lowers the entry function of `module` to a Program for one NeuronCore of `spec`.

    Args:
      module: the per-device IR (after hlo_passes).
      spec: the `hw.spec.CoreSpec` (or a chip spec with `.core`).
      matmul_precision: what a dot_general at precision DEFAULT runs as: "default" (bf16
        operands), "high" (tf32) or "highest" (fp32); defaults to
        $JAX_TRN_MATMUL_PRECISION, else "default".
      target: a generation name ("trn2") selecting target-specific rules, if any.

    Returns:
      The Program; non-splat constants are in `program.constants` (name -> array).

    Raises:
      LoweringError: an op without a rule, a dtype the hardware lacks, or a kernel that
        does not fit the core; the message names the op and its source location.
    """
    precision = resolve_precision(matmul_precision)
    return _Lowering(module.main, spec, precision, target, module).run()
