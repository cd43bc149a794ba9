"""Attention backward fusions (hlo_passes/passes/attention_bwd_fusion.py) as one
flash-attention backward kernel (FlashAttention-2 style): dq, dk, dv of
o = softmax(mask(q @ k^T * scale)) @ v from q, k, v, o, do and the rows' logsumexp the
forward kernel wrote (attention.py), the [Sq, Sk] scores and probabilities never
leaving the chip. q, k, v, o, do are read and dq, dk, dv written in the program's own
layout ([B, S, N, H] as jax.nn.dot_product_attention has them, or any other with the
head dim contiguous): the fusion's `attention_layout` gives each operand's strides for
the batch axes, Sq, Sk, D and Dv (the forward's, hlo_passes/attention_layout.py, with
do, dq, dk, dv appended: hlo_passes/passes/attention_bwd_fusion.bwd_layout), so no
transpose kernel runs before or after.

Per unit (a batch index and a GQA group: the axes flattened), everything of the query side stays in SBUF:
Q^T [D, Sq] (by dma_transpose, §3.4, times the scale on GpSimd, as the forward does),
Q and dO in 128-row tiles (rows on partitions), dO^T [Dv, Sq], -lse and
Dr = rowsum(dO * O) per row ([P, 1] columns), and an FP32 dQ accumulator; the key side
likewise (K^T, K rows, V^T of the unit's kv head). Then for each 128-key block j, for
each 128-row q-tile i with an unmasked entry in block (i, j) (a compile-time mask the
same for every unit: fully masked blocks are skipped, partially masked ones get the
forward's additive bias by one more TensorE pass, S += I @ bias; a runtime mask, a
mask that varies per head, or a runtime bias: their block is read per job and added
the same way, and dS is multiplied by the mask, as the program's select(mask, ds, 0)):

  A  S = (scale Q_i) K_j^T (+ the mask bias) and dP = dO_i V_j^T on TensorE (PSUM,
     FP32); P = exp(S - lse_i) and dP - Dr_i on ScalarE (the row statistics are the
     activation biases), dS = (dP - Dr_i) * P on VectorE, both in bf16
  B  dV_j += P^T dO_i and dK_j += dS^T Q_i, accumulated in PSUM across i (stationary P /
     dS [q, k], §2.2); dS^T by a TensorE transpose, copied to SBUF (VectorE)
  C  dQ_i += dS K_j (stationary dS^T [k, q]): in PSUM when the banks allow, else
     through a PSUM ring added into an SBUF FP32 accumulator

After the last i of block j, dK_j * scale and dV_j are rounded and DMAed out (two keys
per partition when their rows are contiguous: 512-byte descriptors, `_store_kv`; GQA:
summed over the groups of a batch index in FP32 SBUF first); after the last j of q-tile i,
dQ_i * scale. Stages are emitted software-pipelined (each engine runs its queue in
program order, §2.1): A(n), B(n - 3), C(n - 6), so TensorE has the next scores while
ScalarE / VectorE compute a pair's P and dS, and dS^T's PSUM -> SBUF copy (VectorE,
queued behind later jobs' dS) has three jobs of TensorE work to finish before dQ reads
it. Lags (B, C) measured on the LM row's backward (B4 S1023 N16 H64 causal bf16, us):
(2, 3) 1313, (3, 4) 1302, (1, 5) 1312, (2, 4) 1073, (2, 5) 1045, (3, 5) 1061, (3, 6)
1029, (3, 7) 1032, (4, 7) 1065: C trailing B by one job, TensorE waited at each dQ. The next batch index's inputs are DMAed while this one
computes.

Numerics: FP32 scores; P, dP - Dr and dS rounded to the 16-bit dtype (the program
rounds p and ds before its matmuls), FP32 accumulation; the scale is applied to dq / dk
in FP32 at the end (the program multiplies the rounded ds by it). Non-16-bit operands,
D or Dv > 128, a head dim that is not contiguous or a fully masked q row of a
compile-time mask raise Unsupported: the region's ops then run one by one. (A row a
runtime mask leaves no key: `_unseen_rows`.)
"""
from __future__ import annotations

import itertools

from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .attention import _check, _mask, pipeline_slots
from .attention_bwd_masks import MaskTiles
from .attention_dropout import DropoutBlocks
from .attention_layout import Axes, HeadStores
from .builder import Ring, sub
from .layout import tiles
from .registry import LowerCtx
from .translate import Unsupported
from .transposed import Transposer

