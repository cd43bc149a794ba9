"""bitcast_convert: the same bytes seen as another element type.

SBUF is untyped bytes (§3.1), so a bitcast is a DMA into a tile of the operand's type
and a DMA out of a tile of the result's type over the same bytes; neither DMA casts.
Between widths (XLA adds or drops a minor dimension of the width ratio) the wide
element's bytes are the narrow elements in order.
"""
from __future__ import annotations

from hlo_passes import ir
from jax_trn.hw.program import DramTensor

from .builder import sub
from .elementwise import FMAX
from .errors import LoweringError
from .layout import flat_tiles
from .registry import LowerCtx, register_lowering


@register_lowering("bitcast_convert")
def _bitcast_convert_lower(ctx: LowerCtx, x: DramTensor) -> None:
    out = ctx.outs[0]
    wide, narrow = (x, out) if _size(x) >= _size(out) else (out, x)
    ratio = _size(wide) // _size(narrow)
    if wide.size * ratio != narrow.size:
        raise LoweringError(f"bitcast_convert between {x.dtype}{list(x.shape)} and "
                            f"{out.dtype}{list(out.shape)} changes the byte count")
    kb = ctx.kb
    for b in flat_tiles(wide.size, FMAX // ratio, kb.target.partitions):
        tile = kb.tile(b.free * (ratio if x is narrow else 1), x.dtype)
        kb.dma(sub(tile, b.parts, tile.free[0]), _ap(kb, x, b, ratio if x is narrow else 1))
        seen = tile.with_(free=(b.free * (ratio if out is narrow else 1),), dtype=out.dtype)
        kb.dma(_ap(kb, out, b, ratio if out is narrow else 1), sub(seen, b.parts, seen.free[0]))
        kb.release(tile)


def _size(t: DramTensor) -> int:
    return ir.np_dtype(t.dtype).itemsize


def _ap(kb, t: DramTensor, block, ratio: int):
    """The block of wide elements `block`, in units of `t`'s elements (ratio per wide)."""
    return kb.ap(t, block.offset * ratio, ((block.pstride * ratio, block.parts),
                                           (1, block.free * ratio)))
