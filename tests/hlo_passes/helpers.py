"""Real StableHLO artifacts from JAX (CPU lowering), as a PJRT plugin receives them.

PJRT's `PjRtCApiClient::CompileAndLoad` calls XLA's `Serialize(module, version)` with
the plugin's `stablehlo_current_version` (ours: jaxlib's current version). For modules
without `sdy` ops that is exactly `SerializeUsingVersionedStablehlo`, which jaxlib
exposes as `_jax.mlir.serialize_portable_artifact`. (For targets >= 1.11 XLA keeps `sdy`
ops as they are; this binding instead runs the Shardy round-trip export, so sharded
programs are tested both ways in test_importer.py.)
"""
from __future__ import annotations

import io

import jax
from jax._src.lib import _jax
from jaxlib.mlir.dialects import stablehlo

from hlo_passes import importer, ir

PLUGIN_VERSION = stablehlo.get_current_version()

# A chlo.erf composite whose decomposition is a private function (JAX emits erf so).
ERF_COMPOSITE = """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.composite "chlo.erf" %x {decomposition = @erf_impl} : (tensor<4xf32>) -> tensor<4xf32>
    return %0 : tensor<4xf32>
  }
  func.func private @erf_impl(%x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.tanh %x : tensor<4xf32>
    return %0 : tensor<4xf32>
  }"""


def lowered_module(f, *args, **jit_kwargs):
    """The StableHLO MLIR module JAX hands to `backend.compile` for the CPU platform."""
    traced = jax.jit(f, **jit_kwargs).trace(*args)
    return traced.lower(lowering_platforms=("cpu",)).compiler_ir("stablehlo")


def bytecode(mlir_module) -> bytes:
    buf = io.BytesIO()
    mlir_module.operation.write_bytecode(file=buf)
    return buf.getvalue()


def serialize(code: bytes | str, target: str = PLUGIN_VERSION) -> bytes:
    """MLIR bytecode/text -> portable artifact, through XLA's C++ serializer."""
    data = code.encode() if isinstance(code, str) else code
    return _jax.mlir.serialize_portable_artifact(data, target)


def artifact_of(f, *args, target: str = PLUGIN_VERSION, **jit_kwargs) -> bytes:
    """The bytes PJRT_Client_Compile receives for `jax.jit(f)(*args)`."""
    return serialize(bytecode(lowered_module(f, *args, **jit_kwargs)), target)


def from_text(text: str, name: str = "test") -> ir.Module:
    """Our IR for StableHLO text (no MLIR passes, no pipeline)."""
    _, mlir_module = importer.deserialize(text)
    return importer.import_module(mlir_module, name=name)


def kinds(block: ir.Block) -> list[str]:
    """Op kinds of a block, without nested ops."""
    return [op.kind for op in block.ops]


def all_kinds(module: ir.Module) -> list[str]:
    return [op.kind for fn in module.functions.values() for op in ir.walk(fn.body)]


def on_trn_and_cpu(trn, cpu, f, *args):
    """jax.jit(f)(*args) on the trn device and on CPU, float32 matmuls at HIGHEST (the
    conformance rule for comparing them tightly): (trn result, CPU result) as numpy."""
    import numpy as np
    g = jax.jit(f)
    with jax.default_matmul_precision("highest"):
        return tuple(np.asarray(g(*(jax.device_put(a, dev) for a in args)))
                     for dev in (trn, cpu))
