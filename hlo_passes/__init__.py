"""StableHLO in, our small IR out: deserialize, MLIR passes, import, pass pipeline.

    compile_to_ir(code, name=None, fuse=True) -> ir.Module   # what pjrt_plugin calls
    deserialize(code) -> (mlir context, mlir module)
    run_mlir_passes(mlir_module)                    # Shardy round-trip import, chlo
    import_module(mlir_module, name=None) -> ir.Module
    default_pipeline(fuse=True) -> Pipeline          # inline, localize (SPMD),
                                                    # fix(simplify,cse,dce), fusion
    Pipeline([...], verify=True, dump_dir=$JAX_TRN_DUMP), Fix([...]), verify(module)
"""
from __future__ import annotations

from hlo_passes import ir
from hlo_passes.errors import HloImportError, VerifyError
from hlo_passes.importer import artifact_version, deserialize, import_module
from hlo_passes.mlir_passes import run_mlir_passes
from hlo_passes.passes import cse, dce, fusion, inline_calls, localize, simplify
from hlo_passes.pipeline import Fix, Pipeline
from hlo_passes.verifier import verify

__all__ = [
        "HloImportError", "VerifyError", "Fix", "Pipeline", "compile_to_ir",
        "default_pipeline", "deserialize", "import_module", "ir", "run_mlir_passes",
        "verify",
]


def default_pipeline(*, fuse: bool = True, **kwargs) -> Pipeline:
    """The hardware-agnostic pipeline every program gets after import: inlining, SPMD
    localization (multi-device programs), cleanup to a fixpoint, then fusion (`fuse=False` stops after cleanup; at run time
    JAX_TRN_DISABLE_PASSES=fusion does the same)."""
    cleanup = [inline_calls, localize, Fix([simplify, cse, dce])]
    return Pipeline(cleanup + ([fusion] if fuse else []), **kwargs)


def compile_to_ir(code: bytes | str, *, name: str | None = None,
                  fuse: bool = True) -> ir.Module:
    """Bytes from PJRT_Client_Compile (format "mlir") -> verified, optimized IR.

    `name` names the module (and its IR dumps); by default the MLIR module's name
    ("jit_f"), or "module". `fuse=False` skips the fusion pass.
    """
    _, mlir_module = deserialize(code)
    run_mlir_passes(mlir_module)
    module = import_module(mlir_module, name=name)
    version = artifact_version(code if isinstance(code, bytes) else b"")
    if version:
        module.attrs["stablehlo.version"] = version
    default_pipeline(fuse=fuse).run(module)
    return module
