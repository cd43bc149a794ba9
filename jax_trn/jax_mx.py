"""JAX lowering rules for block-scaled matmuls (`jax.nn.scaled_matmul`,
`jax.nn.scaled_dot_general`) on the "trn" platform.

JAX defines one primitive, `scaled_matmul` (jax/_src/cudnn/scaled_matmul_stablehlo.py):
lhs [B, M, K] and rhs [B, N, K] of a low-precision type, their scales [B, M, K / bs] and
[B, N, K / bs], out[b, m, n] = sum_k lhs[b, m, k] s_l[b, m, k // bs] rhs[b, n, k]
s_r[b, n, k // bs] in FP32, cast to `preferred_element_type`. `scaled_dot_general`
quantizes its operands with ordinary jnp ops (the program's own quantization: amax per
block, E8M0 scale rounded up, cast with clipping; hlo_passes/passes/mx_quantize.py
makes them one `mx_quantize` op) and calls it. JAX lowers the
primitive for cuda / rocm only (and its wrapper through `custom_partitioning`, which on
several devices emits XLA's `CustomSPMDPartitioning` call); on trn both lower here:

- block-scaled operands the device can dequantize exactly to BF16 (`is_block_scaled`:
  data float8_e4m3fn / float8_e5m2 / float4_e2m1fn, scales float8_e8m0fnu or
  float8_e4m3fn, a block dividing K) become one
  `custom_call @trn.mx_matmul(lhs, rhs, lhs_scales, rhs_scales)`, which the importer
  turns into an `mx_matmul` op (jax_trn/lower/mx_matmul.py). OCP MX (`is_mx`: block 32,
  E8M0 scales: the "mxfp8" config, and MXFP4, which JAX 0.10.2 names no config for:
  `BlockScaleConfig(mode="mxfp8", data_type=float4_e2m1fn, block_size=32, ...)`) runs
  as `nc_matmul_mx` on NeuronCore-v4; everything else (Trn1 / Trn2; nvfp4's block 16
  with E4M3 scales, which no MX mode takes, §2.2) as dequantize + BF16 matmul, the
  kernels' notes saying why. The op carries a Shardy sharding rule (`_sharding_rule`)
  and partitions like a dot_general: batch / M / N sharded, each core computes its
  block; K sharded, each core its partial sums and an all_reduce adds them
  (hlo_passes/mlir_passes.py keeps the rule for Shardy's explicit-reshards pass, which
  the propagation pipeline would drop, and localize knows mx_matmul's partials are
  sums). nvfp4's global scale is not the primitive's: `scaled_dot_general` divides the
  operands by it before quantizing and multiplies the FP32 result after, as ordinary ops.
- anything else lowers to its definition: dequantize (to BF16) and a `dot_general`
  accumulating in FP32, which runs and partitions as ordinary ops.
"""
from __future__ import annotations

import numpy as np
from jax import lax
from jax._src import dtypes
from jax._src.interpreters import mlir

from hlo_passes.importer import MX_MATMUL_TARGET as MX_TARGET
MX_BLOCK = 32                                            # OCP MX v1.0 group size, §4
MX_DATA = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn")
MX_SCALE = ("float8_e8m0fnu",)
BLOCK_SCALE = ("float8_e8m0fnu", "float8_e4m3fn")        # scales the dequantize path takes

_done = False


def register() -> None:
    """Registers the rule for the primitive and for its partitioning wrapper (once)."""
    global _done
    if _done:
        return
    from jax._src.cudnn import scaled_matmul_stablehlo as sm
    for prim in (sm._scaled_matmul_p, sm._scaled_matmul_p_wrapper):
        mlir.register_lowering(prim, _scaled_matmul_lower, platform="trn")
    _done = True


def is_mx(lhs, rhs, lhs_scales, rhs_scales) -> bool:
    """Operand avals of an OCP MX matmul (block 32 along K, MX element and scale types)."""
    k = lhs.shape[-1]
    return (all(str(x.dtype) in MX_DATA for x in (lhs, rhs))
            and all(str(s.dtype) in MX_SCALE for s in (lhs_scales, rhs_scales))
            and all(s.shape[-1] * MX_BLOCK == k for s in (lhs_scales, rhs_scales)))


