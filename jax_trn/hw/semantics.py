"""What each instruction does to a core's memories: the living definition of the ISA.

One function per instruction, `fn(instr, core)`; each instruction class names its own
(`semantics = ...`, isa_base.py), so this module knows operands, not instruction
classes. `core` provides `mem(tile)` (its SBUF / PSUM `OnChipMemory`), `dram` (name ->
flat numpy array) and `numerics` (the rounding context). Compute rules (§2.3-§2.5, §4):

- Float work runs in FP32: inputs widen exactly, the result is cast to the destination
  dtype (RNE or stochastic).
- If every operand (tiles and immediates) is integer or bool, the op runs natively in
  int64 and wraps into the destination dtype: no FP32 round trip (GpSimd-style, §2.5).
  Float immediates with an integral value count as integers.
- Copies between equal dtypes are bit-exact; int <-> int copies wrap; anything
  involving a float goes through FP32 (§3.4 for DMA).
- ScalarE activation functions give NaN outside their published input ranges unless
  `core.numerics.strict_ranges` is off (alu.py, §2.4).
- PSUM remembers whether a matmul wrote each byte last; on v2/v3 a matmul that
  accumulates onto anything else raises IsaError (undefined behaviour, §2.2).

`execute(instr, core)` is the entry point (`Instr.execute`): the instruction's own
function plus the PSUM bookkeeping. MX instructions are in semantics_mx.py.
"""
from __future__ import annotations

import numpy as np

from . import alu as _alu
from . import dtypes as _dt
from .memory import dram_read, dram_write
from .numerics import is_int, round_tf32, to_fp32
from .operands import DramAP, IsaError, Tile
from .sgemm import matmul as _matmul

_F32 = np.float32
_I64 = np.int64


# --- operand access -------------------------------------------------------------------

def _read(core, tile: Tile) -> np.ndarray:
    return core.mem(tile).view(tile)


def _store(core, tile: Tile, result: np.ndarray) -> None:
    """Cast `result` (FP32 or int64) to the tile's dtype and write it."""
    dt = _dt.np_dtype(tile.dtype)
    if is_int(result.dtype) and not is_int(dt) and result.dtype != dt:
        result = result.astype(_F32)      # int -> float goes through the FP32 datapath
    out = core.numerics.cast(result, dt)
    view = core.mem(tile).view(tile)
    view[...] = out.reshape(view.shape) if out.size == view.size else out


def _int_imm(v) -> bool:
    if isinstance(v, Tile):
        return is_int(_dt.np_dtype(v.dtype))
    if isinstance(v, (bool, int, np.integer)):
        return True
    return float(v).is_integer() and abs(v) < 2.0 ** 63


def _scalar(core, v, data: Tile, as_int: bool) -> np.ndarray:
    """An immediate, or a [P, 1] tile shaped to broadcast over `data`."""
    if isinstance(v, Tile):
        x = _read(core, v).reshape((v.num_partitions,) + (1,) * len(data.free))
    else:
        x = np.asarray(v)
    return x.astype(_I64) if as_int else to_fp32(x)


def _widen(x: np.ndarray, as_int: bool) -> np.ndarray:
    return x.astype(_I64) if as_int else to_fp32(x)


def _convert(core, x: np.ndarray, dtype: str) -> np.ndarray:
    """Copy conversion: bit-exact for equal dtypes, wrap for int->int, else via FP32."""
    dt = _dt.np_dtype(dtype)
    if x.dtype == dt:
        return x
    if is_int(x.dtype) and is_int(dt):
        return _dt.int_astype(x, dt)
    return core.numerics.cast(to_fp32(x), dt)


def _bits(tile: Tile) -> int:
    return _dt.bits(tile.dtype)


def _binary(op: str, a: np.ndarray, b: np.ndarray, as_int: bool, bits: int) -> np.ndarray:
    return _alu.int_op(op, a, b, bits) if as_int else _alu.float_op(op, a, b)


# --- DMA and TensorE ------------------------------------------------------------------

def _read_operand(core, v) -> np.ndarray:
    return dram_read(v, core.dram) if isinstance(v, DramAP) else _read(core, v)


def dma_copy(ins, core) -> None:
    x = _convert(core, _read_operand(core, ins.src), ins.dst.dtype)
    if isinstance(ins.dst, DramAP):
        dram_write(ins.dst, core.dram, x.reshape(ins.dst.shape))
    else:
        view = _read(core, ins.dst)
        view[...] = x.reshape(view.shape)


