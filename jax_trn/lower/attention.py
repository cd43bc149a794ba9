"""Attention fusions (hlo_passes/passes/attention.py) as one flash-attention kernel:
out = softmax(mask(q @ k^T * scale)) @ v, the [Sq, Sk] scores never leaving the chip.

Per batch index (all leading dims flattened), K^T [D, Sk] comes by dma_transpose (§3.4)
and V [Sk, Dv] in 128-row k-tiles (K on partitions, as TensorE needs, §2.2); both are
prefetched during the previous batch index. Per q-tile of 128 rows, Q^T [D, 128] comes
by dma_transpose and is multiplied by the scale on GpSimd, Q_AHEAD jobs ahead (Trn1 has
no dma_transpose: rows, TensorE transposes and scaled copies instead, transposed.py). The live key range of the
q-tile (blocks of 128 keys with any unmasked entry; the mask is a compile-time
constant, so fully masked causal blocks are never computed) is cut into chunks of up to
1024 keys (two PSUM banks of FP32, §3.2), and each chunk runs two stages:

  A  S = (scale Q) K^T on TensorE into PSUM; partially masked 128x128 blocks get an
     additive bias (0 / -3e38 in bf16, built once per distinct block from the mask)
     accumulated by one more TensorE pass, S += I @ bias (cheaper there than on VectorE);
     -m = -rowmax(S) (VectorE tensor_reduce, negated); online softmax across chunks:
     -m_new = min(-m_old, -m), alpha = exp(m_old - m_new) (ScalarE);
     P = exp(S - m_new) in bf16 with its row sums accumulated by the same ScalarE
     activation (§2.4 activation with add-reduction); l = l * alpha + rowsum.
  B  P^T per 128-key block by TensorE transposes (4 per PSUM bank, copied to SBUF on
     VectorE / ScalarE in turn), O_chunk = P V accumulated in PSUM (stationary P^T
     [keys, q], moving V [keys, Dv]); O = O * alpha + O_chunk (VectorE); after the last
     chunk out = O / l, DMAed out.

Stages are emitted software-pipelined (each engine runs its queue in program order,
§2.1): A(n+4), the transposes (and their copies) of n+2, then the rest of B(n), so
TensorE transposes P two chunks after its scores: the chain S -> row max (VectorE) ->
exp (ScalarE) of a chunk is longer than one chunk's TensorE work (LM row, D64: ~1.1 us
against ~0.8), and with a lag of one TensorE waited on it at every transpose (forward
683 -> 587 us with lags (2, 4); (1, 2) (2, 3) (2, 5) (3, 5) (2, 6) measured 683, 658,
601, 623, 602). S and the PSUM accumulators are double-buffered; the SBUF rings
between the stages (P, P^T, the [P, 1] statistics) are sized from the lags. (Other
orders measured slower: the copies of n+1 before the softmax of n+2 delay the next row
max.)

Layouts: q, k, v and the result stay in the program's layout ([B, S, N, H] as
jax.nn.dot_product_attention has them, or anything else with the head dim contiguous);
the fusion's `attention_layout` (hlo_passes/attention_layout.py) gives each operand's
strides for the batch axes, the GQA group axes, Sq, Sk, D and Dv, and every DMA reads
rows with those strides. K^T and V are loaded once per batch index and reused by every
group (GQA / MQA: the q heads that share a k / v head).

Masks and biases: a compile-time mask that does not vary along batch / group axes skips
its fully masked blocks; its partially masked blocks get the cached additive bias above.
A runtime mask (an input of the program: padding) or an additive bias is read per
chunk (the mask's rows of a q-tile once, as bool), turned into an additive bias on
GpSimd, and added to S by one identity matmul per block (TensorE) or, one chunk in
VECTOR_EVERY, on VectorE (the two engines balanced). A runtime mask that is the outer
`and` of a query and a key vector (flax's make_attention_mask; the fusion then has the
two vectors as operands, `mask_outer`) costs no per-block work: the key vector weights
V's rows and gives P @ V a column of masked row sums, the query vector selects each
row's result (attention_outer.py).

Dropout on the probabilities (`dropout`: the operand after the mask and bias, the
multiplier keep / keep_prob or the boolean keep, and the factor the result takes, 1 or
1 / keep_prob): each job's [q-tile, keys] block of it (a unit's rows kept in SBUF,
loaded once for every head of flax's broadcast draw: attention_dropout.py) multiplies P
on GpSimd
after the row sums, so l is the undropped softmax's and O sums the dropped P, as the
program computes it. The mask itself comes from its own kernel (the threefry hash
fused with the compare, 1-2 bytes per element in HBM): generating it per tile here
would repeat the hash for every head of a broadcast draw. With an outer mask (whose
column sums give l) it raises Unsupported; the logsumexp output (for the backward)
is the undropped softmax's, as the backward recomputes P from it.

Numerics: FP32 scores and softmax, P rounded to the dtype of the p @ v operand (as the
program does), FP32 accumulation; unlike the unfused program the scores are not
rounded to bf16 before the softmax (more precise). Masked entries get -3e38 instead of
the program's fill (exp gives 0 either way): with a finite fill (-1e9, finfo.min,
-0.7 * finfo.max) a q row with no unmasked key has all its scores equal, so its
softmax is uniform over every key, as XLA computes it (such q-tiles skip no block).
With a -inf fill XLA gives NaN for such a row: a compile-time mask with one raises
Unsupported, a runtime one gets NaN rows (one extra check per q-tile). Non-16-bit
q/k/v, a head dim that is not contiguous, or D > 128 / Dv > 512 raise Unsupported: the
region's ops then run one by one.
"""
from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np

