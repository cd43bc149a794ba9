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
  V; with a -inf fill NaN, as XLA computes them. One more matmul per q-tile (K = 1,
  TensorE) adds c_i * [meanV | 1] to the last chunk's [O | l] in PSUM, c_i = BIG
  (1e30) where rows[i] = 0, TINY (1e-30) elsewhere (NaN / 0 with a -inf fill), so that
  res = O / l is meanV for padded rows (BIG swamps O and l), O / l for the others (TINY
  is lost against any l the FP32 exp did not underflow), meanV where l = 0 (TINY / TINY),
  and the result is one VectorE divide. meanV [1, Dv] per head: ones^T V (TensorE).

Versus the mask read whole: no [Sq, Sk] bool kernel before the attention (33 us on
linen_attn), no GpSimd bias build per job, no bias pass (identity matmul on TensorE or an
add on VectorE) per score block.
"""
from __future__ import annotations

import numpy as np

from jax_trn.hw import isa
from jax_trn.hw.dtypes import itemsize as _itemsize

from .builder import Ring, sub
from .layout import tiles
from .translate import Unsupported

BIG, TINY = 1e30, 1e-30     # c_i of padded / other rows (module docstring)
V_LOADS_PER_JOB = 2  # deferred V tile loads emitted per job (measured, linen_attn:
                     # 1 or 2: 791.6 us, 3: 796.4, all at once: 797.4)
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
        self.cdtype = "bfloat16" if flash.v.dtype == "bfloat16" else "float32"
        self.weight_ring = kb.ring(3, self.nkt, "float32")
        self.flag_ring = Ring([kb.tile(pmax, self.cdtype, parts=1)
                               for _ in range(2 * -(-flash.sq // pmax) + 1)])
        self.flag_f32 = kb.tile(pmax, "float32", parts=1)
        self.loads: list = []           # V loads to emit after the next Q load
        self.pending: dict = {}         # V loads not yet prepared, by SBUF offset
        self.flags: dict = {}
        self.meanv = Ring([kb.tile(flash.v_heads * flash.dvx, self.cdtype, parts=1)
                           for _ in range(2)])
        for t in self.meanv.tiles:      # [meanV | 1] per head: the ones set once
            kb.emit(isa.Memset, dst=t.with_(offset=t.offset + flash.dv * _itemsize(
                self.cdtype), free=(flash.v_heads, 1), strides=(flash.dvx, 1)), value=1.0,
                engine="gpsimd")
        self.stage = kb.ring(2, self.nkt * flash.v_heads * flash.dv, flash.v.dtype)
        for vb in flash.vb.tiles:       # the weights' columns start finite (x * 0 + w)
            cols = self.nkt * flash.v_heads
            kb.emit(isa.Memset, dst=vb.with_(offset=vb.offset + flash.dv * 2, free=(cols, 1),
                                             strides=(flash.dvx, 1)), value=1.0,
                    engine="gpsimd")

    # --- at each V load ---------------------------------------------------------------

    def load_v(self, vblock: isa.Tile, b: dict, width: int, vsize: int) -> isa.Tile:
        """Queues the DMAs of V of the run of `vsize` heads at `b` (rows of vsize * Dv,
        as without the mask) into a staging tile (`flush` emits them, a few per job);
        the rest (`prepare`) waits for the run's first P @ V, so no engine queue
        stalls on the load while earlier jobs could run.
        Returns the tile that will hold the run's [meanV | 1] rows [1, vsize x Dv+1]."""
        f, kb = self.f, self.f.kb
        vs = f.axes.sk[1][2]
        stage = self.stage.next()
        for j, (r0, rn) in enumerate(tiles(f.sk, f.pmax)):
            self.loads.append((sub(stage, rn, width, at=j * width),
                               kb.ap(f.v, b["v"] + r0 * vs, ((vs, rn), (1, width)))))
        meanv = self.meanv.next()
        self.pending[vblock.offset] = (stage, vsize, meanv, b["mask_k"])
        return meanv

    def flush(self, n: int = V_LOADS_PER_JOB) -> None:
        """`n` of the V loads `load_v` deferred (all with n=None), emitted after a
        job's Q load: a run's V (up to 2 MB) spread over the first jobs instead of
        queued at once ahead of the next q-tiles' Q (whose scores then waited ~13 us)."""
        for dst, src in self.loads[:n]:
            self.f._dma(dst, src)
        self.loads = self.loads[len(self.loads) if n is None else n:]

    def prepare(self, vblock: isa.Tile) -> None:
        """Once per V load, before its first use: the heads' mean of V, then V' =
        [V w | w] per head and key tile ([keys, vsize, Dv + 1], GpSimd: the ones
        column set, V weighted by the key vector as it is copied in)."""
        job = self.pending.pop(vblock.offset, None)
        if job is None:
            return
        self.flush(None)                # every V load emitted before its first read
        f, kb = self.f, self.f.kb
        stage, vsize, meanv, at = job
        dv, dvx = f.dv, f.dvx
        width, row = vsize * dv, vsize * dvx
        for h in range(vsize):
            self._mean(stage, width, h, sub(meanv, 1, dv, at=h * dvx))
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
        """dst [1, Dv] = the mean over keys of head h's V (ones^T V)."""
        f, kb = self.f, self.f.kb
        acc = sub(f.o.next(), 1, f.dv)
        for j, (r0, rn) in enumerate(tiles(f.sk, f.pmax)):
            kb.emit(isa.NcMatmul, dst=acc, stationary=sub(self.ones, rn, 1),
                    moving=sub(stage, rn, f.dv, at=j * width + h * f.dv),
                    accumulate=j > 0)
        kb.emit(isa.TensorScalar, dst=dst, data=acc, op0="multiply",
                operand0=1.0 / f.sk, engine="scalar")

    def _weights(self, at: int) -> isa.Tile:
        """The key vector as FP32 [P, key tiles] (key r0 + p at [p, j]), once per
        offset while it stays in its ring (units come batch by batch); loaded at the
        run's first P @ V (measured better than at the V load, or as [key tiles, P]
        rows turned by TensorE: both wait on DMA queues the Q loads need)."""
        w, new = self._cached(self.weights, self.weight_ring, at)
        if new:
            f, cs = self.f, self.f.axes.sk[1][MASK_K]
            for j, (r0, rn) in enumerate(tiles(f.sk, f.pmax)):
                f._dma(sub(w, rn, 1, at=j), f.kb.ap(self.cols, at + r0 * cs,
                                                    ((cs, rn), (1, 1))))
        return w

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

    def correct(self, job: dict, o: isa.Tile) -> None:
        """[O | l] += c_i * [meanV | 1] on the last chunk's PSUM accumulator."""
        tile = job["tile"]
        kv = job["kv"]
        self.f.kb.emit(isa.NcMatmul, dst=o, stationary=self._flags(
            job["b"]["mask"], tile["q0"], tile["qt"]),
            moving=sub(kv[4], 1, self.f.dvx, at=kv[2]), accumulate=True)

    def result(self, job: dict, acc: isa.Tile, res: isa.Tile) -> None:
        """res = O / l (see the module docstring for padded rows)."""
        qt = job["tile"]["qt"]
        self.f.kb.emit(isa.TensorScalar, dst=res, data=sub(acc, qt, self.f.dv),
                       op0="divide", operand0=sub(acc, qt, 1, at=self.f.dv))

    def _flags(self, at: int, q0: int, qt: int) -> isa.Tile:
        """c [1, qt] of the query rows [q0, q0 + qt): BIG where rows[i] = 0 else TINY
        (NaN / 0 with a -inf fill), once per offset while it stays in its ring."""
        c, new = self._cached(self.flags, self.flag_ring, (at, q0))
        c = sub(c, 1, qt)
        if new:
            f, kb = self.f, self.f.kb
            rs = f.axes.sq[1][4]
            r = sub(self.flag_f32, 1, qt)
            f._dma(r, kb.ap(self.rows, at + q0 * rs, ((rs * qt, 1), (rs, qt))))
            if f.fill == -np.inf:
                kb.emit(isa.TensorScalar, dst=c, data=r, op0="divide", operand0=0.0,
                        reverse0=True)
            else:
                kb.emit(isa.TensorScalar, dst=r, data=r, op0="multiply", operand0=-BIG,
                        op1="add", operand1=BIG)
                kb.emit(isa.TensorScalar, dst=c, data=r, op0="max", operand0=TINY)
        return c
