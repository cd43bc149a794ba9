"""A hand-written kernel: the `@jit` decorator, tracing for a generation, and the
standalone run on numpy inputs.

    @kernels.jit
    def add(a, b):                        # a, b: HBM tensors
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        ...
        return out

    add(x, y)                             # under JAX: one kernel on the trn device
    run = kernels.simulate(add, x_np, y_np, system="trn2")   # no JAX program needed
    run.outputs, run.execution.summary(), run.execution.plot_timeline()

Array arguments are the kernel's HBM inputs; every other argument is static (part of
the kernel's identity, passed as is). A kernel is traced once per (static arguments,
input shapes and dtypes, generation): `trace_for` returns a `Traced` kernel whose
`Kernel` runs on a NeuronCore as is.

`key` identifies a kernel and its static arguments across processes (a digest of its
name, its module's source and its static arguments), so a compiled program that calls
it is cached and reloaded like any other (jax_trn.runtime.compile_cache), and an edit to
the kernel or its module's helpers and constants makes a new key.
"""
from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import itertools
import os
import threading
from dataclasses import dataclass

import numpy as np

from jax_trn.hw.program import DramTensor, Kernel, Program
from jax_trn.lower.builder import KernelBuilder
from jax_trn.lower.target import Target

from . import trace
from .errors import KernelError
from .tensors import normalize_dtype

_lock = threading.Lock()
_BIND = None                            # call.bind, set when call.py is imported
_REGISTRY: dict[str, "Call"] = {}       # key -> the kernel and its static arguments


def jit(fn=None, *, name: str | None = None, **options):
    """Makes `fn` a kernel (NKI's `@nki.jit`): callable from JAX, and by `simulate`.
    NKI's compiler options (`mode=`, `additional_compile_opt=`, `platform_target=`,
    ...) are accepted and kept on the kernel (`.options`); none changes the result."""
    if fn is None:
        return functools.partial(jit, name=name, **options)
    k = KernelFunction(fn, name)
    k.options = dict(options)
    return k


def baremetal(fn=None, **options):
    """NKI's `@nki.baremetal`: the same as `jit` here (the kernel runs on the model)."""
    return jit(fn, **options)


def benchmark(fn=None, **options):
    """NKI's `@nki.benchmark(warmup=, iters=)`: a `jit` kernel; its cycles and profile
    come from `simulate` (simulated time is deterministic: no warm-up, no iterations)."""
    return jit(fn, **{k: v for k, v in options.items() if k not in ("warmup", "iters")})


def is_array(v) -> bool:
    return hasattr(v, "shape") and hasattr(v, "dtype") and not isinstance(v, type)


def _source(fn) -> str:
    """What a kernel's trace depends on, for its key: the source of its whole module
    (helpers, constants) where there is one, else of the function (a notebook cell)."""
    for obj in (inspect.getmodule(fn), fn):
        try:
            return inspect.getsource(obj)
        except (OSError, TypeError):
            continue
    return getattr(fn, "__qualname__", repr(fn))


class KernelFunction:
    """A kernel written in the kernel language (see the module docstring)."""

    def __init__(self, fn, name: str | None = None):
        functools.update_wrapper(self, fn)
        self.fn, self.name = fn, name or fn.__name__
        self.vmap_rule = None
        self.grid: tuple[int, ...] = (1,)
        src = _source(fn)
        self._digest = hashlib.sha256(
            f"{fn.__module__}:{fn.__qualname__}\n{src}".encode()).hexdigest()[:16]
        code = getattr(fn, "__code__", None)
        self.where = (f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"
                      if code else "?")

    def __repr__(self) -> str:
        return f"<kernel {self.name} ({self.where})>"

    def __call__(self, *args, **kwargs):
        """From JAX (arrays, tracers): the kernel in the program. With numpy arrays
        only, as NKI runs a kernel called on numpy inputs: simulated on one core of this
        process's system, the results as numpy arrays (`simulate` gives the profile)."""
        arrays = [a for a in args if is_array(a)]
        if arrays and all(isinstance(a, np.ndarray) for a in arrays):
            return simulate_kernel(self, *args, **kwargs)
        return _BIND(self, args, kwargs)

    def __getitem__(self, grid):
        """`kernel[gx, gy](...)`: the body runs once per instance of the launch grid,
        in turn, each reading its `nl.program_id(axis)` (NKI's SPMD launch; here the
        instances run on one core, one after another)."""
        launch = copy.copy(self)
        launch.grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
        return launch

    def def_vmap(self, rule):
        """Registers `rule(axis_size, in_dims, *args) -> (outputs, out_dims)` for `vmap`
        of this kernel (the default maps the kernel over the batch, one call each)."""
        self.vmap_rule = rule
        return rule

    def call(self, args: tuple, kwargs: dict) -> "Call":
        """The kernel with its static arguments bound: arrays become input slots."""
        slots = tuple(None if is_array(a) else a for a in args)
        return Call.make(self, slots, tuple(sorted(kwargs.items())))

    @property
    def key_extra(self) -> str:
        return "" if self.grid == (1,) else f"grid={self.grid}"


