"""StableHLO portable artifact (or plain MLIR text/bytecode) -> hlo_passes IR.

`deserialize(code)` gives an MLIR module in a context with the func, stablehlo, chlo,
mhlo and sdy dialects; `import_module(mlir_module)` walks it and builds `ir.Module`.

Op kinds: `stablehlo.X` -> "X"; other dialects keep their full name ("func.call",
"sdy.sharding_constraint", "mhlo.topk"). Types: ranked static tensors -> `TensorType`
with the dtype names of `ir.DTYPES` (i1 -> "bool"); `!stablehlo.token` -> `ir.TOKEN`
(bool[0]: a token holds no data); tuples, dynamic shapes and unknown element types raise
`HloImportError`.

Attributes, by op (all other attributes: DenseI64ArrayAttr -> tuple, IntegerAttr -> int,
FloatAttr -> float, BoolAttr/UnitAttr -> bool, StringAttr -> str, FlatSymbolRefAttr ->
name, enums -> their string ("EQ"), ArrayAttr -> tuple, DictAttr -> dict, dense
elements -> nested tuples, dialect structs -> dict of fields, sdy -> text, else str):

    op                 attrs
    ----------------   ----------------------------------------------------------------
    constant,          value: np.ndarray of the result dtype and shape (splats expanded)
    sdy.constant
    iota               iota_dimension: int
    broadcast_in_dim   broadcast_dimensions: tuple
    transpose          permutation: tuple
    reshape, convert,
    select, clamp      (none)
    compare            comparison_direction: "EQ"|"NE"|"LT"|"LE"|"GT"|"GE",
                       compare_type: "FLOAT"|"TOTALORDER"|"SIGNED"|"UNSIGNED"|None
    dot_general        lhs_batching_dimensions, rhs_batching_dimensions,
                       lhs_contracting_dimensions, rhs_contracting_dimensions: tuple,
                       precision_config: tuple of "DEFAULT"|"HIGH"|"HIGHEST" (maybe ()),
                       algorithm: dict (only if present)
    reduce             dimensions: tuple; regions[0] is the body
    reduce_window      window_dimensions, window_strides, base_dilations,
                       window_dilations: tuple; padding: ((lo, hi), ...) (trivial
                       values filled in when MLIR omits them; same for convolution)
    slice              start_indices, limit_indices, strides: tuple
    dynamic_slice      slice_sizes: tuple
    concatenate        dimension: int
    pad                edge_padding_low, edge_padding_high, interior_padding: tuple
    gather             dimension_numbers: dict (offset_dims, collapsed_slice_dims,
                       operand_batching_dims, start_indices_batching_dims,
                       start_index_map, index_vector_dim), slice_sizes: tuple
    scatter            scatter_dimension_numbers: dict (update_window_dims,
                       inserted_window_dims, input_batching_dims,
                       scatter_indices_batching_dims, scatter_dims_to_operand_dims,
                       index_vector_dim); regions[0] is the update computation
    sort               dimension: int, is_stable: bool; regions[0] is the comparator
    convolution        dimension_numbers: dict, window_strides, lhs_dilation,
                       rhs_dilation: tuple, padding: ((lo, hi), ...),
                       feature_group_count, batch_group_count: int,
                       precision_config: tuple
    while              regions: [cond, body]
    case               regions: one per branch
    all_reduce etc.    replica_groups: nested tuple, channel_handle: {handle, type}
    custom_call        call_target_name: str, backend_config: str (dict configs as
                       text), api_version: int, has_side_effect: bool
    composite          name, decomposition: str, composite_attributes: dict, version
    top_k              k: int (from `custom_call @trn.top_k`, which mlir_passes makes
                       of the `chlo.top_k` the trn rule takes)
    host_callback      callback: int (the registry key), device: int | None (the
                       partition that calls it for all, None: every device),
                       has_side_effect: bool (from `custom_call @trn.python_callback`,
                       backend_config "callback=<key>[ device=<partition>]", which
                       jax_trn.jax_callbacks emits for JAX's callback primitives)
    mx_matmul          only its sdy.sharding (from `custom_call @trn.mx_matmul`, which jax_trn.jax_mx
                       emits for JAX's block-scaled `scaled_matmul`: lhs [B, M, K],
                       rhs [B, N, K], their E8M0 scales [B, M, K/32], [B, N, K/32])
    kernel_call        kernel: str (from `custom_call @trn.kernel`, backend_config
                       "kernel=<key>", which jax_trn.kernels emits for a hand-written
                       kernel: its operands are the kernel's inputs, its results the
                       tensors it returns)
    func.call          callee: str

Functions: `arg_attrs` / `result_attrs` keep every attribute by its MLIR name
("mhlo.sharding", "sdy.sharding", "mhlo.layout_mode", "jax.result_info",
"tf.aliasing_output", "jax.buffer_donor", ...) converted as above: strings and
sharding attributes as text, ints as int, bools as bool. Module attributes
("mhlo.num_partitions", "mhlo.num_replicas", "sym_name", ...) go to `Module.attrs`;
`sdy.mesh` ops become `Module.attrs["sdy.meshes"] = {name: ((axis, size), ...)}` (and
`Module.attrs["sdy.mesh_device_ids"] = {name: ids}` for meshes with explicit device ids).

Locations: `Op.name` is the first NameLoc ("jit(f)/dot_general"), `Op.loc` the first
file location ("/path/file.py:12"), i.e. the innermost user frame of a CallSiteLoc.
"""
from __future__ import annotations

