"""Which process owns which devices (issue 17): one simulated system across the
processes of a JAX multi-controller run.

After `jax.distributed.initialize(coordinator, num_processes, process_id)` JAX creates the
`trn` client with the create options `node_id` (this process) and `num_nodes` (how many),
and hands it the coordination service's key-value store (`kvstore.KVStore`). Process p
owns the chips [p * k, (p + 1) * k) of the system, k = num_chips / num_nodes (whole
chips: a chip's cores share its HBM, whose contention is simulated inside one process),
and with them the devices on those chips. Every process sees every device (ids stay
global); only its own are addressable.
"""
from __future__ import annotations

from dataclasses import dataclass

from jax_trn.systems import System


class ProcessSplitError(ValueError):
    """A process count the system's chips cannot be divided by."""


@dataclass(frozen=True)
class Processes:
    """This process's place in the run: `index` of `count` processes, owning
    `chips_per_process` consecutive chips each."""
    index: int = 0
    count: int = 1
    chips_per_process: int = 0         # 0: one process owns every chip

    @property
    def multi(self) -> bool:
        return self.count > 1

    def owner_of_chip(self, chip: int) -> int:
        """The process index that owns `chip`."""
        return chip // self.chips_per_process if self.chips_per_process else 0


def split(system: System, index: int = 0, count: int = 1) -> Processes:
    """The share of `system` that process `index` of `count` owns; a count that does
    not divide the chips is refused (a chip is never split between processes)."""
    if not isinstance(count, int) or count < 1:
        raise ProcessSplitError(f"num_nodes={count!r}: the number of processes must be "
                                f"a positive integer")
    if not isinstance(index, int) or not 0 <= index < count:
        raise ProcessSplitError(f"node_id={index!r}: the process index must be in "
                                f"0..{count - 1} (num_nodes={count})")
    if count == 1:
        return Processes()
    chips = system.num_chips
    if chips % count:
        divisors = [n for n in range(1, chips + 1) if chips % n == 0]
        raise ProcessSplitError(
            f"{system.name} has {chips} chips, which {count} processes cannot share "
            f"equally (each process owns whole chips); use a process count among "
            f"{divisors}, or a system with a multiple of {count} chips (JAX_TRN_SYSTEM)")
    return Processes(index, count, chips // count)
