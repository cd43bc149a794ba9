"""The masks and biases of the flash-attention backward kernel (attention_bwd.py): a
compile-time mask's partially masked blocks as cached additive bias tiles, and per job
the block of a runtime mask (or a compile-time one that varies per head) and of a
runtime bias, read with the unit's strides and combined on GpSimd as the forward does
(attention.py); rows a runtime mask leaves no key."""
from __future__ import annotations

from jax_trn.hw import isa

from .attention import NEG, mask_bias
from .attention_masks import clamp_bias
from .builder import sub

MASK_CACHE = 16         # distinct partially-masked blocks kept as bias tiles
MASK, BIAS = 4, 5       # their positions in a unit's offsets / the layout's strides


class MaskTiles:
    """Mixed into attention_bwd._FlashBwd (its tiles, rings, `base` offsets, `_dma`)."""

    def _bias(self, q0: int, qt: int, k0: int, kbn: int) -> isa.Tile:
        """The additive bias (0 / NEG, attention.py's) of a partially masked block, its
        columns in the key order of _load_keys_T (cached by content)."""
        key = self.mask[1][q0:q0 + qt, k0:k0 + kbn].tobytes() + bytes((qt, kbn % 256))
        tile = self.masks.get(key)
        if tile is None:
            keep = len(self.masks) < MASK_CACHE
            tile = self.kb.tile(kbn, self.dtype, parts=qt) if keep else \
                sub(self.dsT.next(), qt, kbn)
            sk, r_n = self.mask[1].shape[1], self.group
            nat = sub(self.dsT.next(), qt, kbn) if r_n > 1 else tile
            self._dma(nat, self.kb.ap(self.mask[0], q0 * sk + k0, ((sk, qt), (1, kbn))))
            if r_n > 1:     # columns in the key order of _load_keys_T: (r, c) <- R c + r
                g = kbn // r_n
                self.kb.emit(isa.TensorCopy, dst=tile.with_(free=(r_n, g)),
                             src=nat.with_(free=(r_n, g), strides=(1, r_n)), engine="gpsimd")
            neg = mask_bias(self.dtype)
            self.kb.emit(isa.TensorScalar, dst=tile, data=tile, op0="multiply",
                         operand0=-neg, op1="add", operand1=neg, engine="gpsimd")
            if keep:
                self.masks[key] = tile
        return tile

    def _runtime_bias(self, job: dict) -> tuple:
        """(the additive bias of a job's block, in the matmul dtype: 0 / NEG from the
        runtime mask plus the runtime bias; the mask as 0 / 1, or None), DMAed with
        the unit's strides and combined on GpSimd, as the forward does (attention.py)."""
        kb, blk = self.kb, job["block"]
        q0, qt, k0, kbn = job["q0"], job["qt"], blk["k0"], blk["kbn"]
        base = self.base[job["side"]["b"]]
        total, keep = sub(self.rt_total.next(), qt, kbn), None
        for n, t in ((MASK, self.rt_mask), (BIAS, self.rt_bias)):
            if t is None:
                continue
            rows, cols = self.rt_strides[n]
            ap = kb.ap(t, base[self.unit_pos[n]] + q0 * rows + k0 * cols,
                       ((rows, qt), (cols, kbn)))
            if n == MASK:
                m = sub(self.rt_bool.next(), qt, kbn)
                self._dma(m, ap)
                keep = sub(self.keep.next(), qt, kbn)
                kb.emit(isa.TensorScalar, dst=keep, data=m, op0="multiply", operand0=1.0,
                        engine="gpsimd")
                kb.emit(isa.TensorScalar, dst=total, data=m, op0="multiply",
                        operand0=-NEG, op1="add", operand1=NEG, engine="gpsimd")
                continue
            part = total if keep is None else sub(self.rt_part.next(), qt, kbn)
            self._dma(part, ap)
            if part is not total:
                kb.emit(isa.TensorTensor, dst=total, data1=total, data2=part, op="add",
                        engine="gpsimd")
            clamp_bias(kb, total)
        return total, keep

    def _unseen_rows(self, side: dict, i: int, qt: int, neg) -> None:
        """Rows a runtime mask leaves no key (a finite fill): their softmax is uniform
        over the Sk keys, but their lse (NEG + ln Sk in FP32) lost ln Sk, so exp(S -
        lse) gives 1, not 1 / Sk: their dO rows are scaled by 1 / Sk for dV (their dS
        is 0 by `keep`). f = 1 + (-lse >= -NEG / 2) * (1 / Sk - 1) per row (GpSimd)."""
        kb, f = self.kb, sub(self.rowf.next(), qt, 1)
        kb.emit(isa.TensorScalar, dst=f, data=neg, op0="is_ge", operand0=-NEG / 2,
                op1="multiply", operand1=1.0 / self.sk - 1.0, engine="gpsimd")
        kb.emit(isa.TensorScalar, dst=f, data=f, op0="add", operand0=1.0, engine="gpsimd")
        rows = sub(side["dor"], qt, self.dvn, at=i * self.dvn)
        kb.emit(isa.TensorScalar, dst=rows, data=rows, op0="multiply", operand0=f,
                engine="gpsimd")
