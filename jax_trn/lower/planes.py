"""The complex boundary: interleaved (real, imaginary) pairs <-> two planes.

A complex64 buffer in HBM is float32 pairs (hlo_passes/passes/complex_planes.py). The
pass reads a complex parameter with `trn.deinterleave` (float32[S, 2] -> re[S], im[S])
and writes a complex result with `trn.interleave` (the reverse). Done as strided DRAM
slices, every 4-byte element would be its own DMA element (~900 us for 256 x 256
pairs); here the DMAs stay contiguous and the shuffle happens on chip: each block of
pairs is one DMA into SBUF, two strided copies (an SBUF access pattern with an 8-byte
innermost stride, §3.1) on VectorE and GpSimdE split or join the planes, and each plane
is one contiguous DMA.
"""
from __future__ import annotations

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import sub
from .elementwise import FMAX
from .layout import flat_tiles
from .registry import LowerCtx, register_lowering

ENGINES = ("vector", "gpsimd")       # one plane each, so the two copies overlap


@register_lowering("trn.deinterleave")
def _deinterleave(ctx: LowerCtx, x: DramTensor) -> None:
    kb = ctx.kb
    n = ctx.outs[0].size
    for b in flat_tiles(n, FMAX // 2, kb.target.partitions):
        pairs = kb.tile(2 * b.free, x.dtype)
        kb.dma(sub(pairs, b.parts, 2 * b.free), _ap(kb, x, b, 2))
        for p, out in enumerate(ctx.outs):
            plane = kb.tile(b.free, out.dtype)
            kb.emit(isa.TensorCopy, dst=sub(plane, b.parts, b.free),
                    src=_strided(pairs, b.parts, b.free, p), engine=ENGINES[p])
            kb.dma(_ap(kb, out, b, 1), sub(plane, b.parts, b.free))
            kb.release(plane)
        kb.release(pairs)


@register_lowering("trn.interleave")
def _interleave(ctx: LowerCtx, re: DramTensor, im: DramTensor) -> None:
    kb = ctx.kb
    out = ctx.outs[0]
    for b in flat_tiles(re.size, FMAX // 2, kb.target.partitions):
        pairs = kb.tile(2 * b.free, out.dtype)
        for p, src in enumerate((re, im)):
            plane = kb.tile(b.free, src.dtype)
            kb.dma(sub(plane, b.parts, b.free), _ap(kb, src, b, 1))
            kb.emit(isa.TensorCopy, dst=_strided(pairs, b.parts, b.free, p),
                    src=sub(plane, b.parts, b.free), engine=ENGINES[p])
            kb.release(plane)
        kb.dma(_ap(kb, out, b, 2), sub(pairs, b.parts, 2 * b.free))
        kb.release(pairs)


def _strided(pairs: isa.Tile, parts: int, free: int, p: int) -> isa.Tile:
    """Plane p of a [parts, 2 * free] tile of pairs, as [parts, free] with stride 2."""
    view = sub(pairs, parts, 2 * free)
    return view.with_(free=(free,), strides=(2,),
                      offset=view.offset + p * hw_dtypes.itemsize(pairs.dtype))


def _ap(kb, t: DramTensor, block, width: int):
    """The block of flat elements `block` of `t`, `width` elements per element."""
    return kb.ap(t, block.offset * width, ((block.pstride * width, block.parts),
                                           (1, block.free * width)))
