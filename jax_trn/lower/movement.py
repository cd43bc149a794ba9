"""Copies and generated data: DRAM->DRAM copies (reshape, output copies), splat
constants (Memset) and iota. Transpose and broadcast_in_dim are in `relayout.py`.

A DRAM->DRAM copy is a DMA whose access patterns do the work (DMA engines move
HBM<->HBM, §3.4), cut into chunks of at most `CHUNK_BYTES`, spread round-robin over
the DMA queues.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .elementwise import FMAX, _engine
from .layout import Axes, View, box_offset, box_pattern, box_tiles, flat_tiles, merge_axes, tiles
from .registry import LowerCtx, register_lowering
from .target import Target

CHUNK_BYTES = 512 * 1024    # a compiler choice: bytes per DRAM->DRAM DMA


def dram_copy(kb: KernelBuilder, dst: View, src: View) -> None:
    """DMAs the elements of view `src` into view `dst` (same index space)."""
    d, s = merge_axes(dst.axes, src.axes)
    cap = max(1, CHUNK_BYTES // ir.np_dtype(dst.t.dtype).itemsize)
    for box in box_tiles([n for _, n in d], cap):
        kb.dma(kb.ap(dst.t, dst.offset + box_offset(d, box), box_pattern(d, box)),
               kb.ap(src.t, src.offset + box_offset(s, box), box_pattern(s, box)))


def copy(kb: KernelBuilder, dst: DramTensor, src: DramTensor) -> None:
    """A contiguous copy of all elements (shapes may differ: reshape)."""
    flat = ((1, dst.size),)
    dram_copy(kb, View(dst, flat), View(src, flat))


@register_lowering("reshape")
def _reshape_lower(ctx: LowerCtx, x: DramTensor) -> None:
    copy(ctx.kb, ctx.outs[0], x)


@register_lowering("optimization_barrier")
def _optimization_barrier_lower(ctx: LowerCtx, *xs: DramTensor) -> None:
    for x, out in zip(xs, ctx.outs):
        copy(ctx.kb, out, x)


@register_lowering("sdy.sharding_constraint")
def _sharding_constraint_lower(ctx: LowerCtx, x: DramTensor, **_sharding) -> None:
    """A sharding constraint in a program that reaches lowering un-partitioned (one
    device: the runtime rejects multi-device programs until the Shardy passes run) is
    a copy."""
    copy(ctx.kb, ctx.outs[0], x)


def fill(kb: KernelBuilder, out: DramTensor, value) -> None:
    """Writes `value` everywhere in `out`: one Memset tile, DMAed out once per block."""
    blocks = flat_tiles(out.size, FMAX, kb.target.partitions)
    if not blocks:
        return
    tile = kb.tile(max(b.free for b in blocks), out.dtype)
    value = value.item() if hasattr(value, "item") else value
    value = int(value) if isinstance(value, bool) else value
    kb.emit(isa.Memset, dst=tile, value=value, engine=_engine(out.dtype))
    for b in blocks:
        kb.dma(kb.ap(out, b.offset, b.pattern), sub(tile, b.parts, b.free))
    kb.release(tile)


# --- iota ----------------------------------------------------------------------------

@dataclass(frozen=True)
class IotaTile:
    """dst[p, f] = offset + p * channel_multiplier + step * f, DMAed to `out_offset`."""
    parts: int
    free: int
    step: int
    offset: int
    channel_multiplier: int
    out_offset: int
    out_pattern: Axes


def _iota_flat_rows(a_n: int, b_n: int, pmax: int) -> list[IotaTile]:
    """Iota along the last axis, each row tiled as [pmax, F] blocks of its range."""
    return [IotaTile(t.parts, t.free, 1, t.offset, t.pstride, a * b_n + t.offset, t.pattern)
            for a in range(a_n) for t in flat_tiles(b_n, FMAX, pmax)]


def _iota_rows(a_n: int, b_n: int, pmax: int) -> list[IotaTile]:
    """Iota along the last axis with rows on partitions: every row is 0, 1, 2, ..."""
    return [IotaTile(pa, fb, 1, b0, 0, a0 * b_n + b0, ((b_n, pa), (1, fb)))
            for a0, pa in tiles(a_n, pmax) for b0, fb in tiles(b_n, FMAX)]


def _iota_planes(a_n: int, b_n: int, c_n: int, pmax: int) -> list[IotaTile]:
    """Iota along a middle axis: its index on partitions, the trailing axes on F."""
    return [IotaTile(pb, fc, 0, b0, 1, (a * b_n + b0) * c_n + c0, ((c_n, pb), (1, fc)))
            for a in range(a_n) for b0, pb in tiles(b_n, pmax)
            for c0, fc in tiles(c_n, FMAX)]


def iota_plan(shape: tuple[int, ...], dim: int, target: Target) -> list[IotaTile]:
    """The tiles of an iota along `dim`: the cheaper of rows and flat blocks by GpSimd
    cycles, an instruction costing its start-up plus its elements (§6.3)."""
    a_n, b_n, c_n = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    pmax = target.partitions
    if c_n > 1:
        return _iota_planes(a_n, b_n, c_n, pmax)
    plans = [_iota_rows(a_n, b_n, pmax), _iota_flat_rows(a_n, b_n, pmax)]
    start = target.core.gpsimd_startup
    return min(plans, key=lambda plan: sum(start + t.free for t in plan))


@register_lowering("iota")
def _iota_lower(ctx: LowerCtx, *, iota_dimension) -> None:
    """Iota writes its integer pattern straight into a tile of the result dtype (like
    `nki.isa.iota(..., dtype=)`): the cast happens on the way out of GpSimd."""
    kb, out = ctx.kb, ctx.outs[0]
    if out.size == 0:
        return
    plan = iota_plan(tuple(out.shape), iota_dimension, ctx.target)
    ring = kb.ring(2, max(t.free for t in plan), out.dtype)
    for t in plan:
        dst = sub(ring.next(), t.parts, t.free)
        kb.emit(isa.Iota, dst=dst, pattern=((t.step, t.free),), offset=t.offset,
                channel_multiplier=t.channel_multiplier)
        kb.dma(kb.ap(out, t.out_offset, t.out_pattern), dst)
    kb.release(ring)