def dma_gather(ins, core) -> None:
    """dst[p, j, :] = table[indices[p, j], :], cast like dma_copy; out-of-bounds rows
    raise (oob_mode "error") or leave their slot unchanged ("skip")."""
    table = dram_read(ins.src, core.dram).reshape(ins.rows, ins.row_size)
    p = ins.dst.num_partitions
    idx = _read(core, ins.indices).reshape(p, -1).astype(_I64)
    ok = (idx >= 0) & (idx < ins.rows)
    if ins.oob_mode == "error" and not ok.all():
        raise IsaError(f"gather index {idx[~ok][0]} outside the {ins.rows} rows of "
                       f"{ins.src.tensor!r} (oob_mode='error')")
    rows = _convert(core, table[np.where(ok, idx, 0)], ins.dst.dtype)
    view = _read(core, ins.dst).reshape(p, idx.shape[1], ins.row_size)
    view[ok] = rows[ok]


def dma_scatter(ins, core) -> None:
    """table[indices[p, j], :] = src[p, j, :] (or += in FP32, cast back) in index order,
    p-major: the k-th write to a row lands after every earlier one; out-of-bounds rows
    raise (oob_mode "error") or are dropped ("skip")."""
    dram_read(ins.dst, core.dram)                   # checks the table's bounds and dtype
    flat = core.dram[ins.dst.tensor]
    if not flat.flags.writeable:
        raise IsaError(f"DRAM tensor {ins.dst.tensor!r} is read-only (a kernel input?)")
    idx = _read(core, ins.indices).reshape(-1).astype(_I64)
    ok = (idx >= 0) & (idx < ins.rows)
    if ins.oob_mode == "error" and not ok.all():
        raise IsaError(f"scatter index {idx[~ok][0]} outside the {ins.rows} rows of "
                       f"{ins.dst.tensor!r} (oob_mode='error')")
    src = _read(core, ins.src).reshape(idx.size, ins.row_size)[ok]
    (step, _), *inner = ins.dst.pattern
    cols = ins.dst.offset + _pattern_offsets(inner)
    addr = idx[ok][:, None] * step + cols[None, :]
    for sel in _layers(idx[ok], overlapping=step < int(cols.max() - cols.min()) + 1):
        if ins.rmw_op == "add":
            acc = to_fp32(flat[addr[sel]]) + to_fp32(src[sel])
            flat[addr[sel]] = core.numerics.cast(acc, flat.dtype)
        else:
            flat[addr[sel]] = _convert(core, src[sel], ins.dst.dtype)


def _pattern_offsets(pattern) -> np.ndarray:
    """Element offsets of every index tuple of `pattern`, row-major."""
    off = np.zeros(1, _I64)
    for stride, num in pattern:
        off = (off[:, None] + stride * np.arange(num, dtype=_I64)[None, :]).reshape(-1)
    return off


def _layers(idx: np.ndarray, overlapping: bool):
    """Index arrays of the writes, in groups that touch each row at most once: the k-th
    write to every row is in group k (one write per group if rows overlap)."""
    if overlapping:
        yield from (np.array([i]) for i in range(idx.size))
        return
    order = np.argsort(idx, kind="stable")
    first = np.r_[True, np.diff(idx[order]) != 0]
    group_start = np.maximum.accumulate(np.where(first, np.arange(idx.size), 0))
    rank = np.empty_like(idx)
    rank[order] = np.arange(idx.size) - group_start
    for r in range(int(rank.max()) + 1 if idx.size else 0):
        yield np.flatnonzero(rank == r)


def dma_transpose(ins, core) -> None:
    """dst[B, A] = src[A, B], bit-exact."""
    x = _read_operand(core, ins.src).reshape(ins.src_shape)
    view = _read(core, ins.dst)
    bits = np.dtype(f"u{x.dtype.itemsize}")   # move bits: numpy copies ml_dtypes slowly
    # The source made contiguous first: a transposing copy straight out of strided DRAM
    # into SBUF's partition rows is 3-4x slower (the same bits either way).
    src = np.ascontiguousarray(x.view(bits))
    view.view(bits)[...] = src.T.reshape(view.shape)


def _matmul_operand(core, tile: Tile, rows: int, tf32: bool) -> np.ndarray:
    x = to_fp32(_read(core, tile)).reshape(rows, -1)
    return round_tf32(x) if tf32 else x


