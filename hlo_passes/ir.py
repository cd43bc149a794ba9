"""A small SSA IR for StableHLO programs, after import from MLIR.

Shape of the IR (one module, many functions, ops in blocks, blocks in regions):

        Module.functions[name] -> Function(args: [Value], body: Block, result_types)
        Block(args: [Value], ops: [Op])               # the last op of a body is its terminator
        Op(kind, operands: [Value], results: [Value], attrs: dict, regions: [Region], loc)
        Value(type: TensorType, name)                 # produced by exactly one Op or Block

`kind` is the MLIR op name without its dialect when the dialect is `stablehlo`
("add", "dot_general", "reduce", "return"), and the full name otherwise
("func.return", "func.call", "sdy.sharding_constraint"). Attributes are converted to
plain Python: ints, floats, bools, strings, tuples of ints, numpy arrays (dense
constants), and small dicts for structured attributes (see hlo_passes.importer for the
attribute names of each op). Types use numpy-style dtype names (`DTYPES`).

Ops are changed only through `Op.replace(**changes)` or by building new ops; a pass that
rewires uses calls `Block.replace_uses(old, new)`.

`Value.name` is a process-unique id (for identity and debugging), never printed: the text
form (`format_module`) numbers the values of each module in print order (`value_names`:
%v0, %v1, ...), so the same program always prints the same text, however many programs
the process built before it.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import ml_dtypes

# Element types we know, by the names numpy/ml_dtypes give them.
DTYPES = {
        "bool": np.dtype(np.bool_),
        "int8": np.dtype(np.int8), "int16": np.dtype(np.int16),
        "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
        "uint8": np.dtype(np.uint8), "uint16": np.dtype(np.uint16),
        "uint32": np.dtype(np.uint32), "uint64": np.dtype(np.uint64),
        "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16),
        "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
        "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
        "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
        "float8_e4m3": np.dtype(ml_dtypes.float8_e4m3),
        "complex64": np.dtype(np.complex64), "complex128": np.dtype(np.complex128),
}
# Narrow types ml_dtypes knows; the importer accepts them, lowering decides.
DTYPES.update({name: np.dtype(getattr(ml_dtypes, name)) for name in (
        "int2", "uint2", "int4", "uint4", "float8_e4m3fnuz", "float8_e5m2fnuz",
        "float8_e4m3b11fnuz", "float8_e3m4", "float8_e8m0fnu", "float4_e2m1fn",
        "float6_e2m3fn", "float6_e3m2fn") if hasattr(ml_dtypes, name)})


def np_dtype(name: str) -> np.dtype:
    return DTYPES[name]


def is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat"))


def is_int(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.size * np_dtype(self.dtype).itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


# A token (stablehlo.token) orders side effects and holds no data: it is an empty bool
# tensor, the type of the runtime tokens JAX passes for it (`dispatch.RuntimeTokenSet`),
# so the passes, the lowering and the runtime treat it like any other (empty) value.
TOKEN = TensorType((0,), "bool")

_ids = itertools.count()


@dataclass(eq=False)
class Value:
    type: TensorType
    name: str = ""          # process-unique id; printed text uses `value_names` instead

    def __post_init__(self):
        if not self.name:
            self.name = f"v{next(_ids)}"

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype

    def __repr__(self) -> str:
        return f"%{self.name}:{self.type}"


@dataclass(eq=False)
class Block:
    args: list[Value] = field(default_factory=list)
    ops: list["Op"] = field(default_factory=list)

    @property
    def terminator(self) -> "Op":
        return self.ops[-1]

    def replace_uses(self, old: Value, new: Value) -> None:
        """Replaces every use of `old` by `new` in this block and its nested regions."""
        for op in self.ops:
            if any(v is old for v in op.operands):
                op.operands = [new if v is old else v for v in op.operands]
            for region in op.regions:
                for block in region.blocks:
                    block.replace_uses(old, new)

    def replace_all_uses(self, mapping: dict["Value", "Value"]) -> None:
        """Like `replace_uses`, for many values at once (one walk)."""
        if not mapping:
            return
        for op in walk(self):
            if any(v in mapping for v in op.operands):
                op.operands = [mapping.get(v, v) for v in op.operands]


@dataclass(eq=False)
class Region:
    blocks: list[Block] = field(default_factory=list)

    @property
    def block(self) -> Block:
        assert len(self.blocks) == 1, "expected a single-block region"
        return self.blocks[0]


@dataclass(eq=False)
class Op:
    kind: str
    operands: list[Value]
    results: list[Value]
    attrs: dict[str, Any] = field(default_factory=dict)
    regions: list[Region] = field(default_factory=list)
    loc: str = ""          # "file.py:12" of the user's code, as JAX attached it
    name: str = ""         # the JAX op name path, e.g. "jit(f)/dot_general"

    def replace(self, **changes) -> "Op":
        return dataclasses.replace(self, **changes)

    @property
    def result(self) -> Value:
        assert len(self.results) == 1, f"{self.kind} has {len(self.results)} results"
        return self.results[0]

    def describe(self) -> str:
        """One line naming the op, its operand and result types, and where it came from."""
        ins = ", ".join(str(v.type) for v in self.operands)
        outs = ", ".join(str(v.type) for v in self.results)
        where = f" at {self.loc}" if self.loc else ""
        kind = self.kind if "." in self.kind else f"stablehlo.{self.kind}"
        return f"{kind}({ins}) -> ({outs}){where}"


@dataclass(eq=False)
class Function:
    name: str
    args: list[Value]
    result_types: list[TensorType]
    body: Block
    arg_attrs: list[dict[str, Any]] = field(default_factory=list)
    result_attrs: list[dict[str, Any]] = field(default_factory=list)
    visibility: str = "public"


@dataclass(eq=False)
class Module:
    functions: dict[str, Function]
    attrs: dict[str, Any] = field(default_factory=dict)
    entry: str = "main"
    name: str = "module"   # used to name IR dumps

    @property
    def main(self) -> Function:
        return self.functions[self.entry]


def walk(block: Block) -> Iterator[Op]:
    """Every op of `block`, pre-order, including ops in nested regions."""
    for op in block.ops:
        yield op
        for region in op.regions:
            for b in region.blocks:
                yield from walk(b)


def value_names(module: Module) -> dict[Value, str]:
    """The names `format_module` prints for the values of `module`: "v0", "v1", ...
    numbered per module in print order (function arguments, then each op's results,
    operands and nested block arguments), so they depend on the program only."""
    names: dict[Value, str] = {}
    for fn in module.functions.values():
        _number(fn.args, names)
        _name_block(fn.body, names)
    return names


def _number(values: list[Value], names: dict[Value, str]) -> None:
    for v in values:
        if v not in names:
            names[v] = f"v{len(names)}"


def _name_block(block: Block, names: dict[Value, str]) -> None:
    for op in block.ops:
        _number(op.results, names)
        _number(op.operands, names)
        for region in op.regions:
            for b in region.blocks:
                _number(b.args, names)
                _name_block(b, names)


def format_module(module: Module) -> str:
    """A readable text form of the module (used by IR dumps and `as_text()`); the same
    program gives the same text (values numbered by `value_names`)."""
    names, lines = value_names(module), []
    for fn in module.functions.values():
        args = ", ".join(_typed(a, names) for a in fn.args)
        rets = ", ".join(str(t) for t in fn.result_types)
        lines.append(f"func @{fn.name}({args}) -> ({rets}) {{")
        _format_block(fn.body, lines, "  ", names)
        lines.append("}")
    return "\n".join(lines) + "\n"


def _typed(v: Value, names: dict[Value, str]) -> str:
    return f"%{names[v]}:{v.type}"


def _format_attr(v: Any) -> str:
    if isinstance(v, np.ndarray):
        if v.size <= 8:
            return f"dense<{v.tolist()}>"
        return f"dense<{v.dtype}{list(v.shape)}>"
    return repr(v)


# Attributes printed one per line under the op (long lists of reasons).
LISTED_ATTRS = ("decisions",)


def _format_block(block: Block, lines: list[str], indent: str,
                  names: dict[Value, str]) -> None:
    for op in block.ops:
        res = ", ".join(_typed(r, names) for r in op.results)
        ops = ", ".join(f"%{names[v]}" for v in op.operands)
        attrs = ", ".join(f"{k}={_format_attr(v)}" for k, v in op.attrs.items()
                          if k not in LISTED_ATTRS)
        head = f"{res} = " if op.results else ""
        tail = f" {{{attrs}}}" if attrs else ""
        loc = f"  # {op.loc}" if op.loc else ""
        lines.append(f"{indent}{head}{op.kind}({ops}){tail}{loc}")
        for key in LISTED_ATTRS:
            lines.extend(f"{indent}  // {key[:-1]}: {item}" for item in op.attrs.get(key, ()))
        for region in op.regions:
            for b in region.blocks:
                bargs = ", ".join(_typed(a, names) for a in b.args)
                lines.append(f"{indent}  ^bb({bargs}):")
                _format_block(b, lines, indent + "    ", names)
