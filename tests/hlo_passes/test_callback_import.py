"""The importer's part of host callbacks: `custom_call @trn.python_callback` becomes a
`host_callback` op (its registry key and caller parsed from backend_config), a token
becomes JAX's runtime token type (bool[0]), and the op is a side effect no pass drops."""
from __future__ import annotations

import pytest

from hlo_passes import ir
from hlo_passes.effects import has_side_effects
from hlo_passes.errors import HloImportError
from hlo_passes.passes import dce
from tests.hlo_passes.helpers import from_text

CALLBACKS = """
  func.func @main(%t: !stablehlo.token, %x: tensor<4xf32>) -> (!stablehlo.token, tensor<4xf32>) {
    %0 = stablehlo.custom_call @trn.python_callback(%t, %x) {backend_config = "callback=7 device=2",
        has_side_effect = true} : (!stablehlo.token, tensor<4xf32>) -> !stablehlo.token
    %1 = stablehlo.custom_call @trn.python_callback(%x) {backend_config = "callback=8"}
        : (tensor<4xf32>) -> tensor<4xf32>
    stablehlo.custom_call @trn.python_callback(%x) {backend_config = "callback=9"}
        : (tensor<4xf32>) -> ()
    %2 = stablehlo.after_all %0 : !stablehlo.token
    return %2, %x : !stablehlo.token, tensor<4xf32>
  }"""


def test_python_callback_custom_calls_become_host_callback_ops():
    module = from_text(CALLBACKS)
    ops = [op for op in module.main.body.ops if op.kind == "host_callback"]
    assert [op.attrs for op in ops] == [
        {"callback": 7, "device": 2, "has_side_effect": True},
        {"callback": 8, "device": None, "has_side_effect": False},
        {"callback": 9, "device": None, "has_side_effect": False}]
    assert all(has_side_effects(op) for op in ops)


def test_tokens_are_empty_bool_tensors():
    module = from_text(CALLBACKS)
    assert ir.TOKEN == ir.TensorType((0,), "bool")
    assert module.main.args[0].type == ir.TOKEN
    assert module.main.result_types[0] == ir.TOKEN


def test_dce_keeps_callbacks_whose_results_nobody_reads():
    module = from_text(CALLBACKS)
    dce.run(module)
    assert [op.kind for op in module.main.body.ops].count("host_callback") == 3


def test_a_malformed_callback_config_is_an_import_error():
    with pytest.raises(HloImportError, match="trn.python_callback with backend_config 'seven'"):
        from_text(CALLBACKS.replace("callback=8", "seven"))
