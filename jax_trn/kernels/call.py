"""A hand-written kernel as a JAX primitive, `trn_kernel`: one call of a kernel in a
JAX program.

- **shapes**: the kernel is traced for the system the program is traced for
  (`config.tracing_system`: an estimate's / comparison's, else this process's) to
  learn what it returns (`kernel.out_types`, cached); the program's compile traces it
  again for its own target;
- **on trn**: one `custom_call @trn.kernel` whose backend_config names the kernel
  ("kernel=<key>", `kernel.Call.key`); the importer makes it a `kernel_call` op and the
  compiler's rule (rule.py) traces the kernel into that op's kernel, for the
  generation being compiled for. It runs as one kernel on the hardware model;
- **elsewhere** (the CPU backend, ...): the kernel's numerics reference, the same
  kernel run on the hardware model's instruction semantics in numpy on the host
  (`kernel.simulate`, through `jax.pure_callback`), so programs stay portable;
- **vmap**: the kernel's own rule (`KernelFunction.def_vmap`), else one call per batch
  element (`lax.map`);
- **grad**: a kernel has no derivative of its own; pair a forward and a backward kernel
  with `jax.custom_vjp`;
- **shard_map**: each device runs the kernel on its own shard (the op is per-device);
  under automatic sharding (jit over a mesh), the kernel sees whole arrays: its Shardy
  rule makes every dimension need replication (`_replicated_rule`).
"""
from __future__ import annotations

import os
from functools import partial

import numpy as np
import jax
from jax._src import core, dispatch, source_info_util
from jax._src.interpreters import ad, batching, mlir
from jax.extend.core import Primitive

from hlo_passes.importer import KERNEL_TARGET
from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.lower.target import Target

from .errors import KernelError
from . import kernel as _kernel
from .kernel import Call, KernelFunction, is_array, out_types, simulate

# A kernel call's source location is the user's line that called the kernel, not ours.
source_info_util.register_exclusion(os.path.dirname(os.path.abspath(__file__)))

kernel_p = Primitive("trn_kernel")
kernel_p.multiple_results = True
kernel_p.def_impl(partial(dispatch.apply_primitive, kernel_p))


def _target() -> Target:
    """The core the program is traced for: `jax_trn.estimate` / `compare`'s system,
    else this process's (what `nl.tile_size` reads while JAX asks for shapes)."""
    from jax_trn import config
    return Target.of(config.tracing_system().chip.core)


def _types(call: Call, avals):
    return out_types(call, [(tuple(a.shape), str(a.dtype)) for a in avals], _target())


@kernel_p.def_abstract_eval
def _abstract(*avals, call):
    types, _ = _types(call, avals)
    return [core.ShapedArray(s, hw_dtypes.np_dtype(d)) for s, d in types]


def bind(kernel: KernelFunction, args: tuple, kwargs: dict):
    call = kernel.call(args, kwargs)
    arrays = [jax.numpy.asarray(a) if isinstance(a, np.ndarray) else a
              for a in args if is_array(a)]
    outs = kernel_p.bind(*arrays, call=call)
    _, single = _types(call, [jax.typeof(a) for a in arrays])
    return outs[0] if single else tuple(outs)


_kernel._BIND = bind


def _lower_trn(ctx, *args, call):
    types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out]
    op = mlir.custom_call(KERNEL_TARGET, result_types=types, operands=list(args),
                          backend_config=f"kernel={call.key}", has_side_effect=False,
                          api_version=1,
                          extra_attributes={"sdy.sharding_rule": _replicated_rule(ctx)})
    return list(op.results)


def _replicated_rule(ctx):
    """A kernel sees whole arrays: every dimension of every operand and result its own
    factor, each needing replication, so that under automatic sharding Shardy gathers
    the operands before the call (each device runs the kernel on the whole array) and
    the results come out replicated. In shard_map the kernel runs on each device's
    shard, as written (manual axes are not partitioned)."""
    from jax._src.custom_partitioning_sharding_rule import (
        sdy_sharding_rule_to_mlir, str_to_sdy_sharding_rule)
    from jax_trn.jax_mx import _not_custom
    avals = list(ctx.avals_in) + list(ctx.avals_out)
    names = iter(f"f{n}" for n in range(sum(len(a.shape) for a in avals)))
    sides = [" ".join(next(names) for _ in a.shape) for a in avals]
    ins, outs = sides[:len(ctx.avals_in)], sides[len(ctx.avals_in):]
    used = " ".join(sides).split()
    rule = str_to_sdy_sharding_rule(", ".join(ins) + " -> " + ", ".join(outs),
                                    need_replication_factors=tuple(used))
    types_in = [mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_in]
    types_out = [mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out]
    return _not_custom(sdy_sharding_rule_to_mlir(rule, types_in, types_out))


def _reference(call: Call, *arrays):
    """The kernel's numerics on the host: its instructions on the hardware model."""
    it = iter(arrays)
    args = [np.asarray(next(it)) if s is None else s for s in call.slots]
    return tuple(simulate(call.kernel, *args, **dict(call.kwargs)).outputs)


def _lower_reference(ctx, *args, call):
    shapes = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in ctx.avals_out]

    def f(*xs):
        return jax.pure_callback(partial(_reference, call), shapes, *xs,
                                 vmap_method="sequential")
    return mlir.lower_fun(f, multiple_results=True)(ctx, *args)


mlir.register_lowering(kernel_p, _lower_reference)
_registered = False


def register() -> None:
    """The rule for platform "trn" (once the plugin has registered the platform:
    jax_trn.jax_rules)."""
    global _registered
    if not _registered:
        mlir.register_lowering(kernel_p, _lower_trn, platform="trn")
        _registered = True


def _batch(args, dims, *, call):
    rule = call.kernel.vmap_rule
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    if rule is not None:
        return rule(size, dims, *args)
    mapped = [i for i, d in enumerate(dims) if d is not None]
    moved = [batching.moveaxis(args[i], dims[i], 0) for i in mapped]

    def one(xs):
        full = list(args)
        for i, x in zip(mapped, xs):
            full[i] = x
        return kernel_p.bind(*full, call=call)
    outs = jax.lax.map(one, moved)
    return list(outs), [0] * len(outs)


batching.primitive_batchers[kernel_p] = _batch


def _no_jvp(primals, tangents, *, call):
    raise KernelError(f"kernel {call.name} has no derivative of its own: pair it with a "
                      "backward kernel in jax.custom_vjp (see jax_trn.kernels)")


ad.primitive_jvps[kernel_p] = _no_jvp
