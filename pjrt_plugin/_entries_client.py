"""Client: creation, devices, memories, compilation and host-to-device transfers."""
from __future__ import annotations

import ctypes

import numpy as np


from . import _dtypes
from ._errors import Code, PjrtError
from ._handles import HANDLES
from ._mem import get_ptr, read_array, read_bytes, set_array, set_ptr
from ._objects import (CBuffer, CClient, CDevice, CLoadedExecutable, CMemory,
                       read_named_values)
from ._registry import entry
from ._entries_core import new_event


def client_of(a) -> CClient:
    return HANDLES.get(get_ptr(a, "client"), CClient)


@entry("PJRT_Client_Create")
def client_create(a):
    from jax_trn.runtime.client import create_client
    from ._kvstore import CallbackKVStore
    options = read_named_values(get_ptr(a, "create_options"), a.num_options)
    kv = CallbackKVStore.from_create_args(a)
    set_ptr(a, "client", CClient(create_client(options, kv)).handle)


@entry("PJRT_Client_Destroy", never_fails=True)
def client_destroy(a):
    HANDLES.free(get_ptr(a, "client"))


@entry("PJRT_Client_PlatformName", never_fails=True)
def client_platform_name(a):
    set_array(a, "platform_name", "platform_name_size", client_of(a).platform_name)


@entry("PJRT_Client_ProcessIndex", never_fails=True)
def client_process_index(a):
    a.process_index = client_of(a).rt.process_index


@entry("PJRT_Client_PlatformVersion", never_fails=True)
def client_platform_version(a):
    set_array(a, "platform_version", "platform_version_size", client_of(a).platform_version)


@entry("PJRT_Client_Devices", never_fails=True)
def client_devices(a):
    set_array(a, "devices", "num_devices", client_of(a).device_array)


@entry("PJRT_Client_AddressableDevices", never_fails=True)
def client_addressable_devices(a):
    set_array(a, "addressable_devices", "num_addressable_devices",
              client_of(a).local_device_array)


@entry("PJRT_Client_LookupDevice")
def client_lookup_device(a):
    c = client_of(a)
    set_ptr(a, "device", c.cdevice(c.rt.device(a.id)).handle)


@entry("PJRT_Client_LookupAddressableDevice")
def client_lookup_addressable_device(a):
    c = client_of(a)
    set_ptr(a, "addressable_device", c.cdevice(c.rt.local_device(a.local_hardware_id)).handle)


@entry("PJRT_Client_UpdateGlobalProcessInfo", never_fails=True)
def client_update_global_process_info(a):
    """The coordination service's view of the run's processes (JAX calls this from a
    thread of its own as it changes, also while the interpreter shuts down, and aborts
    the process on an error: infallible). Nothing uses it yet: a dead peer shows as a
    key-value get that times out (`jax_trn.runtime.kvstore`)."""


@entry("PJRT_Client_AddressableMemories", never_fails=True)
def client_addressable_memories(a):
    set_array(a, "addressable_memories", "num_addressable_memories", client_of(a).memory_array)


@entry("PJRT_Client_Compile")
def client_compile(a):
    c = client_of(a)
    from . import _c_api as C
    program = C.PJRT_Program.from_address(get_ptr(a, "program"))
    code = read_bytes(get_ptr(program, "code"), program.code_size)
    fmt = read_bytes(get_ptr(program, "format"), program.format_size).decode()
    options = read_bytes(get_ptr(a, "compile_options"), a.compile_options_size)
    _hand_over_loaded(a, "executable", c, c.rt.compile(code, fmt, options))


@entry("PJRT_Executable_DeserializeAndLoad")
def executable_deserialize_and_load(a):
    """What PJRT_Executable_Serialize wrote (jax_trn.runtime.compile_cache's format),
    loaded on this client; JAX may override the compile options (device assignment)."""
    c = client_of(a)
    data = read_bytes(get_ptr(a, "serialized_executable"), a.serialized_executable_size)
    options = None
    if get_ptr(a, "overridden_serialized_compile_options"):
        options = read_bytes(get_ptr(a, "overridden_serialized_compile_options"),
                             a.overridden_serialized_compile_options_size) or None
    _hand_over_loaded(a, "loaded_executable", c, c.rt.deserialize(data, options))


def _hand_over_loaded(a, field: str, c: CClient, executable) -> None:
    try:
        loaded = CLoadedExecutable(executable, c)
    except BaseException:
        executable.release()             # its constants' HBM
        raise
    set_ptr(a, field, HANDLES.new(loaded))


@entry("PJRT_Client_DefaultDeviceAssignment")
def client_default_device_assignment(a):
    ids = client_of(a).rt.default_device_assignment(a.num_replicas, a.num_partitions)
    if len(ids) > a.default_assignment_size:
        raise PjrtError(Code.INVALID_ARGUMENT, "default_assignment array too small")
    out = (ctypes.c_int * len(ids)).from_address(get_ptr(a, "default_assignment"))
    out[:] = ids


def _host_array(a, dtype: str, dims: list[int]) -> np.ndarray:
    """A C-contiguous copy of the caller's host data (any byte strides)."""
    np_dtype = _np_dtype(dtype)
    if int(np.prod(dims, dtype=np.int64)) == 0:
        return np.zeros(dims, np_dtype)
    strides = read_array(get_ptr(a, "byte_strides"), ctypes.c_int64, a.num_byte_strides)
    if not strides:
        strides = list(np.empty(0, np_dtype).reshape([0] + dims[1:]).strides) if dims else []
    # Negative strides (a reversed numpy view): elements lie below the data pointer too.
    low = sum((d - 1) * s for d, s in zip(dims, strides) if s < 0)
    high = np_dtype.itemsize + sum((d - 1) * s for d, s in zip(dims, strides) if s > 0)
    raw = (ctypes.c_uint8 * (high - low)).from_address(get_ptr(a, "data") + low)
    view = np.ndarray(dims, np_dtype, buffer=raw, offset=-low, strides=strides)
    return np.array(view, copy=True, order="C")


def _np_dtype(name: str):
    from jax_trn.hw import dtypes
    return dtypes.np_dtype(name)


@entry("PJRT_Client_BufferFromHostBuffer")
def client_buffer_from_host_buffer(a):
    c = client_of(a)
    dtype = _dtypes.to_name(a.type)
    dims = read_array(get_ptr(a, "dims"), ctypes.c_int64, a.num_dims)
    device = _target_device(c, a)
    array = _dtypes.canonical(_host_array(a, dtype, dims), dtype)
    buffer = c.rt.buffer_from_host(array, device.rt)
    set_ptr(a, "buffer", CBuffer(buffer, c).new_handle())
    set_ptr(a, "done_with_host_buffer", new_event())


def _target_device(c: CClient, a) -> CDevice:
    if get_ptr(a, "device"):
        return HANDLES.get(get_ptr(a, "device"), CDevice)
    if get_ptr(a, "memory"):
        memory = HANDLES.get(get_ptr(a, "memory"), CMemory)
        return c.cdevice(memory.rt.device)
    raise PjrtError(Code.INVALID_ARGUMENT, "BufferFromHostBuffer needs a device or a memory")


@entry("PJRT_Client_TopologyDescription")
def client_topology_description(a):
    raise PjrtError(Code.UNIMPLEMENTED, "trn: topology descriptions are not implemented yet")
