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


def test_default_pipeline_ends_with_the_fusion_passes():
    module = from_text(TEXT)
    pipeline = hlo_passes.default_pipeline()
    assert pipeline.run(module)
    assert [r.name for r in pipeline.log][-13:] == [
            "degenerate-reduce", "convert-into-reduce", "transposed-dot", "attention-bwd-fusion", "attention-fusion",
            "dot-operand-transpose", "convert-into-dot", "broadcast-before-convert", "pads-to-concat", "fusion",
            "compose-views", "attention-views", "dce"]
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


def test_disable_passes_by_name():
    a, b = Recorder("a"), Recorder("b")
    module = from_text(TEXT)
    passes = hlo_passes.default_pipeline(fuse=False).passes + [a, b]
    pipeline = Pipeline(passes, disabled={"cse", "b"})
    pipeline.run(module)
    assert "cse" not in [r.name for r in pipeline.log]
    assert (a.calls, b.calls) == (1, 0)
    assert kinds(module.main.body).count("exponential") == 2


def test_pass_names_are_every_name_that_can_be_disabled():
    names = hlo_passes.pass_names()
    assert names == ("inline-calls", "localize", "complex-planes", "total-order-compare", "rank0-windows",
                     "split-reductions", "simplify", "cse", "dce", "combine-all-reduce", "linear-iota",
                     "mx-quantize",
                     "onehot-contract", "degenerate-reduce", "convert-into-reduce",
                     "transposed-dot", "attention-bwd-fusion",
                     "attention-fusion", "dot-operand-transpose", "convert-into-dot", "broadcast-before-convert",
                     "pads-to-concat", "fusion", "compose-views", "attention-views")
    pipeline = hlo_passes.default_pipeline(disabled=names)
    module = from_text(TEXT)
    assert not pipeline.run(module) and pipeline.log == []


@pytest.mark.parametrize("make", [
    lambda d: hlo_passes.default_pipeline(disabled=d),
    lambda d: hlo_passes.default_pipeline(fuse=False, disabled=d),
    lambda d: Pipeline([Recorder("a"), Fix([Recorder("b")])], disabled=d),
])
def test_unknown_pass_names_are_an_error(make):
    """Was: JAX_TRN_DISABLE_PASSES=nosuchpass silently ignored."""
    with pytest.raises(ValueError, match=r"unknown passes nosuchpass, zzz \(passes: .*\)"):
        make({"nosuchpass", "zzz"})
    with pytest.raises(ValueError, match=r"unknown pass fix\(b\)"):
        make({"fix(b)"})


def test_unknown_names_are_reported_before_any_work():
    with pytest.raises(ValueError, match="unknown pass fuse"):
        hlo_passes.compile_to_ir(b"not even mlir", disabled_passes=["fuse"])


def test_fusion_pass_names_are_valid_without_fusion():
    pipeline = hlo_passes.default_pipeline(fuse=False, disabled={"fusion", "cse"})
    assert pipeline.disabled == {"cse"}


def test_dumps_after_every_pass(tmp_path):
    module = hlo_passes.compile_to_ir(artifact_of(lambda x: jnp.tanh(x) * 2, jnp.ones(3)),
                                      dump_dir=tmp_path / "dumps")
    names = sorted(p.name for p in (tmp_path / "dumps").iterdir())
    assert names[0] == "jit__lambda.00.import.txt"
    assert names[1] == "jit__lambda.01.inline-calls.txt"
    assert {n.split(".")[2] for n in names} >= {"import", "inline-calls", "simplify", "cse",
                                                "dce", "degenerate-reduce", "transposed-dot",
                                                "attention-fusion", "fusion"}
    assert names[-4:] == [f"jit__lambda.{len(names) - 4:02d}.fusion.txt",
                          f"jit__lambda.{len(names) - 3:02d}.compose-views.txt",
                          f"jit__lambda.{len(names) - 2:02d}.attention-views.txt",
                          f"jit__lambda.{len(names) - 1:02d}.dce.txt"]
    assert (tmp_path / "dumps" / names[-1]).read_text() == ir.format_module(module)


def test_disabled_passes_are_not_dumped(tmp_path):
    hlo_passes.compile_to_ir(artifact_of(lambda x: jnp.tanh(x) * 2, jnp.ones(3)),
                             dump_dir=tmp_path, disabled_passes={"fusion", "transposed-dot"})
    steps = {p.name.split(".")[2] for p in tmp_path.iterdir()}
    assert "fusion" not in steps and "transposed-dot" not in steps
    assert "attention-fusion" in steps


def test_dump_dir_that_is_a_file_is_a_clear_error(tmp_path):
    """Was: INTERNAL ... FileExistsError from inside the first dump."""
    path = tmp_path / "dump"
    path.write_text("")
    pipeline = hlo_passes.default_pipeline(dump_dir=path)
    with pytest.raises(ValueError, match=f"IR dump directory {path}: exists and is not a "
                                         "directory"):
        pipeline.run(from_text(TEXT))
    with pytest.raises(ValueError, match="not a directory"):
        hlo_passes.compile_to_ir(artifact_of(jnp.sin, jnp.ones(3)), dump_dir=path)


def test_dump_dir_under_a_file_is_a_clear_error(tmp_path):
    (tmp_path / "file").write_text("")
    path = tmp_path / "file" / "dump"
    with pytest.raises(ValueError, match=f"IR dump directory {path}: cannot be created"):
        Pipeline([], dump_dir=path).run(from_text(TEXT))


def test_dump_dir_not_writable_is_a_clear_error(tmp_path, monkeypatch):
    import os
    monkeypatch.setattr(os, "access", lambda path, mode: False)    # root may write anyway
    with pytest.raises(ValueError, match=f"IR dump directory {tmp_path}: not writable"):
        Pipeline([], dump_dir=tmp_path).run(from_text(TEXT))


def test_the_environment_is_not_read(tmp_path, monkeypatch):
    """Options come in as parameters; the old variables change nothing here."""
    monkeypatch.setenv("JAX_TRN_DUMP", str(tmp_path))
    monkeypatch.setenv("JAX_TRN_DISABLE_PASSES", "fusion")
    code = artifact_of(lambda x: jnp.tanh(x) * 2, jnp.ones(3))
    module = hlo_passes.compile_to_ir(code, name="prog_7")
    assert module.name == "prog_7"
    assert kinds(module.main.body) == ["fusion", "func.return"]
    assert not list(tmp_path.iterdir())
    assert Pipeline([]).dump_dir is None and Pipeline([]).disabled == frozenset()
