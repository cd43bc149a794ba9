"""The `InspectSharding` custom call: `jax.debug.inspect_array_sharding` (and
`visualize_array_sharding`) under jit on several devices.

JAX cannot know a value's sharding before the partitioner has chosen it, so it lowers
the call to a custom call whose backend_config holds two pointers (jaxlib's
`encode_inspect_sharding_callback`): a C function and its data, the user's callback.
The partitioner calls it with the operand's sharding as a serialized `xla.OpSharding`
and an out-struct for an error; the op itself computes nothing. `localize` calls it
here with the sharding it gave the operand (a value it sees unannotated, e.g. inside a
shard_map body, reports replicated), then drops the op.
"""
from __future__ import annotations

import ctypes

import numpy as np
from jaxlib import xla_client as xc

from hlo_passes.errors import VerifyError
from hlo_passes.sharding import Mesh, TensorSharding, tile_assignment

TARGET = "InspectSharding"


class _Args(ctypes.Structure):
    """jaxlib's JAX_InspectSharding_Callback_Args."""
    _fields_ = [("sharding_spec", ctypes.c_void_p), ("sharding_spec_size", ctypes.c_size_t),
                ("error_txt", ctypes.c_char_p), ("error_scratch", ctypes.c_void_p),
                ("free_error", ctypes.c_void_p)]


_CALL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(_Args))
_FREE = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Args))


def key_bytes(key: bytes | str) -> bytes:
    """The backend_config's bytes: the importer gives text when the two pointers happen
    to be valid UTF-8 (hlo_passes/attributes.py `_string`), which encodes back to them."""
    return key.encode("utf-8") if isinstance(key, str) else key


def call(key: bytes | str, sharding: TensorSharding | None, mesh: Mesh | None,
         rank: int) -> None:
    """Calls the callback encoded in `key` with `sharding` (of a rank-`rank` value)."""
    key = key_bytes(key)
    if not isinstance(key, bytes) or len(key) != 2 * ctypes.sizeof(ctypes.c_void_p):
        raise VerifyError(f"{TARGET}: backend_config is not a callback ({key!r:.40})")
    fn, data = np.frombuffer(key, dtype=np.uintp)
    spec = op_sharding(sharding, mesh, rank).SerializeToString()
    buf = ctypes.create_string_buffer(spec, len(spec))
    args = _Args(ctypes.cast(buf, ctypes.c_void_p), len(spec), None, None, None)
    _CALL(int(fn))(int(data), ctypes.byref(args))
    if args.error_txt is not None:
        message = args.error_txt.decode(errors="replace")
        if args.free_error:
            _FREE(args.free_error)(ctypes.byref(args))
        raise VerifyError(f"the inspect_array_sharding callback raised: {message}")


def op_sharding(s: TensorSharding | None, mesh: Mesh | None, rank: int) -> xc.OpSharding:
    """`s` as an `xla.OpSharding` over partition ids (`sharding.tile_assignment`)."""
    out = xc.OpSharding()
    tiled = tile_assignment(s, mesh, rank)
    if tiled is None:
        out.type = xc.OpSharding.Type.REPLICATED
        return out
    out.type = xc.OpSharding.Type.OTHER
    out.tile_assignment_dimensions, out.tile_assignment_devices, \
        out.replicate_on_last_tile_dim = tiled
    return out
