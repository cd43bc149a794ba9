"""The flash kernel's (attention.py) runtime padding mask given as two vectors,
mask[i, j] = rows[i] & cols[j] (flax's `make_attention_mask(valid_q, valid_k)`, found by
hlo_passes/attention_outer.py), applied with no per-tile [Sq, Sk] work:

- keys: softmax with masked keys is exp(s_ij - m) w_j / sum_j exp(s_ij - m) w_j with
  w_j = cols[j] in {0, 1}, for any row shift m. So V's rows are multiplied by w_j once
  per load, as GpSimd copies them from the load's staging tile (keys on partitions: a
  per-partition scalar), and V gets one more column holding w_j, so that
  P @ [V w | w] accumulates the masked row sums l beside O in PSUM (the online-softmax
  rescale by alpha covers both). The row max m is taken over every key (masked ones
  too): exact in real arithmetic and in FP32, except where exp underflows: unmasked
  keys whose score is more than ~87 below the row's max over all keys lose their
  weight, and a row whose unmasked keys all do gets the uniform result below. Masked
  scores that far above every unmasked one are not what padding gives (padded tokens
  are ordinary activations), but the kernel cannot check it.
- query rows with rows[i] = 0, or with no unmasked key (l = 0), see only the fill: with
  a finite fill their softmax is uniform over every key, so the result is the mean of
  V (one ones-matmul pass over V per head, before the weighting); with a -inf fill NaN,
  as XLA computes them. res = O * (ok / l) + meanV * (1 - ok), ok = rows[i] * (l > 0).

Versus the mask read whole: no [Sq, Sk] bool kernel before the attention (33 us on
linen_attn), no GpSimd bias build per job, no bias pass (identity matmul on TensorE or an
add on VectorE) per score block.
"""
from __future__ import annotations

import numpy as np

from jax_trn.hw import isa

from .builder import sub
from .layout import tiles
from .translate import Unsupported

MASK_K = 6          # the key vector's strides in `attention_layout` (after q .. bias)