import re

from jaxlib.mlir import ir as mlir_ir
from jaxlib.mlir._mlir_libs import _jax_mlir_ext
from jaxlib.mlir.dialects import chlo, mhlo, sdy
from jaxlib.mlir.dialects import stablehlo as shlo

from hlo_passes import ir
from hlo_passes.attributes import (constant_value, dtype_name, fill_rank_defaults, op_attrs,
                                   to_python)
from hlo_passes.errors import HloImportError

_BYTECODE_MAGIC = b"ML\xefR"
CALLBACK_TARGET = "trn.python_callback"
MX_MATMUL_TARGET = "trn.mx_matmul"
KERNEL_TARGET = "trn.kernel"
_KERNEL_CONFIG = re.compile(r"kernel=([0-9a-f]+)$")
_CALLBACK_CONFIG = re.compile(r"callback=(\d+)(?: device=(\d+))?$")
_PRODUCER = re.compile(rb"StableHLO_v(\d+\.\d+\.\d+)\x00")
_NAME_LOC = re.compile(r'"((?:[^"\\]|\\.)*)"(?=[(),\]])')  # not followed by ":"
_FILE_LOC = re.compile(r'"((?:[^"\\]|\\.)*)":(\d+):\d+')


def make_context() -> mlir_ir.Context:
    """A fresh MLIR context with the dialects JAX programs use (like jax's own)."""
    registry = mlir_ir.DialectRegistry()
    _jax_mlir_ext.register_dialects(registry)
    ctx = mlir_ir.Context()
    ctx.append_dialect_registry(registry)
    ctx.load_all_available_dialects()
    sdy.register_dialect(ctx)
    mhlo.register_mhlo_dialect(ctx)
    chlo.register_dialect(ctx)
    shlo.register_dialect(ctx)
    ctx.enable_multithreading(False)
    return ctx


def artifact_version(code: bytes) -> str | None:
    """The StableHLO version of a portable artifact ("1.13.7"), None if not one."""
    if not code.startswith(_BYTECODE_MAGIC):
        return None
    match = _PRODUCER.search(code[:64])
    return match.group(1).decode() if match else None