LAG_B, LAG_C = 3, 6     # stage B of job n - 3 and C of n - 6 follow stage A of job n
                        # (rings between the stages are sized from them)
KEY_GROUP = 2          # keys per partition in the dk / dv stores (_store_kv; 2 measured
                       # faster than 1 and 4: S1024 208 / 180 / 198 us, S2048 543 / 537 / 577)
STORE_BUFS = 8         # result tiles in flight to HBM (a store takes ~2 us: 1.3 us fixed, §2.6)
HEADS_BYTES = 16 * 1024     # SBUF per partition for each of dq / dk / dv of adjacent heads


def lower_attention_bwd(ctx: LowerCtx, ins: list[DramTensor], scale: float,
                        masked: bool, layout: tuple | None = None,
                        offsets: tuple = (), dropout: float | None = None) -> None:
    q, k, v, o, lse, do = ins[:6]
    if layout is None:
        raise Unsupported("attention backward without its attention_layout")
    axes = Axes(layout, offsets)
    mask = _mask(ctx, ins[6], axes) if masked else None
    drop = (ins[-1], dropout) if dropout else None
    runtime = {"mask": ins[6] if masked and mask is None else None,
               "bias": ins[6 + masked] if len(ins) > 6 + masked + bool(drop) else None,
               "drop": drop}
    _check(ctx, q, k, v, axes)
    d, dv = axes.d[0], axes.dv[0]
    if max(d, dv) > ctx.target.partitions or not do.dtype == o.dtype == q.dtype:
        raise Unsupported(f"attention backward with D={d}, Dv={dv} (<= "
                          f"{ctx.target.partitions}) or do / o {do.dtype} / {o.dtype} != "
                          f"{q.dtype}")
    if (axes.d[1][7], axes.d[1][8], axes.dv[1][6], axes.dv[1][9]) != (1, 1, 1, 1):
        raise Unsupported("attention backward with a head dim of do / dq / dk / dv that "
                          "is not contiguous")
    if runtime["mask"] is not None and q.dtype != "bfloat16":
        raise Unsupported(f"attention backward with a runtime mask on {q.dtype} (its "
                          "-3e38 bias needs bfloat16's range)")
    if any(out.dtype not in (q.dtype, "float32") for out in ctx.outs):
        raise Unsupported(f"attention backward writing {[o.dtype for o in ctx.outs]}")
    ctx.kb.notes.append("attention_bwd: flash-attention backward kernel (attention_bwd.py)")
    _FlashBwd(ctx, (q, k, v, o, lse, do), scale, mask, axes, runtime).run()


# operand positions in a backward fusion's attention_layout strides (hlo_passes/passes/
# attention_bwd_fusion.bwd_layout): the forward's q, k, v, o, mask, bias, then these
Q, K, V, O, MASK, BIAS, DO, DQ, DK, DV, DROP = range(11)
UNIT = (Q, K, V, O, DO, DQ, DK, DV, MASK, BIAS)     # the order of a unit's offsets
                                                    # (+ DROP with a dropout)


