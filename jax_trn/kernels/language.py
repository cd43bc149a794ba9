"""`nl`: the kernel language's types, buffers, tensors, loops and operators, named as
NKI's `nki.language` so kernels port by changing imports.

    import jax_trn.kernels.language as nl

    x_sb = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.sbuf)
    acc = nl.zeros((128, 512), dtype=nl.float32, buffer=nl.psum)
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)   # a kernel result
    for i in nl.affine_range(n):       # iterations independent: buffers rotate
        ...

- Buffers: `nl.sbuf`, `nl.psum` (on chip: first axis = partitions, <= 128) and
  `nl.shared_hbm` / `nl.hbm` / `nl.private_hbm` (device memory: the kernel's results,
  or scratch when not returned).
- Loops: `affine_range`, `sequential_range`, `static_range` unroll at trace time; a
  tensor allocated in the body is that iteration's, from a ring of `bufs` buffers
  (`nl.ndarray(..., bufs=3)`; default 2) so consecutive iterations overlap.
- Operators (`nl.add`, `nl.exp`, ...) name ALU ops and activation functions for
  `nisa` calls (`op=nl.add`), and, called on tiles, emit the instruction themselves
  into a new SBUF tile: `nl.exp(x)` is ScalarE `activation`, `nl.add(a, b)` VectorE
  `tensor_tensor` (or `tensor_scalar` with a number), `nl.sum(x, axis=1)` a
  `tensor_reduce`. `nl.load` / `nl.store` are DMAs, `nl.matmul` a TensorE matmul.
"""
from __future__ import annotations

import numbers

import ml_dtypes
import numpy as np

from . import isa as nisa
from . import tensors, trace
from .tensors import AffineIndex, HbmView, TileView, normalize_dtype

# --- element types (§4) -------------------------------------------------------------------
bool_ = np.dtype(np.bool_)
int8, int16, int32 = np.dtype(np.int8), np.dtype(np.int16), np.dtype(np.int32)
uint8, uint16, uint32 = np.dtype(np.uint8), np.dtype(np.uint16), np.dtype(np.uint32)
float16, float32 = np.dtype(np.float16), np.dtype(np.float32)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float8_e4m3 = np.dtype(ml_dtypes.float8_e4m3)
float8_e5m2 = np.dtype(ml_dtypes.float8_e5m2)
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
float8_e8m0fnu = np.dtype(ml_dtypes.float8_e8m0fnu)
float4_e2m1fn = np.dtype(ml_dtypes.float4_e2m1fn)
float8_e4m3fn_x4, float8_e5m2_x4, float4_e2m1fn_x4 = (
    "float8_e4m3fn_x4", "float8_e5m2_x4", "float4_e2m1fn_x4")

# --- buffers ---------------------------------------------------------------------------------
sbuf, psum = "sbuf", "psum"
shared_hbm = hbm = private_hbm = "hbm"


class _TileSize:
    """Tile limits of the core the kernel is traced for (§2.2, §3.1, §3.2), read while
    tracing: `nl.tile_size.gemm_moving_fmax` is 512 on NeuronCore-v2/v3, 4096 on v4."""
    pmax = 128                        # partitions
    psum_fmax = 512                   # FP32 elements of one PSUM bank per partition
    gemm_stationary_fmax = 128        # stationary free size (PE columns)
    bn_stats_fmax = 512               # bn_stats free size (§2.3, [NKI-ISA])

    @property
    def gemm_moving_fmax(self) -> int:
        return trace.current().target.moving_max

    @property
    def total_available_sbuf_size(self) -> int:
        """SBUF bytes per partition a kernel may allocate."""
        return trace.current().target.sbuf_bytes

    @property
    def psum_banks(self) -> int:
        return trace.current().target.psum_banks


tile_size = _TileSize()


# --- tensors ----------------------------------------------------------------------------------