def deserialize(code: bytes | str) -> tuple[mlir_ir.Context, mlir_ir.Module]:
    """Portable artifact, MLIR bytecode or MLIR text -> (context, StableHLO module)."""
    ctx = make_context()
    data = code.encode() if isinstance(code, str) else bytes(code)
    with ctx, mlir_ir.Location.unknown():
        try:
            if artifact_version(data):
                return ctx, shlo.deserialize_portable_artifact(ctx, data)
            return ctx, mlir_ir.Module.parse(data)
        except (mlir_ir.MLIRError, ValueError) as e:
            raise HloImportError(f"cannot deserialize the program: {e}") from e


def import_module(mlir_module: mlir_ir.Module, *, name: str | None = None) -> ir.Module:
    """Builds our IR from a StableHLO MLIR module (see the module docstring)."""
    top = mlir_module.operation
    with top.context:
        attrs = op_attrs(top, "builtin.module")
        functions = {}
        for op in mlir_module.body.operations:
            op = op.operation
            if op.name == "func.func":
                fn = _import_function(op)
                functions[fn.name] = fn
            elif op.name == "sdy.mesh":
                _import_mesh(op, attrs)
            else:
                raise HloImportError(f"unexpected top-level op {op.name}")
    return ir.Module(functions, attrs, _entry(functions),
                     name=name or attrs.get("sym_name") or "module")


def _entry(functions: dict[str, ir.Function]) -> str:
    if "main" in functions:
        return "main"
    public = [f.name for f in functions.values() if f.visibility == "public"]
    if not public:
        raise HloImportError("the module has no public function to run")
    return public[0]


def _import_mesh(op: mlir_ir.Operation, attrs: dict) -> None:
    mesh = sdy.MeshAttr(op.attributes["mesh"])
    axes = tuple((a.name, int(a.size)) for a in map(sdy.MeshAxisAttr, mesh.axes))
    name = op.attributes["sym_name"].value
    attrs.setdefault("sdy.meshes", {})[name] = axes
    ids = tuple(int(i) for i in mesh.device_ids)
    if ids:
        attrs.setdefault("sdy.mesh_device_ids", {})[name] = ids


def _import_function(fop: mlir_ir.Operation) -> ir.Function:
    name = fop.attributes["sym_name"].value
    where = f"function @{name}"
    ftype = fop.attributes["function_type"].value
    if len(fop.regions[0].blocks) != 1:
        raise HloImportError(f"{where}: expected a single-block body")
    env: dict = {}
    block = _import_block(fop.regions[0].blocks[0], env, where)
    visibility = (fop.attributes["sym_visibility"].value
                  if "sym_visibility" in fop.attributes else "public")
    return ir.Function(
            name, block.args, [tensor_type(t, where) for t in ftype.results], block,
            arg_attrs=_attr_dicts(fop, "arg_attrs", len(ftype.inputs)),
            result_attrs=_attr_dicts(fop, "res_attrs", len(ftype.results)),
            visibility=visibility)


def _attr_dicts(fop: mlir_ir.Operation, key: str, n: int) -> list[dict]:
    if key not in fop.attributes:
        return [{} for _ in range(n)]
    return [to_python(d) for d in fop.attributes[key]]


def _import_block(block: mlir_ir.Block, env: dict, where: str) -> ir.Block:
    args = []
    for arg in block.arguments:
        args.append(ir.Value(tensor_type(arg.type, where)))
        env[arg] = args[-1]
    return ir.Block(args, [_import_op(op.operation, env) for op in block.operations])


