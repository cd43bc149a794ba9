"""`nisa`: one function per instruction of the NeuronCore ISA (jax_trn/hw/isa.py), named
and keyworded as NKI's `nki.isa` (trainium-hardware.md §6.2).

    import jax_trn.kernels.isa as nisa
    nisa.dma_copy(dst=x_sb, src=x[i * 128:(i + 1) * 128, :])
    nisa.nc_matmul(dst=acc, stationary=wT, moving=x_sb)          # acc in PSUM
    nisa.activation(dst=y, op=nl.exp, data=acc, bias=neg_max, scale=1.0)

Both NKI styles work: with `dst=` (NKI 2.x) the instruction writes there; without it
(the older style) the function allocates its result (SBUF, or PSUM for TensorE) and
returns it, and `psum_tile += nisa.nc_matmul(stationary, moving)` accumulates.
`engine=` picks the engine where the ISA allows several (`nisa.vector_engine`, ...),
`queue=` the DMA queue of a DMA (default: round-robin over the queues).

Each call builds one instruction, which checks its operands (partitions, shapes,
dtypes, memories) and the target generation's rules; a violation is a `KernelError`
naming the kernel and the line of the call.

`nc_matmul`'s `accumulate=None` adds to the destination when its bytes hold a
matmul's sums (the second and later k-steps of an accumulation group) and starts a
new group otherwise (a fresh or `nl.zeros` PSUM tile): pass True / False to decide.
"""
from __future__ import annotations

import numbers

import numpy as np

from jax_trn.hw import isa as hw

from . import trace
from .tensors import HbmView, TileView

tensor_engine, vector_engine, scalar_engine, gpsimd_engine = (
    "tensor", "vector", "scalar", "gpsimd")
unknown_engine = None


class engine:
    """NKI's engine enum (`engine=nisa.engine.vector`)."""
    tensor, vector, scalar, gpsimd, unknown = "tensor", "vector", "scalar", "gpsimd", None
    activation = "scalar"


class dge_mode:
    """Descriptor generation modes (§3.4): accepted; the DMA model prices them alike."""
    none, swdge, hwdge, unknown = "none", "swdge", "hwdge", None


class reduce_cmd:
    """Accumulator commands of ScalarE's activation (accepted, not modelled)."""
    idle, reset, reduce, reset_reduce = "idle", "reset", "reduce", "reset_reduce"


class matmul_perf_mode:
    none, double_row = "none", "double_row"



# --- operands --------------------------------------------------------------------------

class MatmulResult:
    """`nisa.nc_matmul(stationary, moving)` without `dst`: emitted where it is used --
    accumulated by `psum_tile += ...`, or into a fresh PSUM tile when read."""

    def __init__(self, stationary, moving, kw: dict, line: str):
        self.stationary, self.moving, self.kw, self.line = stationary, moving, kw, line
        self._tile: TileView | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return (self.stationary.shape[-1] if len(self.stationary.shape) == 2
                else _free(self.stationary), _free(self.moving))

    def materialize(self) -> TileView:
        if self._tile is None:
            t = trace.current()
            dst = t.alloc(self.shape, "float32", "psum", "matmul")
            _matmul(t, dst, self.stationary, self.moving, False, self.kw, self.line)
            self._tile = dst
        return self._tile

    def __getitem__(self, index):
        return self.materialize()[index]

    def __radd__(self, acc):
        """`acc += nisa.nc_matmul(stationary, moving)`: accumulates into PSUM tile acc
        (TileView has no `+`, so Python asks the matmul)."""
        return accumulate_into(acc, self)


def _free(v) -> int:
    n = 1
    for d in v.shape[1:]:
        n *= d
    return n


def _tile_in(t, v, what: str) -> hw.Tile:
    if isinstance(v, MatmulResult):
        v = v.materialize()
    if not isinstance(v, TileView):
        raise t.error(f"{what} must be an SBUF/PSUM tile, got {_kind(v)}")
    t.read(v)
    return v.tile()


