"""The real-program tier (tests/programs/programs.py) on trn and on JAX's CPU backend.

    python benchmarks/programs.py [--steps 3] [--only NAME ...]

For each program: whether it runs on trn ("yes", or the error), the largest relative
difference of its losses from the CPU backend's over `--steps` training steps (both under
the default settings: trn multiplies float32 matmuls as bf16 operands with FP32
accumulation, the CPU backend in float32), the simulated time of one more step (every
execution it ran, on the slowest device), and the wall-clock time per step on trn and on
the CPU (one more step, compiled, mean of REPEATS). Programs marked "waits on" need
an issue-12 item that has not landed; they run anyway, so the table shows their state.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

# 8 host devices, so the sharded programs have a CPU mesh (as tests/conftest.py does).
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REPEATS = 3


def run(jax, program, device, steps: int):
    """(Run of `steps` steps, wall seconds of one more step, compiled) on `device`."""
    with jax.default_device(device):
        result = program.run(jax, steps)
        if result.step is None:
            return result, None
        jax.block_until_ready(result.step(*result.args))       # compiled already
        start = time.perf_counter()
        for _ in range(REPEATS):
            jax.block_until_ready(result.step(*result.args))
        return result, (time.perf_counter() - start) / REPEATS


def simulated_step_s(jax, result, device) -> float | None:
    """Simulated seconds of one more step: the executions it ran, end to end."""
    import jax_trn
    if result.step is None:
        return None
    with jax.default_device(device), jax_trn.profile() as prof:
        jax.block_until_ready(result.step(*result.args))
    return sum(ex.simulated_time_s for ex in prof.executions) or None


def row(jax, program, steps: int) -> dict:
    import numpy as np
    trn, cpu = jax.devices("trn")[0], jax.devices("cpu")[0]
    want, cpu_s = run(jax, program, cpu, steps)
    try:
        got, trn_s = run(jax, program, trn, steps)
    except Exception as e:                          # noqa: BLE001 (reported, not raised)
        return {"name": program.name, "works": f"no: {type(e).__name__}: "
                f"{str(e).splitlines()[0][:70]}", "needs": program.needs, "cpu_s": cpu_s}
    losses, ref = np.asarray(got.losses), np.asarray(want.losses)
    diff = float(np.max(np.abs(losses - ref) / np.maximum(np.abs(ref), 1e-6)))
    finite = bool(np.all(np.isfinite(losses)))
    return {"name": program.name, "works": "yes" if finite else "no: non-finite loss",
            "needs": program.needs, "loss_diff": diff if finite else float("nan"),
            "sim_s": simulated_step_s(jax, got, trn), "trn_s": trn_s, "cpu_s": cpu_s}


def _time(s) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def format_rows(rows: list[dict]) -> str:
    width = max(len(r["name"]) for r in rows) + 2
    lines = [f"{'program':<{width}}{'works':<8}{'max loss diff':>14}{'sim step':>12}"
             f"{'wall trn':>11}{'wall cpu':>11}  note"]
    for r in rows:
        works = "yes" if r["works"] == "yes" else "no"
        diff = f"{r['loss_diff']:.2e}" if "loss_diff" in r else "-"
        note = r["works"][4:] if works == "no" else ""
        if r["needs"]:
            note = (note + "; " if note else "") + f"waits on {r['needs'][:60]}"
        lines.append(f"{r['name']:<{width}}{works:<8}{diff:>14}{_time(r.get('sim_s')):>12}"
                     f"{_time(r.get('trn_s')):>11}{_time(r.get('cpu_s')):>11}  {note}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None)
    opts = parser.parse_args()
    import warnings

    import jax
    from tests.programs.programs import PROGRAMS
    warnings.filterwarnings("ignore", message="Platform 'trn' is experimental")
    names = opts.only or list(PROGRAMS)
    rows = [row(jax, PROGRAMS[n], opts.steps) for n in names]
    print(format_rows(rows))


if __name__ == "__main__":
    main()
