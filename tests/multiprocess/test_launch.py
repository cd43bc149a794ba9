"""`python -m jax_trn.launch`: N processes of an unchanged multi-host script (its
`jax.distributed.initialize()` with no arguments finds the launcher's coordinator through
`jax_trn.cluster`), their output prefixed, a failure stopping the others."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

_SCRIPT = """
import sys
import numpy as np
import jax, jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
jax.distributed.initialize()
mesh = Mesh(np.array(jax.devices()), ("data",))
p = jax.process_index()
if "--fail" in sys.argv and p == 1:
    raise RuntimeError("process 1 gives up")
x = jax.make_array_from_process_local_data(
    NamedSharding(mesh, P("data")), np.full((len(jax.local_devices()), 2), p + 1.0, np.float32))
total = jax.jit(lambda a: jnp.sum(a))(x)
print(f"process {p} of {jax.process_count()}: {len(jax.local_devices())} of "
      f"{len(jax.devices())} devices, sum {float(total.addressable_data(0))}, args {sys.argv[1:]}")
"""


def _launch(tmp_path, *args, script_args=("--lr", "3"), timeout=240):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    env = {**os.environ, "JAX_PLATFORMS": "trn,cpu", "JAX_TRN_SYSTEM": "trn2.48xlarge"}
    env.pop("XLA_FLAGS", None)
    start = time.monotonic()
    got = subprocess.run([sys.executable, "-m", "jax_trn.launch", *args, str(script),
                          *script_args], capture_output=True, text=True, env=env,
                         timeout=timeout)
    return got, time.monotonic() - start


def test_a_script_runs_in_two_processes_that_find_each_other(tmp_path):
    got, _ = _launch(tmp_path, "-n", "2")
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    lines = got.stdout.splitlines()
    for p in (0, 1):
        # 2 x 64 devices holding 1.0 and 2.0 in 2 columns: 64*2*1 + 64*2*2
        assert f"[{p}] process {p} of 2: 64 of 128 devices, sum 384.0, args ['--lr', '3']" in lines


def test_a_process_that_exits_fails_its_waiting_peer_at_once(tmp_path):
    """Process 1 raises before the program's collective; process 0, waiting for it there,
    fails with process 1's reason (not after JAX_TRN_PROCESS_TIMEOUT's 300 s), both
    exit, and the launcher returns the failure's exit code."""
    got, took = _launch(tmp_path, "-n", "2", "--grace", "30", script_args=("--fail",))
    assert got.returncode == 1, got.stdout[-3000:]
    assert "[1] RuntimeError: process 1 gives up" in got.stdout
    assert "process 1 exited (it raised RuntimeError: process 1 gives up) while process 0 " \
           "waits for it here" in got.stdout, got.stdout[-3000:]
    assert took < 120
