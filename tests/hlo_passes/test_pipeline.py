"""Pipeline: order, fixpoints, verification after each pass, dumps, disabling."""
from __future__ import annotations

import jax.numpy as jnp
import pytest

import hlo_passes
from hlo_passes import Fix, Pipeline, ir
from hlo_passes.errors import VerifyError
from tests.hlo_passes.helpers import artifact_of, from_text, kinds

TEXT = """
  func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.reshape %x : (tensor<4xf32>) -> tensor<4xf32>
    %1 = stablehlo.exponential %0 : tensor<4xf32>
    %2 = stablehlo.exponential %x : tensor<4xf32>
    %3 = stablehlo.add %1, %2 : tensor<4xf32>
    return %3 : tensor<4xf32>
  }"""


class Recorder:
    """A pass that records calls and reports a change the first `changes` times."""

    def __init__(self, name: str, changes: int = 0):
        self.name, self.changes, self.calls = name, changes, 0

    def run(self, module: ir.Module) -> bool:
        self.calls += 1
        return self.calls <= self.changes


class Breaker:
    name = "breaker"

    def run(self, module: ir.Module) -> bool:
        module.main.body.ops.pop()        # drop the terminator
        return True


def test_default_pipeline_reaches_fixpoint():
    module = from_text(TEXT)
    assert hlo_passes.default_pipeline(fuse=False, dump_dir=None).run(module)
    assert kinds(module.main.body) == ["exponential", "add", "func.return"]


def test_default_pipeline_ends_with_fusion():
    module = from_text(TEXT)
    pipeline = hlo_passes.default_pipeline(dump_dir=None)
    assert pipeline.run(module)
    assert pipeline.log[-1].name == "fusion"
    assert kinds(module.main.body) == ["fusion", "func.return"]
    (fusion,) = module.main.body.ops[:1]
    assert kinds(fusion.regions[0].block) == ["exponential", "add", "return"]


def test_fix_repeats_until_no_change():
    a, b = Recorder("a", changes=2), Recorder("b")
    pipeline = Pipeline([Fix([a, b])], dump_dir=None)
    assert pipeline.run(from_text(TEXT))
    assert a.calls == b.calls == 3
    assert [r.name for r in pipeline.log] == ["a", "b"] * 3


def test_fix_that_never_converges_raises():
    with pytest.raises(VerifyError, match="did not converge"):
        Pipeline([Fix([Recorder("a", changes=100)], max_iterations=4)],
                 dump_dir=None).run(from_text(TEXT))


def test_verifier_runs_after_each_pass():
    with pytest.raises(VerifyError, match="after pass breaker"):
        Pipeline([Breaker()], dump_dir=None).run(from_text(TEXT))
    Pipeline([Breaker()], verify=False, dump_dir=None).run(from_text(TEXT))


def test_disable_passes_by_name(monkeypatch):
    monkeypatch.setenv("JAX_TRN_DISABLE_PASSES", "cse, b")
    a, b = Recorder("a"), Recorder("b")
    module = from_text(TEXT)
    pipeline = hlo_passes.default_pipeline(fuse=False, dump_dir=None)
    pipeline.passes += [a, b]
    pipeline.run(module)
    assert "cse" not in [r.name for r in pipeline.log]
    assert (a.calls, b.calls) == (1, 0)
    assert kinds(module.main.body).count("exponential") == 2


def test_dumps_after_every_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("JAX_TRN_DUMP", str(tmp_path))
    module = hlo_passes.compile_to_ir(artifact_of(lambda x: jnp.tanh(x) * 2, jnp.ones(3)))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0] == "jit__lambda.00.import.txt"
    assert names[1] == "jit__lambda.01.inline-calls.txt"
    assert {n.split(".")[2] for n in names} >= {"import", "inline-calls", "simplify",
                                                "cse", "dce"}
    assert (tmp_path / names[-1]).read_text() == ir.format_module(module)


def test_explicit_name_and_no_dump_by_default(tmp_path, monkeypatch):
    monkeypatch.delenv("JAX_TRN_DUMP", raising=False)
    module = hlo_passes.compile_to_ir(artifact_of(jnp.sin, jnp.ones(3)), name="prog_7")
    assert module.name == "prog_7"
    assert Pipeline([]).dump_dir is None