def nc_matmul(ins, core) -> None:
    """dst[M,N] (+)= stationary[K,M].T @ moving[K,N] in FP32 (§2.2). double_row
    contracts over (partition, row) pairs, i.e. K = 2 x partitions."""
    tf32 = ins.precision == "tf32"
    st = _matmul_operand(core, ins.stationary, ins.rows, tf32)
    mv = _matmul_operand(core, ins.moving, ins.rows, tf32)
    if ins.accumulate:               # dst + st.T @ mv, as `sgemm.matmul` accumulates
        acc = np.array(to_fp32(_read(core, ins.dst)).reshape(st.shape[1], -1), np.float32)
        result = _matmul(st.T, mv, acc, True)
    else:
        result = _matmul(st.T, mv)
    _store(core, ins.dst, result)


def nc_transpose(ins, core) -> None:
    """dst[F, P] = data[P, F], free axes flattened; values converted like a copy."""
    x = _read(core, ins.data).reshape(ins.data.num_partitions, -1)
    view = _read(core, ins.dst)
    view[...] = _convert(core, x.T, ins.dst.dtype).reshape(view.shape)


# --- ScalarE / VectorE / GpSimd -------------------------------------------------------

def activation(ins, core) -> None:
    """dst = func(data * scale + bias), FP32 inside; reduce_res = sum of the result."""
    x = to_fp32(_read(core, ins.data))
    if not (isinstance(ins.scale, (int, float)) and ins.scale == 1.0):
        x = x * _scalar(core, ins.scale, ins.data, False)
    if ins.bias is not None:
        x = x + _scalar(core, ins.bias, ins.data, False)
    y = _alu.activation(ins.func, x, strict=core.numerics.strict_ranges)
    _store(core, ins.dst, y)
    if ins.reduce_res is not None:
        total = np.add.reduce(y.reshape(y.shape[0], -1), axis=1, dtype=_F32)
        _store(core, ins.reduce_res, total)


def tensor_tensor(ins, core) -> None:
    a, b = _read(core, ins.data1), _read(core, ins.data2)
    as_int = is_int(a.dtype) and is_int(b.dtype)
    b = b.reshape(a.shape)
    _store(core, ins.dst, _binary(ins.op, _widen(a, as_int), _widen(b, as_int), as_int,
                                  _bits(ins.data1)))


def _apply_scalar(core, x, op, operand, reverse, data, as_int):
    s = _scalar(core, operand, data, as_int)
    a, b = (s, x) if reverse else (x, s)
    return _binary(op, a, b, as_int, _bits(data))


def tensor_scalar(ins, core) -> None:
    """dst = (data <op0> operand0) <op1> operand1 (operand first when reversed)."""
    x = _read(core, ins.data)
    ops = [(ins.op0, ins.operand0, ins.reverse0)]
    if ins.op1 is not None:
        ops.append((ins.op1, ins.operand1, ins.reverse1))
    as_int = is_int(x.dtype) and all(_int_imm(v) for _, v, _ in ops)
    x = _widen(x, as_int)
    for op, operand, reverse in ops:
        x = _apply_scalar(core, x, op, operand, reverse, ins.data, as_int)
    _store(core, ins.dst, x)


def tensor_reduce(ins, core) -> None:
    x = _read(core, ins.data)
    if is_int(x.dtype):
        r = _alu.reduce_int(ins.op, x.astype(_I64), ins.axes)
    else:
        r = _alu.reduce_float(ins.op, to_fp32(x), ins.axes)
    _store(core, ins.dst, -r if ins.negate else r)


def bn_stats(ins, core) -> None:
    """Per partition, of the even and the odd elements of `data` (FP32): (count, mean,
    variance * count) each, §6.2 [NKI-ISA]."""
    x = to_fp32(_read(core, ins.data)).reshape(ins.data.num_partitions, -1)
    out = []
    for part in (x[:, 0::2], x[:, 1::2]):
        n = part.shape[1]
        mean = part.mean(axis=1, dtype=np.float32) if n else np.zeros(len(x), np.float32)
        m2 = ((part - mean[:, None]) ** 2).sum(axis=1, dtype=np.float32) if n else mean * 0
        out += [np.full(len(x), n, np.float32), mean, m2]
    _store(core, ins.dst, np.stack(out, axis=1))


def bn_aggr(ins, core) -> None:
    """(mean, variance) per partition from bn_stats' (count, mean, variance * count)
    triples (Chan's parallel combination, FP32), §6.2 [NKI-ISA]."""
    x = to_fp32(_read(core, ins.data)).reshape(ins.data.num_partitions, -1, 3)
    count, mean, m2 = x[:, :, 0], x[:, :, 1], x[:, :, 2]
    total = count.sum(axis=1, dtype=np.float32)
    with np.errstate(all="ignore"):
        mu = np.where(total > 0, (count * mean).sum(axis=1, dtype=np.float32) / total, 0)
        ss = (m2 + count * (mean - mu[:, None]) ** 2).sum(axis=1, dtype=np.float32)
        var = np.where(total > 0, ss / total, 0)
    _store(core, ins.dst, np.stack([mu, var], axis=1).astype(np.float32))


