"""What the MX instructions do (trainium-hardware.md §2.2, §2.3, §4): `quantize_mx`
and `nc_matmul_mx`, on the packed types and scale layout of mx.py."""
from __future__ import annotations

import numpy as np

from . import mx as _mx
from .numerics import to_fp32
from .operands import Tile
from .sgemm import matmul as _matmul
from .semantics import _read, _store

__all__ = ["quantize_mx", "nc_matmul_mx"]


def quantize_mx(ins, core) -> None:
    """Groups of 8 partitions x 4 values -> packed FP8 data and E8M0 scale bytes; the
    data rounds like any output cast (RNE, or stochastic when enabled)."""
    p = ins.src.num_partitions
    x = to_fp32(_read(core, ins.src)).reshape(p, -1)
    codes, bits = _mx.quantize(x, ins.dst.dtype[:-3], core.numerics.cast)
    view = _read(core, ins.dst)
    view[...] = _mx.pack(codes, ins.dst.dtype).reshape(view.shape)
    scale = _read(core, ins.dst_scale).reshape(ins.dst_scale.num_partitions, -1)
    scale.view(np.uint8)[_mx.scale_rows(p)] = bits


def _operand(core, data: Tile, scale: Tile) -> np.ndarray:
    """Dequantized [4P, F]: row 4p + i is packed value i of partition p."""
    p = data.num_partitions
    raw = _read(core, data).reshape(p, -1)
    values = _mx.dequantize(raw, data.dtype, _read(core, scale))     # [P, F, 4]
    return values.transpose(0, 2, 1).reshape(4 * p, -1)


def nc_matmul_mx(ins, core) -> None:
    """dst[M, N] (+)= A.T @ B in FP32 over K = 4P dequantized rows (§2.2)."""
    a = _operand(core, ins.stationary, ins.stationary_scale)
    b = _operand(core, ins.moving, ins.moving_scale)
    with np.errstate(invalid="ignore", over="ignore"):
        result = _matmul(a.T, b)
    if ins.accumulate:
        result += to_fp32(_read(core, ins.dst)).reshape(result.shape)
    _store(core, ins.dst, result)

