"""The compile driver: program bytes + options -> the per-device IR and its ISA program.

One driver for everything that compiles: the PJRT client (`Client.compile`) and the
tools that compile without going through the backend (`jax_trn.compare`). Each step
takes what it needs from the `jax_trn.config.Options` it is given, never from the
environment. Both steps run with Python's garbage collector paused (`gc_pause`), and
the interpreter's exit waits for a compile still running (`inflight`).

    hlo_passes.compile_to_ir(code, ...)      # Shardy, import, our passes (disabled
                                             # passes and IR dumps from the options)
    jax_trn.lower.lower_module(module, ...)  # kernels for one NeuronCore of the
                                             # options' system (its CoreSpec)
"""
from __future__ import annotations

from collections.abc import Callable
import dataclasses
from dataclasses import dataclass

from jax_trn.config import Options

from . import inflight
from .gc_pause import gc_paused


@dataclass(frozen=True)
class Signature:
    """What the runtime needs of the per-device IR besides the lowered program: the entry
    function's parameter and result types, its parameter attributes (donation aliases)
    and the SPMD description (`hlo_passes.passes.localize.Spmd`, None for one device)."""
    param_types: tuple
    result_types: tuple
    arg_attrs: tuple
    spmd: object = None

    @classmethod
    def of(cls, module) -> "Signature":
        fn = module.main
        # complex parameters and results as JAX sees them (the program's are float32
        # pairs: hlo_passes/passes/complex_planes.py)
        params, results = module.attrs.get("trn.complex_boundary") or (
                tuple(a.type for a in fn.args), tuple(fn.result_types))
        return cls(tuple(params), tuple(results), tuple(fn.arg_attrs),
                   module.attrs.get("trn.spmd"))


@dataclass(frozen=True)
class Compiled:
    """A compiled program: its name, the lowered `hw.program.Program`, the signature the
    runtime loads it by, and the per-device IR it came from (None in a compiled program
    read back from the persistent cache or deserialized: the IR is often a hundred times
    the program's size, and nothing after compilation reads it)."""
    name: str
    program: object         # jax_trn.hw.program.Program
    signature: Signature
    module: object = None   # hlo_passes.ir.Module
    mlir_text: str | None = None   # the program as MLIR (runtime.program_mlir), if made

    def without_ir(self) -> "Compiled":
        return dataclasses.replace(self, module=None)


def to_ir(code: bytes, options: Options, *, name: str | None = None, fuse: bool = True):
    """StableHLO bytes -> verified, optimized per-device IR (`hlo_passes.ir.Module`)."""
    import hlo_passes
    inflight.checkpoint()
    with gc_paused():
        return hlo_passes.compile_to_ir(code, name=name, fuse=fuse,
                                        disabled_passes=options.disable_passes,
                                        dump_dir=options.dump)


def lower(module, options: Options):
    """Per-device IR -> the ISA program for one NeuronCore of `options.system`."""
    from jax_trn.lower import lower_module
    inflight.checkpoint()
    with gc_paused():
        return lower_module(module, options.system.chip.core,
                            matmul_precision=options.matmul_precision)


def compile_program(code: bytes, options: Options, *, name: str | None = None,
                    fuse: bool = True, check: Callable[[str, object], None] | None = None
                    ) -> Compiled:
    """Both steps. `check(name, module)` runs between them (e.g. the client's test that
    the arguments and results fit in a device's HBM, before lowering anything large).
    The interpreter's exit waits for it (`inflight`)."""
    with inflight.tracked():
        module = to_ir(code, options, name=name, fuse=fuse)
        name = str(module.attrs.get("sym_name", name) or name or "module")
        if check is not None:
            check(name, module)
        return Compiled(name, lower(module, options), Signature.of(module), module)
