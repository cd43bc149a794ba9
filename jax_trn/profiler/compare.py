"""One program on several Trainium generations: `jax_trn.compare(f, *args, systems=...)`.

The system of a running `trn` backend is fixed when it starts, so compare does not go
through the backend. It does in-process what the plugin does on compile and execute:

    jax.jit(f).trace(*args).lower(lowering_platforms=("trn",))   # StableHLO, as PJRT gets it
      -> MLIR bytecode -> hlo_passes.compile_to_ir               # our IR (hardware-agnostic)
      -> jax_trn.lower.lower_module(module, CHIPS[gen].core)     # per generation
      -> runtime.executable.simulate(program, system)            # timing on a fresh core

Simulated time does not depend on the data, so the run is timing-only
(`NeuronCore.run(execute=False)`) and the argument values are not used, only their
shapes and dtypes. This is deterministic, needs no subprocesses (a new JAX process per system would cost
seconds each and would hand results back through pipes), and it returns the
`Execution` of each run, so every system's summary and trace are one call away.
Programs over several devices are not supported yet (the multichip work).
"""
from __future__ import annotations

import io
from dataclasses import dataclass, field

DEFAULT_SYSTEMS = ("trn1.2xlarge", "trn2.3xlarge", "trn3-ultraserver")


@dataclass
class Comparison:
    """The rows of a comparison (one dict per system) and each system's Execution."""
    name: str
    rows: list[dict]
    executions: dict[str, object] = field(default_factory=dict, repr=False)

    def __getitem__(self, system: str) -> dict:
        for row in self.rows:
            if row["system"] == system:
                return row
        raise KeyError(system)

    def __str__(self) -> str:
        return format_table(self.name, self.rows)

    def _repr_pretty_(self, p, cycle) -> None:          # IPython
        p.text(str(self))


def compare(f, *args, systems=None, name: str | None = None,
            matmul_precision: str | None = None) -> Comparison:
    """Compiles `f(*args)` for each system's generation and simulates one call on one
    NeuronCore of it. Returns a `Comparison`: `print(it)` for the table, `.rows` for
    the numbers (simulated time, TFLOP/s, MFU, MBU, bound), `.executions[system]` for
    each run's `summary()` / `save_trace()`."""
    from jax_trn.systems import get_system
    chosen = [get_system(s) for s in (systems or DEFAULT_SYSTEMS)]
    code, label = _stablehlo(f, args)
    name = name or label
    executions = {s.name: _run(code, name, s, matmul_precision) for s in chosen}
    rows = [_row(s, executions[s.name]) for s in chosen]
    base = rows[0]["simulated_time_s"] if rows else 0.0
    for row in rows:
        t = row["simulated_time_s"]
        row["speedup"] = base / t if t else 0.0
    return Comparison(name, rows, executions)


def _stablehlo(f, args) -> tuple[bytes, str]:
    """MLIR bytecode of `jax.jit(f)` lowered for the trn platform (JAX's default
    lowering rules; lowering needs no backend)."""
    import jax
    lowered = jax.jit(f).trace(*args).lower(lowering_platforms=("trn",))
    module = lowered.compiler_ir("stablehlo")
    buf = io.BytesIO()
    module.operation.write_bytecode(file=buf)
    label = str(module.operation.attributes["sym_name"]).strip('"')
    return buf.getvalue(), label


def _run(code: bytes, name: str, system, precision):
    import hlo_passes
    from jax_trn.lower import lower_module
    from jax_trn.runtime.executable import simulate
    module = hlo_passes.compile_to_ir(code, name=name)
    program = lower_module(module, system.chip.core, matmul_precision=precision)
    return simulate(name, program, system)


def _row(system, ex) -> dict:
    from .summary import Summary
    d = Summary([ex]).to_dict()
    return {
        "system": system.name, "chip": system.chip_name, "core": system.chip.core.name,
        "dtype": ex.dtype, "simulated_time_s": ex.simulated_time_s,
        "tflops": d["achieved_tflops"], "peak_tflops": d["peak_tflops_per_core"],
        "mfu": d["mfu_estimated_percent"] / 100, "mbu": d["mbu_estimated_percent"] / 100,
        "bound": d["bound"], "bound_time_percent": d["bound_time_percent"],
        "kernels": len(ex.kernels),
    }


def _time(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.2f} us"


def format_table(name: str, rows: list[dict]) -> str:
    if not rows:
        return f"{name}: no systems"
    base = rows[0]["system"]
    width = max(len(r["system"]) for r in rows) + 2
    header = (f"{'system':<{width}}{'chip':<11}{'dtype':<10}{'time':>11}{'TFLOP/s':>9}"
              f"{'MFU':>8}{'MBU':>7}  {'bound':<16}vs {base}")
    lines = [f"{name} on one NeuronCore per system", header]
    for r in rows:
        bound = f"{r['bound']} {r['bound_time_percent']:.0f}%"
        lines.append(
            f"{r['system']:<{width}}{r['chip']:<11}{r['dtype']:<10}"
            f"{_time(r['simulated_time_s']):>11}{r['tflops']:>9.2f}{r['mfu']:>8.1%}"
            f"{r['mbu']:>7.0%}  {bound:<16}{r['speedup']:.2f}x")
    return "\n".join(lines) + "\n"
