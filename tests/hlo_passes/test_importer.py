"""Importer: real JAX artifacts in, our IR out (op kinds, attrs, types, locations)."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import hlo_passes
from hlo_passes import importer, ir
from hlo_passes.errors import HloImportError
from tests.hlo_passes.helpers import (ERF_COMPOSITE, PLUGIN_VERSION, all_kinds, artifact_of, bytecode,
                                      from_text, kinds, lowered_module, serialize)

HERE = os.path.basename(__file__)


def gelu_layer(x, w, b):
    return jax.nn.gelu(x @ w + b)


GELU_LINE = gelu_layer.__code__.co_firstlineno + 1
GELU_ARGS = (jnp.ones((4, 8)), jnp.ones((8, 16)), jnp.ones((16,)))


def imported(code: bytes) -> ir.Module:
    """Deserialize + MLIR passes + import, without our pass pipeline."""
    _, mlir_module = importer.deserialize(code)
    hlo_passes.run_mlir_passes(mlir_module)
    return importer.import_module(mlir_module)


def ops_of(module: ir.Module, kind: str) -> list[ir.Op]:
    return [op for fn in module.functions.values() for op in ir.walk(fn.body)
            if op.kind == kind]


# ---- the bytes -------------------------------------------------------------------


def test_artifact_is_versioned_bytecode():
    code = artifact_of(gelu_layer, *GELU_ARGS)
    assert code.startswith(b"ML\xefR")
    assert importer.artifact_version(code) == PLUGIN_VERSION


def test_text_is_not_an_artifact():
    assert importer.artifact_version(b"module {}") is None


def test_old_target_version_imports():
    code = artifact_of(gelu_layer, *GELU_ARGS, target="1.0.0")
    assert importer.artifact_version(code) == "1.0.0"
    assert "dot_general" in all_kinds(imported(code))


# ---- gelu(x @ w + b) --------------------------------------------------------------


def test_gelu_op_kinds():
    module = hlo_passes.compile_to_ir(artifact_of(gelu_layer, *GELU_ARGS))
    assert kinds(module.main.body) == ["fusion", "func.return"]     # one matmul epilogue
    assert set(all_kinds(module)) - {"fusion", "return"} == {
            "constant", "dot_general", "broadcast_in_dim", "add", "multiply", "tanh",
            "func.return"}
    assert module.name == "jit_gelu_layer"
    assert module.attrs["mhlo.num_partitions"] == 1
    assert module.attrs["stablehlo.version"] == PLUGIN_VERSION


def test_gelu_dot_general_attrs_and_types():
    module = imported(artifact_of(gelu_layer, *GELU_ARGS))
    (dot,) = ops_of(module, "dot_general")
    assert dot.attrs["lhs_contracting_dimensions"] == (1,)
    assert dot.attrs["rhs_contracting_dimensions"] == (0,)
    assert dot.attrs["lhs_batching_dimensions"] == ()
    assert dot.attrs["precision_config"] == ()
    assert [v.type for v in dot.operands] == [ir.TensorType((4, 8), "float32"),
                                              ir.TensorType((8, 16), "float32")]
    assert dot.result.type == ir.TensorType((4, 16), "float32")


def test_gelu_locations_point_at_user_code():
    module = imported(artifact_of(gelu_layer, *GELU_ARGS))
    (dot,) = ops_of(module, "dot_general")
    assert dot.name == "jit(gelu_layer)/dot_general"
    assert dot.loc.endswith(f"{HERE}:{GELU_LINE}")
    assert ops_of(module, "tanh")[0].loc.endswith(f"{HERE}:{GELU_LINE}")


def test_function_attrs():
    f = lambda x, y: x * y
    module = imported(artifact_of(f, jnp.ones(4), jnp.ones(4), donate_argnums=(0,)))
    assert module.main.arg_attrs[0] == {"tf.aliasing_output": 0}
    assert module.main.arg_attrs[1] == {}
    assert module.main.result_attrs == [{"jax.result_info": "result"}]


def test_precision_config_kept():
    f = lambda a, b: jnp.dot(a, b, precision="highest")
    module = imported(artifact_of(f, jnp.ones((2, 3)), jnp.ones((3, 4))))
    assert ops_of(module, "dot_general")[0].attrs["precision_config"] == ("HIGHEST",) * 2


# ---- dtypes and constants ---------------------------------------------------------

DTYPE_CASES = [
        (jnp.bfloat16, "bfloat16", [1.5, -2.0, 3.0]),
        (jnp.float8_e4m3fn, "float8_e4m3fn", [1.0, 2.0, -0.5]),
        (jnp.float8_e5m2, "float8_e5m2", [1.0, 4.0, -0.25]),
        (jnp.bool_, "bool", [True, False, True]),
        (jnp.uint32, "uint32", [1, 2, 4_000_000_000]),
        (jnp.complex64, "complex64", [1 + 2j, 3 - 4j, 0]),
        (jnp.int8, "int8", [-128, 0, 127]),
        (jnp.float16, "float16", [0.5, -1.0, 65504.0]),
]


@pytest.mark.parametrize("dtype,name,values", DTYPE_CASES, ids=[c[1] for c in DTYPE_CASES])
def test_dtypes_and_constants(dtype, name, values):
    const = np.array(values, dtype=dtype)
    f = lambda x: (x, jnp.asarray(const))
    module = imported(artifact_of(f, jnp.zeros((3,), dtype)))
    assert module.main.args[0].type == ir.TensorType((3,), name)
    (c,) = ops_of(module, "constant")
    assert c.attrs["value"].dtype == ir.np_dtype(name)
    np.testing.assert_array_equal(c.attrs["value"], const)


def test_float64_and_splat_constants_from_text():
    module = from_text("""
      func.func @main() -> (tensor<2xf64>, tensor<2x3xbf16>, tensor<4xi1>) {
        %a = stablehlo.constant dense<[1.5, -2.25]> : tensor<2xf64>
        %b = stablehlo.constant dense<0x7FC0> : tensor<2x3xbf16>
        %c = stablehlo.constant dense<true> : tensor<4xi1>
        return %a, %b, %c : tensor<2xf64>, tensor<2x3xbf16>, tensor<4xi1>
      }""")
    a, b, c = (op.attrs["value"] for op in module.main.body.ops[:3])
    np.testing.assert_array_equal(a, np.array([1.5, -2.25]))
    assert b.shape == (2, 3) and b.dtype == ml_dtypes.bfloat16 and np.isnan(b).all()
    assert c.dtype == np.bool_ and c.all()


def test_large_constants_use_the_hex_form():
    table = (np.arange(300) / 7).astype(ml_dtypes.bfloat16).reshape(3, 100)
    cplx = (np.arange(150) + 1j).astype(np.complex64)
    f = lambda x: (x + jnp.asarray(table), jnp.asarray(cplx))
    module = imported(artifact_of(f, jnp.zeros((3, 100), jnp.bfloat16)))
    values = [op.attrs["value"] for op in ops_of(module, "constant")]
    assert any(v.shape == (3, 100) and np.array_equal(v, table) for v in values)
    assert any(v.shape == (150,) and np.array_equal(v, cplx) for v in values)


def test_token_type():
    module = from_text("""
      func.func @main(%t: !stablehlo.token) -> !stablehlo.token {
        %0 = stablehlo.after_all %t : !stablehlo.token
        return %0 : !stablehlo.token
      }""")
    assert module.main.args[0].type == ir.TOKEN


# ---- regions -----------------------------------------------------------------------


def test_reduce_has_a_body():
    module = imported(artifact_of(lambda x: jnp.sum(x, axis=0), jnp.ones((4, 8))))
    (red,) = ops_of(module, "reduce")
    assert red.attrs["dimensions"] == (0,)
    body = red.regions[0].block
    assert [a.type for a in body.args] == [ir.TensorType((), "float32")] * 2
    assert kinds(body) == ["add", "return"]
    assert red.result.type == ir.TensorType((8,), "float32")


def test_while_and_case_regions():
    def f(x, i):
        y = jax.lax.fori_loop(0, 3, lambda _, v: v * 2.0, x)
        return jax.lax.switch(i, [lambda v: v + 1, lambda v: v - 1], y)

    module = imported(artifact_of(f, jnp.ones((4,)), jnp.int32(1)))
    (loop,) = ops_of(module, "while")
    assert len(loop.regions) == 2
    cond, body = (r.block for r in loop.regions)
    assert len(cond.args) == len(body.args) == len(loop.operands)
    assert cond.terminator.operands[0].type == ir.TensorType((), "bool")
    (case,) = ops_of(module, "case")
    assert len(case.regions) == 2
    assert all(r.block.terminator.kind == "return" for r in case.regions)


def test_sort_comparator_and_compare_attrs():
    module = imported(artifact_of(lambda x: jnp.sort(x), jnp.ones((5,))))
    (sort,) = ops_of(module, "sort")
    assert sort.attrs["dimension"] == 0 and sort.attrs["is_stable"] is True
    compares = [op for op in ir.walk(sort.regions[0].block) if op.kind == "compare"]
    assert {c.attrs["comparison_direction"] for c in compares} >= {"LT"}
    assert {c.attrs["compare_type"] for c in compares} >= {"TOTALORDER"}


def test_gather_scatter_reduce_window_attrs():
    def f(x, idx):
        return x[idx], x.at[idx].add(1.0), jnp.cumsum(x, axis=1)

    module = imported(artifact_of(f, jnp.ones((4, 4)), jnp.array([0, 2])))
    gather = ops_of(module, "gather")[0]
    assert gather.attrs["dimension_numbers"]["offset_dims"] == (1,)
    assert gather.attrs["slice_sizes"] == (1, 4)
    scatter = ops_of(module, "scatter")[0]
    assert scatter.attrs["scatter_dimension_numbers"]["inserted_window_dims"] == (0,)
    window = ops_of(module, "reduce_window")[0]
    assert window.attrs["window_strides"] == (1, 1)
    assert window.attrs["padding"] == ((0, 0), (3, 0))


def test_private_functions_are_inlined_with_names_and_locations():
    def f(x):
        return jnp.where(x > 0, x, 0.0)

    line = f.__code__.co_firstlineno + 1
    module = hlo_passes.compile_to_ir(artifact_of(f, jnp.ones((3,))))
    assert list(module.functions) == ["main"]
    assert "func.call" not in all_kinds(module)
    (select,) = ops_of(module, "select")
    assert select.name.startswith("jit(f)/jit(_where)/")
    assert select.loc.endswith(f"{HERE}:{line}")


def test_composites_are_expanded():
    module = from_text(ERF_COMPOSITE)
    composite = module.main.body.ops[0]
    assert composite.attrs["name"] == "chlo.erf"
    assert composite.attrs["decomposition"] == "erf_impl"
    hlo_passes.default_pipeline(dump_dir=None).run(module)
    assert kinds(module.main.body) == ["tanh", "func.return"]
    assert list(module.functions) == ["main"]


def test_custom_call_attrs():
    module = from_text("""
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %0 = stablehlo.custom_call @foo(%x) {backend_config = "cfg", api_version = 2 : i32, has_side_effect = true} : (tensor<4xf32>) -> tensor<4xf32>
        %1 = stablehlo.custom_call @bar(%0) {backend_config = {n = 1 : i32}, api_version = 4 : i32} : (tensor<4xf32>) -> tensor<4xf32>
        return %1 : tensor<4xf32>
      }""")
    foo, bar = module.main.body.ops[:2]
    assert (foo.attrs["call_target_name"], foo.attrs["backend_config"]) == ("foo", "cfg")
    assert foo.attrs["api_version"] == 2 and foo.attrs["has_side_effect"] is True
    assert bar.attrs["backend_config"] == "{n = 1 : i32}"
    assert bar.attrs["has_side_effect"] is False


def test_unconvertible_attributes_fall_back_to_text():
    # The bindings abort on `NamedAttribute.attr` for dense complex attributes.
    module = from_text("""
      func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
        %0 = stablehlo.custom_call @foo(%x) {odd = dense<[(1.0, 2.0)]> : tensor<1xcomplex<f32>>, mhlo.frontend_attributes = {c = dense<[(1.0, 2.0)]> : tensor<1xcomplex<f32>>}} : (tensor<4xf32>) -> tensor<4xf32>
        return %0 : tensor<4xf32>
      }""")
    attrs = module.main.body.ops[0].attrs
    assert attrs["odd"].startswith("dense<(1.0")
    assert attrs["mhlo.frontend_attributes"]["c"].startswith("dense<(1.0")


# ---- Shardy -------------------------------------------------------------------------


def sharded(x):
    mesh = Mesh(jax.devices("cpu")[:1], ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    y = jax.lax.with_sharding_constraint(x * 2, NamedSharding(mesh, P("x")))
    return jnp.sum(y, 0)


def sharded_module():
    mesh = Mesh(jax.devices("cpu")[:1], ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    x = jax.device_put(jnp.ones((4, 8)), NamedSharding(mesh, P("x")))
    return lowered_module(sharded, x)


def check_sdy(module: ir.Module) -> None:
    assert module.attrs["sdy.meshes"] == {"mesh": (("x", 1),)}
    assert module.main.arg_attrs[0]["sdy.sharding"] == '#sdy.sharding<@mesh, [{"x"}, {}]>'
    (constraint,) = ops_of(module, "sdy.sharding_constraint")
    assert constraint.attrs["sharding"] == '#sdy.sharding<@mesh, [{"x"}, {}]>'


def test_sdy_ops_as_mixed_serialization_delivers_them():
    check_sdy(imported(bytecode(sharded_module())))


def test_sdy_round_trip_export_is_undone():
    code = serialize(bytecode(sharded_module()))
    assert "custom_call" in all_kinds(importer.import_module(importer.deserialize(code)[1]))
    check_sdy(imported(code))


def test_sdy_mesh_from_text_artifact():
    text = """
      module @m attributes {mhlo.num_partitions = 8 : i32} {
        sdy.mesh @mesh = <["a"=2, "b"=4]>
        func.func @main(%x: tensor<8x16xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"a"}, {"b"}]>}) -> tensor<8x16xf32> {
          %0 = sdy.sharding_constraint %x <@mesh, [{}, {"b"}]> : tensor<8x16xf32>
          return %0 : tensor<8x16xf32>
        }
      }"""
    module = imported(serialize(text))
    assert module.attrs["sdy.meshes"] == {"mesh": (("a", 2), ("b", 4))}
    assert module.attrs["mhlo.num_partitions"] == 8
    # Shardy ran (8 partitions over a mesh): the constraint is an explicit all-gather
    assert kinds(module.main.body) == ["sdy.all_gather", "func.return"]


# ---- text input and errors -------------------------------------------------------


def test_chlo_text_is_legalized():
    _, mlir_module = importer.deserialize("""
      func.func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> tensor<4xf32> {
        %0 = chlo.broadcast_add %x, %y : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
        return %0 : tensor<4xf32>
      }""")
    hlo_passes.run_mlir_passes(mlir_module)
    module = importer.import_module(mlir_module)
    assert "add" in kinds(module.main.body)
    assert not any(k.startswith("chlo.") for k in all_kinds(module))


def test_garbage_bytes_raise():
    with pytest.raises(HloImportError, match="cannot deserialize"):
        hlo_passes.compile_to_ir(b"ML\xefR\x00StableHLO_v1.0.0\x00garbage")
    with pytest.raises(HloImportError, match="cannot deserialize"):
        hlo_passes.compile_to_ir(b"this is not mlir")


def test_tuple_types_are_rejected_naming_the_op():
    with pytest.raises(HloImportError, match="stablehlo.tuple.*tuple type"):
        from_text("""
          func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
            %0 = stablehlo.tuple %x : tuple<tensor<4xf32>>
            %1 = stablehlo.get_tuple_element %0[0] : (tuple<tensor<4xf32>>) -> tensor<4xf32>
            return %1 : tensor<4xf32>
          }""")


def test_dynamic_shapes_are_rejected():
    with pytest.raises(HloImportError, match="dynamic shape"):
        from_text("""
          func.func @main(%x: tensor<?xf32>) -> tensor<?xf32> {
            return %x : tensor<?xf32>
          }""")


def test_parse_location_forms():
    from jaxlib.mlir import ir as mlir_ir
    with importer.make_context():
        file = mlir_ir.Location.file("/src/model.py", 12, 8)
        caller = mlir_ir.Location.file("/src/main.py", 3, 1)
        call = mlir_ir.Location.callsite(file, [caller])
        named = mlir_ir.Location.name("jit(f)/dot_general", childLoc=call)
        fused = mlir_ir.Location.fused([mlir_ir.Location.name("x"), file])
        assert importer.parse_location(named) == ("jit(f)/dot_general", "/src/model.py:12")
        assert importer.parse_location(fused) == ("x", "/src/model.py:12")
        assert importer.parse_location(mlir_ir.Location.unknown()) == ("", "")
