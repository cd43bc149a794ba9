"""A tiny builder of IR functions for lowering tests (no importer needed)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hlo_passes import ir


class FnBuilder:
    """Appends ops to one function body: `b.op("add", [x, y], x.shape, x.dtype)`."""

    def __init__(self, loc: str = "test.py:1"):
        self.args: list[ir.Value] = []
        self.ops: list[ir.Op] = []
        self.loc = loc

    def arg(self, shape: Sequence[int], dtype: str = "float32") -> ir.Value:
        v = ir.Value(ir.TensorType(tuple(shape), dtype), f"arg{len(self.args)}")
        self.args.append(v)
        return v

    def op(self, kind: str, operands, shape, dtype, regions=(), **attrs) -> ir.Value:
        res = ir.Value(ir.TensorType(tuple(shape), dtype))
        self.ops.append(ir.Op(kind, list(operands), [res], dict(attrs), list(regions),
                              loc=self.loc))
        return res

    def const(self, value, dtype: str = "float32") -> ir.Value:
        value = np.asarray(value, ir.np_dtype(dtype))
        return self.op("constant", [], value.shape, dtype, value=value)

    def ret(self, *values: ir.Value) -> ir.Module:
        body = ir.Block([], [*self.ops, ir.Op("return", list(values), [])])
        fn = ir.Function("main", self.args, [v.type for v in values], body)
        return ir.Module({"main": fn})


def combiner(kind: str, dtype: str) -> ir.Region:
    """The region of a reduce whose combiner is one `kind` op (add, maximum, ...)."""
    a, b = (ir.Value(ir.TensorType((), dtype)) for _ in range(2))
    r = ir.Value(ir.TensorType((), dtype))
    ops = [ir.Op(kind, [a, b], [r]), ir.Op("return", [r], [])]
    return ir.Region([ir.Block([a, b], ops)])


def unary(kind: str, shape, dtype: str = "float32", out_dtype: str | None = None,
          **attrs) -> ir.Module:
    b = FnBuilder()
    x = b.arg(shape, dtype)
    return b.ret(b.op(kind, [x], shape, out_dtype or dtype, **attrs))


def binary(kind: str, shape, dtype: str = "float32", out_dtype: str | None = None,
           **attrs) -> ir.Module:
    b = FnBuilder()
    x, y = b.arg(shape, dtype), b.arg(shape, dtype)
    return b.ret(b.op(kind, [x, y], shape, out_dtype or dtype, **attrs))
