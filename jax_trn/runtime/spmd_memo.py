"""Kernels whose inputs agree across devices, run once per call (issue 14, point 4).

In a data-parallel step many kernels see the same bits on every device: everything
after an all_gather (the loss over the gathered logits and labels), everything after an
all_reduce (the optimizer's update of replicated parameters). A kernel's effect on DRAM
is a function of what it reads there (`NeuronCore.replay` runs its instructions in the
leader's recorded order; SBUF and PSUM are one scratch every core of the process
computes in, and no kernel reads what it did not write, `NeuronCore.begin`), so a
follower whose inputs hold the same bits as the first leader's gets the same outputs.

`Memo.record` runs a top-level kernel on the first leader that reaches it and keeps a
copy of what it read (the tensors it names but does not write first) and of what it
wrote. `Memo.apply` on a follower compares its inputs with those, bit for bit, and on a
match writes the recorded outputs instead of replaying the kernel. A mismatch drops
the entry: that kernel varies across devices (its data are sharded) and is replayed
from then on, at the cost of one comparison.

A temporary only this kernel writes, made fresh by it (not yet in DRAM), is bound as one
read-only array shared by every device (the first leader's too), so the next kernel's
comparison is an identity test (`frozen`), and memory is one array, not one per device.
So is a program output only this kernel writes (its zeros before the kernel compared
as an input), on followers: `outputs_bound` hands the array to the output buffer
(`adopt`), so 1152 devices' replicated results are one host array. Anything else it
writes (a temporary other steps write too) is copied into the device's own array.
Kernels nested in loops and conditionals are always replayed (their temporaries carry
values between trips; an on-chip loop's kernels keep carries in SBUF): only the steps
of the program's own list are recorded (`wants`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jax_trn.hw.program import Collective, HostCallback, Kernel, walk_steps

__all__ = ["Memo"]


@dataclass
class _Entry:
    fresh: frozenset            # written names not in DRAM before the kernel
    inputs: tuple               # (name, bits before the kernel) of everything else named
    outputs: tuple              # (name, bits after, bind: shared read-only array)


class Memo:
    """One call's recorded kernels (see module doc); `toucher` gives a step's
    (names, written names)."""

    def __init__(self, prog, toucher):
        self._touches = toucher._touches
        self.single = _single_writer_temps(prog, toucher)
        self.top = frozenset(id(s) for s in prog.steps if isinstance(s, Kernel))
        self.outputs = frozenset(t.name for t in prog.outputs)
        self.replaced: list[tuple[dict, str, np.ndarray]] = []   # outputs bound: originals
        self.entries: dict[int, _Entry | None] = {}
        self.frozen: dict[int, np.ndarray] = {}
        self.hits = 0

    def wants(self, kernel) -> bool:
        """Whether `kernel` is a step of the program's own list (not one nested in a
        loop, a conditional or an on-chip loop, whose kernels may keep state in SBUF
        from one to the next) not recorded yet."""
        return id(kernel) in self.top and id(kernel) not in self.entries

    def record(self, kernel, dram, run):
        """`run()` (the leader's timed kernel) with its inputs and outputs recorded;
        returns what `run` returns."""
        touched, written = self._touches(kernel)
        fresh = frozenset(n for n in written if n not in dram)
        inputs = tuple((n, self._snap(dram[n])) for n in sorted(touched - fresh))
        got = run()
        outputs = []
        for n in sorted(written):
            bind = n in self.single and (n in fresh or n in self.outputs)
            value = self._snap(dram[n]) if not bind else self._freeze(dram[n])
            if bind and n in fresh:
                dram[n] = value
            outputs.append((n, value, bind))
        self.entries[id(kernel)] = _Entry(fresh, inputs, tuple(outputs))
        return got

    def apply(self, kernel, dram) -> bool:
        """The recorded outputs into `dram` if its inputs are the recorded bits (True);
        False (and the entry dropped) if not: replay the kernel."""
        entry = self.entries.get(id(kernel)) if id(kernel) in self.top else None
        if entry is None:
            return False
        if any(n in dram for n in entry.fresh) or not all(
                _same(dram[n], want) for n, want in entry.inputs):
            self.entries[id(kernel)] = None
            return False
        for n, value, bind in entry.outputs:
            if bind and n in self.outputs:
                self.replaced.append((dram, n, dram[n]))
                dram[n] = value
            elif bind:
                dram[n] = value
            else:
                dram[n][...] = value
        self.hits += 1
        return True

    def restore(self) -> None:
        """The outputs' own arrays back in their DRAMs (a diverged call reruns)."""
        for dram, n, original in reversed(self.replaced):
            dram[n] = original
        self.replaced = []

    def _snap(self, a: np.ndarray) -> np.ndarray:
        return a if id(a) in self.frozen and self.frozen[id(a)] is a else a.copy()

    def _freeze(self, a: np.ndarray) -> np.ndarray:
        value = a.copy()
        value.flags.writeable = False
        self.frozen[id(value)] = value
        return value


def _same(a: np.ndarray, want: np.ndarray) -> bool:
    """Whether `a` holds `want`'s bits (NaN payloads and -0.0 included): their bytes
    compared (memcmp; ~10x faster than `array_equal` on the small per-device tensors
    a data-parallel step compares, as fast on large ones)."""
    if a is want:
        return True
    if a.shape != want.shape or a.dtype != want.dtype:
        return False
    return a.tobytes() == want.tobytes()


def _single_writer_temps(prog, toucher) -> frozenset:
    """The temporaries and outputs exactly one step of the whole program writes, that
    step a top-level kernel."""
    writers: dict[str, int] = {}
    top = {id(s) for s in prog.steps if isinstance(s, Kernel)}
    ok: set[str] = set()
    for step in walk_steps(prog.steps):
        if isinstance(step, (Kernel, Collective, HostCallback)):
            for n in toucher._touches(step)[1]:
                writers[n] = writers.get(n, 0) + 1
                if id(step) in top:
                    ok.add(n)
    names = {t.name for t in prog.temps} | {t.name for t in prog.outputs}
    return frozenset(n for n in ok & names if writers[n] == 1)
