"""Executables: static queries (precomputed), execution, and the Shardings extension."""
from __future__ import annotations

import ctypes

from . import _native
from ._errors import Code, PjrtError
from ._handles import HANDLES
from ._mem import get_ptr, read_array, set_array, set_arrays, set_ptr
from ._objects import CBuffer, CDevice, CExecutable, CLoadedExecutable, mark_deleted
from ._registry import entry
from ._entries_core import new_event

_NO_OP_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda p: None)
_NO_OP_ADDRESS = ctypes.cast(_NO_OP_DELETER, ctypes.c_void_p).value


def _exe(a) -> CExecutable:
    return HANDLES.get(get_ptr(a, "executable"), CExecutable)


def _loaded(a) -> CLoadedExecutable:
    return HANDLES.get(get_ptr(a, "executable"), CLoadedExecutable)


@entry("PJRT_Executable_Destroy", never_fails=True)
def executable_destroy(a):
    HANDLES.free(get_ptr(a, "executable"))


@entry("PJRT_Executable_Name")
def executable_name(a):
    set_array(a, "executable_name", "executable_name_size", _exe(a).name)


@entry("PJRT_Executable_NumReplicas")
def executable_num_replicas(a):
    a.num_replicas = _exe(a).rt.num_replicas


@entry("PJRT_Executable_NumPartitions")
def executable_num_partitions(a):
    a.num_partitions = _exe(a).rt.num_partitions


@entry("PJRT_Executable_NumOutputs")
def executable_num_outputs(a):
    a.num_outputs = len(_exe(a).rt.output_types)


@entry("PJRT_Executable_SizeOfGeneratedCodeInBytes")
def executable_code_size(a):
    a.size_in_bytes = _exe(a).rt.code_size_bytes


@entry("PJRT_Executable_GetCostAnalysis")
def executable_cost_analysis(a):
    set_array(a, "properties", "num_properties", _exe(a).cost)


_KINDS = ("memory_kinds", "memory_kind_sizes")
_SHARDINGS = ("shardings", "sharding_sizes")


@entry("PJRT_Executable_OutputMemoryKinds")
def executable_output_memory_kinds(a):
    set_arrays(a, _KINDS, "num_outputs", _exe(a).memory_kinds)


@entry("PJRT_Executable_ParameterMemoryKinds")
def executable_parameter_memory_kinds(a):
    set_arrays(a, _KINDS, "num_parameters", _exe(a).param_memory_kinds)


@entry("PJRT_Executable_OptimizedProgram")
def executable_optimized_program(a):
    from . import _c_api as C
    e = _exe(a)
    program = C.PJRT_Program.from_address(get_ptr(a, "program"))
    text = e.optimized_mlir
    set_ptr(program, "format", e.mlir_format[0])
    program.format_size = e.mlir_format[1]
    if get_ptr(program, "code"):
        if program.code_size < len(text):
            raise PjrtError(Code.INVALID_ARGUMENT, "OptimizedProgram: code buffer too small")
        ctypes.memmove(get_ptr(program, "code"), text, len(text))
    program.code_size = len(text)


@entry("PJRT_Executable_OutputElementTypes")
def executable_output_element_types(a):
    set_array(a, "output_types", "num_output_types", _exe(a).output_types)


@entry("PJRT_Executable_OutputDimensions")
def executable_output_dimensions(a):
    set_arrays(a, ("dims", "dim_sizes"), "num_outputs", _exe(a).output_dims)


@entry("PJRT_Executable_Fingerprint")
def executable_fingerprint(a):
    set_array(a, "executable_fingerprint", "executable_fingerprint_size", _exe(a).fingerprint)


@entry("PJRT_Executable_GetCompiledMemoryStats")
def executable_compiled_memory_stats(a):
    stats = _exe(a).rt.memory_stats()
    for name, ctype in type(a)._fields_:
        if ctype is ctypes.c_int64:          # every statistic we do not report is 0
            setattr(a, name, stats.get(name, 0))