def ndarray(shape, dtype, buffer=sbuf, name: str = "", bufs: int | None = None):
    """A new tensor: on chip (`nl.sbuf`, `nl.psum`; [partitions, free...]) or in HBM."""
    t = trace.current()
    if buffer == "hbm":
        return t.hbm(shape, dtype)
    if hasattr(buffer, "mem") and hasattr(buffer, "offset"):      # compiler.mod_alloc
        return t.place(shape, dtype, buffer, name)
    if buffer not in (sbuf, psum):
        raise t.error(f"unknown buffer {buffer!r} (nl.sbuf, nl.psum, nl.shared_hbm)")
    return t.alloc(shape, dtype, buffer, name, bufs)


def shared_constant(value, dtype=None):
    """An HBM tensor holding `value` (a numpy array) from the start of every call: a
    constant of the program the kernel is in."""
    return trace.current().constant(value, dtype)


def zeros(shape, dtype, buffer=sbuf, name: str = "", bufs: int | None = None):
    """A new tensor of zeros (in PSUM: the start of an accumulation, `+=` matmuls)."""
    t = trace.current()
    out = ndarray(shape, dtype, buffer, name, bufs)
    if buffer == psum:
        t.zeroed(out)
    elif buffer == "hbm":
        raise t.error("nl.zeros in HBM: allocate it and store a zeroed tile into it")
    else:
        nisa.memset(out, 0)
    return out


def full(shape, fill_value, dtype, buffer=sbuf, name: str = "", bufs: int | None = None):
    out = ndarray(shape, dtype, buffer, name, bufs)
    return nisa.memset(out, fill_value)


def ones(shape, dtype, buffer=sbuf, name: str = "", bufs: int | None = None):
    return full(shape, 1, dtype, buffer, name, bufs)


def zeros_like(x, dtype=None, buffer=None, name: str = ""):
    return zeros(x.shape, dtype or x.dtype, buffer or _buffer(x), name)


def empty_like(x, dtype=None, buffer=None, name: str = ""):
    return ndarray(x.shape, dtype or x.dtype, buffer or _buffer(x), name)


def ndarray_like(x, dtype=None, buffer=None, name: str = ""):
    return empty_like(x, dtype, buffer, name)


def _buffer(x) -> str:
    return "hbm" if isinstance(x, HbmView) else x.mem


class _ParDim(int):
    par_dim = True


def par_dim(n: int) -> int:
    """NKI's partition-axis marker: `nl.ndarray((2, nl.par_dim(128), 64), ...)` is two
    [128, 64] tiles side by side (index it `t[i]`); without it the first axis is the
    partition axis."""
    return _ParDim(n)


def ds(start: int, size: int) -> slice:
    """NKI's dynamic slice: `t[nl.ds(i * 128, 128), :]`."""
    return slice(start, start + size)


class fp32:
    """FP32 constants NKI names."""
    min = float(np.finfo(np.float32).min)
    max = float(np.finfo(np.float32).max)


# --- index expressions ----------------------------------------------------------------------------

def arange(*args) -> AffineIndex:
    """`nl.arange(n)` (or start, stop[, step]): an index expression over one axis;
    `nl.arange(128)[:, None]` on a grid's first axis, `[None, :]` its second."""
    r = range(*args)
    return AffineIndex(r.start, ((0, r.step, len(r)),), 1)


class _MGrid:
    """`nl.mgrid[0:128, 0:512]`: one index expression per axis of a grid."""

    def __getitem__(self, index):
        index = index if isinstance(index, tuple) else (index,)
        out = []
        for k, sl in enumerate(index):
            r = range(sl.start or 0, sl.stop, sl.step or 1)
            out.append(AffineIndex(r.start, ((k, r.step, len(r)),), len(index)))
        return tuple(out) if len(out) > 1 else out[0]


mgrid = _MGrid()


# --- loops -------------------------------------------------------------------------------------

def affine_range(*args, directives=None):
    """range(*args) whose iterations are independent (no loop-carried dependency)."""
    return trace.current().loop("affine", range(*args))


def sequential_range(*args, directives=None):
    """range(*args) whose iterations depend on each other (e.g. an accumulation)."""
    return trace.current().loop("sequential", range(*args))


