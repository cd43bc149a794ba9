"""The compiler's lowering rule for `kernel_call` (a hand-written kernel called from
JAX, call.py): the kernel is traced into the op's kernel for the generation being
compiled for. The kernel takes the name its author gave it ("rmsnorm_kernel.3"), so
profiles and traces show it under that name, each instruction with its source line.
"""
from __future__ import annotations

from jax_trn.lower.registry import LowerCtx, register_lowering

from .kernel import lookup, trace_into


@register_lowering("kernel_call")
def _kernel_call(ctx: LowerCtx, *ins, kernel: str, **_):
    call = lookup(kernel)
    ctx.kb.name = f"{call.name}.{ctx.kb.name.rpartition('.')[2]}"
    trace_into(call, ctx.kb, list(ins), ctx.temp, list(ctx.outs), ctx.constant_tensor)
