"""JAX lowering rules for host callbacks on the "trn" platform.

JAX's own rules for its callback primitives call `callback.emit_python_callback`, which
serves only cpu/cuda/rocm/tpu (`EmitPythonCallback` not supported on trn backend), and
`debug_print` has rules for cpu/gpu/tpu only. These are the same rules for "trn":

    primitive          user API                              who calls the host
    ----------------   -----------------------------------   --------------------------
    debug_print        jax.debug.print                       one device for a whole
    debug_callback     jax.debug.callback (breakpoint, ...)  array (jit over a mesh:
    pure_callback      jax.pure_callback (vmap_method: by    partition 0, or the one
                       JAX's batching rule, before lowering) `sharding=` names); each
    io_callback        jax.experimental.io_callback          device for its own values
                       (ordered: threads JAX's token)        (one device, shard_map,
    check              checkify.check (jax_xla_runtime_      pmap, partitioned=True)
                       errors; checkify.checkify needs none)

Each emits one `custom_call @trn.python_callback` whose backend_config holds the
registry key of the Python function (`jax_trn.runtime.callbacks`) and, when one device
calls for all, its partition ("callback=7 device=0"). The function is JAX's own wrapper
of the user's callable (`pure_callback_impl`, `io_callback_impl`, the debug impls): the
user sees CPU jax.Arrays, its results are checked as on CPU. The registry entry lives as
long as the lowering and executables that use it (`add_host_callback`). An ordered
effect's token goes in and out of the custom_call, as on CPU.
"""
from __future__ import annotations

from functools import partial

import numpy as np
from jax._src import callback as cb
from jax._src import checkify, config, debugging, dtypes, effects, sharding_impls
from jax._src.interpreters import mlir
from jax._src.lib.mlir.dialects import hlo

from hlo_passes.importer import CALLBACK_TARGET
from jax_trn.runtime import callbacks

_done = False


def register() -> None:
    """Registers the rules for platform "trn" (once)."""
    global _done
    if _done:
        return
    mlir.register_lowering(cb.pure_callback_p, _pure_callback, platform="trn",
                           cacheable=False)
    mlir.register_lowering(cb.io_callback_p, _io_callback, platform="trn", cacheable=False)
    mlir.register_lowering(debugging.debug_callback_p, _debug_callback, platform="trn",
                           cacheable=False)
    mlir.register_lowering(debugging.debug_print_p, _debug_print, platform="trn",
                           cacheable=False)
    mlir.register_lowering(checkify.check_p, _check, platform="trn", cacheable=False)
    _done = True


# --- emitting the custom_call -------------------------------------------------------------

def emit(ctx, fn, token, operands, result_avals, *, has_side_effect: bool, kind: str,
         caller: int | None):
    """`custom_call @trn.python_callback` calling `fn(*numpy operands)` on the host;
    returns (results, token out). `token` (an ordered effect's) goes in first and comes
    out first; `caller`: the partition that calls for all devices (None: each its own)."""
    host_fn = _checked(fn, result_avals)
    types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in result_avals]
    if token is not None:
        host_fn = partial(_with_token, host_fn)
        operands, types = [token, *operands], [hlo.TokenType.get(), *types]
    entry = callbacks.register(host_fn, kind)
    ctx.module_context.add_host_callback(entry)
    where = f"callback={entry.key}" + ("" if caller is None else f" device={caller}")
    op = mlir.custom_call(CALLBACK_TARGET, result_types=types, operands=list(operands),
                          backend_config=where, has_side_effect=has_side_effect,
                          api_version=1)
    results = list(op.results)
    if token is not None:
        token, *results = results
    return results, token


def _with_token(fn, token, *args):
    return (token, *fn(*args))


def _checked(fn, result_avals):
    """`fn` with its results checked and canonicalized as JAX's CPU wrapper does
    (`callback.emit_python_callback`), with the same messages."""

    def checked(*args):
        out = fn(*args)
        if len(out) != len(result_avals):
            raise RuntimeError("Mismatched number of outputs from callback. Expected: "
                               f"{len(result_avals)}, Actual: {len(out)}")
        out = tuple(dtypes.canonicalize_value(np.asarray(a)) for a in out)
        for i, (value, aval) in enumerate(zip(out, result_avals)):
            if value.shape != aval.shape:
                raise RuntimeError(f"Incorrect output shape for return value #{i}: "
                                   f"Expected: {aval.shape}, Actual: {value.shape}")
            if value.dtype != aval.dtype:
                raise RuntimeError(f"Incorrect output dtype for return value #{i}: "
                                   f"Expected: {aval.dtype}, Actual: {value.dtype}")
        return out
    return checked


