"""Host callbacks: Python functions a running program calls in the user's process.

JAX's callback primitives (`jax.debug.print` / `debug.callback`, `pure_callback`,
`io_callback`, `checkify`'s runtime checks) are lowered for trn by
`jax_trn.jax_callbacks` into `custom_call @trn.python_callback` ops whose config holds a
key into this module's registry. The compiler turns each into a `hw.program.HostCallback`
step; when a device reaches it, `call` runs:

  1. the operands are copied from HBM to host memory (one DMA over the host link),
  2. the registered function runs with them as numpy arrays (what JAX's wrapper then
     gives the user's callable: CPU arrays, exactly as on the CPU backend),
  3. its results are copied back into HBM (one DMA over the host link).

Simulated time: each copy is one DMA's fixed cost plus its bytes at the chip's host
link rate (`LinkSpec.host_bytes_per_ns`, an assumption: see hw/spec.py); both run
even with no bytes (the doorbell that wakes the host, the completion the device waits
for). The function's own host time is not simulated (it is not device time).

Lifetime: `register` returns the entry, whose only strong references are the
lowering's host callbacks (`ModuleContext.add_host_callback`, kept by JAX for the
jitted function's lowering and by jaxlib for its executable) and the runtime
executables whose programs call it; the registry itself holds it weakly, so it goes
away with the last of them.
"""
from __future__ import annotations

import itertools
import threading
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from jax_trn import profiler
from jax_trn.hw import dtypes as _dt
from jax_trn.hw.trace import TraceEvent


class CallbackError(RuntimeError):
    """A host callback raised (or returned the wrong values): reaches JAX as INTERNAL
    with the callback's traceback, like the CPU backend's "CpuCallback error calling
    callback: ..." (so code that reads the message, e.g. equinox.filter_jit's, works
    the same). `pjrt_code`: the plugin reports it as is, not as a jax-trn fault."""
    pjrt_code = "INTERNAL"


@dataclass(eq=False)
class HostFunction:
    """A registered callable: `fn(*numpy arrays) -> sequence of numpy arrays`."""
    key: int
    fn: Callable[..., Sequence]
    kind: str                                  # "pure_callback", "debug_callback", ...

    def __call__(self, *args):                 # what add_host_callback keeps alive
        return self.fn(*args)


_LOCK = threading.Lock()
_KEYS = itertools.count(1)
_LIVE: "weakref.WeakValueDictionary[int, HostFunction]" = weakref.WeakValueDictionary()


def register(fn: Callable[..., Sequence], kind: str) -> HostFunction:
    """A new registry entry for `fn` (keep the returned object alive: see module doc)."""
    with _LOCK:
        entry = HostFunction(next(_KEYS), fn, kind)
        _LIVE[entry.key] = entry
    return entry


def lookup(key: int) -> HostFunction:
    """The live entry for `key`; LookupError if it is gone (or never existed here)."""
    entry = _LIVE.get(key)
    if entry is None:
        raise LookupError(
            f"host callback {key} is not registered in this process: a program with "
            "host callbacks runs only in the process (and while the jitted function) "
            "that lowered it")
    return entry


# --- running one callback ------------------------------------------------------------

def read(dram: dict, tensors) -> list[np.ndarray]:
    """Copies of the DRAM tensors `tensors` in their shapes (what the host receives)."""
    return [np.array(np.asarray(dram[t.name]).reshape(t.shape)) for t in tensors]


def write(dram: dict, tensors, values: Sequence[np.ndarray]) -> None:
    """Writes host `values` into the DRAM tensors `tensors` (after `check_results`)."""
    for t, value in zip(tensors, values):
        dram[t.name][...] = np.asarray(value).reshape(-1)


def zeros(tensors) -> list[np.ndarray]:
    """What a timing-only run writes for the results (it calls nothing)."""
    return [np.zeros(t.shape, _dt.np_dtype(t.dtype)) for t in tensors]


