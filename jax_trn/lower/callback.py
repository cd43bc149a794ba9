"""Host callbacks (`host_callback`) and the token ops that order them.

A `host_callback` op (the importer's form of `custom_call @trn.python_callback`, which
`jax_trn.jax_callbacks` emits for jax.debug.print, pure_callback, io_callback, ...) is
not a kernel: it becomes a `hw.program.HostCallback` step between kernels, which the
runtime executes by copying the operands to the host, calling the registered Python
function and copying its results back (`jax_trn.runtime.callbacks`). Its attributes:
`callback` (the registry key) and `device` (the partition that calls it for all
devices, or None: every device calls it with its own values).

Tokens order side effects; they carry no data. The importer gives them the type of
JAX's runtime tokens (bool[0]), so a token is an empty DRAM tensor: `after_all` and
`create_token` make one and compute nothing. Step order is program order, which the
token chains already imply.
"""
from __future__ import annotations

from hlo_passes import ir
from jax_trn.hw.program import DramTensor, HostCallback

from .driver import StepCtx
from .errors import LoweringError
from .registry import op_label as _label
from .registry import register_step


@register_step("host_callback")
def lower_host_callback(ctx: StepCtx, op: ir.Op, claims: dict[int, DramTensor]) -> None:
    """A `HostCallback` step: the runtime stops the device and calls the host."""
    key = op.attrs.get("callback")
    if not isinstance(key, int):
        raise LoweringError(f"host callback without a registry key ({op.describe()})")
    ins = [ctx.operand(v) for v in op.operands]
    outs = [ctx.result(r, claims) for r in op.results]
    ctx.append(HostCallback(ctx.name("host_callback"), key, ins, outs,
                            op.attrs.get("device"), [_label(op)]))


@register_step("after_all", "create_token")
def lower_token(ctx: StepCtx, op: ir.Op, claims: dict[int, DramTensor]) -> None:
    """A token: an empty buffer, nothing to compute."""
    for r in op.results:
        if r.shape != (0,) or r.dtype != "bool":
            raise LoweringError(f"{op.kind} of type {r.dtype}{list(r.shape)}, expected a "
                                f"token ({op.describe()})")
        ctx.result(r, claims)
