"""dot_general on TensorE.

Canonical form: for every batch index, out[M, N] = lhs[M, K] @ rhs[K, N], where M, K
and N are single strided axes of the operands in DRAM (batch may stay multi-axis). When
a group of dims cannot be read as one strided axis, that operand is first copied into
[B, M, K] / [B, K, N] order by a DMA kernel. The result [B, M, N] is XLA's dot_general
result order (batch, lhs free, rhs free), so it is written directly.

The loop nest itself is in `matmul.py`.

Precision (decided): float32 operands at DEFAULT run as bf16 (DMA casts through FP32,
RNE) with FP32 accumulation; HIGH as TF32 (FP32 tiles, `NcMatmul(precision="tf32")`:
rounded to TF32 in the array, at the BF16 rate); HIGHEST as FP32 at the FP32 rate.
An operand whose convert was folded into the dot (`operand_types`, hlo_passes
convert-into-dot) is DMA-cast to that type as it loads. What DEFAULT means is set by `lower_module(matmul_precision=)` (the options pass
$JAX_TRN_MATMUL_PRECISION, jax_trn/config.py). bf16/fp16/fp8 run
natively; mixed types are cast to the wider one. Integer dots (integer operands and
result) are exact and wrap like XLA: digit matmuls on TensorE combined on GpSimd
(intmatmul.py); bool dots compute in FP32 (sums of 0/1 products, only their being
nonzero matters).
"""
from __future__ import annotations

import dataclasses
import math

from hlo_passes import ir
from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .elementwise import FMAX
from .intmatmul import IntMatmul, inner_products, is_int_dot
from .layout import (Axes, View, box_offset, box_pattern, line_tiles, merge_axes, row_major,
                     tiles)
from . import matmul_quarters as quarters
from .matmul import MatmulEmitter
from .matmul_plan import Operand, double_row, interleaved, make_plan, with_dma_transpose
from .movement import fill
from .relayout import permute, relayout
from .registry import LowerCtx, register_lowering

LEVELS = {"default": 0, "high": 1, "highest": 2}


# --- dtypes and precision ----------------------------------------------------------

def _level(precision_config, default: str) -> int:
    names = [p.lower() for p in precision_config or ()] or ["default"]
    return max(LEVELS[default] if p == "default" else LEVELS[p] for p in names)


def matmul_types(lhs: str, rhs: str, precision_config, default: str, ocp_fp8: bool = True
                 ) -> tuple[str, str, str]:
    """(lhs SBUF dtype, rhs SBUF dtype, NcMatmul precision) after the precision rule.
    Without OCP FP8 in TensorE (`ocp_fp8`, v4 only, §2.2) float8_e4m3fn operands are
    loaded as bf16 (exact: the DMA casts through FP32) and run at the BF16 rate.

    >>> matmul_types("float32", "float32", (), "default")
    ('bfloat16', 'bfloat16', 'native')
    >>> matmul_types("float32", "float32", ("HIGH", "DEFAULT"), "default")
    ('float32', 'float32', 'tf32')
    >>> matmul_types("bfloat16", "float32", (), "highest")
    ('float32', 'float32', 'native')
    >>> matmul_types("float8_e4m3", "float8_e5m2", (), "default")
    ('float8_e4m3', 'float8_e5m2', 'native')
    >>> matmul_types("int32", "int32", (), "default")
    ('float32', 'float32', 'native')
    >>> matmul_types("float8_e4m3fn", "float8_e5m2", (), "default", ocp_fp8=False)
    ('bfloat16', 'bfloat16', 'native')
    >>> matmul_types("float4_e2m1fn", "bfloat16", (), "default")
    ('bfloat16', 'bfloat16', 'native')
    """
    # TensorE reads FP4 only inside nc_matmul_mx (§2.2): a plain dot loads it as BF16
    # (exact: the DMA casts through FP32)
    lhs, rhs = ("bfloat16" if d == "float4_e2m1fn" else d for d in (lhs, rhs))
    if not ocp_fp8 and "float8_e4m3fn" in (lhs, rhs):
        lhs, rhs = ("bfloat16" if d.startswith("float8") else d for d in (lhs, rhs))
    if not (ir.is_float(lhs) and ir.is_float(rhs)):
        return "float32", "float32", "native"    # integer dot: FP32, exact below 2**24
    if lhs.startswith("float8") and rhs.startswith("float8"):
        return lhs, rhs, "native"
    size = {d: hw_dtypes.itemsize(d) for d in (lhs, rhs)}
    common = lhs if lhs == rhs else max(lhs, rhs, key=size.get)
    if lhs != rhs and size[lhs] == size[rhs]:
        common = "float32"
    if common != "float32":
        return common, common, "native"
    level = _level(precision_config, default)
    return {0: ("bfloat16", "bfloat16", "native"), 1: ("float32", "float32", "tf32"),
            2: ("float32", "float32", "native")}[level]


# --- canonical form --------------------------------------------------------------------

def _single(axes: Axes) -> tuple[int, int] | None:
    """`axes` as one (stride, num) axis, or None."""
    if len(axes) > 1:
        return None
    return axes[0] if axes else (1, 1)


