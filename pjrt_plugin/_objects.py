"""C-side wrappers of runtime objects: what each PJRT handle points to.

Everything an infallible getter returns is computed once here, when the wrapper is
made, so the getters only copy addresses and numbers. The one exception is the cost
analysis (it runs the program once on the simulator), made on first request.
"""
from __future__ import annotations

import ctypes
import math


from . import _c_api as C
from . import _dtypes
from ._native import TAGS
from ._handles import HANDLES
from ._mem import Keep, set_ptr


def named_values(keep: Keep, values: dict) -> tuple[int, int]:
    """A PJRT_NamedValue array for a dict of str/int/float/bool/list-of-int."""
    arr = (C.PJRT_NamedValue * max(1, len(values)))()
    for nv, (key, value) in zip(arr, values.items()):
        nv.struct_size = C.struct_size(C.PJRT_NamedValue)
        address, nv.name_size = keep.bytes(key)
        set_ptr(nv, "name", address)
        if isinstance(value, bool):
            nv.type, nv.bool_value, nv.value_size = C.PJRT_NamedValue_Type.kBool, value, 1
        elif isinstance(value, int):
            nv.type, nv.int64_value, nv.value_size = C.PJRT_NamedValue_Type.kInt64, value, 1
        elif isinstance(value, float):
            nv.type, nv.float_value, nv.value_size = C.PJRT_NamedValue_Type.kFloat, value, 1
        elif isinstance(value, (list, tuple)):
            nv.type = C.PJRT_NamedValue_Type.kInt64List
            ctypes.c_void_p.from_address(
                ctypes.addressof(nv) + _union_offset()).value = keep.array(ctypes.c_int64, value)
            nv.value_size = len(value)
        else:
            address, size = keep.bytes(str(value))
            nv.type, nv.value_size = C.PJRT_NamedValue_Type.kString, size
            ctypes.c_void_p.from_address(ctypes.addressof(nv) + _union_offset()).value = address
    return keep.obj(arr), len(values)


def _union_offset() -> int:
    return C.PJRT_NamedValue.value_size.offset - 8


def read_named_values(address: int, n: int) -> dict:
    out = {}
    for i in range(n):
        nv = C.PJRT_NamedValue.from_address(address + i * ctypes.sizeof(C.PJRT_NamedValue))
        key = ctypes.string_at(ctypes.c_void_p.from_buffer(nv, C.PJRT_NamedValue.name.offset)
                               .value, nv.name_size).decode()
        payload = ctypes.addressof(nv) + _union_offset()
        t = nv.type
        if t == C.PJRT_NamedValue_Type.kString:
            out[key] = ctypes.string_at(ctypes.c_void_p.from_address(payload).value,
                                        nv.value_size).decode()
        elif t == C.PJRT_NamedValue_Type.kInt64:
            out[key] = ctypes.c_int64.from_address(payload).value
        elif t == C.PJRT_NamedValue_Type.kInt64List:
            ptr = ctypes.c_void_p.from_address(payload).value
            out[key] = list((ctypes.c_int64 * nv.value_size).from_address(ptr)) if ptr else []
        elif t == C.PJRT_NamedValue_Type.kFloat:
            out[key] = ctypes.c_float.from_address(payload).value
        elif t == C.PJRT_NamedValue_Type.kBool:
            out[key] = ctypes.c_bool.from_address(payload).value
    return out


class CMemory:
    def __init__(self, memory, client: "CClient"):
        self.rt = memory
        self.keep = Keep()
        self.kind = self.keep.bytes(memory.kind)
        self.debug_string = self.keep.bytes(memory.debug_string)
        self.to_string = self.keep.bytes(memory.to_string)
        # vtable NULL (no user-data support); MEMORY_WORDS: C answers PJRT_Memory_Kind
        self.handle = HANDLES.stable(self, 0, (TAGS["memory"], *self.kind))
        self.client = client
        self.devices = (0, 0)                   # filled by CClient once devices exist


