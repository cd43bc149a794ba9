"""Matmul epilogues: a fused elementwise region applied to each output tile as it
leaves PSUM, instead of a PSUM -> SBUF copy, an HBM round trip and more kernels.

The matmul's output tile is [M rows on partitions, N columns on F] in PSUM (§2.2). Per
drained tile the epilogue DMAs its other inputs' boxes (a bias over N is a stride-0
partition pattern: the same row into every partition, loaded once per column group and
reused across row tiles; a bias over M is one value per partition), then runs the
region's steps with the dot's value read straight from PSUM by the first step (VectorE
and ScalarE read PSUM, §2.3-2.4; a TensorTensor with one PSUM input is one pass,
§6.3), writing the results into the [mt, group] output tile that is DMAed out.

Why not ScalarE's `Activation(func, psum, bias=[P, 1])` for `act(x @ w + b)`: that bias
is per partition, i.e. over M; a bias over N (the usual one) would need the operands
swapped so N lands on partitions, and then the [N, M] result must be transposed back
(TensorE transposes plus one more PSUM evacuation per tile, or 2-byte DMA runs). The
VectorE add from PSUM costs what the plain copy it replaces costs (max(64, N) cycles),
so the bias is free and the activation is one ScalarE pass, with no transpose.

Numerics: the first step reads the FP32 accumulator, so the dot's own rounding to its
result type is skipped (more precise than the unfused program, like XLA's excess
precision); each later step rounds to its IR type as unfused. A first step that cannot
read PSUM (integer math, power, select, a value used twice by one op) gets an exact
copy in the dot's type first.
"""
from __future__ import annotations

import math

import numpy as np

from hlo_passes import ir
from jax_trn.hw import isa

from .builder import KernelBuilder, sub
from .layout import merge_axes, row_major
from .matmul_plan import GROUP_COLS
from .regions import IN_DEPTH, STEP_DEPTH, Evaluator, assign_slots
from .spread import ListSpreader
from .target import Target
from .tileops import ACTIVATION, Src
from .translate import FusionPlan, Unsupported

GROUP_MAX = max(GROUP_COLS)       # the widest matmul column group (matmul_plan.py)
PSUM_SAFE = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum",
                       "compare", "convert", "negate", "abs", "activation",
                       "tensor_scalar", "scalar_tensor_tensor", "activation_row",
                       *ACTIVATION})


class Epilogue:
    """Drains matmul output tiles through a fused region (see the module docstring)."""

    def __init__(self, plan: FusionPlan, nbatch: int, nm: int):
        self.region, self.dot = plan.region, plan.dot.vid
        self.dot_dtype = plan.region.dtype(self.dot)
        shape = plan.region.shape
        self.batch_shape = shape[:nbatch]
        self.m, self.n = math.prod(shape[nbatch:nbatch + nm]), math.prod(shape[nbatch + nm:])
        self.axes = [self._axes(i.axes, shape, nbatch, nm) if i.t is not None else None
                     for i in plan.region.inputs]
        self.direct = self._psum_direct()
        self.notes = [self._note()]

    @staticmethod
    def _axes(axes, shape, nb: int, nm: int):
        """(batch strides, M stride, N stride) of an input, or Unsupported."""
        out = row_major(shape)
        strides = []
        for lo, hi in ((nb, nb + nm), (nb + nm, len(shape))):
            merged = merge_axes(out[lo:hi], axes[lo:hi])[1]
            if len(merged) > 1:
                raise Unsupported("an epilogue input that is not one strided axis over "
                                  "the matmul's rows or columns")
            strides.append(merged[0][0] if merged else 0)
        return tuple(s for s, _ in axes[:nb]), strides[0], strides[1]

    def _psum_direct(self) -> bool:
        """Whether the steps using the dot's value may read it from PSUM."""
        if not ir.is_float(self.dot_dtype):
            return False
        users = [s for s in self.region.steps if self.dot in s.args]
        return all(s.kind in PSUM_SAFE and s.args.count(self.dot) == 1 for s in users)

    def _note(self) -> str:
        first = next(s for s in self.region.steps if self.dot in s.args)
        how = "read from PSUM by" if self.direct else "copied out of PSUM, then"
        return (f"epilogue: {len([s for s in self.region.steps if s.kind != 'constant'])} "
                f"ops per output tile, dot value {how} {first.kind}")

    def sbuf_bytes(self, target: Target) -> int:
        """Per-partition SBUF the epilogue needs (for the matmul plan's budget); its
        steps work on chunks of one PSUM bank of columns (the matmul's accumulators)."""
        r, chunk = self.region, target.psum_bank_fp32
        ins = sum(IN_DEPTH * GROUP_MAX * _size(i.dtype) for i in r.inputs if i.t is not None)
        slots = len(set(assign_slots(r).values()))
        outs = sum(2 * GROUP_MAX * _size(o.dtype) for _, o in r.outputs)
        return ins + slots * STEP_DEPTH * chunk * r.max_itemsize() + outs + \
            2 * chunk * _size(self.dot_dtype)

    # --- per kernel -----------------------------------------------------------------------

    def start(self, kb: KernelBuilder, group: int) -> None:
        self.kb, chunk = kb, kb.target.psum_bank_fp32
        self.ev = Evaluator(kb, self.region, group, min(chunk, group))
        self.outs = [(vid, out, kb.ring(2, group, out.dtype)) for vid, out in
                     self.region.outputs]
        self.evac = None if self.direct else kb.ring(2, chunk, self.dot_dtype)
        self.spread = ListSpreader(kb, kb.target.core)

    def close(self) -> None:
        self.ev.close()
        self.kb.release(*(r for _, _, r in self.outs), *([self.evac] if self.evac else []))

    def drain(self, accs, base: int, m0: int, mt: int, g0: int, gn: int) -> None:
        """Applies the region to the [mt, gn] block at rows m0, columns g0."""
        flat = base // (self.m * self.n) if self.m * self.n else 0
        srcs = self.ev.load([self._box(i, flat, m0, mt, g0, gn)
                             for i in range(len(self.region.inputs))])
        tiles = [(vid, out, sub(ring.next(), mt, gn)) for vid, out, ring in self.outs]
        for c0, ct, acc in accs:
            pins = {vid: sub(t, mt, ct, at=c0) for vid, _, t in tiles}
            first = len(self.kb.instrs)
            self.ev.compute(srcs, mt, ct, at=c0, dsts=pins,
                            preset={self.dot: self._dot_src(acc)})
            self.spread.after_tile(first)        # engines of the chunk's steps (spread.py)
        for _, out, t in tiles:
            self.kb.dma(self.kb.ap(out, base + m0 * self.n + g0, ((self.n, mt), (1, gn))), t)

    def _box(self, i: int, flat: int, m0: int, mt: int, g0: int, gn: int):
        if self.axes[i] is None:
            return None
        batch, sm, sn = self.axes[i]
        index = np.unravel_index(flat, self.batch_shape) if self.batch_shape else ()
        offset = sum(int(j) * s for j, s in zip(index, batch)) + m0 * sm + g0 * sn
        return offset, ((sm, mt), (sn, gn))

    def _dot_src(self, acc: isa.Tile) -> Src:
        if self.direct:
            return Src.of(acc)
        tile = sub(self.evac.next(), acc.num_partitions, acc.free_size)
        self.kb.emit(isa.TensorCopy, dst=tile, src=acc, engine=self.kb.evac_engine())
        return Src.of(tile)


def _size(dtype: str) -> int:
    return ir.np_dtype(dtype).itemsize

