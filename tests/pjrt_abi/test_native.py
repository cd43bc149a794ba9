"""The native layer (pjrt_plugin/_native/_guard.c) against the ABI: the struct layouts
its C entry points assume, its PJRT_Errors read through the API table, and the words of
a buffer's handle block that Python writes and C reads. No JAX backend runs here."""
from __future__ import annotations

import ctypes

import pytest

from pjrt_plugin import _c_api as capi
from pjrt_plugin import _native, _objects

guard = pytest.importorskip("pjrt_plugin._native._guard")

HEADER = 16          # struct_size, extension_start: the C code's ARGS_HEADER / BufferArgs

# The C buffer getters write their out-fields right after the buffer handle.
BUFFER_GETTERS = {"ElementType": ("type",), "Dimensions": ("dims", "num_dims"),
                  "UnpaddedDimensions": ("unpadded_dims", "num_dims"),
                  "DynamicDimensionIndices": ("dynamic_dim_indices", "num_dynamic_dims"),
                  "Device": ("device",), "Memory": ("memory",),
                  "IsDeleted": ("is_deleted",), "IsOnCpu": ("is_on_cpu",)}


@pytest.mark.parametrize("name", sorted(BUFFER_GETTERS))
def test_buffer_getter_layouts_are_what_the_c_code_assumes(name):
    cls = getattr(capi, f"PJRT_Buffer_{name}_Args")
    assert cls.buffer.offset == HEADER
    for i, field in enumerate(BUFFER_GETTERS[name]):
        assert getattr(cls, field).offset == HEADER + 8 * (i + 1)
    assert f"PJRT_Buffer_{name}" in guard.entry_points()


def test_block_words_agree_between_python_and_c():
    assert tuple(guard.BUFFER_WORDS.split()) == _objects.BUFFER_WORDS
    assert tuple(guard.EXECUTABLE_WORDS.split()) == _objects.EXECUTABLE_WORDS
    assert tuple(guard.MEMORY_WORDS.split()) == _objects.MEMORY_WORDS


@pytest.mark.parametrize("name", ["Destroy", "Message", "GetCode", "ForEachPayload"])
def test_error_entry_point_layouts_are_what_the_c_code_assumes(name):
    cls = getattr(capi, f"PJRT_Error_{name}_Args")
    assert cls.error.offset == HEADER
    assert f"PJRT_Error_{name}" in guard.entry_points()


def _call(name: str, args: ctypes.Structure) -> None:
    fn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(guard.entry_points()[name])
    args.struct_size = capi.struct_size(type(args))
    assert fn(ctypes.addressof(args)) is None


def test_a_native_error_reads_back_through_the_api_table_and_its_vtable():
    error = _native.new_error(int(capi.PJRT_Error_Code.NOT_FOUND), "no such thing: ünï")
    message = capi.PJRT_Error_Message_Args(error=error)
    _call("PJRT_Error_Message", message)
    text = ctypes.string_at(message.message, message.message_size).decode()
    code = capi.PJRT_Error_GetCode_Args(error=error)
    _call("PJRT_Error_GetCode", code)
    vtable = capi.PJRT_Error.from_address(error).vtable.contents
    assert (text, code.code, vtable.get_code(error)) == ("no such thing: ünï", 5, 5)
    assert (vtable.struct_size, vtable.instance_size) == (56, 8)
    _call("PJRT_Error_Destroy", capi.PJRT_Error_Destroy_Args(error=error))


def test_buffer_getters_answer_from_the_handle_block():
    dims = (ctypes.c_int64 * 2)(3, 4)
    words = {"tag": _native.TAGS["buffer"], "type": 11, "dims": ctypes.addressof(dims),
             "num_dims": 2, "device": 0x1000, "memory": 0x2000, "deleted": 1, "failed": 0}
    block = (ctypes.c_void_p * len(_objects.BUFFER_WORDS))(
        None, *(words[w] for w in _objects.BUFFER_WORDS[1:]))
    handle = ctypes.addressof(block)
    answers = {}
    for name, fields in BUFFER_GETTERS.items():
        args = getattr(capi, f"PJRT_Buffer_{name}_Args")(buffer=handle)
        _call(f"PJRT_Buffer_{name}", args)
        answers[name] = tuple(getattr(args, f) for f in fields)
    assert answers["ElementType"] == (11,)
    assert list(answers["Dimensions"][0][:2]) == [3, 4] and answers["Dimensions"][1] == 2
    assert answers["Device"] == (0x1000,) and answers["Memory"] == (0x2000,)
    assert answers["IsDeleted"] == (True,) and answers["IsOnCpu"] == (False,)
    assert answers["DynamicDimensionIndices"][1] == 0