class CDevice:
    def __init__(self, device, client: "CClient"):
        self.rt = device
        self.client = client
        self.keep = Keep()
        self.kind = self.keep.bytes(device.kind)
        self.debug_string = self.keep.bytes(device.debug_string)
        self.to_string = self.keep.bytes(device.to_string)
        self.attributes = named_values(self.keep, device.attributes)
        self.handle = HANDLES.stable(self)
        self.description = HANDLES.stable(CDeviceDescription(self))
        self.memory = client.memory_of[id(device.memory)]
        self.memories = (self.keep.pointers([self.memory.handle]), 1)
        self.buffer_words = (self.handle, self.memory.handle)    # BUFFER_WORDS' device, memory


class CDeviceDescription:
    def __init__(self, device: CDevice):
        self.device = device


class CClient:
    def __init__(self, runtime_client):
        self.rt = runtime_client
        self.keep = Keep()
        self.platform_name = self.keep.bytes(runtime_client.platform_name)
        self.platform_version = self.keep.bytes(runtime_client.platform_version)
        self.memory_of = {id(m): CMemory(m, self) for m in runtime_client.memories}
        self.devices = [CDevice(d, self) for d in runtime_client.devices]
        self.device_of = {id(d.rt): d for d in self.devices}
        for d in self.devices:
            d.memory.devices = (d.memory.keep.pointers([d.handle]), 1)
        self.device_array = (self.keep.pointers(d.handle for d in self.devices), len(self.devices))
        local = [d for d in self.devices if d.rt.addressable]
        self.local_device_array = (self.keep.pointers(d.handle for d in local), len(local))
        mems = [d.memory.handle for d in local]
        self.memory_array = (self.keep.pointers(mems), len(mems))
        self.handle = HANDLES.new(self)

    def cdevice(self, device) -> CDevice:
        return self.device_of[id(device)]


# The words of the handle blocks C reads (pjrt_plugin/_native/_answers.c: the same
# order as its B_*, X_* and M_* constants). `failed`: the buffer has an error.
BUFFER_WORDS = ("vtable", "tag", "type", "dims", "num_dims", "device", "memory", "deleted",
                "failed")
EXECUTABLE_WORDS = ("vtable", "tag", "num_replicas", "num_partitions", "num_outputs")
MEMORY_WORDS = ("vtable", "tag", "kind", "kind_size")


_SHAPES = Keep()            # C arrays of dims and layouts, shared by buffers of a shape
_SHAPE_FACTS: dict[tuple, tuple] = {}
_MAX_SHAPES = 1 << 16
_TAG_BUFFER = TAGS["buffer"]


def _shape_facts(shape: tuple[int, ...], dtype: str) -> tuple:
    """((dims address, rank), (minor_to_major address, rank), keep, PJRT element type)
    of a shape and dtype: C reads the arrays only, so every buffer of the shape shares
    one copy (made once: a ctypes array costs microseconds, and an execution makes one
    buffer per output)."""
    got = _SHAPE_FACTS.get((shape, dtype))
    if got is None:
        shape = tuple(int(d) for d in shape)
        keep = _SHAPES if len(_SHAPE_FACTS) < _MAX_SHAPES else Keep()
        # Dense row-major: minor_to_major = (rank-1, ..., 0), no tiles.
        got = ((keep.array(ctypes.c_int64, shape), len(shape)),
               (keep.array(ctypes.c_int64, range(len(shape) - 1, -1, -1)), len(shape)), keep,
               _dtypes.to_pjrt(dtype))
        if keep is _SHAPES:
            _SHAPE_FACTS[shape, dtype] = got
    return got


