"""ctypes definitions of the PJRT C API, version 0.112.

This module is our own Python transcription of the PJRT plugin ABI that
jaxlib expects (openxla ``xla/pjrt/c/pjrt_c_api.h`` at PJRT_API_MINOR 112),
plus the Shardings (v1) and Layouts (v4) extensions.  It holds no logic: the
plugin implementation builds its PJRT_Api table and reads/writes the
``*_Args`` structs through these classes.

Conventions
-----------
* One ``ctypes.Structure`` per C struct, in header order, with the C field
  names, so ``args.contents.num_devices`` etc. work.  The two anonymous C
  unions are ``_anonymous_`` members named ``_u`` (``nv.int64_value`` and
  ``layout.tiled`` work directly).
* Every pointer to a PJRT object is a plain ``c_void_p`` address: the opaque
  handles (PJRT_Client*, PJRT_Device*, PJRT_Buffer*, PJRT_Event*, ...) and
  also PJRT_Error* and PJRT_Memory*.  Those two have a visible layout (a
  vtable pointer first), described by the ``PJRT_Error`` / ``PJRT_Memory``
  classes; view one with ``PJRT_Error.from_address(addr)``.  Arrays of
  handles (``PJRT_Device* const*``) are ``POINTER(c_void_p)``.
* Every ``char*`` (const or not) is ``c_void_p``: strings travel with an
  explicit ``*_size`` and need not be NUL-terminated (read them with
  ``ctypes.string_at(p, n)``).  Anything we hand out through an out field
  must be kept alive by us for the lifetime the API promises.
* Pointers to the other (transparent) structs are ``POINTER(Struct)``;
  scalar arrays are ``POINTER(c_int64)``, ``POINTER(c_size_t)``, ...
* C enums are ``c_int`` inside structs.  Their values are IntEnum classes
  named after the C enum (members without the common prefix, e.g.
  ``PJRT_Buffer_Type.F32``) and module constants with the full C name
  (``PJRT_Buffer_Type_F32``).
* Each API function has a CFUNCTYPE named after it, taking
  ``POINTER(<name>_Args)`` and returning ``c_void_p`` (a PJRT_Error*, None
  for success) or nothing (PJRT_Error_Destroy, PJRT_Error_Message).
  ``ENTRY_FUNCTYPE`` / ``ARGS_STRUCT`` map names to them; ``PJRT_Api`` has
  one field per name in ``API_ENTRY_POINTS`` (table order).  Unnamed
  function-pointer fields use inline CFUNCTYPEs; get one with
  ``field_type(cls, name)``.
* ``STRUCT_SIZE[name]`` and ``cls.STRUCT_SIZE`` follow the header's
  ``NAME_STRUCT_SIZE``: offset of the last field plus its size (trailing
  padding excluded).  Put it in ``struct_size`` of structs we fill.  For
  structs we receive, fields past the caller's ``struct_size`` do not exist
  (XLA's own plugins reject a ``struct_size`` below theirs).

Keeping in step with the header
-------------------------------
New header versions only append fields to structs and entries to PJRT_Api.
Mirror the change here (same order), bump PJRT_API_MINOR, then regenerate the
C-compiled truth table and run the size test::

    python tests/pjrt_abi/test_pjrt_struct_sizes.py --regen DIR
    python -m pytest tests/pjrt_abi

where DIR holds ``pjrt_c_api.h`` and the two extension headers.  The
``--regen`` step writes and compiles (gcc) a throwaway probe in a temporary
directory and rewrites ``tests/pjrt_abi/pjrt_struct_sizes.json``.
"""

from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    Union,
    c_bool,
    c_float,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_ssize_t,
    c_uint64,
    c_void_p,
    sizeof,
)
from enum import IntEnum

# Entry point name -> its *_Args Structure / its CFUNCTYPE.  Filled by
# _entry_point() as the types are defined; covers the core API and the
# extensions below.
ARGS_STRUCT: dict[str, type] = {}
ENTRY_FUNCTYPE: dict[str, type] = {}


def _entry_point(args_cls, restype=c_void_p):
    name = args_cls.__name__[: -len("_Args")]
    functype = CFUNCTYPE(restype, POINTER(args_cls))
    ARGS_STRUCT[name] = args_cls
    ENTRY_FUNCTYPE[name] = functype
    return functype


def _export_enum(enum_cls, prefix):
    # Also expose each value under its full C enumerator name.
    globals().update({prefix + m.name: m for m in enum_cls})


def _struct_names():
    return [
        k for k, v in globals().items()
        if isinstance(v, type) and issubclass(v, Structure)
        and k.startswith("PJRT_")
    ]


def struct_size(cls) -> int:
    """The header's NAME_STRUCT_SIZE: end offset of the last field."""
    last_name, last_type = cls._fields_[-1][:2]
    return getattr(cls, last_name).offset + sizeof(last_type)


def field_type(cls, name):
    """The ctypes type of field ``name`` of Structure ``cls``."""
    for f in cls._fields_:
        if f[0] == name:
            return f[1]
    raise AttributeError(f"{cls.__name__} has no field {name!r}")


# -------- Extensions ---------------------------------------------------------


class PJRT_Extension_Type(IntEnum):
    Gpu_Custom_Call = 0
    Profiler = 1
    Custom_Partitioner = 2
    Stream = 3
    Layouts = 4
    FFI = 5
    MemoryDescriptions = 6
    Triton = 7
    RawBuffer = 8
    PhaseCompile = 9
    Example = 10
    Unknown = 11
    CrossHostTransfers = 12
    ExecutableMetadata = 13
    Callback = 14
    HostAllocator = 15
    TpuTopology = 16
    TpuExecutable = 17
    Megascale = 18
    Shardings = 19
    AbiVersion = 20
    Collectives = 21
    MultiSlice = 22
    HostMemoryAllocator = 23
    XlaTransform = 24


_export_enum(PJRT_Extension_Type, "PJRT_Extension_Type_")


class PJRT_Extension_Base(Structure):
    pass


PJRT_Extension_Base._fields_ = [
    ("struct_size", c_size_t),
    ("type", c_int),
    ("next", POINTER(PJRT_Extension_Base)),
]


# -------- Version ------------------------------------------------------------

PJRT_API_MAJOR = 0

PJRT_API_MINOR = 112


class PJRT_Api_Version(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("major_version", c_int),  # out
        ("minor_version", c_int),  # out
    ]


# -------- Errors -------------------------------------------------------------


class PJRT_Error_Destroy_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("error", c_void_p),
    ]


PJRT_Error_Destroy = _entry_point(PJRT_Error_Destroy_Args, restype=None)


class PJRT_Error_Message_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("error", c_void_p),
        ("message", c_void_p),  # out
        ("message_size", c_size_t),  # out
    ]


PJRT_Error_Message = _entry_point(PJRT_Error_Message_Args, restype=None)


class PJRT_Error_Code(IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


_export_enum(PJRT_Error_Code, "PJRT_Error_Code_")

PJRT_Error_PayloadVisitor = CFUNCTYPE(
    None,
    c_void_p,
    c_size_t,
    c_void_p,
    c_size_t,
    c_void_p,
)


class PJRT_Error_FunctionTable(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("instance_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("destroy", CFUNCTYPE(None, c_void_p)),
        ("message", CFUNCTYPE(None, c_void_p, POINTER(c_void_p), POINTER(c_size_t))),
        ("get_code", CFUNCTYPE(c_int, c_void_p)),
        ("for_each_payload",
         CFUNCTYPE(None, c_void_p, PJRT_Error_PayloadVisitor, c_void_p)),
    ]


# Since 0.107 a PJRT_Error is a real object, not an opaque handle: its first
# word must point at a PJRT_Error_FunctionTable, because some callers (those
# without the PJRT_Api at hand) call error->vtable->message/get_code/destroy
# directly.  instance_size is the size of this base struct (8).  Our own
# errors must therefore be laid out as PJRT_Error (+ private data after it),
# and the table entries PJRT_Error_Destroy/_Message/_GetCode must agree with
# the vtable.
class PJRT_Error(Structure):
    _fields_ = [
        ("vtable", POINTER(PJRT_Error_FunctionTable)),
    ]


class PJRT_Error_GetCode_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("error", c_void_p),
        ("code", c_int),  # out
    ]


PJRT_Error_GetCode = _entry_point(PJRT_Error_GetCode_Args)


class PJRT_Error_ForEachPayload_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("error", c_void_p),
        ("visitor", PJRT_Error_PayloadVisitor),
        ("user_arg", c_void_p),
    ]


PJRT_Error_ForEachPayload = _entry_point(PJRT_Error_ForEachPayload_Args)

PJRT_CallbackError = CFUNCTYPE(c_void_p, c_int, c_void_p, c_size_t)


# -------- Named Values -------------------------------------------------------


class PJRT_NamedValue_Type(IntEnum):
    kString = 0
    kInt64 = 1
    kInt64List = 2
    kFloat = 3
    kBool = 4


_export_enum(PJRT_NamedValue_Type, "PJRT_NamedValue_")


class _NamedValueUnion(Union):
    _fields_ = [
        ("string_value", c_void_p),
        ("int64_value", c_int64),
        ("int64_array_value", POINTER(c_int64)),
        ("float_value", c_float),
        ("bool_value", c_bool),
    ]