def caller(ctx, sharding) -> int | None:
    """The partition that calls the host for all devices, as JAX decides for the CPU
    (`callback._callback_op_sharding`, whose checks raise as there): under automatic
    sharding over several devices the one `sharding` names, else partition 0; None
    when each device calls for itself (one device, shard_map, pmap)."""
    axis_context = ctx.module_context.axis_context
    cb._callback_op_sharding(axis_context, sharding, ctx.avals_out)
    if not isinstance(axis_context, sharding_impls.ShardingContext):
        return None
    if axis_context.num_devices <= 1:
        return None
    if sharding is None:
        return 0
    return axis_context.device_assignment.index(next(iter(sharding.device_set)))


# --- the rules ----------------------------------------------------------------------------

def _pure_callback(ctx, *args, callback, sharding, **params):
    def host(*flat_args):
        return tuple(cb.pure_callback_impl(*flat_args, callback=callback, sharding=None,
                                           **params))
    results, _ = emit(ctx, host, None, args, ctx.avals_out, has_side_effect=False,
                      kind="pure_callback", caller=caller(ctx, sharding))
    return results


def _io_callback(ctx, *args, callback, sharding, ordered, **params):
    def host(*flat_args):
        return tuple(cb.io_callback_impl(*flat_args, callback=callback, sharding=None,
                                         ordered=ordered, **params))
    who = caller(ctx, sharding)
    token = ctx.tokens_in.get(cb._OrderedIOEffect) if ordered else None
    results, token = emit(ctx, host, token, args, ctx.avals_out, has_side_effect=True,
                          kind="io_callback", caller=who)
    if ordered:
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(
            mlir.TokenSet({cb._OrderedIOEffect: token})))
    return results


def _debug_callback(ctx, *args, effect, partitioned, callback, **params):
    axis_context = ctx.module_context.axis_context
    if (isinstance(axis_context, sharding_impls.SPMDAxisContext)
            and set(axis_context.mesh.axis_names) != set(axis_context.manual_axes)):
        # Partly manual: JAX's own rewrite (a cond on the auto axes' index) lowers it.
        lower = partial(debugging._debug_callback_partial_auto, axis_context, effect=effect,
                        partitioned=partitioned, callback=callback, **params)
        return mlir.lower_fun(lower)(ctx, *args)

    def host(*flat_args):
        debugging.debug_callback_p.impl(*flat_args, effect=effect, partitioned=partitioned,
                                        callback=callback, **params)
        return ()
    who = None if partitioned else caller(ctx, None)
    ordered = effects.ordered_effects.contains(effect)
    token = ctx.tokens_in.get(effect) if ordered else None
    results, token = emit(ctx, host, token, args, ctx.avals_out, has_side_effect=True,
                          kind="debug_callback", caller=who)
    if ordered:
        ctx.set_tokens_out(ctx.tokens_in.update_tokens(mlir.TokenSet({effect: token})))
    return results


def _debug_print(ctx, *dyn_args, fmt, ordered, partitioned, in_tree, static_args,
                 np_printoptions, has_placeholders, logging_record):
    """jax.debug.print: JAX's print callback (`debugging.debug_print_lowering_rule`)
    through the debug_callback rule above."""
    callback = partial(debugging._format_print_callback, fmt, dict(np_printoptions),
                       has_placeholders, logging_record)
    callback = debugging._make_flat_callback(in_tree, callback, static_args)
    effect = debugging.ordered_debug_effect if ordered else debugging.debug_effect
    return _debug_callback(ctx, *dyn_args, effect=effect, partitioned=partitioned,
                           callback=callback)


def _check(ctx, *args, err_tree, debug):
    """checkify.check staged out under `jax_xla_runtime_errors` (as on CPU)."""
    if debug:
        return []
    if not config.xla_runtime_errors.value:
        raise checkify.functionalization_error
    results, _ = emit(ctx, partial(checkify.python_err, err_tree), None, args,
                      ctx.avals_out, has_side_effect=True, kind="check",
                      caller=caller(ctx, None))
    return results
