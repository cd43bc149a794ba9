"""Dispatch of a jitted call (issue 14, dispatch row): what enters Python per call.

A tiny jitted call makes about fourteen PJRT calls. The static ones (an executable's
counts, a memory's kind, a buffer's shape) and the events (all ready: the simulator
finishes a call before Execute returns) are answered in C (pjrt_plugin/_native/
_answers.c): only Execute and the destruction of the previous result run Python.
Wall-clock figures are in benchmarks/dispatch.py; this counts calls."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import run_python

_COUNT = """
import collections, json
from pjrt_plugin import _native
counts = collections.Counter()
install = _native.entry_address
def counted(name, call, kind):
    def call_counted(address, call=call, name=name):
        counts[name] += 1
        return call(address)
    return install(name, call_counted, kind)
_native.entry_address = counted
import jax, numpy as np
f = jax.jit(lambda a, b: a + b)
dev = jax.devices("trn")[0]
args = [jax.device_put(np.ones(8, np.float32), dev) for _ in range(2)]
for _ in range(3):
    f(*args).block_until_ready()
counts.clear()
for _ in range(20):
    f(*args).block_until_ready()
print(json.dumps(dict(counts)))
"""


def test_a_jitted_call_enters_python_only_to_execute_and_free_the_last_result():
    pytest.importorskip("pjrt_plugin._native._guard")
    done = run_python(_COUNT, env={"JAX_PLATFORMS": "trn,cpu"})
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts == {"PJRT_LoadedExecutable_Execute": 20, "PJRT_Buffer_Destroy": 20}


def test_results_events_and_shapes_read_through_c_are_right(jax, trn):
    f = jax.jit(lambda a, b: (a + b, (a * b).reshape(2, 4).astype(jax.numpy.int32)))
    x = jax.device_put(np.arange(8, dtype=np.float32), trn)
    for _ in range(3):
        s, p = f(x, x)
        s.block_until_ready()
        assert s.shape == (8,) and s.dtype == np.float32 and s.is_ready()
        assert p.shape == (2, 4) and p.dtype == np.int32
        assert p.devices() == {trn} and not p.is_deleted()
        np.testing.assert_array_equal(np.asarray(p), (np.arange(8) ** 2).reshape(2, 4))
    p.delete()
    assert p.is_deleted()