def tensor_copy(ins, core) -> None:
    view = _read(core, ins.dst)
    view[...] = _convert(core, _read(core, ins.src), ins.dst.dtype).reshape(view.shape)


def memset(ins, core) -> None:
    as_int = is_int(_dt.np_dtype(ins.dst.dtype)) and _int_imm(ins.value)
    _store(core, ins.dst, np.asarray(ins.value, _I64 if as_int else _F32))


def _affine(partitions: int, pattern, offset: int, channel_multiplier: int) -> np.ndarray:
    """offset + p * channel_multiplier + sum(step_k * i_k), shape (P, *nums), in int64."""
    idx = offset + channel_multiplier * np.arange(partitions, dtype=_I64)
    idx = idx.reshape(-1, *([1] * len(pattern)))
    for k, (step, num) in enumerate(pattern):
        shape = [1] * (len(pattern) + 1)
        shape[k + 1] = num
        idx = idx + step * np.arange(num, dtype=_I64).reshape(shape)
    return idx


def iota(ins, core) -> None:
    """dst[p, i...] = offset + p * channel_multiplier + sum(step_k * i_k), in int."""
    t = ins.dst
    _store(core, t, _affine(t.num_partitions, ins.pattern, ins.offset,
                            ins.channel_multiplier))


def select(ins, core) -> None:
    pred = _read(core, ins.pred) != 0
    a, b = _read(core, ins.on_true), _read(core, ins.on_false)
    as_int = is_int(a.dtype) and is_int(b.dtype)
    shape = a.shape
    r = np.where(pred.reshape(shape), _widen(a, as_int), _widen(b, as_int).reshape(shape))
    _store(core, ins.dst, r)


def scalar_tensor_tensor(ins, core) -> None:
    """dst = (data <op0> operand0) <op1> operand1, in FP32 (VectorE)."""
    x = to_fp32(_read(core, ins.data))
    x = _apply_scalar(core, x, ins.op0, ins.operand0, ins.reverse0, ins.data, False)
    y = to_fp32(_read(core, ins.operand1)).reshape(x.shape)
    a, b = (y, x) if ins.reverse1 else (x, y)
    _store(core, ins.dst, _alu.float_op(ins.op1, a, b))


def exponential(ins, core) -> None:
    """dst = exp(src - max_value) in FP32; reduce_res = reduce_init + sum of it."""
    x = to_fp32(_read(core, ins.src)) - _scalar(core, ins.max_value, ins.src, False)
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.exp(x, dtype=_F32)
    _store(core, ins.dst, y)
    if ins.reduce_res is not None:
        total = np.add.reduce(y.reshape(y.shape[0], -1), axis=1, dtype=_F32)
        _store(core, ins.reduce_res, total + _F32(ins.reduce_init))


def tensor_partition_reduce(ins, core) -> None:
    """dst[1, F] = reduce over partitions; integers natively, floats in FP32."""
    x = _read(core, ins.data).reshape(ins.data.num_partitions, -1)
    if is_int(x.dtype):
        r = _alu.reduce_int(ins.op, x.astype(_I64), (0,))
    else:
        r = _alu.reduce_float(ins.op, to_fp32(x), (0,))
    _store(core, ins.dst, r.reshape(1, -1))


def affine_select(ins, core) -> None:
    """dst = on_true_tile where cmp_op(affine, 0) else on_false_value."""
    t = ins.dst
    a = _affine(t.num_partitions, ins.pattern, ins.offset, ins.channel_multiplier)
    pred = _alu.int_op(ins.cmp_op, a, np.zeros((), _I64), 64) != 0
    view = _read(core, t)
    on_true = _convert(core, _read(core, ins.on_true_tile), t.dtype).reshape(view.shape)
    fill = _convert(core, np.full(view.shape, ins.on_false_value, _F32), t.dtype)
    view[...] = np.where(pred.reshape(view.shape), on_true, fill)


