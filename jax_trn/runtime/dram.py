"""One device's DRAM for a call: the program's tensors by name, bound to buffers.

The simulator's HBM is a dict of flat numpy arrays (`hw.memory.dram_read`): the call's
parameters (read-only) and outputs, fresh temporaries, the program's constants and the
device's partition / replica ids.
"""
from __future__ import annotations

import numpy as np

from jax_trn.hw import dtypes as _dt

# Per-device values a program reads from DRAM (`stablehlo.partition_id` / `replica_id`).
PARTITION_ID, REPLICA_ID = "sys:partition_id", "sys:replica_id"


def bind_dram(prog, params: list[np.ndarray], outs: list[np.ndarray], *, partition: int = 0,
              replica: int = 0, static: dict | None = None) -> dict[str, np.ndarray]:
    """The DRAM tensors of one execution by name: flat parameter arrays (read-only),
    output arrays (written in place), temporaries (`Dram`: zeros, made on first use,
    views of their shared slots), the constants, and this device's partition and
    replica ids (uint32 scalars the runtime writes).
    `static`: the constants and ids already bound (`static_dram`), reused."""
    dram = dict(static) if static is not None else static_dram(prog, partition, replica)
    for p, data in zip(prog.params, params):
        view = _as_stored(data, p.dtype)
        view.flags.writeable = False      # kernels may not write their inputs
        dram[p.name] = view
    for t, data in zip(prog.outputs, outs):
        dram[t.name] = _as_stored(data, t.dtype)
    return Dram(dram, prog)


class Dram(dict):
    """A device's DRAM tensors by name, whose temporaries are made on first use (zeros,
    as a call finds them) and dropped by `free` after their last use: memory for the
    temporaries alive at a time, not for all of them (1152 devices' temporaries
    outgrow a laptop). A freed temporary is "not allocated" again (`hw.memory`
    raises), never silently zeros. With a buffer assignment (jax_trn.lower.buffers) a
    temporary is a view of its HBM slot, one zeroed byte array made when the first of
    its tenants is used and dropped when the tenant in use is freed; without `free`
    (one device's run) the slot is kept and its next tenant starts with the dead
    value's bytes, as on hardware."""
    __slots__ = ("temps", "freed", "slot_bytes", "temp_slot", "slots")

    def __init__(self, tensors: dict, prog):
        super().__init__(tensors)
        self.temps = {t.name: t for t in prog.temps}
        self.slot_bytes, self.temp_slot = prog.slot_bytes, prog.temp_slot
        self.freed: set[str] = set()
        self.slots: dict[int, np.ndarray] = {}

    def __missing__(self, name: str) -> np.ndarray:
        t = self.temps.get(name)
        if t is None or name in self.freed:
            raise KeyError(name)
        dtype = _dt.np_dtype(t.dtype)
        if self.slot_bytes is None:
            value = np.zeros(t.size, dtype)
        else:
            i = self.temp_slot[name]
            slot = self.slots.get(i)
            if slot is None:
                slot = self.slots[i] = np.zeros(t.nbytes, np.uint8)
            elif slot.size < t.nbytes:
                slot = self._grow(i, t.nbytes)
            value = slot[:t.nbytes].view(dtype)
        self[name] = value
        return value

    def _grow(self, i: int, nbytes: int) -> np.ndarray:
        """Slot `i` made `nbytes` long, its bytes kept and its live tenants re-bound
        to the new array (still views of one array). A slot is made as long as the
        tenant that makes it, not as its largest tenant: 1152 devices' small
        temporaries crossing a collective each held a whole slot (1.3 GB in the
        dp1152 step). The bytes are those a full-size slot would hold: every byte ever
        written lies within some tenant, copied on growth; the others are zeros."""
        old = self.slots[i]
        slot = self.slots[i] = np.zeros(nbytes, np.uint8)
        slot[:old.size] = old
        for name, t in self.temps.items():
            if self.temp_slot.get(name) == i and dict.__contains__(self, name):
                self[name] = slot[:t.nbytes].view(_dt.np_dtype(t.dtype))
        return slot

    def free(self, name: str) -> None:
        """Drops temporary `name` (its last use is over), and its slot's memory."""
        self.freed.add(name)
        self.pop(name, None)
        if self.slot_bytes is not None and name in self.temp_slot:
            self.slots.pop(self.temp_slot[name], None)

    def reset(self) -> None:
        """Every temporary back to unmade (zeros on next use)."""
        for name in self.temps:
            self.pop(name, None)
        self.freed.clear()
        self.slots.clear()


def static_dram(prog, partition: int = 0, replica: int = 0) -> dict[str, np.ndarray]:
    """The DRAM tensors that are the same on every call of `prog` on one device: its
    constants and the partition / replica ids, as read-only flat arrays."""
    dram = {PARTITION_ID: np.array([partition], np.uint32),
            REPLICA_ID: np.array([replica], np.uint32)}
    for name, value in prog.constants.items():
        dram[name] = np.ascontiguousarray(value).reshape(-1).view()
    for view in dram.values():
        view.flags.writeable = False
    return dram


def _as_stored(data: np.ndarray, dtype: str) -> np.ndarray:
    """A view of a buffer's flat data as the program's element type: itself, or the
    float32 pairs of a complex64 buffer (same bytes)."""
    want = _dt.np_dtype(dtype)
    return data.view() if data.dtype == want else data.view(want)
