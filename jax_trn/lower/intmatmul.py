"""Exact integer dot_general: digit matmuls on TensorE, combined on GpSimd.

XLA's integer dot is exact two's-complement arithmetic wrapping to the result type. The
operands become signed base-256 digit planes in bf16 and every digit product sum is
kept an exact FP32 integer (intdigits.py has the arithmetic); this module emits it,
one canonical matmul out[M, N] = lhs[M, K] @ rhs[K, N] per batch index (dot.py):

    for each block of M rows:                  # lhs digit strips [K, digits, 128] resident
        for each column tile of N (<= 512):    # rhs digit slice [K, digits, cols]: loaded
            for each 128-row tile of the block:    # and split one tile ahead
                for each accumulation group (highest shift first):
                    bf16 matmuls of its (k-tile, pair) units into one PSUM bank
                    PSUM -> SBUF as int32 (VectorE/ScalarE; exact, |v| <= 2**24)
                    acc = (acc << 8 * shift step) + group: the shift a VectorE bitvec
                    op (§6.2), the add on GpSimd's integer ALU (§2.5), both wrapping
                wrap acc to the result type (GpSimd copy) if narrower; DMA it out

An operand is loaded K-major (K on partitions, §2.2): rows of K as they lie in DRAM
when its free axis is the contiguous one; otherwise by dma_transpose of its 2- or
4-byte integers (v3+, §3.4, bit-exact) or, failing that (int8, trn1), as rows of its
free axis whose bf16 digit planes are transposed on TensorE (exact) and copied to
SBUF. Digits are split per loaded tile: one GpSimd tensor_scalar (z = (x + B) ^ B),
one VectorE/ScalarE copy of z's bytes read as int8, and for an operand narrower than
the result a VectorE shift for its top digit; an 8-bit operand is DMA-cast to bf16.
Column tiles narrow to 256 / 128 before K is blocked (TensorE cost is linear in the
columns, §6.3); when K is still too deep the rows go one 128-row tile at a time and K
in blocks, each block's Horner sum added into the accumulator.

Why this way: the FP32 path it replaces cost 4x a BF16 matmul and was wrong above
2**24; digits cost 1x (int8), 4x (int16 -> int32) or 10x (int32) a BF16 matmul on
TensorE, plus per output tile a few GpSimd passes that overlap the next tile's
matmuls. GpSimd alone (exact 32-bit MACs on 128 lanes) would take M*N*K / 128 cycles:
~874 us for 512^3 at 1.2 GHz. Simulated, 512^3 on trn2 (benchmarks/int_matmul.py):
int8 17.2 us, int16 -> int32 25.5 us, int32 45.6 us (bf16: 11.9 us); at 2048^3 int32
is 12x bf16 with TensorE 81% busy. M = N = 1 batched products run on GpSimd
(`inner_products`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from jax_trn.hw import dtypes as hw_dtypes
from jax_trn.hw import isa
from jax_trn.hw.program import DramTensor

from .builder import KernelBuilder, sub
from .errors import LoweringError
from .intdigits import DIGIT_BITS, Digits, Group, digits_of, plan_groups
from .layout import box_offset, box_pattern, line_tiles, merge_axes, row_major, tiles
from .matmul_plan import Operand

STAGE = 512             # raw integer elements per partition split into digits at once
ROWS_K = 1024           # K columns of one staged row load (TensorE-transposed operands)
TRANSPOSE_BANKS = 2     # PSUM banks for TensorE transposes, when an operand needs them
STORE_SHARE = 4         # 1/4 of the DMA queues carry result stores
SBUF_SHARE = 0.9        # of the free SBUF the plan may use (allocator alignment slack)


def is_int_dot(lhs: str, rhs: str, out: str) -> bool:
    """An integer dot_general this module computes (bool keeps the FP32 path: its sums
    of 0/1 products only need to be nonzero)."""
    return all(hw_dtypes.np_dtype(d).kind in "iu" for d in (lhs, rhs, out))


@dataclass
class Planes:
    """Digit planes of K-major operand tiles: k-tile j, digit i is [rows, width] bf16 at
    element (j * count + i) * width of `base` (width: the columns loaded)."""
    base: isa.Tile
    count: int
    width: int

    def plane(self, j: int, i: int, rows: int, cols: int, at: int = 0) -> isa.Tile:
        return sub(self.base, rows, cols, at=(j * self.count + i) * self.width + at)

    def run(self, j: int, i: int, rows: int, n: int, cols: int, at: int = 0) -> isa.Tile:
        """`n` consecutive (k-tile, digit) planes from (j, i), columns [at, at + cols)."""
        first = self.plane(j, i, rows, cols, at)
        if cols == self.width or n == 1:
            return first.with_(free=(n * cols,))
        return first.with_(free=(n, cols), strides=(self.width, 1))

    def digits(self, j0: int, n: int, count: int, rows: int, cols: int, at: int = 0,
               first: int = 0) -> isa.Tile:
        """Digits [first, count) of k-tiles j0 .. j0 + n - 1 as [rows, n, digits, cols]
        (size-1 axes dropped; contiguous when whole)."""
        k = count - first
        if cols == self.width and (n == 1 or k == self.count):
            return self.run(j0, first, rows, n * k, cols, at)
        axes = [(a, s) for a, s in ((n, self.count * self.width), (k, self.width),
                                    (cols, 1)) if a > 1] or [(1, 1)]
        return self.plane(j0, first, rows, cols, at).with_(
            free=tuple(a for a, _ in axes), strides=tuple(s for _, s in axes))


def _bytes_of(z: isa.Tile, n: int, count: int, cols: int) -> isa.Tile:
    """Bytes 0..count-1 of the elements of `z` ([P, n * cols], contiguous) as int8
    [P, n, count, cols] (size-1 axes dropped; §6.1 `view(dtype)`)."""
    size = hw_dtypes.itemsize(z.dtype)
    axes = [(a, s) for a, s in ((n, cols * size), (count, 1), (cols, size)) if a > 1]
    axes = axes or [(1, size)]
    return z.with_(dtype="int8", free=tuple(a for a, _ in axes),
                   strides=tuple(s for _, s in axes))


class IntMatmul:
    """Emits one canonical integer matmul (see the module docstring)."""

    def __init__(self, kb: KernelBuilder, lhs: Operand, rhs: Operand, out: DramTensor,
                 epilogue=None):
        self.kb, self.lhs, self.rhs, self.out = kb, lhs, rhs, out
        self.epilogue = epilogue        # epilogue.py: drains the int accumulators
        self.bits = 8 * hw_dtypes.itemsize(out.dtype)
        self.acc_dtype = "int64" if self.bits == 64 else "int32"
        self.ld, self.rd = digits_of(lhs.t.dtype, self.bits), digits_of(rhs.t.dtype, self.bits)
        self.m, self.k, self.n = lhs.f[1], lhs.k[1], rhs.f[1]
        t = kb.target
        self.kt, self.mt, self.cols = t.partitions, t.stationary_max, t.psum_bank_fp32
        self.mb, self.kblock, self.ncols = self._plan()
        self._groups: dict[int, list[Group]] = {}
        nq = t.dma_queues
        split = max(1, nq - max(1, nq // STORE_SHARE))
        self.load_q = itertools.cycle(range(split))
        self.store_q = itertools.cycle(range(split, nq) if split < nq else range(nq))
        self._alloc()

    # --- plan and buffers ------------------------------------------------------------

    def _fixed_bytes(self) -> int:
        """SBUF bytes per partition of everything but the strips and slices."""
        acc, z = hw_dtypes.itemsize(self.acc_dtype), 8 if self.bits == 64 else 4
        raw = max(hw_dtypes.itemsize(op.t.dtype) for op in (self.lhs, self.rhs))
        rows = 2 * ROWS_K * (raw + 2 * max(self.ld.count, self.rd.count)) \
            if self._pe_any() else 0
        return 3 * STAGE * (raw + z) + rows + 2 * self.cols * (3 * acc + 8)

    def _sets(self, mb: int, kblock: int) -> int:
        """Strip sets in flight: 2 when the strips change (the next set loads while the
        current one computes), else 1."""
        nbatch = math.prod(n for _, n in self.lhs.batch)
        return 1 if nbatch == 1 and mb >= self.m and kblock == self.k else 2

    def _strip_bytes(self, mb: int, kblock: int, ncols: int) -> int:
        """Bytes per partition of the lhs strips and the double-buffered rhs slices."""
        nk = -(-kblock // self.kt)
        strips = self._sets(mb, kblock) * -(-mb // self.mt) * nk * self.ld.count * self.mt
        return 2 * (strips + 2 * nk * self.rd.count * ncols)

    def _plan(self) -> tuple[int, int, int]:
        """(rows whose strips stay resident, K rows per block, columns per tile): all of
        K with as many row tiles as fit, for column tiles of one PSUM bank down to 128
        (a matmul's cost is linear in its columns above 64, §6.3, so narrower tiles cost
        TensorE nothing); else one row tile and the deepest K blocks that fit."""
        reserved = self.epilogue.sbuf_bytes(self.kb.target) if self.epilogue else 0
        budget = int(_free_sbuf(self.kb) * SBUF_SHARE) - self._fixed_bytes() - reserved
        for ncols in dict.fromkeys(min(self.n, c) for c in (self.cols, self.cols // 2,
                                                             self.cols // 4)):
            mb = -(-self.m // self.mt) * self.mt
            while mb > self.mt and self._strip_bytes(mb, self.k, ncols) > budget:
                mb = max(self.mt, -(-mb // 2 // self.mt) * self.mt)
            if self._strip_bytes(mb, self.k, ncols) <= budget:
                return min(mb, self.m), self.k, ncols
        kblock, ncols = self.k, min(self.n, self.cols)
        while kblock > self.kt and self._strip_bytes(self.mt, kblock, ncols) > budget:
            kblock = max(self.kt, kblock // 2 // self.kt * self.kt)
        if self._strip_bytes(self.mt, kblock, ncols) > budget:
            raise LoweringError("integer dot_general tiles do not fit in SBUF")
        return min(self.mt, self.m), kblock, ncols

    def _pe_any(self) -> bool:
        return any(op.pe_transposed for op in (self.lhs, self.rhs))

    def _alloc(self) -> None:
        kb, nk = self.kb, -(-self.kblock // self.kt)
        depth = self._sets(self.mb, self.kblock) * -(-self.mb // self.mt)
        self.strips = kb.ring(depth, nk * self.ld.count * self.mt, "bfloat16")
        self.slices = kb.ring(2, nk * self.rd.count * self.ncols, "bfloat16")
        raw = max((op.t.dtype for op in (self.lhs, self.rhs)), key=hw_dtypes.itemsize)
        self.raw = kb.ring(3, STAGE, raw)
        self.z = kb.ring(3, STAGE, "int64" if self.bits == 64 else "int32")
        self.rows = self.rows_d = self.tps = None
        if self._pe_any():
            self.rows = kb.ring(2, ROWS_K, raw)
            self.rows_d = kb.ring(2, max(self.ld.count, self.rd.count) * ROWS_K, "bfloat16")
            self.tps = kb.ring(TRANSPOSE_BANKS, self.cols, "float32", mem="psum")
        banks = kb.target.psum_banks - (TRANSPOSE_BANKS if self.tps else 0)
        self.psum = kb.ring(banks, self.cols, "float32", mem="psum")
        self.accs, self.totals, self.tmps = (kb.ring(2, self.cols, self.acc_dtype)
                                             for _ in range(3))
        self.obuf = kb.ring(2, self.cols, self.out.dtype)
        if self.epilogue is not None:
            self.epilogue.start(kb, self.ncols)

    def _release(self) -> None:
        rings = [self.strips, self.slices, self.raw, self.z, self.psum, self.accs,
                 self.totals, self.tmps, self.obuf, self.rows, self.rows_d, self.tps]
        self.kb.release(*(r for r in rings if r is not None))
        if self.epilogue is not None:
            self.epilogue.close()

    # --- the loop nest -------------------------------------------------------------------

    def run(self) -> None:
        """Jobs (batch index, row block, column tile, K block) in order, each job's
        loads emitted before the previous job's compute (`_loads`)."""
        jobs = [(index, mblock, ntile, kblock)
                for index in itertools.product(*(range(n) for _, n in self.lhs.batch))
                for mblock in tiles(self.m, self.mb)
                for ntile in tiles(self.n, self.ncols)
                for kblock in tiles(self.k, self.kblock)]
        strips, key = None, None
        loads = self._loads(jobs[0], key)
        for at, job in enumerate(jobs):
            (strips, key), slice_ = loads
            if at + 1 < len(jobs):
                loads = self._loads(jobs[at + 1], key, strips)
            self._compute(job, strips, slice_)
        self._release()

    def _loads(self, job, key, strips=None):
        """The loads of `job`: its rhs slice, and its lhs strips unless they are those
        of the previous job (`key`, `strips`)."""
        index, (m0, mbn), (n0, nn), kblock = job
        rest = []
        if (index, m0, kblock) != key:
            rows = tiles(mbn, self.mt)
            strips = [self._load(self.lhs, self.ld, index, kblock, m0, rows[0][1],
                                 self.strips)]
            rest, key = rows[1:], (index, m0, kblock)
        slice_ = self._load(self.rhs, self.rd, index, kblock, n0, nn, self.slices)
        strips += [self._load(self.lhs, self.ld, index, kblock, m0 + r0, rn, self.strips)
                   for r0, rn in rest]      # after the slice the first row tile needs
        return (strips, key), slice_

    def _compute(self, job, strips: list[Planes], r: Planes) -> None:
        """Every row tile of the job: its Horner sum, added into the accumulator when K
        comes in blocks; stored after the last block."""
        index, (m0, mbn), (n0, nn), (k0, kn) = job
        flat = sum(i * st for i, st in zip(index, self._batch_strides()))
        groups = self._groups_for(kn)
        for s, (r0, rn) in zip(strips, tiles(mbn, self.mt)):
            if k0 == 0:
                self._acc = acc = sub(self.accs.next(), rn, nn)
                self._horner(acc, s, r, groups, rn, nn)
            else:
                acc, total = self._acc, sub(self.totals.next(), rn, nn)
                self._horner(total, s, r, groups, rn, nn)
                self.kb.emit(isa.TensorTensor, dst=acc, data1=acc, data2=total, op="add",
                             engine="gpsimd")
            if k0 + kn == self.k:
                self._store(acc, flat * self.m * self.n, m0 + r0, rn, n0, nn)

    def _batch_strides(self) -> list[int]:
        """Flat batch index = sum(index * stride) (row-major over the batch dims)."""
        sizes = [n for _, n in self.lhs.batch]
        return [math.prod(sizes[d + 1:]) for d in range(len(sizes))]

    def _groups_for(self, kn: int) -> list[Group]:
        if kn not in self._groups:
            self._groups[kn] = plan_groups(self.ld, self.rd, self.bits, tiles(kn, self.kt))
        return self._groups[kn]

    # --- digit matmuls and the Horner combine ------------------------------------------

    def _horner(self, total: isa.Tile, s: Planes, r: Planes, groups, rn: int, nn: int):
        """total = sum over groups of group * 256**shift, highest shift first."""
        level = None
        for g in groups:
            ps = sub(self.psum.next(), rn, nn)
            for u, (i, j, jt, rows) in enumerate(g.units):
                self.kb.emit(isa.NcMatmul, dst=ps, stationary=s.plane(jt, i, rows, rn),
                             moving=r.plane(jt, j, rows, nn), accumulate=u > 0)
            if level is None:
                self.kb.emit(isa.TensorCopy, dst=total, src=ps, engine=self.kb.evac_engine())
            else:
                if g.shift != level:
                    self._shift(total, level - g.shift)
                tmp = sub(self.tmps.next(), rn, nn)
                self.kb.emit(isa.TensorCopy, dst=tmp, src=ps, engine=self.kb.evac_engine())
                self.kb.emit(isa.TensorTensor, dst=total, data1=total, data2=tmp, op="add",
                             engine="gpsimd")
            level = g.shift
        if level:
            self._shift(total, level)

    def _shift(self, t: isa.Tile, digits: int) -> None:
        """A bit shift on VectorE (a bitvec op, §6.2: VectorE's, exact on integers)."""
        self.kb.emit(isa.TensorScalar, dst=t, data=t, op0="shift_left",
                     operand0=DIGIT_BITS * digits, engine="vector")

    def _store(self, acc: isa.Tile, base: int, m0: int, rn: int, n0: int, nn: int) -> None:
        """acc, wrapped to the result type (a GpSimd copy when narrower; a same-width
        type is the same bits, the tile read as it), DMAed out; or drained through the
        fused epilogue (which copies it out in the dot's type first, epilogue.py)."""
        if self.epilogue is not None:
            return self.epilogue.drain([(0, nn, acc)], base, m0, rn, n0, nn)
        src = acc.with_(dtype=self.out.dtype)
        if hw_dtypes.itemsize(self.out.dtype) != hw_dtypes.itemsize(self.acc_dtype):
            src = sub(self.obuf.next(), rn, nn)
            self.kb.emit(isa.TensorCopy, dst=src, src=acc, engine="gpsimd")
        ap = self.kb.ap(self.out, base + m0 * self.n + n0, ((self.n, rn), (1, nn)))
        self.kb.emit(isa.DmaCopy, dst=ap, src=src, dma_queue=next(self.store_q))

    # --- loads: K-major digit planes -------------------------------------------------------

    def _load(self, op: Operand, d: Digits, index, kblock, f0: int, fn: int, ring
              ) -> Planes:
        """op[kblock, f0:f0+fn] as K-major digit planes (see the module docstring)."""
        planes = Planes(ring.next(), d.count, fn)
        base = op.batch_offset(index) + kblock[0] * op.k[0] + f0 * op.f[0]
        if op.pe_transposed:
            for c0, fc in tiles(fn, self.kt):
                self._load_rows(op, d, base + c0 * op.f[0], kblock[1], fc, planes, c0)
            return planes
        ktiles = [(j, kt) for j, (_, kt) in enumerate(tiles(kblock[1], self.kt))]
        for run in _batches(ktiles, max(1, STAGE // fn), key=lambda u: u[1]):
            self._load_ktiles(op, d, base, run, fn, planes)
        return planes

    def _load_ktiles(self, op: Operand, d: Digits, base: int, run, fn: int,
                     planes: Planes) -> None:
        """k-tiles `run` (equal depth) of columns [0, fn): DMA, then digits."""
        (j0, kt), n = run[0], len(run)
        if d.direct:
            for j, _ in run:
                src = self.kb.ap(op.t, base + j * self.kt * op.k[0],
                                 ((op.k[0], kt), (op.f[0], fn)), view=d.direct)
                self._dma(planes.plane(j, 0, kt, fn), src)
            return
        raw = sub(self.raw.next(), kt, n * fn).with_(dtype=op.t.dtype)
        for q, (j, _) in enumerate(run):
            at = base + j * self.kt * op.k[0]
            dst = sub(raw, kt, fn, at=q * fn)
            if op.via_dma:
                src = self.kb.ap(op.t, at, ((op.f[0], fn), (op.k[0], kt)))
                self.kb.emit(isa.DmaTranspose, dst=dst, src=src, dma_queue=next(self.load_q))
            else:
                self._dma(dst, self.kb.ap(op.t, at, ((op.k[0], kt), (op.f[0], fn))))
        self._split(raw, d, planes, j0, n, fn)

    def _split(self, raw: isa.Tile, d: Digits, planes: Planes, j0: int, n: int, cols: int,
               at: int = 0) -> None:
        """The digits of `raw` ([rows, n * cols] integers: k-tiles j0.. j0 + n - 1) into
        their planes: z = (x + B) ^ B on GpSimd, the byte digits in one copy of z's
        bytes, the shifted top digit by a VectorE bitvec shift (§6.2)."""
        rows = raw.num_partitions
        z = raw
        if d.bias:
            z = sub(self.z.next(), rows, n * cols)
            self.kb.emit(isa.TensorScalar, dst=z, data=raw, op0="add", operand0=d.bias,
                         op1="bitwise_xor", operand1=d.bias, engine="gpsimd")
        if d.bytes:
            self.kb.emit(isa.TensorCopy, dst=planes.digits(j0, n, d.bytes, rows, cols, at),
                         src=_bytes_of(z, n, d.bytes, cols), engine=self.kb.evac_engine())
        if d.top_shift:
            top = planes.digits(j0, n, d.count, rows, cols, at, first=d.count - 1)
            self.kb.emit(isa.TensorScalar, dst=top, data=z, op0="shift_right_arithmetic",
                         operand0=DIGIT_BITS * (d.count - 1), engine="vector")

    def _load_rows(self, op: Operand, d: Digits, base: int, kn: int, fc: int,
                   planes: Planes, c0: int) -> None:
        """Columns [c0, c0 + fc) of a K-contiguous operand: rows of K (fc partitions),
        digits split in row layout, each digit plane transposed on TensorE."""
        for r0, rk in tiles(kn, ROWS_K):
            src = self.kb.ap(op.t, base + r0 * op.k[0], ((op.f[0], fc), (op.k[0], rk)),
                             view=d.direct)
            rowplanes = Planes(sub(self.rows_d.next(), fc, d.count * rk), d.count, rk)
            if d.direct:
                self._dma(rowplanes.plane(0, 0, fc, rk), src)
            else:
                raw = sub(self.rows.next(), fc, rk).with_(dtype=op.t.dtype)
                self._dma(raw, src)
                self._split(raw, d, rowplanes, 0, 1, rk)
            self._transpose(rowplanes, rk, fc, planes, r0 // self.kt, c0)

    def _transpose(self, rows: Planes, rk: int, fc: int, planes: Planes, j0: int,
                   c0: int) -> None:
        """Every (k-tile, digit) [fc, kt] block of `rows` -> planes (j0 + j, digit),
        columns [c0, c0 + fc): as many per PSUM bank as fit, one copy per bank."""
        units = [(j, i, kt) for j, (_, kt) in enumerate(tiles(rk, self.kt))
                 for i in range(rows.count)]
        for batch in _batches(units, max(1, self.cols // fc), key=lambda u: u[2]):
            bank, kt = self.tps.next(), batch[0][2]
            for s, (j, i, _) in enumerate(batch):
                self.kb.emit(isa.NcTranspose, dst=sub(bank, kt, fc, at=s * fc),
                             data=sub(rows.base, fc, kt, at=i * rk + j * self.kt))
            j, i, _ = batch[0]
            self.kb.emit(isa.TensorCopy, dst=planes.run(j0 + j, i, kt, len(batch), fc, c0),
                         src=sub(bank, kt, len(batch) * fc), engine=self.kb.evac_engine())

    def _dma(self, dst, src) -> None:
        self.kb.emit(isa.DmaCopy, dst=dst, src=src, dma_queue=next(self.load_q))


def _batches(units: list, size: int, key) -> list[list]:
    """Consecutive runs of `units` with equal `key`, at most `size` long."""
    out: list[list] = []
    for u in units:
        if out and len(out[-1]) < size and key(out[-1][-1]) == key(u):
            out[-1].append(u)
        else:
            out.append([u])
    return out


def _free_sbuf(kb: KernelBuilder) -> int:
    top = max((off + size for off, size in kb.sbuf.live.items()), default=0)
    return kb.sbuf.capacity - top


# --- M = N = 1: batched inner products on GpSimd -----------------------------------------

def inner_products(kb: KernelBuilder, lhs: Operand, rhs: Operand, out: DramTensor,
                   fmax: int) -> None:
    """out[b] = sum_k lhs[b, k] * rhs[b, k] mod 2**W on GpSimd's integer ALU (§2.5):
    batches on partitions, K on F in chunks of `fmax`; multiply, reduce, add, each
    wrapping in the accumulator type, then wrapped to the result type."""
    acc = "int64" if hw_dtypes.itemsize(out.dtype) == 8 else "int32"
    (lb, rb, ob), k = merge_axes(lhs.batch, rhs.batch, row_major([n for _, n in lhs.batch])), \
        lhs.k[1]
    ins = (kb.ring(3, fmax, lhs.t.dtype), kb.ring(3, fmax, rhs.t.dtype))
    prods, accs, res = kb.ring(2, fmax, acc), kb.ring(2, 1, acc), kb.ring(2, 1, out.dtype)
    parts_ring = kb.ring(2, 1, acc)
    for box in line_tiles([n for _, n in lb], kb.target.partitions):
        parts = box_pattern(lb, box)[-1][1]
        total = sub(accs.next(), parts, 1)
        for i, (k0, kc) in enumerate(tiles(k, fmax)):
            x, y = (_rows(kb, op, axes, box, k0, kc, ring)
                    for op, axes, ring in ((lhs, lb, ins[0]), (rhs, rb, ins[1])))
            prod = sub(prods.next(), parts, kc)
            kb.emit(isa.TensorTensor, dst=prod, data1=x, data2=y, op="multiply",
                    engine="gpsimd")
            part = total if i == 0 else sub(parts_ring.next(), parts, 1)
            kb.emit(isa.TensorReduce, dst=part, data=prod, op="add", engine="gpsimd")
            if i:
                kb.emit(isa.TensorTensor, dst=total, data1=total, data2=part, op="add",
                        engine="gpsimd")
        dst = sub(res.next(), parts, 1)
        kb.emit(isa.TensorCopy, dst=dst, src=total, engine="gpsimd")
        kb.dma(kb.ap(out, box_offset(ob, box), box_pattern(ob, box)[-1:] + ((1, 1),)), dst)
    kb.release(*ins, prods, accs, res, parts_ring)


def _rows(kb, op: Operand, axes, box, k0: int, kc: int, ring) -> isa.Tile:
    tile = sub(ring.next(), box_pattern(axes, box)[-1][1], kc)
    src = box_pattern(axes, box)[-1:] + ((op.k[0], kc),)
    kb.dma(tile, kb.ap(op.t, box_offset(axes, box) + k0 * op.k[0], src))
    return tile
