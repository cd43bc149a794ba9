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
import math

import numpy as np
from jaxlib import xla_client as xc

from hlo_passes.errors import VerifyError
from hlo_passes.sharding import AxisRef, Mesh, TensorSharding

TARGET = "InspectSharding"


class _Args(ctypes.Structure):
    """jaxlib's JAX_InspectSharding_Callback_Args."""
    _fields_ = [("sharding_spec", ctypes.c_void_p), ("sharding_spec_size", ctypes.c_size_t),
                ("error_txt", ctypes.c_char_p), ("error_scratch", ctypes.c_void_p),
                ("free_error", ctypes.c_void_p)]


_CALL = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(_Args))
_FREE = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Args))


def call(key: bytes, sharding: TensorSharding | None, mesh: Mesh | None, rank: int) -> None:
    """Calls the callback encoded in `key` with `sharding` (of a rank-`rank` value)."""
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
    """`s` as an `xla.OpSharding` over partition ids: one tile dimension per tensor
    dimension (its axes, major first), the unused axes as a last, replicated one."""
    out = xc.OpSharding()
    if s is None or mesh is None or s.is_replicated:
        out.type = xc.OpSharding.Type.REPLICATED
        return out
    factors = _factors(mesh, s)
    devices = np.array(mesh.partitions()).reshape([size for _, _, size in factors])
    used = [[i for ref in d for i in _covering(factors, mesh, ref)] for d in s.dims]
    used += [[] for _ in range(rank - len(used))]
    rest = [i for i in range(len(factors)) if all(i not in u for u in used)]
    dims = [math.prod(factors[i][2] for i in u) for u in used]
    replicas = math.prod(factors[i][2] for i in rest)
    out.type = xc.OpSharding.Type.OTHER
    out.tile_assignment_dimensions = dims + ([replicas] if replicas > 1 else [])
    out.replicate_on_last_tile_dim = replicas > 1
    perm = [i for u in used for i in u] + rest
    out.tile_assignment_devices = [int(d) for d in devices.transpose(perm).reshape(-1)]
    return out


def _factors(mesh: Mesh, s: TensorSharding) -> list[tuple[str, int, int]]:
    """The mesh axes cut at every sub-axis boundary `s` names: (axis, pre, size), in
    mesh order, major first."""
    refs = [r for d in s.dims for r in d] + list(s.replicated)
    out = []
    for name, size in mesh.axes:
        cuts = {1, size}
        for r in refs:
            if r.name == name and r.size is not None:
                cuts |= {r.pre_size, r.pre_size * r.size}
        points = sorted(cuts)
        out += [(name, lo, hi // lo) for lo, hi in zip(points, points[1:])]
    return out


def _covering(factors, mesh: Mesh, ref: AxisRef) -> list[int]:
    lo, hi = ref.pre_size, ref.pre_size * mesh.axis_size(ref)
    return [i for i, (name, pre, size) in enumerate(factors)
            if name == ref.name and pre >= lo and pre * size <= hi]
