"""The profiler's view of collectives on a real 8-device run (the 8 NeuronCores of the
default Trn2 chip): `summary()` (time share, exposed time, per-kind and per-collective
rows), `save_trace()` (one "core N collectives" track per device, algorithm and
participants in args) and the collective scatter plot, from the `CollectiveRecord`s the
SPMD runtime produces (jax_trn/runtime/spmd.py)."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from tests.profiler.helpers import check_trace

RNG = np.random.default_rng(5)
X = RNG.normal(size=(8 * 64, 256)).astype(np.float32)
A = RNG.normal(size=(8 * 128, 128)).astype(np.float32)
W = RNG.normal(size=(128, 128)).astype(np.float32)


def body(x, a, w):
    import jax
    s = jax.lax.psum(x, "y")                       # 4 groups of 2 devices
    g = jax.lax.all_gather(x[:8], ("x", "y"), tiled=True)   # all 8 devices
    return s, g, a @ w                             # the matmul depends on neither


@pytest.fixture(scope="module")
def ex(jax, trn_devices):
    from jax import shard_map
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import jax_trn
    mesh = jax.make_mesh((4, 2), ("x", "y"), devices=trn_devices[:8])
    spec = P(("x", "y"))
    f = jax.jit(shard_map(body, mesh=mesh, in_specs=(spec, spec, P()),
                          out_specs=(spec, spec, spec), check_vma=False))
    args = [jax.device_put(X, NamedSharding(mesh, spec)), jax.device_put(A, NamedSharding(mesh, spec)),
            jax.device_put(W, NamedSharding(mesh, P()))]
    with jax.default_matmul_precision("highest"), jax_trn.profile() as prof:
        jax.block_until_ready(f(*args))
    return prof.executions[-1]


def test_records_carry_groups_spans_and_steps(ex):
    assert {c.kind for c in ex.collectives} == {"all_gather", "all_reduce"}
    ar = next(c for c in ex.collectives if c.kind == "all_reduce")
    assert len(ar.groups) == 4 and all(len(g) == 2 for g in ar.groups)
    for c in ex.collectives:
        assert c.algorithm and c.bytes > 0 and c.steps and len(c.arrival_ns) == 8
        assert sorted(d for d, _, _ in c.spans) == sorted(c.devices)
        assert all(c.start_ns <= a < b <= c.end_ns for _, a, b in c.spans)


def test_summary_has_collective_share_and_rows(ex):
    d = ex.summary_dict()["collectives"]
    assert d["count"] == len(ex.collectives) and set(d["durations_s"]) == {"all_gather", "all_reduce"}
    assert d["time_s"] == pytest.approx(sum(c.duration_ns for c in ex.collectives) * 1e-9)
    assert 0 < d["time_percent"]
    # the matmul runs beside the collectives: not all of their time is exposed
    assert 0 <= d["exposed_s"] < d["time_s"]
    rows = {r["name"]: r for r in d["list"]}
    assert {r["kind"] for r in rows.values()} == {"all_gather", "all_reduce"}
    assert all(r["algorithm"] and r["participants"] == 8 for r in rows.values())
    assert next(r for r in rows.values() if r["kind"] == "all_reduce")["groups"] == 4
    text = str(ex.summary())
    assert f"collectives: {len(ex.collectives)}" in text and "exposed" in text
    assert all(name in text for name in rows)


def test_trace_has_a_collective_track_per_device(ex, tmp_path):
    path = ex.save_trace(tmp_path / "coll.json")
    with open(path) as f:
        doc = json.load(f)
    names = check_trace(doc)
    slices = [e for e in doc["traceEvents"] if e.get("cat") == "collective"]
    tracks = {(e["pid"], e["tid"]) for e in slices}
    assert len(tracks) == 8                                   # one per device
    assert all(names[t].endswith("collectives") and names[t].startswith("core ") for t in tracks)
    assert len(slices) == sum(len(c.spans) for c in ex.collectives)
    for t in tracks:                                          # one at a time per device
        evs = sorted((e for e in slices if (e["pid"], e["tid"]) == t), key=lambda e: e["ts"])
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-6 for a, b in itertools.pairwise(evs))
    ar = [e for e in slices if e["name"] == "all_reduce"]
    assert all(len(e["args"]["group"]) == 2 and e["args"]["participants"] == 8 for e in ar)
    assert all(e["args"]["algorithm"] and e["args"]["device"] in e["args"]["group"] for e in slices)
    rec = {(d, c.name): (a, b) for c in ex.collectives for d, a, b in c.spans}
    for e in slices:
        a, b = rec[(e["args"]["device"], e["args"]["name"])]
        assert e["ts"] == pytest.approx(a / 1e3, abs=1e-6)
        assert e["dur"] == pytest.approx((b - a) / 1e3, abs=1e-5)


def test_collective_scatter_plot(ex):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    try:
        ax = ex.plot_collectives()
        assert "collectives" in ax.get_title()
        points = sum(len(c.get_offsets()) for c in ax.collections)
        assert points == len(ex.collectives)
        labels = sorted(t.get_text() for t in ax.get_legend().get_texts())
        assert labels == ["all_gather", "all_reduce"]
    finally:
        plt.close("all")


def test_kernel_shares_of_a_multi_device_run_stay_within_100_percent(jax, trn_devices):
    import numpy as np
    import jax_trn
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((8,), ("d",), devices=trn_devices,
                         axis_types=(jax.sharding.AxisType.Auto,))
    x = jax.device_put(np.ones((1024, 256), np.float32), NamedSharding(mesh, P("d")))
    with jax_trn.profile() as prof:
        jax.jit(lambda x: jax.numpy.tanh(x) * 2)(x).block_until_ready()
    rows = prof.executions[-1].summary_dict()["kernels"]
    assert rows and sum(r["time_percent"] for r in rows) <= 100.0 + 1e-6