class CBuffer:
    def __init__(self, buffer, client: CClient):
        self.rt = buffer
        self.client = client
        self.dims, self.minor_to_major, self.keep, self.element_type = _shape_facts(
            buffer.shape, buffer.dtype)

    @property
    def device(self) -> CDevice:
        return self.client.cdevice(self.rt.device)

    def new_handle(self) -> int:
        """A handle whose block holds this buffer's infallible answers (BUFFER_WORDS)."""
        rt = self.rt
        device = self.client.device_of[id(rt.device)]
        return HANDLES.new(self, 0, (_TAG_BUFFER, self.element_type, *self.dims,
                                     *device.buffer_words, int(rt.is_deleted),
                                     int(rt.error is not None)))


def mark_deleted(buffer_handle: int) -> None:
    """Sets the `deleted` word of a buffer's handle block."""
    word = BUFFER_WORDS.index("deleted")
    ctypes.c_void_p.from_address(buffer_handle + word * ctypes.sizeof(ctypes.c_void_p)
                                 ).value = 1


class CEvent:
    """All work is synchronous in the simulator: events are born ready."""

    def __init__(self, error: BaseException | None = None):
        self.error = error


class CExecutable:
    """What PJRT_Executable points to: the compiled program's static description."""

    def __init__(self, executable, client: CClient):
        self.rt = executable
        self.client = client
        self.keep = k = Keep()
        self.serialized = None           # (address, size): made on first request
        self._mlir: bytes | None = None
        self.name = k.bytes(executable.name)
        outs = executable.output_types
        self.output_types = (k.array(ctypes.c_int, [_dtypes.to_pjrt(t.dtype) for t in outs]),
                             len(outs))
        dims = [d for t in outs for d in t.shape]
        self.output_dims = (k.array(ctypes.c_int64, dims),
                            k.array(ctypes.c_size_t, [len(t.shape) for t in outs]), len(outs))
        kinds = [k.bytes("device") for _ in outs]
        self.memory_kinds = (k.pointers(a for a, _ in kinds),
                             k.array(ctypes.c_size_t, (n for _, n in kinds)), len(outs))
        params = executable.param_types
        pkinds = [k.bytes("device") for _ in params]
        self.param_memory_kinds = (k.pointers(a for a, _ in pkinds),
                                   k.array(ctypes.c_size_t, (n for _, n in pkinds)), len(params))
        self.mlir_format = k.bytes("mlir")
        self.compile_options = k.bytes(executable.options.raw)
        self.fingerprint = k.bytes(executable.fingerprint)
        self._cost: tuple[int, int] | None = None
        spmd = getattr(executable, "spmd", None)
        if spmd is None:
            self.param_shardings = _replicated_shardings(k, len(params))
            self.output_shardings = _replicated_shardings(k, len(outs))
        else:
            self.param_shardings = _shardings(k, spmd.mesh, spmd.arg_shardings,
                                              spmd.arg_types)
            self.output_shardings = _shardings(k, spmd.mesh, spmd.result_shardings,
                                               spmd.result_types)
        if not outs:
            # A module with no results has one (replicated) sharding, the empty tuple's:
            # XLA's IFRT client requires exactly one (FailedPrecondition otherwise).
            self.output_shardings = _replicated_shardings(k, 1)

    def new_handle(self) -> int:
        """A handle whose block holds the counts C answers (EXECUTABLE_WORDS)."""
        rt = self.rt
        return HANDLES.new(self, 0, (TAGS["executable"], rt.num_replicas, rt.num_partitions,
                                     len(rt.output_types)))

    @property
    def optimized_mlir(self) -> bytes:
        if self._mlir is None:
            self._mlir = self.rt.optimized_mlir.encode()
        return self._mlir

    @property
    def cost(self) -> tuple[int, int]:
        """Cost analysis as named values, made on first request: it includes the
        simulated time, which takes one timing run of the program."""
        if self._cost is None:
            self._cost = named_values(self.keep, self.rt.cost_analysis())
        return self._cost


