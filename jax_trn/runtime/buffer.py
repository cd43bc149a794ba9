"""Device buffers: arrays held in a device's simulated HBM; the allocations of one execution."""
from __future__ import annotations

import math
import weakref

import numpy as np

from jax_trn.hw import dtypes as _dt
from .device import Device


class Buffer:
    """An immutable array in one device's HBM. `data` is the flat host copy that the
    simulator's DMA reads and writes; its bytes are charged to the device."""

    def __init__(self, device: Device, shape: tuple[int, ...], dtype: str,
                 data: np.ndarray | None = None):
        self._describe(device, shape, dtype)
        device.allocate(self.nbytes, f"a {dtype}{list(self.shape)} buffer")
        try:
            if data is None:
                data = host_zeros(math.prod(self.shape), dtype)
            self.data: np.ndarray | None = data if data.ndim == 1 else data.reshape(-1)
        except BaseException:            # host MemoryError, Ctrl-C: charge nothing
            device.free(self.nbytes)
            raise

    def _describe(self, device: Device, shape, dtype: str) -> None:
        self.device = device
        self.shape, self.nbytes = _shape_facts(shape, dtype)
        self.dtype = dtype
        self.external_refs = 0
        self.error: BaseException | None = None
        self.unset: str | None = None    # why a timing-only output has no values
        self.charged = True              # its bytes count in the device's HBM

    @classmethod
    def from_host(cls, device: Device, array: np.ndarray) -> "Buffer":
        """A copy of host `array` on `device`; the host copy is read-only, and shared
        with the previous transfer's if that went to another device with the same bits
        (`HostShare`)."""
        dtype = str(array.dtype)
        _dt.np_dtype(dtype)     # rejects dtypes the hardware lacks
        data = HOST_SHARE.get(device, array)
        if data is None:
            data = np.array(array, copy=True, order="C").reshape(-1)
            data.flags.writeable = False
            HOST_SHARE.put(device, data)
        return cls(device, array.shape, dtype, data)

    @classmethod
    def failed(cls, device: Device, shape, dtype: str, error: BaseException) -> "Buffer":
        """A buffer that never got a value (its execution did not complete): it holds
        and charges nothing, and reading it raises `error`."""
        buf = cls.__new__(cls)
        buf._describe(device, shape, dtype)
        buf.data, buf.error, buf.charged = None, error, False
        return buf

    @classmethod
    def without_values(cls, device: Device, shape, dtype: str, why: str) -> "Buffer":
        """An output of a timing-only call (`jax_trn.timing_only()`): ready at once,
        holding and charging nothing; reading it raises `TimingOnlyValue(why)`, a
        timing-only call takes it as an argument, a call that computes refuses it."""
        buf = cls.__new__(cls)
        buf._describe(device, shape, dtype)
        buf.data, buf.unset, buf.charged = None, why, False
        return buf

    @classmethod
    def reusing(cls, donor: "Buffer", shape, dtype: str) -> "Buffer":
        """An output that will take over `donor`'s HBM (same byte size): it charges
        nothing until `donor.hand_over(it)`; until then deleting it frees nothing."""
        buf = cls.__new__(cls)
        buf._describe(donor.device, shape, dtype)
        if buf.nbytes != donor.nbytes:
            raise ValueError(f"{buf} cannot reuse the {donor.nbytes} bytes of {donor}")
        buf.data = host_zeros(math.prod(buf.shape), dtype)
        buf.charged = False
        return buf

    def hand_over(self, to: "Buffer") -> None:
        """Donation: this buffer is deleted and its HBM becomes `to`'s (no free, no
        allocation: the device's bytes in use stay the same)."""
        to.charged, self.charged = self.charged, False
        self.data, self.error = None, None

    @property
    def is_deleted(self) -> bool:
        return self.data is None and self.error is None and self.unset is None

    def delete(self) -> None:
        self.error, self.unset = None, None
        if self.data is not None:
            self.data = None
            if self.charged:
                self.device.free(self.nbytes)
            self.charged = False

    def to_host(self) -> np.ndarray:
        if self.error is not None:
            raise self.error
        if self.unset is not None:
            raise TimingOnlyValue(self.unset)
        if self.data is None:
            raise RuntimeError(f"buffer on {self.device.to_string} was deleted")
        return self.data.reshape(self.shape)

    def copy_to(self, device: Device) -> "Buffer":
        if self.unset is not None:
            return Buffer.without_values(device, self.shape, self.dtype, self.unset)
        return Buffer(device, self.shape, self.dtype, self.to_host().copy())

    def __repr__(self) -> str:
        return f"Buffer({self.dtype}{list(self.shape)} on {self.device.to_string})"


