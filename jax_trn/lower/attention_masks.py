"""Mask biases of the flash-attention kernel (attention.py), as a mixin of its `_Flash`:
the additive bias tile of a compile-time mask's partially masked block (cached by
content), a runtime mask's rows and a runtime bias turned into one additive bias per
job (GpSimd), the NaN rows of a -inf fill, and the identity TensorE adds a bias with
(S += I @ bias). Moved out of attention.py unchanged, to keep that file short."""
from __future__ import annotations

from jax_trn.hw import isa

from .builder import sub

NEG = -3.0e38           # additive bias of a masked score (bf16; f16: `mask_bias`)
F16_NEG = -65504.0      # float16's largest finite magnitude: -3e38 would round to -inf
                        # there, and I @ bias then gives 0 * -inf = NaN for every score
BIAS_CACHE = 16         # distinct partially-masked blocks kept as bias tiles
MASK_ROWS_BYTES = 48 * 1024     # a runtime mask's rows kept in SBUF per partition


def mask_bias(dtype: str) -> float:
    """The additive bias of a masked score in the matmul dtype: finite there (S += I @
    bias multiplies it by I's zeros) and, added to FP32 scores, far enough below any
    unmasked one that exp gives 0."""
    return NEG if dtype == "bfloat16" else F16_NEG


def clamp_bias(kb, total: isa.Tile) -> None:
    """A runtime bias (plus the mask's) raised to at least the masked-score bias: a
    `-inf` entry (`bias=jnp.where(m, 0, -jnp.inf)`) would make I @ bias 0 * -inf =
    NaN for every score of its row block (and NEG + NEG overflows to -inf); clamped,
    it weighs nothing after exp, as -inf does. A row whose every key is -inf gets
    the mean of V here where XLA gives NaN (the clamped scores are all equal)."""
    kb.emit(isa.TensorScalar, dst=total, data=total, op0="max",
            operand0=mask_bias(total.dtype), engine="gpsimd")


class MaskBiases:
    """Methods of `_Flash` that build mask biases (they use its kb, axes, rings)."""

    def _bias(self, q0: int, qt: int, k0: int, kbn: int) -> isa.Tile:
        """The additive mask bias of a partially masked block (cached by content)."""
        key = self.mask[1][q0:q0 + qt, k0:k0 + kbn].tobytes() + bytes((qt, kbn % 256))
        tile = self.biases.get(key)
        if tile is not None:
            return tile
        tile = self.kb.tile(kbn, self.q.dtype, parts=qt) if len(self.biases) < BIAS_CACHE \
            else sub(self.pt.next(), qt, kbn)
        rows, cols = self.axes.sq[1][4], self.axes.sk[1][4]
        self._dma(tile, self.kb.ap(self.mask[0], q0 * rows + k0 * cols,
                                   ((rows, qt), (cols, kbn))))
        neg = mask_bias(self.q.dtype)
        self.kb.emit(isa.TensorScalar, dst=tile, data=tile, op0="multiply",
                     operand0=-neg, op1="add", operand1=neg, engine="gpsimd")
        if len(self.biases) < BIAS_CACHE:
            self.biases[key] = tile
        return tile

    def _runtime_bias(self, job: dict, width: int) -> isa.Tile:
        """The additive bias of a job from the runtime mask (0 / NEG) and the runtime
        bias, in the matmul dtype: the mask rows of a q-tile loaded once (bool, whole
        key range, kept while the next unit uses the same rows: heads broadcast), the
        bias chunk DMAed, both combined on GpSimd; TensorE adds it to S (one more pass
        per block; one job in VECTOR_EVERY adds it on VectorE instead)."""
        kb, tile, b = self.kb, job["tile"], job["b"]
        qt, k0 = tile["qt"], job["blocks"][0][0]
        total = sub(self.rt_sum.next(), qt, width)
        if self.rt_mask is not None:
            rows = self._mask_rows(b["mask"], tile["q0"], qt)
            kb.emit(isa.TensorScalar, dst=total, data=sub(rows, qt, width, at=k0),
                    op0="multiply", operand0=-NEG, op1="add", operand1=NEG,
                    engine="gpsimd")
        if self.rt_bias is not None:
            rows, cols = self.axes.sq[1][5], self.axes.sk[1][5]
            part = total if self.rt_mask is None else sub(self.rt_tiles.next(), qt, width)
            self._dma(part, kb.ap(self.rt_bias, b["bias"] + tile["q0"] * rows + k0 * cols,
                                  ((rows, qt), (cols, width))))
            if part is not total:
                kb.emit(isa.TensorTensor, dst=total, data1=total, data2=part, op="add",
                        engine="gpsimd")
            clamp_bias(kb, total)
        return total

    def _mask_rows(self, base: int, q0: int, qt: int) -> isa.Tile:
        """The runtime mask's rows [q0, q0 + qt) over every key (bool), cached per
        q-tile while they fit (MASK_ROWS_BYTES per partition), else reloaded."""
        rows, cols = self.axes.sq[1][4], self.axes.sk[1][4]
        at = base + q0 * rows
        cached = self.mask_rows.get(q0)
        if cached is not None and cached[1] == at:
            return cached[0]
        if cached is not None:
            tile = cached[0]
        elif -(-self.sq // self.pmax) * self.sk <= MASK_ROWS_BYTES:
            tile = self.kb.tile(self.sk, "bool")
        else:
            tile = self.mask_ring.next()
        self._dma(sub(tile, qt, self.sk),
                  self.kb.ap(self.rt_mask, at, ((rows, qt), (cols, self.sk))))
        self.mask_rows[q0] = (tile, at)
        return tile

    def _nan_rows(self, res: isa.Tile, tile: dict) -> None:
        """Rows with no unmasked key (-m >= -NEG / 2) become NaN, as softmax of a row
        of -inf is: res += 0 / (1 - flag)."""
        flag = sub(self.small.next(), tile["qt"], 1)
        self.kb.emit(isa.TensorScalar, dst=flag, data=tile["negm"], op0="is_ge",
                     operand0=-NEG / 2, op1="subtract", operand1=1.0, reverse1=True)
        self.kb.emit(isa.TensorScalar, dst=flag, data=flag, op0="divide", operand0=0.0,
                     reverse0=True)
        self.kb.emit(isa.TensorScalar, dst=res, data=res, op0="add", operand0=flag)

    def _identity(self) -> isa.Tile:
        """I [128, 128] in the matmul dtype, built once on GpSimd (affine_select p == f)."""
        if self.ident is None:
            self.ident = self.kb.tile(self.pmax, self.q.dtype)
            self.kb.emit(isa.Memset, dst=self.ident, value=1.0, engine="gpsimd")
            self.kb.emit(isa.AffineSelect, dst=self.ident, on_true_tile=self.ident,
                         on_false_value=0.0, pattern=((-1, self.pmax),), channel_multiplier=1,
                         cmp_op="is_equal")
        return self.ident

    # --- stage A: scores and softmax ------------------------------------------------------