def static_range(*args, directives=None):
    """range(*args), unrolled (as every loop here is)."""
    return trace.current().loop("static", range(*args))


def program_id(axis: int = 0) -> int:
    """This instance's index along `axis` of the launch grid (`kernel[gx, gy](...)`)."""
    return trace.current().program_id(axis)


def num_programs(axis: int = 0) -> int:
    return trace.current().num_programs(axis)


def device_print(prefix: str, x) -> None:
    """Not modelled (the simulator has no device printf): a no-op, as on a host trace."""


# --- data movement -------------------------------------------------------------------------------

def load(src: HbmView, dtype=None, mask=None, name: str = ""):
    """A new SBUF tile holding `src` (an HBM view whose first axis goes on partitions),
    cast to `dtype`."""
    t = trace.current()
    if not isinstance(src, HbmView):
        raise t.error(f"nl.load takes an HBM tensor view, got {type(src).__name__}")
    shape = src.shape if len(src.shape) >= 2 else (src.shape[0] if src.shape else 1, 1)
    out = t.alloc(shape, normalize_dtype(dtype or src.dtype), sbuf, name)
    return nisa.dma_copy(dst=out, src=src, mask=mask)


def store(dst: HbmView, value, mask=None):
    """Writes tile `value` to HBM view `dst` (a PSUM tile or a matmul goes through an
    SBUF copy first: DMA does not read PSUM, §3.4)."""
    if isinstance(value, nisa.MatmulResult) or (isinstance(value, TileView)
                                                 and value.mem == psum):
        value = nisa.tensor_copy(src=value, dtype=dst.dtype, mask=mask)
    return nisa.dma_copy(dst=dst, src=value, mask=mask)


def load_transpose2d(src: HbmView, dtype=None):
    """A new SBUF tile holding src[A, B] transposed to [B, A], by DMA (NeuronCore-v3+)."""
    t = trace.current()
    out = t.alloc((src.shape[1], src.shape[0]), normalize_dtype(dtype or src.dtype), sbuf)
    return nisa.dma_transpose(dst=out, src=src)


def _copy(x, dtype=None, mask=None, name: str = ""):
    """A new SBUF copy of tile `x` (PSUM evacuation), cast to `dtype`."""
    return nisa.tensor_copy(src=x, dtype=normalize_dtype(dtype) if dtype else None,
                            mask=mask)


def matmul(x, y, transpose_x: bool = False):
    """x @ y on TensorE into a new PSUM tile: `x` [K, M] when `transpose_x` (the
    contraction on partitions, as TensorE reads it), else [M, K] (transposed first on
    TensorE, an extra instruction and PSUM evacuation)."""
    if not transpose_x:
        xt = nisa.nc_transpose(data=x, engine="tensor")
        x = nisa.tensor_copy(src=xt, dtype=normalize_dtype(x.dtype))
    return nisa.nc_matmul(x, y)       # emitted where used: `acc += ...` or as a value


def transpose(x, dtype=None):
    """x[P, F] -> [F, P] into a new SBUF tile (TensorE, or VectorE for <= 32 x 32)."""
    out = nisa.nc_transpose(data=x)
    if out.mem == psum:
        out = nisa.tensor_copy(src=out, dtype=normalize_dtype(dtype or x.dtype))
    return out


# --- operators --------------------------------------------------------------------------------------

class _Op:
    """An `nl` operator: names an ALU op (`alu`) and/or an activation function (`func`)
    for nisa calls; called on tiles, emits one instruction into a new SBUF tile."""

    def __init__(self, name: str, alu: str | None = None, func: str | None = None):
        self.name, self.alu, self.func = name, alu, func

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def __call__(self, x, y=None, dtype=None, mask=None, **kw):
        dtype = normalize_dtype(dtype) if dtype is not None else None
        if y is None and self.func is not None:
            return nisa.activation(op=self, data=x, dtype=dtype, mask=mask, **kw)
        if self.alu is None:
            raise trace.current().error(f"nl.{self.name} takes one operand")
        return _arith(self.alu, x, y, dtype=dtype, mask=mask)