def _scalar_in(t, v, what: str):
    if isinstance(v, (TileView, MatmulResult)):
        return _tile_in(t, v, what)
    if isinstance(v, numbers.Number) or hasattr(v, "item"):
        return float(v) if not isinstance(v, (bool, int)) else v
    raise t.error(f"{what} must be a number or a [P, 1] tile, got {_kind(v)}")


def _kind(v) -> str:
    if isinstance(v, HbmView):
        return f"HBM tensor {v.name}{list(v.shape)} (load it into SBUF first)"
    return type(v).__name__


_NUMPY_ALU = {"add": "add", "subtract": "subtract", "multiply": "multiply",
              "divide": "divide", "true_divide": "divide", "maximum": "max",
              "minimum": "min", "power": "pow", "equal": "is_equal",
              "not_equal": "not_equal", "greater": "is_gt", "greater_equal": "is_ge",
              "less": "is_lt", "less_equal": "is_le", "logical_and": "logical_and",
              "logical_or": "logical_or", "logical_xor": "logical_xor",
              "bitwise_and": "bitwise_and", "bitwise_or": "bitwise_or",
              "bitwise_xor": "bitwise_xor", "left_shift": "shift_left",
              "right_shift": "shift_right_logical", "mod": "remainder",
              "remainder": "remainder"}
_NUMPY_FUNC = {"exp": "exp", "log": "log", "tanh": "tanh", "sqrt": "sqrt",
               "square": "square", "abs": "abs", "absolute": "abs", "sign": "sign",
               "sin": "sin", "cos": "cos", "arctan": "arctan", "reciprocal": "reciprocal"}


def _numpy_name(op) -> str | None:
    """numpy ufuncs as ops (`op=np.add`, as older NKI kernels write them)."""
    import numpy as np
    return op.__name__ if isinstance(op, np.ufunc) else None


def _op(t, op, what: str = "op") -> str:
    """An ALU op name from an `nl` op, a numpy ufunc or a string."""
    return _named(t, op, "alu", _NUMPY_ALU, f"{what} ", "an ALU operation (nl.add, "
                  "nl.multiply, nl.maximum, ...)")


def _func(t, op) -> str:
    """An activation function name from an `nl` op, a numpy ufunc or a string."""
    return _named(t, op, "func", _NUMPY_FUNC, "", "an activation function (nl.exp, "
                  "nl.tanh, nl.gelu, nl.copy, ...)")


def _named(t, op, attr: str, numpy_names: dict, what: str, kind: str) -> str:
    """`op`'s name for the ISA: a string as it is, an `nl` op's `attr`, a numpy ufunc's
    entry in `numpy_names`."""
    if _numpy_name(op) is not None:
        op = numpy_names.get(_numpy_name(op), _numpy_name(op))
    name = getattr(op, attr, None) if not isinstance(op, str) else op
    if name is None:
        raise t.error(f"{what}{getattr(op, 'name', op)!r} is not {kind}")
    return name


def _positional(t, fn: str, args: tuple, new: tuple, old: tuple, given: dict) -> dict:
    """Positional arguments in NKI 2.x order (`new`, dst first) or the older order
    (`old`, no dst), after the ones passed by keyword: the order whose remaining
    names the positional count fills (the older one when both do)."""
    if not args:
        return given
    fits = [names for names in (old, new)
            if len([n for n in names if given.get(n) is None]) == len(args)]
    if not fits:
        raise t.error(f"{fn} takes positional ({', '.join(new)}) or ({', '.join(old)}); "
                      "pass the others by keyword")
    out = dict(given)
    for k, v in zip([n for n in fits[0] if given.get(n) is None], args):
        out[k] = v
    return out


def _dst(t, dst, shape, dtype, mem: str = "sbuf") -> TileView:
    if dst is None:
        return t.alloc(shape, dtype, mem)
    if not isinstance(dst, TileView):
        raise t.error(f"dst must be an SBUF/PSUM tile, got {_kind(dst)}")
    return dst


def _emit(t, cls, dst_views: list[TileView], matmul: bool = False, line=None, **fields):
    instr = t.emit(cls, line=line, **fields)
    for v in dst_views:
        if v is not None:
            t.wrote(v, matmul)
    return instr


