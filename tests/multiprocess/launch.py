"""Starting the processes of a multi-controller run on this machine (as JAX's own
multi-process tests do): `run(script, n)` runs `script` (Python source) in `n` fresh
interpreters, process i after `jax.distributed.initialize("localhost:<port>", n, i)`,
and returns what each printed as its last line of JSON (`report(obj)` in the script).

The script sees `PROCESS_ID`, `NUM_PROCESSES` and `report`; JAX_PLATFORMS=trn,cpu and
JAX_TRN_SYSTEM (default trn2.48xlarge) are set."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

from jax_trn.launch import free_port

_PRELUDE = """
import json, os, sys
PROCESS_ID, NUM_PROCESSES, PORT, HEARTBEAT = (int(v) for v in sys.argv[1:5])
import jax
jax.distributed.initialize(f"localhost:{PORT}", NUM_PROCESSES, PROCESS_ID,
                           initialization_timeout=60, heartbeat_timeout_seconds=HEARTBEAT)

def report(obj):
    print("REPORT " + json.dumps(obj), flush=True)
"""




class ProcessFailed(AssertionError):
    pass


def run(script: str, n: int = 2, system: str = "trn2.48xlarge", timeout: float = 240,
        env: dict | None = None, expect_ok: bool = True, heartbeat_s: int = 100,
        env_per_process: dict | None = None) -> list:
    """Each process's reported object (None if it reported nothing); with `expect_ok`,
    a process that fails raises ProcessFailed with its output, else (exit code,
    report, stderr) of each. `env_per_process`: {process: extra variables}. `heartbeat_s`: after how long JAX's coordination service
    declares a silent process dead (and ends the others)."""
    port = free_port()
    code = _PRELUDE + textwrap.dedent(script)
    full_env = {**os.environ, "JAX_PLATFORMS": "trn,cpu", "JAX_TRN_SYSTEM": system,
                **(env or {})}
    full_env.pop("XLA_FLAGS", None)          # no forced host device count in the children
    # Output goes to files, not pipes: a process blocked writing to a full pipe that
    # nobody reads yet (the launcher waits on process 0, which waits for it at JAX's
    # shutdown barrier) would hang the run.
    with tempfile.TemporaryDirectory() as tmp:
        files = [(open(os.path.join(tmp, f"{i}.out"), "w+"),
                  open(os.path.join(tmp, f"{i}.err"), "w+")) for i in range(n)]
        procs = [subprocess.Popen([sys.executable, "-c", code, str(i), str(n), str(port),
                                   str(heartbeat_s)], stdout=out, stderr=err, text=True,
                                  env={**full_env, **(env_per_process or {}).get(i, {})})
                 for i, (out, err) in enumerate(files)]
        outs = []
        try:
            deadline = time.monotonic() + timeout
            for p, (out, err) in zip(procs, files):
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
                out.seek(0)
                err.seek(0)
                outs.append((p.returncode, out.read(), err.read()))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for out, err in files:
                out.close()
                err.close()
    reports = []
    for i, (rc, out, err) in enumerate(outs):
        lines = [ln[7:] for ln in out.splitlines() if ln.startswith("REPORT ")]
        if expect_ok and rc != 0:
            raise ProcessFailed(f"process {i} exited with {rc}:\n{out[-3000:]}\n{err[-6000:]}")
        reports.append(json.loads(lines[-1]) if lines else None)
    if not expect_ok:
        return [(rc, r, err) for (rc, _, err), r in zip(outs, reports)]
    return reports
