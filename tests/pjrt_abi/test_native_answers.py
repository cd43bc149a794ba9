"""Calls answered in C (pjrt_plugin/_native/_answers.c): each gives the answer the
Python function gives, and what C cannot answer (a NULL, destroyed or foreign handle,
a short *_Args) still reaches Python and fails as before. No JAX backend runs here:
the handles are made from stand-ins of the runtime objects."""
from __future__ import annotations

import ctypes
from types import SimpleNamespace

import pytest

from pjrt_plugin import _api, _c_api as C, _errors, _native, _objects
from pjrt_plugin._entries_core import new_event
from pjrt_plugin._handles import HANDLES, Handles
from pjrt_plugin._registry import ENTRIES

guard = pytest.importorskip("pjrt_plugin._native._guard")
API = __import__("pjrt_plugin").get_api()
_ENTRY = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)


def _fill(name: str, **fields) -> ctypes.Structure:
    args = getattr(C, name + "_Args")(**fields)
    args.struct_size = C.struct_size(type(args))
    return args


def table_call(name: str, args: ctypes.Structure) -> int | None:
    """Calls entry point `name` through the API table JAX uses (C first, then Python)."""
    offset = getattr(C.PJRT_Api, name).offset
    address = ctypes.c_void_p.from_address(ctypes.addressof(API) + offset).value
    return _ENTRY(address)(ctypes.addressof(args))


def python_call(name: str, args: ctypes.Structure) -> int | None:
    """Calls the Python function of entry point `name`, as the trampoline does."""
    fn, never_fails = ENTRIES[name]
    return _api._call(name, fn, never_fails)(ctypes.addressof(args))


def read_error(error: int | None) -> tuple[int, str] | None:
    """(code, message) of a PJRT_Error, which is destroyed; None for no error."""
    if not error:
        return None
    message = _fill("PJRT_Error_Message", error=error)
    table_call("PJRT_Error_Message", message)
    code = _fill("PJRT_Error_GetCode", error=error)
    table_call("PJRT_Error_GetCode", code)
    table_call("PJRT_Error_Destroy", _fill("PJRT_Error_Destroy", error=error))
    return code.code, ctypes.string_at(message.message, message.message_size).decode()


def test_every_fast_path_names_an_entry_point_with_a_python_function():
    assert set(guard.fast_paths()) <= set(ENTRIES)
    assert not set(guard.fast_paths()) & set(guard.entry_points())


@pytest.mark.parametrize("name, fields", [
    ("PJRT_Event_Destroy", ("event",)), ("PJRT_Event_Error", ("event",)),
    ("PJRT_Event_Await", ("event",)), ("PJRT_Event_Create", ("event",)),
    ("PJRT_Event_IsReady", ("event", "is_ready")),
    ("PJRT_Event_OnReady", ("event", "callback", "user_arg")),
    ("PJRT_Event_Set", ("event", "error_code", "error_message", "error_message_size")),
    ("PJRT_Executable_NumReplicas", ("executable", "num_replicas")),
    ("PJRT_Executable_NumPartitions", ("executable", "num_partitions")),
    ("PJRT_Executable_NumOutputs", ("executable", "num_outputs")),
    ("PJRT_Memory_Kind", ("memory", "kind", "kind_size")),
    ("PJRT_Buffer_ReadyEvent", ("buffer", "event")),
])
def test_fast_path_layouts_are_what_the_c_code_assumes(name, fields):
    cls = getattr(C, name + "_Args")
    assert [getattr(cls, f).offset for f in fields] == [16, 24, 32, 40][:len(fields)]
    assert name in guard.fast_paths()


# --- events ----------------------------------------------------------------------------

def _is_ready(event: int) -> tuple[bool, tuple | None]:
    args = _fill("PJRT_Event_IsReady", event=event)
    error = read_error(table_call("PJRT_Event_IsReady", args))
    return args.is_ready, error


def _on_ready(event: int) -> tuple[list, tuple | None]:
    seen = []
    callback = C.PJRT_Event_OnReadyCallback(
        lambda error, user: seen.append((read_error(error), user)))
    args = _fill("PJRT_Event_OnReady", event=event, callback=callback, user_arg=1234)
    error = read_error(table_call("PJRT_Event_OnReady", args))
    return seen, error


def _destroy(event: int) -> None:
    assert table_call("PJRT_Event_Destroy", _fill("PJRT_Event_Destroy", event=event)) is None


def test_a_ready_event_answers_in_c_as_the_python_event_did():
    event = new_event()
    assert ctypes.c_void_p.from_address(event + 8).value == _native.TAGS["event"]
    assert _is_ready(event) == (True, None)
    assert read_error(table_call("PJRT_Event_Error", _fill("PJRT_Event_Error", event=event))) is None
    assert read_error(table_call("PJRT_Event_Await", _fill("PJRT_Event_Await", event=event))) is None
    assert _on_ready(event) == ([(None, 1234)], None)
    _destroy(event)


