"""`python -m jax_trn`, the README's first command, runs and checks itself against CPU."""
from __future__ import annotations

import subprocess
import sys


def test_demo_runs_and_matches_cpu():
    r = subprocess.run([sys.executable, "-m", "jax_trn"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert ": OK" in r.stdout
    for line in ("simulated time:", "TFLOP/s peak per core", "engine utilization:", "insights"):
        assert line in r.stdout