class PJRT_NamedValue(Structure):
    _anonymous_ = ("_u",)
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("name", c_void_p),
        ("name_size", c_size_t),
        ("type", c_int),
        ("_u", _NamedValueUnion),
        ("value_size", c_size_t),
    ]


# -------- Plugin -------------------------------------------------------------


class PJRT_Plugin_Initialize_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
    ]


PJRT_Plugin_Initialize = _entry_point(PJRT_Plugin_Initialize_Args)


class PJRT_Plugin_Attributes_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("attributes", POINTER(PJRT_NamedValue)),  # out
        ("num_attributes", c_size_t),  # out
    ]


PJRT_Plugin_Attributes = _entry_point(PJRT_Plugin_Attributes_Args)


# -------- Events -------------------------------------------------------------


class PJRT_Event_Destroy_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("event", c_void_p),
    ]


PJRT_Event_Destroy = _entry_point(PJRT_Event_Destroy_Args)


class PJRT_Event_IsReady_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("event", c_void_p),
        ("is_ready", c_bool),  # out
    ]


PJRT_Event_IsReady = _entry_point(PJRT_Event_IsReady_Args)


class PJRT_Event_Error_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("event", c_void_p),
    ]


PJRT_Event_Error = _entry_point(PJRT_Event_Error_Args)


class PJRT_Event_Await_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("event", c_void_p),
    ]


PJRT_Event_Await = _entry_point(PJRT_Event_Await_Args)

PJRT_Event_OnReadyCallback = CFUNCTYPE(None, c_void_p, c_void_p)


class PJRT_Event_OnReady_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("event", c_void_p),
        ("callback", PJRT_Event_OnReadyCallback),
        ("user_arg", c_void_p),
    ]


PJRT_Event_OnReady = _entry_point(PJRT_Event_OnReady_Args)


class PJRT_Event_Create_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("event", c_void_p),  # out
    ]


PJRT_Event_Create = _entry_point(PJRT_Event_Create_Args)


class PJRT_Event_Set_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("event", c_void_p),
        ("error_code", c_int),
        ("error_message", c_void_p),
        ("error_message_size", c_size_t),
    ]


PJRT_Event_Set = _entry_point(PJRT_Event_Set_Args)


# -------- Client -------------------------------------------------------------


class PJRT_Memory_FunctionTable(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("instance_struct_size", c_size_t),
        ("get_user_data", CFUNCTYPE(c_void_p, c_void_p, c_void_p)),
        ("set_user_data",
         CFUNCTYPE(None, c_void_p, c_void_p, c_void_p, CFUNCTYPE(None, c_void_p))),
    ]


# Since 0.105 a PJRT_Memory begins with a vtable pointer too.  When a plugin
# reports minor >= 105, jaxlib reads memory->vtable (NULL allowed) and, if
# set_user_data is non-NULL, calls it to attach its own objects.
class PJRT_Memory(Structure):
    _fields_ = [
        ("vtable", POINTER(PJRT_Memory_FunctionTable)),
    ]


PJRT_KeyValueGetCallback_ValueDeleter = CFUNCTYPE(None, c_void_p)


class PJRT_KeyValueGetCallback_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("key", c_void_p),
        ("key_size", c_size_t),
        ("timeout_in_ms", c_int),
        ("callback_error", POINTER(PJRT_CallbackError)),
        ("user_arg", c_void_p),
        ("value", c_void_p),  # out
        ("value_size", c_size_t),  # out
        ("value_deleter_callback", PJRT_KeyValueGetCallback_ValueDeleter),  # out
    ]


PJRT_KeyValueGetCallback = CFUNCTYPE(c_void_p, POINTER(PJRT_KeyValueGetCallback_Args))

PJRT_KeyValueTryGetCallback_ValueDeleter = CFUNCTYPE(None, c_void_p)


class PJRT_KeyValueTryGetCallback_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("key", c_void_p),
        ("key_size", c_size_t),
        ("callback_error", POINTER(PJRT_CallbackError)),
        ("user_arg", c_void_p),
        ("value", c_void_p),  # out
        ("value_size", c_size_t),  # out
        ("value_deleter_callback", PJRT_KeyValueTryGetCallback_ValueDeleter),  # out
    ]


PJRT_KeyValueTryGetCallback = CFUNCTYPE(
    c_void_p,
    POINTER(PJRT_KeyValueTryGetCallback_Args),
)


class PJRT_KeyValuePutCallback_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("key", c_void_p),
        ("key_size", c_size_t),
        ("value", c_void_p),
        ("value_size", c_size_t),
        ("callback_error", POINTER(PJRT_CallbackError)),
        ("user_arg", c_void_p),
    ]


PJRT_KeyValuePutCallback = CFUNCTYPE(c_void_p, POINTER(PJRT_KeyValuePutCallback_Args))


class PJRT_Client_Create_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("create_options", POINTER(PJRT_NamedValue)),
        ("num_options", c_size_t),
        ("kv_get_callback", PJRT_KeyValueGetCallback),
        ("kv_get_user_arg", c_void_p),
        ("kv_put_callback", PJRT_KeyValuePutCallback),
        ("kv_put_user_arg", c_void_p),
        ("client", c_void_p),  # out
        ("kv_try_get_callback", PJRT_KeyValueTryGetCallback),
        ("kv_try_get_user_arg", c_void_p),
    ]


PJRT_Client_Create = _entry_point(PJRT_Client_Create_Args)


class PJRT_Client_Destroy_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
    ]


PJRT_Client_Destroy = _entry_point(PJRT_Client_Destroy_Args)


class PJRT_Client_PlatformName_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("platform_name", c_void_p),  # out
        ("platform_name_size", c_size_t),  # out
    ]


PJRT_Client_PlatformName = _entry_point(PJRT_Client_PlatformName_Args)


class PJRT_Client_ProcessIndex_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("process_index", c_int),  # out
    ]


PJRT_Client_ProcessIndex = _entry_point(PJRT_Client_ProcessIndex_Args)


class PJRT_Client_PlatformVersion_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("platform_version", c_void_p),  # out
        ("platform_version_size", c_size_t),  # out
    ]


PJRT_Client_PlatformVersion = _entry_point(PJRT_Client_PlatformVersion_Args)


class PJRT_Client_TopologyDescription_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("topology", c_void_p),  # out
    ]


PJRT_Client_TopologyDescription = _entry_point(PJRT_Client_TopologyDescription_Args)


class PJRT_Client_Devices_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("devices", POINTER(c_void_p)),  # out
        ("num_devices", c_size_t),  # out
    ]


PJRT_Client_Devices = _entry_point(PJRT_Client_Devices_Args)


class PJRT_Client_AddressableDevices_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("addressable_devices", POINTER(c_void_p)),  # out
        ("num_addressable_devices", c_size_t),  # out
    ]


PJRT_Client_AddressableDevices = _entry_point(PJRT_Client_AddressableDevices_Args)


class PJRT_Client_LookupDevice_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("id", c_int),
        ("device", c_void_p),  # out
    ]


PJRT_Client_LookupDevice = _entry_point(PJRT_Client_LookupDevice_Args)


class PJRT_Client_LookupAddressableDevice_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("local_hardware_id", c_int),
        ("addressable_device", c_void_p),  # out
    ]


PJRT_Client_LookupAddressableDevice = _entry_point(
    PJRT_Client_LookupAddressableDevice_Args)


class PJRT_ProcessState(IntEnum):
    kUnspecified = 0
    kUninitialized = 1
    kDisconnected = 2
    kConnected = 3
    kError = 4


_export_enum(PJRT_ProcessState, "PJRT_ProcessState_")


class PJRT_ProcessInfo(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("task_id", c_int),
        ("incarnation_id", c_uint64),
        ("state", c_int),
        ("error_code", c_int),
        ("error_message", c_void_p),
        ("error_message_size", c_size_t),
    ]


class PJRT_Client_UpdateGlobalProcessInfo_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("process_infos", POINTER(PJRT_ProcessInfo)),
        ("num_process_infos", c_size_t),
    ]


PJRT_Client_UpdateGlobalProcessInfo = _entry_point(
    PJRT_Client_UpdateGlobalProcessInfo_Args)


class PJRT_Client_AddressableMemories_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("addressable_memories", POINTER(c_void_p)),  # out
        ("num_addressable_memories", c_size_t),  # out
    ]


PJRT_Client_AddressableMemories = _entry_point(PJRT_Client_AddressableMemories_Args)


class PJRT_Program(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("code", c_void_p),  # in/out
        ("code_size", c_size_t),
        ("format", c_void_p),
        ("format_size", c_size_t),
    ]


class PJRT_Client_Compile_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("program", POINTER(PJRT_Program)),
        ("compile_options", c_void_p),
        ("compile_options_size", c_size_t),
        ("executable", c_void_p),  # out
    ]


PJRT_Client_Compile = _entry_point(PJRT_Client_Compile_Args)


class PJRT_Client_Load_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("executable", c_void_p),
        ("compile_options", c_void_p),
        ("compile_options_size", c_size_t),
        ("loaded_executable", c_void_p),  # out
    ]


PJRT_Client_Load = _entry_point(PJRT_Client_Load_Args)


class PJRT_Client_DefaultDeviceAssignment_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("num_replicas", c_int),
        ("num_partitions", c_int),
        ("default_assignment_size", c_size_t),
        ("default_assignment", POINTER(c_int)),
    ]


PJRT_Client_DefaultDeviceAssignment = _entry_point(
    PJRT_Client_DefaultDeviceAssignment_Args)


