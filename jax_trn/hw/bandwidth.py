"""Shared bandwidth as a reservation timeline (a simple fluid model).

A `Bandwidth` resource has a capacity in bytes/ns and a piecewise-constant record of
the rate already reserved over time. A transfer asks `reserve(...)` for `nbytes` from
time `t0` at no more than `max_rate`; it takes whatever capacity earlier reservations
left free on *every* resource it crosses, segment by segment, and keeps that rate
reserved until it is done. First come, first served: deterministic, and concurrent
transfers slow each other down, which is all we need from it.

Each NeuronCore owns one for its 16 DMA engines; each chip owns an `Hbm` shared by its
cores (the caller passes the same `Hbm` to every `NeuronCore` of a chip).
"""
from __future__ import annotations

from bisect import bisect_right

__all__ = ["Bandwidth", "Hbm", "reserve"]

_INF = float("inf")
_EPS = 1e-9


class Bandwidth:
    """Capacity `bytes_per_ns` and reserved rate `used[i]` on `[times[i], times[i+1])`."""
    __slots__ = ("name", "capacity", "times", "used", "total_bytes")

    def __init__(self, bytes_per_ns: float, name: str = "bandwidth"):
        self.name = name
        self.capacity = float(bytes_per_ns)
        self.times = [-_INF]
        self.used = [0.0]
        self.total_bytes = 0.0

    def _segment(self, t: float) -> int:
        return bisect_right(self.times, t) - 1

    def free_at(self, t: float) -> tuple[float, float]:
        """(free rate at t, time of the next breakpoint after t)."""
        i = self._segment(t)
        nxt = self.times[i + 1] if i + 1 < len(self.times) else _INF
        return self.capacity - self.used[i], nxt

    def _split(self, t: float) -> int:
        """Make `t` a breakpoint; return its segment index."""
        i = self._segment(t)
        if self.times[i] != t:
            self.times.insert(i + 1, t)
            self.used.insert(i + 1, self.used[i])
            i += 1
        return i

    def add(self, t0: float, t1: float, rate: float) -> None:
        if t1 <= t0 or rate <= 0.0:
            return
        i, j = self._split(t0), self._split(t1)
        for k in range(i, j):
            self.used[k] += rate
        self.total_bytes += rate * (t1 - t0)

    def prune(self, before: float) -> None:
        """Forget reservations that end before `before` (bounded memory)."""
        i = self._segment(before)
        if i > 0:
            del self.times[1:i + 1]
            del self.used[:i]
            self.times[0] = -_INF


class Hbm(Bandwidth):
    """A chip's HBM: one bandwidth shared by all its NeuronCores' DMAs.

    Cores are simulated one after another, so first come, first served would let the
    first cores take all they can and starve the last ones, which then run below the
    HBM rate once the others finish. When `sharers` cores stream together (an SPMD
    program on every core of a chip), the HBM arbiter gives each its fair share, so
    each core takes at most `capacity / sharers` (`share`). None: no per-core limit
    (one core, or unknown)."""
    __slots__ = ("sharers",)

    def __init__(self, bytes_per_ns: float, name: str = "hbm", sharers: int | None = None):
        super().__init__(bytes_per_ns, name)
        self.sharers = sharers

    @property
    def share(self) -> float:
        """The most one core may take (bytes/ns)."""
        return self.capacity / self.sharers if self.sharers else _INF


def _step(lines, t: float) -> tuple[float, float]:
    """(free rate per byte of progress, next breakpoint) across weighted resources."""
    rate, nxt = _INF, _INF
    for line, weight in lines:
        free, brk = line.free_at(t)
        rate = min(rate, max(free, 0.0) / weight)
        nxt = min(nxt, brk)
    return rate, nxt


def reserve(lines: list[tuple[Bandwidth, float]], t0: float, nbytes: float,
            max_rate: float) -> float:
    """Move `nbytes` starting at `t0`, at most `max_rate` bytes/ns, through resources
    `lines` = [(resource, weight)] (a byte of progress uses `weight` bytes of the
    resource's capacity). Reserves the rate used and returns the finishing time."""
    t, left, pieces = t0, float(nbytes), []
    while left > _EPS:
        free, nxt = _step(lines, t)
        rate = min(max_rate, free)
        if rate <= _EPS:
            if nxt == _INF:
                raise RuntimeError("bandwidth exhausted forever (zero capacity?)")
            t = nxt
            continue
        end = t + left / rate
        if end > nxt:
            end = nxt
            left -= rate * (end - t)
        else:
            left = 0.0
        pieces.append((t, end, rate))
        t = end
    for line, weight in lines:
        for a, b, rate in pieces:
            line.add(a, b, rate * weight)
    return t