def _shape_of(v) -> tuple[int, ...]:
    """The [partitions, free...] shape a result of operand `v` takes."""
    return tuple(getattr(v, "phys_shape", None) or v.shape)


def _maskable(fn):
    """NKI's `mask=` (e.g. `mask=(i_p < n)`, tensors.IndexMask): while the instruction's
    operands are made, grid axis 0 cuts the partitions (an HBM view's first axis) and
    axis 1 the last free axis; positions outside an HBM tensor must be masked."""
    import functools

    @functools.wraps(fn)
    def wrapped(*args, mask=None, **kw):
        if mask is None or (isinstance(mask, (bool, np.bool_)) and mask):
            return fn(*args, **kw)            # no mask, or one that keeps everything
        t = trace.current()
        if isinstance(mask, (bool, np.bool_)):          # keeps nothing: not issued
            return kw.get("dst", args[0] if args and isinstance(args[0], TileView) else None)
        if not hasattr(mask, "bounds"):
            raise t.error(f"mask= takes comparisons of index expressions (e.g. i_p < n) "
                          f"or a bool, got {mask!r}")
        with t.masked(mask):
            return fn(*args, **kw)
    return wrapped


# --- TensorE -----------------------------------------------------------------------------

@_maskable
def nc_matmul(*args, dst=None, stationary=None, moving=None, accumulate=None,
              perf_mode=None, precision=None, is_stationary_onezero=False,
              is_moving_onezero=False, is_transpose=False, tile_position=(), tile_size=(),
              name=None):
    """dst[M, N] (+)= stationary[K, M].T @ moving[K, N] on TensorE, FP32 in PSUM (§2.2)."""
    t = trace.current()
    if len(args) == 3:
        dst, stationary, moving = args
    elif len(args) == 2:
        stationary, moving = args
    elif args:
        raise t.error("nc_matmul takes (stationary, moving) or (dst, stationary, moving)")
    if is_transpose:                # v3+: stationary passes through the PE array transposed
        if not t.target.transpose_mode:
            raise t.error(f"is_transpose needs NeuronCore-v3+, not {t.target.name} (§2.2)")
        src = _operand_view(t, stationary, "stationary")
        out = _dst(t, dst, (src.free_size, src.num_partitions), "float32", "psum")
        _emit(t, hw.NcTranspose, [out], True, dst=out.tile(), data=_tile_in(t, src, "data"),
              engine="tensor")
        return out
    if tile_position or tile_size:
        raise t.error("TensorE row/column tiling (tile_position) is not modelled")
    kw = {"perf_mode": perf_mode, "precision": precision}
    if dst is None:
        return MatmulResult(stationary, moving, kw, trace.user_line())
    if not isinstance(dst, TileView) or dst.mem != "psum":
        raise t.error(f"nc_matmul writes PSUM; dst is {_kind(dst) if not isinstance(dst, TileView) else dst}")
    acc = t.accumulates(dst) if accumulate is None else bool(accumulate)
    _matmul(t, dst, stationary, moving, acc, kw)
    return dst


def _matmul(t, dst: TileView, stationary, moving, accumulate: bool, kw: dict,
            line: str | None = None) -> None:
    fields = {}
    if kw.get("perf_mode") not in (None, "none"):
        fields["perf_mode"] = getattr(kw["perf_mode"], "value", kw["perf_mode"])
    if kw.get("precision") is not None:
        fields["precision"] = kw["precision"]
    _emit(t, hw.NcMatmul, [dst], True, line=line, dst=dst.tile(),
          stationary=_tile_in(t, stationary, "stationary"),
          moving=_tile_in(t, moving, "moving"), accumulate=accumulate, **fields)


def accumulate_into(dst: TileView, other) -> TileView:
    """`dst += x`: a matmul (`nisa.nc_matmul(stationary, moving)` without dst) adds into
    `dst` (a new accumulation group where dst holds no sums yet)."""
    t = trace.current()
    if not isinstance(dst, TileView):
        raise t.error(f"`x += matmul`: x must be a PSUM tile, got {_kind(dst)}")
    if other._tile is not None:
        raise t.error("this matmul was already used as a value; write `tile += "
                      "nisa.nc_matmul(...)` directly")
    _matmul(t, dst, other.stationary, other.moving, t.accumulates(dst), other.kw, other.line)
    return dst