@entry("PJRT_Executable_GetCompileOptions")
def executable_compile_options(a):
    set_array(a, "serialized_bytes", "serialized_bytes_size", _exe(a).compile_options)
    set_ptr(a, "serialized_compile_options", 0)
    set_ptr(a, "serialized_compile_options_deleter", _NO_OP_ADDRESS)


@entry("PJRT_Executable_Serialize")
def executable_serialize(a):
    """The program as bytes PJRT_Executable_DeserializeAndLoad reads (JAX's AOT
    serialization and its persistent cache, where it engages)."""
    exe = _exe(a)
    if exe.serialized is None:
        exe.serialized = exe.keep.bytes(exe.client.rt.serialize(exe.rt))
    set_array(a, "serialized_bytes", "serialized_bytes_size", exe.serialized)
    set_ptr(a, "serialized_executable", 0)
    set_ptr(a, "serialized_executable_deleter", _NO_OP_ADDRESS)


@entry("PJRT_LoadedExecutable_Destroy", never_fails=True)
def loaded_destroy(a):
    le = HANDLES.free(get_ptr(a, "executable"))
    if le is not None:
        le.rt.release()


@entry("PJRT_LoadedExecutable_GetExecutable", never_fails=True)
def loaded_get_executable(a):
    le = HANDLES.get(get_ptr(a, "loaded_executable"), CLoadedExecutable)
    set_ptr(a, "executable", le.executable.new_handle())


@entry("PJRT_LoadedExecutable_AddressableDevices", never_fails=True)
def loaded_addressable_devices(a):
    set_array(a, "addressable_devices", "num_addressable_devices", _loaded(a).devices)


@entry("PJRT_LoadedExecutable_AddressableDeviceLogicalIds")
def loaded_logical_ids(a):
    set_array(a, "addressable_device_logical_ids", "num_addressable_device_logical_ids", _loaded(a).logical_ids)


@entry("PJRT_LoadedExecutable_Delete")
def loaded_delete(a):
    le = _loaded(a)
    le.deleted = True
    le.rt.release()


@entry("PJRT_LoadedExecutable_IsDeleted")
def loaded_is_deleted(a):
    a.is_deleted = _loaded(a).deleted


@entry("PJRT_LoadedExecutable_Fingerprint")
def loaded_fingerprint(a):
    set_array(a, "executable_fingerprint", "executable_fingerprint_size", _loaded(a).fingerprint)


@entry("PJRT_LoadedExecutable_GetDeviceAssignment", never_fails=True)
def loaded_device_assignment(a):
    set_array(a, "serialized_bytes", "serialized_bytes_size", _loaded(a).device_assignment)
    set_ptr(a, "serialized_device_assignment", 0)
    set_ptr(a, "serialized_device_assignment_deleter", _NO_OP_ADDRESS)


# PJRT_LoadedExecutable_Execute_Args read as words in one go (offsets / 8 of its fields,
# checked by tests/pjrt_abi): a ctypes field read per field costs a microsecond each.
_EXECUTE_WORDS = ctypes.c_void_p * 10
_EXECUTABLE, _OPTIONS, _ARGUMENT_LISTS, _NUM_DEVICES, _NUM_ARGS = 2, 3, 4, 5, 6
_OUTPUT_LISTS, _COMPLETE_EVENTS, _EXECUTE_DEVICE = 7, 8, 9
_ARRAYS: dict[int, type] = {}          # n -> ctypes.c_void_p * n (made once each)


def _array(n: int) -> type:
    got = _ARRAYS.get(n)
    if got is None:
        got = _ARRAYS[n] = ctypes.c_void_p * n
    return got


def _words(address: int | None, n: int, what: str) -> list:
    """`n` pointer-size words at `address` (ints or None)."""
    if not n:
        return []
    if not address:
        raise PjrtError(Code.INVALID_ARGUMENT, f"Execute: {what} is NULL")
    return _array(n).from_address(address)[:]


