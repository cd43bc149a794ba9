"""Run a multi-process JAX program on this machine: N processes, one simulated system.

    python -m jax_trn.launch -n 4 train.py --steps 10
    python -m jax_trn.launch -n 2 -m my_package.train

Starts N Python processes running the script (or module) with its arguments, each with
`JAX_TRN_COORDINATOR`, `JAX_TRN_NUM_PROCESSES` and `JAX_TRN_PROCESS_ID` set (a free port
on localhost), so the program's own `jax.distributed.initialize()` finds them
(`jax_trn.cluster`) as it would find SLURM's or Open MPI's on a cluster. Process p then
owns the p-th share of the system's chips (`JAX_TRN_SYSTEM`, as in one process).

Each process's output lines are printed prefixed with `[p] `. If one process fails, the
others are stopped after `--grace` seconds (they would otherwise wait for it at their
next collective until `JAX_TRN_PROCESS_TIMEOUT`); the launcher's exit code is the first
failing process's, else 0. Ctrl-C stops them all.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from jax_trn.cluster import COORDINATOR, NUM_PROCESSES, PROCESS_ID
from jax_trn.config import environment_with

# The child: registers jax_trn's cluster environment, then runs the program as
# `python script.py args` / `python -m module args` would.
_CHILD = """\
import runpy, sys
import jax_trn.cluster
kind, target = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
if kind == "module":
    runpy.run_module(target, run_name="__main__", alter_sys=True)
else:
    sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(target)))
    runpy.run_path(target, run_name="__main__")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m jax_trn.launch",
        description="Run a multi-process JAX program (jax.distributed) on this machine: "
                    "N processes sharing one simulated Trainium system.")
    ap.add_argument("-n", "--processes", type=int, required=True,
                    help="how many processes (must divide the system's chip count)")
    ap.add_argument("-m", dest="module", metavar="MODULE",
                    help="run a module (as python -m MODULE) instead of a script")
    ap.add_argument("--port", type=int, default=0,
                    help="the coordinator's port on localhost (default: a free one)")
    ap.add_argument("--grace", type=float, default=10.0,
                    help="seconds the other processes get to end after one fails")
    ap.add_argument("args", nargs=argparse.REMAINDER,
                    help="the script and its arguments (or the module's arguments)")
    return ap


def launch(target: str, args: list[str], processes: int, module: bool = False,
           port: int = 0, grace: float = 10.0, out=None, env: dict | None = None) -> int:
    """Runs `target` (a script path, or a module name with `module`) with `args` in
    `processes` processes; returns the exit code (the first failure's, else 0).
    `out`: where the prefixed lines go (default sys.stdout)."""
    if processes < 1:
        raise ValueError(f"--processes {processes}: need at least 1")
    out = sys.stdout if out is None else out
    address = f"localhost:{port or free_port()}"
    base = environment_with({**(env or {}), COORDINATOR: address,
                             NUM_PROCESSES: str(processes)})
    procs = [subprocess.Popen(
        [sys.executable, "-u", "-c", _CHILD, "module" if module else "script", target, *args],
        env={**base, PROCESS_ID: str(p)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, errors="replace", start_new_session=True)
        for p in range(processes)]
    lock = threading.Lock()

    def relay(p: int, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            with lock:
                out.write(f"[{p}] {line}" if line.endswith("\n") else f"[{p}] {line}\n")
                out.flush()

    threads = [threading.Thread(target=relay, args=(p, proc), daemon=True)
               for p, proc in enumerate(procs)]
    for t in threads:
        t.start()
    code, failed_at = 0, None
    try:
        while any(proc.poll() is None for proc in procs):
            for p, proc in enumerate(procs):
                rc = proc.poll()
                if rc not in (None, 0) and code == 0:
                    code, failed_at = rc, time.monotonic()
                    with lock:
                        out.write(f"[launch] process {p} exited with {rc}; stopping the "
                                  f"others in {grace:g} s\n")
                        out.flush()
            if failed_at is not None and time.monotonic() - failed_at > grace:
                _stop(procs)
            time.sleep(0.05)
    except KeyboardInterrupt:
        _stop(procs)
        code = code or 130
    for t in threads:
        t.join(timeout=5)
    if code == 0:
        code = next((proc.returncode for proc in procs if proc.returncode), 0)
    return code


def _stop(procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except OSError:
                pass
    deadline = time.monotonic() + 5
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    args = list(ns.args)
    if args and args[0] == "--":
        args = args[1:]
    if ns.module:
        target = ns.module
    elif args:
        target, args = args[0], args[1:]
    else:
        _parser().error("give a script to run (or -m MODULE)")
    return launch(target, args, ns.processes, module=bool(ns.module), port=ns.port,
                  grace=ns.grace)


if __name__ == "__main__":
    sys.exit(main())
