"""MLIR attributes -> plain Python values (see the table in hlo_passes.importer).

Never touch `NamedAttribute.attr`: the bindings abort the process (not raise) when an
attribute cannot be downcast, e.g. a dense complex constant. `op.attributes[name]` and
`dict_attr[name]` raise TypeError instead; we then fall back to the attribute's text.
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np
from jaxlib.mlir import ir as mlir_ir
from jaxlib.mlir.dialects import sdy
from jaxlib.mlir.dialects import stablehlo as shlo

from hlo_passes import ir

# MLIR element type spelling -> our dtype name (ir.DTYPES).
ELEMENT_TYPES = {
        "i1": "bool", "i2": "int2", "i4": "int4", "i8": "int8", "i16": "int16",
        "i32": "int32", "i64": "int64", "ui2": "uint2", "ui4": "uint4", "ui8": "uint8",
        "ui16": "uint16", "ui32": "uint32", "ui64": "uint64",
        "f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
        "f8E4M3FN": "float8_e4m3fn", "f8E5M2": "float8_e5m2", "f8E4M3": "float8_e4m3",
        "f8E4M3FNUZ": "float8_e4m3fnuz", "f8E5M2FNUZ": "float8_e5m2fnuz",
        "f8E4M3B11FNUZ": "float8_e4m3b11fnuz", "f8E3M4": "float8_e3m4",
        "f8E8M0FNU": "float8_e8m0fnu", "f4E2M1FN": "float4_e2m1fn",
        "f6E2M3FN": "float6_e2m3fn", "f6E3M2FN": "float6_e3m2fn",
        "complex<f32>": "complex64", "complex<f64>": "complex128",
}

# Per-op defaults for attributes MLIR omits when they have their default value.
DEFAULTS = {
        "dot_general": {"precision_config": (), "lhs_batching_dimensions": (),
                        "rhs_batching_dimensions": ()},
        "convolution": {"precision_config": ()},
        "compare": {"compare_type": None},
        "custom_call": {"backend_config": "", "api_version": 1, "has_side_effect": False},
}


def fill_rank_defaults(kind: str, attrs: dict[str, Any], rank: int) -> None:
    """Window attributes MLIR omits when trivial, filled for an operand of `rank`."""
    n = rank - 2 if kind == "convolution" else rank
    if kind not in ("reduce_window", "convolution"):
        return
    names = (("window_strides", "lhs_dilation", "rhs_dilation") if kind == "convolution"
             else ("window_strides", "base_dilations", "window_dilations"))
    for key in names:
        attrs.setdefault(key, (1,) * n)
    attrs.setdefault("padding", ((0, 0),) * n)


def dtype_name(element_type: mlir_ir.Type) -> str | None:
    """Our dtype name for an MLIR element type, or None if we have none."""
    return ELEMENT_TYPES.get(str(element_type))


def op_attrs(op: mlir_ir.Operation, kind: str) -> dict[str, Any]:
    """All attributes of `op` as plain Python, with per-op expansions and defaults."""
    out = dict(DEFAULTS.get(kind, {}))
    for name in op.attributes:
        if kind == "constant" and name == "value":
            continue  # the importer builds the numpy value from the result type
        value = _get(op.attributes, name)
        if name == "dot_dimension_numbers" and isinstance(value, dict):
            out.update(value)
        elif kind == "custom_call" and name == "backend_config":
            out[name] = (value if isinstance(value, (str, bytes))
                         else _text(op.attributes, name))
        else:
            out[name] = value
    return out


def to_python(attr: mlir_ir.Attribute) -> Any:
    """Best-effort conversion of one attribute (see the importer's table)."""
    for cls, convert in _DIALECT_ATTRS:
        if cls.isinstance(attr):
            return convert(cls(attr))
    for cls, convert in _BUILTIN_ATTRS:
        if isinstance(attr, cls):
            return convert(attr)
    text = str(attr)
    enum = re.fullmatch(r"#\w+<\w+ (\w+)>", text)
    return enum.group(1) if enum else text


def _string(attr: mlir_ir.StringAttr) -> str | bytes:
    """The text of a string attribute, or its bytes when they are not UTF-8 (e.g. the
    `InspectSharding` custom call's backend_config: two pointers)."""
    try:
        return attr.value
    except (RuntimeError, UnicodeDecodeError):
        return bytes(attr.value_bytes)


def _get(attrs, name: str) -> Any:
    try:
        return to_python(attrs[name])
    except TypeError:  # the bindings cannot downcast it (e.g. dense complex)
        return _text(attrs, name)


def _text(attrs, name: str) -> str:
    for i in range(len(attrs)):
        if attrs[i].name == name:
            return _unreadable_text(attrs, i)
    return ""


def _unreadable_text(attrs, i: int) -> str:
    # `str(NamedAttribute)` prints without downcasting: `NamedAttribute(name=<text>)`.
    text = str(attrs[i])
    return text[text.index("=") + 1:-1] if text.startswith("NamedAttribute(") else text


def _dims(seq) -> tuple[int, ...]:
    return tuple(int(x) for x in seq)


def _dict(attr: mlir_ir.DictAttr) -> dict[str, Any]:
    return {attr[i].name: _get(attr, attr[i].name) for i in range(len(attr))}


def _dense(attr: mlir_ir.DenseElementsAttr) -> Any:
    try:
        return _nested_tuple(np.array(attr).tolist())
    except (TypeError, ValueError, RuntimeError):
        return str(attr)


def _nested_tuple(x: Any) -> Any:
    return tuple(_nested_tuple(v) for v in x) if isinstance(x, list) else x


def _type_name(t: mlir_ir.Type) -> str:
    return dtype_name(t) or str(t)


def _dot_dims(a) -> dict[str, tuple[int, ...]]:
    return {"lhs_batching_dimensions": _dims(a.lhs_batching_dimensions),
            "rhs_batching_dimensions": _dims(a.rhs_batching_dimensions),
            "lhs_contracting_dimensions": _dims(a.lhs_contracting_dimensions),
            "rhs_contracting_dimensions": _dims(a.rhs_contracting_dimensions)}


def _gather_dims(a) -> dict[str, Any]:
    return {"offset_dims": _dims(a.offset_dims),
            "collapsed_slice_dims": _dims(a.collapsed_slice_dims),
            "operand_batching_dims": _dims(a.operand_batching_dims),
            "start_indices_batching_dims": _dims(a.start_indices_batching_dims),
            "start_index_map": _dims(a.start_index_map),
            "index_vector_dim": int(a.index_vector_dim)}


def _scatter_dims(a) -> dict[str, Any]:
    return {"update_window_dims": _dims(a.update_window_dims),
            "inserted_window_dims": _dims(a.inserted_window_dims),
            "input_batching_dims": _dims(a.input_batching_dims),
            "scatter_indices_batching_dims": _dims(a.scatter_indices_batching_dims),
            "scatter_dims_to_operand_dims": _dims(a.scattered_dims_to_operand_dims),
            "index_vector_dim": int(a.index_vector_dim)}


def _conv_dims(a) -> dict[str, Any]:
    return {"input_batch_dimension": int(a.input_batch_dimension),
            "input_feature_dimension": int(a.input_feature_dimension),
            "input_spatial_dimensions": _dims(a.input_spatial_dimensions),
            "kernel_input_feature_dimension": int(a.kernel_input_feature_dimension),
            "kernel_output_feature_dimension": int(a.kernel_output_feature_dimension),
            "kernel_spatial_dimensions": _dims(a.kernel_spatial_dimensions),
            "output_batch_dimension": int(a.output_batch_dimension),
            "output_feature_dimension": int(a.output_feature_dimension),
            "output_spatial_dimensions": _dims(a.output_spatial_dimensions)}


def _dot_algorithm(a) -> dict[str, Any]:
    return {"lhs_precision_type": _type_name(a.lhs_precision_type),
            "rhs_precision_type": _type_name(a.rhs_precision_type),
            "accumulation_type": _type_name(a.accumulation_type),
            "lhs_component_count": int(a.lhs_component_count),
            "rhs_component_count": int(a.rhs_component_count),
            "num_primitive_operations": int(a.num_primitive_operations),
            "allow_imprecise_accumulation": bool(a.allow_imprecise_accumulation)}


def _output_operand_alias(a) -> dict[str, Any]:
    return {"output_tuple_indices": _dims(a.output_tuple_indices),
            "operand_index": int(a.operand_index),
            "operand_tuple_indices": _dims(a.operand_tuple_indices)}


_ENUMS = (shlo.ComparisonDirectionAttr, shlo.ComparisonTypeAttr, shlo.PrecisionAttr,
          shlo.FftTypeAttr, shlo.RngAlgorithmAttr, shlo.RngDistributionAttr,
          shlo.TransposeAttr)
_SDY_ATTRS = (sdy.TensorShardingAttr, sdy.TensorShardingPerValueAttr, sdy.MeshAttr,
              sdy.ManualAxesAttr, sdy.OpShardingRuleAttr)

_DIALECT_ATTRS = (
        *((cls, lambda a: str(a.value)) for cls in _ENUMS),
        (shlo.DotDimensionNumbers, _dot_dims),
        (shlo.GatherDimensionNumbers, _gather_dims),
        (shlo.ScatterDimensionNumbers, _scatter_dims),
        (shlo.ConvDimensionNumbers, _conv_dims),
        (shlo.DotAlgorithm, _dot_algorithm),
        (shlo.OutputOperandAlias, _output_operand_alias),
        (shlo.ChannelHandle, lambda a: {"handle": int(a.handle), "type": int(a.channel_type)}),
        *((cls, str) for cls in _SDY_ATTRS),
)

_BUILTIN_ATTRS = (
        (mlir_ir.BoolAttr, lambda a: bool(a.value)),
        (mlir_ir.IntegerAttr, lambda a: int(a.value)),
        (mlir_ir.FloatAttr, lambda a: float(a.value)),
        (mlir_ir.StringAttr, lambda a: _string(a)),
        (mlir_ir.UnitAttr, lambda a: True),
        (mlir_ir.FlatSymbolRefAttr, lambda a: a.value),
        (mlir_ir.TypeAttr, lambda a: str(a.value)),
        (mlir_ir.DenseBoolArrayAttr, lambda a: tuple(bool(x) for x in a)),
        (mlir_ir.DenseI64ArrayAttr, _dims),
        (mlir_ir.DenseI32ArrayAttr, _dims),
        (mlir_ir.DenseI16ArrayAttr, _dims),
        (mlir_ir.DenseI8ArrayAttr, _dims),
        (mlir_ir.DenseF32ArrayAttr, lambda a: tuple(float(x) for x in a)),
        (mlir_ir.DenseF64ArrayAttr, lambda a: tuple(float(x) for x in a)),
        (mlir_ir.ArrayAttr, lambda a: tuple(to_python(x) for x in a)),
        (mlir_ir.DictAttr, _dict),
        (mlir_ir.DenseElementsAttr, _dense),
)


# ---- dense constants -------------------------------------------------------------


def constant_value(op: mlir_ir.Operation, ttype: ir.TensorType) -> np.ndarray:
    """The `value` of a stablehlo.constant as a numpy array of `ttype`'s dtype/shape."""
    dtype = ir.np_dtype(ttype.dtype)
    try:
        attr = op.attributes["value"]
        return _from_buffer(attr, dtype, ttype.shape)
    except (TypeError, ValueError, RuntimeError):
        pass  # bf16, fp8, complex, narrow ints: the bindings cannot export them
    text = op.get_asm(enable_debug_info=False, large_elements_limit=None)
    return parse_dense(_dense_body(text), dtype, ttype.shape)


def _from_buffer(attr, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    arr = np.array(attr)
    if arr.dtype != dtype:
        raise ValueError(f"buffer dtype {arr.dtype} is not {dtype}")
    return np.broadcast_to(arr, shape).copy() if arr.shape != shape else arr.copy()


def _dense_body(text: str) -> str:
    """The text between `dense<` and its matching `>`."""
    start = text.index("dense<") + len("dense<")
    depth = 1
    for i in range(start, len(text)):
        depth += {"<": 1, ">": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    raise ValueError(f"unterminated dense attribute: {text[:80]}")


def parse_dense(body: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """Parses the inside of `dense<...>` (hex blob or literal list) into an array."""
    size = int(np.prod(shape, dtype=np.int64))
    if body.startswith('"0x'):
        flat = np.frombuffer(bytes.fromhex(body[3:-1]), dtype=dtype)
    else:
        flat = _parse_literals(body, dtype)
    if flat.size == 1 and size != 1:
        return np.full(shape, flat[0], dtype=dtype)
    if flat.size != size:
        raise ValueError(f"dense attribute has {flat.size} elements, expected {size}")
    return flat.reshape(shape).copy()


def _parse_literals(body: str, dtype: np.dtype) -> np.ndarray:
    if dtype.kind == "c":
        part = np.dtype(np.float32 if dtype.itemsize == 8 else np.float64)
        pairs = re.findall(r"\(([^,()]+),([^,()]+)\)", body)
        real = _scalars([p[0] for p in pairs], part)
        imag = _scalars([p[1] for p in pairs], part)
        out = np.empty(len(pairs), dtype=dtype)
        out.real, out.imag = real, imag
        return out
    tokens = [t for t in re.split(r"[\s,\[\]]+", body) if t]
    return _scalars(tokens, dtype)


def _scalars(tokens: list[str], dtype: np.dtype) -> np.ndarray:
    """Literal tokens (true/false, ints, floats, 0x bit patterns) -> array of dtype."""
    out = np.empty(len(tokens), dtype=dtype)
    for i, tok in enumerate(tokens):
        tok = tok.strip()
        if tok.startswith("0x") and dtype.kind not in "iub":
            out[i:i + 1] = _bits(tok, dtype)
        elif tok in ("true", "false"):
            out[i] = tok == "true"
        elif dtype.kind in "iub":
            out[i] = int(tok, 0)
        else:
            out[i] = float(tok)
    return out


def _bits(tok: str, dtype: np.dtype) -> np.ndarray:
    """A hex bit pattern (MLIR prints NaN/inf floats this way) as one element."""
    uint = np.dtype(f"uint{dtype.itemsize * 8}")
    return np.array([int(tok, 16)], dtype=uint).view(dtype)
