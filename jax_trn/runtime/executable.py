"""Compiled programs and their execution on the simulated NeuronCores."""
from __future__ import annotations

import hashlib
import threading

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
        """Static figures of the compiled program (per device)."""
        return {
            "flops": float(self.program.flops),
            "bytes accessed": float(sum(t.nbytes for t in self.program.params)
                                    + sum(t.nbytes for t in self.program.outputs)),
        }

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
        hbms = {d.chip: Hbm(chip.hbm_bytes_per_ns, f"hbm.chip{d.chip}") for d in devices}
        records, results = [], []
        for dev, args in zip(devices, arg_lists):
            outs, kernels = self._run_on(dev, args, hbms[dev.chip])
            results.append(outs)
            records.extend(kernels)
        profiler.record(self._execution(records, devices))
        return results

    def _execution(self, kernels, devices) -> profiler.Execution:
        system = devices[0].system
        dtype = self.param_types[0].dtype if self.param_types else "float32"
        peak = system.chip.peak_tflops_per_core(dtype) * 1e12
        return profiler.Execution(self.name, system.name, [d.id for d in devices],
                                  kernels, peak)

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
            dram = self._bind(args, outs)
            with device.execution_lock:
                core = device.core_model
                core.begin(hbm)
                kernels, t = [], 0.0
                for kernel in prog.kernels:
                    run = core.run(kernel, dram, t)
                    kernels.append(_kernel_record(kernel, device, run))
                    t = run.end_ns
            return outs, kernels
        finally:
            device.free(temp_bytes)

    def _bind(self, args, outs) -> dict[str, np.ndarray]:
        prog = self.program
        dram = {}
        for p, b in zip(prog.params, args):
            view = b.data.view()
            view.flags.writeable = False      # kernels may not write their inputs
            dram[p.name] = view
        for t, b in zip(prog.outputs, outs):
            dram[t.name] = b.data
        for t in prog.temps:
            dram[t.name] = np.zeros(t.size, _dt.np_dtype(t.dtype))
        for name, value in prog.constants.items():
            view = np.ascontiguousarray(value).reshape(-1).view()
            view.flags.writeable = False
            dram[name] = view
        return dram


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


def _kernel_record(kernel, device: Device, run) -> profiler.KernelRecord:
    return profiler.KernelRecord(kernel.name, device.id, run.start_ns, run.end_ns,
                                 dict(run.busy_ns), int(kernel.flops or run.flops),
                                 int(run.hbm_bytes), list(kernel.ops), run.events)
