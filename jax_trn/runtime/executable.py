"""Compiled programs and their execution on the simulated NeuronCores.

Every execution is recorded for the profiler (`profiler.record`). `simulate` times a
program on a fresh NeuronCore of any system, outside any JAX backend: the timing run
behind `cost_analysis()` and `jax_trn.compare`.
"""
from __future__ import annotations

import hashlib
import threading
from collections import Counter

import numpy as np

from jax_trn import profiler
from jax_trn.hw import dtypes as _dt
from .buffer import Buffer
from .device import Device


class ExecutionError(RuntimeError):
    pass


class Executable:
    """One compiled program, loaded for `devices` (one per replica × partition)."""

    def __init__(self, name: str, program, module, devices: list[Device], options,
                 mlir_text: str = ""):
        self.name = name
        self.program = program
        self.optimized_mlir = mlir_text
        self.devices = devices
        self.options = options
        fn = module.main
        self.output_types = list(fn.result_types)
        self.param_types = [a.type for a in fn.args]
        self.fingerprint = hashlib.sha256(program.text.encode() + name.encode()).hexdigest()[:32]
        self.deleted = False
        self._lock = threading.Lock()
        self._timing: profiler.Execution | None = None
        _check_signature(name, program, self.param_types, self.output_types)
        # Constants live in each device's HBM for as long as the executable is loaded.
        self.constant_bytes = sum(int(np.asarray(v).nbytes) for v in program.constants.values())
        for i, d in enumerate(devices):
            try:
                d.allocate(self.constant_bytes, f"the constants of {name}")
            except MemoryError:
                for loaded in devices[:i]:
                    loaded.free(self.constant_bytes)
                raise

    def release(self) -> None:
        """Unloads the executable: frees its constants' HBM."""
        with self._lock:
            if not self.deleted:
                self.deleted = True
                for d in self.devices:
                    d.free(self.constant_bytes)

    @property
    def num_replicas(self) -> int:
        return self.options.num_replicas

    @property
    def num_partitions(self) -> int:
        return self.options.num_partitions

    @property
    def optimized_text(self) -> str:
        return self.program.text

    @property
    def code_size_bytes(self) -> int:
        """Instruction bytes, at a nominal 64 bytes per instruction (the encoding is not
        public, trainium-hardware.md §11)."""
        return 64 * sum(len(k.instructions) for k in self.program.kernels)

    def memory_stats(self) -> dict[str, int]:
        prog = self.program
        args = sum(t.nbytes for t in prog.params)
        outs = sum(t.nbytes for t in prog.outputs)
        temps = sum(t.nbytes for t in prog.temps)
        return {"generated_code_size_in_bytes": self.code_size_bytes,
                "argument_size_in_bytes": args, "output_size_in_bytes": outs,
                "temp_size_in_bytes": temps, "peak_memory_in_bytes": args + outs + temps,
                "total_size_in_bytes": args + outs + temps}

    def cost_analysis(self) -> dict[str, float]:
        """Figures of the compiled program (per device): static FLOPs and argument +
        result bytes, and from one timing run (`timing()`) the simulated time, MFU,
        MBU and the bytes DMA moves to and from HBM."""
        timing = self.timing()
        summary = timing.summary().to_dict()
        return {
            "flops": float(self.program.flops),
            "bytes accessed": float(sum(t.nbytes for t in self.program.params)
                                    + sum(t.nbytes for t in self.program.outputs)),
            "simulated_time_s": float(timing.simulated_time_s),
            "mfu": summary["mfu_estimated_percent"] / 100,
            "mbu": summary["mbu_estimated_percent"] / 100,
            "hbm bytes": float(timing.hbm_bytes),
        }

    def timing(self) -> profiler.Execution:
        """One timing-only run on a fresh core of this executable's system (computed
        once; not recorded by `profile()`). Simulated time does not depend on the
        data, so it equals a real call's."""
        with self._lock:
            if self._timing is None:
                self._timing = simulate(self.name, self.program, self.devices[0].system)
            return self._timing

    def execute(self, arg_lists: list[list[Buffer]], device: Device | None = None
                ) -> list[list[Buffer]]:
        devices = [device] if device is not None else self.devices
        if len(arg_lists) != len(devices):
            raise ExecutionError(
                f"{self.name} was compiled for {len(self.devices)} devices, "
                f"called with {len(arg_lists)} argument lists")
        from jax_trn.hw.bandwidth import Hbm
        chip = devices[0].system.chip
        # One HBM per chip, fresh for each execution: the devices of one call run
        # concurrently (from t=0) and contend for their chip's HBM; separate calls do not.
        sharers = Counter(d.chip for d in devices)
        hbms = {c: Hbm(chip.hbm_bytes_per_ns, f"hbm.chip{c}", n if n > 1 else None)
                for c, n in sharers.items()}
        records, results = [], []
        for dev, args in zip(devices, arg_lists):
            outs, kernels = self._run_on(dev, args, hbms[dev.chip])
            results.append(outs)
            records.extend(kernels)
        profiler.record(self._execution(records, devices))
        return results

    def _execution(self, kernels, devices) -> profiler.Execution:
        return make_execution(self.name, self.program, devices[0].system,
                              [d.id for d in devices], kernels)

    def _check_args(self, device: Device, args: list[Buffer]) -> None:
        if len(args) != len(self.program.params):
            raise ExecutionError(f"{self.name} takes {len(self.program.params)} arguments, "
                                 f"got {len(args)}")
        for i, (p, b) in enumerate(zip(self.program.params, args)):
            if b.is_deleted:
                raise ExecutionError(f"argument {i} of {self.name} was deleted")
            if tuple(p.shape) != b.shape or p.dtype != b.dtype:
                raise ExecutionError(f"argument {i} of {self.name}: expected {p.dtype}"
                                     f"{list(p.shape)}, got {b.dtype}{list(b.shape)}")
            if b.device is not device:
                raise ExecutionError(f"argument {i} of {self.name} is on {b.device.to_string}, "
                                     f"the program runs on {device.to_string}")

    def _run_on(self, device: Device, args: list[Buffer], hbm):
        self._check_args(device, args)
        prog = self.program
        outs = [Buffer(device, t.shape, t.dtype) for t in prog.outputs]
        temp_bytes = sum(t.nbytes for t in prog.temps)
        try:
            device.allocate(temp_bytes, f"{len(prog.temps)} temporaries of {self.name}")
        except MemoryError:
            for b in outs:
                b.delete()
            raise
        try:
            dram = bind_dram(prog, [b.data for b in args], [b.data for b in outs])
            with device.execution_lock:
                core = device.core_model
                core.begin(hbm)
                kernels = run_kernels(prog, core, dram, device.id, device.chip)
            return outs, kernels
        finally:
            device.free(temp_bytes)


