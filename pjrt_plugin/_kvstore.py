"""The key-value store callbacks of PJRT_Client_Create as a `jax_trn.runtime.kvstore.KVStore`.

PJRT C API contract (pjrt_c_api.h, PJRT_KeyValue*Callback_Args): the plugin (we) fills
the key, the timeout (get only), `user_arg` (what Client_Create passed) and
`callback_error`, a pointer to a function of ours that the callback calls to build the
error it returns (so the returned PJRT_Error* is our own object: here a token into
`_ERRORS`). On success the callback sets `value` / `value_size` and
`value_deleter_callback`: we copy the value, then call the deleter on it. A put's value
only needs to live during the call. The callbacks are thread-safe and may block (get).
"""
from __future__ import annotations

import ctypes
import itertools
import threading

from jax_trn.runtime.kvstore import DEFAULT_TIMEOUT_S, KVError, KVStore, KVTimeout

from . import _c_api as C
from ._errors import Code

_ERRORS: dict[int, tuple[int, str]] = {}
_ERRORS_LOCK = threading.Lock()
_TOKENS = itertools.count(1)


def _make_error(code: int, message, size: int) -> int:
    """Our PJRT_CallbackError: records (code, message), returns a non-null token."""
    try:
        text = ctypes.string_at(message, size).decode("utf-8", "replace") if size else ""
    except Exception:                   # noqa: BLE001 - never raise into C
        text = "(unreadable message)"
    with _ERRORS_LOCK:
        token = next(_TOKENS)
        _ERRORS[token] = (int(code), text)
    return token


_MAKE_ERROR = C.PJRT_CallbackError(_make_error)
# PJRT_CallbackError* callback_error: the address of a word holding the function's.
_MAKE_ERROR_WORD = ctypes.c_void_p(ctypes.cast(_MAKE_ERROR, ctypes.c_void_p).value)
_MAKE_ERROR_ADDRESS = ctypes.addressof(_MAKE_ERROR_WORD)


def _take_error(token: int, what: str) -> KVError:
    with _ERRORS_LOCK:
        code, text = _ERRORS.pop(token, (int(Code.UNKNOWN), "unknown error"))
    try:
        name = Code(code).name
    except ValueError:
        name = str(code)
    cls = KVTimeout if name == "DEADLINE_EXCEEDED" else KVError
    return cls(name, f"{what}: {name}: {text}")


def _set_key(args, key: bytes) -> ctypes.Array:
    buf = ctypes.create_string_buffer(key, len(key))
    args.key = ctypes.addressof(buf)
    args.key_size = len(key)
    ctypes.c_void_p.from_address(
        ctypes.addressof(args) + type(args).callback_error.offset).value = _MAKE_ERROR_ADDRESS
    return buf


def _value(args) -> bytes:
    """The callback's value, copied; then released with its deleter."""
    if not args.value:
        return b""
    data = ctypes.string_at(args.value, args.value_size)
    if args.value_deleter_callback:
        args.value_deleter_callback(args.value)
    return data


class CallbackKVStore(KVStore):
    """The store behind the callbacks of one PJRT_Client_Create call."""

    def __init__(self, get, get_arg, put, put_arg, try_get=None, try_get_arg=None):
        self._get, self._get_arg = get, get_arg
        self._put, self._put_arg = put, put_arg
        self._try_get, self._try_get_arg = try_get, try_get_arg
        self._delete = None            # found on first use (delete_dir)

    @classmethod
    def from_create_args(cls, a) -> "CallbackKVStore | None":
        """The store of PJRT_Client_Create_Args `a`, or None if JAX gave none. The
        function addresses are copied out (a ctypes function field reads the args
        struct, which is gone once Client_Create returns)."""
        def fn(name, ftype):
            address = ctypes.c_void_p.from_address(
                ctypes.addressof(a) + getattr(type(a), name).offset).value
            return ftype(address) if address else None
        get = fn("kv_get_callback", C.PJRT_KeyValueGetCallback)
        put = fn("kv_put_callback", C.PJRT_KeyValuePutCallback)
        if get is None or put is None:
            return None
        try_get = None
        if a.struct_size >= C.PJRT_Client_Create_Args.kv_try_get_user_arg.offset + 8:
            try_get = fn("kv_try_get_callback", C.PJRT_KeyValueTryGetCallback)
        return cls(get, a.kv_get_user_arg, put, a.kv_put_user_arg, try_get,
                   a.kv_try_get_user_arg if try_get else None)

    def put(self, key: str, value: bytes) -> None:
        args = C.PJRT_KeyValuePutCallback_Args()
        args.struct_size = C.struct_size(C.PJRT_KeyValuePutCallback_Args)
        keep = _set_key(args, key.encode())
        data = ctypes.create_string_buffer(bytes(value), len(value))
        args.value, args.value_size = ctypes.addressof(data), len(value)
        args.user_arg = self._put_arg
        error = self._put(ctypes.byref(args))
        del keep, data
        if error:
            raise _take_error(error, f"key-value store put of {key!r}")

    def get(self, key: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bytes:
        args = C.PJRT_KeyValueGetCallback_Args()
        args.struct_size = C.struct_size(C.PJRT_KeyValueGetCallback_Args)
        keep = _set_key(args, key.encode())
        args.timeout_in_ms = max(1, min(int(timeout_s * 1000), 2**31 - 1))
        args.user_arg = self._get_arg
        error = self._get(ctypes.byref(args))
        del keep
        if error:
            raise _take_error(error, f"key-value store get of {key!r} "
                                     f"(waited up to {timeout_s:g} s)")
        return _value(args)

    def delete_dir(self, directory: str) -> bool:
        """Through JAX's own client of the coordination service (the callbacks have no
        delete), under the prefix JAX puts before the plugin's keys: found once by
        writing a probe key through the callbacks and reading it back there."""
        if self._delete is None:
            self._delete = _jax_delete(self) or False
        if not self._delete:
            return False
        try:
            self._delete(directory)
        except Exception:        # noqa: BLE001 - the service is gone: nothing to keep
            return False
        return True

    def try_get(self, key: str) -> bytes | None:
        if self._try_get is None:        # an older caller: a get that barely waits
            try:
                return self.get(key, 0.001)
            except KVTimeout:
                return None
        args = C.PJRT_KeyValueTryGetCallback_Args()
        args.struct_size = C.struct_size(C.PJRT_KeyValueTryGetCallback_Args)
        keep = _set_key(args, key.encode())
        args.user_arg = self._try_get_arg
        error = self._try_get(ctypes.byref(args))
        del keep
        if error:
            exc = _take_error(error, f"key-value store try-get of {key!r}")
            if exc.code == "NOT_FOUND":
                return None
            raise exc
        return _value(args)


def _jax_delete(store: CallbackKVStore):
    """A function deleting a directory of `store`'s keys through JAX's distributed
    client, or None if there is none or its keys are not `store`'s under a known
    prefix."""
    try:
        from jax._src.distributed import global_state
        client = global_state.client
    except Exception:            # noqa: BLE001 - another JAX: no delete
        return None
    if client is None:
        return None
    probe = f"jax_trn/probe/{id(store)}-{threading.get_ident()}-{next(_TOKENS)}"
    try:
        store.put(probe, b"probe")
    except KVError:
        return None
    for prefix in ("trn:", ""):
        try:
            if client.key_value_try_get(prefix + probe) == "probe":
                client.key_value_delete(prefix + probe)
                return lambda directory, p=prefix: client.key_value_delete(p + directory)
        except Exception:        # noqa: BLE001 - not found under this prefix
            continue
    return None
