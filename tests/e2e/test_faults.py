"""The faults found by probing (issue 11, item 7), each pinned by a test that failed
before its fix: an abort at interpreter exit, Ctrl-C turned into JaxRuntimeError, and
simulated HBM left charged by failed executions; and the garbage collector kept out of
compilation (compile-time scaling itself: tests/lower/test_semaphores.py).

Scripts that need a fresh interpreter (interpreter exit, signals, an environment
setting read at start) run in subprocesses with the repository on PYTHONPATH.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _start(code: str, env: dict | None = None) -> subprocess.Popen:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                            env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _run(code: str, env: dict | None = None, timeout: float = 300):
    proc = _start(code, env)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


# --- abort at interpreter exit ----------------------------------------------------------

READ_IN_DEL_AT_EXIT = """
    import jax, numpy as np

    class Holder:
        def __init__(self):
            self.x = jax.device_put(np.arange(16, dtype=np.float32), jax.devices("trn")[0])
            self.me = self          # a cycle: only the interpreter's final collection frees it

        def __del__(self):
            print("read at exit:", float(np.asarray(self.x).sum()), flush=True)

    Holder()
"""

# Freed later, while the modules are torn down. JAX's own modules may be cleared first
# (`np` is None inside jax._src.array), so on every backend such a read may fail with an
# AttributeError, which Python prints as "Exception ignored": it must never abort.
READ_IN_DEL_AT_MODULE_TEARDOWN = READ_IN_DEL_AT_EXIT.replace(
    "            self.me = self          # a cycle: only the interpreter's final collection frees it\n",
    "").replace("    Holder()\n", "    holder = Holder()\n    float(np.asarray(holder.x).sum())\n")


def test_trn_array_read_in_a_del_at_interpreter_exit_works_every_time():
    """Was SIGABRT in 6 of 10 runs (XLA read an unset element type while Python was
    finalizing), or "Array has been deleted"; the CPU backend prints the sum."""
    procs = [_start(READ_IN_DEL_AT_EXIT) for _ in range(10)]
    results = [(p.returncode, out, err) for p in procs
               for out, err in [p.communicate(timeout=300)]]
    for returncode, out, err in results:
        assert returncode == 0, err[-2000:]
        assert out.strip() == "read at exit: 120.0", err[-2000:]


def test_trn_array_read_at_module_teardown_never_aborts():
    """The same read while modules are torn down: the sum, or the error JAX's cleared
    modules give on the CPU backend too, printed by Python; never an abort."""
    procs = [_start(READ_IN_DEL_AT_MODULE_TEARDOWN) for _ in range(10)]
    results = [(p.returncode, out, err) for p in procs
               for out, err in [p.communicate(timeout=300)]]
    for returncode, out, err in results:
        assert returncode == 0, err[-2000:]
        assert out.strip() in ("read at exit: 120.0", ""), err[-2000:]
        assert out.strip() or "Exception ignored in" in err, err[-2000:]
        assert "Fatal" not in err and "INTERNAL" not in err, err[-2000:]


WITHOUT_EXTENSION = """
    import sys, warnings
    sys.modules["pjrt_plugin._native._guard"] = None        # as if it was never built
    warnings.simplefilter("ignore")
    import jax, numpy as np
    from pjrt_plugin import _native
    assert not _native.has_guard()
    x = jax.device_put(np.ones((8, 8), np.float32), jax.devices("trn")[0])
    print(float(jax.jit(lambda a: a * 2)(x).sum()), np.asarray(x).dtype, x.is_deleted())
    try:
        jax.jit(lambda a: jax.numpy.cumprod(a * 1j, 0).real)(x)
    except Exception as e:
        print(type(e).__name__, "reduce_window" in str(e))
"""


def test_the_plugin_still_runs_without_its_extension():
    """Without a C compiler at install: ctypes thunks and Python errors instead."""
    returncode, out, err = _run(WITHOUT_EXTENSION)
    assert returncode == 0, err[-3000:]
    assert out.splitlines() == ["128.0 float32 False", "JaxRuntimeError True"], err[-3000:]


# --- Ctrl-C -------------------------------------------------------------------------------

INTERRUPT_EXECUTION = """
    import os, signal, threading
    import jax, numpy as np

    dev = jax.devices("trn")[0]
    x = jax.device_put(np.ones((256, 256), np.float32), dev)

    @jax.jit
    def loop(a, n):
        body = lambda c: (c[0] + 1, c[1] * 1.0001)
        return jax.lax.while_loop(lambda c: c[0] < n, body, (0, a))[1]

    few, forever = (jax.device_put(np.int32(n), dev) for n in (3, 2**30))

    def interrupted(call):
        before = dev.memory_stats()["bytes_in_use"]
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        try:
            call().block_until_ready()
            what = "finished"
        except KeyboardInterrupt:
            what = "KeyboardInterrupt"
        except BaseException as e:
            what = type(e).__name__ + ": " + str(e)[:200]
        return what, dev.memory_stats()["bytes_in_use"] - before

    compiled = loop.lower(x, few).compile()
    print("compiled object:", *interrupted(lambda: compiled(x, forever)))
    loop(x, few).block_until_ready()               # now JAX dispatches in C++
    print("C++ dispatch:", *interrupted(lambda: loop(x, forever)))
    print("then:", round(float(loop(x, few)[0, 0]), 4), float(jax.jit(lambda a: a + 1)(x)[0, 0]))