def test_a_failed_event_gives_a_new_copy_of_its_error_each_time():
    exc = _errors.PjrtError(_errors.Code.CANCELLED, "the call was interrupted")
    event = new_event(exc)
    expected = (int(_errors.code_for(exc)), _errors.message_for(exc))
    for name in ("PJRT_Event_Error", "PJRT_Event_Await", "PJRT_Event_Error"):
        assert read_error(table_call(name, _fill(name, event=event))) == expected
    assert _on_ready(event) == ([(expected, 1234)], None)
    _destroy(event)


def test_an_internal_error_event_carries_the_message_python_makes():
    try:
        raise RuntimeError("boom")
    except RuntimeError as exc:
        error = exc
    event = new_event(error)
    code, message = read_error(table_call("PJRT_Event_Error",
                                          _fill("PJRT_Event_Error", event=event)))
    assert code == _errors.Code.INTERNAL and message == _errors.message_for(error)
    assert "internal error in jax-trn: RuntimeError: boom" in message
    _destroy(event)


def test_create_and_set_make_and_fail_a_c_event():
    args = _fill("PJRT_Event_Create")
    assert table_call("PJRT_Event_Create", args) is None
    event = args.event
    assert ctypes.c_void_p.from_address(event + 8).value == _native.TAGS["event"]
    assert table_call("PJRT_Event_Set", _fill("PJRT_Event_Set", event=event)) is None
    assert _is_ready(event) == (True, None)
    text = "host transfer failed: ünï".encode()
    message = ctypes.create_string_buffer(text)
    set_args = _fill("PJRT_Event_Set", event=event, error_code=9,
                     error_message=ctypes.addressof(message), error_message_size=len(text))
    assert table_call("PJRT_Event_Set", set_args) is None
    assert read_error(table_call("PJRT_Event_Error", _fill("PJRT_Event_Error", event=event))) \
        == (9, text.decode())
    _destroy(event)


def test_calls_on_a_destroyed_or_null_event_still_return_errors():
    event = new_event()
    _destroy(event)
    for handle in (event, 0):
        for name in ("PJRT_Event_Error", "PJRT_Event_Await"):
            code, message = read_error(table_call(name, _fill(name, event=handle)))
            assert code == _errors.Code.NOT_FOUND and "invalid or freed handle" in message
        assert _is_ready(handle)[1][0] == _errors.Code.NOT_FOUND
        seen, error = _on_ready(handle)
        assert seen == [] and error[0] == _errors.Code.NOT_FOUND
    # destroying twice is harmless (Python: nothing to free)
    assert table_call("PJRT_Event_Destroy", _fill("PJRT_Event_Destroy", event=event)) is None


def test_an_invalid_set_is_refused_and_changes_nothing():
    event = new_event()
    args = _fill("PJRT_Event_Set", event=event, error_code=99)
    assert read_error(table_call("PJRT_Event_Set", args))[0] == _errors.Code.INVALID_ARGUMENT
    assert _is_ready(event) == (True, None)
    assert read_error(table_call("PJRT_Event_Error", _fill("PJRT_Event_Error", event=event))) is None
    _destroy(event)


def test_a_short_args_struct_is_refused_by_python_as_before():
    event = new_event()
    args = _fill("PJRT_Event_IsReady", event=event)
    args.struct_size = 24                      # without its out-field
    code, message = read_error(table_call("PJRT_Event_IsReady", args))
    assert code == _errors.Code.INVALID_ARGUMENT and "struct_size 24" in message
    _destroy(event)


# --- executables, memories, buffers --------------------------------------------------

def _executable(replicas=2, partitions=3, outputs=5) -> int:
    exe = _objects.CExecutable.__new__(_objects.CExecutable)
    exe.rt = SimpleNamespace(num_replicas=replicas, num_partitions=partitions,
                             output_types=[None] * outputs)
    return exe.new_handle()


@pytest.mark.parametrize("name, field", [("NumReplicas", "num_replicas"),
                                         ("NumPartitions", "num_partitions"),
                                         ("NumOutputs", "num_outputs")])
def test_executable_counts_in_c_equal_the_python_answers(name, field):
    name = "PJRT_Executable_" + name
    handle = _executable()
    answers = []
    for call in (table_call, python_call):
        args = _fill(name, executable=handle)
        assert call(name, args) is None
        answers.append(getattr(args, field))
    assert answers[0] == answers[1] and answers[0] in (2, 3, 5)
    HANDLES.free(handle)
    for bad in (handle, 0):                     # freed, NULL: Python's error, as before
        code, message = read_error(table_call(name, _fill(name, executable=bad)))
        assert code == _errors.Code.NOT_FOUND and "invalid or freed handle" in message