def _groups(shape, batch, contract) -> tuple[Axes, Axes, Axes]:
    axes = row_major(shape)
    free = [d for d in range(len(shape)) if d not in (*batch, *contract)]
    return tuple(axes[d] for d in batch), tuple(axes[d] for d in free), \
        tuple(axes[d] for d in contract)


def _operand(t: DramTensor, b: Axes, f: Axes, k: Axes, dtype: str) -> Operand | None:
    ks, fs = _single(merge_axes(k)[0] if k else ()), _single(merge_axes(f)[0] if f else ())
    if ks is None or fs is None:
        return None
    transposed = ks[0] == 1 and fs[0] != 1 and ks[1] > 1
    return Operand(t, b, ks, fs, dtype, transposed)


def _dims_of(axes: Axes, order: Axes) -> tuple[int, ...] | None:
    """The dims of a row-major tensor without size-1 dims (its `axes`, all distinct)
    that `order` lists, as a permutation; None if `order` is not one (merged axes)."""
    dims = [next((i for i, a in enumerate(axes) if a == axis), None) for axis in order]
    if None in dims or sorted(dims) != list(range(len(axes))):
        return None
    return tuple(dims)


def _squeezed(t: DramTensor) -> DramTensor:
    """`t` without its size-1 dims: the same buffer, the same row-major layout."""
    return DramTensor(t.name, tuple(n for n in t.shape if n != 1), t.dtype)


def _canonical(ctx: LowerCtx, t: DramTensor, b: Axes, f: Axes, k: Axes, dtype: str,
               lhs: bool) -> Operand:
    """The operand as single K/F axes, copied into [B, M, K] / [B, K, N] if need be."""
    op = _operand(t, b, f, k, dtype)
    if op is not None:
        return op
    order = (*b, *f, *k) if lhs else (*b, *k, *f)
    copy = ctx.temp(tuple(n for _, n in order), t.dtype)
    # Size-1 dims aside (the layouts are the same without them), the copy is a
    # transpose of t unless batch axes were merged.
    sq, copy_sq = _squeezed(t), _squeezed(copy)
    perm = _dims_of(row_major(sq.shape), tuple(a for a in order if a[1] != 1))
    if perm is None:
        relayout(ctx.kb, View.of(copy), View(t, order))
    else:
        permute(ctx, copy_sq, sq, perm)
    nb = len(b)
    axes = row_major(copy.shape)
    bb = axes[:nb]
    ff, kk = (axes[nb:nb + len(f)], axes[nb + len(f):]) if lhs else \
        (axes[nb + len(k):], axes[nb:nb + len(k)])
    return _operand(copy, bb, ff, kk, dtype)


# --- the rule ---------------------------------------------------------------------------------

@register_lowering("dot_general")
def _dot_general_lower(ctx: LowerCtx, lhs: DramTensor, rhs: DramTensor, **attrs) -> None:
    lower_dot(ctx, lhs, rhs, ctx.outs[0], attrs)


def lower_dot(ctx: LowerCtx, lhs: DramTensor, rhs: DramTensor, out: DramTensor,
              attrs: dict, epilogue=None) -> None:
    """dot_general into `out`, or through `epilogue` (epilogue.py: then `out` only names
    the dot's value, which is never stored)."""
    # near misses of attention fusion (hlo_passes/passes/attention_fusion.py)
    ctx.kb.notes.extend(f"decision: {d}" for d in attrs.get("decisions", ()))
    lb, lf, lc = _groups(lhs.shape, attrs.get("lhs_batching_dimensions", ()),
                         attrs.get("lhs_contracting_dimensions", ()))
    rb, rf, rc = _groups(rhs.shape, attrs.get("rhs_batching_dimensions", ()),
                         attrs.get("rhs_contracting_dimensions", ()))
    k = math.prod(n for _, n in lc)
    ctx.kb.flops += 2 * out.size * k
    if out.size == 0 or k == 0:
        _no_epilogue(epilogue, "an empty dot_general")
        return fill(ctx.kb, out, 0)
    if is_int_dot(lhs.dtype, rhs.dtype, out.dtype):
        return _int_dot(ctx, lhs, rhs, out, (lb, lf, lc), (rb, rf, rc), epilogue)
    # operand_types: a convert folded into the loads (hlo_passes convert-into-dot)
    lty, rty = attrs.get("operand_types") or (lhs.dtype, rhs.dtype)
    ldt, rdt, precision = matmul_types(lty, rty, attrs.get("precision_config", ()),
                                       ctx.matmul_precision, ctx.target.ocp_fp8)
    lb, rb = merge_axes(lb, rb) if lb else ((), ())
    lop = _canonical(ctx, lhs, lb, lf, lc, ldt, lhs=True)
    rop = _canonical(ctx, rhs, rb, rf, rc, rdt, lhs=False)
    if lop.t is not lhs or rop.t is not rhs:
        ctx.next_kernel("dot")
    if lop.f[1] == rop.f[1] == 1 and lop.batch and precision == "native":
        _no_epilogue(epilogue, "batched inner products (M = N = 1)")
        return _inner_products(ctx.kb, lop, rop, out)
    target = ctx.target
    pairs = double_row(lop, rop, precision, target)
    lop, rop = with_dma_transpose(lop, target, pairs), with_dma_transpose(rop, target)
    reserved = epilogue.sbuf_bytes(target) if epilogue is not None else 0
    # SBUF sums (matmul_plan.make_plan) need PSUM free of a fused epilogue, and are not
    # offered to FP8 double_row pairs, whose K blocks keep their own pairing rules
    sums = epilogue is None and not pairs
    plan = make_plan(lop, rop, out.dtype, _free_sbuf(ctx.kb), target, reserved, sums)
    if interleaved(lop, pairs) and plan.kb % (2 * target.partitions):
        # K blocks of an odd number of k-tiles cannot hold 16-bit pairs: TensorE transposes.
        lop = dataclasses.replace(lop, via_dma=False)
        plan = make_plan(lop, rop, out.dtype, _free_sbuf(ctx.kb), target, reserved, sums)
    kperm = quarters.word_elems(lop) if quarters.applies(lop, rop, plan, target, pairs) \
        else 0
    MatmulEmitter(ctx.kb, lop, rop, out, plan, precision, epilogue, pairs, kperm).run()


