"""Value names are numbered per module when the IR is printed, so the same program gives
the same text, the same dumps and the same executable fingerprint, however many programs
the process compiled before (was: a process-global counter, different every time)."""
from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np

import hlo_passes
from hlo_passes import ir
from hlo_passes.passes import fusion

from .helpers import artifact_of, from_text


def layer(x, w):
    y = jnp.tanh(x @ w).sum(0) * 2
    return jnp.where(y > 0, y, 0.1 * y), (x @ w).T


ARGS = (jnp.ones((16, 8), jnp.float32), jnp.ones((8, 4), jnp.float32))

TEXT = """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.exponential %x : tensor<4xf32>
    %1 = stablehlo.add %0, %x : tensor<4xf32>
    return %1 : tensor<4xf32>
  }"""


def test_values_are_numbered_in_print_order():
    text = ir.format_module(from_text(TEXT))
    assert re.findall(r"%(\w+)", text) == ["v0", "v1", "v0", "v2", "v1", "v0", "v2"]


def test_names_do_not_depend_on_what_was_built_before():
    first = ir.format_module(from_text(TEXT))
    [ir.Value(ir.TensorType((), "float32")) for _ in range(5)]
    assert ir.format_module(from_text(TEXT)) == first


def test_same_program_twice_gives_the_same_text():
    code = artifact_of(layer, *ARGS)
    a, b = (ir.format_module(hlo_passes.compile_to_ir(code)) for _ in range(2))
    assert a == b
    assert "// decision: " in a


def test_same_program_twice_gives_the_same_dumps(tmp_path):
    code = artifact_of(layer, *ARGS)
    for d in ("a", "b"):
        hlo_passes.compile_to_ir(code, dump_dir=tmp_path / d)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for n in names:
        assert (tmp_path / "a" / n).read_text() == (tmp_path / "b" / n).read_text(), n


def test_decisions_name_values_as_the_previous_dump_does():
    module = from_text(TEXT)
    before = ir.value_names(module)
    exp, add = module.main.body.ops[:2]
    assert fusion.run(module)
    (op,) = [o for o in module.main.body.ops if o.kind == "fusion"]
    assert op.attrs["decisions"] == (
            f"exponential %{before[exp.result]} -> add %{before[add.result]}: elementwise: "
            "fused",) == ("exponential %v1 -> add %v2: elementwise: fused",)


def test_two_jit_objects_of_one_program_get_the_same_fingerprint(jax, trn):
    x, w = (jax.device_put(a, trn) for a in ARGS)
    first, second = (jax.jit(lambda x, w: layer(x, w)).lower(x, w).compile(),
                     jax.jit(lambda x, w: layer(x, w)).lower(x, w).compile())
    assert first.as_text() == second.as_text()
    fp = first.runtime_executable().fingerprint
    assert fp and fp == second.runtime_executable().fingerprint
    np.testing.assert_array_equal(np.asarray(first(x, w)[0]), np.asarray(second(x, w)[0]))