class PJRT_Client_DmaMap_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("data", c_void_p),
        ("size", c_size_t),
    ]


PJRT_Client_DmaMap = _entry_point(PJRT_Client_DmaMap_Args)


class PJRT_Client_DmaUnmap_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("data", c_void_p),
    ]


PJRT_Client_DmaUnmap = _entry_point(PJRT_Client_DmaUnmap_Args)


class PJRT_AsyncHostToDeviceTransferManager_Destroy_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("transfer_manager", c_void_p),
    ]


PJRT_AsyncHostToDeviceTransferManager_Destroy = _entry_point(
    PJRT_AsyncHostToDeviceTransferManager_Destroy_Args)


class PJRT_AsyncHostToDeviceTransferManager_TransferData_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("transfer_manager", c_void_p),
        ("buffer_index", c_int),
        ("data", c_void_p),
        ("offset", c_int64),
        ("transfer_size", c_int64),
        ("is_last_transfer", c_bool),
        ("done_with_h2d_transfer", c_void_p),  # out
    ]


PJRT_AsyncHostToDeviceTransferManager_TransferData = _entry_point(
    PJRT_AsyncHostToDeviceTransferManager_TransferData_Args)


class PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("transfer_manager", c_void_p),
        ("buffer_index", c_int),
        ("buffer_out", c_void_p),  # out
    ]


PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer = _entry_point(
    PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer_Args)


class PJRT_AsyncHostToDeviceTransferManager_Device_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("transfer_manager", c_void_p),
        ("device_out", c_void_p),  # out
    ]


PJRT_AsyncHostToDeviceTransferManager_Device = _entry_point(
    PJRT_AsyncHostToDeviceTransferManager_Device_Args)


class PJRT_AsyncHostToDeviceTransferManager_BufferCount_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("transfer_manager", c_void_p),
        ("buffer_count", c_size_t),  # out
    ]


PJRT_AsyncHostToDeviceTransferManager_BufferCount = _entry_point(
    PJRT_AsyncHostToDeviceTransferManager_BufferCount_Args)


class PJRT_AsyncHostToDeviceTransferManager_BufferSize_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("transfer_manager", c_void_p),
        ("buffer_index", c_int),
        ("buffer_size", c_size_t),  # out
    ]


PJRT_AsyncHostToDeviceTransferManager_BufferSize = _entry_point(
    PJRT_AsyncHostToDeviceTransferManager_BufferSize_Args)


class PJRT_AsyncHostToDeviceTransferManager_SetBufferError_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("transfer_manager", c_void_p),
        ("buffer_index", c_int),
        ("error_code", c_int),
        ("error_message", c_void_p),
        ("error_message_size", c_size_t),
    ]


PJRT_AsyncHostToDeviceTransferManager_SetBufferError = _entry_point(
    PJRT_AsyncHostToDeviceTransferManager_SetBufferError_Args)


class PJRT_AsyncHostToDeviceTransferManager_AddMetadata_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("transfer_manager", c_void_p),
        ("transfer_metadata", POINTER(PJRT_NamedValue)),
        ("num_metadata", c_size_t),
    ]


PJRT_AsyncHostToDeviceTransferManager_AddMetadata = _entry_point(
    PJRT_AsyncHostToDeviceTransferManager_AddMetadata_Args)


class PJRT_Buffer_Type(IntEnum):
    INVALID = 0
    PRED = 1
    S8 = 2
    S16 = 3
    S32 = 4
    S64 = 5
    U8 = 6
    U16 = 7
    U32 = 8
    U64 = 9
    F16 = 10
    F32 = 11
    F64 = 12
    BF16 = 13
    C64 = 14
    C128 = 15
    F8E5M2 = 16
    F8E4M3FN = 17
    F8E4M3B11FNUZ = 18
    F8E5M2FNUZ = 19
    F8E4M3FNUZ = 20
    S4 = 21
    U4 = 22
    TOKEN = 23
    S2 = 24
    U2 = 25
    F8E4M3 = 26
    F8E3M4 = 27
    F8E8M0FNU = 28
    F4E2M1FN = 29
    S1 = 30
    U1 = 31


_export_enum(PJRT_Buffer_Type, "PJRT_Buffer_Type_")


class PJRT_HostBufferSemantics(IntEnum):
    kImmutableOnlyDuringCall = 0
    kImmutableUntilTransferCompletes = 1
    kImmutableZeroCopy = 2
    kMutableZeroCopy = 3


_export_enum(PJRT_HostBufferSemantics, "PJRT_HostBufferSemantics_")


class PJRT_Buffer_MemoryLayout_Type(IntEnum):
    Tiled = 0
    Strides = 1


_export_enum(PJRT_Buffer_MemoryLayout_Type, "PJRT_Buffer_MemoryLayout_Type_")


class PJRT_Buffer_MemoryLayout_Tiled(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("minor_to_major", POINTER(c_int64)),
        ("minor_to_major_size", c_size_t),
        ("tile_dims", POINTER(c_int64)),
        ("tile_dim_sizes", POINTER(c_size_t)),
        ("num_tiles", c_size_t),
    ]


class PJRT_Buffer_MemoryLayout_Strides(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("byte_strides", POINTER(c_int64)),
        ("num_byte_strides", c_size_t),
    ]


class _BufferMemoryLayoutUnion(Union):
    _fields_ = [
        ("tiled", PJRT_Buffer_MemoryLayout_Tiled),
        ("strides", PJRT_Buffer_MemoryLayout_Strides),
    ]


class PJRT_Buffer_MemoryLayout(Structure):
    _anonymous_ = ("_u",)
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("_u", _BufferMemoryLayoutUnion),
        ("type", c_int),
    ]


class PJRT_AsyncHostToDeviceTransferManager_TransferLiteral_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("transfer_manager", c_void_p),
        ("buffer_index", c_int),
        ("data", c_void_p),
        ("shape_dims", POINTER(c_int64)),
        ("shape_num_dims", c_size_t),
        ("shape_element_type", c_int),
        ("shape_layout", POINTER(PJRT_Buffer_MemoryLayout)),
        ("done_with_h2d_transfer", c_void_p),  # out
    ]


PJRT_AsyncHostToDeviceTransferManager_TransferLiteral = _entry_point(
    PJRT_AsyncHostToDeviceTransferManager_TransferLiteral_Args)


class PJRT_Client_CreateUninitializedBuffer_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("shape_dims", POINTER(c_int64)),
        ("shape_num_dims", c_size_t),
        ("shape_element_type", c_int),
        ("shape_layout", POINTER(PJRT_Buffer_MemoryLayout)),
        ("device", c_void_p),
        ("memory", c_void_p),
        ("buffer", c_void_p),  # out
    ]


PJRT_Client_CreateUninitializedBuffer = _entry_point(
    PJRT_Client_CreateUninitializedBuffer_Args)


class PJRT_Client_CreateErrorBuffer_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("error_code", c_int),
        ("error_message", c_void_p),
        ("error_message_size", c_size_t),
        ("shape_dims", POINTER(c_int64)),
        ("shape_num_dims", c_size_t),
        ("shape_element_type", c_int),
        ("shape_layout", POINTER(PJRT_Buffer_MemoryLayout)),
        ("memory", c_void_p),
        ("buffer", c_void_p),  # out
        ("payload", POINTER(PJRT_NamedValue)),
        ("num_payload", c_size_t),
    ]


PJRT_Client_CreateErrorBuffer = _entry_point(PJRT_Client_CreateErrorBuffer_Args)


class PJRT_Client_CreateAliasBuffer_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("memory", c_void_p),
        ("shape_dims", POINTER(c_int64)),
        ("shape_num_dims", c_size_t),
        ("shape_element_type", c_int),
        ("shape_layout", POINTER(PJRT_Buffer_MemoryLayout)),
        ("alias_buffer", c_void_p),  # out
        ("fulfill_alias_buffer_cb", c_void_p),  # out
    ]


PJRT_Client_CreateAliasBuffer = _entry_point(PJRT_Client_CreateAliasBuffer_Args)


class PJRT_Client_FulfillAliasBuffer_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("buffer", c_void_p),
        ("status_code", c_int),
        ("error_message", c_void_p),
        ("error_message_size", c_size_t),
        ("fulfill_alias_buffer_cb", c_void_p),
    ]


PJRT_Client_FulfillAliasBuffer = _entry_point(PJRT_Client_FulfillAliasBuffer_Args)


class PJRT_Client_BufferFromHostBuffer_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("data", c_void_p),
        ("type", c_int),
        ("dims", POINTER(c_int64)),
        ("num_dims", c_size_t),
        ("byte_strides", POINTER(c_int64)),
        ("num_byte_strides", c_size_t),
        ("host_buffer_semantics", c_int),
        ("device", c_void_p),
        ("memory", c_void_p),
        ("device_layout", POINTER(PJRT_Buffer_MemoryLayout)),
        ("done_with_host_buffer", c_void_p),  # out
        ("buffer", c_void_p),  # out
    ]


PJRT_Client_BufferFromHostBuffer = _entry_point(PJRT_Client_BufferFromHostBuffer_Args)


class PJRT_Client_CreateViewOfDeviceBuffer_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("device_buffer_ptr", c_void_p),
        ("dims", POINTER(c_int64)),
        ("num_dims", c_size_t),
        ("element_type", c_int),
        ("layout", POINTER(PJRT_Buffer_MemoryLayout)),
        ("device", c_void_p),
        ("on_delete_callback", CFUNCTYPE(None, c_void_p, c_void_p)),
        ("on_delete_callback_arg", c_void_p),
        ("stream", c_ssize_t),
        ("buffer", c_void_p),  # out
        ("memory", c_void_p),
    ]