def _import_op(op: mlir_ir.Operation, env: dict) -> ir.Op:
    kind = op.name.removeprefix("stablehlo.")
    name, loc = parse_location(op.location)
    where = f"{op.name}" + (f" at {loc}" if loc else f" ({name})" if name else "")
    operands = [_lookup(env, v, where) for v in op.operands]
    results = [ir.Value(tensor_type(r.type, where)) for r in op.results]
    env.update(zip(op.results, results))
    attrs = op_attrs(op, kind)
    if operands:
        fill_rank_defaults(kind, attrs, operands[0].type.rank)
    if kind in ("constant", "sdy.constant"):    # Shardy's propagation makes the latter
        attrs["value"] = _constant(op, results[0].type, where)
    if kind == "custom_call" and attrs.get("call_target_name") == "trn.top_k":
        kind, attrs = "top_k", {"k": int(attrs["backend_config"])}
    if kind == "custom_call" and attrs.get("call_target_name") == MX_MATMUL_TARGET:
        kind, attrs = "mx_matmul", {k: v for k, v in attrs.items() if k == "sdy.sharding"}
    if kind == "custom_call" and attrs.get("call_target_name") == CALLBACK_TARGET:
        kind, attrs = "host_callback", _callback_attrs(attrs, where)
    if kind == "custom_call" and attrs.get("call_target_name") == KERNEL_TARGET:
        kind, attrs = "kernel_call", _kernel_attrs(attrs, where)
    regions = [_import_region(r, env, where) for r in op.regions]
    return ir.Op(kind, operands, results, attrs, regions, loc=loc, name=name)


def _callback_attrs(attrs: dict, where: str) -> dict:
    """The attributes of a `host_callback` op from its custom_call's."""
    match = _CALLBACK_CONFIG.match(str(attrs.get("backend_config", "")).strip())
    if match is None:
        raise HloImportError(f"{where}: {CALLBACK_TARGET} with backend_config "
                             f"{attrs.get('backend_config')!r}, expected "
                             "'callback=<key>[ device=<partition>]'")
    device = match.group(2)
    return {"callback": int(match.group(1)), "device": None if device is None else int(device),
            "has_side_effect": bool(attrs.get("has_side_effect", False))}


def _kernel_attrs(attrs: dict, where: str) -> dict:
    """The attributes of a `kernel_call` op (a hand-written kernel, jax_trn.kernels)."""
    match = _KERNEL_CONFIG.match(str(attrs.get("backend_config", "")).strip())
    if match is None:
        raise HloImportError(f"{where}: {KERNEL_TARGET} with backend_config "
                             f"{attrs.get('backend_config')!r}, expected 'kernel=<key>'")
    return {"kernel": match.group(1)}


def _import_region(region: mlir_ir.Region, env: dict, where: str) -> ir.Region:
    return ir.Region([_import_block(b, env, where) for b in region.blocks])


def _lookup(env: dict, value: mlir_ir.Value, where: str) -> ir.Value:
    try:
        return env[value]
    except KeyError:
        raise HloImportError(f"{where}: operand {value.get_name()} is not defined "
                             "before its use") from None


def _constant(op: mlir_ir.Operation, ttype: ir.TensorType, where: str):
    try:
        return constant_value(op, ttype)
    except (ValueError, KeyError) as e:
        raise HloImportError(f"{where}: cannot read the constant of type {ttype}: {e}")


def tensor_type(t: mlir_ir.Type, where: str) -> ir.TensorType:
    """Our TensorType for an MLIR type; HloImportError naming `where` otherwise."""
    if isinstance(t, mlir_ir.RankedTensorType):
        if not t.has_static_shape:
            raise HloImportError(f"{where}: dynamic shape {t} is not supported")
        dtype = dtype_name(t.element_type)
        if dtype is None:
            raise HloImportError(f"{where}: element type {t.element_type} is not supported")
        return ir.TensorType(tuple(t.shape), dtype)
    if shlo.TokenType.isinstance(t):
        return ir.TOKEN
    if isinstance(t, mlir_ir.TupleType):
        raise HloImportError(f"{where}: tuple type {t} is not supported "
                             "(JAX programs pass tuples as separate values)")
    raise HloImportError(f"{where}: type {t} is not supported")


def parse_location(loc: mlir_ir.Location) -> tuple[str, str]:
    """(JAX op name, "file.py:line" of the innermost user frame); "" when absent."""
    text = str(loc)
    name = _NAME_LOC.search(text)
    file = _FILE_LOC.search(text)
    return (_unescape(name.group(1)) if name else "",
            f"{_unescape(file.group(1))}:{file.group(2)}" if file else "")


def _unescape(s: str) -> str:
    return s.replace('\\"', '"').replace("\\\\", "\\")
