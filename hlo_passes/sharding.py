"""Shardy's sharding attributes as Python data, and the device arithmetic behind them.

The importer keeps `sdy` attributes as their MLIR text (the Python bindings expose the
sharding attribute but not the collectives' axis lists); this module parses that text:

    #sdy.sharding<@mesh, [{"x"}, {"y", "x":(2)2}, {}], replicated={"z"}>   TensorSharding
    #sdy.sharding_per_value<[<@mesh, [...]>, ...]>                          [TensorSharding]
    #sdy<list_of_axis_ref_lists[{"x"}, {}]>                                 per-dim axes
    #sdy<axis_ref_list{"y"}>                                                axes
    #sdy<all_to_all_param_list[{"x"}: 0->1]>                                [AllToAllParam]

A `Mesh` is the named axes of an `sdy.mesh` (row-major: the first axis is the most
major) and, optionally, its `device_ids` (mesh position -> partition id; by default the
position itself). A sub-axis `"x":(p)s` is the part of axis x of size s whose more-major
parts multiply to p. A tensor dimension sharded on axes (a1, a2, ...) is split into
prod(sizes) blocks, a1 the most major; a device holds block
`((c(a1) * |a2|) + c(a2)) * ...` where c(a) is the device's coordinate on a.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np


class ShardingError(ValueError):
    pass


@dataclass(frozen=True)
class AxisRef:
    name: str
    pre_size: int = 1           # product of the more-major sub-axes of `name`
    size: int | None = None     # None: the whole axis

    def __str__(self) -> str:
        sub = f":({self.pre_size}){self.size}" if self.size is not None else ""
        return f'"{self.name}"{sub}'


@dataclass(frozen=True)
class TensorSharding:
    mesh: str
    dims: tuple[tuple[AxisRef, ...], ...]
    replicated: tuple[AxisRef, ...] = ()
    unreduced: tuple[AxisRef, ...] = ()

    def __str__(self) -> str:
        dims = ", ".join("{" + ", ".join(map(str, d)) + "}" for d in self.dims)
        return f"<@{self.mesh}, [{dims}]>"

    @property
    def is_replicated(self) -> bool:
        return not any(self.dims)

    def sharded_dims(self) -> list[int]:
        return [i for i, d in enumerate(self.dims) if d]


@dataclass(frozen=True)
class AllToAllParam:
    axes: tuple[AxisRef, ...]
    src_dim: int
    tgt_dim: int


@dataclass(frozen=True)
class Mesh:
    name: str
    axes: tuple[tuple[str, int], ...]
    device_ids: tuple[int, ...] | None = None

    @property
    def size(self) -> int:
        return math.prod(s for _, s in self.axes)

    def axis_size(self, ref: AxisRef) -> int:
        if ref.size is not None:
            return ref.size
        return self._full(ref.name)

    def _full(self, name: str) -> int:
        for n, s in self.axes:
            if n == name:
                return s
        raise ShardingError(f"mesh @{self.name} has no axis {name!r} (axes "
                            f"{[n for n, _ in self.axes]})")

    def partitions(self) -> list[int]:
        """Partition id of each mesh position (row-major)."""
        return list(self.device_ids) if self.device_ids else list(range(self.size))

    def coordinate(self, position: int, ref: AxisRef) -> int:
        """The coordinate of mesh `position` on axis (or sub-axis) `ref`."""
        stride = 1
        found = False
        for n, s in reversed(self.axes):
            if n == ref.name:
                found = True
                break
            stride *= s
        if not found:
            self._full(ref.name)
        c = (position // stride) % self._full(ref.name)
        if ref.size is None:
            return c
        minor = self._full(ref.name) // (ref.pre_size * ref.size)
        return (c // minor) % ref.size

    def block_index(self, position: int, axes: tuple[AxisRef, ...]) -> int:
        """Which of prod(|a|) blocks a dimension sharded on `axes` puts at `position`."""
        idx = 0
        for a in axes:
            idx = idx * self.axis_size(a) + self.coordinate(position, a)
        return idx

    def groups(self, axes: tuple[AxisRef, ...]) -> list[list[int]]:
        """Partition ids grouped by equal coordinates off `axes`, each group ordered by
        its block index on `axes` (the replica groups of a collective over `axes`)."""
        n = math.prod(self.axis_size(a) for a in axes)
        by_rest: dict[tuple, list[int | None]] = {}
        parts = self.partitions()
        for pos in range(self.size):
            rest = self._rest_key(pos, axes)
            group = by_rest.setdefault(rest, [None] * n)
            group[self.block_index(pos, axes)] = parts[pos]
        groups = list(by_rest.values())
        if any(p is None for g in groups for p in g):
            raise ShardingError(f"axes {[str(a) for a in axes]} do not tile mesh @{self.name}")
        return groups  # type: ignore[return-value]

    def _rest_key(self, pos: int, axes: tuple[AxisRef, ...]) -> tuple:
        """The position's coordinates on everything outside `axes`, at the finest
        granularity: each axis split into its elementary sub-axes."""
        key = []
        for name, size in self.axes:
            cuts = _cuts(name, size, axes)
            c = self.coordinate(pos, AxisRef(name))
            for pre, sub in cuts:
                if not any(a.name == name and _covers(a, pre, sub, size) for a in axes):
                    key.append((c // (size // (pre * sub))) % sub)
        return tuple(key)


def _cuts(name: str, size: int, axes: tuple[AxisRef, ...]) -> list[tuple[int, int]]:
    """Splits axis `name` into (pre_size, size) parts at every boundary `axes` use."""
    bounds = {1, size}
    for a in axes:
        if a.name == name and a.size is not None:
            bounds.update((a.pre_size, a.pre_size * a.size))
    edges = sorted(bounds)
    return [(lo, hi // lo) for lo, hi in zip(edges, edges[1:])]


def _covers(a: AxisRef, pre: int, sub: int, size: int) -> bool:
    lo, hi = (1, size) if a.size is None else (a.pre_size, a.pre_size * a.size)
    return lo <= pre and pre * sub <= hi


def shard_count(mesh: Mesh, axes: tuple[AxisRef, ...]) -> int:
    """How many blocks a dimension sharded on `axes` is cut into."""
    return math.prod(mesh.axis_size(a) for a in axes)


def local_shape(shape: tuple[int, ...], sharding: TensorSharding | None,
                mesh: Mesh | None) -> tuple[int, ...]:
    """The per-device shape of a tensor of `shape` under `sharding`: ceil(d / shards)
    on each sharded dimension, as XLA's SPMD partitioner pads a dimension that does not
    divide (the last blocks hold padding, or nothing but padding when d < shards)."""
    if sharding is None or mesh is None or not sharding.dims:
        return tuple(shape)
    if len(sharding.dims) != len(shape):
        raise ShardingError(f"sharding {sharding} has {len(sharding.dims)} dims for a "
                            f"rank-{len(shape)} tensor")
    return tuple(-(-d // shard_count(mesh, axes)) for d, axes in zip(shape, sharding.dims))


def padded_dims(shape: tuple[int, ...], sharding: TensorSharding | None,
                mesh: Mesh | None) -> list[int]:
    """The dimensions whose per-device blocks carry padding (the size does not divide
    into the dimension's shards)."""
    if sharding is None or mesh is None:
        return []
    return [i for i, (d, axes) in enumerate(zip(shape, sharding.dims))
            if axes and d % shard_count(mesh, axes)]


def even_prefix(shape: tuple[int, ...], sharding: TensorSharding | None,
                mesh: Mesh | None) -> TensorSharding | None:
    """`sharding` with each dimension cut to the longest prefix of its axes that divides
    it evenly: the sharding XLA gives a parameter or result whose propagated sharding
    does not divide (JAX refuses uneven shardings at a program's boundary)."""
    if not padded_dims(shape, sharding, mesh):
        return sharding
    dims = []
    for d, axes in zip(shape, sharding.dims):
        keep = len(axes)
        while keep and d % shard_count(mesh, axes[:keep]):
            keep -= 1
        dims.append(tuple(axes[:keep]))
    return TensorSharding(sharding.mesh, tuple(dims), sharding.replicated,
                          sharding.unreduced)


# --- axis lists with sub-axes ------------------------------------------------------------
#
# Shardy writes the same split of a dimension in more than one way: {"x"} on an axis of
# size 4 is {"x":(1)2, "x":(2)2}, and once a dimension does not divide into 4, its
# propagation shards it on the part of the axis that divides ({"x":(1)2}). Comparing
# axis lists element by element then takes a refinement for a different sharding
# ("cannot slice ... {"x":(1)2} to {"x"}"). These helpers compare them as sequences of
# pieces (name, lo, hi): the part of axis `name` whose more-major parts multiply to
# `lo`, of size hi / lo.


def _pieces(mesh: Mesh, axes: tuple[AxisRef, ...]) -> list[list]:
    out = []
    for a in axes:
        lo = a.pre_size
        out.append([a.name, lo, lo * mesh.axis_size(a)])
    return out


def _refs(mesh: Mesh, pieces) -> tuple[AxisRef, ...]:
    """Pieces back to AxisRefs, adjacent parts of one axis merged (Shardy's canonical
    form: a whole axis is written without a sub-axis)."""
    merged: list[list] = []
    for name, lo, hi in pieces:
        if merged and merged[-1][0] == name and merged[-1][2] == lo:
            merged[-1][2] = hi
        else:
            merged.append([name, lo, hi])
    return tuple(AxisRef(n) if (lo, hi) == (1, mesh._full(n)) else AxisRef(n, lo, hi // lo)
                 for n, lo, hi in merged)


def axes_after(mesh: Mesh, axes: tuple[AxisRef, ...],
               prefix: tuple[AxisRef, ...]) -> tuple[AxisRef, ...] | None:
    """The axes `axes` adds after `prefix`, or None if `prefix` does not start it:
    axes_after({"x"}, {"x":(1)2}) = {"x":(2)2}."""
    rest, head = _pieces(mesh, axes), _pieces(mesh, prefix)
    for name, lo, hi in head:
        if not rest or rest[0][0] != name or rest[0][1] != lo or rest[0][2] < hi:
            return None
        if rest[0][2] == hi:
            rest.pop(0)
        else:
            rest[0] = [name, hi, rest[0][2]]
    return _refs(mesh, rest)


def axes_before(mesh: Mesh, axes: tuple[AxisRef, ...],
                suffix: tuple[AxisRef, ...]) -> tuple[AxisRef, ...] | None:
    """The axes `axes` keeps once `suffix` (its minor end) is taken off, or None if it
    does not end so: axes_before({"x"}, {"x":(2)2}) = {"x":(1)2}."""
    rest, tail = _pieces(mesh, axes), _pieces(mesh, suffix)
    for name, lo, hi in reversed(tail):
        if not rest or rest[-1][0] != name or rest[-1][2] != hi or rest[-1][1] > lo:
            return None
        if rest[-1][1] == lo:
            rest.pop()
        else:
            rest[-1] = [name, rest[-1][1], lo]
    return _refs(mesh, rest)


def join_axes(mesh: Mesh, major: tuple[AxisRef, ...],
              minor: tuple[AxisRef, ...]) -> tuple[AxisRef, ...]:
    """`major` then `minor`, written canonically ({"x":(1)2} + {"x":(2)2} = {"x"})."""
    return _refs(mesh, _pieces(mesh, major) + _pieces(mesh, minor))


def block_offsets(shape: tuple[int, ...], sharding: TensorSharding, mesh: Mesh) -> np.ndarray:
    """[num_partitions, rank] int32: where each partition's block starts in the tensor
    (past its end for a block of padding only)."""
    local = local_shape(shape, sharding, mesh)
    parts = mesh.partitions()
    table = np.zeros((len(parts), len(shape)), np.int32)
    for pos, pid in enumerate(parts):
        for i, axes in enumerate(sharding.dims):
            table[pid, i] = mesh.block_index(pos, axes) * local[i]
    return table


def valid_counts(shape: tuple[int, ...], sharding: TensorSharding, mesh: Mesh) -> np.ndarray:
    """[num_partitions, rank] int32: how many leading elements of each partition's block
    are data, not padding, along each dimension."""
    local = np.asarray(local_shape(shape, sharding, mesh), np.int64)
    ends = np.asarray(shape, np.int64) - block_offsets(shape, sharding, mesh)
    return np.clip(ends, 0, local).astype(np.int32)


# --- parsing ---------------------------------------------------------------------------

_AXIS = re.compile(r'"((?:[^"\\]|\\.)*)"(?::\((\d+)\)(\d+))?')


def parse_axes(text: str) -> tuple[AxisRef, ...]:
    """`"x", "y":(2)2` (inside braces or not) -> AxisRefs; `?` (open) is ignored."""
    return tuple(AxisRef(m.group(1), int(m.group(2)) if m.group(2) else 1,
                         int(m.group(3)) if m.group(3) else None)
                 for m in _AXIS.finditer(text))


def _braces(text: str) -> list[str]:
    """The contents of each top-level {...} in `text`."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "{":
            if depth == 0:
                start = i + 1
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                out.append(text[start:i])
    return out


def _bracket_body(text: str) -> str:
    """The text inside the first top-level [...]."""
    start = text.index("[")
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "[":
            depth += 1
        elif text[i] == "]":
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
    raise ShardingError(f"unbalanced brackets in {text!r}")


_SHARDING = re.compile(r"<\s*@([\w.$-]+)\s*,\s*\[")


def _parse_one(text: str) -> TensorSharding:
    m = _SHARDING.search(text)
    if not m:
        raise ShardingError(f"cannot read the sharding {text!r} (only meshes named by "
                            "symbol are supported)")
    dims_text = _bracket_body(text[m.end() - 1:])
    dims = tuple(parse_axes(d) for d in _braces(dims_text))
    rest = text[m.end() - 1 + len(dims_text) + 2:]
    replicated = unreduced = ()
    for key, body in re.findall(r"(replicated|unreduced)\s*=\s*\{([^}]*)\}", rest):
        if key == "replicated":
            replicated = parse_axes(body)
        else:
            unreduced = parse_axes(body)
    return TensorSharding(m.group(1), dims, replicated, unreduced)


def parse_sharding(text: str | None) -> TensorSharding | None:
    """`#sdy.sharding<@mesh, [...]>` or `<@mesh, [...]>` -> TensorSharding."""
    if not text:
        return None
    body = text.removeprefix("#sdy.sharding")
    return _parse_one(body)


def parse_per_value(text: str | None) -> list[TensorSharding] | None:
    """`#sdy.sharding_per_value<[<@mesh, [...]>, ...]>` -> one TensorSharding per result."""
    if not text:
        return None
    body = _bracket_body(text)
    out, depth, start = [], 0, None
    for i, ch in enumerate(body):
        if ch == "<":
            if depth == 0:
                start = i
            depth += 1
        elif ch == ">":
            depth -= 1
            if depth == 0:
                out.append(_parse_one(body[start:i + 1]))
    return out


def parse_axis_lists(text: str) -> tuple[tuple[AxisRef, ...], ...]:
    """`#sdy<list_of_axis_ref_lists[{"x"}, {}]>` -> per-dim axes."""
    return tuple(parse_axes(b) for b in _braces(_bracket_body(text)))


def parse_axis_list(text: str) -> tuple[AxisRef, ...]:
    """`#sdy<axis_ref_list{"y"}>` -> axes."""
    return parse_axes(text)


_A2A = re.compile(r"\{([^}]*)\}\s*:\s*(\d+)\s*->\s*(\d+)")


def parse_all_to_all_params(text: str) -> list[AllToAllParam]:
    """`#sdy<all_to_all_param_list[{"x"}: 0->1, ...]>` -> params."""
    return [AllToAllParam(parse_axes(a), int(s), int(t)) for a, s, t in _A2A.findall(text)]


def tile_assignment(sharding: TensorSharding | None, mesh: Mesh | None,
                    rank: int) -> tuple[list[int], list[int], bool] | None:
    """XLA's tiled form of `sharding` (as in an OpSharding): tile dimensions, the
    partition ids in tile order, and whether the last tile dimension is replication.
    None for a replicated tensor."""
    if sharding is None or mesh is None or sharding.is_replicated:
        return None
    counts = [math.prod(mesh.axis_size(a) for a in axes) for axes in sharding.dims]
    copies = mesh.size // math.prod(counts)
    tiles: dict[tuple[int, ...], list[int]] = {}
    parts = mesh.partitions()
    for pos in range(mesh.size):
        key = tuple(mesh.block_index(pos, axes) for axes in sharding.dims)
        tiles.setdefault(key, []).append(parts[pos])
    devices = [p for key in sorted(tiles) for p in tiles[key]]
    dims = counts + ([copies] if copies > 1 else [])
    return dims, devices, copies > 1
