"""Planning the conv kernel: output rows per input band and per PSUM chunk, within SBUF
and an instruction budget."""
from __future__ import annotations

import math
from dataclasses import dataclass

from jax_trn.hw import dtypes as hw_dtypes

from ..errors import LoweringError
from ..layout import tiles
from .geometry import Conv, Packing, Padded

SBUF_SHARE = 0.75          # of SBUF the conv kernel plans for
PSUM_ACCS = 4               # accumulation banks in flight (of the target's 8, §3.2)
OUT_BUFS = 3                # evacuated bands in flight to the output DMA
BAND_BUFS = 3               # input bands in flight per ci tile
MAX_INSTRUCTIONS = 400_000  # beyond this a conv would take minutes to compile


@dataclass(frozen=True)
class Plan:
    band: int                   # output rows per input band
    rows: int                   # output rows per PSUM chunk (1 if a row is cut)
    weight_bytes: int           # per partition, the largest block's resident weights


def chunks(cv: Conv, rows: int, r0: int, rn: int) -> list[tuple[int, int, int, int]]:
    """(first row, rows, first column, columns) of each PSUM chunk of a band."""
    ow = cv.dims[-1].out
    if ow > cv.bank:
        return [(r, 1, c0, cn) for r in range(r0, r0 + rn) for c0, cn in tiles(ow, cv.bank)]
    return [(r0 + a0, an, 0, ow) for a0, an in tiles(rn, rows)]


def make_plan(cv: Conv, units, src, pk: Packing, ldt: str, rdt: str, odt: str, sbuf: int,
              what: str) -> Plan:
    h, w = cv.dims[-2:]
    rows = max(1, (cv.bank - w.out) // w.q + 1) if w.out <= cv.bank else 1
    slots = outer_taps(cv) * len(pk.groups)
    wbytes = max(sum(slots * u.cot for u in us) for us in units) * hw_dtypes.itemsize(rdt)
    budget = int(sbuf * SBUF_SHARE) - wbytes
    ncit = max(len(tiles(b.cn, cv.pmax)) for b in cv.blocks)
    per_row = BAND_BUFS * ncit * outer_taps(cv) * phase_count(cv) * w.q * hw_dtypes.itemsize(ldt)
    if isinstance(src, Padded):         # + the staging ring of unpadded rows
        per_row += BAND_BUFS * ncit * h.stride * w.size * hw_dtypes.itemsize(ldt)
    per_row += OUT_BUFS * w.out * hw_dtypes.itemsize(odt)
    fit = budget // per_row - h.shift if budget > 0 else 0
    if fit < 1:
        raise LoweringError(f"convolution tiles do not fit in SBUF (weights {wbytes} B, "
                            f"input rows {per_row} B per partition): {what}")
    band = min(h.out, fit if fit < rows else fit // rows * rows)
    plan = Plan(band, rows, wbytes)
    count = _matmuls(cv, plan, slots)
    if count > MAX_INSTRUCTIONS:
        raise LoweringError(f"convolution needs {count} matmuls in its tap loop (more than "
                            f"{MAX_INSTRUCTIONS}, minutes to compile); a huge kernel window "
                            f"outside wgrad.py's cases (grouped, 3-D, strided window): {what}")
    return plan


def outer_taps(cv: Conv) -> int:
    return math.prod(d.kernel for d in cv.dims[:-2])


def phase_count(cv: Conv) -> int:
    return len(cv.dims[-2].phases) * len(cv.dims[-1].phases)


def _matmuls(cv: Conv, plan: Plan, slots: int) -> int:
    h = cv.dims[-2]
    n = sum(len(chunks(cv, plan.rows, r0, rn)) for r0, rn in tiles(h.out, plan.band))
    per_image = n * slots * math.prod(d.out for d in cv.dims[:-2])
    return cv.n_out * per_image * sum(len(tiles(b.cn, cv.pmax)) * len(tiles(b.on, cv.pmax))
                                      for b in cv.blocks)