@_maskable
def nc_matmul_mx(dst, stationary, moving, stationary_scale, moving_scale, accumulate=None,
                 name=None):
    """MXFP8/MXFP4 matmul with E8M0 block scales on TensorE (NeuronCore-v4, §2.2)."""
    t = trace.current()
    acc = t.accumulates(dst) if accumulate is None else bool(accumulate)
    _emit(t, hw.NcMatmulMx, [dst], True, dst=dst.tile(),
          stationary=_tile_in(t, stationary, "stationary"),
          moving=_tile_in(t, moving, "moving"),
          stationary_scale=_tile_in(t, stationary_scale, "stationary_scale"),
          moving_scale=_tile_in(t, moving_scale, "moving_scale"), accumulate=acc)
    return dst


@_maskable
def nc_transpose(*args, dst=None, data=None, engine=None, name=None):
    """dst[F, P] = data[P, F]: on TensorE (<= 128 x 128, SBUF -> PSUM) or VectorE
    (<= 32 x 32), §6.2. Default engine: VectorE for blocks of at most 32 x 32."""
    t = trace.current()
    a = _positional(t, "nc_transpose", args, ("dst", "data"), ("data",),
                    {"dst": dst, "data": data})
    dst, data = a["dst"], a["data"]
    src = data.materialize() if isinstance(data, MatmulResult) else data
    if not isinstance(src, TileView):
        raise t.error(f"nc_transpose data must be a tile, got {_kind(src)}")
    p, f = src.num_partitions, src.free_size
    if engine is None:
        engine = "vector" if max(p, f) <= t.target.vector_transpose_max else "tensor"
    mem = "psum" if engine == "tensor" else "sbuf"
    out = _dst(t, dst, (f, p), "float32" if engine == "tensor" else src.dtype, mem)
    _emit(t, hw.NcTranspose, [out], engine == "tensor", dst=out.tile(),
          data=_tile_in(t, src, "data"), engine=engine)
    return out


# --- ScalarE / VectorE / GpSimd -----------------------------------------------------------

@_maskable
def activation(*args, dst=None, op=None, data=None, bias=None, scale=1.0, reduce_op=None,
               reduce_res=None, reduce_cmd=None, dtype=None, name=None):
    """dst = op(data * scale + bias) on ScalarE; with `reduce_res` ([P, 1]) also the
    add-reduction of the result along the free axis (§2.4)."""
    t = trace.current()
    a = _positional(t, "activation", args, ("dst", "op", "data"), ("op", "data"),
                    {"dst": dst, "op": op, "data": data})
    dst, op, data = a["dst"], a["op"], a["data"]
    if reduce_op is not None and _op(t, reduce_op, "reduce_op") != "add":
        raise t.error("activation reduces with add only (§2.4)")
    out = _dst(t, dst, _shape_of(data), dtype or _dtype_of(data))
    fields = {"scale": _scalar_in(t, scale, "scale")}
    if bias is not None:
        fields["bias"] = _scalar_in(t, bias, "bias")
    if reduce_res is not None:
        fields["reduce_res"] = reduce_res.tile()
    _emit(t, hw.Activation, [out, reduce_res], dst=out.tile(), data=_tile_in(t, data, "data"),
          func=_func(t, op), **fields)
    return out


@_maskable
def activation_reduce(*args, dst=None, op=None, data=None, reduce_op=None, reduce_res=None,
                      bias=None, scale=1.0, dtype=None, name=None):
    """`activation` with the add-reduction of its result into `reduce_res` ([P, 1])."""
    t = trace.current()
    if reduce_res is None:
        raise t.error("activation_reduce needs reduce_res (a [P, 1] tile)")
    return activation(*args, dst=dst, op=op, data=data, bias=bias, scale=scale,
                      reduce_op=reduce_op, reduce_res=reduce_res, dtype=dtype)


def _dtype_of(v) -> str:
    if isinstance(v, MatmulResult):
        return "float32"
    return v.dtype


