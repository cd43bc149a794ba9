"""complex-planes: every complex value becomes a pair of real planes (real, imaginary).

The hardware has no complex type (trainium-hardware.md §4). As XLA does for targets
without native complex, this pass rewrites every complex value and op of the
per-device IR into real ops on pairs (complex64 -> two float32 values, complex128 ->
two float64 values), so the passes after it, the lowering and the hardware model see
only reals. It runs after `localize` (collectives on complex values are split here
too) and before `split-reductions` (which splits the two-plane reductions it leaves).

    op kind                              becomes
    add, subtract, negate, select,       the same op on each plane
    movement (reshape, transpose, slice, broadcast_in_dim, concatenate, pad, gather,
    dynamic_slice, dynamic_update_slice, reverse, copy), collectives (all_gather,
    all_to_all, collective_permute), sharding constraints
    multiply, divide, power, exp, log,   real formulas (hlo_passes.complex_math)
    sqrt, sin, cos, tan, tanh, ...
    abs, real, imag, complex, convert    one plane / both planes
    compare EQ / NE                      both planes compared, and / or
    dot_general, convolution             4 real ones (bilinear; `GAUSS` chooses 3)
    fft                                  DFT matmuls (hlo_passes.complex_fft)
    constant, iota                       two constants / iota and zeros
    reduce, reduce_window (sums), while, case, sort, optimization_barrier
                                         operands, results, block arguments and
                                         terminators flattened: each complex value
                                         is two values in its place (a complex
                                         product: a tree of complex multiplies)
    scatter, all_reduce, reduce_scatter  one op per plane (a sum or a replace combiner;
                                         a scatter-multiply: hlo_passes.complex_scatter)

The program's parameters and results stay complex at the PJRT boundary: a complex64
parameter of shape S becomes a float32 parameter of shape S + (2,), the same bytes
(interleaved real, imaginary), split into planes by one `trn.deinterleave` op; a
complex result is one `trn.interleave` of its planes (both lowered in
jax_trn/lower/planes.py: contiguous DMAs, a strided on-chip copy). `Module.attrs[BOUNDARY]`
keeps the complex signature `(param types, result types)` for the runtime, whose
buffers hold complex64 data and bind it to the program as float32 (same bytes).

An op on complex values that none of the rules above covers fails with an error naming
the op, its types and its source location.
"""
from __future__ import annotations

import numpy as np

from hlo_passes import complex_fft, complex_math, complex_scatter
from hlo_passes import ir
from hlo_passes.complex_math import PART, Builder, Planes, is_complex
from hlo_passes.errors import HloImportError

name = "complex-planes"
BOUNDARY = "trn.complex_boundary"
GAUSS = False            # 3-matmul complex dot_general (see _dot_general)

PLANEWISE = frozenset({
        "add", "subtract", "negate", "select", "reshape", "transpose", "broadcast_in_dim",
        "slice", "reverse", "copy", "dynamic_slice", "dynamic_update_slice", "concatenate",
        "pad", "gather", "all_gather", "all_to_all", "collective_permute",
        "collective_broadcast", "sdy.sharding_constraint"})
FLATTENED = frozenset({"while", "case", "optimization_barrier"})
PER_PLANE_REGION = frozenset({"scatter", "all_reduce", "reduce_scatter"})
RETURNS = ("return", "func.return")


def run(module: ir.Module) -> bool:
    if not any(_has_complex_fn(fn) for fn in module.functions.values()):
        return False
    for fn in module.functions.values():
        if fn is module.main:
            _Rewriter().main(module, fn)
        elif _has_complex_fn(fn):
            if any(is_complex(t.dtype) for t in (*[a.type for a in fn.args],
                                                 *fn.result_types)):
                raise HloImportError(f"function {fn.name} takes or returns complex values "
                                     "(only the entry function may)")
            _Rewriter().block(fn.body)
    return True


def part_type(t: ir.TensorType) -> ir.TensorType:
    return ir.TensorType(t.shape, PART.get(t.dtype, t.dtype))