PJRT_Client_CreateViewOfDeviceBuffer = _entry_point(
    PJRT_Client_CreateViewOfDeviceBuffer_Args)


class PJRT_ShapeSpec(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("dims", POINTER(c_int64)),
        ("num_dims", c_size_t),
        ("element_type", c_int),
    ]


class PJRT_Client_CreateBuffersForAsyncHostToDevice_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("shape_specs", POINTER(PJRT_ShapeSpec)),
        ("num_shape_specs", c_size_t),
        ("device_layouts", POINTER(POINTER(PJRT_Buffer_MemoryLayout))),
        ("num_device_layouts", c_size_t),
        ("memory", c_void_p),
        ("transfer_manager", c_void_p),  # out
    ]


PJRT_Client_CreateBuffersForAsyncHostToDevice = _entry_point(
    PJRT_Client_CreateBuffersForAsyncHostToDevice_Args)


# -------- Device Descriptions ------------------------------------------------


class PJRT_DeviceDescription_Id_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device_description", c_void_p),
        ("id", c_int),  # out
    ]


PJRT_DeviceDescription_Id = _entry_point(PJRT_DeviceDescription_Id_Args)


class PJRT_DeviceDescription_ProcessIndex_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device_description", c_void_p),
        ("process_index", c_int),  # out
    ]


PJRT_DeviceDescription_ProcessIndex = _entry_point(
    PJRT_DeviceDescription_ProcessIndex_Args)


class PJRT_DeviceDescription_Attributes_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device_description", c_void_p),
        ("num_attributes", c_size_t),  # out
        ("attributes", POINTER(PJRT_NamedValue)),  # out
    ]


PJRT_DeviceDescription_Attributes = _entry_point(PJRT_DeviceDescription_Attributes_Args)


class PJRT_DeviceDescription_Kind_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device_description", c_void_p),
        ("device_kind", c_void_p),  # out
        ("device_kind_size", c_size_t),  # out
    ]


PJRT_DeviceDescription_Kind = _entry_point(PJRT_DeviceDescription_Kind_Args)


class PJRT_DeviceDescription_DebugString_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device_description", c_void_p),
        ("debug_string", c_void_p),  # out
        ("debug_string_size", c_size_t),  # out
    ]


PJRT_DeviceDescription_DebugString = _entry_point(
    PJRT_DeviceDescription_DebugString_Args)


class PJRT_DeviceDescription_ToString_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device_description", c_void_p),
        ("to_string", c_void_p),  # out
        ("to_string_size", c_size_t),  # out
    ]


PJRT_DeviceDescription_ToString = _entry_point(PJRT_DeviceDescription_ToString_Args)


# -------- Devices ------------------------------------------------------------


class PJRT_Device_GetDescription_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device", c_void_p),
        ("device_description", c_void_p),  # out
    ]


PJRT_Device_GetDescription = _entry_point(PJRT_Device_GetDescription_Args)


class PJRT_Device_IsAddressable_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device", c_void_p),
        ("is_addressable", c_bool),  # out
    ]


PJRT_Device_IsAddressable = _entry_point(PJRT_Device_IsAddressable_Args)


class PJRT_Device_LocalHardwareId_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device", c_void_p),
        ("local_hardware_id", c_int),  # out
    ]


PJRT_Device_LocalHardwareId = _entry_point(PJRT_Device_LocalHardwareId_Args)


class PJRT_Device_AddressableMemories_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device", c_void_p),
        ("memories", POINTER(c_void_p)),  # out
        ("num_memories", c_size_t),  # out
    ]


PJRT_Device_AddressableMemories = _entry_point(PJRT_Device_AddressableMemories_Args)


class PJRT_Device_DefaultMemory_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device", c_void_p),
        ("memory", c_void_p),  # out
    ]


PJRT_Device_DefaultMemory = _entry_point(PJRT_Device_DefaultMemory_Args)


class PJRT_Device_MemoryStats_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device", c_void_p),
        ("bytes_in_use", c_int64),  # out
        ("peak_bytes_in_use", c_int64),  # out
        ("peak_bytes_in_use_is_set", c_bool),  # out
        ("num_allocs", c_int64),  # out
        ("num_allocs_is_set", c_bool),  # out
        ("largest_alloc_size", c_int64),  # out
        ("largest_alloc_size_is_set", c_bool),  # out
        ("bytes_limit", c_int64),  # out
        ("bytes_limit_is_set", c_bool),  # out
        ("bytes_reserved", c_int64),  # out
        ("bytes_reserved_is_set", c_bool),  # out
        ("peak_bytes_reserved", c_int64),  # out
        ("peak_bytes_reserved_is_set", c_bool),  # out
        ("bytes_reservable_limit", c_int64),  # out
        ("bytes_reservable_limit_is_set", c_bool),  # out
        ("largest_free_block_bytes", c_int64),  # out
        ("largest_free_block_bytes_is_set", c_bool),  # out
        ("pool_bytes", c_int64),  # out
        ("pool_bytes_is_set", c_bool),  # out
        ("peak_pool_bytes", c_int64),  # out
        ("peak_pool_bytes_is_set", c_bool),  # out
    ]


PJRT_Device_MemoryStats = _entry_point(PJRT_Device_MemoryStats_Args)


class PJRT_Device_ClearMemoryStats_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device", c_void_p),
    ]


PJRT_Device_ClearMemoryStats = _entry_point(PJRT_Device_ClearMemoryStats_Args)


class PJRT_Device_PoisonExecution_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device", c_void_p),
        ("launch_id", c_int32),
        ("error_code", c_int),
        ("error_message", c_void_p),
        ("error_message_size", c_size_t),
        ("poisoned", c_bool),  # out
        ("payload", POINTER(PJRT_NamedValue)),
        ("num_payload", c_size_t),
    ]


PJRT_Device_PoisonExecution = _entry_point(PJRT_Device_PoisonExecution_Args)


class PJRT_Device_GetAttributes_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device", c_void_p),
        ("attributes", POINTER(PJRT_NamedValue)),  # out
        ("num_attributes", c_size_t),  # out
        ("device_attributes", c_void_p),  # out
        ("attributes_deleter", CFUNCTYPE(None, c_void_p)),  # out
    ]


PJRT_Device_GetAttributes = _entry_point(PJRT_Device_GetAttributes_Args)


# -------- AsyncTrackingEvent -------------------------------------------------


class PJRT_Device_CreateAsyncTrackingEvent_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("device", c_void_p),
        ("description", c_void_p),
        ("description_size", c_size_t),
        ("event", c_void_p),  # out
    ]


PJRT_Device_CreateAsyncTrackingEvent = _entry_point(
    PJRT_Device_CreateAsyncTrackingEvent_Args)


class PJRT_AsyncTrackingEvent_Destroy_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("event", c_void_p),
    ]


PJRT_AsyncTrackingEvent_Destroy = _entry_point(PJRT_AsyncTrackingEvent_Destroy_Args)


# -------- Memory -------------------------------------------------------------


class PJRT_Memory_Id_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("memory", c_void_p),
        ("id", c_int),  # out
    ]


PJRT_Memory_Id = _entry_point(PJRT_Memory_Id_Args)


class PJRT_Memory_Kind_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("memory", c_void_p),
        ("kind", c_void_p),  # out
        ("kind_size", c_size_t),  # out
    ]


PJRT_Memory_Kind = _entry_point(PJRT_Memory_Kind_Args)


class PJRT_Memory_Kind_Id_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("memory", c_void_p),
        ("kind_id", c_int),  # out
    ]


PJRT_Memory_Kind_Id = _entry_point(PJRT_Memory_Kind_Id_Args)


class PJRT_Memory_DebugString_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("memory", c_void_p),
        ("debug_string", c_void_p),  # out
        ("debug_string_size", c_size_t),  # out
    ]


PJRT_Memory_DebugString = _entry_point(PJRT_Memory_DebugString_Args)


class PJRT_Memory_ToString_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("memory", c_void_p),
        ("to_string", c_void_p),  # out
        ("to_string_size", c_size_t),  # out
    ]


PJRT_Memory_ToString = _entry_point(PJRT_Memory_ToString_Args)


class PJRT_Memory_AddressableByDevices_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("memory", c_void_p),
        ("devices", POINTER(c_void_p)),  # out
        ("num_devices", c_size_t),  # out
    ]


PJRT_Memory_AddressableByDevices = _entry_point(PJRT_Memory_AddressableByDevices_Args)


# -------- Execute Context ----------------------------------------------------


class PJRT_ExecuteContext_Create_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("context", c_void_p),  # out
    ]


PJRT_ExecuteContext_Create = _entry_point(PJRT_ExecuteContext_Create_Args)


class PJRT_ExecuteContext_Destroy_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("context", c_void_p),
    ]


PJRT_ExecuteContext_Destroy = _entry_point(PJRT_ExecuteContext_Destroy_Args)


# -------- Executables --------------------------------------------------------


class PJRT_Executable_Destroy_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
    ]


PJRT_Executable_Destroy = _entry_point(PJRT_Executable_Destroy_Args)


class PJRT_LoadedExecutable_Destroy_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
    ]


