"""Shared programs for the profiler tests, and a checker of the Chrome trace-event format
(https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU)."""
from __future__ import annotations

import itertools

import numpy as np

import jax_trn

ENGINE_TRACK = ("TensorE", "VectorE", "ScalarE", "GpSimdE", "DMA q")
REQUIRED = {"X": ("name", "ph", "ts", "dur", "pid", "tid"),
            "M": ("name", "ph", "pid", "args"),
            "s": ("name", "ph", "ts", "pid", "tid", "id", "cat"),
            "f": ("name", "ph", "ts", "pid", "tid", "id", "cat")}
EPS_US = 1e-6


def layer_inputs(jax, device, m=256, k=512, n=128):
    import jax.numpy as jnp
    keys = jax.random.split(jax.random.key(2), 3)
    host = [jax.random.normal(key, s, jnp.float32).astype(jnp.bfloat16)
            for key, s in zip(keys, [(m, k), (k, n), (n,)])]
    return host, [jax.device_put(a, device) for a in host]


def layer(x, w, b):
    import jax
    return jax.nn.gelu(x @ w + b)


def profiled(jax, fn, *args):
    with jax_trn.profile() as prof:
        jax.block_until_ready(fn(*args))
    return prof


def check_trace(doc: dict) -> dict:
    """Asserts the trace-event format and our layout; returns {(pid, tid): name}."""
    assert isinstance(doc["traceEvents"], list) and doc["traceEvents"]
    events = doc["traceEvents"]
    for e in events:
        assert e["ph"] in REQUIRED, e
        for key in REQUIRED[e["ph"]]:
            assert key in e, (key, e)
        if e["ph"] != "M":
            assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0, e
    names = {(e["pid"], e["tid"]): e["args"]["name"]
             for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks: dict[tuple[int, int], list[dict]] = {}
    for e in events:
        if e["ph"] != "M":
            assert (e["pid"], e["tid"]) in names, f"unnamed track {e}"
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, evs in tracks.items():
        ts = [e["ts"] for e in evs]
        assert ts == sorted(ts), f"track {names[key]} not sorted by ts"
        if any(t in names[key] for t in ENGINE_TRACK):
            _no_overlaps(names[key], [e for e in evs if e["ph"] == "X"])
    _check_flows(events, tracks)
    return names


def _no_overlaps(track: str, slices: list[dict]) -> None:
    for a, b in itertools.pairwise(slices):
        assert a["dur"] >= 0
        assert a["ts"] + a["dur"] <= b["ts"] + EPS_US, f"overlap on {track}: {a} {b}"


def _check_flows(events, tracks) -> None:
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert starts.keys() == finishes.keys()
    for fid, s in starts.items():
        f = finishes[fid]
        assert s["ts"] <= f["ts"], (s, f)
        assert f.get("bp") == "e"
        for e in (s, f):
            assert _enclosed(e, tracks[(e["pid"], e["tid"])]), f"unbound flow {e}"


def _enclosed(flow: dict, track: list[dict]) -> bool:
    return any(x["ph"] == "X" and x["ts"] <= flow["ts"] <= x["ts"] + x["dur"]
               for x in track)


def numpy_args(host):
    return [np.asarray(a) for a in host]