class _FlashBwd(MaskTiles):
    def __init__(self, ctx: LowerCtx, ins, scale: float, mask, axes: Axes, runtime: dict):
        self.ctx, self.kb, self.scale, self.mask = ctx, ctx.kb, scale, mask
        self.rt_mask, self.rt_bias = runtime["mask"], runtime["bias"]
        self.drop = runtime["drop"]         # (operand, factor of its values) or None
        self.runtime = self.rt_mask is not None or self.rt_bias is not None
        self.rt_strides = {n: (axes.sq[1][n], axes.sk[1][n])
                           for n in (MASK, BIAS) + ((DROP,) if self.drop else ())}
        self.q, self.k, self.v, self.o, self.lse, self.do = ins
        # one output: dq, dk, dv packed into one gradient (attention_views.py), each at
        # its strides and offset in it
        self.dq, self.dk, self.dv = ctx.outs if len(ctx.outs) == 3 else ctx.outs * 3
        self.sq, self.d = axes.sq[0], axes.d[0]
        self.sk, self.dvn = axes.sk[0], axes.dv[0]
        self.rows = {n: axes.sq[1][n] for n in (Q, O, DO, DQ)} | \
            {n: axes.sk[1][n] for n in (K, V, DK, DV)}      # row strides
        ops = UNIT + ((DROP,) if self.drop else ())
        groups = axes.offsets(axes.group, ops)      # GQA: k, v, dk, dv strides 0
        self.ngroups = len(groups)
        self.base = [tuple(map(sum, zip(b, g)))
                     for b in axes.offsets(axes.batch, ops, start=True)
                     for g in groups]               # per unit (batch index, group)
        self.unit_pos = {n: i for i, n in enumerate(ops)}       # in a `base` tuple
        self.batch = len(self.base)
        self.pmax = ctx.target.partitions
        self.bank = ctx.target.psum_bank_fp32
        self.nq, self.nk = -(-self.sq // self.pmax), -(-self.sk // self.pmax)
        self.dtype = self.q.dtype
        kb, dt, p = self.kb, self.dtype, self.pmax
        # two of each per-batch tile: the next batch index loads while this one ends;
        # the row tiles stages B and C read, as many as batch indices they span
        self.rows_depth = rows = self._rows_depth()
        self.qT, self.doT = kb.ring(2, self.sq, dt), kb.ring(2, self.sq, dt)
        self.qr = kb.ring(rows, self.nq * self.d, dt)
        self.dor = kb.ring(rows, self.nq * self.dvn, dt)
        self.stats = kb.ring(2, 2 * self.nq, "float32")     # -lse, -Dr per q-tile
        self.kT, self.vT = kb.ring(2, self.sk, dt), kb.ring(2, self.sk, dt)
        self.kr = kb.ring(rows, self.nk * self.d, dt)
        self.oT = kb.ring(2, self.sq, dt)
        self.prod = kb.ring(1, self.sq, "float32")
        self.lse_in = kb.ring(2, self.nq, "float32")
        self.ones = kb.tile(1, "float32")
        kb.emit(isa.Memset, dst=self.ones, value=1.0, engine="gpsimd")
        depth = LAG_C + 1               # a job's tiles live from stage A to stage C
        self.pt, self.dst = kb.ring(depth, p, dt), kb.ring(depth, p, dt)
        self.dpd, self.dsT = kb.ring(depth, p, dt), kb.ring(depth, p, dt)
        self.res = {t: kb.ring(STORE_BUFS, max(self.d, self.dvn), t)
                    for t in {out.dtype for out in ctx.outs}}
        rows_contiguous = self.rows[DK] == self.d and self.rows[DV] == self.dvn
        self.group = KEY_GROUP if self.sk % p == 0 and rows_contiguous and \
            not self.runtime and not self.drop else 1   # runtime tiles in key order
        if self.runtime:
            self.rt_total, self.rt_part = kb.ring(depth, p, dt), kb.ring(depth, p, dt)
            self.rt_bool, self.keep = kb.ring(depth, p, "bool"), kb.ring(depth, p, dt)
            self.rowf = kb.ring(4, 1, "float32")
        if self.drop:
            self.drop_blocks = DropoutBlocks(kb, self.drop[0], self.sq, self.sk,
                                             self.rt_strides[DROP], self._dma, depth, p)
            self.pdrop, self.dpw = kb.ring(depth, p, dt), kb.ring(depth, p, "float32")
        self._head_stores()
        if self.group > 1:
            self.kvres = {t: kb.ring(STORE_BUFS, self.group * max(self.d, self.dvn), t)
                          for t in {self.dk.dtype, self.dv.dtype}}
        self.s, self.dp = bank_rings(kb, (2, p), (2, p))
        self.tps = bank_rings(kb, (4, p))[0]
        self.dkps, self.dvps = bank_rings(kb, (2, self.d), (2, self.dvn))
        self._dq_accumulators()
        if self.ngroups > 1:        # dK, dV summed over a batch index's groups (FP32)
            self.kvacc = {"dk": kb.tile(self.nk * self.d, "float32"),
                          "dv": kb.tile(self.nk * self.dvn, "float32")}
        self.masks: dict[bytes, isa.Tile] = {}
        self.ident: isa.Tile | None = None
        self.copy_engines = itertools.cycle(("scalar", "vector"))
        self.queues = itertools.cycle(range(ctx.target.dma_queues))
        self.tr = Transposer(kb, self._dma, self.tps.next, self.copy_engines)
        kb.flops += 2 * self.batch * self.sq * self.sk * 2 * (self.d + self.dvn)

    def _head_stores(self) -> None:
        """dq (any layout) and dk / dv (one group per kv head, one key per partition)
        of runs of adjacent heads staged and stored together (`HeadStores`)."""
        at = {n: [b[self.unit_pos[n]] for b in self.base] for n in (DQ, DK, DV)}
        self.heads = {DQ: HeadStores(self.kb, at[DQ], self.d, self.nq, self.dq.dtype,
                                     HEADS_BYTES, self._dma)}
        if self.ngroups == 1 and self.group == 1:
            for n, out, w in ((DK, self.dk, self.d), (DV, self.dv, self.dvn)):
                self.heads[n] = HeadStores(self.kb, at[n], w, self.nk, out.dtype,
                                           HEADS_BYTES, self._dma)

    def _dq_accumulators(self) -> None:
        """dQ accumulates in PSUM (tile i in bank i // per_bank) when the banks left
        allow (§3.2: 8 banks, 3 taken above), else in an SBUF FP32 tile fed from a PSUM
        ring by VectorE adds."""
        kb, t = self.kb, self.ctx.target
        per_bank = self.bank // self.d
        banks = -(-self.nq // per_bank)
        self.dq_psum = banks <= t.psum_banks - 3
        if self.dq_psum:
            self.dqacc = kb.tile(banks * self.bank, "float32", mem="psum")
        else:
            self.dqacc = kb.ring(self.rows_depth, self.nq * self.d, "float32")
            self.dqps = bank_rings(kb, (4, self.d))[0]

    def _rows_depth(self) -> int:
        """Slots of the per-batch tiles stages B and C read (q, dO and K rows, dQ in
        SBUF). Batch index b's are written by its first job's stage A and read until its
        last job's stage C, LAG_C jobs later (`attention.pipeline_slots`): 4 when a
        causal S = 128 makes one job per head (two slots let head b + 2 overwrite head
        b's rows)."""
        jobs = sum(self._state(q0, qt, k0, kbn) != "skip"
                   for k0, kbn in tiles(self.sk, self.pmax) for q0, qt in tiles(self.sq, self.pmax))
        return pipeline_slots(jobs, LAG_C)

    def _dq_slot(self, side: dict, i: int, qt: int) -> isa.Tile:
        if self.dq_psum:
            per_bank = self.bank // self.d
            return sub(self.dqacc, qt, self.d, at=(i // per_bank) * self.bank +
                       (i % per_bank) * self.d)
        return sub(side["dq"], qt, self.d, at=i * self.d)

    # --- driver ------------------------------------------------------------------------

    def run(self) -> None:
        per_b = [self._jobs(b) for b in range(self.batch)]
        for b in range(self.batch - 1):
            if per_b[b] and per_b[b + 1]:
                per_b[b][0]["next"] = per_b[b + 1][0]["side"]
        jobs = [job for b_jobs in per_b for job in b_jobs]
        for n in range(len(jobs) + LAG_C):
            for stage, lag in ((self._stage_a, 0), (self._stage_b, LAG_B),
                               (self._stage_c, LAG_C)):
                if 0 <= n - lag < len(jobs):
                    stage(jobs[n - lag])

    def _jobs(self, b: int) -> list[dict]:
        """One job per live (key block, q-tile) pair of batch index `b`; key blocks with
        no live pair get their zero dk / dv written here."""
        jobs, side = [], {"b": b}
        qtiles = tiles(self.sq, self.pmax)
        if self.mask is not None and not self.mask[1].any(axis=1).all():
            raise Unsupported("attention with a fully masked query row (softmax of -inf)")
        for j, (k0, kbn) in enumerate(tiles(self.sk, self.pmax)):
            live = [(i, q0, qt, st) for i, (q0, qt) in enumerate(qtiles)
                    if (st := self._state(q0, qt, k0, kbn)) != "skip"]
            if not live:
                self._zero_block(b, k0, kbn)
            block = {"j": j, "k0": k0, "kbn": kbn}
            for n, (i, q0, qt, st) in enumerate(live):
                jobs.append({"side": side, "block": block, "i": i, "q0": q0, "qt": qt,
                             "state": st, "first": n == 0, "last": n == len(live) - 1})
        last = {job["i"]: job for job in jobs}
        for job in last.values():
            job["dq_last"] = True           # tile i's dQ is complete after this job
        if jobs:
            jobs[0]["load"] = True
        side["started"] = set()
        return jobs

    def _state(self, q0: int, qt: int, k0: int, kbn: int) -> str:
        if self.mask is None:
            return "full"
        blk = self.mask[1][q0:q0 + qt, k0:k0 + kbn]
        return "full" if blk.all() else ("skip" if not blk.any() else "partial")

    # --- loads -------------------------------------------------------------------------

    def _dma(self, dst, src, cls=isa.DmaCopy) -> None:
        self.kb.emit(cls, dst=dst, src=src, dma_queue=next(self.queues))

    def _load_T(self, t: DramTensor, base: int, rows: int, stride: int, width: int,
                dst) -> None:
        """[rows, width] of `t` at `base`, rows `stride` apart, as [width, rows]
        (dma_transpose, §3.4; Trn1: transposed.py)."""
        for r0, rn in tiles(rows, self.bank):
            src = self.kb.ap(t, base + r0 * stride, ((stride, rn), (1, width)))
            self.tr.load(sub(dst, width, rn, at=r0), src)

    def _rows(self, srcT, rows: int, width: int, dst) -> None:
        """dst[:, i * width:] = the 128-row tile i of srcT^T ([width, rows] in SBUF), by
        TensorE transposes: cheaper than DMAing rows of under 512 bytes (§3.4)."""
        for i, (r0, rn) in enumerate(tiles(rows, self.pmax)):
            tp = sub(self.tps.next(), rn, width)
            self.kb.emit(isa.NcTranspose, dst=tp, data=sub(srcT, width, rn, at=r0))
            self.kb.emit(isa.TensorCopy, dst=sub(dst, rn, width, at=i * width), src=tp,
                         engine=next(self.copy_engines))

    def _fetch(self, side: dict) -> None:
        """The DMAs of one batch index's inputs (q, do, k, v, o transposed; lse),
        issued one batch index ahead: the DMA queues run beside the compute engines."""
        if "qT" in side:
            return
        kb, b, d, dv, p = self.kb, side["b"], self.d, self.dvn, self.pmax
        base, rows = self.base[b], self.rows
        for name, ring in (("qT", self.qT), ("doT", self.doT), ("qr", self.qr),
                           ("dor", self.dor), ("kT", self.kT), ("vT", self.vT),
                           ("kr", self.kr), ("oT", self.oT), ("stats", self.stats),
                           ("lse", self.lse_in)):
            side[name] = ring.next()
        self._load_T(self.q, base[UNIT.index(Q)], self.sq, rows[Q], d, side["qT"])
        self._load_T(self.do, base[UNIT.index(DO)], self.sq, rows[DO], dv, side["doT"])
        self._load_keys_T(self.k, base[UNIT.index(K)], rows[K], d, side["kT"])
        self._load_keys_T(self.v, base[UNIT.index(V)], rows[V], dv, side["vT"])
        self._load_T(self.o, base[UNIT.index(O)], self.sq, rows[O], dv, side["oT"])
        full = self.sq // p
        if full:          # lse [nq, 128] rows -> [128, nq] columns by one dma_transpose
            self.tr.load(sub(side["lse"], p, full),
                         kb.ap(self.lse, b * self.sq, ((p, full), (1, p))))
        tail = self.sq - full * p
        if tail:          # the last q-tile's [1, tail] row -> a [tail, 1] column
            self.tr.load(sub(side["lse"], tail, 1, at=full),
                         kb.ap(self.lse, b * self.sq + full * p, ((tail, 1), (1, tail))))

    def _load_keys_T(self, t: DramTensor, base: int, stride: int, width: int,
                     dst) -> None:
        """K^T / V^T [width, Sk]; with key groups, column k0 + r * g + c of block k0
        holds key k0 + R * c + r (R = self.group, g = 128 / R): one dma_transpose of
        every R-th row per r. dK / dV then come out of PSUM with keys k0 + R * c + r in
        partition r * g + c, so each partition of the store holds R consecutive rows."""
        r_n = self.group
        if r_n == 1:
            return self._load_T(t, base, self.sk, stride, width, dst)
        g = self.pmax // r_n
        for k0 in range(0, self.sk, self.pmax):
            for r in range(r_n):
                src = self.kb.ap(t, base + (k0 + r) * stride, ((r_n * stride, g), (1, width)))
                self.tr.load(sub(dst, width, g, at=k0 + r * g), src)

    def _load(self, side: dict, nxt: dict | None) -> None:
        """One batch index's on-chip inputs and row statistics; the next one's DMAs."""
        kb, d, dv = self.kb, self.d, self.dvn
        self._fetch(side)
        if nxt is not None:
            self._fetch(nxt)
        self._rows(side["qT"], self.sq, d, side["qr"])
        self._rows(side["doT"], self.sq, dv, side["dor"])
        self._rows(side["kT"], self.sk, d, side["kr"])
        qT = sub(side["qT"], d, self.sq)
        kb.emit(isa.TensorScalar, dst=qT, data=qT, op0="multiply", operand0=self.scale,
                engine="gpsimd")
        if not self.dq_psum:
            side["dq"] = self.dqacc.next()
            kb.emit(isa.Memset, dst=side["dq"], value=0.0, engine="gpsimd")
        self._row_stats(side)

    def _row_stats(self, side: dict) -> None:
        """-lse and -Dr = -rowsum(dO * O) per q-tile ([qt, 1] FP32 columns); Dr as
        (dO^T * O^T)^T @ 1 on TensorE. The product [Dv, Sq] runs on GpSimd: on VectorE
        (2N cycles, FP32 out, §6.3: ~2.1 us at S1023) it sat in VectorE's queue behind
        the previous unit's dS and TensorE waited on it at every unit's first Dr matmul
        (LM row backward, 64 units: 1029 -> 974 us; preparing the unit's rows and
        statistics 4 to 12 jobs ahead measured 985-988 us, not better)."""
        kb, b, dv, p = self.kb, side["b"], self.dvn, self.pmax
        full, lse = self.sq // p, side["lse"]
        prod = sub(self.prod.next(), dv, self.sq)
        kb.emit(isa.TensorTensor, dst=prod, data1=sub(side["oT"], dv, self.sq),
                data2=sub(side["doT"], dv, self.sq), op="multiply", engine="gpsimd")
        for i, (q0, qt) in enumerate(tiles(self.sq, p)):
            neg, dr = self._stat(side, i, qt)
            kb.emit(isa.TensorScalar, dst=neg, data=sub(lse, qt, 1, at=i),
                    op0="multiply", operand0=-1.0, engine="gpsimd")
            if self.rt_mask is not None:
                self._unseen_rows(side, i, qt, neg)
            ps = sub(self.tps.next(), qt, 1)
            kb.emit(isa.NcMatmul, dst=ps, stationary=sub(prod, dv, qt, at=q0),
                    moving=sub(self.ones, dv, 1))
            kb.emit(isa.Activation, dst=dr, data=ps, func="copy", scale=-1.0)

    def _stat(self, side: dict, i: int, qt: int) -> tuple[isa.Tile, isa.Tile]:
        return (sub(side["stats"], qt, 1, at=2 * i), sub(side["stats"], qt, 1, at=2 * i + 1))

    def _identity(self) -> isa.Tile:
        """I [128, 128] in the matmul dtype (GpSimd: memset, affine_select p == f)."""
        if self.ident is None:
            self.ident = self.kb.tile(self.pmax, self.dtype)
            self.kb.emit(isa.Memset, dst=self.ident, value=1.0, engine="gpsimd")
            self.kb.emit(isa.AffineSelect, dst=self.ident, on_true_tile=self.ident,
                         on_false_value=0.0, pattern=((-1, self.pmax),),
                         channel_multiplier=1, cmp_op="is_equal")
        return self.ident

    # --- stages ------------------------------------------------------------------------

    def _stage_a(self, job: dict) -> None:
        """S, dP (TensorE); P = exp(S - lse) (ScalarE); dS = (dP - Dr) * P (VectorE)."""
        kb, side, blk = self.kb, job["side"], job["block"]
        if job.get("load"):
            self._load(side, job.get("next"))
        q0, qt, k0, kbn = job["q0"], job["qt"], blk["k0"], blk["kbn"]
        s, dp = sub(self.s.next(), qt, kbn), sub(self.dp.next(), qt, kbn)
        kb.emit(isa.NcMatmul, dst=s, stationary=sub(side["qT"], self.d, qt, at=q0),
                moving=sub(side["kT"], self.d, kbn, at=k0))
        if job["state"] == "partial":       # S += I @ bias: the mask as one TensorE pass
            kb.emit(isa.NcMatmul, dst=s, stationary=sub(self._identity(), qt, qt),
                    moving=self._bias(q0, qt, k0, kbn), accumulate=True)
        keep = None
        if self.runtime:                    # S += I @ (runtime mask bias + bias)
            total, keep = self._runtime_bias(job)
            kb.emit(isa.NcMatmul, dst=s, stationary=sub(self._identity(), qt, qt),
                    moving=total, accumulate=True)
        kb.emit(isa.NcMatmul, dst=dp, stationary=sub(side["doT"], self.dvn, qt, at=q0),
                moving=sub(side["vT"], self.dvn, kbn, at=k0))
        neg, dr = self._stat(side, job["i"], qt)
        p = sub(self.pt.next(), qt, kbn)
        kb.emit(isa.Activation, dst=p, data=s, func="exp", bias=neg)
        ds = sub(self.dst.next(), qt, kbn)
        if self.drop:
            pv = self._dropout(job, p, dp, dr, ds)
        else:
            dpd = sub(self.dpd.next(), qt, kbn)   # dP - Dr on ScalarE, * P on VectorE:
            kb.emit(isa.Activation, dst=dpd, data=dp, func="copy", bias=dr)  # one pass each
            kb.emit(isa.TensorTensor, dst=ds, data1=dpd, data2=p, op="multiply")
            pv = p
        if keep is not None:        # the program's select(mask, ds, 0): a row with no
            kb.emit(isa.TensorTensor, dst=ds, data1=ds, data2=keep, op="multiply")
        job["p"], job["ds"] = pv, ds    # key left has p = 1 / Sk (finite fill) but ds 0

    def _dropout(self, job: dict, p, dp, dr, ds):
        """With a dropout W (its block: attention_dropout.py, as the forward's; c its
        values' factor: 1, or 1 / keep_prob for a boolean keep): Pw = P * W (GpSimd)
        is dV's P (the store multiplies by c); dS = (c dP W - Dr) * P as dP * W
        (VectorE, from PSUM, FP32), then c x that - Dr (ScalarE, the copy with scale
        and bias the plain kernel runs), then * P (VectorE): one VectorE pass more than
        without a dropout. Dr = rowsum(dO * O) is the same sum, O being the dropped-out
        P's. Returns Pw."""
        kb, blk, c = self.kb, job["block"], self.drop[1]
        q0, qt, k0, kbn = job["q0"], job["qt"], blk["k0"], blk["kbn"]
        w = self.drop_blocks.block(self.base[job["side"]["b"]][self.unit_pos[DROP]],
                                   q0, qt, k0, kbn)
        pw = sub(self.pdrop.next(), qt, kbn)
        kb.emit(isa.TensorTensor, dst=pw, data1=p, data2=w, op="multiply", engine="gpsimd")
        g = sub(self.dpw.next(), qt, kbn)
        kb.emit(isa.TensorTensor, dst=g, data1=dp, data2=w, op="multiply")
        dpd = sub(self.dpd.next(), qt, kbn)
        kb.emit(isa.Activation, dst=dpd, data=g, func="copy", scale=c, bias=dr)
        kb.emit(isa.TensorTensor, dst=ds, data1=dpd, data2=p, op="multiply")
        return pw

    def _stage_b(self, job: dict) -> None:
        """dV_j += P^T dO_i, dK_j += dS^T Q_i (PSUM across i); dS^T to SBUF."""
        kb, side, blk = self.kb, job["side"], job["block"]
        i, qt, kbn, d, dv = job["i"], job["qt"], blk["kbn"], self.d, self.dvn
        if job["first"]:
            blk["dk"] = sub(self.dkps.next(), kbn, d)
            blk["dv"] = sub(self.dvps.next(), kbn, dv)
        kb.emit(isa.NcMatmul, dst=blk["dv"], stationary=job["p"],
                moving=sub(side["dor"], qt, dv, at=i * dv), accumulate=not job["first"])
        kb.emit(isa.NcMatmul, dst=blk["dk"], stationary=job["ds"],
                moving=sub(side["qr"], qt, d, at=i * d), accumulate=not job["first"])
        tp = sub(self.tps.next(), kbn, qt)
        kb.emit(isa.NcTranspose, dst=tp, data=job["ds"])
        dsT = sub(self.dsT.next(), kbn, qt)
        kb.emit(isa.TensorCopy, dst=dsT, src=tp)       # VectorE reads PSUM at 2x (§2.3)
        job["dsT"] = dsT
        if job["last"]:
            self._store_kv(side["b"], blk)

    def _stage_c(self, job: dict) -> None:
        """dQ_i += dS K_j (in PSUM, or via a PSUM ring into SBUF); tile i out after its
        last job."""
        kb, side, blk = self.kb, job["side"], job["block"]
        i, qt, kbn, d = job["i"], job["qt"], blk["kbn"], self.d
        moving = sub(side["kr"], kbn, d, at=blk["j"] * d)
        acc = self._dq_slot(side, i, qt)
        if self.dq_psum:
            kb.emit(isa.NcMatmul, dst=acc, stationary=job["dsT"], moving=moving,
                    accumulate=i in side["started"])
            side["started"].add(i)
        else:
            ps = sub(self.dqps.next(), qt, d)
            kb.emit(isa.NcMatmul, dst=ps, stationary=job["dsT"], moving=moving)
            kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=ps, op="add")
        if job.get("dq_last"):
            b, heads = side["b"], self.heads[DQ]
            res = heads.tile(b, i, qt) or sub(self.res[self.dq.dtype].next(), qt, d)
            kb.emit(isa.TensorScalar, dst=res, data=acc, op0="multiply", operand0=self.scale)
            rs = self.rows[DQ]
            heads.store(b, i, self.dq, self.base[b][UNIT.index(DQ)] + job["q0"] * rs, rs,
                        qt, res)

    # --- stores ------------------------------------------------------------------------

    def _store_kv(self, b: int, blk: dict) -> None:
        """dK_j * scale (ScalarE) and dV_j (VectorE) rounded and stored. With key groups
        each group of g partitions moves to partitions [0, g) (allowed within 64, §2.3)
        at free offset r * width: a partition holds R consecutive rows, so the store's
        descriptors are R x longer (R x the DMA efficiency below 2.5 KB, §3.4)."""
        kb, k0, kbn = self.kb, blk["k0"], blk["kbn"]
        r_n, g = self.group, kbn // self.group
        dv_scale = self.drop[1] if self.drop and self.drop[1] != 1.0 else None
        for n, out, acc, w, scale in ((DK, self.dk, blk["dk"], self.d, self.scale),
                                      (DV, self.dv, blk["dv"], self.dvn, dv_scale)):
            if self.ngroups > 1:
                acc = self._group_sum(b, blk, n, acc, w)
                if acc is None:
                    continue
            heads = self.heads.get(n)
            staged = heads.tile(b, blk["j"], kbn) if heads is not None else None
            tile = staged or sub((self.kvres if r_n > 1 else self.res)[out.dtype].next(),
                                 g, r_n * w)
            for r in range(r_n):
                src = acc.with_(start_partition=acc.start_partition + r * g, num_partitions=g)
                dst = sub(tile, g, w, at=r * w)
                if scale is None:
                    kb.emit(isa.TensorCopy, dst=dst, src=src)
                else:
                    kb.emit(isa.Activation, dst=dst, data=src, func="copy", scale=scale)
            rs, at = self._out_rows(n, b)
            if heads is not None:
                heads.store(b, blk["j"], out, at + k0 * rs, rs, kbn, tile)
            else:
                self._dma(kb.ap(out, at + k0 * rs, ((r_n * rs, g), (1, r_n * w))), tile)

    def _group_sum(self, u: int, blk: dict, n: int, acc, w: int):
        """Block j's dK / dV of unit `u` added into the batch index's FP32 sum (GQA:
        the q heads of a group share k, v); the sum after the last group, else None."""
        g = u % self.ngroups
        total = sub(self.kvacc["dk" if n == DK else "dv"], blk["kbn"], w,
                    at=blk["j"] * w)
        if g == 0:
            self.kb.emit(isa.TensorCopy, dst=total, src=acc)
        else:
            self.kb.emit(isa.TensorTensor, dst=total, data1=total, data2=acc, op="add")
        return total if g == self.ngroups - 1 else None

    def _zero_block(self, b: int, k0: int, kbn: int) -> None:
        """dk, dv of a key block no query sees: zeros."""
        kb = self.kb
        for n, out, w in ((DK, self.dk, self.d), (DV, self.dv, self.dvn)):
            z = sub(self.res[out.dtype].next(), kbn, w)
            kb.emit(isa.Memset, dst=z, value=0.0, engine="gpsimd")
            rs, at = self._out_rows(n, b)
            self._dma(kb.ap(out, at + k0 * rs, ((rs, kbn), (1, w))), z)

    def _out_rows(self, n: int, b: int) -> tuple[int, int]:
        """(row stride, offset of batch index `b`) of dk or dv (`n`: DK or DV; the two
        may be one tensor, attention_views.py's packed gradient)."""
        return self.rows[n], self.base[b][UNIT.index(n)]


def bank_rings(kb, *specs: tuple[int, int]) -> list[Ring]:
    """Rings of FP32 [P, free] PSUM accumulators, (depth, free) each, sharing one 2 KiB
    bank (§3.2: a matmul must not cross a bank, several may share one)."""
    total = sum(depth * free for depth, free in specs)
    assert total <= kb.target.psum_bank_fp32, specs
    bank, at, rings = kb.tile(total, "float32", mem="psum"), 0, []
    for depth, free in specs:
        rings.append(Ring([sub(bank, kb.target.partitions, free, at=at + i * free)
                           for i in range(depth)]))
        at += depth * free
    return rings