@dataclass(frozen=True)
class Call:
    """A kernel and its static arguments (`slots`: None where an input tensor goes)."""
    kernel: KernelFunction
    slots: tuple
    kwargs: tuple
    key: str

    @staticmethod
    def make(kernel: KernelFunction, slots: tuple, kwargs: tuple) -> "Call":
        try:
            static = repr((slots, kwargs)) + kernel.key_extra
            hash((slots, kwargs))
        except TypeError as e:
            raise KernelError(f"kernel {kernel.name}: static arguments must be hashable "
                              f"(numbers, strings, tuples): {e}") from None
        key = hashlib.sha256(f"{kernel._digest}\n{static}".encode()).hexdigest()[:24]
        call = Call(kernel, slots, kwargs, key)
        with _lock:
            _REGISTRY.setdefault(key, call)
        return call

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other) -> bool:
        return isinstance(other, Call) and other.key == self.key

    @property
    def name(self) -> str:
        return self.kernel.name


def lookup(key: str) -> Call:
    with _lock:
        call = _REGISTRY.get(key)
    if call is None:
        raise KernelError(f"the program calls hand-written kernel {key!r}, which this "
                          "process has not defined (import the module that defines it)")
    return call


@dataclass
class Traced:
    """One trace of a kernel: the builder holding its instructions, its outputs."""
    kb: KernelBuilder
    tracer: trace.Tracer
    outputs: list          # HbmViews of the returned tensors


def trace_into(call: Call, kb: KernelBuilder, inputs: list[DramTensor], hbm,
               outputs=None, constant=None) -> Traced:
    """Traces `call` into `kb` reading `inputs`; with `outputs` (tensors, or a function
    of the returned views making them), the returned tensors are renamed to them
    (shapes and dtypes must match)."""
    n_in = sum(s is None for s in call.slots)
    if n_in != len(inputs):
        raise KernelError(f"kernel {call.name} takes {n_in} tensors, got {len(inputs)}")
    tracer, outs = trace.run(call.kernel.fn, call.name, kb, hbm, inputs, call.slots,
                             dict(call.kwargs), call.kernel.grid, constant)
    renames = {}
    if callable(outputs):
        outputs = outputs(outs)
    if outputs is not None:
        if len(outputs) != len(outs):
            raise KernelError(f"kernel {call.name} returns {len(outs)} tensors, "
                              f"expected {len(outputs)}")
        for o, t in zip(outs, outputs):
            if tuple(o.shape) != tuple(t.shape) or o.dtype != t.dtype:
                raise KernelError(f"kernel {call.name} returned {list(o.shape)} {o.dtype} "
                                  f"where {list(t.shape)} {t.dtype} was traced before")
            renames[o.tensor.name] = t
    tracer.finish(renames)
    kb.flops += sum(i.flops for i in kb.instrs if i.engine == "tensor")
    return Traced(kb, tracer, outs)


def out_types(call: Call, avals: list[tuple[tuple[int, ...], str]], target: Target
              ) -> tuple[list[tuple[tuple[int, ...], str]], bool]:
    """(shape, dtype) of each result, from a trace for `target` (cached), and whether
    the kernel returns one tensor (not a tuple)."""
    return _out_types(call, tuple(avals), target)


@functools.lru_cache(maxsize=512)
def _out_types(call, avals, target):
    inputs = [DramTensor(f"in{i}", tuple(s), normalize_dtype(d)) for i, (s, d) in
              enumerate(avals)]
    counter = itertools.count()
    traced = trace_into(call, KernelBuilder(call.name, target), inputs,
                        lambda s, d: DramTensor(f"hbm{next(counter)}", s, d),
                        constant=lambda a, d: DramTensor(f"const{next(counter)}",
                                                         tuple(a.shape), d))
    return [(tuple(o.shape), o.dtype) for o in traced.outputs], traced.tracer.single


# --- standalone -----------------------------------------------------------------------------