def storage_type(t: ir.TensorType) -> ir.TensorType:
    """The real type of a complex parameter's or result's bytes: shape + (2,)."""
    return ir.TensorType(t.shape + (2,), PART[t.dtype]) if is_complex(t.dtype) else t


class _Rewriter:
    def __init__(self):
        self.planes: dict[ir.Value, Planes] = {}

    # --- values ----------------------------------------------------------------------

    def get(self, v: ir.Value) -> Planes:
        return self.planes[v]

    def flat(self, values) -> list[ir.Value]:
        out: list[ir.Value] = []
        for v in values:
            out.extend(self.planes[v] if is_complex(v.dtype) else (v,))
        return out

    def split_arg(self, v: ir.Value) -> list[ir.Value]:
        """Fresh real block arguments for `v` (two if complex)."""
        if not is_complex(v.dtype):
            return [v]
        pair = (ir.Value(part_type(v.type)), ir.Value(part_type(v.type)))
        self.planes[v] = pair
        return list(pair)

    # --- blocks ----------------------------------------------------------------------

    def main(self, module: ir.Module, fn: ir.Function) -> None:
        params = [a.type for a in fn.args]
        results = list(fn.result_types)
        ops: list[ir.Op] = []
        args = []
        for a in fn.args:
            if is_complex(a.dtype):
                stored = ir.Value(storage_type(a.type))
                self.planes[a] = _unstack(Builder(ops), stored, a.shape)
                args.append(stored)
            else:
                args.append(a)
        self.block(fn.body, prefix=ops, boundary=True)
        fn.args = fn.body.args = args
        fn.result_types = [storage_type(t) for t in results]
        if any(is_complex(t.dtype) for t in (*params, *results)):
            module.attrs[BOUNDARY] = (tuple(params), tuple(results))

    def block(self, block: ir.Block, prefix=(), boundary: bool = False) -> None:
        ops: list[ir.Op] = list(prefix)
        self.replaced: dict[ir.Value, ir.Value] = {}
        for op in block.ops:
            op.operands = [self.replaced.get(v, v) for v in op.operands]
            if op.kind in RETURNS:
                self._return(op, ops, boundary)
            elif not _has_complex_op(op):
                ops.append(op)
            else:
                self._rewrite(op, ops)
        block.ops = ops
        if self.replaced:
            block.replace_all_uses(self.replaced)

    def _return(self, op: ir.Op, ops: list[ir.Op], boundary: bool) -> None:
        if not boundary:
            ops.append(op.replace(operands=self.flat(op.operands)))
            return
        b = Builder(ops, op.loc, op.name)
        vals = [_stack(b, self.get(v)) if is_complex(v.dtype) else v for v in op.operands]
        ops.append(op.replace(operands=vals))

    def _nested(self, op: ir.Op) -> None:
        """Rewrites the blocks of `op`'s regions, their arguments flattened."""
        saved = getattr(self, "replaced", {})
        for region in op.regions:
            for blk in region.blocks:
                blk.args = [n for a in blk.args for n in self.split_arg(a)]
                self.block(blk)
        self.replaced = saved

    def _rewrite(self, op: ir.Op, ops: list[ir.Op]) -> None:
        b = Builder(ops, op.loc, op.name)
        rule = _rule(op)
        if rule is None:
            raise HloImportError(f"complex numbers are not supported in {op.describe()}")
        out = rule(self, b, op)
        if out is None:
            return
        if len(op.results) == 1:
            out = [out]
        for r, new in zip(op.results, out):
            if is_complex(r.dtype):
                self.planes[r] = new
            else:
                self.replaced[r] = new


# --- rules: (rewriter, builder, op) -> one entry per result (planes or a real value) ----


def _planewise(rw: _Rewriter, b: Builder, op: ir.Op):
    r = op.result
    t = part_type(r.type)
    return tuple(
        b.emit_op(op.kind, [rw.get(v)[p] if is_complex(v.dtype) else v for v in op.operands],
                  [t], op.attrs).result
        for p in (0, 1))