def _int_dot(ctx: LowerCtx, lhs: DramTensor, rhs: DramTensor, out: DramTensor, lg, rg,
             epilogue=None) -> None:
    """An exact integer dot_general (intmatmul.py): M = N = 1 batched products on
    GpSimd, anything else as digit matmuls."""
    (lb, lf, lc), (rb, rf, rc) = lg, rg
    lb, rb = merge_axes(lb, rb) if lb else ((), ())
    lop = _canonical(ctx, lhs, lb, lf, lc, lhs.dtype, lhs=True)
    rop = _canonical(ctx, rhs, rb, rf, rc, rhs.dtype, lhs=False)
    if lop.t is not lhs or rop.t is not rhs:
        ctx.next_kernel("dot")
    if lop.f[1] == rop.f[1] == 1 and lop.batch:
        _no_epilogue(epilogue, "batched inner products (M = N = 1)")
        return inner_products(ctx.kb, lop, rop, out, FMAX)
    target = ctx.target
    IntMatmul(ctx.kb, with_dma_transpose(lop, target), with_dma_transpose(rop, target),
              out, epilogue).run()


def _free_sbuf(kb: KernelBuilder) -> int:
    """SBUF bytes per partition above the kernel's live allocations."""
    top = max((off + size for off, size in kb.sbuf.live.items()), default=0)
    return kb.sbuf.capacity - top


def _no_epilogue(epilogue, why: str) -> None:
    if epilogue is not None:
        from .translate import Unsupported
        raise Unsupported(f"no matmul epilogue for {why}")


# --- batched inner products ------------------------------------------------------------------

def _inner_products(kb: KernelBuilder, lhs: Operand, rhs: Operand, out: DramTensor) -> None:
    """out[b] = sum_k lhs[b, k] * rhs[b, k] (M = N = 1): batches on partitions, K on F;
    VectorE multiplies (exact for bf16 operands in FP32) and reduces along F. One
    128x1x1 matmul per batch would leave TensorE ~0% used."""
    (lb, rb, ob), k = merge_axes(lhs.batch, rhs.batch, row_major([n for _, n in lhs.batch])), \
        lhs.k[1]
    ins = (kb.ring(3, FMAX, lhs.dtype), kb.ring(3, FMAX, rhs.dtype))
    prods, accs = kb.ring(2, FMAX, "float32"), kb.ring(2, 1, "float32")
    res = kb.ring(2, 1, out.dtype)
    for box in line_tiles([n for _, n in lb], kb.target.partitions):
        parts = box_pattern(lb, box)[-1][1]
        acc = sub(accs.next(), parts, 1)
        for i, (k0, kc) in enumerate(tiles(k, FMAX)):
            x, y = (_load_rows(kb, op, axes, box, k0, kc, ring)
                    for op, axes, ring in ((lhs, lb, ins[0]), (rhs, rb, ins[1])))
            prod = sub(prods.next(), parts, kc)
            kb.emit(isa.TensorTensor, dst=prod, data1=x, data2=y, op="multiply")
            part = acc if i == 0 else sub(prods.next(), parts, 1)
            kb.emit(isa.TensorReduce, dst=part, data=prod, op="add")
            if i:
                kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=part, op="add")
        dst = sub(res.next(), parts, 1)
        kb.emit(isa.TensorCopy, dst=dst, src=acc)
        kb.dma(kb.ap(out, box_offset(ob, box), box_pattern(ob, box)[-1:] + ((1, 1),)), dst)
    kb.release(*ins, prods, accs, res)


def _load_rows(kb, op: Operand, axes: Axes, box, k0: int, kc: int, ring) -> isa.Tile:
    tile = sub(ring.next(), box_pattern(axes, box)[-1][1], kc)
    src = box_pattern(axes, box)[-1:] + ((op.k[0], kc),)
    kb.dma(tile, kb.ap(op.t, box_offset(axes, box) + k0 * op.k[0], src))
    return tile
