"""Semaphore insertion: the waits that make a program-ordered kernel correct (§2.1).

Lowering emits instructions in program order without waits. `insert_semaphores`
finds, for every instruction, the earlier instructions on *other* queues it conflicts
with (read-after-write, write-after-read, write-after-write) and sets `waits` to
`((queue, count), ...)`: "wait until that queue has completed >= count instructions"
(semaphores count each queue's completed instructions, §2.1 [NKI-PERF]). Same-queue
order is already guaranteed by the in-order queue. One wait per queue, the strongest.

Regions: SBUF/PSUM tiles are partition range x byte range; a DRAM access pattern is
its tensor and the byte range of the elements [min, max] it touches (conservative for
strided patterns). Accesses are indexed by region in page buckets, so the pass is linear in
the number of instructions for ordinary kernels.

Only the latest accesses per exact region are kept: a write W to region R waited for
every earlier conflicting access, so anyone who later waits for W transitively waits
for them too (waits are transitive through completion order).
"""
from __future__ import annotations

from dataclasses import fields

from . import dtypes as _dt
from .isa import DramAP, Instr, Tile
from .memory import ap_bounds

__all__ = ["insert_semaphores", "accesses", "written_tiles"]

_WRITE_FIELDS = ("reduce_res",)     # and every field whose name starts with "dst"
_ON_CHIP_PAGE = 9          # 512-byte pages of a partition's bytes
_DRAM_MIN_PAGE = 12        # DRAM pages of >= 4 KiB
_WIDE_PAGES = 64           # wider accesses are checked against everything


def _region(v) -> tuple:
    """(space, p0, p1, lo, hi): partitions [p0, p1) x bytes [lo, hi)."""
    if isinstance(v, Tile):
        return (v.mem, v.start_partition, v.start_partition + v.num_partitions, *v.byte_range)
    lo, hi = ap_bounds(v)
    item = _dt.itemsize(v.dtype)     # bytes: a pattern may view a tensor as another width
    return ("dram:" + v.tensor, 0, 1, lo * item, (hi + 1) * item)


_FIELDS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _operand_fields(cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(read field names, write field names) of an instruction class, cached."""
    if cls not in _FIELDS:
        names = [f.name for f in fields(cls) if f.name not in ("name", "waits")]
        writes = tuple(n for n in names if _writes(n))
        reads = tuple(n for n in names if not _writes(n))
        _FIELDS[cls] = (reads, writes)
    return _FIELDS[cls]


def _writes(field_name: str) -> bool:
    return field_name.startswith("dst") or field_name in _WRITE_FIELDS


def _operands(d: dict, names: tuple[str, ...]) -> list:
    """The Tile / DramAP operands in fields `names` (a field may hold a tuple of them)."""
    out = []
    for n in names:
        v = d[n]
        if isinstance(v, (Tile, DramAP)):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            out.extend(x for x in v if isinstance(x, (Tile, DramAP)))
    return out


def accesses(instr: Instr) -> tuple[list[tuple], list[tuple]]:
    """(regions read, regions written) by an instruction."""
    read_names, write_names = _operand_fields(type(instr))
    d = instr.__dict__
    reads = [_region(v) for v in _operands(d, read_names)]
    writes = [_region(v) for v in _operands(d, write_names)]
    return reads, writes


def written_tiles(instr: Instr) -> list[Tile]:
    """The on-chip tiles an instruction writes."""
    names = _operand_fields(type(instr))[1]
    return [v for v in _operands(instr.__dict__, names) if isinstance(v, Tile)]


class _Space:
    """Accesses to one memory (SBUF, PSUM, or one DRAM tensor), bucketed by page."""
    __slots__ = ("shift", "pages", "wide", "writes", "reads")

    def __init__(self, shift: int):
        self.shift = shift
        self.pages: dict[int, set] = {}
        self.wide: set = set()
        self.writes: dict[tuple, dict[str, int]] = {}   # region -> {queue: count}
        self.reads: dict[tuple, dict[str, int]] = {}

    def _pages(self, lo: int, hi: int) -> range | None:
        first, last = lo >> self.shift, (hi - 1) >> self.shift
        return None if last - first >= _WIDE_PAGES else range(first, last + 1)

    def candidates(self, region: tuple) -> set:
        pages = self._pages(region[3], region[4])
        if pages is None:
            return set(self.writes) | set(self.reads)
        found = set(self.wide)
        for p in pages:
            found.update(self.pages.get(p, ()))
        return found

    def register(self, region: tuple) -> None:
        if region in self.writes or region in self.reads:
            return
        pages = self._pages(region[3], region[4])
        if pages is None:
            self.wide.add(region)
            return
        for p in pages:
            self.pages.setdefault(p, set()).add(region)


def _overlap(a: tuple, b: tuple) -> bool:
    return a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]


class _Tracker:
    def __init__(self):
        self.spaces: dict[str, _Space] = {}
        self.counts: dict[str, int] = {}

    def space(self, region: tuple) -> _Space:
        sp = self.spaces.get(region[0])
        if sp is None:
            shift = _ON_CHIP_PAGE
            if region[0].startswith("dram:"):
                shift = max(_DRAM_MIN_PAGE, (region[4] - region[3]).bit_length() - 2)
            sp = self.spaces[region[0]] = _Space(shift)
        return sp

    def conflicts(self, region: tuple, is_write: bool, waits: dict[str, int]) -> None:
        """Fold into `waits` the latest conflicting accesses on each queue."""
        sp = self.space(region)
        tables = (sp.writes, sp.reads) if is_write else (sp.writes,)
        for other in sp.candidates(region):
            if not _overlap(region, other):
                continue
            for table in tables:
                for q, c in table.get(other, {}).items():
                    if waits.get(q, 0) < c:
                        waits[q] = c

    def record(self, region: tuple, is_write: bool, queue: str, count: int) -> None:
        sp = self.space(region)
        sp.register(region)
        if is_write:
            sp.writes[region] = {queue: count}     # earlier accesses are implied
            sp.reads.pop(region, None)
        else:
            sp.reads.setdefault(region, {})[queue] = count


def _with_waits(instr: Instr, waits: dict[str, int]) -> Instr:
    for q, c in instr.waits:
        waits[q] = max(waits.get(q, 0), c)
    new = tuple(sorted(waits.items()))
    if new == instr.waits:
        return instr
    clone = object.__new__(type(instr))       # skip __post_init__: operands unchanged
    clone.__dict__.update(instr.__dict__)
    clone.__dict__["waits"] = new
    return clone


def insert_semaphores(instrs: list[Instr]) -> list[Instr]:
    """The same instructions, each with the semaphore waits it needs."""
    tracker, out = _Tracker(), []
    for instr in instrs:
        queue = instr.queue
        count = tracker.counts.get(queue, 0) + 1
        tracker.counts[queue] = count
        reads, writes = accesses(instr)
        waits: dict[str, int] = {}
        for r in reads:
            tracker.conflicts(r, False, waits)
        for w in writes:
            tracker.conflicts(w, True, waits)
        waits.pop(queue, None)
        for r in reads:
            tracker.record(r, False, queue, count)
        for w in writes:
            tracker.record(w, True, queue, count)
        out.append(_with_waits(instr, waits))
    return out