def _flattened(rw: _Rewriter, b: Builder, op: ir.Op):
    rw._nested(op)
    types = [t for r in op.results for t in
             ((part_type(r.type),) * 2 if is_complex(r.dtype) else (r.type,))]
    new = b.emit_op(op.kind, rw.flat(op.operands), types, op.attrs, op.regions).results
    it, out = iter(new), []
    for r in op.results:
        out.append((next(it), next(it)) if is_complex(r.dtype) else next(it))
    return out if len(op.results) != 1 else out[0]


def _sort(rw: _Rewriter, b: Builder, op: ir.Op):
    """Comparator arguments come in pairs per operand (lhs_i, rhs_i): a complex operand
    gives (lhs_re, rhs_re, lhs_im, rhs_im), in the order of its flattened planes."""
    blk = op.regions[0].block
    args = []
    for lhs, rhs in zip(blk.args[0::2], blk.args[1::2]):
        if is_complex(lhs.dtype):
            lr, li = rw.split_arg(lhs)
            rr, ri = rw.split_arg(rhs)
            args += [lr, rr, li, ri]
        else:
            args += [lhs, rhs]
    blk.args = args
    saved = rw.replaced
    rw.block(blk)
    rw.replaced = saved
    types = [t for r in op.results for t in
             ((part_type(r.type),) * 2 if is_complex(r.dtype) else (r.type,))]
    new = b.emit_op("sort", rw.flat(op.operands), types, op.attrs, op.regions).results
    it, out = iter(new), []
    for r in op.results:
        out.append((next(it), next(it)) if is_complex(r.dtype) else next(it))
    return out if len(op.results) != 1 else out[0]


def _per_plane_region(rw: _Rewriter, b: Builder, op: ir.Op):
    """scatter / all_reduce / reduce_scatter of one complex operand whose combiner is a
    sum or a replace: the same op on each plane, with a real combiner."""
    if len(op.results) != 1 or not is_complex(op.result.dtype):
        raise HloImportError(f"complex numbers are not supported in {op.describe()} "
                             "(one complex operand and result only)")
    if op.kind == "scatter" and complex_scatter.is_multiply(op):
        return complex_scatter.multiply([rw.get(op.operands[0]), rw.get(op.operands[2])],
                                        b, op)
    body = _real_body(op)
    t = part_type(op.result.type)
    out = []
    for p in (0, 1):
        operands = [rw.get(v)[p] if is_complex(v.dtype) else v for v in op.operands]
        out.append(b.emit_op(op.kind, operands, [t], op.attrs, [body()]).result)
    return tuple(out)


def _real_body(op: ir.Op):
    """A factory of fresh real combiners equal to `op`'s complex one (add, or return
    of its second argument), else an error."""
    blk = op.regions[0].block
    kinds = [o.kind for o in blk.ops]
    ret = blk.terminator
    dtype = PART[blk.args[0].dtype]
    if kinds[:-1] == ["add"] and blk.ops[0].operands == blk.args[:2]:
        kind = "add"
    elif kinds[:-1] == [] and ret.operands[0] is blk.args[1]:
        kind = None
    else:
        raise HloImportError(f"complex {op.kind} with the combiner {kinds} is not "
                             f"supported ({op.describe()})")

    def make() -> ir.Region:
        args = [ir.Value(ir.TensorType((), dtype)) for _ in range(2)]
        ops = []
        val = args[1]
        if kind == "add":
            ops.append(ir.Op("add", list(args), [ir.Value(ir.TensorType((), dtype))]))
            val = ops[0].result
        ops.append(ir.Op(ret.kind, [val], []))
        return ir.Region([ir.Block(args, ops)])
    return make


