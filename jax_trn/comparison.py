"""One program on several Trainium systems: `jax_trn.compare(f, *args, systems=...)`.

The system of a running `trn` backend is fixed when it starts, so compare does not go
through the backend. It does in-process what the plugin does on compile and execute,
with the same compile driver (`jax_trn.runtime.compiler`) and the options of this
process (`jax_trn.config.current()`) with each system in turn:

    jax.jit(f).trace(*args).lower(lowering_platforms=("trn",))   # StableHLO, as PJRT gets it
      -> MLIR bytecode -> runtime.compiler.to_ir                 # our IR (hardware-agnostic)
      -> runtime.compiler.lower(module, options)                 # per generation
      -> runtime.executable.simulate(name, program, options, ids)   # timing on fresh cores

Simulated time does not depend on the data, so the argument values are not used, only
their shapes and dtypes: the run is timing-only (`NeuronCore.run(execute=False)`), except
that programs with collectives or control flow execute their numerics on all-zero
arguments (every device of a collective; wall time grows with size x devices). This is deterministic, needs no subprocesses (a new JAX process per system would cost
seconds each and would hand results back through pipes), and it returns the
`Execution` of each run, so every system's summary and trace are one call away.

Sharded programs: give the arguments a `NamedSharding`, as for `jax.jit` — arrays
placed with `jax.device_put(x, NamedSharding(mesh, spec))` on any backend's mesh, or
`jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))`, where `mesh`
may be a `jax.sharding.AbstractMesh` (no devices needed, so a 128-device mesh can be
compared from a process with 8 NeuronCores). `in_shardings=` / `out_shardings=` are passed to
`jax.jit` as they are. The StableHLO depends only on the mesh's shape, so it is lowered
once; `hlo_passes.compile_to_ir` partitions it (Shardy + localization) and each
system runs the per-device program on its first N devices (N = the mesh size), with
its collectives over that system's links (or on `device_ids`: e.g. one core per chip,
`lambda system: [c * system.cores_per_chip for c in range(16)]`, to spread a 16-device
mesh over 16 chips). A system with fewer than N devices is an error naming both.
"""
from __future__ import annotations

import contextlib

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
            matmul_precision: str | None = None, in_shardings=None, out_shardings=None,
            fuse: bool = True, device_ids=None) -> Comparison:
    """Compiles `f(*args)` for each system's generation and simulates one call: on one
    NeuronCore, or for sharded arguments (a `NamedSharding`, see the module docstring)
    on the system's first N devices, N the mesh size. Returns a `Comparison`:
    `print(it)` for the table, `.rows` for the numbers (devices, simulated time,
    TFLOP/s, MFU, MBU, bound, collective time share), `.executions[system]` for each
    run's `summary()` / `save_trace()` / `plot_collectives()`.

    `in_shardings` / `out_shardings` go to `jax.jit`; `fuse=False` skips the fusion
    pass (as JAX_TRN_DISABLE_PASSES=fusion does for the backend). `device_ids`: the
    devices of each system that run the N partitions (partition p on the p-th id), a
    list for every system or a function of the `System`; by default 0..N-1."""
    from jax_trn import config
    base = config.current()
    if matmul_precision is not None:
        base = base.replace(matmul_precision=matmul_precision)
    chosen = [config.get_system(s) if isinstance(s, str) else s
              for s in (systems or DEFAULT_SYSTEMS)]
    jit_kw = {k: v for k, v in (("in_shardings", in_shardings),
                                ("out_shardings", out_shardings)) if v is not None}
    code, label, n = _stablehlo(f, args, jit_kw, chosen[0] if chosen else None)
    small = [s for s in chosen if s.num_devices < n]
    if small:
        raise ValueError(
            f"{label} runs on {n} devices (its mesh), more than "
            + ", ".join(f"{s.name} has ({s.num_devices} devices)" for s in small))
    ids = {s.name: _device_ids(s, n, device_ids, label) for s in chosen}
    name = name or label
    from jax_trn.runtime import compiler
    module = compiler.to_ir(code, base, name=name, fuse=fuse)   # the same for every system
    programs: dict[object, object] = {}         # one lowering per core generation
    executions = {}
    for s in chosen:
        options = base.replace(system=s)
        if s.chip.core not in programs:
            programs[s.chip.core] = compiler.lower(module, options)
        executions[s.name] = _simulate(name, programs[s.chip.core], options, ids[s.name])
    rows = [_row(s, executions[s.name], n) for s in chosen]
    base = rows[0]["simulated_time_s"] if rows else 0.0
    for row in rows:
        t = row["simulated_time_s"]
        row["speedup"] = base / t if t else 0.0
    return Comparison(name, rows, executions)