from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .attention_layout import Axes, LseRows, heads_per_dma, unit_blocks
from .attention_masks import NEG, mask_bias  # noqa: F401  (attention_bwd_masks reads them)
from .attention_dropout import DropoutBlocks
from .attention_masks import MASK_ROWS_BYTES, MaskBiases
from .attention_outer import MASK_K, OuterMask
from .builder import KernelBuilder, Ring, sub
from .layout import tiles
from .registry import LowerCtx
from .translate import Unsupported
from .transposed import Transposer

DROP = 7                # the dropout operand's column of the layout's strides (after
                        # hlo_passes OPERANDS and "mask_k": passes/attention_fusion.py)
CHUNK_BANKS = 2         # keys per softmax chunk: two PSUM banks of FP32 (§3.2); one
                        # score matmul per bank (512 keys, §2.2)
VECTOR_EVERY = 4
Q_AHEAD = 4             # Q^T (dma_transpose, then scaled on GpSimd) of the q-tiles of the
                        # next 4 jobs loaded before a job's scores: loaded at the job's own
                        # stage A, TensorE waited on it (LM row forward: 587 -> 571 us;
                        # 1, 2, 6 ahead: 586, 580, 569)
HEADS_BYTES = 32 * 1024         # SBUF per partition for V / results of adjacent heads
QK_BYTES = 96 * 1024            # Trn1: at most for the Q^T and K^T of adjacent heads
SBUF_SLACK = 4 * 1024           # what `_qk_bytes` leaves free of what the probe measured
LAG_T, LAG_B = 2, 4     # the P^T of job n - 2 and stage B of n - 4 follow stage A of
                        # job n (`_Flash.run`; the rings of P, P^T and the row
                        # statistics are sized from them)


def lower_attention(ctx: LowerCtx, ins: list[DramTensor], scale: float, masked: bool,
                    bias: bool = False, fill: float = -np.inf,
                    layout: tuple | None = None, mask_outer: bool = False,
                    offsets: tuple = (), dropout: float | None = None) -> None:
    q, k, v = ins[:3]
    axes = Axes(layout, offsets) if layout is not None else Axes.canonical(q, k, v)
    outer = masked and mask_outer       # the mask as rows & columns (attention_outer.py)
    mask = _mask(ctx, ins[3], axes) if masked and not outer else None
    extra = {"bias": ins[3 + masked + outer] if bias else None,
             "mask": ins[3] if masked and mask is None and not outer else None,
             "outer": ins[3:5] if outer else None,
             "drop": (ins[3 + masked + outer + bias], dropout) if dropout else None}
    if extra["drop"] is not None and outer:
        raise Unsupported("attention dropout with an outer mask (its l would be dropped)")
    _check(ctx, q, k, v, axes)
    if extra["mask"] is not None and q.dtype != "bfloat16":
        raise Unsupported(f"attention with a runtime mask on {q.dtype} (its -3e38 bias "
                          "needs bfloat16's range)")
    ctx.kb.notes.append("attention: flash-attention kernel (attention.py)")
    args = ((q, k, v), ctx.outs[0], scale, mask, axes, extra, fill)
    _Flash(ctx, *args, qk_bytes=_qk_bytes(ctx, args)).run()