def _reduce(rw: _Rewriter, b: Builder, op: ir.Op):
    """A complex product (the body multiplies its arguments) is a tree of complex
    multiplies of halves over the reduced elements, then the init; any other reduce
    is flattened (a sum's two planes are then split by `split-reductions`)."""
    blk = op.regions[0].block
    kinds = [o.kind for o in blk.ops]
    if (len(op.operands) != 2 or kinds != ["multiply", blk.terminator.kind]
            or not is_complex(op.operands[0].dtype)):
        return _flattened(rw, b, op)
    x, init = op.operands
    dims = tuple(op.attrs.get("dimensions", ()))
    keep = tuple(i for i in range(len(x.shape)) if i not in dims)
    kept = tuple(x.shape[i] for i in keep)
    size = int(np.prod([x.shape[i] for i in dims], dtype=np.int64))
    perm = keep + dims
    z = tuple(b.emit("reshape", [b.emit("transpose", [p], tuple(x.shape[i] for i in perm),
                                        p.dtype, permutation=perm)],
                     kept + (size,), p.dtype) for p in rw.get(x))
    while z[0].shape[-1] > 1:
        n = z[0].shape[-1]
        h = n // 2
        lo, hi, tail = ([_slice_last(b, p, a, c) for p in z] for a, c in
                        ((0, h), (h, 2 * h), (2 * h, n)))
        z = complex_math.mul(b, tuple(lo), tuple(hi))
        if n % 2:
            z = tuple(b.emit("concatenate", [p, t], kept + (h + 1,), p.dtype,
                             dimension=len(kept)) for p, t in zip(z, tail))
    init_planes = tuple(b.emit("broadcast_in_dim", [p], kept, p.dtype, broadcast_dimensions=())
                        for p in rw.get(init))
    if size == 0:
        return init_planes
    z = tuple(b.emit("reshape", [p], kept, p.dtype) for p in z)
    return complex_math.mul(b, init_planes, z)


def _slice_last(b: Builder, x: ir.Value, lo: int, hi: int) -> ir.Value:
    r = len(x.shape)
    return b.emit("slice", [x], x.shape[:-1] + (hi - lo,), x.dtype,
                  start_indices=(0,) * (r - 1) + (lo,), limit_indices=x.shape[:-1] + (hi,),
                  strides=(1,) * r)


def _reduce_window(rw: _Rewriter, b: Builder, op: ir.Op):
    """A complex window sum (cumsum, sum pooling): two planes, split afterwards by
    `split-reductions`; other combiners (a cumulative product) are refused."""
    kinds = [o.kind for o in op.regions[0].block.ops]
    if kinds[:-1] != ["add"]:
        raise HloImportError(f"complex reduce_window with the combiner {kinds} is not "
                             f"supported ({op.describe()})")
    return _flattened(rw, b, op)


def _unary_math(rw, b, op):
    return complex_math.UNARY[op.kind](b, rw.get(op.operands[0]))


def _binary_math(rw, b, op):
    x, y = op.operands
    return complex_math.BINARY[op.kind](b, rw.get(x), rw.get(y))


def _abs(rw, b, op):
    return complex_math.abs_(b, rw.get(op.operands[0]))


def _real(rw, b, op):
    return rw.get(op.operands[0])[0]


def _imag(rw, b, op):
    return rw.get(op.operands[0])[1]


def _complex(rw, b, op):
    return tuple(op.operands)


def _convert(rw, b, op):
    x, r = op.operands[0], op.result
    if is_complex(x.dtype) and is_complex(r.dtype):
        return tuple(_convert_to(b, p, PART[r.dtype]) for p in rw.get(x))
    if is_complex(r.dtype):
        re = _convert_to(b, x, PART[r.dtype])
        return re, b.const(0.0, re)
    return _convert_to(b, rw.get(x)[0], r.dtype)        # complex -> real drops imag


def _convert_to(b: Builder, x: ir.Value, dtype: str) -> ir.Value:
    return x if x.dtype == dtype else b.emit("convert", [x], x.shape, dtype)


def _compare(rw, b, op):
    direction = op.attrs.get("comparison_direction")
    if direction not in ("EQ", "NE"):
        raise HloImportError(f"complex compare {direction} is not defined ({op.describe()})")
    (x, y), (u, v) = (rw.get(o) for o in op.operands)
    re, im = b.compare(x, u, direction), b.compare(y, v, direction)
    return b.emit("and" if direction == "EQ" else "or", [re, im], re.shape, "bool")


def _constant(rw, b, op):
    value = np.asarray(op.attrs["value"]).reshape(op.result.shape)   # complex scalars: [1]
    part = PART[op.result.dtype]
    return b.array(value.real, part), b.array(value.imag, part)


