"""Devices, device descriptions and memories: all infallible getters of precomputed data."""
from __future__ import annotations

import ctypes

from ._handles import HANDLES
from ._mem import get_ptr, set_array, set_ptr
from ._objects import CDevice, CDeviceDescription, CMemory
from ._registry import entry


def _desc(a) -> CDevice:
    return HANDLES.get(get_ptr(a, "device_description"), CDeviceDescription).device


def _dev(a) -> CDevice:
    return HANDLES.get(get_ptr(a, "device"), CDevice)


def _mem(a) -> CMemory:
    return HANDLES.get(get_ptr(a, "memory"), CMemory)


@entry("PJRT_DeviceDescription_Id", never_fails=True)
def description_id(a):
    a.id = _desc(a).rt.id


@entry("PJRT_DeviceDescription_ProcessIndex", never_fails=True)
def description_process_index(a):
    a.process_index = _desc(a).rt.process_index


@entry("PJRT_DeviceDescription_Attributes", never_fails=True)
def description_attributes(a):
    set_array(a, "attributes", "num_attributes", _desc(a).attributes)


@entry("PJRT_DeviceDescription_Kind", never_fails=True)
def description_kind(a):
    set_array(a, "device_kind", "device_kind_size", _desc(a).kind)


@entry("PJRT_DeviceDescription_DebugString", never_fails=True)
def description_debug_string(a):
    set_array(a, "debug_string", "debug_string_size", _desc(a).debug_string)


@entry("PJRT_DeviceDescription_ToString", never_fails=True)
def description_to_string(a):
    set_array(a, "to_string", "to_string_size", _desc(a).to_string)


@entry("PJRT_Device_GetDescription", never_fails=True)
def device_get_description(a):
    set_ptr(a, "device_description", _dev(a).description)


@entry("PJRT_Device_IsAddressable", never_fails=True)
def device_is_addressable(a):
    a.is_addressable = _dev(a).rt.addressable


@entry("PJRT_Device_LocalHardwareId", never_fails=True)
def device_local_hardware_id(a):
    a.local_hardware_id = _dev(a).rt.id


@entry("PJRT_Device_AddressableMemories", never_fails=True)
def device_addressable_memories(a):
    set_array(a, "memories", "num_memories", _dev(a).memories)


@entry("PJRT_Device_DefaultMemory", never_fails=True)
def device_default_memory(a):
    set_ptr(a, "memory", _dev(a).memory.handle)


@entry("PJRT_Device_MemoryStats")
def device_memory_stats(a):
    stats = _dev(a).rt.memory_stats()
    a.bytes_in_use = stats["bytes_in_use"]
    for name, _ in type(a)._fields_:
        if name.endswith("_is_set"):
            setattr(a, name, False)
    for key in ("peak_bytes_in_use", "num_allocs", "largest_alloc_size", "bytes_limit"):
        setattr(a, key, stats[key])
        setattr(a, key + "_is_set", True)


@entry("PJRT_Device_ClearMemoryStats")
def device_clear_memory_stats(a):
    d = _dev(a).rt
    d.peak_bytes_in_use = d.bytes_in_use


@entry("PJRT_Memory_Id", never_fails=True)
def memory_id(a):
    a.id = _mem(a).rt.id


@entry("PJRT_Memory_Kind", never_fails=True)
def memory_kind(a):
    set_array(a, "kind", "kind_size", _mem(a).kind)


@entry("PJRT_Memory_Kind_Id", never_fails=True)
def memory_kind_id(a):
    a.kind_id = _mem(a).rt.kind_id


@entry("PJRT_Memory_DebugString", never_fails=True)
def memory_debug_string(a):
    set_array(a, "debug_string", "debug_string_size", _mem(a).debug_string)


@entry("PJRT_Memory_ToString", never_fails=True)
def memory_to_string(a):
    set_array(a, "to_string", "to_string_size", _mem(a).to_string)


@entry("PJRT_Memory_AddressableByDevices", never_fails=True)
def memory_addressable_by_devices(a):
    set_array(a, "devices", "num_devices", _mem(a).devices)


_NO_OP_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda p: None)


@entry("PJRT_Device_GetAttributes", never_fails=True)
def device_get_attributes(a):
    d = _dev(a)
    set_array(a, "attributes", "num_attributes", d.attributes)
    set_ptr(a, "device_attributes", 0)
    set_ptr(a, "attributes_deleter", ctypes.cast(_NO_OP_DELETER, ctypes.c_void_p).value)
