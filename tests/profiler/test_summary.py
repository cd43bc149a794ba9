"""The summary page: definitions of the ratios, bounds, kernel table and insights."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.profiler import metrics
from jax_trn.profiler.insights import insights
from tests.profiler.helpers import layer, layer_inputs, profiled


@pytest.fixture(scope="module")
def ex(jax, trn):
    _, args = layer_inputs(jax, trn)
    return profiled(jax, jax.jit(layer), *args).executions[-1]


@pytest.fixture(scope="module")
def d(ex):
    return ex.summary_dict()


def test_headline_numbers_follow_their_definitions(ex, d):
    assert d["total_time_s"] == pytest.approx(ex.simulated_time_s)
    peak = ex.chip_spec.peak_tflops_per_core("bfloat16") * 1e12
    assert d["dtype"] == "bfloat16" and d["peak_tflops_per_core"] * 1e12 == peak
    assert d["mfu_estimated_percent"] == pytest.approx(
        100 * ex.flops / (ex.simulated_time_s * peak))
    assert d["mfu_estimated_percent"] == pytest.approx(100 * ex.mfu)
    assert d["hfu_estimated_percent"] >= d["mfu_estimated_percent"] * 0.99
    dma = ex.chip_spec.core.dma_bytes_per_ns * ex.simulated_time_s * 1e9
    assert d["dma_bandwidth_percent"] == pytest.approx(100 * d["dma_bytes"] / dma)
    assert d["mbu_estimated_percent"] == max(d["dma_bandwidth_percent"],
                                             d["hbm_bandwidth_percent"])
    assert d["mm_arithmetic_intensity"] == pytest.approx(ex.flops / ex.hbm_bytes)


def test_engine_active_matches_execution_utilization(ex, d):
    for e, u in ex.engine_utilization.items():
        assert d["engine_active_percent"][e] == pytest.approx(100 * u)
        assert 0 <= d["engine_active_percent"][e] <= 100
    assert set(d["semaphore_wait_percent"]) == {"tensor", "vector", "scalar", "gpsimd"}
    assert sum(d["tensor_busy_breakdown_percent"].values()) == pytest.approx(100)


def test_kernel_table_is_sorted_and_complete(ex, d):
    rows = d["kernels"]
    assert len(rows) == len(ex.kernels)
    assert [r["time_s"] for r in rows] == sorted((r["time_s"] for r in rows), reverse=True)
    assert sum(r["time_percent"] for r in rows) == pytest.approx(100)
    assert all(r["bound"] in ("compute", "memory", "latency") for r in rows)
    dot = next(r for r in rows if r["name"].startswith("dot_general"))
    assert dot["flops"] > 0 and dot["engine_active_percent"]["tensor"] > 0
    assert dot["ops"][0].startswith("dot_general at ")


def test_insights_are_few_and_ranked(ex, d):
    found = d["insights"]
    assert 1 <= len(found) <= 4
    assert [i["impact_s"] for i in found] == sorted((i["impact_s"] for i in found),
                                                   reverse=True)
    assert any("dot_general" in i["message"] for i in found)


def test_text_page_shows_the_numbers(ex, d):
    text = str(ex.summary())
    for needle in ("simulated time", "MFU (bfloat16)", "MBU", "TensorE", "top kernels",
                   "insights", d["kernels"][0]["name"]):
        assert needle in text
    assert f"{d['total_time_s'] * 1e6:.2f} us" in text
    assert max(len(line) for line in text.splitlines()[:12]) < 120


@pytest.mark.parametrize("active, mbu, bound", [
    ({"tensor": 0.95, "vector": 0.2}, 0.1, "compute"),
    ({"tensor": 0.3, "vector": 0.91}, 0.3, "compute"),
    ({"tensor": 0.3}, 0.7, "memory"),
    ({"tensor": 0.91}, 0.95, "memory"),
    ({"tensor": 0.99}, 0.61, "compute"),
    ({"tensor": 0.5, "vector": 0.5}, 0.5, "latency"),
])
def test_bound_rules(active, mbu, bound):
    assert metrics.classify(active, mbu)[0] == bound


def test_dma_queues_busy_below_the_mbu_threshold_is_memory_bound():
    """DMA queues always busy yet far from the DMA rate: small descriptors (§3.4)."""
    bound, why = metrics.classify({"tensor": 0.33, "vector": 0.33}, 0.24, dma_active=1.0)
    assert bound == "memory" and "descriptors" in why
    assert metrics.classify({"tensor": 0.33}, 0.24, dma_active=0.5)[0] == "latency"


def test_small_dma_insight(jax, trn):
    x = jax.device_put(np.ones((128, 64), np.float32), trn)   # 256 B per partition
    ex = profiled(jax, jax.jit(lambda a: a + 1), x).executions[-1]
    found = insights([ex], metrics.kernel_stats([ex]), limit=100)
    small = [i for i in found if i.kind == "small_dma"]
    assert small and "under 512 B per partition" in small[0].message


def test_profile_summary_adds_executions(jax, trn):
    _, args = layer_inputs(jax, trn, 128, 256, 128)
    f = jax.jit(layer)
    prof = profiled(jax, lambda *a: (f(*a), f(*a)), *args)
    d = prof.summary_dict()
    assert d["executions"] == 2
    assert d["total_time_s"] == pytest.approx(
        sum(ex.simulated_time_s for ex in prof.executions))
    assert all(r["calls"] == 2 for r in d["kernels"])
    assert "2 executions" in str(prof.summary())