@_maskable
def tensor_tensor(*args, dst=None, data1=None, data2=None, op=None, engine=None,
                  dtype=None, name=None):
    """dst = data1 <op> data2 elementwise on VectorE (or GpSimd), §2.3."""
    t = trace.current()
    a = _positional(t, "tensor_tensor", args, ("dst", "data1", "data2", "op"),
                    ("data1", "data2", "op"), {"dst": dst, "data1": data1, "data2": data2,
                                               "op": op})
    dst, data1, data2, op = a["dst"], a["data1"], a["data2"], a["op"]
    out = _dst(t, dst, _shape_of(data1), dtype or _dtype_of(data1))
    _emit(t, hw.TensorTensor, [out], dst=out.tile(), data1=_tile_in(t, data1, "data1"),
          data2=_tile_in(t, data2, "data2"), op=_op(t, op), engine=engine or "vector")
    return out


@_maskable
def tensor_scalar(*args, dst=None, data=None, op0=None, operand0=None, reverse0=False,
                  op1=None, operand1=None, reverse1=False, engine=None, dtype=None,
                  name=None):
    """dst = (data <op0> operand0) <op1> operand1, operands numbers or [P, 1] tiles,
    on VectorE (default), ScalarE or GpSimd (§6.2)."""
    t = trace.current()
    a = _positional(t, "tensor_scalar", args, ("dst", "data", "op0", "operand0"),
                    ("data", "op0", "operand0"), {"dst": dst, "data": data, "op0": op0,
                                                  "operand0": operand0})
    dst, data, op0, operand0 = a["dst"], a["data"], a["op0"], a["operand0"]
    out = _dst(t, dst, _shape_of(data), dtype or _dtype_of(data))
    fields = {}
    if op1 is not None:
        fields = {"op1": _op(t, op1, "op1"), "operand1": _scalar_in(t, operand1, "operand1"),
                  "reverse1": reverse1}
    _emit(t, hw.TensorScalar, [out], dst=out.tile(), data=_tile_in(t, data, "data"),
          op0=_op(t, op0, "op0"), operand0=_scalar_in(t, operand0, "operand0"),
          reverse0=reverse0, engine=engine or "vector", **fields)
    return out


@_maskable
def reciprocal(*args, dst=None, data=None, dtype=None, name=None):
    """dst = 1 / data (VectorE: tensor_scalar, data divided into 1.0)."""
    t = trace.current()
    a = _positional(t, "reciprocal", args, ("dst", "data"), ("data",),
                    {"dst": dst, "data": data})
    return tensor_scalar(dst=a["dst"], data=a["data"], op0="divide", operand0=1.0,
                         reverse0=True, dtype=dtype)


@_maskable
def tensor_scalar_reduce(*, dst=None, data, op0, operand0, reduce_op, reduce_res,
                         reverse0=False, dtype=None, name=None):
    """dst = data <op0> operand0 and reduce_res = reduce<reduce_op>(dst) along the free
    axis: here two VectorE instructions (tensor_scalar, then tensor_reduce)."""
    out = tensor_scalar(dst=dst, data=data, op0=op0, operand0=operand0, reverse0=reverse0,
                        dtype=dtype)
    tensor_reduce(dst=reduce_res, op=reduce_op, data=out, axis=len(out.free))
    return out


@_maskable
def bn_stats(*args, dst=None, data=None, dtype=None, name=None):
    """dst[P, 6] = (count, mean, variance * count) of the even and of the odd elements of
    each partition of data (F <= 512), VectorE (§6.2)."""
    return _statistics(hw.BnStats, "bn_stats", 6, args, dst, data, dtype)


@_maskable
def bn_aggr(*args, dst=None, data=None, dtype=None, name=None):
    """dst[P, 2] = (mean, variance) of one or more bn_stats outputs, VectorE (§6.2)."""
    return _statistics(hw.BnAggr, "bn_aggr", 2, args, dst, data, dtype)


