"""Buffer assignment: HBM temporaries whose lifetimes do not overlap share memory.

Every value the lowering cannot put in a parameter or output gets an HBM temporary
(`Lowerer.temp`). Allocating each one for the whole call, as the runtime did, charged a
program the sum of all its intermediates: `jax.random.bernoulli` of 10^8 samples made
57 temporaries of 400 MB and ran out of a Trn2 core's HBM, where XLA (and the Neuron
compiler) reuse the memory of dead values and need a few of them at once.

Lifetimes are measured on the program's top-level steps: a temporary is live from the
first step that names it to the last (a step names a tensor if any kernel nested in it
does, or it is a loop's predicate / carried value, a conditional's index / result, a
collective's or host callback's operand / result). Temporaries live at the same step
never share, so a loop body's values keep their own memory for the whole loop. Slots
are assigned greedily in order of first use, each temporary taking the best-fitting
free slot (one that is at least its size, else the largest free one, which grows), or a
new one. The runtime allocates one zeroed byte array per slot per call and binds every
temporary to a view of its slot (`jax_trn.runtime.dram.bind_dram`); a temporary that
shares a slot may therefore start with a dead value's bytes, as on hardware: no kernel
reads a temporary before writing it.
"""
from __future__ import annotations

from jax_trn.hw.program import (Case, Collective, DramTensor, HostCallback, Kernel, Loop,
                                Step, While, walk_steps)

__all__ = ["assign"]


def assign(temps: list[DramTensor], steps: list[Step]) -> tuple[list[int], dict[str, int]]:
    """(bytes of each slot, the slot of each temporary by name) for `temps` of the
    program `steps`. A temporary no step names keeps a slot of its own."""
    spans = _lifetimes({t.name for t in temps}, steps)
    order = sorted(temps, key=lambda t: (spans.get(t.name, (len(steps),))[0], t.name))
    sizes: list[int] = []
    busy_until: list[int] = []           # the last step of the slot's current tenant
    slot: dict[str, int] = {}
    for t in order:
        first, last = spans.get(t.name, (len(steps), len(steps)))
        free = [i for i, end in enumerate(busy_until) if end < first]
        i = _best_fit(free, sizes, t.nbytes)
        if i is None:
            sizes.append(0)
            busy_until.append(-1)
            i = len(sizes) - 1
        sizes[i] = max(sizes[i], t.nbytes)
        busy_until[i] = last
        slot[t.name] = i
    return sizes, slot


def _best_fit(free: list[int], sizes: list[int], nbytes: int) -> int | None:
    """The smallest free slot holding `nbytes`, else the largest free slot (None: none)."""
    fits = [i for i in free if sizes[i] >= nbytes]
    if fits:
        return min(fits, key=lambda i: (sizes[i], i))
    return max(free, key=lambda i: (sizes[i], -i)) if free else None


def _lifetimes(names: set[str], steps: list[Step]) -> dict[str, tuple[int, int]]:
    """(first, last) top-level step index naming each of `names`."""
    spans: dict[str, tuple[int, int]] = {}
    for i, step in enumerate(steps):
        for name in _named(step) & names:
            first, _ = spans.get(name, (i, i))
            spans[name] = (first, i)
    return spans


def _named(step: Step) -> set[str]:
    """Every DRAM tensor name `step` or a step nested in it names."""
    names: set[str] = set()
    for s in walk_steps([step]):
        if isinstance(s, Kernel):
            names.update(s.dram)
        elif isinstance(s, While):
            names.update(t.name for t in (s.pred, *s.carried))
        elif isinstance(s, Loop):
            names.update(t.name for t in s.carried)
        elif isinstance(s, Case):
            names.update(t.name for t in (s.index, *s.results))
        elif isinstance(s, (Collective, HostCallback)):
            names.update(t.name for t in (*s.operands, *s.results))
    return names