_SHAPE_FACTS: dict[tuple, tuple[tuple[int, ...], int]] = {}


def _shape_facts(shape, dtype: str) -> tuple[tuple[int, ...], int]:
    """(shape as a tuple of ints, byte size) of a buffer: remembered per (shape, dtype),
    since an execution makes one buffer per output, each call the same ones."""
    key = (shape if type(shape) is tuple else tuple(shape), dtype)
    got = _SHAPE_FACTS.get(key)
    if got is None:
        dims = tuple(int(d) for d in shape)
        got = (dims, math.prod(dims) * _dt.itemsize(dtype))
        if len(_SHAPE_FACTS) < 4096:
            _SHAPE_FACTS[key] = got
    return got


class TimingOnlyValue(ValueError):
    """The values of an array a timing-only call produced were read."""


class Allocations:
    """The HBM one execution allocates: its outputs, kept if it succeeds, and its
    temporaries, freed when it ends. If it fails in any way (an exception, a runaway
    loop, KeyboardInterrupt) its outputs are deleted too: a failed call leaves nothing
    charged on any device. Outputs that reuse a donated argument (`reuse`) take its
    HBM only when the call succeeds; a failed call donates nothing."""

    def __init__(self, donate: dict[int, int] | None = None):
        self.outputs: list[Buffer] = []
        self.reserved: list[tuple[Device, int]] = []
        self.donations: list[tuple[Buffer, Buffer]] = []
        self.donate = donate or {}           # the call's donations {parameter: output}

    def output(self, device: Device, shape, dtype: str) -> Buffer:
        buf = Buffer(device, shape, dtype)
        self.outputs.append(buf)
        return buf

    def reuse(self, donor: Buffer, shape, dtype: str) -> Buffer:
        """An output in `donor`'s HBM (see `Buffer.reusing`), donated on success."""
        buf = Buffer.reusing(donor, shape, dtype)
        self.outputs.append(buf)
        self.donations.append((donor, buf))
        return buf

    def reserve(self, device: Device, nbytes: int, what: str) -> None:
        device.allocate(nbytes, what)
        self.reserved.append((device, nbytes))

    def __enter__(self) -> "Allocations":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for device, nbytes in self.reserved:
            device.free(nbytes)
        self.reserved = []
        if exc_type is not None:
            for buf in self.outputs:
                buf.delete()
        else:
            for donor, buf in self.donations:
                donor.hand_over(buf)
        self.donations = []


def host_zeros(size: int, dtype: str) -> np.ndarray:
    """The host memory behind a new buffer (may raise MemoryError)."""
    return np.zeros(size, _dt.np_dtype(dtype))


class HostShare:
    """Replicated arguments, one host copy (issue 14, point 4). JAX puts a replicated
    array on each device by a host transfer per device, the same bits each time: 132K
    parameters on 1152 NeuronCores were 613 MB of host copies. An argument buffer's
    host data is never written (kernels read parameters through read-only views,
    `dram.bind_dram`; a donated buffer's output gets its own array, `Buffer.reusing`),
    so buffers on different devices may share one read-only array. A transfer with the
    previous one's dtype, shape and bits, to a device that does not hold it yet, gets
    that array: every buffer of one device keeps its own host memory (distinct
    `PJRT_Buffer_UnsafePointer`s on a device, as JAX expects). Only the last array is
    remembered, weakly: a replicated array's transfers come one after the other."""

    def __init__(self):
        self._last: tuple | None = None      # (weakref to the array, its device ids)

    def get(self, device: Device, array: np.ndarray) -> np.ndarray | None:
        last = self._last
        got = last[0]() if last is not None else None
        if (got is None or device.id in last[1] or got.dtype != array.dtype
                or got.shape != (array.size,) or not _same_bits(got, array)):
            return None
        last[1].add(device.id)
        return got

    def put(self, device: Device, data: np.ndarray) -> None:
        self._last = (weakref.ref(data), {device.id})


def _same_bits(flat: np.ndarray, array: np.ndarray) -> bool:
    a = np.ascontiguousarray(array).reshape(-1)
    if flat.dtype.itemsize not in (1, 2, 4, 8):
        return flat.tobytes() == a.tobytes()
    kind = np.dtype(f"u{flat.dtype.itemsize}")
    return bool(np.array_equal(flat.view(kind), a.view(kind)))


HOST_SHARE = HostShare()