def tensor_tensor_scan(ins, core) -> None:
    """dst[:, i] = (data0[:, i] <op0> dst[:, i-1]) <op1> data1[:, i], dst[:, -1] being
    `initial`; the running value stays FP32 (int64 for all-integer operands)."""
    a, b = _read(core, ins.data0), _read(core, ins.data1)
    as_int = is_int(a.dtype) and is_int(b.dtype) and _int_imm(ins.initial)
    p = ins.data1.num_partitions
    a, b = _widen(a, as_int).reshape(p, -1), _widen(b, as_int).reshape(p, -1)
    prev = np.broadcast_to(_scalar(core, ins.initial, ins.data1, as_int).reshape(-1, 1),
                           (p, 1))
    out = np.empty(b.shape, _I64 if as_int else _F32)
    bits = _bits(ins.dst)
    for i in range(b.shape[1]):
        prev = _binary(ins.op0, a[:, i:i + 1], prev, as_int, bits)
        prev = _binary(ins.op1, prev, b[:, i:i + 1], as_int, bits)
        out[:, i:i + 1] = prev
    _store(core, ins.dst, out)



# --- max8 / nc_find_index8 / nc_match_replace8 (the choices: isa_vector.py) -------------

def _rows32(core, tile: Tile) -> np.ndarray:
    """A tile as [P, n] FP32 (integers converted like any VectorE input, §2.3)."""
    return to_fp32(_read(core, tile)).reshape(tile.num_partitions, -1)


def _sentinel(tile: Tile) -> int:
    return (1 << _bits(tile)) - 1


def max8(ins, core) -> None:
    """The 8 largest per partition, descending; NaN above +inf, ties in position order."""
    x = _rows32(core, ins.src)
    pos = np.broadcast_to(np.arange(x.shape[1]), x.shape)
    nan = np.isnan(x)
    order = np.lexsort((pos, -np.where(nan, 0, x), ~nan), axis=-1)[:, :8]
    _store(core, ins.dst, np.take_along_axis(x, order, axis=1))


def _matches(data: np.ndarray, vals: np.ndarray, ascending: bool) -> np.ndarray:
    """[P, 8] int64 positions: the occurrence of vals[:, j] in data that slot j takes
    (duplicates in vals take successive occurrences, in ascending or descending slot
    order), -1 where there is none; FP32 equality (NaN matches nothing)."""
    out = np.full(vals.shape, -1, _I64)
    for j in range(vals.shape[1]):
        v = vals[:, j:j + 1]
        same = vals == v
        rank = same[:, :j].sum(1) if ascending else same[:, j + 1:].sum(1)
        eq = data == v
        hit = eq & (np.cumsum(eq, axis=1) == (rank + 1)[:, None])
        found = hit.any(1)
        out[found, j] = hit[found].argmax(1)
    return out


def find_index8(ins, core) -> None:
    pos = _matches(_rows32(core, ins.data), _rows32(core, ins.vals), ascending=True)
    _store(core, ins.dst, np.where(pos < 0, _sentinel(ins.dst), pos))


def match_replace8(ins, core) -> None:
    x = _rows32(core, ins.data)
    pos = _matches(x, _rows32(core, ins.vals), ascending=False)
    raw = _read(core, ins.data).reshape(x.shape)
    out = _convert(core, raw, ins.dst.dtype).copy()
    rows = np.broadcast_to(np.arange(x.shape[0])[:, None], pos.shape)
    ok = pos >= 0
    out[rows[ok], pos[ok]] = _convert(core, np.full(1, ins.imm, _F32), ins.dst.dtype)[0]
    view = _read(core, ins.dst)
    view[...] = out.reshape(view.shape)
    if ins.dst_idx is not None:
        _store(core, ins.dst_idx, np.where(ok, pos, _sentinel(ins.dst_idx)))


# --- dispatch and PSUM bookkeeping ------------------------------------------------

def _check_accumulate(ins, core) -> None:
    """§2.2 [NKI-ISA]: on v2/v3 accumulating onto PSUM data that a non-matmul
    instruction wrote (or nothing wrote) is undefined behaviour."""
    if core.spec.psum_accumulate_any:
        return
    if not core.mem(ins.dst).written_by_matmul(ins.dst):
        raise IsaError(f"matmul accumulates onto PSUM {ins.dst.shape} at byte "
                       f"{ins.dst.offset} that a matmul did not write: undefined on "
                       f"{core.spec.name}, §2.2")


def execute(ins, core) -> None:
    """Apply `ins` to `core`, then record which PSUM bytes a matmul wrote."""
    if ins.matmul_output and getattr(ins, "accumulate", False):
        _check_accumulate(ins, core)
    ins.semantics(core)
    for t in ins.outputs():
        if isinstance(t, Tile) and t.mem == "psum":
            core.mem(t).mark(t, ins.matmul_output)