def _stablehlo(f, args, jit_kw, system=None) -> tuple[bytes, str, int]:
    """MLIR bytecode of `jax.jit(f)` lowered for the trn platform (JAX's default
    lowering rules; lowering needs no backend), its name, and how many devices it runs
    on (num_partitions x num_replicas). `system`: what the program is traced for (the
    target hand-written kernels see when JAX asks their shapes)."""
    import jax
    from jax_trn import config
    args = jax.tree.map(_abstract, args)
    with (config.tracing_for(system) if system is not None else contextlib.nullcontext()):
        lowered = jax.jit(f, **jit_kw).trace(*args).lower(lowering_platforms=("trn",))
    module = lowered.compiler_ir("stablehlo")
    buf = io.BytesIO()
    module.operation.write_bytecode(file=buf)
    attrs = module.operation.attributes
    label = str(attrs["sym_name"]).strip('"')
    n = 1
    for key in ("mhlo.num_partitions", "mhlo.num_replicas"):
        if key in attrs:
            n *= int(str(attrs[key]).split(":")[0])
    return buf.getvalue(), label, n


def _abstract(x):
    """A sharded argument as shape, dtype and a NamedSharding over its mesh's shape
    (the devices it is on do not matter to the lowering: any backend's mesh will do);
    anything else as it is."""
    import jax
    from jax.sharding import NamedSharding
    sharding = getattr(x, "sharding", None)
    if isinstance(sharding, NamedSharding) and hasattr(x, "shape"):
        mesh = sharding.mesh
        mesh = getattr(mesh, "abstract_mesh", mesh)
        return jax.ShapeDtypeStruct(x.shape, x.dtype,
                                    sharding=NamedSharding(mesh, sharding.spec))
    return x


def _device_ids(system, n: int, device_ids, label: str) -> list[int]:
    ids = device_ids(system) if callable(device_ids) else device_ids
    ids = list(range(n)) if ids is None else [int(d) for d in ids]
    if len(ids) != n or len(set(ids)) != n or not all(0 <= d < system.num_devices
                                                        for d in ids):
        raise ValueError(f"{label} runs on {n} devices; device_ids {ids} are not {n} "
                         f"distinct devices of {system.name} (0..{system.num_devices - 1})")
    return ids


def _simulate(name: str, program, options, ids: list[int]):
    from jax_trn.runtime.executable import simulate
    return simulate(name, program, options, ids)


def _row(system, ex, n: int) -> dict:
    from jax_trn.profiler.summary import Summary
    d = Summary([ex]).to_dict()
    # A partitioned program without collectives runs on device 0 only (simulate():
    # every partition runs the same instructions and time does not depend on the
    # data), so its FLOP/s count for all n partitions; MFU is per device either way.
    scale = n / len(ex.devices)
    return {
        "system": system.name, "chip": system.chip_name, "core": system.chip.core.name,
        "devices": n, "dtype": ex.dtype, "simulated_time_s": ex.simulated_time_s,
        "tflops": d["achieved_tflops"] * scale, "peak_tflops": d["peak_tflops_per_core"],
        "mfu": d["mfu_estimated_percent"] / 100, "mbu": d["mbu_estimated_percent"] / 100,
        "bound": d["bound"], "bound_time_percent": d["bound_time_percent"],
        "kernels": len(ex.kernels),
        "collectives": d["collectives"]["count"],
        "collective_time_s": d["collectives"]["time_s"],
        "collective_percent": d["collectives"]["time_percent"],
    }


def _time(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s >= 1e-3 else f"{s * 1e6:.2f} us"


def format_table(name: str, rows: list[dict]) -> str:
    if not rows:
        return f"{name}: no systems"
    base = rows[0]["system"]
    n = rows[0].get("devices", 1)
    sharded = n > 1
    width = max(len(r["system"]) for r in rows) + 2
    header = (f"{'system':<{width}}{'chip':<11}{'dtype':<10}{'time':>11}{'TFLOP/s':>9}"
              f"{'MFU':>8}{'MBU':>7}" + (f"{'coll.':>7}" if sharded else "")
              + f"  {'bound':<16}vs {base}")
    where = f"on {n} NeuronCores" if sharded else "on one NeuronCore"
    lines = [f"{name} {where} per system", header]
    for r in rows:
        bound = f"{r['bound']} {r['bound_time_percent']:.0f}%"
        coll = f"{r['collective_percent'] / 100:>7.0%}" if sharded else ""
        lines.append(
            f"{r['system']:<{width}}{r['chip']:<11}{r['dtype']:<10}"
            f"{_time(r['simulated_time_s']):>11}{r['tflops']:>9.2f}{r['mfu']:>8.1%}"
            f"{r['mbu']:>7.0%}{coll}  {bound:<16}{r['speedup']:.2f}x")
    return "\n".join(lines) + "\n"