def run(step, src: dict, dsts, call_host: bool = True) -> None:
    """Runs `step` on the operands in DRAM `src` and writes its results into DRAM `dsts`
    (one dict, or a list: a callback one device makes for all). `call_host=False`
    (a timing run) calls nothing and writes zeros."""
    outs = call(step, read(src, step.operands)) if call_host else zeros(step.results)
    for dram in dsts if isinstance(dsts, list) else [dsts]:
        write(dram, step.results, outs)


def call(step, args: list[np.ndarray]) -> list[np.ndarray]:
    """Runs `step`'s function on `args`; its results, checked against `step.results`.
    An exception in the function becomes a CallbackError carrying its traceback."""
    entry = lookup(step.key)
    try:
        out = list(entry.fn(*args))
    except Exception as e:
        text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        raise CallbackError(f"TrnCallback error calling {entry.kind} ({step.name}): "
                            f"{text}") from e
    return check_results(step, out)


def check_results(step, out: list) -> list[np.ndarray]:
    """The function's results as arrays of the declared shapes and dtypes."""
    if len(out) != len(step.results):
        raise CallbackError(f"{step.name}: the callback returned {len(out)} values, "
                            f"the program expects {len(step.results)}")
    arrays = []
    for i, (value, t) in enumerate(zip(out, step.results)):
        a = np.asarray(value)
        if tuple(a.shape) != tuple(t.shape) or a.dtype != _dt.np_dtype(t.dtype):
            raise CallbackError(f"{step.name}: result {i} is {a.dtype}{list(a.shape)}, "
                                f"the program expects {t.dtype}{list(t.shape)}")
        arrays.append(a)
    return arrays


# --- timing -------------------------------------------------------------------------

def transfer_ns(chip, nbytes: int) -> float:
    """One copy between HBM and host memory: a DMA's fixed cost (§2.6 [NKI-DMABW]) plus
    `nbytes` at the host link's rate (`LinkSpec.host_bytes_per_ns`, assumed)."""
    return chip.core.dma_fixed_ns + nbytes / chip.links.host_bytes_per_ns


def nbytes(tensors) -> int:
    return sum(t.nbytes for t in tensors)


@dataclass(frozen=True)
class Span:
    """One device's time at a callback: it reached it at `start_ns`; its operands were in
    host memory at `host_ns` (== start_ns if it sends none: another device calls for
    it); the results' copy back started at `back_ns` and ended at `end_ns`."""
    start_ns: float
    host_ns: float
    back_ns: float
    end_ns: float


def local_span(step, chip, t: float) -> Span:
    """The span of a callback this device calls for itself, reached at `t`."""
    host = t + transfer_ns(chip, nbytes(step.operands))
    return Span(t, host, host, host + transfer_ns(chip, nbytes(step.results)))


def shared_spans(step, chip, arrivals: list[float], caller: int) -> list[Span]:
    """Each device's span at a callback device `caller` makes for all, reached at
    `arrivals[p]`: the caller's operands go to the host, then every device gets the
    results (over its own host link) once the host has them and it has arrived."""
    host = arrivals[caller] + transfer_ns(chip, nbytes(step.operands))
    back = transfer_ns(chip, nbytes(step.results))
    spans = []
    for p, t in enumerate(arrivals):
        start = host if p == caller else max(t, host)
        spans.append(Span(t, host if p == caller else t, start, start + back))
    return spans


def record(step, span: Span, device_id: int, chip: int, core: int, context: str):
    """The profiler's record of one device's callback: its two copies as DMA events
    (the caller's copy to the host only on the device that sent its operands)."""
    evs = []
    if span.host_ns > span.start_ns:
        evs.append(TraceEvent("dma0", "DmaToHost", step.name, span.start_ns, span.host_ns,
                              span.start_ns, bytes=nbytes(step.operands), core=core))
    evs.append(TraceEvent("dma0", "DmaFromHost", step.name, span.back_ns, span.end_ns,
                          span.host_ns, bytes=nbytes(step.results), core=core))
    busy = sum(e.end_ns - e.start_ns for e in evs)
    return profiler.KernelRecord(step.name, device_id, span.start_ns, span.end_ns,
                                 {"dma": busy}, 0, sum(e.bytes for e in evs), list(step.ops),
                                 evs, chip=chip, core=core, context=context)
