"""Whole systems: a sharded matmul on every NeuronCore of a 16-chip Trn2 server (128
devices) and of a Trn3 UltraServer (1152, slow), in a fresh process per system."""
from __future__ import annotations

import json
import pathlib
import runpy

import pytest

from tests.conftest import run_python

# The benchmark's program (benchmarks/scale.py prints the same figures as a table).
CHILD = runpy.run_path(str(pathlib.Path(__file__).parents[2] / "benchmarks" / "scale.py"))["CHILD"]


def _run(system: str) -> dict:
    r = run_python(CHILD, env={"JAX_TRN_SYSTEM": system}, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_sharded_matmul_on_a_16_chip_trn2_server():
    row = _run("trn2.48xlarge")
    assert row["devices"] == 128 and row["correct"]
    assert row["kernels"] == 128 and row["collective"].startswith("all_reduce")


@pytest.mark.slow
def test_sharded_matmul_on_all_1152_cores_of_a_trn3_ultraserver():
    row = _run("trn3-ultraserver")
    assert row["devices"] == 1152 and row["correct"]
