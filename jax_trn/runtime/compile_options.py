"""Reading JAX's serialized CompileOptions (xla.CompileOptionsProto)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Options:
    num_replicas: int
    num_partitions: int
    device_assignment: tuple[tuple[int, ...], ...] | None   # [replica][partition] -> device id
    raw: bytes = field(repr=False)
    # JAX's `compiler_options` (`.compile({...})`): name -> value, ours and anyone's
    overrides: dict = field(default_factory=dict, repr=False, compare=False)


def parse(serialized: bytes) -> Options:
    from jaxlib import xla_client as xc
    opts = xc.CompileOptions.ParseFromString(serialized)
    build = opts.executable_build_options
    da = build.device_assignment
    assignment = _parse_device_assignment(da.serialize()) if da is not None else None
    return Options(max(1, build.num_replicas), max(1, build.num_partitions), assignment,
                   serialized, dict(opts.env_option_overrides))


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def _fields(buf: bytes):
    """Yields (field number, wire type, value) of a protobuf message (varint and
    length-delimited fields only, which is all DeviceAssignmentProto uses)."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        else:
            raise ValueError(f"unexpected protobuf wire type {wire}")
        yield num, wire, value


def _parse_device_assignment(buf: bytes) -> tuple[tuple[int, ...], ...]:
    """DeviceAssignmentProto: replica_count=1, computation_count=2, and
    computation_devices=3 (one per computation, each with replica_device_ids=1)."""
    replicas, computations, columns = 1, 1, []
    for num, wire, value in _fields(buf):
        if num == 1:
            replicas = value
        elif num == 2:
            computations = value
        elif num == 3:
            columns.append(_device_ids(value))
    assert len(columns) == computations, (columns, computations)
    return tuple(tuple(col[r] for col in columns) for r in range(replicas))


def _device_ids(buf: bytes) -> list[int]:
    ids = []
    for num, wire, value in _fields(buf):
        if num != 1:
            continue
        if wire == 0:
            ids.append(value)
        else:                       # packed repeated int64
            i = 0
            while i < len(value):
                v, i = _varint(value, i)
                ids.append(v)
    return ids


def serialize_device_assignment(assignment: tuple[tuple[int, ...], ...]) -> bytes:
    import numpy as np
    from jaxlib import xla_client as xc
    return xc.DeviceAssignment.create(np.array(assignment, dtype=np.int64)).serialize()