PJRT_LoadedExecutable_Destroy = _entry_point(PJRT_LoadedExecutable_Destroy_Args)


class PJRT_LoadedExecutable_GetExecutable_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("loaded_executable", c_void_p),
        ("executable", c_void_p),  # out
    ]


PJRT_LoadedExecutable_GetExecutable = _entry_point(
    PJRT_LoadedExecutable_GetExecutable_Args)


class PJRT_LoadedExecutable_GetDeviceAssignment_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("serialized_bytes", c_void_p),  # out
        ("serialized_bytes_size", c_size_t),  # out
        ("serialized_device_assignment", c_void_p),
        ("serialized_device_assignment_deleter", CFUNCTYPE(None, c_void_p)),  # out
    ]


PJRT_LoadedExecutable_GetDeviceAssignment = _entry_point(
    PJRT_LoadedExecutable_GetDeviceAssignment_Args)


class PJRT_Executable_Name_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("executable_name", c_void_p),  # out
        ("executable_name_size", c_size_t),  # out
    ]


PJRT_Executable_Name = _entry_point(PJRT_Executable_Name_Args)


class PJRT_Executable_NumReplicas_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("num_replicas", c_size_t),  # out
    ]


PJRT_Executable_NumReplicas = _entry_point(PJRT_Executable_NumReplicas_Args)


class PJRT_Executable_NumPartitions_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("num_partitions", c_size_t),  # out
    ]


PJRT_Executable_NumPartitions = _entry_point(PJRT_Executable_NumPartitions_Args)


class PJRT_LogicalDeviceIds(Structure):
    _fields_ = [
        ("replica", c_int),
        ("partition", c_int),
    ]


class PJRT_LoadedExecutable_AddressableDevices_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("addressable_devices", POINTER(c_void_p)),  # out
        ("num_addressable_devices", c_size_t),  # out
    ]


PJRT_LoadedExecutable_AddressableDevices = _entry_point(
    PJRT_LoadedExecutable_AddressableDevices_Args)


class PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("addressable_device_logical_ids", POINTER(PJRT_LogicalDeviceIds)),  # out
        ("num_addressable_device_logical_ids", c_size_t),  # out
    ]


PJRT_LoadedExecutable_AddressableDeviceLogicalIds = _entry_point(
    PJRT_LoadedExecutable_AddressableDeviceLogicalIds_Args)


class PJRT_Executable_OptimizedProgram_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("program", POINTER(PJRT_Program)),  # out
    ]


PJRT_Executable_OptimizedProgram = _entry_point(PJRT_Executable_OptimizedProgram_Args)


class PJRT_LoadedExecutable_Delete_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
    ]


PJRT_LoadedExecutable_Delete = _entry_point(PJRT_LoadedExecutable_Delete_Args)


class PJRT_LoadedExecutable_IsDeleted_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("is_deleted", c_bool),  # out
    ]


PJRT_LoadedExecutable_IsDeleted = _entry_point(PJRT_LoadedExecutable_IsDeleted_Args)


class PJRT_Chunk(Structure):
    _fields_ = [
        ("data", c_void_p),
        ("size", c_size_t),
        ("deleter", CFUNCTYPE(None, c_void_p, c_void_p)),
        ("deleter_arg", c_void_p),
    ]


PJRT_SendCallback = CFUNCTYPE(
    c_void_p,
    POINTER(PJRT_Chunk),
    POINTER(PJRT_CallbackError),
    c_size_t,
    c_bool,
    c_void_p,
)

PJRT_RecvCallback = CFUNCTYPE(None, c_void_p, c_void_p)


class PJRT_SendCallbackInfo(Structure):
    _fields_ = [
        ("channel_id", c_int64),
        ("user_arg", c_void_p),
        ("send_callback", PJRT_SendCallback),
    ]


class PJRT_RecvCallbackInfo(Structure):
    _fields_ = [
        ("channel_id", c_int64),
        ("user_arg", c_void_p),
        ("recv_callback", PJRT_RecvCallback),
    ]


PJRT_HloOutputCallback = CFUNCTYPE(
    None,
    c_int64,
    c_int64,
    c_void_p,
    POINTER(c_int64),
    c_size_t,
    c_int,
    c_int64,
    c_void_p,
)


class PJRT_HloOutputCallbackInfo(Structure):
    _fields_ = [
        ("user_arg", c_void_p),
        ("callback", PJRT_HloOutputCallback),
        ("callback_id", c_int64),
        ("num_operands", c_size_t),
    ]


class PJRT_ExecuteOptions(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("send_callbacks", POINTER(POINTER(PJRT_SendCallbackInfo))),
        ("recv_callbacks", POINTER(POINTER(PJRT_RecvCallbackInfo))),
        ("num_send_ops", c_size_t),
        ("num_recv_ops", c_size_t),
        ("launch_id", c_int),
        ("non_donatable_input_indices", POINTER(c_int64)),
        ("num_non_donatable_input_indices", c_size_t),
        ("context", c_void_p),
        ("call_location", c_void_p),  # NUL-terminated
        ("num_tasks", c_size_t),
        ("task_ids", POINTER(c_int)),
        ("incarnation_ids", POINTER(c_int64)),
        ("multi_slice_config", c_void_p),
        ("use_major_to_minor_data_layout_for_callbacks", c_bool),
        ("hlo_output_callbacks", POINTER(PJRT_HloOutputCallbackInfo)),
        ("num_hlo_output_callbacks", c_size_t),
    ]


class PJRT_LoadedExecutable_Execute_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("options", POINTER(PJRT_ExecuteOptions)),
        ("argument_lists", POINTER(POINTER(c_void_p))),
        ("num_devices", c_size_t),
        ("num_args", c_size_t),
        ("output_lists", POINTER(POINTER(c_void_p))),  # in/out
        ("device_complete_events", POINTER(c_void_p)),  # in/out
        ("execute_device", c_void_p),
    ]


PJRT_LoadedExecutable_Execute = _entry_point(PJRT_LoadedExecutable_Execute_Args)


class PJRT_Executable_NumOutputs_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("num_outputs", c_size_t),  # out
    ]


PJRT_Executable_NumOutputs = _entry_point(PJRT_Executable_NumOutputs_Args)


class PJRT_Executable_SizeOfGeneratedCodeInBytes_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("size_in_bytes", c_int64),  # out
    ]


PJRT_Executable_SizeOfGeneratedCodeInBytes = _entry_point(
    PJRT_Executable_SizeOfGeneratedCodeInBytes_Args)


class PJRT_Executable_Fingerprint_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("executable_fingerprint", c_void_p),  # out
        ("executable_fingerprint_size", c_size_t),  # out
    ]


PJRT_Executable_Fingerprint = _entry_point(PJRT_Executable_Fingerprint_Args)


class PJRT_Executable_GetCostAnalysis_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("num_properties", c_size_t),  # out
        ("properties", POINTER(PJRT_NamedValue)),  # out
    ]


PJRT_Executable_GetCostAnalysis = _entry_point(PJRT_Executable_GetCostAnalysis_Args)


class PJRT_Executable_GetCompiledMemoryStats_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("generated_code_size_in_bytes", c_int64),  # out
        ("argument_size_in_bytes", c_int64),  # out
        ("output_size_in_bytes", c_int64),  # out
        ("alias_size_in_bytes", c_int64),  # out
        ("temp_size_in_bytes", c_int64),  # out
        ("host_generated_code_size_in_bytes", c_int64),  # out
        ("host_argument_size_in_bytes", c_int64),  # out
        ("host_output_size_in_bytes", c_int64),  # out
        ("host_alias_size_in_bytes", c_int64),  # out
        ("host_temp_size_in_bytes", c_int64),  # out
        ("peak_memory_in_bytes", c_int64),  # out
        ("total_size_in_bytes", c_int64),  # out
        ("total_allocation_bytes", c_int64),  # out
        ("indefinite_allocations", c_int64),  # out
        ("peak_unpadded_heap_bytes", c_int64),  # out
    ]


PJRT_Executable_GetCompiledMemoryStats = _entry_point(
    PJRT_Executable_GetCompiledMemoryStats_Args)


class PJRT_Executable_OutputElementTypes_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("output_types", POINTER(c_int)),  # out
        ("num_output_types", c_size_t),  # out
    ]


PJRT_Executable_OutputElementTypes = _entry_point(
    PJRT_Executable_OutputElementTypes_Args)


class PJRT_Executable_OutputDimensions_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("num_outputs", c_size_t),
        ("dims", POINTER(c_int64)),  # out
        ("dim_sizes", POINTER(c_size_t)),  # out
    ]


PJRT_Executable_OutputDimensions = _entry_point(PJRT_Executable_OutputDimensions_Args)


class PJRT_Executable_ParameterMemoryKinds_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("num_parameters", c_size_t),
        ("memory_kinds", POINTER(c_void_p)),  # out
        ("memory_kind_sizes", POINTER(c_size_t)),  # out
    ]


PJRT_Executable_ParameterMemoryKinds = _entry_point(
    PJRT_Executable_ParameterMemoryKinds_Args)


class PJRT_Executable_OutputMemoryKinds_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("num_outputs", c_size_t),
        ("memory_kinds", POINTER(c_void_p)),  # out
        ("memory_kind_sizes", POINTER(c_size_t)),  # out
    ]


PJRT_Executable_OutputMemoryKinds = _entry_point(PJRT_Executable_OutputMemoryKinds_Args)