def _arith(op: str, x, y, into=None, dtype=None, mask=None):
    """x <op> y elementwise into a new SBUF tile (or `into`): VectorE tensor_tensor, or
    tensor_scalar when one side is a number or a per-partition [P, 1] column."""
    if isinstance(into, TileView) and isinstance(y, nisa.MatmulResult) and op == "add":
        return nisa.accumulate_into(into, y)          # psum_tile += nc_matmul(...)
    x, y = _operand(x), _operand(y)
    if isinstance(y, numbers.Number) or _column(y, x):
        return nisa.tensor_scalar(dst=into, data=x, op0=op, operand0=_col(y), dtype=dtype,
                                  mask=mask)
    if isinstance(x, numbers.Number) or _column(x, y):
        return nisa.tensor_scalar(dst=into, data=y, op0=op, operand0=_col(x), reverse0=True,
                                  dtype=dtype, mask=mask)
    return nisa.tensor_tensor(dst=into, data1=x, data2=y, op=op, dtype=dtype, mask=mask)


class _Column:
    """A [P, 1] tile broadcast along the free axis (`t.broadcast_to((P, F))`): read as
    a per-partition operand (tensor_scalar)."""

    def __init__(self, view: TileView, shape):
        self.view, self.shape = view, tuple(shape)
        self.free_size = int(np.prod(self.shape[1:]))


def _operand(v):
    return v.materialize() if isinstance(v, nisa.MatmulResult) else v


def _column(c, other) -> bool:
    if isinstance(c, _Column):
        return True
    return (isinstance(c, TileView) and isinstance(other, TileView) and c.free_size == 1
            and other.free_size != 1)


def _col(v):
    return v.view if isinstance(v, _Column) else v


def _assign(dst: TileView, value) -> None:
    """`dst[...] = value` (tensors.TileView.__setitem__)."""
    t = trace.current()
    if isinstance(value, numbers.Number):
        nisa.memset(dst, value)
    elif isinstance(value, HbmView):
        nisa.dma_copy(dst=dst, src=value)
    elif isinstance(value, nisa.MatmulResult) and value._tile is None:
        nisa.nc_matmul(dst=dst, stationary=value.stationary, moving=value.moving,
                       accumulate=False)
    elif isinstance(value, (TileView, nisa.MatmulResult, _Column)):
        src = _col(_operand(value))
        if not t.retarget(src, dst):
            nisa.tensor_copy(dst=dst, src=src)
    else:
        raise t.error(f"tile[...] = {type(value).__name__}: assign a tile, an HBM view, a "
                      "matmul or a number")


def _broadcast(view: TileView, shape):
    """`tile.broadcast_to(shape)` (tensors.TileView.broadcast_to)."""
    t = trace.current()
    shape = tuple(int(d) for d in shape)
    p, free = view.num_partitions, view.free_size
    if len(shape) < 2 or not (shape[0] == p or (p == 1 and shape[0] <= t.target.partitions)) \
            or (free != 1 and int(np.prod(shape[1:])) != free):
        raise t.error(f"cannot broadcast tile {view.shape} to {shape}: [P, 1] -> [P, F] and "
                      "[1, F] -> [P, F]")
    if shape[0] != p:                   # [1, F] -> [P, F]: ones[1, P].T @ row[1, F]
        ones = t.alloc((1, shape[0]), view.dtype, sbuf)
        nisa.memset(ones, 1.0)
        out = t.alloc((shape[0], free), view.dtype, sbuf)
        for c0 in range(0, free, 512):
            c1 = c0 + 512 if c0 + 512 < free else free     # (nl.min shadows min)
            ps = t.alloc((shape[0], c1 - c0), "float32", psum)
            nisa.nc_matmul(dst=ps, stationary=ones, moving=view.reshape(
                (1, free))[:, c0:c1], accumulate=False)
            nisa.tensor_copy(dst=out[:, c0:c1], src=ps)
        view = out
    if int(np.prod(shape[1:])) != view.free_size:
        return _Column(view, shape)
    return view.reshape(shape) if view.shape != shape else view