@entry("PJRT_LoadedExecutable_Execute")
def loaded_execute(a):
    w = _EXECUTE_WORDS.from_address(ctypes.addressof(a))[:]
    le = HANDLES.get(w[_EXECUTABLE] or 0, CLoadedExecutable)
    if le.deleted:
        raise PjrtError(Code.FAILED_PRECONDITION, f"executable {le.rt.name} was deleted")
    n_dev, n_args = w[_NUM_DEVICES] or 0, w[_NUM_ARGS] or 0
    handles = [_words(row, n_args, "an argument list")
               for row in _words(w[_ARGUMENT_LISTS], n_dev, "argument_lists")]
    get = HANDLES.get
    args = [[get(p or 0, CBuffer).rt for p in row] for row in handles]
    device = get(w[_EXECUTE_DEVICE], CDevice).rt if w[_EXECUTE_DEVICE] else None
    donates = bool(le.rt.aliases)      # without aliases no argument can be donated
    error = None
    try:
        results = le.rt.execute(args, device=device,
                                keep=_non_donatable(w[_OPTIONS]) if donates else frozenset())
    except Exception:
        raise
    except BaseException as exc:      # KeyboardInterrupt: see _interrupted
        results, error = _interrupted(le, exc, device)
    if donates:
        _mark_donated(handles)
    try:
        _hand_over(w, le, results, n_dev, error)
    except BaseException:
        for outs in results:
            for buf in outs:
                buf.delete()
        raise


def _non_donatable(address: int | None) -> frozenset[int]:
    """The parameters the caller forbids donating (PJRT_ExecuteOptions at `address`;
    every other aliased parameter is donated, as PJRT specifies)."""
    from . import _c_api as C
    if not address:
        return frozenset()
    options = C.PJRT_ExecuteOptions.from_address(address)
    if options.struct_size < C.PJRT_ExecuteOptions.num_non_donatable_input_indices.offset + 8:
        return frozenset()
    return frozenset(read_array(get_ptr(options, "non_donatable_input_indices"),
                                ctypes.c_int64, options.num_non_donatable_input_indices))


def _mark_donated(handles: list[list[int]]) -> None:
    """Arguments the call donated (their runtime buffer is now deleted): their handles
    answer PJRT_Buffer_IsDeleted with true (JAX then raises "Array has been deleted")."""
    for row in handles:
        for p in row:
            if p and HANDLES.get(p, CBuffer).rt.is_deleted:
                mark_deleted(p)


def _interrupted(le: CLoadedExecutable, exc: BaseException, device):
    """An execution stopped by an interrupt (Ctrl-C) succeeds, with outputs that fail
    with CANCELLED when read, and the interrupt is raised again as soon as control is
    back in Python: at the call itself. Failing the call instead would surface as
    JaxRuntimeError where JAX's C++ dispatch returns, before any Python code could
    raise the interrupt."""
    _native.defer(exc)
    error = PjrtError(Code.CANCELLED, f"{le.rt.name} was interrupted ({type(exc).__name__})")
    return le.rt.failed_outputs(error, device), error


def _hand_over(w: list, le: CLoadedExecutable, results, n_dev: int, error) -> None:
    """Writes the output handles (and completion events, failed with `error` if any)
    into the caller's arrays (`w`: the Execute args' words). If this fails, the caller
    deletes the outputs."""
    client = le.client
    handles = [[CBuffer(buf, client).new_handle() for buf in outs] for outs in results]
    out_lists = _words(w[_OUTPUT_LISTS], n_dev, "output_lists") if any(handles) else ()
    for outs, address in zip(handles, out_lists):
        if outs:                      # no results: the caller may pass no array at all
            _array(len(outs)).from_address(address)[:] = outs
    if w[_COMPLETE_EVENTS]:
        _array(n_dev).from_address(w[_COMPLETE_EVENTS])[:] = [
            new_event(error) for _ in range(n_dev)]


# --- Shardings extension ------------------------------------------------------------

@entry("PJRT_Shardings_PJRT_Executable_ParameterShardings")
def parameter_shardings(a):
    set_arrays(a, _SHARDINGS, "num_parameters", _exe(a).param_shardings)


@entry("PJRT_Shardings_PJRT_Executable_OutputShardings")
def output_shardings(a):
    set_arrays(a, _SHARDINGS, "num_outputs", _exe(a).output_shardings)