def _statistics(cls, fn: str, width: int, args, dst, data, dtype):
    t = trace.current()
    a = _positional(t, fn, args, ("dst", "data"), ("data",), {"dst": dst, "data": data})
    src = _operand_view(t, a["data"], "data")
    out = _dst(t, a["dst"], (src.num_partitions, width), dtype or "float32")
    _emit(t, cls, [out], dst=out.tile(), data=_tile_in(t, src, "data"))
    return out


def _operand_view(t, v, what: str) -> TileView:
    v = v.materialize() if isinstance(v, MatmulResult) else v
    if not isinstance(v, TileView):
        raise t.error(f"{what} must be a tile, got {_kind(v)}")
    return v


@_maskable
def scalar_tensor_tensor(*, dst=None, data, op0, operand0, op1, operand1, reverse0=False,
                         reverse1=False, dtype=None, name=None):
    """dst = (data <op0> operand0) <op1> operand1, operand1 a tile (VectorE, §6.2)."""
    t = trace.current()
    out = _dst(t, dst, _shape_of(data), dtype or _dtype_of(data))
    _emit(t, hw.ScalarTensorTensor, [out], dst=out.tile(), data=_tile_in(t, data, "data"),
          op0=_op(t, op0, "op0"), operand0=_scalar_in(t, operand0, "operand0"),
          op1=_op(t, op1, "op1"), operand1=_tile_in(t, operand1, "operand1"),
          reverse0=reverse0, reverse1=reverse1)
    return out


@_maskable
def tensor_reduce(*args, dst=None, op=None, data=None, axis=None, negate=False,
                  keepdims=False, engine=None, dtype=None, name=None):
    """dst = reduce<op>(data) over free axes `axis` (VectorE, §2.3)."""
    t = trace.current()
    a = _positional(t, "tensor_reduce", args, ("dst", "op", "data"), ("op", "data"),
                    {"dst": dst, "op": op, "data": data})
    dst, op, data = a["dst"], a["op"], a["data"]
    src = data.materialize() if isinstance(data, MatmulResult) else data
    if not isinstance(src, TileView):
        raise t.error(f"tensor_reduce data must be a tile, got {_kind(src)}")
    nfree = len(src.free)
    axes = (nfree,) if axis is None else ((axis,) if isinstance(axis, int) else tuple(axis))
    if any(a == 0 or a > nfree for a in axes):
        raise t.error(f"tensor_reduce over axes {axes}: free axes 1..{nfree} only "
                      "(across partitions: tensor_partition_reduce)")
    kept = tuple(1 if k + 1 in axes else n for k, n in enumerate(src.free))
    out_free = kept if keepdims else tuple(n for k, n in enumerate(src.free)
                                           if k + 1 not in axes) or (1,)
    out = _dst(t, dst, (src.num_partitions,) + out_free, dtype or src.dtype)
    _emit(t, hw.TensorReduce, [out], dst=out.tile(), data=_tile_in(t, src, "data"),
          op=_op(t, op), axis=tuple(a - 1 - nfree for a in axes), negate=negate,
          engine=engine or "vector")
    return out


@_maskable
def tensor_partition_reduce(*, dst=None, op, data, dtype=None, name=None):
    """dst[1, F] = reduce<op>(data[P, F]) across partitions (GpSimd, §6.2)."""
    t = trace.current()
    out = _dst(t, dst, (1,) + tuple(data.free), dtype or data.dtype)
    _emit(t, hw.TensorPartitionReduce, [out], dst=out.tile(),
          data=_tile_in(t, data, "data"), op=_op(t, op))
    return out


@_maskable
def tensor_copy(*args, dst=None, src=None, engine=None, dtype=None, name=None):
    """dst = src, cast to dst's type (VectorE default, ScalarE or GpSimd)."""
    t = trace.current()
    a = _positional(t, "tensor_copy", args, ("dst", "src"), ("src",),
                    {"dst": dst, "src": src})
    dst, src = a["dst"], a["src"]
    out = _dst(t, dst, _shape_of(src), dtype or _dtype_of(src))
    _emit(t, hw.TensorCopy, [out], dst=out.tile(), src=_tile_in(t, src, "src"),
          engine=engine or "vector")
    return out


@_maskable
def memset(dst, value, engine=None, name=None):
    t = trace.current()
    _emit(t, hw.Memset, [dst], dst=dst.tile(), value=value, engine=engine or "vector")
    return dst


