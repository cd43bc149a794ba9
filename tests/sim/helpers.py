"""Helpers for the simulator tests: build tiles, run one instruction, read results."""
from __future__ import annotations

import numpy as np

from jax_trn.hw import CHIPS, Kernel, NeuronCore, Numerics, Tile
from jax_trn.hw import dtypes as dt

_NEXT_OFFSET = {"sbuf": 0, "psum": 0}


def tile(shape, dtype="float32", mem="sbuf", offset=None, start=0) -> Tile:
    """A tile of `shape` = (partitions, *free); offsets advance so tiles never alias."""
    p, *free = shape
    tile = Tile(mem, start, p, 0, tuple(free) or (1,), dtype)
    if offset is None:
        offset = _NEXT_OFFSET[mem]
        step = 2048 if mem == "psum" else 4096
        nbytes = -(-tile.bytes_per_partition // step) * step
        _NEXT_OFFSET[mem] = (offset + nbytes) % (16384 if mem == "psum" else 131072)
    return tile.with_(offset=offset)


def core(gen="trn2", rounding="rne", seed=0) -> NeuronCore:
    return NeuronCore(CHIPS[gen].core, numerics=Numerics(rounding, seed))


def run1(instr, inputs: dict, gen: str = "trn2", dram: dict | None = None, c=None):
    """Write `inputs` (Tile -> array-like of its dtype), run `instr` alone on a core and
    return the destination tile(s) as arrays: dst, or (dst, reduce_res)."""
    c = c or core(gen)
    for t, values in inputs.items():
        c.mem(t).write(t, np.asarray(values, dt.np_dtype(t.dtype)).reshape(t.shape))
    c.run(Kernel("run1", [instr], {}), dram or {})
    outs = [getattr(instr, "dst")]
    if getattr(instr, "reduce_res", None) is not None:
        outs.append(instr.reduce_res)
    arrays = [np.array(c.mem(t).read(t)) if isinstance(t, Tile) else None for t in outs]
    return arrays[0] if len(arrays) == 1 else tuple(arrays)


def col(values, dtype="float32"):
    """A [P, 1] column of values."""
    return np.asarray(values, dt.np_dtype(dtype)).reshape(-1, 1)
