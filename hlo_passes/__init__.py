"""StableHLO in, our small IR out: deserialize, MLIR passes, import, pass pipeline.

    compile_to_ir(code, *, name=None, fuse=True, disabled_passes=frozenset(),
                  dump_dir=None) -> ir.Module        # what the compile driver calls
    deserialize(code) -> (mlir context, mlir module)
    run_mlir_passes(mlir_module)                    # Shardy round-trip import, chlo
    import_module(mlir_module, name=None) -> ir.Module
    default_pipeline(*, fuse=True, disabled=frozenset(), dump_dir=None) -> Pipeline
    pass_names() -> ("inline-calls", ...)           # every name `disabled` accepts
    Pipeline([...], verify=True, dump_dir=None, disabled=frozenset()), Fix([...]),
    verify(module)

The default pipeline, one pass per file in hlo_passes/passes/ (the names are the ones
dumps and `disabled` use):

    inline-calls         func.call / composite ops inlined
    localize             SPMD programs to per-device shapes and collectives
    complex-planes       complex values -> pairs of real planes (complex64 -> 2 x f32)
    total-order-compare  float compare TOTALORDER -> SIGNED compare of integer keys
    rank0-windows        convolution / reduce_window over no dims: one unit dim added
    split-reductions     variadic reduce / reduce_window with a separable body -> one each
    fix(simplify, cse, dce)   cleanup, repeated until nothing changes
    combine-all-reduce   independent all_reduces -> one variadic all_reduce per bucket
    linear-iota          sum of iotas * row-major strides (threefry's   } fuse=True
                         counters) -> reshape of one flat iota          }
    mx-quantize          JAX's MX quantization -> one mx_quantize op   }
    onehot-contract      sum(onehot(t) * y) -> y gathered at t (+ b*sum(y)) }
    degenerate-reduce    reduce over extent-1 dims -> reshape          }
    convert-into-reduce  f32 reduce (+ reshapes) + convert to bf16 ->  }
                         one reduce with the bf16 result               }
    transposed-dot       transpose(dot(a, b)) -> dot(b, a)              } only
    attention-bwd-fusion softmax(q k^T) v with its gradient -> fusions  }
                         "attention" (+ logsumexp) and "attention_bwd"  }
    attention-fusion     softmax(q k^T) v -> fusion "attention"         }
    dot-operand-transpose  dot(a, transpose(b)) -> dot(a, b), other dims }
    convert-into-dot     f32 -> bf16 converts read by dots only -> the  }
                         dots' operand loads (DMA casts)                }
    broadcast-before-convert  broadcast(convert(x)) -> convert(broadcast(x)) }
    pads-to-concat       a sum of zero-padded disjoint pieces -> concatenate }
    fusion               loop / reduction / matmul-epilogue regions     }
    compose-views        chains of layout ops left outside fusions ->   }
                         one strided view (trn.view)                    }
    attention-views      attention kernels read q, k, v through those   }
                         views (attention_offsets), no copy             }
    dce                  what the rewrites above left without users     }

Everything is a parameter; nothing here reads the environment (the caller's options
object does, once).
"""
from __future__ import annotations

import os
from typing import Iterable

from hlo_passes import ir
from hlo_passes.errors import HloImportError, VerifyError
from hlo_passes.fusion_policy import FusionPolicy
from hlo_passes.importer import artifact_version, deserialize, import_module
from hlo_passes.mlir_passes import run_mlir_passes
from hlo_passes.passes import (
    attention_views,
    broadcast_before_convert,
    combine_all_reduce,
    complex_planes,
    compose_views,
    convert_into_dot,
    convert_into_reduce,
    cse,
    dce,
    degenerate_reduce,
    dot_operand_transpose,
    inline_calls,
    linear_iota,
    localize,
    mx_quantize,
    onehot_contract,
    pads_to_concat,
    rank0_windows,
    simplify,
    split_reductions,
    total_order_compare,
    transposed_dot,
)
from hlo_passes.passes.attention_bwd_fusion import AttentionBwdFusion
from hlo_passes.passes.attention_fusion import AttentionFusion
from hlo_passes.passes.fusion import Fusion
from hlo_passes.pipeline import Fix, Pipeline, check_disabled, names_of
from hlo_passes.verifier import verify

__all__ = [
        "HloImportError", "VerifyError", "Fix", "FusionPolicy", "Pipeline",
        "compile_to_ir", "default_pipeline", "deserialize", "import_module", "ir",
        "pass_names", "run_mlir_passes", "verify",
]


def _cleanup() -> list:
    return [inline_calls, localize, complex_planes, total_order_compare, rank0_windows,
            split_reductions,
            Fix([simplify, cse, dce]), combine_all_reduce]


def _fusion(policy: FusionPolicy) -> list:
    return [linear_iota, mx_quantize, onehot_contract, degenerate_reduce, convert_into_reduce,
            transposed_dot,
            AttentionBwdFusion(policy), AttentionFusion(policy), dot_operand_transpose,
            convert_into_dot, broadcast_before_convert,
            pads_to_concat, Fusion(policy), compose_views, attention_views, dce]


def pass_names() -> tuple[str, ...]:
    """Every pass name `disabled` / `disabled_passes` accepts, in pipeline order."""
    return names_of(_cleanup() + _fusion(FusionPolicy()))


def default_pipeline(*, fuse: bool = True, disabled: Iterable[str] = frozenset(),
                     dump_dir: str | os.PathLike | None = None, verify: bool = True,
                     policy: FusionPolicy | None = None) -> Pipeline:
    """The hardware-agnostic pipeline every program gets after import (module
    docstring). `fuse=False` stops after cleanup (no rewrite for fusion, no fusion);
    `disabled` skips passes by name (any of `pass_names()`, whatever `fuse` says;
    others are a ValueError); `policy` decides attention-fusion and fusion."""
    disabled = check_disabled(disabled, pass_names())
    passes = _cleanup() + (_fusion(policy or FusionPolicy()) if fuse else [])
    return Pipeline(passes, verify=verify, dump_dir=dump_dir,
                    disabled=disabled & set(names_of(passes)))


def compile_to_ir(code: bytes | str, *, name: str | None = None, fuse: bool = True,
                  disabled_passes: Iterable[str] = frozenset(),
                  dump_dir: str | os.PathLike | None = None) -> ir.Module:
    """Bytes from PJRT_Client_Compile (format "mlir") -> verified, optimized IR.

    `name` names the module (and its IR dumps); by default the MLIR module's name
    ("jit_f"), or "module". `fuse`, `disabled_passes`: see `default_pipeline`;
    `dump_dir`: the IR after every pass goes there. Unknown pass names are a ValueError
    before any work, an unusable dump directory one before the first pass.
    """
    pipeline = default_pipeline(fuse=fuse, disabled=disabled_passes, dump_dir=dump_dir)
    _, mlir_module = deserialize(code)
    version = artifact_version(code if isinstance(code, bytes) else b"")
    run_mlir_passes(mlir_module, as_serialized=not version)
    module = import_module(mlir_module, name=name)
    if version:
        module.attrs["stablehlo.version"] = version
    pipeline.run(module)
    return module