tensors._ARITH = _arith
tensors._ASSIGN = _assign
tensors._BROADCAST = _broadcast


def _ops(names: dict) -> dict:
    return {k: _Op(k, *v) for k, v in names.items()}


_ALL = _ops({
    # ALU operations (VectorE / GpSimd / ScalarE tensor_scalar), §6.2
    "add": ("add", None), "subtract": ("subtract", None), "multiply": ("multiply", None),
    "divide": ("divide", None), "maximum": ("max", None), "minimum": ("min", None),
    "power": ("pow", None), "mod": ("remainder", None), "fmod": ("remainder", None),
    "equal": ("is_equal", None), "not_equal": ("not_equal", None),
    "greater": ("is_gt", None), "greater_equal": ("is_ge", None),
    "less": ("is_lt", None), "less_equal": ("is_le", None),
    "logical_and": ("logical_and", None), "logical_or": ("logical_or", None),
    "logical_xor": ("logical_xor", None),
    "bitwise_and": ("bitwise_and", None), "bitwise_or": ("bitwise_or", None),
    "bitwise_xor": ("bitwise_xor", None), "left_shift": ("shift_left", None),
    "right_shift": ("shift_right_logical", None),
    # activation functions (ScalarE), §2.4
    "exp": (None, "exp"), "log": (None, "log"), "tanh": (None, "tanh"),
    "sigmoid": (None, "sigmoid"), "relu": (None, "relu"), "gelu": (None, "gelu"),
    "gelu_apprx_tanh": (None, "gelu_apprx_tanh"), "silu": (None, "silu"),
    "softplus": (None, "softplus"), "mish": (None, "mish"), "sqrt": (None, "sqrt"),
    "rsqrt": (None, "rsqrt"), "reciprocal": (None, "reciprocal"), "square": (None, "square"),
    "sign": (None, "sign"), "erf": (None, "erf"), "sin": (None, "sin"), "cos": (None, "cos"),
    "arctan": (None, "arctan"), "identity": (None, "identity"),
    "abs": ("abs_max", "abs"),
})
globals().update(_ALL)
class _CopyOp(_Op):
    """`nl.copy(x)` makes an SBUF copy; `op=nl.copy` names the identity activation."""

    def __call__(self, x, dtype=None, mask=None, name: str = ""):
        return _copy(x, dtype, mask, name)


copy = _CopyOp("copy", None, "copy")


class _Reduce:
    def __init__(self, name: str, op: str):
        self.name, self.alu = name, op

    def __repr__(self) -> str:
        return f"nl.{self.name}"

    def __call__(self, x, axis, dtype=None, keepdims: bool = False):
        return nisa.tensor_reduce(op=self.alu, data=x, axis=axis, keepdims=keepdims,
                                  dtype=normalize_dtype(dtype) if dtype else None)


sum = _Reduce("sum", "add")               # noqa: A001 (NKI's names)
max = _Reduce("max", "max")               # noqa: A001
min = _Reduce("min", "min")               # noqa: A001
prod = _Reduce("prod", "multiply")


def mean(x, axis, dtype=None, keepdims: bool = False):
    total = sum(x, axis, dtype=float32, keepdims=keepdims)
    n = 1
    for a in ((axis,) if isinstance(axis, int) else axis):
        n *= x.shape[a]
    return nisa.tensor_scalar(dst=total, data=total, op0=multiply, operand0=1.0 / n)


def where(cond, x, y, dtype=None):
    """x where cond != 0 else y, elementwise (VectorE select)."""
    out = trace.current().alloc(cond.shape, normalize_dtype(dtype or _dt(x, y)), sbuf)
    return nisa.select(dst=out, pred=cond, on_true=x, on_false=y)


def _dt(x, y):
    for v in (x, y):
        if isinstance(v, TileView):
            return v.dtype
    return "float32"
