"""benchmarks/jax_conformance.py without running JAX's tests: JUnit outcomes, error
lines grouped generically, the deterministic --sample subset, the report."""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import jax_conformance as jc  # noqa: E402

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="nn_test.NNFunctionsTest" name="testGelu0" time="1.5"/>
<testcase classname="nn_test.NNFunctionsTest" name="testGelu1" time="2.0">
  <failure message="jax.errors.JaxRuntimeError: INVALID_ARGUMENT: after pass localize: operand %v12 at /u/x.py:3 of float32[4,1] -&gt; bool[] is bad&#10;more">trace</failure>
</testcase>
<testcase classname="nn_test.NNFunctionsTest" name="testGelu2" time="0.1">
  <skipped message="needs 2 devices"/>
</testcase>
</testsuite></testsuites>"""


@pytest.fixture
def out(tmp_path):
    for platform in ("cpu", "trn"):
        xml = JUNIT if platform == "trn" else JUNIT.replace("<failure", "<x").replace(
            "</failure>", "</x>")
        (tmp_path / f"nn_test.py.{platform}.xml").write_text(xml)
    return tmp_path


def test_junit_outcomes_and_first_lines(out):
    got = jc.read_junit(str(out / "nn_test.py.trn.xml"))
    assert [o.status for o in got.values()] == ["passed", "failed", "skipped"]
    assert got["NNFunctionsTest::testGelu1"].message == (
        "jax.errors.JaxRuntimeError: INVALID_ARGUMENT: after pass localize: "
        "operand %vN of float32[..] -> bool[..] is bad")


def test_missing_xml_is_no_outcomes(tmp_path):
    assert jc.read_junit(str(tmp_path / "none.xml")) == {}


def test_sample_thins_only_big_groups():
    ids = [f"f.py::C::testBig{i}" for i in range(60)] + ["f.py::C::testSmall_a",
                                                         "f.py::C::testSmall_b"]
    kept = jc.sample(ids, ["testBig", "testSmall"], 4)
    assert kept == ids[0:60:4] + ids[60:]


def test_report_counts_cpu_passing_tests(out, capsys):
    jc.report(SimpleNamespace(files=["nn_test.py"], out=str(out)))
    text = capsys.readouterr().out
    assert "| nn_test.py | 2 | 0 | 2 | 1 | 50.0% |" in text
    assert "1  jax.errors.JaxRuntimeError" in text