class PJRT_Executable_Serialize_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("serialized_bytes", c_void_p),  # out
        ("serialized_bytes_size", c_size_t),  # out
        ("serialized_executable", c_void_p),
        ("serialized_executable_deleter", CFUNCTYPE(None, c_void_p)),  # out
    ]


PJRT_Executable_Serialize = _entry_point(PJRT_Executable_Serialize_Args)


class PJRT_Executable_GetCompileOptions_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("serialized_bytes", c_void_p),  # out
        ("serialized_bytes_size", c_size_t),  # out
        ("serialized_compile_options", c_void_p),
        ("serialized_compile_options_deleter", CFUNCTYPE(None, c_void_p)),  # out
    ]


PJRT_Executable_GetCompileOptions = _entry_point(PJRT_Executable_GetCompileOptions_Args)


class PJRT_LoadOptions(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("computation_origin", POINTER(c_int32)),
        ("computation_origin_size", c_size_t),
        ("multi_slice_config", c_void_p),
    ]


class PJRT_Executable_DeserializeAndLoad_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("serialized_executable", c_void_p),
        ("serialized_executable_size", c_size_t),
        ("loaded_executable", c_void_p),  # out
        ("overridden_serialized_compile_options", c_void_p),
        ("overridden_serialized_compile_options_size", c_size_t),
        ("load_options", POINTER(PJRT_LoadOptions)),
    ]


PJRT_Executable_DeserializeAndLoad = _entry_point(
    PJRT_Executable_DeserializeAndLoad_Args)


class PJRT_LoadedExecutable_Fingerprint_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("executable_fingerprint", c_void_p),  # out
        ("executable_fingerprint_size", c_size_t),  # out
    ]


PJRT_LoadedExecutable_Fingerprint = _entry_point(PJRT_LoadedExecutable_Fingerprint_Args)


# -------- Buffers ------------------------------------------------------------


class PJRT_Buffer_Destroy_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
    ]


PJRT_Buffer_Destroy = _entry_point(PJRT_Buffer_Destroy_Args)


class PJRT_Buffer_ElementType_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("type", c_int),  # out
    ]


PJRT_Buffer_ElementType = _entry_point(PJRT_Buffer_ElementType_Args)


class PJRT_Buffer_Dimensions_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("dims", POINTER(c_int64)),  # out
        ("num_dims", c_size_t),  # out
    ]


PJRT_Buffer_Dimensions = _entry_point(PJRT_Buffer_Dimensions_Args)


class PJRT_Buffer_UnpaddedDimensions_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("unpadded_dims", POINTER(c_int64)),  # out
        ("num_dims", c_size_t),  # out
    ]


PJRT_Buffer_UnpaddedDimensions = _entry_point(PJRT_Buffer_UnpaddedDimensions_Args)


class PJRT_Buffer_DynamicDimensionIndices_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("dynamic_dim_indices", POINTER(c_size_t)),  # out
        ("num_dynamic_dims", c_size_t),  # out
    ]


PJRT_Buffer_DynamicDimensionIndices = _entry_point(
    PJRT_Buffer_DynamicDimensionIndices_Args)


class PJRT_Buffer_GetMemoryLayout_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("layout", PJRT_Buffer_MemoryLayout),  # out
    ]


PJRT_Buffer_GetMemoryLayout = _entry_point(PJRT_Buffer_GetMemoryLayout_Args)


class PJRT_Buffer_ToHostBuffer_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("src", c_void_p),
        ("host_layout", POINTER(PJRT_Buffer_MemoryLayout)),
        ("dst", c_void_p),  # in/out
        ("dst_size", c_size_t),  # in/out
        ("event", c_void_p),  # out
    ]


PJRT_Buffer_ToHostBuffer = _entry_point(PJRT_Buffer_ToHostBuffer_Args)


class PJRT_Buffer_OnDeviceSizeInBytes_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("on_device_size_in_bytes", c_size_t),  # out
    ]


PJRT_Buffer_OnDeviceSizeInBytes = _entry_point(PJRT_Buffer_OnDeviceSizeInBytes_Args)


class PJRT_Buffer_Delete_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
    ]


PJRT_Buffer_Delete = _entry_point(PJRT_Buffer_Delete_Args)


class PJRT_Buffer_IsDeleted_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("is_deleted", c_bool),  # out
    ]


PJRT_Buffer_IsDeleted = _entry_point(PJRT_Buffer_IsDeleted_Args)


class PJRT_Buffer_CopyRawToHost_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("dst", c_void_p),
        ("offset", c_int64),
        ("transfer_size", c_int64),
        ("event", c_void_p),  # out
    ]


PJRT_Buffer_CopyRawToHost = _entry_point(PJRT_Buffer_CopyRawToHost_Args)


class PJRT_Buffer_CopyRawToHostFuture_Callback_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("callback_data", c_void_p),
        ("error_code", c_int),
        ("error_message", c_void_p),
        ("error_message_size", c_size_t),
        ("dst", c_void_p),
    ]


# Type of PJRT_Buffer_CopyRawToHostFuture_Args.future_ready_callback.
FutureReadyCallback = CFUNCTYPE(
    None, POINTER(PJRT_Buffer_CopyRawToHostFuture_Callback_Args))


class PJRT_Buffer_CopyRawToHostFuture_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("offset", c_int64),
        ("transfer_size", c_int64),
        ("event", c_void_p),  # out
        ("callback_data", c_void_p),  # out
        ("future_ready_callback", FutureReadyCallback),  # out
    ]


PJRT_Buffer_CopyRawToHostFuture = _entry_point(PJRT_Buffer_CopyRawToHostFuture_Args)


class PJRT_Buffer_CopyToDevice_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("dst_device", c_void_p),
        ("dst_buffer", c_void_p),  # out
    ]


PJRT_Buffer_CopyToDevice = _entry_point(PJRT_Buffer_CopyToDevice_Args)


class PJRT_Buffer_CopyToMemory_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("dst_memory", c_void_p),
        ("dst_buffer", c_void_p),  # out
    ]


PJRT_Buffer_CopyToMemory = _entry_point(PJRT_Buffer_CopyToMemory_Args)


class PJRT_Buffer_Bitcast_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("element_type", c_int),
        ("dims", POINTER(c_int64)),
        ("num_dims", c_size_t),
        ("device_layout", POINTER(PJRT_Buffer_MemoryLayout)),
        ("out_buffer", c_void_p),  # out
    ]


PJRT_Buffer_Bitcast = _entry_point(PJRT_Buffer_Bitcast_Args)


class PJRT_Buffer_IsOnCpu_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("is_on_cpu", c_bool),  # out
    ]


PJRT_Buffer_IsOnCpu = _entry_point(PJRT_Buffer_IsOnCpu_Args)


class PJRT_Buffer_Device_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("device", c_void_p),  # out
    ]


PJRT_Buffer_Device = _entry_point(PJRT_Buffer_Device_Args)


class PJRT_Buffer_Memory_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("memory", c_void_p),  # out
    ]


PJRT_Buffer_Memory = _entry_point(PJRT_Buffer_Memory_Args)


class PJRT_Buffer_ReadyEvent_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("event", c_void_p),  # out
    ]


PJRT_Buffer_ReadyEvent = _entry_point(PJRT_Buffer_ReadyEvent_Args)


class PJRT_Buffer_UnsafePointer_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("buffer_pointer", c_size_t),  # out
    ]


PJRT_Buffer_UnsafePointer = _entry_point(PJRT_Buffer_UnsafePointer_Args)


class PJRT_Buffer_IncreaseExternalReferenceCount_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
    ]


PJRT_Buffer_IncreaseExternalReferenceCount = _entry_point(
    PJRT_Buffer_IncreaseExternalReferenceCount_Args)


class PJRT_Buffer_DecreaseExternalReferenceCount_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
    ]


PJRT_Buffer_DecreaseExternalReferenceCount = _entry_point(
    PJRT_Buffer_DecreaseExternalReferenceCount_Args)


class PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("device_memory_ptr", c_void_p),  # out
    ]


PJRT_Buffer_OpaqueDeviceMemoryDataPointer = _entry_point(
    PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args)


class PJRT_Buffer_DonateWithControlDependency_Callback_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("callback_data", c_void_p),
        ("error_code", c_int),
        ("error_message", c_void_p),
        ("error_message_size", c_size_t),
    ]


# Type of PJRT_Buffer_DonateWithControlDependency_Args.dependency_ready_callback.
DependencyReadyCallback = CFUNCTYPE(
    None, POINTER(PJRT_Buffer_DonateWithControlDependency_Callback_Args))


class PJRT_Buffer_DonateWithControlDependency_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("callback_data", c_void_p),  # out
        ("dependency_ready_callback", DependencyReadyCallback),  # out
        ("out_buffer", c_void_p),  # out
    ]


PJRT_Buffer_DonateWithControlDependency = _entry_point(
    PJRT_Buffer_DonateWithControlDependency_Args)


# -------- CopyToDeviceStream -------------------------------------------------


class PJRT_CopyToDeviceStream_Destroy_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("stream", c_void_p),
    ]


PJRT_CopyToDeviceStream_Destroy = _entry_point(PJRT_CopyToDeviceStream_Destroy_Args)


class PJRT_CopyToDeviceStream_AddChunk_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("stream", c_void_p),
        ("chunk", POINTER(PJRT_Chunk)),
        ("transfer_complete", c_void_p),  # out
    ]