def is_block_scaled(lhs, rhs, lhs_scales, rhs_scales) -> bool:
    """Operand avals mx_matmul takes: MX data types, E8M0 or E4M3 scales, one block size
    dividing K for both operands (exact in BF16 once dequantized: mx_dequant.py)."""
    k, g = lhs.shape[-1], lhs_scales.shape[-1]
    return (all(str(x.dtype) in MX_DATA for x in (lhs, rhs))
            and all(str(s.dtype) in BLOCK_SCALE for s in (lhs_scales, rhs_scales))
            and g > 0 and k % g == 0 and rhs_scales.shape[-1] == g)


def _scaled_matmul_lower(ctx, lhs, rhs, lhs_scales, rhs_scales, *, preferred_element_type):
    if not is_block_scaled(*ctx.avals_in):
        return mlir.lower_fun(_reference, multiple_results=True)(
            ctx, lhs, rhs, lhs_scales, rhs_scales,
            preferred_element_type=preferred_element_type)
    out = ctx.avals_out[0]
    op = mlir.custom_call(
        MX_TARGET, result_types=[mlir.aval_to_ir_type(ctx.module_context, out)],
        operands=[lhs, rhs, lhs_scales, rhs_scales], api_version=1,
        extra_attributes={"sdy.sharding_rule": _sharding_rule(ctx)})
    return op.results


def _sharding_rule(ctx):
    """b m (g c), b n (g c), b m g, b n g -> b m n with c the block (32 for MX: K is its
    scale groups g times the block), g a reduction factor: how the op partitions, like
    a dot_general (a sharded g: partial sums, which Shardy follows with an all_reduce)."""
    from jax._src.custom_partitioning_sharding_rule import (
        sdy_sharding_rule_to_mlir, str_to_sdy_sharding_rule)
    if ctx.avals_in[2].shape[-1] > 1:
        rule = str_to_sdy_sharding_rule("b m (g c), b n (g c), b m g, b n g -> b m n",
                                        reduction_factors=("g",),
                                        c=ctx.avals_in[0].shape[-1] // ctx.avals_in[2].shape[-1])
    else:       # one block: no compound of a size-1 factor (a Shardy rule)
        rule = str_to_sdy_sharding_rule("b m k, b n k, b m g, b n g -> b m n",
                                        reduction_factors=("k", "g"))
    types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_in]
    out = [mlir.aval_to_ir_type(ctx.module_context, ctx.avals_out[0])]
    return _not_custom(sdy_sharding_rule_to_mlir(rule, types, out))


def _not_custom(attr):
    """The rule without JAX's `custom` flag: that flag leaves the partitioning to an XLA
    custom-partitioner callback (Shardy then inserts no reshards or collectives for
    the op); ours is partitioned by Shardy like any op with a rule."""
    from jaxlib.mlir.dialects import sdy
    a = sdy.OpShardingRuleAttr(attr)
    return sdy.OpShardingRuleAttr.get(
        a.factor_sizes, a.operand_mappings, a.result_mappings,
        reduction_factors=a.reduction_factors,
        need_replication_factors=a.need_replication_factors, is_custom=False)


def dequantize(x, scales):
    """x [..., K] * scales [..., K / bs] repeated bs times along K, in FP32 (the
    definition in `jax.nn.scaled_matmul`'s docstring)."""
    block = x.shape[-1] // scales.shape[-1]
    s = scales.astype(np.float32)
    s = lax.broadcast_in_dim(s, (*s.shape, block), tuple(range(s.ndim)))
    return x.astype(np.float32) * s.reshape(x.shape)


def _reference(lhs, rhs, lhs_scales, rhs_scales, *, preferred_element_type):
    """The primitive's definition: dequantize (to BF16, exact for fp8/fp4 values times
    E8M0 / E4M3 scales within BF16's range), a dot over K (batch 0) accumulating in FP32."""
    a, b = (dequantize(x, s).astype(dtypes.bfloat16) for x, s in ((lhs, lhs_scales),
                                                                   (rhs, rhs_scales)))
    out = lax.dot_general(a, b, (((2,), (2,)), ((0,), (0,))),
                          preferred_element_type=np.float32)
    return [out.astype(dtypes.canonicalize_dtype(preferred_element_type))]