def _iota(rw, b, op):
    t = part_type(op.result.type)
    re = b.emit_op("iota", [], [t], op.attrs).result
    return re, b.const(0.0, re)


def _dot_general(rw, b, op):
    """(a + ib)(c + id): 4 real matmuls (ac - bd, ad + bc), or Gauss's 3 with
    `GAUSS` (ac - bd, (a+b)(c+d) - ac - bd). Measured (benchmarks/complex_matmul.py,
    Trn2 core, n x n x n): Gauss is slower at 256 and 512 (70 vs 58 us, 175 vs 156 us
    at HIGHEST; 81 vs 73, 175 vs 150 us under bf16 auto-cast: the two extra operand
    sums cost more than the matmul saved), even at 1024 (723 vs 731 us HIGHEST, 526
    vs 451 us bf16), and its cancellation raises the bf16 error from 2.3e-3 to 3.9e-3
    of max |result|. So 4 matmuls, as XLA's CPU backend does."""
    x, y = op.operands
    t = part_type(op.result.type)

    def dot(p, q):
        return b.emit_op(op.kind, [p, q], [t], op.attrs).result
    if not is_complex(x.dtype):
        return tuple(dot(x, q) for q in rw.get(y))
    if not is_complex(y.dtype):
        return tuple(dot(p, y) for p in rw.get(x))
    (a, bi), (c, d) = rw.get(x), rw.get(y)
    ac, bd = dot(a, c), dot(bi, d)
    if GAUSS:
        s = dot(b.add(a, bi), b.add(c, d))
        return b.sub(ac, bd), b.sub(b.sub(s, ac), bd)
    return b.sub(ac, bd), b.add(dot(a, d), dot(bi, c))


def _fft(rw, b, op):
    x = op.operands[0]
    src = rw.get(x) if is_complex(x.dtype) else x
    return complex_fft.fft(b, src, op.attrs.get("fft_type", "FFT"),
                           tuple(op.attrs.get("fft_length", ())))


RULES = {"abs": _abs, "real": _real, "imag": _imag, "complex": _complex, "convert": _convert,
         "compare": _compare, "constant": _constant, "iota": _iota, "fft": _fft,
         "dot_general": _dot_general, "convolution": _dot_general, "sort": _sort,
         "reduce": _reduce, "reduce_window": _reduce_window}
RULES.update({k: _planewise for k in PLANEWISE})
RULES.update({k: _flattened for k in FLATTENED})
RULES.update({k: _per_plane_region for k in PER_PLANE_REGION})
RULES.update({k: _unary_math for k in complex_math.UNARY})
RULES.update({k: _binary_math for k in complex_math.BINARY})


def _rule(op: ir.Op):
    return RULES.get(op.kind)


# --- the boundary ----------------------------------------------------------------------


def _unstack(b: Builder, stored: ir.Value, shape) -> Planes:
    """float32[S, 2] (interleaved) -> (re[S], im[S]): one `trn.deinterleave`
    (jax_trn/lower/planes.py: contiguous DMAs, the shuffle on chip)."""
    t = ir.TensorType(tuple(shape), stored.dtype)
    re, im = b.emit_op("trn.deinterleave", [stored], [t, t]).results
    return re, im


def _stack(b: Builder, z: Planes) -> ir.Value:
    """(re[S], im[S]) -> float32[S, 2] (interleaved): one `trn.interleave`."""
    return b.emit("trn.interleave", list(z), z[0].shape + (2,), z[0].dtype)


# --- where complex values are ----------------------------------------------------------


def _has_complex_op(op: ir.Op) -> bool:
    if any(is_complex(v.dtype) for v in (*op.operands, *op.results)):
        return True
    return any(_has_complex_block(blk) for region in op.regions for blk in region.blocks)


def _has_complex_block(block: ir.Block) -> bool:
    return (any(is_complex(a.dtype) for a in block.args)
            or any(_has_complex_op(op) for op in block.ops))


def _has_complex_fn(fn: ir.Function) -> bool:
    return (any(is_complex(a.dtype) for a in fn.args)
            or any(is_complex(t.dtype) for t in fn.result_types)
            or _has_complex_block(fn.body))
