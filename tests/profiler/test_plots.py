"""Plots (the optional `plots` extra): skipped when matplotlib is missing."""
from __future__ import annotations

import pytest

from tests.profiler.helpers import layer, layer_inputs, profiled

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")


@pytest.fixture(scope="module")
def ex(jax, trn):
    _, args = layer_inputs(jax, trn)
    return profiled(jax, jax.jit(layer), *args).executions[-1]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt
    plt.close("all")


def test_timeline_has_a_row_per_engine_and_queue(ex, tmp_path):
    ax = ex.plot_timeline()
    labels = [t.get_text() for t in ax.get_yticklabels()]
    queues = {i.queue for i in ex.instructions}
    assert len(labels) == len(queues) and labels[0] == "TensorE"
    assert ax.get_legend() is not None
    ax.figure.savefig(tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 10_000


def test_utilization_bars_are_the_summary_numbers(ex):
    ax = ex.plot_utilization()
    d = ex.summary_dict()
    heights = [p.get_height() for p in ax.patches]
    expected = [*d["engine_active_percent"].values(), d["mfu_estimated_percent"],
                d["mbu_estimated_percent"]]
    assert heights == pytest.approx(expected)


def test_roofline_plots_kernels_with_flops(ex):
    ax = ex.plot_roofline()
    assert ax.get_xscale() == "log" and len(ax.collections) >= 1
    assert any("dot_general" in t.get_text() for t in ax.texts)


def test_collectives_plot_without_collectives(ex):
    assert "no collectives" in ex.plot_collectives().get_title()