@_maskable
def iota(dst, pattern, offset=0, channel_multiplier=0, name=None):
    """dst[p, i...] = offset + p * channel_multiplier + sum(step_k * i_k), `pattern` the
    (step, num) pairs of the free axes, outermost first (GpSimd, §6.2)."""
    t = trace.current()
    _emit(t, hw.Iota, [dst], dst=dst.tile(), pattern=tuple(tuple(p) for p in pattern),
          offset=offset, channel_multiplier=channel_multiplier)
    return dst


@_maskable
def affine_select(*, dst, pattern, on_true_tile, on_false_value, offset=0,
                  channel_multiplier=0, cmp_op="is_equal", name=None):
    """dst = on_true_tile where cmp_op(offset + p * channel_multiplier + sum(step_k *
    i_k), 0) else on_false_value (GpSimd, §6.2)."""
    t = trace.current()
    _emit(t, hw.AffineSelect, [dst], dst=dst.tile(),
          on_true_tile=_tile_in(t, on_true_tile, "on_true_tile"),
          on_false_value=float(on_false_value), pattern=tuple(tuple(p) for p in pattern),
          offset=offset, channel_multiplier=channel_multiplier,
          cmp_op=_op(t, cmp_op, "cmp_op"))
    return dst


@_maskable
def select(*, dst, pred, on_true, on_false, engine=None, name=None):
    t = trace.current()
    _emit(t, hw.Select, [dst], dst=dst.tile(), pred=_tile_in(t, pred, "pred"),
          on_true=_scalar_in(t, on_true, "on_true"),
          on_false=_scalar_in(t, on_false, "on_false"), engine=engine or "vector")
    return dst


@_maskable
def tensor_tensor_scan(*args, dst=None, data0=None, data1=None, initial=None, op0=None,
                       op1=None, engine=None, dtype=None, name=None):
    """dst[:, i] = (data0[:, i] <op0> dst[:, i-1]) <op1> data1[:, i] (VectorE)."""
    t = trace.current()
    a = _positional(t, "tensor_tensor_scan", args,
                    ("dst", "data0", "data1", "initial", "op0", "op1"),
                    ("data0", "data1", "initial", "op0", "op1"),
                    {"dst": dst, "data0": data0, "data1": data1, "initial": initial,
                     "op0": op0, "op1": op1})
    out = _dst(t, a["dst"], _shape_of(a["data1"]), dtype or _dtype_of(a["data1"]))
    _emit(t, hw.TensorTensorScan, [out], dst=out.tile(),
          data0=_tile_in(t, a["data0"], "data0"), data1=_tile_in(t, a["data1"], "data1"),
          initial=_scalar_in(t, a["initial"], "initial"), op0=_op(t, a["op0"], "op0"),
          op1=_op(t, a["op1"], "op1"), engine=engine or "vector")
    return out


@_maskable
def max8(*, dst, src, name=None):
    """The 8 largest values of each partition, descending (VectorE)."""
    t = trace.current()
    _emit(t, hw.Max8, [dst], dst=dst.tile(), src=_tile_in(t, src, "src"))
    return dst


@_maskable
def nc_find_index8(*, dst, data, vals, name=None):
    """The positions of 8 given values in each partition (VectorE)."""
    t = trace.current()
    _emit(t, hw.FindIndex8, [dst], dst=dst.tile(), data=_tile_in(t, data, "data"),
          vals=_tile_in(t, vals, "vals"))
    return dst


@_maskable
def nc_match_replace8(*, dst, data, vals, imm, dst_idx=None, name=None):
    t = trace.current()
    _emit(t, hw.MatchReplace8, [dst, dst_idx], dst=dst.tile(), data=_tile_in(t, data, "data"),
          vals=_tile_in(t, vals, "vals"), imm=float(imm),
          dst_idx=None if dst_idx is None else dst_idx.tile())
    return dst


