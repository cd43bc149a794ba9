"""Device buffers: arrays held in a device's simulated HBM."""
from __future__ import annotations

import numpy as np

from jax_trn.hw import dtypes as _dt
from .device import Device


class Buffer:
    """An immutable array in one device's HBM. `data` is the flat host copy that the
    simulator's DMA reads and writes; its bytes are charged to the device."""

    def __init__(self, device: Device, shape: tuple[int, ...], dtype: str,
                 data: np.ndarray | None = None):
        self.device = device
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * _dt.itemsize(dtype)
        device.allocate(self.nbytes, f"a {dtype}{list(self.shape)} buffer")
        if data is None:
            data = np.zeros(int(np.prod(self.shape, dtype=np.int64)), _dt.np_dtype(dtype))
        self.data: np.ndarray | None = data.reshape(-1)
        self.external_refs = 0

    @classmethod
    def from_host(cls, device: Device, array: np.ndarray) -> "Buffer":
        dtype = str(array.dtype)
        _dt.np_dtype(dtype)     # rejects dtypes the hardware lacks
        return cls(device, array.shape, dtype, np.array(array, copy=True, order="C"))

    @property
    def is_deleted(self) -> bool:
        return self.data is None

    def delete(self) -> None:
        if self.data is not None:
            self.data = None
            self.device.free(self.nbytes)

    def to_host(self) -> np.ndarray:
        if self.data is None:
            raise RuntimeError(f"buffer on {self.device.to_string} was deleted")
        return self.data.reshape(self.shape)

    def copy_to(self, device: Device) -> "Buffer":
        return Buffer(device, self.shape, self.dtype, self.to_host().copy())

    def __repr__(self) -> str:
        return f"Buffer({self.dtype}{list(self.shape)} on {self.device.to_string})"