class CLoadedExecutable:
    def __init__(self, executable, client: CClient):
        self.rt = executable
        self.client = client
        self.keep = Keep()
        devs = [client.cdevice(d) for d in executable.local_devices]
        self.devices = (self.keep.pointers(d.handle for d in devs), len(devs))
        from jax_trn.runtime.compile_options import serialize_device_assignment
        rows = tuple(tuple(d.id for d in executable.devices[r * executable.num_partitions:
                                                             (r + 1) * executable.num_partitions])
                     for r in range(executable.num_replicas))
        self.device_assignment = self.keep.bytes(serialize_device_assignment(rows))
        self.fingerprint = self.keep.bytes(executable.fingerprint)
        # (replica, partition) of each addressable device, in AddressableDevices' order.
        ids = [divmod(i, executable.num_partitions)
               for i, d in enumerate(executable.devices) if d.addressable]
        flat = [x for pair in ids for x in pair]
        self.logical_ids = (self.keep.array(ctypes.c_int, flat), len(ids))
        self.executable = CExecutable(executable, client)
        self.deleted = False


def op_sharding(sharding, mesh, rank: int):
    """An xla OpSharding for a Shardy sharding of a rank-`rank` tensor (partition ids)."""
    from jaxlib import xla_client as xc
    from hlo_passes.sharding import tile_assignment
    proto = xc.OpSharding()
    if sharding is not None and mesh is not None and sharding.unreduced:
        return _unreduced_sharding(proto, sharding, mesh, rank)
    tiled = tile_assignment(sharding, mesh, rank)
    if tiled is None:
        proto.type = xc.OpSharding.Type.REPLICATED
        return proto
    dims, devices, replicate_last = tiled
    proto.type = xc.OpSharding.Type.OTHER
    proto.tile_assignment_dimensions = dims
    proto.tile_assignment_devices = devices
    proto.replicate_on_last_tile_dim = replicate_last
    return proto


def _unreduced_sharding(proto, sharding, mesh, rank: int):
    """XLA's form of a sharding with unreduced axes (JAX's partial sums): the tiled
    dims, then the unreduced axes as one UNREDUCED subgroup dim, then the remaining
    axes as a REPLICATED one; unreduced over every axis is type UNREDUCED."""
    from jaxlib import xla_client as xc
    dims = list(sharding.dims) + [()] * (rank - len(sharding.dims))
    counts = [math.prod(mesh.axis_size(a) for a in axes) for axes in dims]
    unreduced = tuple(sharding.unreduced)
    n_u = math.prod(mesh.axis_size(a) for a in unreduced)
    n_r = mesh.size // (math.prod(counts) * n_u)
    kind = xc.OpSharding.Type
    if not any(dims) and n_r == 1:
        proto.type = kind.UNREDUCED
        return proto
    tiles: dict[tuple, list[int]] = {}
    parts = mesh.partitions()
    for pos in range(mesh.size):
        key = (*(mesh.block_index(pos, axes) for axes in dims),
               mesh.block_index(pos, unreduced))
        tiles.setdefault(key, []).append(parts[pos])
    proto.type = kind.OTHER
    proto.tile_assignment_dimensions = counts + [n_u] + ([n_r] if n_r > 1 else [])
    proto.tile_assignment_devices = [p for key in sorted(tiles) for p in tiles[key]]
    proto.last_tile_dims = [kind.UNREDUCED] + ([kind.REPLICATED] if n_r > 1 else [])
    return proto


def _shardings(keep: Keep, mesh, shardings, types) -> tuple[int, int, int]:
    data = [keep.bytes(op_sharding(s, mesh, len(t.shape)).SerializeToString())
            for s, t in zip(shardings, types)]
    return (keep.pointers(a for a, _ in data), keep.array(ctypes.c_size_t, (s for _, s in data)),
            len(data))


def _replicated_shardings(keep: Keep, n: int) -> tuple[int, int, int]:
    from jaxlib import xla_client as xc
    proto = xc.OpSharding()
    proto.type = xc.OpSharding.Type.REPLICATED
    data = [keep.bytes(proto.SerializeToString()) for _ in range(n)]
    return (keep.pointers(a for a, _ in data), keep.array(ctypes.c_size_t, (s for _, s in data)), n)
