"""Buffers: shape queries (infallible), deletion, device-to-host and device copies.

With the native extension the infallible queries are answered in C from the handle
block (`CBuffer.new_handle`); the shims here serve the build without it."""
from __future__ import annotations

import ctypes

import numpy as np

from ._errors import Code, PjrtError
from ._handles import HANDLES
from ._mem import get_ptr, read_array, set_array, set_ptr
from ._objects import CBuffer, CDevice, CMemory, mark_deleted
from ._registry import entry
from ._entries_core import new_event


def _buf(a) -> CBuffer:
    return HANDLES.get(get_ptr(a, "buffer"), CBuffer)


@entry("PJRT_Buffer_Destroy", never_fails=True)
def buffer_destroy(a):
    b = HANDLES.free(a.buffer or 0)           # (a c_void_p field: an int or None)
    if b is not None:
        b.rt.delete()


@entry("PJRT_Buffer_ElementType", never_fails=True)
def buffer_element_type(a):
    a.type = _buf(a).element_type


@entry("PJRT_Buffer_Dimensions", never_fails=True)
def buffer_dimensions(a):
    set_array(a, "dims", "num_dims", _buf(a).dims)


@entry("PJRT_Buffer_UnpaddedDimensions")
def buffer_unpadded_dimensions(a):
    set_array(a, "unpadded_dims", "num_dims", _buf(a).dims)


@entry("PJRT_Buffer_DynamicDimensionIndices")
def buffer_dynamic_dimension_indices(a):
    set_ptr(a, "dynamic_dim_indices", 0)
    a.num_dynamic_dims = 0


@entry("PJRT_Buffer_GetMemoryLayout")
def buffer_get_memory_layout(a):
    b = _buf(a)
    layout = a.layout
    layout.struct_size = _c_api().struct_size(_c_api().PJRT_Buffer_MemoryLayout)
    layout.type = 0                                  # Tiled
    tiled = layout.tiled
    tiled.struct_size = _c_api().struct_size(_c_api().PJRT_Buffer_MemoryLayout_Tiled)
    set_array(tiled, "minor_to_major", "minor_to_major_size", b.minor_to_major)
    set_ptr(tiled, "tile_dims", 0)
    set_ptr(tiled, "tile_dim_sizes", 0)
    tiled.num_tiles = 0


def _c_api():
    from . import _c_api
    return _c_api


@entry("PJRT_Buffer_OnDeviceSizeInBytes")
def buffer_on_device_size(a):
    a.on_device_size_in_bytes = _buf(a).rt.nbytes


@entry("PJRT_Buffer_Device", never_fails=True)
def buffer_device(a):
    set_ptr(a, "device", _buf(a).device.handle)


@entry("PJRT_Buffer_Memory", never_fails=True)
def buffer_memory(a):
    set_ptr(a, "memory", _buf(a).device.memory.handle)


@entry("PJRT_Buffer_Delete")
def buffer_delete(a):
    _buf(a).rt.delete()
    mark_deleted(get_ptr(a, "buffer"))


@entry("PJRT_Buffer_IsDeleted", never_fails=True)
def buffer_is_deleted(a):
    a.is_deleted = _buf(a).rt.is_deleted


@entry("PJRT_Buffer_IsOnCpu", never_fails=True)
def buffer_is_on_cpu(a):
    a.is_on_cpu = False


@entry("PJRT_Buffer_UnsafePointer")
def buffer_unsafe_pointer(a):
    """The address of the buffer's bytes: the host array that stands for its simulated
    HBM. Stable for the buffer's life, distinct between live buffers of one device;
    JAX compares them (`Array.unsafe_buffer_pointer`, e.g. to see that a no-op convert
    copied nothing). Buffers on different devices may share one read-only host array
    (a replicated argument or result: `buffer.HostShare`, `spmd_batch.adopt`), so
    their pointers may be equal. Nothing may be read or written through it: the
    simulator owns it."""
    b = _buf(a)
    if b.rt.data is None:
        raise PjrtError(Code.FAILED_PRECONDITION,
                        "UnsafePointer: the buffer is deleted or has no value")
    a.buffer_pointer = b.rt.data.ctypes.data


@entry("PJRT_Buffer_ReadyEvent")
def buffer_ready_event(a):
    set_ptr(a, "event", new_event(_buf(a).rt.error))


@entry("PJRT_Buffer_ToHostBuffer")
def buffer_to_host_buffer(a):
    b = HANDLES.get(get_ptr(a, "src"), CBuffer)
    if get_ptr(a, "host_layout"):
        layout = _c_api().PJRT_Buffer_MemoryLayout.from_address(get_ptr(a, "host_layout"))
        _check_row_major(b, layout)
    nbytes = b.rt.nbytes
    if not get_ptr(a, "dst"):
        a.dst_size = nbytes                          # a size query
        return
    if a.dst_size < nbytes:
        raise PjrtError(Code.INVALID_ARGUMENT,
                        f"ToHostBuffer: destination has {a.dst_size} bytes, need {nbytes}")
    data = np.ascontiguousarray(b.rt.to_host())
    ctypes.memmove(get_ptr(a, "dst"), data.ctypes.data, nbytes)
    set_ptr(a, "event", new_event())


def _check_row_major(b: CBuffer, layout) -> None:
    """Only the dense row-major host layout is supported."""
    if layout.type != 0:
        raise PjrtError(Code.UNIMPLEMENTED, "strided host layouts are not supported")
    rank = len(b.rt.shape)
    m2m = read_array(get_ptr(layout.tiled, "minor_to_major"), ctypes.c_int64,
                     layout.tiled.minor_to_major_size)
    if m2m and m2m != list(range(rank - 1, -1, -1)):
        raise PjrtError(Code.UNIMPLEMENTED, f"host layout minor_to_major={m2m} is not supported")


@entry("PJRT_Buffer_CopyToDevice")
def buffer_copy_to_device(a):
    b = _buf(a)
    device = HANDLES.get(get_ptr(a, "dst_device"), CDevice)
    set_ptr(a, "dst_buffer", CBuffer(b.rt.copy_to(device.rt), b.client).new_handle())


@entry("PJRT_Buffer_CopyToMemory")
def buffer_copy_to_memory(a):
    b = _buf(a)
    memory = HANDLES.get(get_ptr(a, "dst_memory"), CMemory)
    set_ptr(a, "dst_buffer", CBuffer(b.rt.copy_to(memory.rt.device), b.client).new_handle())


@entry("PJRT_Buffer_IncreaseExternalReferenceCount")
def buffer_incref(a):
    _buf(a).rt.external_refs += 1


@entry("PJRT_Buffer_DecreaseExternalReferenceCount")
def buffer_decref(a):
    _buf(a).rt.external_refs -= 1
