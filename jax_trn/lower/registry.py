"""The table of lowering rules and the context a rule runs in.

A rule lowers one op kind: `rule(ctx, *operands, **attrs)`, where `operands` are the
DRAM tensors of the op's operands and `attrs` the op's attributes; it emits instructions
through `ctx.kb` that write the op's results into `ctx.outs`. Rules are registered by op
kind (the stablehlo name without the dialect), optionally for one target generation:

    @register_lowering("transpose")
    def _transpose_lower(ctx, x, *, permutation): ...

    register_lowering("add")(partial(_elementwise, "add"))
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from hlo_passes import ir
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, Limits

Rule = Callable[..., None]

LOWERINGS: dict[str, Rule] = {}
_TARGET_LOWERINGS: dict[str, dict[str, Rule]] = {}


@dataclass(slots=True)
class LowerCtx:
    """What a rule sees while it lowers `op` into the kernel being built."""
    spec: Any                       # the hw CoreSpec
    limits: Limits                  # what codegen reads from the spec
    kb: KernelBuilder               # the kernel being built
    op: ir.Op                       # the op being lowered (for loc, regions, describe())
    outs: list[DramTensor]          # where its results go
    consts: dict[str, np.ndarray]   # compile-time values of operands, by DRAM name
    matmul_precision: str           # what precision DEFAULT means: default|high|highest
    temp: Callable[[tuple[int, ...], str], DramTensor]   # a fresh HBM temporary
    split: Callable[[str], KernelBuilder]                # end this kernel, start another

    def constant(self, t: DramTensor) -> np.ndarray | None:
        """The value of operand `t` if it is a compile-time constant."""
        return self.consts.get(t.name)

    def next_kernel(self, suffix: str) -> KernelBuilder:
        """Ends the current kernel (a DRAM barrier) and continues in a new one."""
        self.kb = self.split(suffix)
        return self.kb


def register_lowering(*kinds: str, target: str | None = None) -> Callable[[Rule], Rule]:
    """Registers a rule for op `kinds`, for every target or only for `target` ("trn2")."""
    def register(rule: Rule) -> Rule:
        table = LOWERINGS if target is None else _TARGET_LOWERINGS.setdefault(target, {})
        for kind in kinds:
            table[kind] = rule
        return rule
    return register


def get_rule(kind: str, target: str | None = None) -> Rule | None:
    """The target's own rule for `kind` if it has one, else the default."""
    rule = _TARGET_LOWERINGS.get(target or "", {}).get(kind)
    return rule if rule is not None else LOWERINGS.get(kind)


def op_label(op: ir.Op) -> str:
    """How a kernel (or step) names a source op: "kind at file.py:12 [jit(f)/scope/kind]"
    -- the op kind, the user's source line and JAX's op name (its name stack, with any
    `jax.named_scope`), each part only when known. `profiler.trace.parse_op` reads it."""
    label = op.kind + (f" at {op.loc}" if op.loc else "")
    return label + (f" [{op.name}]" if op.name else "")