def bind_dram(prog, params: list[np.ndarray], outs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The DRAM tensors of one execution by name: flat parameter arrays (read-only),
    output arrays (written in place), fresh temporaries and the constants."""
    dram = {}
    for p, data in zip(prog.params, params):
        view = data.view()
        view.flags.writeable = False      # kernels may not write their inputs
        dram[p.name] = view
    for t, data in zip(prog.outputs, outs):
        dram[t.name] = data
    for t in prog.temps:
        dram[t.name] = np.zeros(t.size, _dt.np_dtype(t.dtype))
    for name, value in prog.constants.items():
        view = np.ascontiguousarray(value).reshape(-1).view()
        view.flags.writeable = False
        dram[name] = view
    return dram


def run_kernels(prog, core, dram, device_id: int, chip: int, *, execute: bool = True
                ) -> list[profiler.KernelRecord]:
    """Runs the program's kernels in order on `core` from simulated time 0 (with
    `execute=False` only their timing)."""
    kernels, t = [], 0.0
    for kernel in prog.kernels:
        run = core.run(kernel, dram, t, execute=execute)
        kernels.append(_kernel_record(kernel, device_id, chip, core.core_id, run))
        t = run.end_ns
    return kernels


def simulate(name: str, prog, system) -> profiler.Execution:
    """The timing of one call of `prog` on a fresh NeuronCore (core 0 of chip 0) of
    `system`, with no instruction taking effect (simulated time never depends on the
    data), as an Execution that `profile()` does not record. Needs no JAX backend."""
    from jax_trn.hw.bandwidth import Hbm
    from jax_trn.hw.core import NeuronCore
    chip = system.chip
    core = NeuronCore(chip.core, core_id=0)
    core.begin(Hbm(chip.hbm_bytes_per_ns, "hbm.chip0"))
    kernels = run_kernels(prog, core, {}, 0, 0, execute=False)
    return make_execution(name, prog, system, [0], kernels)


def make_execution(name: str, prog, system, device_ids: list[int], kernels
                   ) -> profiler.Execution:
    dtype = compute_dtype(prog)
    peak = system.chip.peak_tflops_per_core(dtype) * 1e12
    return profiler.Execution(name, system.name, device_ids, kernels, peak,
                              generation=system.generation, dtype=dtype)


def compute_dtype(prog) -> str:
    """The dtype whose TensorE peak MFU is measured against: the input dtype of the
    matmuls doing most FLOPs ("tf32" for FP32 matmuls rounded to TF32), else the
    first parameter's dtype."""
    flops: dict[str, int] = {}
    for kernel in prog.kernels:
        for instr in kernel.instructions:
            moving = getattr(instr, "moving", None)
            if instr.flops and moving is not None:
                dtype = moving.dtype
                if dtype == "float32" and getattr(instr, "precision", "") == "tf32":
                    dtype = "tf32"
                flops[dtype] = flops.get(dtype, 0) + instr.flops
    if flops:
        return max(flops, key=lambda d: flops[d])
    return prog.params[0].dtype if prog.params else "float32"


def _check_signature(name, program, param_types, output_types) -> None:
    """The lowered program must take and return exactly what the module declares
    (JAX trusts the executable's output types when it builds result arrays)."""
    declared = [(tuple(t.shape), t.dtype) for t in output_types]
    lowered = [(tuple(t.shape), t.dtype) for t in program.outputs]
    params = [(tuple(t.shape), t.dtype) for t in param_types]
    lowered_params = [(tuple(t.shape), t.dtype) for t in program.params]
    if declared != lowered or params != lowered_params:
        raise ExecutionError(
            f"internal compiler error in {name}: the lowered program's signature "
            f"{lowered_params} -> {lowered} differs from the module's {params} -> {declared}")


def _kernel_record(kernel, device_id: int, chip: int, core: int, run
                   ) -> profiler.KernelRecord:
    return profiler.KernelRecord(kernel.name, device_id, run.start_ns, run.end_ns,
                                 dict(run.busy_ns), int(kernel.flops or run.flops),
                                 int(run.hbm_bytes), list(kernel.ops), run.events,
                                 chip=chip, core=core, kernel=kernel)