def _qk_bytes(ctx: LowerCtx, args: tuple) -> int:
    """SBUF per partition for the Q^T / K^T of runs of heads (Trn1, `_Flash.blocked`):
    what the kernel leaves free when it loads one head at a time (measured by building
    it so, into a scratch kernel), up to QK_BYTES. 0 with dma_transpose."""
    if ctx.target.dma_transpose:
        return 0
    probe = dataclasses.replace(ctx, kb=KernelBuilder(ctx.kb.name, ctx.target))
    _Flash(probe, *args, qk_bytes=0).run()
    return min(QK_BYTES, ctx.target.sbuf_bytes - probe.kb.sbuf.peak - SBUF_SLACK)


def _mask(ctx: LowerCtx, t: DramTensor, axes: Axes) -> tuple | None:
    """(tensor, [Sq, Sk] bool array) of a compile-time mask the same for every batch /
    group index, else None (read at run time)."""
    value = ctx.constant(t)
    if value is None or any(s[4] for _, s in axes.batch + axes.group):
        return None
    flat = np.ascontiguousarray(value, bool).reshape(-1)
    rows, cols = axes.sq[1][4], axes.sk[1][4]
    grid = np.arange(axes.sq[0])[:, None] * rows + np.arange(axes.sk[0])[None, :] * cols
    return t, flat[grid]


def _check(ctx: LowerCtx, q: DramTensor, k: DramTensor, v: DramTensor, axes) -> None:
    d, dv = axes.d[0], axes.dv[0]
    pmax, bank = ctx.target.partitions, ctx.target.psum_bank_fp32
    if not (q.dtype == k.dtype == v.dtype and q.dtype in ("bfloat16", "float16")):
        raise Unsupported(f"attention on {q.dtype}/{k.dtype}/{v.dtype} (16-bit only)")
    if d > pmax or dv > bank:
        raise Unsupported(f"attention head dims D={d}, Dv={dv} (<= {pmax}, <= {bank})")
    if axes.d[1][:2] != (1, 1) or axes.dv[1][2:4] != (1, 1):
        raise Unsupported("attention with a head dim that is not contiguous")