@_maskable
def exponential(*, dst, src, max_value=0.0, reduce_res=None, reduce_init=0.0, name=None):
    """dst = exp(src - max_value), reduce_res = its sum (VectorE, NeuronCore-v4)."""
    t = trace.current()
    _emit(t, hw.Exponential, [dst, reduce_res], dst=dst.tile(), src=_tile_in(t, src, "src"),
          max_value=_scalar_in(t, max_value, "max_value"),
          reduce_res=None if reduce_res is None else reduce_res.tile(),
          reduce_init=reduce_init)
    return dst


@_maskable
def quantize_mx(*, dst, src, dst_scale, name=None):
    """MXFP8 x4 data and E8M0 scales of src (VectorE, NeuronCore-v4, §6.2)."""
    t = trace.current()
    _emit(t, hw.QuantizeMx, [dst, dst_scale], dst=dst.tile(), src=_tile_in(t, src, "src"),
          dst_scale=dst_scale.tile())
    return dst


# --- DMA ---------------------------------------------------------------------------------

@_maskable
def dma_copy(*args, dst=None, src=None, queue=None, oob_mode="error", dge_mode=None,
             name=None):
    """dst = src between HBM and SBUF (or HBM<->HBM, SBUF<->SBUF), cast through FP32
    (§3.4). An HBM view indexed by a [P, 1] int32 tile is an indirect access: a gather
    as src, a scatter as dst (software DGE, §3.4)."""
    t = trace.current()
    a = _positional(t, "dma_copy", args, ("dst", "src"), ("dst", "src"),
                    {"dst": dst, "src": src})
    dst, src = a["dst"], a["src"]
    q = t.queue(queue)
    if isinstance(src, HbmView) and src.indices is not None:
        _emit(t, hw.DmaGather, [dst], dst=_side(t, dst, "dst"), src=src.ap(),
              indices=_tile_in(t, src.indices, "indices"), dma_queue=q, oob_mode=oob_mode)
    elif isinstance(dst, HbmView) and dst.indices is not None:
        _emit(t, hw.DmaScatter, [], dst=dst.ap(), src=_side(t, src, "src"),
              indices=_tile_in(t, dst.indices, "indices"), dma_queue=q, oob_mode=oob_mode)
    else:
        if isinstance(src, TileView) and src.mem == "psum":
            raise t.error("a DMA cannot read PSUM (§3.4): copy the tile to SBUF first "
                          "(nl.copy(tile) or nisa.tensor_copy); nl.store does it for you")
        _emit(t, hw.DmaCopy, [dst] if isinstance(dst, TileView) else [],
              dst=_side(t, dst, "dst"), src=_side(t, src, "src", read=True), dma_queue=q)
    return dst


@_maskable
def dma_transpose(*args, dst=None, src=None, queue=None, name=None):
    """dst[B, A] = src[A, B] by the DMA engines, 2- and 4-byte types (NeuronCore-v3+,
    §3.4)."""
    t = trace.current()
    a = _positional(t, "dma_transpose", args, ("dst", "src"), ("dst", "src"),
                    {"dst": dst, "src": src})
    dst, src = a["dst"], a["src"]
    _emit(t, hw.DmaTranspose, [dst] if isinstance(dst, TileView) else [],
          dst=_side(t, dst, "dst"), src=_side(t, src, "src", read=True),
          dma_queue=t.queue(queue))
    return dst


def _side(t, v, what: str, read: bool = False):
    if isinstance(v, HbmView):
        return v.ap()
    if isinstance(v, (TileView, MatmulResult)):
        if read:
            return _tile_in(t, v, what)
        return v.tile()
    raise t.error(f"DMA {what} must be an HBM tensor or an SBUF tile, got "
                  f"{type(v).__name__}")



class nc_version:
    """NeuronCore generations, as `get_nc_version` names them (§6, [NKI-ISA])."""
    gen2, gen3, gen4 = "gen2", "gen3", "gen4"     # Trn1 / Inf2, Trn2, Trn3


def get_nc_version() -> str:
    """The generation the kernel is being traced for: a kernel may choose its schedule
    by it (shapes are traced for gen4 first; the results must not depend on it)."""
    return {"trn1": nc_version.gen2, "trn2": nc_version.gen3,
            "trn3": nc_version.gen4}[trace.current().target.generation]
