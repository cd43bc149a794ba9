"""Runs a lowered Program on the simulated NeuronCore (numerics and timing in tests)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hlo_passes import ir
from jax_trn.hw.core import NeuronCore
from jax_trn.hw.spec import CHIPS
from jax_trn.lower import lower_module
from jax_trn.runtime.dram import Dram

SPEC = CHIPS["trn2"].core


@dataclass
class Result:
    outputs: list[np.ndarray]
    ns: float                   # simulated time of all kernels
    program: object


def _flat(t, value=None) -> np.ndarray:
    dtype = ir.np_dtype(t.dtype)
    if value is None:
        return np.zeros(t.size, dtype)
    return np.ascontiguousarray(np.asarray(value, dtype)).reshape(-1)


def run_program(program, args: list[np.ndarray], spec=SPEC) -> Result:
    """Binds params/outputs/temps/constants as flat arrays and runs kernels in order."""
    dram = {p.name: _flat(p, a) for p, a in zip(program.params, args)}
    dram.update({t.name: _flat(t) for t in program.outputs})
    dram.update({n: _flat_const(v) for n, v in getattr(program, "constants", {}).items()})
    dram = Dram(dram, program)               # temporaries as the runtime binds them
    core, t = NeuronCore(spec), 0.0
    for kernel in program.kernels:
        t = core.run(kernel, dram, t).end_ns
    outs = [dram[o.name].reshape(o.shape) for o in program.outputs]
    return Result(outs, t, program)


def _flat_const(v: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(v).reshape(-1)


def run(module: ir.Module, *args: np.ndarray, spec=SPEC, **kw) -> Result:
    return run_program(lower_module(module, spec, **kw), list(args), spec)
