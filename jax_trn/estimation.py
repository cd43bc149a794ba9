"""Simulated time without numerics: `jax_trn.estimate(f, *args, system=...)`.

    ex = jax_trn.estimate(step, params, batch, system="trn3-ultraserver")
    ex.simulated_time_s; print(ex.summary()); ex.save_trace("step.json")

`f` is compiled for the system's NeuronCore generation exactly as the backend compiles
it (the same driver as `jax_trn.compare`), then timed by `runtime.timing_only`: one
device (partition 0) is simulated, and each collective is priced over the whole
system's topology. Arguments need only shapes and dtypes: arrays, or
`jax.ShapeDtypeStruct`s, with a `NamedSharding` over a (possibly abstract) mesh for a
sharded program -- a 1152-device mesh costs the memory of one device's program.

What an estimate cannot know (see `runtime.timing_only`): loops and conditionals are
decided on all-zero arguments (exact for static trip counts: fori_loop, scan); devices
are assumed to reach each collective together; host callbacks are timed, not called;
no results are produced. For a program's numerics and its exact multi-device timeline,
run it on the backend.
"""
from __future__ import annotations


def estimate(f, *args, system=None, in_shardings=None, out_shardings=None,
             matmul_precision: str | None = None, fuse: bool = True, device_ids=None,
             name: str | None = None):
    """The simulated time and profile of one call of `jax.jit(f)(*args)` on `system`
    (a name, a `System`, or None for this process's system), as a
    `jax_trn.profiler.Execution` (`simulated_time_s`, `summary()`, `save_trace()`).
    A sharded program's partition p runs on `device_ids[p]` (a list or a function of
    the System; default 0..N-1, N the mesh size). `in_shardings` / `out_shardings` go
    to `jax.jit`; `matmul_precision` and `fuse` as for `jax_trn.compare`."""
    from jax_trn import comparison, config
    from jax_trn.runtime import compiler, timing_only
    options = config.current()
    if matmul_precision is not None:
        options = options.replace(matmul_precision=matmul_precision)
    if system is not None:
        options = options.replace(
            system=config.get_system(system) if isinstance(system, str) else system)
    jit_kw = {k: v for k, v in (("in_shardings", in_shardings),
                                ("out_shardings", out_shardings)) if v is not None}
    s = options.system
    code, label, n = comparison._stablehlo(f, args, jit_kw, s)
    if s.num_devices < n:
        raise ValueError(f"{label} runs on {n} devices (its mesh), more than {s.name} has "
                         f"({s.num_devices} devices)")
    ids = comparison._device_ids(s, n, device_ids, label)
    name = name or label
    program = compiler.lower(compiler.to_ir(code, options, name=name, fuse=fuse), options)
    return timing_only.run(name, program, options, ids)


def timing_only():
    """A context manager: while it is open, jitted calls on trn devices are timed
    without computing their results (as `estimate` times a program), recorded by
    `jax_trn.profile()`; their outputs have shapes but no values.

        with jax_trn.timing_only(), jax_trn.profile() as prof:
            params, opt, loss = step(params, opt, batch)   # arrays without values
        prof.executions[-1].simulated_time_s

    Reading such an array (printing it, `np.asarray`, `float(loss)`) raises
    `TimingOnlyValue`; passing it to another call under `timing_only()` is fine, to a
    call outside it an error. Host callbacks are timed, not called."""
    from jax_trn.runtime import timing_only as _timing_only
    return _timing_only.calls()