def test_a_buffer_handle_is_not_taken_for_an_executable():
    block = HANDLES.new(object(), 0, (_native.TAGS["buffer"], 7, 7, 7))
    code, _ = read_error(table_call("PJRT_Executable_NumOutputs",
                                    _fill("PJRT_Executable_NumOutputs", executable=block)))
    assert code == _errors.Code.NOT_FOUND
    HANDLES.free(block)


def test_memory_kind_in_c_equals_the_python_answer():
    memory = _objects.CMemory(SimpleNamespace(kind="device", debug_string="d",
                                              to_string="t"), client=None)
    answers = []
    for call in (table_call, python_call):
        args = _fill("PJRT_Memory_Kind", memory=memory.handle)
        assert call("PJRT_Memory_Kind", args) is None
        answers.append(ctypes.string_at(args.kind, args.kind_size))
    assert answers == [b"device", b"device"]


def _buffer(error: BaseException | None = None) -> int:
    device = SimpleNamespace(buffer_words=(0x1000, 0x2000))     # handles: device, memory
    rt = SimpleNamespace(shape=(2, 3), dtype="float32", device=None, error=error,
                         is_deleted=False)
    buf = _objects.CBuffer(rt, SimpleNamespace(device_of={id(rt.device): device}))
    return buf.new_handle()


@pytest.mark.parametrize("error", [None, _errors.PjrtError(_errors.Code.CANCELLED, "stopped")])
def test_a_buffers_ready_event_carries_its_error_by_either_path(error):
    handle = _buffer(error)
    expected = None if error is None else (1, "stopped")
    for call in (table_call, python_call):
        args = _fill("PJRT_Buffer_ReadyEvent", buffer=handle)
        assert call("PJRT_Buffer_ReadyEvent", args) is None
        assert read_error(table_call("PJRT_Event_Error",
                                     _fill("PJRT_Event_Error", event=args.event))) == expected
        _destroy(args.event)
    HANDLES.free(handle)


def test_a_freed_handle_block_loses_its_tag_and_is_reused_never_returned_to_malloc():
    handles = Handles()
    first = handles.new("a", 0, (_native.TAGS["executable"], 1, 2, 3))
    assert handles.free(first) == "a"
    assert (ctypes.c_void_p * 5).from_address(first)[1] is None
    second = handles.new("b", 0, (_native.TAGS["executable"], 4, 5, 6))
    assert second == first and handles.get(second) == "b"
    assert (ctypes.c_void_p * 5).from_address(second)[2] == 4


# --- Execute reads its args as words ---------------------------------------------------

def test_execute_args_word_indices_are_the_field_offsets():
    from pjrt_plugin import _entries_executable as X
    cls = C.PJRT_LoadedExecutable_Execute_Args
    assert ctypes.sizeof(X._EXECUTE_WORDS) == ctypes.sizeof(cls)
    for index, field in [(X._EXECUTABLE, "executable"), (X._OPTIONS, "options"), (X._ARGUMENT_LISTS, "argument_lists"),
                         (X._NUM_DEVICES, "num_devices"), (X._NUM_ARGS, "num_args"),
                         (X._OUTPUT_LISTS, "output_lists"),
                         (X._COMPLETE_EVENTS, "device_complete_events"),
                         (X._EXECUTE_DEVICE, "execute_device")]:
        assert getattr(cls, field).offset == 8 * index


def test_execute_with_null_argument_lists_is_an_error_not_a_crash():
    loaded = _objects.CLoadedExecutable.__new__(_objects.CLoadedExecutable)
    loaded.deleted = False
    loaded.rt = SimpleNamespace(name="f", aliases={})
    handle = HANDLES.new(loaded)
    args = _fill("PJRT_LoadedExecutable_Execute", executable=handle, num_devices=1, num_args=2)
    code, message = read_error(python_call("PJRT_LoadedExecutable_Execute", args))
    assert code == _errors.Code.INVALID_ARGUMENT and "argument_lists is NULL" in message
    HANDLES.free(handle)


def test_an_extension_built_from_older_sources_is_not_used():
    """An old build reads handle blocks without their tag word: it would answer with
    the wrong words, so the plugin runs without it (and says why)."""
    from tests.conftest import run_python
    done = run_python(
        "import sys, types, warnings\n"
        "old = types.ModuleType('pjrt_plugin._native._guard')\n"
        "old.ABI = 1\n"
        "sys.modules['pjrt_plugin._native._guard'] = old\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    from pjrt_plugin import _native\n"
        "print(_native.has_guard(), any('out of date' in str(w.message) for w in seen))\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]