class _Flash(MaskBiases):
    def __init__(self, ctx: LowerCtx, qkv, out, scale: float, mask, axes: Axes,
                 extra: dict, fill: float, qk_bytes: int = 0):
        self.ctx, self.kb = ctx, ctx.kb
        q, k, v = qkv
        self.q, self.k, self.v, self.out, self.scale = q, k, v, out, scale
        self.mask, self.axes, self.fill = mask, axes, fill
        self.rt_mask, self.rt_bias = extra["mask"], extra["bias"]
        self.drop = extra["drop"]            # (operand, the result's factor) or None
        self.sq, self.d = axes.sq[0], axes.d[0]
        self.sk, self.dv = axes.sk[0], axes.dv[0]
        self.dvx = self.dv + (extra["outer"] is not None)  # + the key weights' column
        self.batch = math.prod(n for n, _ in axes.batch + axes.group)
        self.pdtype = self._p_dtype()
        target = ctx.target
        self.pmax, self.bank = target.partitions, target.psum_bank_fp32
        self.chunk = CHUNK_BANKS * self.bank
        kb, nkt = self.kb, -(-self.sk // self.pmax)
        self._plan_units(qk_bytes)
        if self.blocked:
            self.kTb = kb.ring(2, self.k_heads * self.sk, q.dtype)
            self.qTb = kb.ring(self.q_depth, self.q_heads * self.sq, q.dtype)
            self.qblocks: dict = {}
        else:
            self.kT = kb.ring(2, self.sk, q.dtype)
        self.vb = kb.ring(self._v_depth(), nkt * self.v_heads * self.dvx, v.dtype)
        self.stage: dict = {}
        if self.out_heads > 1:
            self.stage_ring = kb.ring(2 * -(-self.sq // self.pmax),
                                      self.out_heads * self.dv, out.dtype)
        if not self.blocked:
            self.qT = kb.ring(Q_AHEAD + 2, self.pmax, q.dtype)
        self.s = kb.ring(2, self.chunk, "float32", mem="psum")
        self.p = kb.ring(LAG_T + 2, self.chunk, self.pdtype)
        two_in_bank = 2 * self.dvx * 4 <= target.psum_bank_bytes    # two FP32 rows of Dv
        self.t = kb.ring(3 if two_in_bank else 2, self.bank, "float32", mem="psum")
        self.pt = kb.ring(2 * (LAG_B - LAG_T + 1), self.bank, self.pdtype)
        self.o = _ring_in_bank(kb, 2, self.dvx) if two_in_bank else \
            kb.ring(2, self.dvx, "float32", mem="psum")
        self.osb = kb.ring(2, self.dvx, "float32")
        self.res = kb.ring(2, self.dv, out.dtype)
        self.small = kb.ring(5 * (LAG_B + 1) + 1, 1, "float32")
        self.biases: dict[bytes, isa.Tile] = {}
        self.ident: isa.Tile | None = None
        self.copy_engines = itertools.cycle(("vector", "scalar"))
        self.queues = itertools.cycle(range(target.dma_queues))
        self.tr = Transposer(kb, self._dma, self.t.next, self.copy_engines)
        kb.flops += 2 * self.batch * self.sq * self.sk * (self.d + self.dv)
        self.outer = OuterMask(self, *extra["outer"]) if extra["outer"] else None
        self.lse = LseRows(kb, ctx.outs[1], self._dma, self.tr) if len(ctx.outs) > 1 and \
            extra["outer"] is None else None
        if self.drop is not None:
            self.drop_blocks = DropoutBlocks(kb, self.drop[0], self.sq, self.sk,
                                             (axes.sq[1][DROP], axes.sk[1][DROP]),
                                             self._dma, LAG_T + 2, self.chunk)
        self.runtime = self.rt_mask is not None or self.rt_bias is not None
        if self.runtime:
            self.rt_jobs = 0
            self.rt_sum = kb.ring(3, self.chunk, q.dtype)
            self.mask_rows: dict = {}
            if self.rt_bias is not None:
                self.rt_tiles = kb.ring(2, self.chunk, q.dtype)
            if self.rt_mask is not None and \
                    -(-self.sq // self.pmax) * self.sk > MASK_ROWS_BYTES:
                self.mask_ring = kb.ring(2, self.sk, "bool")

    def _p_dtype(self) -> str:
        """P's dtype: that of the p @ v operands (16-bit both, as the program rounds
        them), else v's (f32 operands of a 16-bit v: P rounded to v's dtype, less
        precise than the program's f32 product)."""
        dots = [o for o in self.ctx.op.regions[0].block.ops if o.kind == "dot_general"]
        dtypes = {v.dtype for v in dots[-1].operands} if dots else set()
        return dtypes.pop() if len(dtypes) == 1 and dtypes <= {"bfloat16", "float16"} \
            else self.v.dtype

    # --- driver ------------------------------------------------------------------------

    def run(self) -> None:
        """Emits the jobs software-pipelined: TensorE runs S(n + LAG_B), P^T(n + LAG_B -
        LAG_T), PV(n), so each softmax has LAG_T TensorE slots to finish and each P^T
        copy LAG_B - LAG_T. Jobs of
        one batch index (all its groups) share its K^T and V."""
        jobs = [job for unit in self.units for job in self._jobs(unit)]
        kv: dict = {}
        for n in range(len(jobs) + LAG_B):
            if n < len(jobs):
                job = jobs[n]
                b = job["b"]
                if b["kv"] not in kv:
                    kv[b["kv"]] = self._load_kv(b)
                job["kv"] = kv[b["kv"]]
                for ahead in jobs[n:n + Q_AHEAD + 1]:
                    if ahead["first"] and "qT" not in ahead["tile"]:
                        ahead["tile"]["qT"] = self._load_q(ahead)
                self._scores(job)
                if self.outer is not None:
                    self.outer.flush()
                self._rowmax(job)
                self._softmax(job)
                if self.drop is not None:
                    self._dropout(job)
            if 0 <= n - LAG_T < len(jobs):
                self._transposes(jobs[n - LAG_T])
            if 0 <= n - LAG_B < len(jobs):
                self._stage_b(jobs[n - LAG_B])
        if self.lse is not None:
            self.lse.flush()

    def _plan_units(self, qk_bytes: int) -> None:
        """The units (batch index x group index) in job order, with the runs of
        adjacent heads whose V rows / result rows one DMA moves (attention_layout.py)."""
        ax = self.axes
        groups = ax.offsets(ax.group, (0, 3, 4, 5))
        self.units = []
        kvs = ax.offsets(ax.batch, (1, 2, 0, 3, 4, 5), start=True)
        cols = [o[0] for o in ax.offsets(ax.batch, (MASK_K,))] if self.dvx > self.dv \
            else [0] * len(kvs)
        drops, gdrops = ([o[0] for o in ax.offsets(which, (DROP,))] if self.drop else
                         [0] * len(ax.offsets(which, ())) for which in (ax.batch, ax.group))
        for b, (ko, vo, qo, oo, mo, bo) in enumerate(kvs):
            for (gq, go, gm, gb), gd in zip(groups, gdrops):
                self.units.append({"n": len(self.units), "kv": b, "k": ko, "v": vo,
                                   "q": qo + gq, "out": oo + go, "mask": mo + gm,
                                   "bias": bo + gb, "mask_k": cols[b],
                                   "drop": drops[b] + gd})
        nkt, nqt = -(-self.sk // self.pmax), -(-self.sq // self.pmax)
        limit = heads_per_dma(nkt, self.dv, 2, HEADS_BYTES)
        vblocks = unit_blocks([kv[1] for kv in kvs], self.dv, limit)
        limit = heads_per_dma(nqt, self.dv, 2, HEADS_BYTES)
        oblocks = unit_blocks([u["out"] for u in self.units], self.dv, limit)
        # Trn1 (no dma_transpose): Q^T / K^T of runs of heads, within `qk_bytes`. A
        # run's Q^T is loaded with its first job, which `run` reaches Q_AHEAD jobs
        # early: the ring holds as many runs as that spans (runs of one head at worst)
        self.q_depth = pipeline_slots(len(self._jobs(self.units[0])), Q_AHEAD)
        limit = min(8, qk_bytes // (2 * (2 * self.sk + self.q_depth * self.sq)))
        self.blocked = limit > 1
        kblocks = unit_blocks([kv[0] for kv in kvs], self.d, max(1, limit))
        qblocks = unit_blocks([u["q"] for u in self.units], self.d, max(1, limit))
        for u, (slot, size), qb in zip(self.units, oblocks, qblocks):
            u["oslot"], u["osize"] = slot, size
            u["vslot"], u["vsize"] = vblocks[u["kv"]]
            u["kslot"], u["ksize"] = kblocks[u["kv"]]
            u["qslot"], u["qsize"] = qb
        self.k_heads = max(size for _, size in kblocks)
        self.q_heads = max(size for _, size in qblocks)
        self.v_heads = max(size for _, size in vblocks)
        self.v_run = min(size for _, size in vblocks) * len(groups)     # units per V tile
        self.out_heads = max(size for _, size in oblocks)

    def _v_depth(self) -> int:
        """Slots of the V ring: a V tile is loaded from its run's first stage A on and
        read by stage B until LAG_B jobs after the run's last job (`pipeline_slots`).
        With one job per head (Sq <= 128, one key chunk) two slots let head u + 2's V
        overwrite head u's before its P @ V."""
        return pipeline_slots(len(self._jobs(self.units[0])) * self.v_run, LAG_B)

    def _jobs(self, b: dict) -> list[dict]:
        """One job per (q-tile, key chunk): the chunk's 128-key blocks and flags."""
        jobs, per_chunk = [], self.chunk // self.pmax
        for q0, qt in tiles(self.sq, self.pmax):
            blocks = self._live_blocks(q0, qt)
            chunks = [blocks[i:i + per_chunk] for i in range(0, len(blocks), per_chunk)]
            state = {"q0": q0, "qt": qt}
            for ci, chunk in enumerate(chunks):
                jobs.append({"b": b, "tile": state, "blocks": chunk, "first": ci == 0,
                             "last": ci == len(chunks) - 1})
        return jobs

    def _live_blocks(self, q0: int, qt: int) -> list[tuple[int, int, str]]:
        """(k0, kb, "full" | "partial") for the key blocks from the first to the last
        with an unmasked entry in rows [q0, q0 + qt) (all of them if a row has none:
        its softmax is uniform over every key, with a finite fill)."""
        blocks = []
        for k0, kbn in tiles(self.sk, self.pmax):
            if self.mask is None:
                blocks.append((k0, kbn, "full"))
                continue
            blk = self.mask[1][q0:q0 + qt, k0:k0 + kbn]
            state = "full" if blk.all() else ("skip" if not blk.any() else "partial")
            blocks.append((k0, kbn, state))
        if self.mask is not None and not self.mask[1][q0:q0 + qt].any(axis=1).all():
            if self.fill == -np.inf or self.q.dtype != "bfloat16":
                raise Unsupported(f"attention on {self.q.dtype} with a fully masked query "
                                  "row (softmax of -inf, or uniform: needs NEG = -3e38)")
            blocks = [(k0, kbn, "partial" if s == "skip" else s) for k0, kbn, s in blocks]
        live = [i for i, blk in enumerate(blocks) if blk[2] != "skip"]
        return [(k0, kbn, "full" if s == "full" else "partial")
                for k0, kbn, s in blocks[live[0]:live[-1] + 1]]

    # --- loads -------------------------------------------------------------------------

    def _dma(self, dst, src, cls=isa.DmaCopy) -> None:
        self.kb.emit(cls, dst=dst, src=src, dma_queue=next(self.queues))

    def _load_kv(self, b: dict) -> tuple:
        """(K^T, V tile, V's offset in it, V's step per key tile): V loaded for the run
        of adjacent heads `b` starts (one DMA per key tile), else the run's tile."""
        ks, vs = self.axes.sk[1][1], self.axes.sk[1][2]
        if self.blocked:
            if b["kslot"] == 0:
                self.kblock = self.kTb.next()
                self._load_heads(self.kblock, self.k, b["k"], ks, self.sk, b["ksize"])
            kT = sub(self.kblock, self.d, self.sk, at=b["kslot"] * self.sk)
        else:
            kT = self.kT.next()
            for r0, rn in tiles(self.sk, self.bank):
                src = self.kb.ap(self.k, b["k"] + r0 * ks, ((ks, rn), (1, self.d)))
                self.tr.load(sub(kT, self.d, rn, at=r0), src)
        width = b["vsize"] * self.dv
        if b["vslot"] == 0:
            self.vblock = self.vb.next()
            if self.outer is not None:
                self.meanv = self.outer.load_v(self.vblock, b, width, b["vsize"])
            for j, (r0, rn) in enumerate(tiles(self.sk, self.pmax)):
                if self.outer is not None:
                    break
                src = self.kb.ap(self.v, b["v"] + r0 * vs, ((vs, rn), (1, width)))
                self._dma(sub(self.vblock, rn, width, at=j * width), src)
        return (kT, self.vblock, b["vslot"] * self.dvx, b["vsize"] * self.dvx,
                self.meanv if self.outer is not None else None)

    def _load_q(self, job: dict) -> isa.Tile:
        tile = job["tile"]
        q0, qt = tile["q0"], tile["qt"]
        qs = self.axes.sq[1][0]
        if self.blocked:        # the run's Q^T, every q-tile, loaded with its first
            u = job["b"]
            run = u["n"] - u["qslot"]
            if run not in self.qblocks:
                self.qblocks[run] = self.qTb.next()
                self._load_heads(self.qblocks[run], self.q, u["q"] - u["qslot"] * self.d,
                                 qs, self.sq, u["qsize"], self.scale)
            return sub(self.qblocks[run], self.d, qt, at=u["qslot"] * self.sq + q0)
        qT = sub(self.qT.next(), self.d, qt)
        src = self.kb.ap(self.q, job["b"]["q"] + q0 * qs, ((qs, qt), (1, self.d)))
        self.tr.load(qT, src, scale=self.scale)
        return qT

    def _load_heads(self, block, t: DramTensor, first: int, stride: int, rows: int,
                    size: int, scale: float | None = None) -> None:
        """Trn1 (no dma_transpose): the [D, rows] transposes of a run of `size`
        adjacent heads (the head at `first`, and the rest of its run: rows of size x D
        elements, one descriptor each, §3.4) into `block`, head h at h x rows."""
        heads = [sub(block, self.d, rows, at=h * rows) for h in range(size)]
        self.tr.load_heads(heads, self.kb.ap(t, first, ((stride, rows), (1, size * self.d))),
                           scale)

    def _scores(self, job: dict) -> None:
        kb, tile = self.kb, job["tile"]
        qt = tile["qt"]
        kT = job["kv"][0]
        k0 = job["blocks"][0][0]
        width = sum(n for _, n, _ in job["blocks"])
        s = sub(self.s.next(), qt, width)
        for c0, cn in tiles(width, self.bank):
            kb.emit(isa.NcMatmul, dst=sub(s, qt, cn, at=c0), stationary=tile["qT"],
                    moving=sub(kT, self.d, cn, at=k0 + c0))
        for bk0, bkn, state in job["blocks"]:
            if state == "partial":      # S += I @ bias: the mask costs TensorE 1 pass
                kb.emit(isa.NcMatmul, dst=sub(s, qt, bkn, at=bk0 - k0),
                        stationary=sub(self._identity(), qt, qt),
                        moving=self._bias(tile["q0"], qt, bk0, bkn), accumulate=True)
        if self.runtime:                # S += I @ (runtime mask bias + bias)
            total = self._runtime_bias(job, width)
            self.rt_jobs += 1
            if self.rt_jobs % VECTOR_EVERY == 0:        # balance TensorE / VectorE
                kb.emit(isa.TensorTensor, dst=s, data1=s, data2=total, op="add")
                job["s"], job["width"] = s, width
                return
            for bk0, bkn, _ in job["blocks"]:
                kb.emit(isa.NcMatmul, dst=sub(s, qt, bkn, at=bk0 - k0),
                        stationary=sub(self._identity(), qt, qt),
                        moving=sub(total, qt, bkn, at=bk0 - k0), accumulate=True)
        job["s"], job["width"] = s, width

    def _rowmax(self, job: dict) -> None:
        """-m (VectorE): the chunk's negated row max, combined with the running one."""
        kb, tile = self.kb, job["tile"]
        qt = tile["qt"]
        if job["last"] and self.lse is not None:   # the lse's columns (LseRows)
            job["lse"] = self.lse.reserve(job["b"]["n"] * self.sq + tile["q0"], qt)
            negm = job["lse"][1]
        else:
            negm = sub(self.small.next(), qt, 1)
        kb.emit(isa.TensorReduce, dst=negm, data=job["s"], op="max", negate=True)
        job["old"] = tile.get("negm")
        if not job["first"]:
            kb.emit(isa.TensorTensor, dst=negm, data1=negm, data2=job["old"], op="minimum")
        tile["negm"] = job["negm"] = negm

    def _softmax(self, job: dict) -> None:
        """P = exp(S - m) with its row sums (ScalarE); alpha and l across chunks."""
        kb, tile = self.kb, job["tile"]
        qt, s, width, negm = tile["qt"], job["s"], job["width"], job["negm"]
        if not job["first"]:
            old = job["old"]
            alpha = sub(self.small.next(), qt, 1)
            kb.emit(isa.Activation, dst=alpha, data=old, func="exp", scale=-1.0, bias=negm)
            job["alpha"] = alpha
        p = sub(self.p.next(), qt, width)
        if self.outer is not None:      # l comes from P @ [V w | w] (attention_outer.py)
            kb.emit(isa.Activation, dst=p, data=s, func="exp", bias=negm)
            job["p"] = p
            return
        last_l = job["lse"][0] if "lse" in job else None
        rs = last_l if job["first"] and last_l is not None else sub(self.small.next(), qt, 1)
        kb.emit(isa.Activation, dst=p, data=s, func="exp", bias=negm, reduce_res=rs)
        if job["first"]:
            tile["l"] = rs
        else:
            lsum = last_l if last_l is not None else sub(self.small.next(), qt, 1)
            kb.emit(isa.ScalarTensorTensor, dst=lsum, data=tile["l"], op0="multiply",
                    operand0=job["alpha"], op1="add", operand1=rs)
            tile["l"] = lsum
        job["p"], job["l"] = p, tile["l"]
        if last_l is not None:
            self.lse.after()

    def _dropout(self, job: dict) -> None:
        """P *= the job's [q, keys] block of the dropout operand (the multiplier, or the
        boolean keep whose 1 / keep_prob the result takes), after the row sums: l is
        the undropped softmax's (GpSimd, idle in the forward: one pass per chunk; a
        quarter to half of it on VectorE measured 269-279 us against 171 for the LM-sized
        MHA forward: VectorE's row max is on the critical path)."""
        kb, tile = self.kb, job["tile"]
        w = self.drop_blocks.block(job["b"]["drop"], tile["q0"], tile["qt"],
                                   job["blocks"][0][0], job["width"])
        kb.emit(isa.TensorTensor, dst=job["p"], data1=job["p"], data2=w, op="multiply",
                engine="gpsimd")

    # --- stage B: P^T, P @ V, output ---------------------------------------------------------

    def _transposes(self, job: dict) -> None:
        kb, tile = self.kb, job["tile"]
        qt, p, blocks = tile["qt"], job["p"], job["blocks"]
        k0 = blocks[0][0]
        pts = []
        per_bank = self.bank // qt
        for group in [blocks[i:i + per_bank] for i in range(0, len(blocks), per_bank)]:
            bank = self.t.next()
            for g, (bk0, bkn, _) in enumerate(group):
                kb.emit(isa.NcTranspose, dst=sub(bank, bkn, qt, at=g * qt),
                        data=sub(p, qt, bkn, at=bk0 - k0))
            pt = self.pt.next()
            rows = group[0][1]
            if all(n == rows for _, n, _ in group):
                kb.emit(isa.TensorCopy, dst=sub(pt, rows, qt * len(group)),
                        src=sub(bank, rows, qt * len(group)), engine=next(self.copy_engines))
            else:
                for g, (_, bkn, _) in enumerate(group):
                    kb.emit(isa.TensorCopy, dst=sub(pt, bkn, qt, at=g * qt),
                            src=sub(bank, bkn, qt, at=g * qt),
                            engine=next(self.copy_engines))
            pts += [(sub(pt, bkn, qt, at=g * qt), bk0, bkn) for g, (bk0, bkn, _)
                    in enumerate(group)]
        job["pts"] = pts

    def _stage_b(self, job: dict) -> None:
        kb, tile = self.kb, job["tile"]
        qt, pts = tile["qt"], job["pts"]
        _, vb, at, step, _ = job["kv"]
        if self.outer is not None:
            self.outer.prepare(vb)
        o = sub(self.o.next(), qt, self.dvx)
        for i, (pt, bk0, bkn) in enumerate(pts):
            kb.emit(isa.NcMatmul, dst=o, stationary=pt,
                    moving=sub(vb, bkn, self.dvx, at=(bk0 // self.pmax) * step + at),
                    accumulate=i > 0)
        if self.outer is not None and job["last"]:
            self.outer.correct(job, o)
        acc = o
        if not job["first"]:
            acc = tile["o"]
            if self.outer is not None:      # two passes, N/2 + N cycles < STT's 2N
                kb.emit(isa.TensorScalar, dst=acc, data=acc, op0="multiply",
                        operand0=job["alpha"])
                kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=o, op="add")
            else:
                kb.emit(isa.ScalarTensorTensor, dst=acc, data=acc, op0="multiply",
                        operand0=job["alpha"], op1="add", operand1=o)
        elif not job["last"]:
            acc = sub(self.osb.next(), qt, self.dvx)
            kb.emit(isa.TensorCopy, dst=acc, src=o)
        tile["o"] = acc
        if job["last"]:
            self._result(job, acc)

    def _result(self, job: dict, acc: isa.Tile) -> None:
        """out = O / l, stored; for a run of adjacent heads, staged per q-tile and
        stored by the run's last head in one DMA."""
        kb, tile, b = self.kb, job["tile"], job["b"]
        qt, q0, slot, size = tile["qt"], tile["q0"], b["oslot"], b["osize"]
        if size == 1:
            res = sub(self.res.next(), qt, self.dv)
        else:
            if slot == 0:
                self.stage[q0] = self.stage_ring.next()
            res = sub(self.stage[q0], qt, self.dv, at=slot * self.dv)
        if self.outer is not None:
            self.outer.result(job, acc, res)
        elif self.drop is not None and self.drop[1] != 1.0:     # 1 / keep_prob
            kb.emit(isa.TensorScalar, dst=res, data=acc, op0="divide", operand0=job["l"],
                    op1="multiply", operand1=self.drop[1])
        else:
            kb.emit(isa.TensorScalar, dst=res, data=acc, op0="divide", operand0=job["l"])
        if self.rt_mask is not None and self.fill == -np.inf:
            self._nan_rows(res, tile)
        if slot == size - 1:
            os = self.axes.sq[1][3]
            base = b["out"] - slot * self.dv + q0 * os
            src = res if size == 1 else sub(self.stage[q0], qt, size * self.dv)
            self._dma(kb.ap(self.out, base, ((os, qt), (1, size * self.dv))), src)


def pipeline_slots(jobs: int, lag: int) -> int:
    """Slots of a ring holding one tile per run of `jobs` consecutive jobs of a software
    pipeline, written from the run's first stage A on and read until the stage `lag`
    jobs behind A reaches the run's last job. The run d later writes the same slot at
    its first job, (d - 1) * jobs + 1 jobs after that last job, and in program order a
    job's stage A comes before the lagging stage of an earlier one: so d - 1 >= lag /
    jobs, d = 1 + ceil(lag / jobs), at least 2 (the next run loads while this one
    computes)."""
    return max(2, 1 + -(-lag // max(1, jobs)))


def _ring_in_bank(kb, depth: int, free: int) -> Ring:
    """`depth` FP32 [P, free] PSUM accumulators sharing one 2 KiB bank (§3.2: a matmul
    must not cross a bank, several may share one)."""
    bank = kb.tile(depth * free, "float32", mem="psum")
    return Ring([sub(bank, kb.target.partitions, free, at=i * free) for i in range(depth)])
