"""Semaphore insertion: the waits that make a program-ordered kernel correct (§2.1).

Lowering emits instructions in program order without waits. `insert_semaphores`
finds, for every instruction, the earlier instructions on *other* queues it conflicts
with (read-after-write, write-after-read, write-after-write) and sets `waits` to
`((queue, count), ...)`: "wait until that queue has completed >= count instructions"
(semaphores count each queue's completed instructions, §2.1 [NKI-PERF]). Same-queue
order is already guaranteed by the in-order queue. One wait per queue, the strongest.

Regions: SBUF/PSUM tiles are partition range x byte range; a DRAM access pattern is
its tensor and the byte range of the elements [min, max] it touches (conservative for
strided patterns).

Only the latest accesses per exact region are kept: a write W to region R waited for
every earlier conflicting access, so anyone who later waits for W transitively waits
for them too (waits are transitive through completion order). A wait per queue is the
largest count among that queue's kept accesses that conflict.

Work: accesses are indexed by page (`_Bucket`), and within a page each queue's are met
newest first, so a query stops at each other queue's latest conflicting access. The pass
is linear in the instructions even when many distinct regions overlap -- e.g. a fill's
partition-strided stores, whose conservative spans all overlap one another (before, each
store was checked against every earlier one: 21.6 s to compile `jnp.zeros(2**30)`).
tests/lower/test_semaphores.py holds the definition the waits must match.
"""
from __future__ import annotations

from dataclasses import fields

from . import dtypes as _dt
from .isa import DramAP, Instr, Tile
from .memory import ap_bounds

__all__ = ["insert_semaphores", "accesses", "written_tiles"]

_WRITE_FIELDS = ("reduce_res",)     # and every field whose name starts with "dst"
_ON_CHIP_PAGE = 12         # 4 KiB pages of a partition's bytes (fewer buckets per tile
                           # than 512 B pages; same waits, the index only skips work)
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


class _Bucket:
    """The live accesses of one page (or of a whole space): `(region, queue, is_write)
    -> count`, oldest first (an access recorded again moves to the end). Counts grow
    with each queue's program order, so scanning backwards meets each queue's entries
    newest first: the first that conflicts is that queue's wait, and the scan ends once
    every queue that could matter is settled. Linear in the accesses that overlap the
    query plus the queues present, however many regions share the page."""
    __slots__ = ("entries", "queues", "writers")

    def __init__(self):
        self.entries: dict[tuple, int] = {}
        self.queues: dict[str, int] = {}      # queue -> live entries
        self.writers: dict[str, int] = {}     # queue -> live write entries

    def put(self, key: tuple, count: int) -> None:
        entries = self.entries
        if key in entries:
            del entries[key]                  # moves to the end
        else:
            queue = key[1]
            self.queues[queue] = self.queues.get(queue, 0) + 1
            if key[2]:
                self.writers[queue] = self.writers.get(queue, 0) + 1
        entries[key] = count

    def drop(self, key: tuple) -> None:
        if self.entries.pop(key, None) is None:
            return
        queue = key[1]
        _decrement(self.queues, queue)
        if key[2]:
            _decrement(self.writers, queue)

    def conflicts(self, region: tuple, is_write: bool, waits: dict[str, int],
                  own: str) -> None:
        """Fold into `waits` each other queue's latest access conflicting with
        `region` (writes; reads too if `is_write`)."""
        present = self.queues if is_write else self.writers
        pending = len(present) - (own in present)
        if pending == 0:
            return
        settled = {own}
        for (other, queue, wrote), count in reversed(self.entries.items()):
            if queue in settled or not (wrote or is_write):
                continue
            if count <= waits.get(queue, 0):
                settled.add(queue)             # its older entries cannot raise the wait
            elif _overlap(region, other):
                waits[queue] = count
                settled.add(queue)
            else:
                continue
            pending -= 1
            if pending == 0:
                return


def _decrement(counts: dict[str, int], queue: str) -> None:
    if counts[queue] == 1:
        del counts[queue]
    else:
        counts[queue] -= 1


class _Space:
    """Accesses to one memory (SBUF, PSUM, or one DRAM tensor): the latest write and
    the latest read per queue of each exact region, indexed by page. Regions wider than
    `_WIDE_PAGES` pages go to one `wide` bucket; a wide query reads `every`, a bucket of
    all accesses made when the first one comes (most spaces never see one)."""
    __slots__ = ("shift", "pages", "wide", "every", "writes", "reads")

    def __init__(self, shift: int):
        self.shift = shift
        self.pages: dict[int, _Bucket] = {}
        self.wide = _Bucket()
        self.every: _Bucket | None = None
        self.writes: dict[tuple, tuple[str, int]] = {}      # region -> its last write
        self.reads: dict[tuple, dict[str, int]] = {}        # region -> reads since, by queue

    def _pages(self, lo: int, hi: int) -> range | None:
        first, last = lo >> self.shift, (hi - 1) >> self.shift
        return None if last - first >= _WIDE_PAGES else range(first, last + 1)

    def conflicts(self, region: tuple, is_write: bool, waits: dict[str, int],
                  own: str) -> None:
        pages = self._pages(region[3], region[4])
        if pages is None:
            self._every().conflicts(region, is_write, waits, own)
            return
        if self.wide.entries:
            self.wide.conflicts(region, is_write, waits, own)
        for p in pages:
            bucket = self.pages.get(p)
            if bucket is not None:
                bucket.conflicts(region, is_write, waits, own)

    def record(self, region: tuple, is_write: bool, queue: str, count: int) -> None:
        """A write supersedes every earlier access to its exact region (they are
        implied: it waited for them); a read supersedes its queue's earlier read."""
        stale = []
        if is_write:
            if region in self.writes:
                stale.append((region, self.writes[region][0], True))
            stale += [(region, q, False) for q in self.reads.pop(region, ())]
            self.writes[region] = (queue, count)
        else:
            self.reads.setdefault(region, {})[queue] = count
        key = (region, queue, is_write)
        for bucket in self._buckets(region):
            for old in stale:
                bucket.drop(old)
            bucket.put(key, count)

    def _buckets(self, region: tuple) -> list[_Bucket]:
        pages = self._pages(region[3], region[4])
        if pages is None:
            found = [self._every(), self.wide]
        else:
            found = [self.pages.get(p) or self.pages.setdefault(p, _Bucket()) for p in pages]
            if self.every is not None:
                found.append(self.every)
        return found

    def _every(self) -> _Bucket:
        """The bucket of all live accesses, made from the tables on first use (count
        order keeps each queue's newest last)."""
        if self.every is None:
            live = [((r, q, True), c) for r, (q, c) in self.writes.items()]
            live += [((r, q, False), c) for r, qs in self.reads.items() for q, c in qs.items()]
            self.every = _Bucket()
            for key, count in sorted(live, key=lambda e: e[1]):
                self.every.put(key, count)
        return self.every


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
            tracker.space(r).conflicts(r, False, waits, queue)
        for w in writes:
            tracker.space(w).conflicts(w, True, waits, queue)
        for r in reads:
            tracker.space(r).record(r, False, queue, count)
        for w in writes:
            tracker.space(w).record(w, True, queue, count)
        out.append(_with_waits(instr, waits))
    return out