"""


def test_ctrl_c_during_execution_raises_keyboard_interrupt_and_the_process_goes_on():
    """Was `JaxRuntimeError: INTERNAL: internal error in jax-trn: KeyboardInterrupt`,
    with the outputs of the interrupted call left charged (256 KiB)."""
    returncode, out, err = _run(INTERRUPT_EXECUTION, {"JAX_TRN_MAX_WHILE_ITERATIONS": "2000000000"})
    assert returncode == 0, err[-3000:]
    assert out.splitlines() == ["compiled object: KeyboardInterrupt 0",
                                "C++ dispatch: KeyboardInterrupt 0",
                                "then: 1.0003 2.0"], err[-3000:]


INTERRUPT_COMPILE = """
    import os, signal, threading, time
    import jax, numpy as np
    import hlo_passes

    compile_to_ir = hlo_passes.compile_to_ir

    def slow(*args, **kwargs):             # a compile that takes a while, interrupted
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        time.sleep(5)
        return compile_to_ir(*args, **kwargs)

    hlo_passes.compile_to_ir = slow
    x = jax.device_put(np.ones((8, 8), np.float32), jax.devices("trn")[0])
    try:
        jax.jit(lambda a: a * 3)(x)
        print("finished")
    except KeyboardInterrupt:
        print("KeyboardInterrupt")
    except BaseException as e:
        print(type(e).__name__ + ": " + str(e)[:200])
    hlo_passes.compile_to_ir = compile_to_ir
    print("then:", float(jax.jit(lambda a: a * 3)(x)[0, 0]))
