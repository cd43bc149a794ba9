"""The lowering registry: one table of rules by op kind, each of an explicit kind.

- **kernel rules** emit ISA into the kernel being built. `rule(ctx, *operands, **attrs)`
  gets a `LowerCtx`, the DRAM tensors of the op's operands and the op's attributes, and
  writes the op's results into `ctx.outs` through `ctx.kb`:

      @register_lowering("transpose")
      def _transpose_lower(ctx: LowerCtx, x, *, permutation): ...

      register_lowering("add")(partial(_elementwise, "add"))

- **step rules** emit steps of the program between kernels: control flow (`while`,
  `case`, calls; control.py) and collectives (collective.py). `rule(ctx, op, claims)`
  gets the `StepCtx` of the function being lowered (driver.py), the op, and `claims`
  (value id -> the buffer a result must be computed into: a function output):

      @register_step("while")
      def lower_while(ctx: StepCtx, op, claims): ...

A rule may be registered for one generation only (`target="trn3"`, like JAX's
`platform=`) or for ops with a given operand count (`operands=4`: the two-operand
`reduce` of argmax is another rule than the one-operand reduce); lookup prefers the
most specific. Constants and fusion ops are the driver's own (driver.py says why).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hlo_passes import ir
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder
from .target import Target


class RuleKind(enum.Enum):
    KERNEL = "kernel"       # emits instructions into a kernel: rule(LowerCtx, *ins, **attrs)
    STEP = "step"           # emits program steps: rule(StepCtx, op, claims)


InPlace = Callable[[ir.Op, ir.Value], bool]


@dataclass(frozen=True)
class Rule:
    kind: RuleKind
    fn: Callable[..., None]
    # Kernel rules only: whether the op may write its result over operand `arg` it reads
    # (each tile of the operand is read before the same tile of the result is written,
    # tiles disjoint), so a loop body can update a carried buffer in place (control.py).
    in_place: InPlace | None = None

    def writes_in_place(self, op: ir.Op, arg: ir.Value) -> bool:
        return self.in_place is not None and self.in_place(op, arg)


Key = tuple[str, str | None, int | None]        # (op kind, generation, operand count)
LOWERINGS: dict[Key, Rule] = {}


def _register(kinds, rule: Rule, target: str | None, operands: int | None):
    for kind in kinds:
        key = (kind, target, operands)
        if key in LOWERINGS:
            raise ValueError(f"a lowering rule for {_key_text(key)} is already registered")
        LOWERINGS[key] = rule


def register_lowering(*kinds: str, target: str | None = None, operands: int | None = None,
                      in_place: InPlace | None = None) -> Callable:
    """Registers a kernel rule for op `kinds` (optionally only for generation `target`,
    or only for ops with `operands` operands)."""
    def register(fn):
        _register(kinds, Rule(RuleKind.KERNEL, fn, in_place), target, operands)
        return fn
    return register


def register_step(*kinds: str, target: str | None = None) -> Callable:
    """Registers a step rule (control flow, collectives) for op `kinds`."""
    def register(fn):
        _register(kinds, Rule(RuleKind.STEP, fn), target, None)
        return fn
    return register


def unregister(kind: str, target: str | None = None, operands: int | None = None) -> None:
    """Removes a rule (tests that register their own)."""
    del LOWERINGS[(kind, target, operands)]


def lookup(kind: str, operands: int | None = None, target: str | None = None
           ) -> Rule | None:
    """The rule for an op of `kind` with `operands` operands on generation `target`:
    the generation's own rule before the default, a rule for that operand count
    before the general one."""
    for key in ((kind, target, operands), (kind, target, None),
                (kind, None, operands), (kind, None, None)):
        if key in LOWERINGS:
            return LOWERINGS[key]
    return None


def rule_for(op: ir.Op, target: str | None = None) -> Rule | None:
    return lookup(op.kind, len(op.operands), target)


def _key_text(key: Key) -> str:
    kind, target, operands = key
    return kind + (f" on {target}" if target else "") + (
        f" with {operands} operands" if operands is not None else "")


@dataclass(slots=True)
class LowerCtx:
    """What a kernel rule sees while it lowers `op` into the kernel being built."""
    target: Target                  # what codegen may assume about the core
    kb: KernelBuilder               # the kernel being built
    op: ir.Op                       # the op being lowered (for loc, regions, describe())
    outs: list[DramTensor]          # where its results go
    consts: dict[str, np.ndarray]   # compile-time values of operands, by DRAM name
    matmul_precision: str           # what precision DEFAULT means: default|high|highest
    temp: Callable[[tuple[int, ...], str], DramTensor]   # a fresh HBM temporary
    split: Callable[[str], KernelBuilder]                # end this kernel, start another
    # where a value of the enclosing function lives (a region may read one: CSE shares
    # a region's constants with the function's)
    tensor_of: Callable[[ir.Value], DramTensor | None] = lambda v: None
    # a program constant holding an array (DramTensor), for kernels that bring their own
    # data (jax_trn.kernels' nl.shared_constant)
    constant_tensor: Callable[[np.ndarray, str], DramTensor] | None = None

    def constant(self, t: DramTensor) -> np.ndarray | None:
        """The value of operand `t` if it is a compile-time constant."""
        return self.consts.get(t.name)

    def next_kernel(self, suffix: str) -> KernelBuilder:
        """Ends the current kernel (a DRAM barrier) and continues in a new one."""
        self.kb = self.split(suffix)
        return self.kb


def op_label(op: ir.Op) -> str:
    """How a kernel (or step) names a source op: "kind at file.py:12 [jit(f)/scope/kind]"
    -- the op kind, the user's source line and JAX's op name (its name stack, with any
    `jax.named_scope`), each part only when known. `profiler.trace.parse_op` reads it."""
    label = op.kind + (f" at {op.loc}" if op.loc else "")
    return label + (f" [{op.name}]" if op.name else "")
