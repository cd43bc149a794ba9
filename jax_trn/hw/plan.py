"""Kernel numerics compiled once into closures (issue 14, point 3).

`semantics.py` is the reference: one function per instruction that looks up its
operands (memory, view, dtype), decides how to compute (integer or FP32, which ALU
function, which cast) and computes, on every execution. For a given core all of that
but the computing is static: a tile's view of SBUF / PSUM never moves, dtypes and
immediates are fixed, the PSUM bytes a matmul marks are known. `kernel_plan(kernel,
core)` compiles each instruction once into a closure with those decisions taken (the
same numpy calls in the same order as its semantics function, so results are
bit-identical), and `NeuronCore` runs the closures instead of interpreting
(`NeuronCore.run` and `NeuronCore.replay`). Instructions without a compiler here, and
every instruction under stochastic rounding (whose random stream is keyed per
instruction), run their semantics function.

`ENABLED = False` turns plans off (the interpreter alone): tests/sim/test_plan.py runs
the op corpus both ways and asserts the results are identical. `PlanCache.lanes` gives
`NeuronCore.replay` the two-thread schedule of a plan (lanes.py).

A matmul into FP32 PSUM writes its product through `sgemm.matmul(..., out)`, an
accumulating one adds it there in the same GEMM (beta = 1, as the interpreter does on
a copy of the accumulator): the PSUM view instead of a fresh array and a separate add.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from . import alu as _alu
from . import dtypes as _dt
from . import lanes as _lanes
from . import semantics as _sem
from . import sgemm
from .memory import dram_read, dram_write
from .numerics import _F4, is_int, to_fp32
from .operands import DramAP, Tile
from .sgemm import matmul as _matmul

__all__ = ["ENABLED", "kernel_plan", "PlanCache"]

ENABLED = True
_F32 = np.float32


def kernel_plan(kernel, core) -> list:
    """One no-argument closure per instruction of `kernel` (by index) applying its
    effect to `core` (its memories, its `dram` at call time, its numerics)."""
    return _kernel_plans(kernel, core)[0]


def _kernel_plans(kernel, core) -> tuple[list, list]:
    """(closures with the PSUM bookkeeping of `semantics.execute`, the same without it)
    per instruction: the second is what a replay runs (see `PlanCache.replay_plan`)."""
    fallback = not ENABLED or core.numerics.rounding != "rne"
    pairs = [_instr_plan(ins, core, fallback) for ins in kernel.instructions]
    return [full for full, _ in pairs], [body for _, body in pairs]


class PlanCache:
    """The plans of the kernels a core ran recently (they hold views of its memories,
    so they belong to the core), at most `size`, least recently used dropped."""

    def __init__(self, size: int = 4096):
        self.size = size
        self._plans: OrderedDict[int, tuple] = OrderedDict()
        self._lanes: dict[int, tuple] = {}      # id(kernel) -> (plan, order, schedule)

    def get(self, kernel, core) -> list:
        return self._both(kernel, core)[0]

    def _both(self, kernel, core) -> tuple[list, list]:
        got = self._plans.get(id(kernel))
        if (got is not None and got[0] is kernel and got[1] == len(kernel.instructions)
                and got[2] is core.numerics and got[3] == ENABLED):
            self._plans.move_to_end(id(kernel))
            return got[4]
        plans = _kernel_plans(kernel, core)
        self._plans[id(kernel)] = (kernel, len(kernel.instructions), core.numerics,
                                   ENABLED, plans)
        if len(self._plans) > self.size:
            dropped = self._plans.popitem(last=False)[0]
            self._lanes.pop(dropped, None)
        return plans

    def lanes(self, kernel, order, core):
        """The two-lane schedule (lanes.py) of `kernel`'s plan in `order`, or None to
        run it sequentially; worked out once per kernel and order."""
        return self.replay_plan(kernel, order, core)[1]

    def replay_plan(self, kernel, order, core) -> tuple:
        """(`kernel`'s plan, its two-lane schedule in `order` or None): what
        `NeuronCore.replay` runs, in one lookup per call. A replay repeats a run that
        validated the kernel, so its closures skip the PSUM bookkeeping (which bytes a
        matmul wrote last, and the accumulate check that reads it): a kernel only
        accumulates onto PSUM it wrote itself, and the run before checked that."""
        plan = self._both(kernel, core)[1]
        got = self._lanes.get(id(kernel))
        on = _lanes.ENABLED and core.numerics.lanes
        if (got is not None and got[0] is plan and got[3] == on
                and (got[1] is order or got[1] == order)):
            return plan, got[2]
        schedule = (_lanes.lane_schedule(kernel, order, plan)
                    if on and core.numerics.rounding == "rne" else None)
        self._lanes[id(kernel)] = (plan, order, schedule, on)
        return plan, schedule


def _instr_plan(ins, core, fallback: bool):
    compiler = None if fallback else _COMPILERS.get(type(ins).semantics)
    body = compiler(ins, core) if compiler is not None else None
    if core.lead:                      # a BatchCore (batch.py): no PSUM bookkeeping
        if body is None:
            slices = core.slices

            def run():
                for one in slices:
                    ins.execute(one)
            return run, run
        return body, body
    if body is None:
        return (lambda: ins.execute(core)), (lambda: ins.semantics(core))
    marks = [(core.mem(t)._flags(t), ins.matmul_output) for t in ins.outputs()
             if isinstance(t, Tile) and t.mem == "psum" and core.mem(t).by_matmul is not None]
    check = ins.matmul_output and getattr(ins, "accumulate", False)
    if check and core.spec.psum_accumulate_any:
        check = False                  # `semantics._check_accumulate` allows it
    if not marks and not check:
        return body, body
    written = core.mem(ins.dst)._flags(ins.dst) if check else None

    def run():
        if check and not written.all():
            _sem._check_accumulate(ins, core)      # raises its error
        body()
        for flags, value in marks:
            flags[...] = value
    return run, body


# --- operand access, compiled ---------------------------------------------------------

def _reader(core, v):
    """A closure reading operand `v`: a tile's fixed view, or a DRAM pattern's view of
    the call's array."""
    if isinstance(v, DramAP):
        if core.lead:                  # [B, ...]: every device's view
            return lambda: core.read_dram(v)
        return lambda: dram_read(v, core.dram)
    view = core.mem(v).view(v)
    return lambda: view


def _storer(core, tile: Tile):
    """`semantics._store` into `tile`, its view and dtype resolved."""
    dt = _dt.np_dtype(tile.dtype)
    dt_int = is_int(dt)
    view = core.mem(tile).view(tile)
    shape, size, cast = view.shape, view.size, core.numerics.cast
    if not dt_int and dt != _F4 and core.numerics.rounding == "rne":
        def store(result):       # numerics.cast's conversion, written into the view
            if is_int(result.dtype):
                result = result.astype(_F32)
            with np.errstate(over="ignore", invalid="ignore"):
                np.copyto(view, result.reshape(shape) if result.size == size else result,
                          casting="unsafe")
        return store

    def store(result):
        if is_int(result.dtype) and not dt_int and result.dtype != dt:
            result = result.astype(_F32)
        out = cast(result, dt)
        view[...] = out.reshape(shape) if out.size == size else out
    return store


def _converter(core, src_dtype: np.dtype, dtype: str):
    """`semantics._convert` from `src_dtype` to `dtype`, decided once."""
    dt = _dt.np_dtype(dtype)
    if src_dtype == dt:
        return lambda x: x
    return lambda x: _sem._convert(core, x, dtype)


def _widener(as_int: bool):
    return (lambda x: x.astype(np.int64)) if as_int else to_fp32


def _binary(op: str, as_int: bool, bits: int):
    if as_int:
        return lambda a, b: _alu.int_op(op, a, b, bits)
    return lambda a, b: _alu.float_op(op, a, b)


def _scalar(core, v, data: Tile, as_int: bool):
    """`semantics._scalar`: an immediate (converted once) or a [P, 1] tile's view."""
    if isinstance(v, Tile):
        view = core.mem(v).view(v)
        shape = (*core.lead, v.num_partitions) + (1,) * len(data.free)
        widen = _widener(as_int)
        return lambda: widen(view.reshape(shape))
    x = np.asarray(v)
    x = x.astype(np.int64) if as_int else to_fp32(x)
    return lambda: x


# --- the instructions -----------------------------------------------------------------

def _dma_copy(ins, core):
    read = _reader(core, ins.src)
    src_dtype = _dt.np_dtype(ins.src.dtype)
    convert = _converter(core, src_dtype, ins.dst.dtype)
    if isinstance(ins.dst, DramAP):
        dst, shape = ins.dst, ins.dst.shape
        if core.lead:
            lead_shape = (*core.lead, *shape)
            return lambda: core.write_dram(dst, convert(read()).reshape(lead_shape))
        return lambda: dram_write(dst, core.dram, convert(read()).reshape(shape))
    view = core.mem(ins.dst).view(ins.dst)

    def run():
        view[...] = convert(read()).reshape(view.shape)
    return run


def _dma_transpose(ins, core):
    """`semantics.dma_transpose`: the source's bits made contiguous, then written
    transposed into the tile's bits view."""
    read = _reader(core, ins.src)
    view = core.mem(ins.dst).view(ins.dst)
    bits = np.dtype(f"u{view.dtype.itemsize}")
    dst = view.view(bits)
    lead = core.lead
    shape = (*lead, *ins.src_shape)

    def run():
        src = np.ascontiguousarray(read().reshape(shape).view(bits))
        dst[...] = src.swapaxes(-1, -2).reshape(dst.shape)
    return run


def _tensor_copy(ins, core):
    src = core.mem(ins.src).view(ins.src)
    view = core.mem(ins.dst).view(ins.dst)
    convert = _converter(core, src.dtype, ins.dst.dtype)

    def run():
        view[...] = convert(src).reshape(view.shape)
    return run


def _narrow(dst: Tile, *dtypes: np.dtype) -> bool:
    """Whether 32-bit integer operands may be computed on uint32 views
    (`alu.narrow_int_op`): the result is stored wrapped into an integer of <= 32 bits."""
    dt = _dt.np_dtype(dst.dtype)
    return (all(d.kind in "iu" and d.itemsize == 4 for d in dtypes)
            and dt.kind in "iu" and dt.itemsize <= 4)


def _narrow_imm(v) -> bool:
    """An immediate whose uint32 wrap means the same to every narrow op (a shift by a
    negative amount gives 0 either way, by 2**32 + k would not)."""
    return isinstance(v, (int, np.integer)) and -(1 << 31) <= int(v) < (1 << 32)


def _tensor_tensor(ins, core):
    a = core.mem(ins.data1).view(ins.data1)
    b = core.mem(ins.data2).view(ins.data2)
    if _alu.ALIASES.get(ins.op, ins.op) in _alu.NARROW_OPS and _narrow(ins.dst, a.dtype,
                                                                       b.dtype):
        op, store, shape = ins.op, _storer(core, ins.dst), a.shape
        a32, b32 = a.view(np.uint32), b.view(np.uint32).reshape(shape)
        return lambda: store(_alu.narrow_int_op(op, a32, b32))
    as_int = is_int(a.dtype) and is_int(b.dtype)
    widen, op = _widener(as_int), _binary(ins.op, as_int, _sem._bits(ins.data1))
    store, shape = _storer(core, ins.dst), a.shape
    return lambda: store(op(widen(a), widen(b.reshape(shape))))


def _tensor_scalar(ins, core):
    x = core.mem(ins.data).view(ins.data)
    ops = [(ins.op0, ins.operand0, ins.reverse0)]
    if ins.op1 is not None:
        ops.append((ins.op1, ins.operand1, ins.reverse1))
    if _narrow_scalar_ops(ins, x, ops):
        return _tensor_scalar_narrow(core, ins, x, ops)
    as_int = is_int(x.dtype) and all(_sem._int_imm(v) for _, v, _ in ops)
    bits = _sem._bits(ins.data)
    steps = [(_binary(op, as_int, bits), _scalar(core, v, ins.data, as_int), rev)
             for op, v, rev in ops]
    widen, store = _widener(as_int), _storer(core, ins.dst)

    def run():
        y = widen(x)
        for fn, scalar, reverse in steps:
            s = scalar()
            y = fn(s, y) if reverse else fn(y, s)
        store(y)
    return run


def _narrow_scalar_ops(ins, x: np.ndarray, ops) -> bool:
    def ok(v):
        if isinstance(v, Tile):
            dt = _dt.np_dtype(v.dtype)
            return dt.kind in "iu" and dt.itemsize == 4
        return _narrow_imm(v)
    return (_narrow(ins.dst, x.dtype)
            and all(_alu.ALIASES.get(op, op) in _alu.NARROW_OPS and ok(v) for op, v, _ in ops))


def _tensor_scalar_narrow(core, ins, x: np.ndarray, ops):
    """`_tensor_scalar` on uint32 views (`alu.narrow_int_op`): the ops chain mod 2**32."""
    def scalar(v):
        if isinstance(v, Tile):
            view = core.mem(v).view(v)
            shape = (*core.lead, v.num_partitions) + (1,) * len(ins.data.free)
            return lambda: view.reshape(shape).view(np.uint32)
        imm = _alu.narrow_operand(int(v))
        return lambda: imm
    steps = [(op, scalar(v), rev) for op, v, rev in ops]
    x32, store = x.view(np.uint32), _storer(core, ins.dst)

    def run():
        y = x32
        for op, s, reverse in steps:
            y = _alu.narrow_int_op(op, s(), y) if reverse else _alu.narrow_int_op(op, y, s())
        store(y)
    return run


def _activation(ins, core):
    x = core.mem(ins.data).view(ins.data)
    scaled = not (isinstance(ins.scale, (int, float)) and ins.scale == 1.0)
    scale = _scalar(core, ins.scale, ins.data, False) if scaled else None
    bias = _scalar(core, ins.bias, ins.data, False) if ins.bias is not None else None
    func, strict = ins.func, core.numerics.strict_ranges
    store = _storer(core, ins.dst)
    reduce = _storer(core, ins.reduce_res) if ins.reduce_res is not None else None
    rows = (*core.lead, ins.data.num_partitions, -1)

    def run():
        y = to_fp32(x)
        if scale is not None:
            y = y * scale()
        if bias is not None:
            y = y + bias()
        y = _alu.activation(func, y, strict=strict)
        store(y)
        if reduce is not None:
            reduce(np.add.reduce(y.reshape(rows), axis=-1, dtype=_F32))
    return run


def _nc_matmul(ins, core):
    if ins.precision == "tf32":
        return None                      # rare: the interpreter
    if core.lead:
        return _nc_matmul_batch(ins, core)
    rows = ins.rows
    st = core.mem(ins.stationary).view(ins.stationary)
    mv = core.mem(ins.moving).view(ins.moving)
    out = _matmul_out(ins, core.mem(ins.dst).view(ins.dst))
    if out is not None:                  # FP32 PSUM the product can be written into
        accumulate = bool(ins.accumulate)
        bound = _bound_matmul(st.reshape(rows, -1), mv.reshape(rows, -1), out, accumulate) \
            if np.may_share_memory(st.reshape(rows, -1), st) \
            and np.may_share_memory(mv.reshape(rows, -1), mv) else None
        if bound is not None:
            return bound

        def run():
            _matmul(to_fp32(st).reshape(rows, -1).T, to_fp32(mv).reshape(rows, -1), out,
                    accumulate)
        return run
    acc = core.mem(ins.dst).view(ins.dst) if ins.accumulate else None
    store = _storer(core, ins.dst)

    def run():
        a, b = to_fp32(st).reshape(rows, -1).T, to_fp32(mv).reshape(rows, -1)
        if acc is None:
            result = _matmul(a, b)
        else:
            result = _matmul(a, b, np.array(to_fp32(acc).reshape(a.shape[0], -1), _F32),
                             True)
        store(result)
    return run


_THREAD = threading.local()


def _bound_matmul(st: np.ndarray, mv: np.ndarray, out: np.ndarray, accumulate: bool):
    """The direct-to-PSUM product as `sgemm.bound` calls, made once per thread: an
    operand that is not FP32 is converted (`to_fp32`'s cast) into that thread's scratch
    of its shape, which the bound GEMM reads; the same call `_matmul` makes, so the
    same bits. None if the GEMM cannot be bound (then `_matmul` per call)."""
    def prepare():
        sa = None if st.dtype == _F32 else _scratch(st.shape, 0)
        sb = None if mv.dtype == _F32 else _scratch(mv.shape, 1)
        call = sgemm.bound((st if sa is None else sa).T, mv if sb is None else sb, out,
                           accumulate)
        return sa, sb, call

    here = prepare()                     # this thread's, and whether it binds at all
    if here[2] is None:
        return None
    per_thread: dict[int, tuple] = {threading.get_ident(): here}

    def run():
        got = per_thread.get(threading.get_ident())
        if got is None:
            got = per_thread[threading.get_ident()] = prepare()
        sa, sb, call = got
        if sa is not None:
            np.copyto(sa, st, casting="unsafe")
        if sb is not None:
            np.copyto(sb, mv, casting="unsafe")
        call()
    return run


def _scratch(shape: tuple, slot: int) -> np.ndarray:
    """This thread's FP32 array `slot` of `shape` (an operand converted for a GEMM)."""
    bufs = _THREAD.__dict__.setdefault("bufs", {})
    buf = bufs.get((shape, slot))
    if buf is None:
        buf = bufs[(shape, slot)] = np.empty(shape, _F32)
    return buf


def _nc_matmul_batch(ins, core):
    """`_nc_matmul` on a BatchCore: operands converted for all devices at once, then one
    GEMM per device, as each device alone makes it."""
    rows, (batch,) = ins.rows, core.lead
    st = core.mem(ins.stationary).view(ins.stationary)
    mv = core.mem(ins.moving).view(ins.moving)
    dst = core.mem(ins.dst).view(ins.dst)
    outs = [_matmul_out(ins, dst[d]) for d in range(batch)]
    accumulate = bool(ins.accumulate)
    if all(o is not None for o in outs):
        def run():
            a = to_fp32(st).reshape(batch, rows, -1)
            b = to_fp32(mv).reshape(batch, rows, -1)
            for d in range(batch):
                _matmul(a[d].T, b[d], outs[d], accumulate)
        return run
    store = _storer(core, ins.dst)

    def run():
        a = to_fp32(st).reshape(batch, rows, -1)
        b = to_fp32(mv).reshape(batch, rows, -1)
        acc = (np.array(to_fp32(dst).reshape(batch, a.shape[2], -1), _F32) if accumulate
               else np.empty((batch, a.shape[2], b.shape[2]), _F32))
        for d in range(batch):
            _matmul(a[d].T, b[d], acc[d], accumulate)
        store(acc)
    return run


def _matmul_out(ins, view: np.ndarray) -> np.ndarray | None:
    """The [M, N] FP32 view of a matmul's PSUM `view` that `sgemm.matmul(..., out)` can
    write through BLAS as it writes a fresh array (rows of unit-stride elements, M and N
    >= 2: a general matrix product, not a vector one), or None."""
    m, n = ins.m, ins.n
    if view.dtype != _F32 or m < 2 or n < 2:
        return None
    out = view.reshape(m, n)
    if not np.may_share_memory(out, view):    # reshape copied: not a view
        return None
    s0, s1 = out.strides
    return out if s1 == 4 and s0 % 4 == 0 and s0 >= 4 * n else None


def _nc_transpose(ins, core):
    x = core.mem(ins.data).view(ins.data)
    view = core.mem(ins.dst).view(ins.dst)
    convert = _converter(core, x.dtype, ins.dst.dtype)
    parts = ins.data.num_partitions

    rows = (*core.lead, parts, -1)

    def run():
        view[...] = convert(x.reshape(rows).swapaxes(-1, -2)).reshape(view.shape)
    return run


def _tensor_reduce(ins, core):
    x = core.mem(ins.data).view(ins.data)
    op, negate = ins.op, ins.negate
    axes = tuple(a + len(core.lead) for a in ins.axes)
    store = _storer(core, ins.dst)
    if is_int(x.dtype):
        def reduce():
            return _alu.reduce_int(op, x.astype(np.int64), axes)
    else:
        def reduce():
            return _alu.reduce_float(op, to_fp32(x), axes)

    def run():
        r = reduce()
        store(-r if negate else r)
    return run


def _select(ins, core):
    pred = core.mem(ins.pred).view(ins.pred)
    a = core.mem(ins.on_true).view(ins.on_true)
    b = core.mem(ins.on_false).view(ins.on_false)
    if a.dtype == b.dtype and is_int(a.dtype):
        widen = lambda x: x    # noqa: E731  same values as int64: no widening needed
    else:
        widen = _widener(is_int(a.dtype) and is_int(b.dtype))
    store, shape = _storer(core, ins.dst), a.shape

    def run():
        store(np.where((pred != 0).reshape(shape), widen(a), widen(b).reshape(shape)))
    return run


_COMPILERS = {
    _sem.dma_copy: _dma_copy, _sem.tensor_copy: _tensor_copy,
    _sem.dma_transpose: _dma_transpose,
    _sem.tensor_tensor: _tensor_tensor, _sem.tensor_scalar: _tensor_scalar,
    _sem.activation: _activation, _sem.nc_matmul: _nc_matmul,
    _sem.nc_transpose: _nc_transpose, _sem.tensor_reduce: _tensor_reduce,
    _sem.select: _select,
}