"""


def test_ctrl_c_during_compile_raises_keyboard_interrupt_and_the_process_goes_on():
    """JAX compiles on a thread of its own and its wait is interruptible, but the
    process hung at exit while the interrupted compile still ran (XLA's pool joined a
    thread CPython had ended): the exit now waits for it (`runtime.inflight`)."""
    returncode, out, err = _run(INTERRUPT_COMPILE, timeout=120)
    assert returncode == 0, err[-3000:]
    assert out.splitlines() == ["KeyboardInterrupt", "then: 3.0"], err[-3000:]


def test_a_ctrl_c_python_could_not_raise_is_raised_between_steps():
    """A SIGINT whose KeyboardInterrupt lands in a __del__ (or JAX's gc callback) is
    printed as ignored by Python; during an execution the next step raises it."""
    import signal
    import time

    from jax_trn.runtime import interrupts

    class Swallows:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)                   # the handler runs here, inside __del__

    with pytest.raises(KeyboardInterrupt):
        with interrupts.watched():
            Swallows()                         # freed at once: its interrupt is lost
            interrupts.check()
    interrupts.check()                         # nothing left over afterwards
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_exit_handler_waits_for_a_running_compile_and_stops_new_ones():
    import threading
    import time

    from jax_trn.runtime import inflight

    done = []

    def compile_():
        with inflight.tracked():
            time.sleep(0.3)
            done.append(1)
            try:
                inflight.checkpoint()          # the compile's next step: stops here
            except inflight.Cancelled:
                done.append("cancelled")

    worker = threading.Thread(target=compile_)
    worker.start()
    time.sleep(0.05)
    try:
        with pytest.raises(inflight.Cancelled):
            inflight.drain()
            with inflight.tracked():
                pass
        assert done == [1, "cancelled"]
    finally:
        inflight._stopping = False
        worker.join()


# --- HBM left charged by failed executions --------------------------------------------------

RUNAWAY_LOOPS = """
    import jax, numpy as np

    dev = jax.devices("trn")[0]
    x = jax.device_put(np.ones((256, 256), np.float32), dev)
    f = jax.jit(lambda a: jax.lax.while_loop(lambda c: c[0] < 100, lambda c: (c[0] + 1, c[1] + 1),
                                             (0, a))[1])
    before = dev.memory_stats()["bytes_in_use"]
    for _ in range(3):
        try:
            f(x).block_until_ready()
        except Exception as e:
            assert "JAX_TRN_MAX_WHILE_ITERATIONS" in str(e), e
    print("charged after 3 runaway loops:", dev.memory_stats()["bytes_in_use"] - before)
"""


def test_while_loops_stopped_by_the_iteration_limit_leave_nothing_charged():
    """Was +256 KiB (the loop's output) per failed call."""
    returncode, out, err = _run(RUNAWAY_LOOPS, {"JAX_TRN_MAX_WHILE_ITERATIONS": "5"})
    assert returncode == 0, err[-3000:]
    assert out.strip() == "charged after 3 runaway loops: 0"


def _in_use(devices) -> list[int]:
    return [d.memory_stats()["bytes_in_use"] for d in devices]


def test_out_of_hbm_on_one_device_releases_the_other_devices_outputs(jax, trn_devices,
                                                                     monkeypatch):
    """A two-device program without collectives runs device by device; device 1 runs
    out of HBM for its output after device 0 ran. Was: device 0's output kept."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from jax_trn.runtime.device import Device, OutOfMemory
    devices = trn_devices[:2]
    sharding = NamedSharding(Mesh(np.array(devices), ("x",)), PartitionSpec("x"))
    x = jax.device_put(np.ones((2, 1024), np.float32), sharding)
    f = jax.jit(lambda a: a * 2)
    f(x).block_until_ready()                 # compiled; a successful call keeps nothing
    before = _in_use(devices)
    allocate = Device.allocate

    def full_on_device_1(self, nbytes, what="buffer"):
        if self.id == devices[1].id and what.endswith("buffer"):
            raise OutOfMemory(f"out of HBM on device {self.id} (test)")
        allocate(self, nbytes, what)

    monkeypatch.setattr(Device, "allocate", full_on_device_1)
    with pytest.raises(Exception, match="RESOURCE_EXHAUSTED"):
        f(x).block_until_ready()
    assert _in_use(devices) == before


@pytest.mark.parametrize("where", ["output", "binding"])
def test_host_memory_error_after_the_device_was_charged_releases_the_charge(
        jax, trn, monkeypatch, where):
    """A host MemoryError while making an output buffer's data (after its HBM was
    charged) or while binding the run's DRAM (after outputs and temporaries were
    charged). Was: the charges kept."""
    from jax_trn.runtime import buffer, executable
    x = jax.device_put(np.ones((64, 64), np.float32), trn)
    f = jax.jit(lambda a: (a @ a).sum(axis=0) + 1)
    f(x).block_until_ready()
    before = _in_use([trn])

    def no_host_memory(*args, **kwargs):
        raise MemoryError("host memory exhausted (test)")

    if where == "output":
        monkeypatch.setattr(buffer, "host_zeros", no_host_memory)
    else:
        monkeypatch.setattr(executable, "bind_dram", no_host_memory)
    with pytest.raises(Exception, match="RESOURCE_EXHAUSTED"):
        f(x).block_until_ready()
    assert _in_use([trn]) == before


def test_a_buffer_whose_host_memory_fails_charges_nothing(monkeypatch):
    from jax_trn import systems
    from jax_trn.runtime import buffer
    from jax_trn.runtime.device import make_devices
    dev = make_devices(systems.SYSTEMS["trn1.2xlarge"])[0]

    def no_host_memory(*args, **kwargs):
        raise MemoryError("host memory exhausted (test)")

    monkeypatch.setattr(buffer, "host_zeros", no_host_memory)
    with pytest.raises(MemoryError):
        buffer.Buffer(dev, (1024,), "float32")
    assert dev.memory_stats()["bytes_in_use"] == 0


# --- the garbage collector during compilation ------------------------------------------------

def test_compiling_runs_with_the_garbage_collector_paused(jax, trn, monkeypatch):
    """Full collections walked JAX's whole heap over and over during a compile (20-34%
    of its time); the compile driver pauses the collector in both of its steps."""
    import gc

    import hlo_passes
    from jax_trn import lower
    states = []

    def recording(fn):
        def call(*args, **kwargs):
            states.append(gc.isenabled())
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(hlo_passes, "compile_to_ir", recording(hlo_passes.compile_to_ir))
    monkeypatch.setattr(lower, "lower_module", recording(lower.lower_module))
    x = jax.device_put(np.ones((8, 8), np.float32), trn)
    assert gc.isenabled()
    jax.jit(lambda a: a * 5 - 1)(x).block_until_ready()
    assert states == [False, False] and gc.isenabled()


def test_gc_pause_restores_the_collector_after_overlapping_bodies():
    import gc
    import threading
    from jax_trn.runtime.gc_pause import gc_paused
    inside, release = threading.Event(), threading.Event()

    def other():
        with gc_paused():
            inside.set()
            release.wait(10)

    assert gc.isenabled()
    thread = threading.Thread(target=other)
    with gc_paused():
        thread.start()
        inside.wait(10)
        assert not gc.isenabled()
    assert not gc.isenabled()              # the other body still runs
    release.set()
    thread.join()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()          # left as it was found
    finally:
        gc.enable()