PJRT_CopyToDeviceStream_AddChunk = _entry_point(PJRT_CopyToDeviceStream_AddChunk_Args)


class PJRT_CopyToDeviceStream_TotalBytes_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("stream", c_void_p),
        ("total_bytes", c_int64),  # out
    ]


PJRT_CopyToDeviceStream_TotalBytes = _entry_point(
    PJRT_CopyToDeviceStream_TotalBytes_Args)


class PJRT_CopyToDeviceStream_GranuleSize_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("stream", c_void_p),
        ("granule_size_in_bytes", c_int64),  # out
    ]


PJRT_CopyToDeviceStream_GranuleSize = _entry_point(
    PJRT_CopyToDeviceStream_GranuleSize_Args)


class PJRT_CopyToDeviceStream_CurrentBytes_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("stream", c_void_p),
        ("current_bytes", c_int64),  # out
    ]


PJRT_CopyToDeviceStream_CurrentBytes = _entry_point(
    PJRT_CopyToDeviceStream_CurrentBytes_Args)


# -------- Device Topology ----------------------------------------------------


class PJRT_TopologyDescription_Create_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("topology_name", c_void_p),
        ("topology_name_size", c_size_t),
        ("create_options", POINTER(PJRT_NamedValue)),
        ("num_options", c_size_t),
        ("topology", c_void_p),  # out
    ]


PJRT_TopologyDescription_Create = _entry_point(PJRT_TopologyDescription_Create_Args)


class PJRT_TopologyDescription_Destroy_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("topology", c_void_p),
    ]


PJRT_TopologyDescription_Destroy = _entry_point(PJRT_TopologyDescription_Destroy_Args)


class PJRT_TopologyDescription_PlatformVersion_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("topology", c_void_p),
        ("platform_version", c_void_p),  # out
        ("platform_version_size", c_size_t),  # out
    ]


PJRT_TopologyDescription_PlatformVersion = _entry_point(
    PJRT_TopologyDescription_PlatformVersion_Args)


class PJRT_TopologyDescription_PlatformName_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("topology", c_void_p),
        ("platform_name", c_void_p),  # out
        ("platform_name_size", c_size_t),  # out
    ]


PJRT_TopologyDescription_PlatformName = _entry_point(
    PJRT_TopologyDescription_PlatformName_Args)


class PJRT_TopologyDescription_GetDeviceDescriptions_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("topology", c_void_p),
        ("descriptions", POINTER(c_void_p)),  # out
        ("num_descriptions", c_size_t),  # out
    ]


PJRT_TopologyDescription_GetDeviceDescriptions = _entry_point(
    PJRT_TopologyDescription_GetDeviceDescriptions_Args)


class PJRT_TopologyDescription_Serialize_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("topology", c_void_p),
        ("serialized_bytes", c_void_p),  # out
        ("serialized_bytes_size", c_size_t),  # out
        ("serialized_topology", c_void_p),  # out
        ("serialized_topology_deleter", CFUNCTYPE(None, c_void_p)),  # out
    ]


PJRT_TopologyDescription_Serialize = _entry_point(
    PJRT_TopologyDescription_Serialize_Args)


class PJRT_TopologyDescription_Deserialize_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("serialized_topology", c_void_p),
        ("serialized_topology_size", c_size_t),
        ("topology", c_void_p),  # out
    ]


PJRT_TopologyDescription_Deserialize = _entry_point(
    PJRT_TopologyDescription_Deserialize_Args)


class PJRT_TopologyDescription_Attributes_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("topology", c_void_p),
        ("attributes", POINTER(PJRT_NamedValue)),  # out
        ("num_attributes", c_size_t),  # out
    ]


PJRT_TopologyDescription_Attributes = _entry_point(
    PJRT_TopologyDescription_Attributes_Args)


class PJRT_TopologyDescription_Fingerprint_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("topology", c_void_p),
        ("fingerprint", c_uint64),  # out
    ]


PJRT_TopologyDescription_Fingerprint = _entry_point(
    PJRT_TopologyDescription_Fingerprint_Args)


class PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("topology", c_void_p),
        ("memory_space_kind_id", c_int),
        ("dims", POINTER(c_int64)),
        ("num_dims", c_size_t),
        ("element_type", c_int),
        ("layout", POINTER(PJRT_Buffer_MemoryLayout)),
        ("serialized_shape", c_void_p),  # out
        ("serialized_shape_size", c_size_t),  # out
        ("serialized_shape_deleter", CFUNCTYPE(None, c_void_p)),  # out
    ]


PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace = _entry_point(
    PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace_Args)


class PJRT_TopologyDescription_GetMemorySpaceKindIds_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("topology", c_void_p),
        ("memory_space_kind_ids", POINTER(c_int)),  # out
        ("num_memory_space_kind_ids", c_size_t),  # out
    ]


PJRT_TopologyDescription_GetMemorySpaceKindIds = _entry_point(
    PJRT_TopologyDescription_GetMemorySpaceKindIds_Args)


class PJRT_Compile_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("topology", c_void_p),
        ("program", POINTER(PJRT_Program)),
        ("compile_options", c_void_p),
        ("compile_options_size", c_size_t),
        ("client", c_void_p),
        ("executable", c_void_p),  # out
    ]


PJRT_Compile = _entry_point(PJRT_Compile_Args)


# -------- API table ----------------------------------------------------------


API_ENTRY_POINTS: tuple[str, ...] = (
    "PJRT_Error_Destroy",
    "PJRT_Error_Message",
    "PJRT_Error_GetCode",
    "PJRT_Plugin_Initialize",
    "PJRT_Plugin_Attributes",
    "PJRT_Event_Destroy",
    "PJRT_Event_IsReady",
    "PJRT_Event_Error",
    "PJRT_Event_Await",
    "PJRT_Event_OnReady",
    "PJRT_Client_Create",
    "PJRT_Client_Destroy",
    "PJRT_Client_PlatformName",
    "PJRT_Client_ProcessIndex",
    "PJRT_Client_PlatformVersion",
    "PJRT_Client_Devices",
    "PJRT_Client_AddressableDevices",
    "PJRT_Client_LookupDevice",
    "PJRT_Client_LookupAddressableDevice",
    "PJRT_Client_AddressableMemories",
    "PJRT_Client_Compile",
    "PJRT_Client_DefaultDeviceAssignment",
    "PJRT_Client_BufferFromHostBuffer",
    "PJRT_DeviceDescription_Id",
    "PJRT_DeviceDescription_ProcessIndex",
    "PJRT_DeviceDescription_Attributes",
    "PJRT_DeviceDescription_Kind",
    "PJRT_DeviceDescription_DebugString",
    "PJRT_DeviceDescription_ToString",
    "PJRT_Device_GetDescription",
    "PJRT_Device_IsAddressable",
    "PJRT_Device_LocalHardwareId",
    "PJRT_Device_AddressableMemories",
    "PJRT_Device_DefaultMemory",
    "PJRT_Device_MemoryStats",
    "PJRT_Memory_Id",
    "PJRT_Memory_Kind",
    "PJRT_Memory_DebugString",
    "PJRT_Memory_ToString",
    "PJRT_Memory_AddressableByDevices",
    "PJRT_Executable_Destroy",
    "PJRT_Executable_Name",
    "PJRT_Executable_NumReplicas",
    "PJRT_Executable_NumPartitions",
    "PJRT_Executable_NumOutputs",
    "PJRT_Executable_SizeOfGeneratedCodeInBytes",
    "PJRT_Executable_GetCostAnalysis",
    "PJRT_Executable_OutputMemoryKinds",
    "PJRT_Executable_OptimizedProgram",
    "PJRT_Executable_Serialize",
    "PJRT_LoadedExecutable_Destroy",
    "PJRT_LoadedExecutable_GetExecutable",
    "PJRT_LoadedExecutable_AddressableDevices",
    "PJRT_LoadedExecutable_Delete",
    "PJRT_LoadedExecutable_IsDeleted",
    "PJRT_LoadedExecutable_Execute",
    "PJRT_Executable_DeserializeAndLoad",
    "PJRT_LoadedExecutable_Fingerprint",
    "PJRT_Buffer_Destroy",
    "PJRT_Buffer_ElementType",
    "PJRT_Buffer_Dimensions",
    "PJRT_Buffer_UnpaddedDimensions",
    "PJRT_Buffer_DynamicDimensionIndices",
    "PJRT_Buffer_GetMemoryLayout",
    "PJRT_Buffer_OnDeviceSizeInBytes",
    "PJRT_Buffer_Device",
    "PJRT_Buffer_Memory",
    "PJRT_Buffer_Delete",
    "PJRT_Buffer_IsDeleted",
    "PJRT_Buffer_CopyToDevice",
    "PJRT_Buffer_ToHostBuffer",
    "PJRT_Buffer_IsOnCpu",
    "PJRT_Buffer_ReadyEvent",
    "PJRT_Buffer_UnsafePointer",
    "PJRT_Buffer_IncreaseExternalReferenceCount",
    "PJRT_Buffer_DecreaseExternalReferenceCount",
    "PJRT_Buffer_OpaqueDeviceMemoryDataPointer",
    "PJRT_CopyToDeviceStream_Destroy",
    "PJRT_CopyToDeviceStream_AddChunk",
    "PJRT_CopyToDeviceStream_TotalBytes",
    "PJRT_CopyToDeviceStream_GranuleSize",
    "PJRT_CopyToDeviceStream_CurrentBytes",
    "PJRT_TopologyDescription_Create",
    "PJRT_TopologyDescription_Destroy",
    "PJRT_TopologyDescription_PlatformName",
    "PJRT_TopologyDescription_PlatformVersion",
    "PJRT_TopologyDescription_GetDeviceDescriptions",
    "PJRT_TopologyDescription_Serialize",
    "PJRT_TopologyDescription_Attributes",
    "PJRT_Compile",
    "PJRT_Executable_OutputElementTypes",
    "PJRT_Executable_OutputDimensions",
    "PJRT_Buffer_CopyToMemory",
    "PJRT_Client_CreateViewOfDeviceBuffer",
    "PJRT_Executable_Fingerprint",
    "PJRT_Client_TopologyDescription",
    "PJRT_Executable_GetCompiledMemoryStats",
    "PJRT_Memory_Kind_Id",
    "PJRT_ExecuteContext_Create",
    "PJRT_ExecuteContext_Destroy",
    "PJRT_Buffer_CopyRawToHost",
    "PJRT_AsyncHostToDeviceTransferManager_Destroy",
    "PJRT_AsyncHostToDeviceTransferManager_TransferData",
    "PJRT_Client_CreateBuffersForAsyncHostToDevice",
    "PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer",
    "PJRT_AsyncHostToDeviceTransferManager_Device",
    "PJRT_AsyncHostToDeviceTransferManager_BufferCount",
    "PJRT_AsyncHostToDeviceTransferManager_BufferSize",
    "PJRT_AsyncHostToDeviceTransferManager_SetBufferError",
    "PJRT_AsyncHostToDeviceTransferManager_AddMetadata",
    "PJRT_Client_DmaMap",
    "PJRT_Client_DmaUnmap",
    "PJRT_Client_CreateUninitializedBuffer",
    "PJRT_Client_UpdateGlobalProcessInfo",
    "PJRT_TopologyDescription_Deserialize",
    "PJRT_Client_CreateAliasBuffer",
    "PJRT_Client_FulfillAliasBuffer",
    "PJRT_LoadedExecutable_GetDeviceAssignment",
    "PJRT_Client_CreateErrorBuffer",
    "PJRT_AsyncHostToDeviceTransferManager_TransferLiteral",
    "PJRT_Buffer_CopyRawToHostFuture",
    "PJRT_Device_PoisonExecution",
    "PJRT_Device_CreateAsyncTrackingEvent",
    "PJRT_AsyncTrackingEvent_Destroy",
    "PJRT_Executable_GetCompileOptions",
    "PJRT_Buffer_DonateWithControlDependency",
    "PJRT_Event_Create",
    "PJRT_Event_Set",
    "PJRT_Device_GetAttributes",
    "PJRT_Client_Load",
    "PJRT_LoadedExecutable_AddressableDeviceLogicalIds",
    "PJRT_Buffer_Bitcast",
    "PJRT_Error_ForEachPayload",
    "PJRT_TopologyDescription_Fingerprint",
    "PJRT_Executable_ParameterMemoryKinds",
    "PJRT_Device_ClearMemoryStats",
    "PJRT_TopologyDescription_MakeCanonicalShapeForMemorySpace",
    "PJRT_TopologyDescription_GetMemorySpaceKindIds",
)