class OuterMask:
    """State of one kernel's outer mask: the vectors' tensors, the cached row flags
    per q-tile and key weights per batch offset."""

    def __init__(self, flash, rows, cols):
        axes = flash.axes
        if any(len(s) <= MASK_K or s[MASK_K] for _, s in axes.group):
            raise Unsupported("attention: a key mask that varies across the heads "
                              "sharing a k / v head")
        self.f, self.rows, self.cols = flash, rows, cols
        kb, pmax = flash.kb, flash.pmax
        self.nkt = -(-flash.sk // pmax)
        self.ones = kb.tile(pmax, flash.v.dtype)
        kb.emit(isa.Memset, dst=self.ones, value=1.0, engine="gpsimd")
        self.weights: dict = {}         # key vector offset -> its tile
        self.weight_ring = kb.ring(3, self.nkt, "float32")
        self.flag_ring = kb.ring(2 * -(-flash.sq // pmax) + 1, 1, "float32")
        self.pending: dict = {}         # V loads not yet prepared, by SBUF offset
        self.flags: dict = {}
        self.meanv = kb.ring(2, flash.v_heads * flash.dv, "float32")
        self.stage = kb.ring(2, self.nkt * flash.v_heads * flash.dv, flash.v.dtype)
        for vb in flash.vb.tiles:       # the weights' columns start finite (x * 0 + w)
            cols = self.nkt * flash.v_heads
            kb.emit(isa.Memset, dst=vb.with_(offset=vb.offset + flash.dv * 2, free=(cols, 1),
                                             strides=(flash.dvx, 1)), value=1.0,
                    engine="gpsimd")
        self.tmp = kb.ring(2, flash.dv, "float32")

    # --- at each V load ---------------------------------------------------------------

    def load_v(self, vblock: isa.Tile, b: dict, width: int, vsize: int) -> isa.Tile:
        """DMAs V of the run of `vsize` heads at `b` (rows of vsize * Dv, as without the
        mask) into a staging tile; the rest (`prepare`) waits for the run's first
        P @ V, so no engine queue stalls on the load while earlier jobs could run.
        Returns the tile that will hold the run's meanV [P, vsize * Dv]."""
        f, kb = self.f, self.f.kb
        vs = f.axes.sk[1][2]
        stage = self.stage.next()
        for j, (r0, rn) in enumerate(tiles(f.sk, f.pmax)):
            f._dma(sub(stage, rn, width, at=j * width),
                   kb.ap(f.v, b["v"] + r0 * vs, ((vs, rn), (1, width))))
        meanv = self.meanv.next()
        self.pending[vblock.offset] = (stage, vsize, meanv, b["mask_k"])
        return meanv

    def prepare(self, vblock: isa.Tile) -> None:
        """Once per V load, before its first use: the heads' mean of V, then V' =
        [V w | w] per head and key tile ([keys, vsize, Dv + 1], GpSimd: the ones
        column set, V weighted by the key vector as it is copied in)."""
        job = self.pending.pop(vblock.offset, None)
        if job is None:
            return
        f, kb = self.f, self.f.kb
        stage, vsize, meanv, at = job
        dv, dvx = f.dv, f.dvx
        width, row = vsize * dv, vsize * dvx
        for h in range(vsize):
            self._mean(stage, width, h, sub(meanv, f.pmax, dv, at=h * dv))
        w = self._weights(at)
        for j, (r0, rn) in enumerate(tiles(f.sk, f.pmax)):
            blk = sub(vblock, rn, row, at=j * row)
            one = blk.with_(offset=blk.offset + dv * 2, free=(vsize, 1), strides=(dvx, 1))
            kb.emit(isa.TensorScalar, dst=one, data=one, op0="multiply", operand0=0.0,
                    op1="add", operand1=sub(w, rn, 1, at=j), engine="gpsimd")
            kb.emit(isa.TensorScalar, dst=blk.with_(free=(vsize, dv), strides=(dvx, 1)),
                    data=sub(stage, rn, (vsize, dv), at=j * width), op0="multiply",
                    operand0=sub(w, rn, 1, at=j), engine="gpsimd")

    def _mean(self, stage: isa.Tile, width: int, h: int, dst: isa.Tile) -> None:
        """dst = the mean over keys of head h's V, on every partition (ones^T V)."""
        f, kb = self.f, self.f.kb
        acc = sub(f.o.next(), f.pmax, f.dv)
        for j, (r0, rn) in enumerate(tiles(f.sk, f.pmax)):
            kb.emit(isa.NcMatmul, dst=acc, stationary=sub(self.ones, rn, f.pmax),
                    moving=sub(stage, rn, f.dv, at=j * width + h * f.dv),
                    accumulate=j > 0)
        kb.emit(isa.TensorScalar, dst=dst, data=acc, op0="multiply",
                operand0=1.0 / f.sk, engine="scalar")

    def _weights(self, at: int) -> isa.Tile:
        """The key vector as FP32 [P, key tiles] (key r0 + p at [p, j]), once per
        offset while it stays in its ring (units come batch by batch)."""
        w = self._cached(self.weights, self.weight_ring, at)
        if w[1]:
            f, cs = self.f, self.f.axes.sk[1][MASK_K]
            for j, (r0, rn) in enumerate(tiles(f.sk, f.pmax)):
                f._dma(sub(w[0], rn, 1, at=j), f.kb.ap(self.cols, at + r0 * cs,
                                                       ((cs, rn), (1, 1))))
        return w[0]

    @staticmethod
    def _cached(cache: dict, ring, key) -> tuple[isa.Tile, bool]:
        """(the tile cached for `key`, False), or (the ring's next tile, True) with the
        key it held forgotten."""
        if key in cache:
            return cache[key], False
        tile = ring.next()
        for old in [k for k, t in cache.items() if t is tile]:
            del cache[old]
        cache[key] = tile
        return tile, True

    # --- at each result ---------------------------------------------------------------

    def result(self, job: dict, acc: isa.Tile, res: isa.Tile) -> None:
        """res = O / l where the row sees a key, else meanV (finite fill) or NaN:
        res = O * (ok / l) + meanV * (1 - ok), two [qt, Dv] passes on VectorE (on
        GpSimd, measured slower: its queue also scales Q, which the scores wait for)."""
        f, kb, tile = self.f, self.f.kb, job["tile"]
        qt, dv = tile["qt"], f.dv
        small = f.small
        l = sub(acc, qt, 1, at=dv)
        ok = sub(small.next(), qt, 1)
        kb.emit(isa.TensorScalar, dst=ok, data=l, op0="is_gt", operand0=0.0,
                op1="multiply", operand1=self._flags(job["b"]["mask"], tile["q0"], qt))
        r = sub(small.next(), qt, 1)        # ok / max(l, tiny)
        kb.emit(isa.TensorScalar, dst=r, data=l, op0="max", operand0=1e-30, op1="divide",
                operand1=ok, reverse1=True)
        c = sub(small.next(), qt, 1)        # 1 - ok; 0 / ok - 1 + 1 with a -inf fill: NaN
        if f.fill == -np.inf:
            kb.emit(isa.TensorScalar, dst=c, data=ok, op0="divide", operand0=0.0,
                    reverse0=True, op1="subtract", operand1=ok)
            kb.emit(isa.TensorScalar, dst=c, data=c, op0="add", operand0=1.0)
        else:
            kb.emit(isa.TensorScalar, dst=c, data=ok, op0="subtract", operand0=1.0,
                    reverse0=True)
        meanv = sub(job["kv"][4], qt, dv, at=job["kv"][2] // f.dvx * dv)
        t = sub(self.tmp.next(), qt, dv)
        kb.emit(isa.TensorScalar, dst=t, data=meanv, op0="multiply", operand0=c)
        kb.emit(isa.ScalarTensorTensor, dst=res, data=sub(acc, qt, dv), op0="multiply",
                operand0=r, op1="add", operand1=t)

    def _flags(self, at: int, q0: int, qt: int) -> isa.Tile:
        """The query vector's rows [q0, q0 + qt) as FP32 [qt, 1], once per offset
        while they stay in their ring."""
        flag, new = self._cached(self.flags, self.flag_ring, (at, q0))
        if new:
            f = self.f
            rs = f.axes.sq[1][4]
            f._dma(sub(flag, qt, 1), f.kb.ap(self.rows, at + q0 * rs, ((rs, qt), (1, 1))))
        return sub(flag, qt, 1)
