"""cost_analysis() with simulated time, and jax_trn.compare across generations."""
from __future__ import annotations

import pytest

import jax_trn
from tests.profiler.helpers import layer, layer_inputs, profiled

SYSTEMS = ["trn1.2xlarge", "trn2.3xlarge", "trn3-ultraserver"]


def test_cost_analysis_reports_simulated_time(jax, trn):
    _, args = layer_inputs(jax, trn)
    compiled = jax.jit(layer).lower(*args).compile()
    cost = compiled.cost_analysis()
    assert cost["flops"] > 2 * 256 * 512 * 128
    assert cost["bytes accessed"] == 2 * (256 * 512 + 512 * 128 + 128 + 256 * 128)
    assert cost["simulated_time_s"] > 0 and 0 < cost["mfu"] < 1 and 0 < cost["mbu"] < 1
    assert cost["hbm bytes"] >= cost["bytes accessed"]
    assert compiled.cost_analysis() == cost                      # cached, deterministic
    ex = profiled(jax, jax.jit(layer), *args).executions[-1]
    # PJRT passes float named values as C floats: 24-bit mantissa.
    assert cost["simulated_time_s"] == pytest.approx(ex.simulated_time_s, rel=1e-6)


def test_compile_does_not_run_the_timing_simulation(jax, trn, monkeypatch):
    import numpy as np

    from jax_trn.runtime import executable
    calls = []
    monkeypatch.setattr(executable, "simulate", lambda *a, **k: calls.append(a))
    x = jax.device_put(np.ones((8, 8), np.float32), trn)
    jax.jit(lambda a: a * 3 + 1).lower(x).compile()
    assert calls == []


@pytest.fixture(scope="module")
def comparison(jax):
    host, _ = layer_inputs(jax, jax.devices("cpu")[0])
    return jax_trn.compare(layer, *host, systems=SYSTEMS)


def test_compare_rows_per_system(comparison):
    rows = comparison.rows
    assert [r["system"] for r in rows] == SYSTEMS
    assert [r["chip"] for r in rows] == ["Trainium1", "Trainium2", "Trainium3"]
    for r in rows:
        assert r["simulated_time_s"] > 0 and 0 < r["mfu"] < 1
        assert r["bound"] in ("compute", "memory", "latency") and r["dtype"] == "bfloat16"
    assert rows[0]["speedup"] == 1.0
    assert comparison["trn2.3xlarge"] is rows[1]
    gens = {ex.generation for ex in comparison.executions.values()}
    assert gens == {"trn1", "trn2", "trn3"}


def test_compare_table_prints_every_system(comparison):
    text = str(comparison)
    for s in SYSTEMS:
        assert s in text
    assert "MFU" in text and "bound" in text and len(text.splitlines()) == 2 + len(SYSTEMS)


def test_compare_matches_a_real_run_on_the_backend(jax, trn, comparison):
    system = jax_trn.get_system()
    if system.name not in SYSTEMS:
        pytest.skip(f"backend runs {system.name}")
    _, args = layer_inputs(jax, trn)
    ex = profiled(jax, jax.jit(layer), *args).executions[-1]
    assert comparison[system.name]["simulated_time_s"] == pytest.approx(
        ex.simulated_time_s, rel=1e-12)


def test_compare_rejects_an_unknown_system(jax):
    import numpy as np
    with pytest.raises(ValueError, match="unknown Trainium system"):
        jax_trn.compare(lambda a: a + 1, np.ones(4, np.float32), systems=["trn9"])