# The function table returned by GetPjrtApi(): header fields, then one
# function pointer per API_ENTRY_POINTS name, in that order.
class PJRT_Api(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("pjrt_api_version", PJRT_Api_Version),
    ] + [(_n, ENTRY_FUNCTYPE[_n]) for _n in API_ENTRY_POINTS]


_CORE_STRUCT_NAMES = _struct_names()


# -------- Shardings extension (pjrt_c_api_shardings_extension.h) -------------

PJRT_API_SHARDINGS_EXTENSION_VERSION = 1


class PJRT_Shardings_PJRT_Executable_ParameterShardings_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("num_parameters", c_size_t),  # out
        ("shardings", POINTER(c_void_p)),  # out
        ("sharding_sizes", POINTER(c_size_t)),  # out
    ]


PJRT_Shardings_PJRT_Executable_ParameterShardings = _entry_point(
    PJRT_Shardings_PJRT_Executable_ParameterShardings_Args)


class PJRT_Shardings_PJRT_Executable_OutputShardings_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("num_outputs", c_size_t),  # out
        ("shardings", POINTER(c_void_p)),  # out
        ("sharding_sizes", POINTER(c_size_t)),  # out
    ]


PJRT_Shardings_PJRT_Executable_OutputShardings = _entry_point(
    PJRT_Shardings_PJRT_Executable_OutputShardings_Args)


SHARDINGS_EXTENSION_ENTRY_POINTS: tuple[str, ...] = (
    "PJRT_Shardings_PJRT_Executable_ParameterShardings",
    "PJRT_Shardings_PJRT_Executable_OutputShardings",
)


class PJRT_Shardings_Extension(Structure):
    _fields_ = [
        ("base", PJRT_Extension_Base),
    ] + [(_n, ENTRY_FUNCTYPE[_n]) for _n in SHARDINGS_EXTENSION_ENTRY_POINTS]


# -------- Layouts extension (pjrt_c_api_layouts_extension.h) -----------------

PJRT_API_LAYOUTS_EXTENSION_VERSION = 4


class PJRT_Layouts_MemoryLayout_Destroy_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("layout", c_void_p),
    ]


PJRT_Layouts_MemoryLayout_Destroy = _entry_point(PJRT_Layouts_MemoryLayout_Destroy_Args)


class PJRT_Layouts_MemoryLayout_Serialize_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("layout", c_void_p),
        ("serialized_bytes", c_void_p),  # out
        ("serialized_bytes_size", c_size_t),  # out
        ("serialized_layout", c_void_p),
        ("serialized_layout_deleter", CFUNCTYPE(None, c_void_p)),  # out
    ]


PJRT_Layouts_MemoryLayout_Serialize = _entry_point(
    PJRT_Layouts_MemoryLayout_Serialize_Args)


class PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("buffer", c_void_p),
        ("layout", c_void_p),  # out
    ]


PJRT_Layouts_PJRT_Buffer_MemoryLayout = _entry_point(
    PJRT_Layouts_PJRT_Buffer_MemoryLayout_Args)


class PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("client", c_void_p),
        ("type", c_int),
        ("dims", POINTER(c_int64)),
        ("num_dims", c_size_t),
        ("layout", c_void_p),  # out
    ]


PJRT_Layouts_PJRT_Client_GetDefaultLayout = _entry_point(
    PJRT_Layouts_PJRT_Client_GetDefaultLayout_Args)


class PJRT_Layouts_PJRT_Topology_GetDefaultLayout_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("topology_description", c_void_p),
        ("type", c_int),
        ("dims", POINTER(c_int64)),
        ("num_dims", c_size_t),
        ("layout", c_void_p),  # out
    ]


PJRT_Layouts_PJRT_Topology_GetDefaultLayout = _entry_point(
    PJRT_Layouts_PJRT_Topology_GetDefaultLayout_Args)


class PJRT_Layouts_PJRT_Executable_GetOutputLayouts_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("num_outputs", c_size_t),  # out
        ("layouts", POINTER(c_void_p)),  # out
    ]


PJRT_Layouts_PJRT_Executable_GetOutputLayouts = _entry_point(
    PJRT_Layouts_PJRT_Executable_GetOutputLayouts_Args)


class PJRT_Layouts_PJRT_Executable_GetParameterLayouts_Args(Structure):
    _fields_ = [
        ("struct_size", c_size_t),
        ("extension_start", POINTER(PJRT_Extension_Base)),
        ("executable", c_void_p),
        ("num_parameters", c_size_t),  # out
        ("layouts", POINTER(c_void_p)),  # out
    ]


PJRT_Layouts_PJRT_Executable_GetParameterLayouts = _entry_point(
    PJRT_Layouts_PJRT_Executable_GetParameterLayouts_Args)


LAYOUTS_EXTENSION_ENTRY_POINTS: tuple[str, ...] = (
    "PJRT_Layouts_MemoryLayout_Destroy",
    "PJRT_Layouts_MemoryLayout_Serialize",
    "PJRT_Layouts_PJRT_Client_GetDefaultLayout",
    "PJRT_Layouts_PJRT_Buffer_MemoryLayout",
    "PJRT_Layouts_PJRT_Topology_GetDefaultLayout",
    "PJRT_Layouts_PJRT_Executable_GetOutputLayouts",
    "PJRT_Layouts_PJRT_Executable_GetParameterLayouts",
)


class PJRT_Layouts_Extension(Structure):
    _fields_ = [
        ("base", PJRT_Extension_Base),
    ] + [(_n, ENTRY_FUNCTYPE[_n]) for _n in LAYOUTS_EXTENSION_ENTRY_POINTS]


# -------- Tables -------------------------------------------------------------


# Every Structure above, in header order (core header, then extensions).
STRUCTS: tuple[type, ...] = tuple(globals()[n] for n in _struct_names())
CORE_STRUCTS: tuple[type, ...] = tuple(
    globals()[n] for n in _CORE_STRUCT_NAMES)
EXTENSION_STRUCTS: tuple[type, ...] = STRUCTS[len(CORE_STRUCTS):]

STRUCT_SIZE: dict[str, int] = {}
for _cls in STRUCTS:
    _cls.STRUCT_SIZE = STRUCT_SIZE[_cls.__name__] = struct_size(_cls)
del _cls
