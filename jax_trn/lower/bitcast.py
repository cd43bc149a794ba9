"""bitcast_convert: the same bytes seen as another element type.

SBUF is untyped bytes (§3.1), so a bitcast is a DMA into a tile of the operand's type
and a DMA out of a tile of the result's type over the same bytes; neither DMA casts.
Between widths (XLA adds or drops a minor dimension of the width ratio) the wide
element's bytes are the narrow elements in order.

int4 / uint4 hold one value per byte on the device (jax_trn/hw/dtypes.py), so their
bitcasts move nibbles, not bytes (`_nibbles`): nibble k of a wide element is value k
of the minor dimension (little-endian, as XLA packs them). Packing: each value k is
DMAed in (a stride-`ratio` pattern) as int32, masked to 4 bits, shifted by 4k and or'ed
in on GpSimd's integer ALU (§2.5); unpacking: the wide element's bits as int32 (a
same-width integer view of its bytes), shifted right by 4k, masked, sign-extended for
int4 ((v ^ 8) - 8), DMAed out. int4 <-> uint4 is a wrapping convert.

float4_e2m1fn is stored the same way (one code per byte, hw/dtypes.py) and bitcasts
like uint4, but its codes move between HBM and the int32 tiles bit for bit (a DMA
between float4 and int32 would convert values): DMAed as float4 into a byte tile,
read as uint8 by a widening copy, and back (`_load_codes`, `_store_codes`). Between
float4 and int4 / uint4 the codes pass through an int32 tile: masked to 4 bits,
sign-extended for int4.
"""
from __future__ import annotations

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import sub
from .elementwise import FMAX
from .errors import LoweringError
from .layout import flat_tiles
from .registry import LowerCtx, register_lowering

NIBBLES = ("int4", "uint4", "float4_e2m1fn")
F4 = "float4_e2m1fn"
_SAME_WIDTH_INT = {1: "uint8", 2: "uint16", 4: "int32"}


@register_lowering("bitcast_convert")
def _bitcast_convert_lower(ctx: LowerCtx, x: DramTensor) -> None:
    out = ctx.outs[0]
    if x.dtype in NIBBLES or out.dtype in NIBBLES:
        return _nibbles(ctx, x, out)
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


def _nibbles(ctx: LowerCtx, x: DramTensor, out: DramTensor) -> None:
    """A bitcast from or to int4 / uint4 (see the module doc)."""
    kb = ctx.kb
    if x.dtype in NIBBLES and out.dtype in NIBBLES:
        for b in flat_tiles(x.size, FMAX, kb.target.partitions):
            if F4 in (x.dtype, out.dtype):
                _float4_codes(kb, x, out, b)
                continue
            tile = kb.tile(b.free, x.dtype)
            kb.dma(sub(tile, b.parts, b.free), _ap(kb, x, b, 1))
            kb.dma(_ap(kb, out, b, 1), sub(tile, b.parts, b.free))    # casts, wrapping
            kb.release(tile)
        return
    packing = x.dtype in NIBBLES
    wide, narrow = (out, x) if packing else (x, out)
    ratio = 2 * _size(wide)
    if wide.size * ratio != narrow.size:
        raise LoweringError(f"bitcast_convert between {x.dtype}{list(x.shape)} and "
                            f"{out.dtype}{list(out.shape)} changes the bit count")
    same = _SAME_WIDTH_INT[_size(wide)]
    fmax = FMAX // 4
    for b in flat_tiles(wide.size, fmax, kb.target.partitions):
        acc, part = kb.tile(b.free, "int32"), kb.tile(b.free, "int32")
        acc_b, part_b = sub(acc, b.parts, b.free), sub(part, b.parts, b.free)
        if packing:
            _pack(kb, narrow, b, ratio, acc_b, part_b)
            raw = kb.tile(b.free, same)
            raw_b = sub(raw, b.parts, b.free)
            kb.emit(isa.TensorCopy, dst=raw_b, src=acc_b, engine="gpsimd")
            kb.dma(_ap(kb, wide, b, 1), raw_b.with_(dtype=wide.dtype))
        else:
            raw = kb.tile(b.free, wide.dtype)
            raw_b = sub(raw, b.parts, b.free)
            kb.dma(raw_b, _ap(kb, wide, b, 1))
            kb.emit(isa.TensorCopy, dst=acc_b, src=raw_b.with_(dtype=same), engine="gpsimd")
            _unpack(kb, narrow, b, ratio, acc_b, part_b)
        kb.release(acc, part, raw)