@dataclass
class KernelRun:
    """What `simulate` returns: the kernel's results and the profile of its run."""
    outputs: list[np.ndarray]
    execution: object                    # jax_trn.profiler.Execution
    kernel: Kernel

    @property
    def simulated_time_s(self) -> float:
        return self.execution.simulated_time_s

    def __iter__(self):
        return iter(self.outputs)


def resolve_system(system):
    """A `System` from a name, a generation ("trn1"/"trn2"/"trn3": its smallest
    system) or None (this process's system)."""
    from jax_trn import config
    from jax_trn.systems import SYSTEMS
    if system is None or not isinstance(system, str):
        return config.get_system() if system is None else system
    if system in ("trn1", "trn2", "trn3"):
        return next(s for s in SYSTEMS.values() if s.generation == system)
    return config.get_system(system)


def build_program(call: Call, arrays: list[np.ndarray], target: Target) -> Program:
    """A one-kernel program: the kernel reading `arrays`' shapes, writing its results."""
    params = [DramTensor(f"arg{i}", tuple(a.shape), normalize_dtype(a.dtype))
              for i, a in enumerate(arrays)]
    temps: list[DramTensor] = []
    counter = itertools.count()

    def hbm(shape, dtype):
        temps.append(DramTensor(f"{call.name}.hbm{next(counter)}", shape, dtype))
        return temps[-1]

    kb = KernelBuilder(call.name, target)
    outputs: list[DramTensor] = []

    def name_outputs(views):
        outputs.extend(DramTensor(f"out{i}", tuple(o.shape), o.dtype)
                       for i, o in enumerate(views))
        return outputs

    constants: dict[str, np.ndarray] = {}

    def constant(array, dtype):
        t = DramTensor(f"{call.name}.const{len(constants)}", tuple(array.shape), dtype)
        constants[t.name] = array
        return t

    traced = trace_into(call, kb, params, hbm, name_outputs, constant)
    returned = {o.tensor.name for o in traced.outputs}
    scratch = [t for t in temps if t.name not in returned and t.name in kb.dram]
    kernel = kb.finish([f"{call.name} at {call.kernel.where}"])
    return Program(params, outputs, scratch, [kernel], constants=constants)


def simulate(kernel: KernelFunction, *args, system=None, **kwargs) -> KernelRun:
    """Runs `kernel` on numpy inputs on one NeuronCore of `system` (a name, "trn1" /
    "trn2" / "trn3", or None: this process's system): its results, computed by the
    hardware model's instructions, and the profile of the run (`execution.summary()`,
    `plot_timeline()`, `save_trace()`), without a JAX program."""
    from jax_trn import config
    from jax_trn.hw.bandwidth import Hbm
    from jax_trn.hw.core import NeuronCore
    from jax_trn.hw import dtypes as hw_dtypes
    from jax_trn.runtime import blas
    from jax_trn.runtime.device import core_numerics
    from jax_trn.runtime.dram import bind_dram
    from jax_trn.runtime.execution import make_execution
    from jax_trn.runtime.steps import run_kernels
    sysm = resolve_system(system)
    call = kernel.call(args, kwargs)
    arrays = [np.asarray(a) for a in args if is_array(a)]
    target = Target.of(sysm.chip.core)
    prog = build_program(call, arrays, target)
    options = config.current().replace(system=sysm)
    core = NeuronCore(sysm.chip.core, core_id=0, numerics=core_numerics(options))
    core.begin(Hbm(sysm.chip.hbm_bytes_per_ns, "hbm.chip0"))
    outs = [np.zeros(t.shape, hw_dtypes.np_dtype(t.dtype)) for t in prog.outputs]
    flat = [np.ascontiguousarray(a).reshape(-1) for a in arrays]
    dram = bind_dram(prog, flat, [o.reshape(-1) for o in outs], partition=0)
    with blas.one_thread(True):
        records = run_kernels(prog, core, dram, 0, 0, execute=True, chip_spec=sysm.chip,
                              call_host=False)
    ex = make_execution(call.name, prog, sysm, [0], records)
    return KernelRun(outs, ex, prog.steps[0])


def simulate_kernel(kernel: KernelFunction, *args, system=None, **kwargs):
    """NKI's `simulate_kernel`: the kernel's results on numpy inputs (one array, or a
    tuple when it returns several); `simulate` also gives the profile."""
    run = simulate(kernel, *args, system=system, **kwargs)
    return run.outputs[0] if len(run.outputs) == 1 else tuple(run.outputs)
