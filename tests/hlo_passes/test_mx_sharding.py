"""Shardy on a custom_call with its own sharding rule (hlo_passes/mlir_passes.py): the
mx_matmul rule of jax_trn/jax_mx.py survives propagation, so a sharded reduction factor
(K) gets an all_reduce after the op; other programs run Shardy as before."""
from __future__ import annotations

from jaxlib.mlir import ir as mlir_ir

from hlo_passes import importer, mlir_passes

RULE = ("#sdy.op_sharding_rule<([i, j, kl], [i, m, kl], [i, j, k], [i, m, k])->([i, j, m]) "
        "{i=2, j=64, k=4, l=32, m=32} reduction={k}>")
TYPES = ("tensor<2x64x128xf8E4M3FN>", "tensor<2x32x128xf8E4M3FN>",
         "tensor<2x64x4xf8E8M0FNU>", "tensor<2x32x4xf8E8M0FNU>")


def _module(dims: tuple[str, str, str], rule: bool = True) -> str:
    """main(a, b, sa, sb) = custom_call @trn.mx_matmul, every argument sharded `dims`
    (lhs data and scales: batch, M, K; rhs alike), in a private function as JAX
    emits it (the primitive's jit)."""
    spec = ", ".join("{%s}" % (f'"{d}"' if d else "") for d in dims)
    sharding = f'{{sdy.sharding = #sdy.sharding<@mesh, [{spec}]>}}'
    args = ", ".join(f"%a{i}: {t} {sharding}" for i, t in enumerate(TYPES))
    plain = ", ".join(f"%a{i}: {t}" for i, t in enumerate(TYPES))
    types = ", ".join(TYPES)
    attr = f" {{sdy.sharding_rule = {RULE}}}" if rule else ""
    return f"""
module @m attributes {{mhlo.num_partitions = 2 : i32}} {{
  sdy.mesh @mesh = <["x"=2]>
  func.func public @main({args}) -> tensor<2x64x32xf32> {{
    %0 = call @f(%a0, %a1, %a2, %a3) : ({types}) -> tensor<2x64x32xf32>
    return %0 : tensor<2x64x32xf32>
  }}
  func.func private @f({plain}) -> tensor<2x64x32xf32> {{
    %0 = stablehlo.custom_call @trn.mx_matmul(%a0, %a1, %a2, %a3){attr} : ({types}) -> tensor<2x64x32xf32>
    return %0 : tensor<2x64x32xf32>
  }}
}}"""


def _run(text: str) -> str:
    with importer.make_context() as ctx:
        module = mlir_ir.Module.parse(text, ctx)
        mlir_passes.run_mlir_passes(module)
        return str(module)


def test_k_sharded_custom_call_gets_an_all_reduce():
    out = _run(_module((None, None, "x")))
    assert 'sdy.all_reduce {"x"}' in out
    assert "sdy.sharding_rule" not in out and mlir_passes.KEPT_RULE not in out


def test_batch_sharded_custom_call_needs_no_collective():
    out = _run(_module(("x", None, None)))
    assert "sdy.all_reduce" not in out and "sdy.all_gather" not in out


def test_program_without_rules_runs_the_single_pipeline(monkeypatch):
    runs = []
    monkeypatch.setattr(mlir_passes, "_run", lambda m, p: runs.append(p))
    _run(_module((None, None, "x"), rule=False))
    assert mlir_passes.SHARDY in runs and mlir_passes.SHARDY_PROPAGATE not in runs