def _nibble_ap(kb, t: DramTensor, block, ratio: int, k: int):
    """Value k of each wide element of `block` in the nibble tensor `t` (a float4
    tensor's code bytes, through a uint8 view)."""
    return kb.ap(t, block.offset * ratio + k, ((block.pstride * ratio, block.parts),
                                               (ratio, block.free)))


def _load_codes(kb, dst: isa.Tile, ap: isa.DramAP) -> None:
    """int32 tile <- the nibble values of `ap` (float4: its codes, bit for bit)."""
    if ap.dtype != F4:
        kb.dma(dst, ap)
        return
    raw = kb.tile(dst.free_size, F4)
    kb.dma(sub(raw, dst.num_partitions, dst.free_size), ap)
    kb.emit(isa.TensorCopy, dst=dst, engine="gpsimd",
            src=sub(raw, dst.num_partitions, dst.free_size).with_(dtype="uint8"))
    kb.release(raw)


def _store_codes(kb, ap: isa.DramAP, src: isa.Tile) -> None:
    """The nibble values of `ap` <- int32 tile `src` (float4: as codes)."""
    if ap.dtype != F4:
        kb.dma(ap, src)
        return
    raw = sub(kb.tile(src.free_size, "uint8"), src.num_partitions, src.free_size)
    kb.emit(isa.TensorCopy, dst=raw, src=src, engine="gpsimd")
    kb.dma(ap, raw.with_(dtype=F4))
    kb.release(raw)


def _float4_codes(kb, x: DramTensor, out: DramTensor, b) -> None:
    """float4 <-> int4 / uint4 (or float4 itself): the 4-bit codes through int32,
    sign-extended for an int4 result."""
    t = sub(kb.tile(b.free, "int32"), b.parts, b.free)
    _load_codes(kb, t, _ap(kb, x, b, 1))
    kb.emit(isa.TensorScalar, dst=t, data=t, op0="bitwise_and", operand0=0xF,
            engine="gpsimd")
    if out.dtype == "int4":
        kb.emit(isa.TensorScalar, dst=t, data=t, op0="bitwise_xor", operand0=8,
                op1="subtract", operand1=8, engine="gpsimd")
    _store_codes(kb, _ap(kb, out, b, 1), t)
    kb.release(t)


def _pack(kb, narrow: DramTensor, b, ratio: int, acc, part) -> None:
    for k in range(ratio):
        dst = acc if k == 0 else part
        _load_codes(kb, dst, _nibble_ap(kb, narrow, b, ratio, k))
        kb.emit(isa.TensorScalar, dst=dst, data=dst, op0="bitwise_and", operand0=0xF,
                op1="shift_left", operand1=4 * k, engine="gpsimd")
        if k:
            kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=part, op="bitwise_or",
                    engine="gpsimd")


def _unpack(kb, narrow: DramTensor, b, ratio: int, acc, part) -> None:
    signed = narrow.dtype == "int4"
    for k in range(ratio):
        kb.emit(isa.TensorScalar, dst=part, data=acc, op0="shift_right_logical",
                operand0=4 * k, op1="bitwise_and", operand1=0xF, engine="gpsimd")
        if signed:
            kb.emit(isa.TensorScalar, dst=part, data=part, op0="bitwise_xor", operand0=8,
                    op1="subtract", operand1=8, engine="gpsimd")
        _store_codes(kb, _nibble_ap(kb, narrow, b, ratio, k), part)
