"""Loops on chip: a `while` with a static trip count becomes a `hw.program.Loop`.

A host-driven `While` pays, every trip, its cond kernel, a predicate read from HBM on
the control path, a counter-add kernel and the body kernels, each kernel at least two
DMA latencies (~1.3 us each, trainium-hardware.md §2.6). NKI keeps such loops on chip
(`sequential_range` / `fori_loop`, §6.1): the counter in a sequencer register, the
branch on the sequencers (§2.1). `counted` recognises the loops that allow it, the
form `lax.fori_loop` and `lax.scan` produce:

    cond:  compare(i, L) LT                  i a carried int32[], L known at compile time
    body:  ..., i' = add(i, S), return ...   S > 0 known, i read by nothing else

`build` then turns the lowered body into the Loop's kernels: the kernels that only
update the counter and the cond kernels are dropped (the back edge's register add and
branch do their work), and when the body is one kernel (plus the copies that move its
results into the carried buffers) each carry it loads once and stores once with the
same access pattern is kept resident in SBUF (`_resident`): loaded by the Loop's `enter`
kernel, read and updated in place by every trip, stored back by its `exit` kernel.

Anything else runs as today's `While`, or as a Loop whose carries stay in HBM, with the
reason in the step's notes.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hlo_passes import ir
from jax_trn.hw import dtypes as _dt
from jax_trn.hw.isa import (Activation, DmaCopy, DramAP, Memset, TensorCopy, TensorScalar,
                            TensorTensor, Tile)
from jax_trn.hw.program import DramTensor, Kernel, Loop

__all__ = ["Counted", "counted", "build"]

_ALIGN = 64           # bytes: resident carries start on a 64-byte boundary per partition


@dataclass(frozen=True)
class Counted:
    """A while loop's counter: carried value `index`, from `start` while < `limit`,
    plus `step` per trip."""
    index: int
    start: int
    limit: int
    step: int

    @property
    def trips(self) -> int:
        return max(0, -(-(self.limit - self.start) // self.step))

    @property
    def final(self) -> int:
        """The counter after the last trip (a 32-bit register's value)."""
        return int(np.int64(self.start + self.trips * self.step).astype(np.int32))


def _scalar(value) -> int | None:
    if value is None or np.asarray(value).size != 1:
        return None
    return int(np.asarray(value).reshape(-1)[0])


def counted(op: ir.Op, known: Callable[[ir.Value], object],
            hoisted: Callable[[ir.Op], bool]) -> Counted | str:
    """The counter of while `op` (see the module doc), or why it has none. `known(v)`:
    the compile-time value of `v` (defined outside the loop) or None; `hoisted(o)`:
    whether op `o` of a region was lowered before the loop."""
    cond, body = op.regions[0].block, op.regions[1].block
    ops = [o for o in cond.ops[:-1] if not hoisted(o)]
    if len(ops) != 1 or ops[0].kind != "compare" or cond.terminator.operands[0] is not ops[0].results[0]:
        return "its condition is not one compare of a counter with a constant"
    cmp = ops[0]
    if cmp.attrs.get("comparison_direction") != "LT" \
            or cmp.attrs.get("compare_type", "SIGNED") != "SIGNED":
        return "its condition is not a signed `counter < limit`"
    k = next((i for i, a in enumerate(cond.args) if a is cmp.operands[0]), None)
    if k is None or cond.args[k].dtype != "int32" or cond.args[k].shape != ():
        return "its condition does not compare an int32[] loop-carried counter"
    if any(a is cmp.operands[1] for a in cond.args):
        return "its limit is loop-carried"
    start, limit = _scalar(known(op.operands[k])), _scalar(known(cmp.operands[1]))
    if start is None or limit is None:
        return "its trip count depends on data (the counter's start or limit is not a constant)"
    step = _step(body, k, known)
    if isinstance(step, str):
        return step
    return Counted(k, start, limit, step)


def _step(body: ir.Block, k: int, known) -> int | str:
    """The counter's increment per trip, or why the body is no plain count."""
    arg, ret = body.args[k], body.terminator.operands[k]
    add = next((o for o in body.ops[:-1] if any(r is ret for r in o.results)), None)
    if add is None or add.kind != "add" or not any(v is arg for v in add.operands):
        return "its body does not add a constant to the counter"
    other = add.operands[1] if add.operands[0] is arg else add.operands[0]
    step = _scalar(known(other))
    if step is None or step <= 0:
        return "its counter's step is not a positive constant"
    readers = [o for o in ir.walk(body) if o is not add and any(v is arg for v in o.operands)]
    uses = sum(v is ret for o in ir.walk(body) for v in o.operands)
    if readers or uses != 1:
        return "its body reads the counter (an index or a value): the counter stays in HBM"
    return step


# --- the Loop ------------------------------------------------------------------------------

def build(name: str, count: Counted, carried: list[DramTensor], body: list,
          sbuf_bytes: int, ops: list[str]) -> Loop | str:
    """The on-chip Loop of a counted while whose lowered body steps are `body`, or why
    it cannot be one. `sbuf_bytes`: the SBUF bytes per partition a kernel may use."""
    if not all(isinstance(s, Kernel) for s in body):
        kinds = sorted({type(s).__name__ for s in body if not isinstance(s, Kernel)})
        return (f"its body has {', '.join(kinds)} steps (control flow, collectives and host "
                f"callbacks run between kernels)")
    counter = carried[count.index]
    kernels = [k for k in body if not _writes_only(k, counter.name)]
    if any(counter.name in k.dram for k in kernels):
        return "a body kernel reads the counter's buffer"
    res = _resident(name, kernels, carried, counter, sbuf_bytes)
    at = res.end if res.names else 0        # the counter's tile: after resident carries
    exit_ = Kernel(f"{name}/exit", res.exit + _write_counter(name, counter, count.final, at),
                   {**res.exit_dram, counter.name: counter}, sbuf_bytes=at + 4,
                   ops=list(ops))
    enter = [Kernel(f"{name}/enter", res.enter, res.enter_dram, sbuf_bytes=res.end,
                    ops=list(ops))] if res.enter else []
    return Loop(name, count.trips, enter, res.kernels, [exit_], carried,
                counter=f"r.{name}", counter_carry=count.index, start=count.start,
                step=count.step,
                resident=res.names, ops=list(ops), notes=res.notes)


def _writes_only(k: Kernel, name: str) -> bool:
    """Whether kernel `k` writes DRAM tensor `name` and no other DRAM tensor."""
    written = {o.tensor for ins in k.instructions for o in ins.outputs()
               if isinstance(o, DramAP)}
    return written == {name}


def _write_counter(name: str, counter: DramTensor, value: int, at: int) -> list:
    """The counter's final value into its HBM buffer (the loop's result)."""
    tile = Tile("sbuf", 0, 1, at, (1,), "int32")
    return [Memset(name=f"{name}/exit/memset", dst=tile, value=value, engine="gpsimd"),
            DmaCopy(name=f"{name}/exit/dma_copy", waits=(("gpsimd", 1),),
                    dst=DramAP(counter.name, 0, ((1, 1), (1, 1)), "int32"), src=tile,
                    dma_queue=0)]


@dataclass
class _Residency:
    kernels: list[Kernel]                  # the per-trip body kernels
    enter: list = dataclasses.field(default_factory=list)
    exit: list = dataclasses.field(default_factory=list)
    enter_dram: dict = dataclasses.field(default_factory=dict)
    exit_dram: dict = dataclasses.field(default_factory=dict)
    names: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    end: int = 0                           # SBUF bytes per partition the loop uses


def _resident(name, kernels, carried, counter, sbuf_bytes) -> _Residency:
    """Keeps the carries of a one-kernel body in SBUF where it can (module doc)."""
    compute = [k for k in kernels if _dram_copy(k) is None]
    if len(compute) != 1:
        return _Residency(kernels, notes=[
            f"on chip; carries stay in HBM: the body is {len(compute)} kernels, not one"])
    kernel = compute[0]
    plans, notes, base = _plans(kernels, kernel, carried, counter, sbuf_bytes)
    if not plans:
        return _Residency(kernels, notes=["on chip; no carry resident in SBUF"] + notes,
                          end=kernel.sbuf_bytes)
    try:
        body = _rewrite(kernel, plans, base)
    except _Partial as e:
        return _Residency(kernels, end=kernel.sbuf_bytes, notes=[
            f"on chip; no carry resident in SBUF: tile {e.args[0]} overlaps a carry's "
            f"tile in part"] + notes)
    folded = {id(p["copy"]) for p in plans if p["copy"] is not None}
    res = _Residency([body if k is kernel else k for k in kernels if id(k) not in folded],
                     end=base)
    for p in plans:
        _enter_exit(res, name, p)
    res.notes = [f"on chip; resident in SBUF: {', '.join(res.names)}"] + notes
    return res


def _plans(kernels, kernel, carried, counter, sbuf_bytes):
    """(the carries `kernel` keeps resident, notes on the others, the SBUF end)."""
    copies = [k for k in kernels if _dram_copy(k) is not None]
    base = _round_up(kernel.sbuf_bytes)
    plans, notes = [], []
    for c in carried:
        if c is counter:
            continue
        copy = next((k for k in copies if _dram_copy(k)[1] == c.name
                     and _dram_copy(k)[0] in kernel.dram), None)
        plan = _plan(kernel, c, copy, base)
        names = {c.name} | ({_dram_copy(copy)[0]} if copy is not None else set())
        if not isinstance(plan, str) and any(
                names & set(k.dram) for k in kernels if k is not kernel and k is not copy):
            plan = "another body kernel reads or writes it"
        if not isinstance(plan, str) and plan["end"] + _ALIGN > sbuf_bytes:  # + the counter
            plan = (f"it needs SBUF up to {plan['end']} B/partition, the kernel may use "
                    f"{sbuf_bytes}")
        if isinstance(plan, str):
            if c.name in kernel.dram:
                notes.append(f"carry {c.name} stays in HBM: {plan}")
            continue
        plans.append({**plan, "copy": copy})
        base = _round_up(plan["end"])
    return plans, notes, base


def _enter_exit(res: _Residency, name: str, p: dict) -> None:
    """The load of resident carry `p` into the enter kernel, its store into the exit."""
    c = p["carry"]
    res.enter.append(dataclasses.replace(p["load"], name=f"{name}/enter/dma_copy",
                                         waits=(), dst=p["tile"]))
    res.enter_dram[c.name] = c
    if p["store"] is not None:
        res.exit.append(dataclasses.replace(
            p["store"], name=f"{name}/exit/dma_copy", waits=(), src=p["tile"],
            dst=dataclasses.replace(p["store"].dst, tensor=c.name)))
        res.exit_dram[c.name] = c
    res.names.append(c.name)


def _round_up(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _dram_copy(k: Kernel) -> tuple[str, str] | None:
    """(source, destination) of a kernel that is one whole DRAM-to-DRAM copy."""
    if len(k.instructions) != 1 or type(k.instructions[0]) is not DmaCopy:
        return None
    ins = k.instructions[0]
    if not (isinstance(ins.src, DramAP) and isinstance(ins.dst, DramAP)):
        return None
    src, dst = k.dram.get(ins.src.tensor), k.dram.get(ins.dst.tensor)
    whole = (ins.src.offset == ins.dst.offset == 0 and ins.src.pattern == ins.dst.pattern
             and src is not None and dst is not None and src.shape == dst.shape
             and src.dtype == dst.dtype == ins.src.dtype == ins.dst.dtype
             and ins.src.pattern == ((1, src.size),))
    return (ins.src.tensor, ins.dst.tensor) if whole else None


def _plan(kernel: Kernel, carry: DramTensor, copy: Kernel | None, base: int) -> dict | str:
    """How carry `carry` stays resident in `kernel`, or why it cannot: its one load
    (HBM -> SBUF tile A) moves to the Loop's enter kernel, its one store (tile B -> the
    carry, or a temporary that `copy` then copies into it) to the exit kernel; A's SBUF
    region moves to a fresh region R, and every trip ends with B copied into R."""
    if carry.name not in kernel.dram:
        return "the body does not touch it"
    names = {carry.name} | ({_dram_copy(copy)[0]} if copy is not None else set())
    loads, stores, others = [], [], []
    for i, ins in enumerate(kernel.instructions):
        aps = [v for v in vars(ins).values() if isinstance(v, DramAP) and v.tensor in names]
        if not aps:
            continue
        plain = type(ins) is DmaCopy and isinstance(ins.src, Tile) != isinstance(ins.dst, Tile)
        if plain and isinstance(ins.dst, Tile) and ins.src.tensor == carry.name:
            loads.append(i)
        elif plain and isinstance(ins.src, Tile):
            stores.append(i)
        else:
            others.append(i)
    if others or len(loads) != 1 or len(stores) > 1:
        return (f"it is read or written other than by one load and one store "
                f"({len(loads)} loads, {len(stores)} stores, {len(others)} other accesses)")
    load = kernel.instructions[loads[0]]
    store = kernel.instructions[stores[0]] if stores else None
    a = load.dst
    if a.mem != "sbuf" or a.strides is not None or load.src.dtype != a.dtype:
        return "its load is not a plain HBM -> SBUF copy without a cast"
    if store is not None:
        b, ap = store.src, store.dst
        if (b.mem != "sbuf" or b.strides is not None or b.shape != a.shape or b.dtype != a.dtype
                or b.start_partition != a.start_partition or ap.dtype != b.dtype
                or (ap.offset, ap.pattern) != (load.src.offset, load.src.pattern)):
            return "its store does not write back what its load read, in the same layout"
    hazard = _hazard(kernel, loads[0], stores[0] if stores else None)
    if hazard:
        return hazard
    tile = dataclasses.replace(a, offset=base)
    return {"carry": carry, "load": load, "store": store, "drop": {loads[0], *stores},
            "tile": tile, "end": base + a.free_size * _dt.itemsize(a.dtype)}


def _hazard(kernel: Kernel, load: int, store: int | None) -> str | None:
    """Why moving the load to before the first trip, or reading the store's source at
    the trip's end, could change what the kernel computes: the load waits for earlier
    instructions (which may have used its tile's memory), or an instruction waits for
    the store or follows it on its queue (which may reuse the source's memory)."""
    ins = kernel.instructions
    if ins[load].waits:
        return "its load waits for other instructions"
    if store is None:
        return None
    q = ins[store].queue
    position = sum(1 for i in ins[:store + 1] if i.queue == q)
    if any(wq == q and n >= position for i in ins for wq, n in i.waits):
        return "an instruction waits for its store"
    if any(i.queue == q for i in ins[store + 1:]):
        return "its store is not the last instruction of its DMA queue"
    return None


def _extent(t: Tile) -> tuple[int, int]:
    """[lo, hi) bytes of tile `t` within each of its partitions."""
    size = _dt.itemsize(t.dtype)
    if t.strides is None:
        return t.offset, t.offset + t.free_size * size
    lo = sum(min(0, (n - 1) * s) for n, s in zip(t.free, t.strides))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(t.free, t.strides))
    return t.offset + lo * size, t.offset + (hi + 1) * size


def _within(t: Tile, region: Tile) -> bool | None:
    """True if `t` lies inside `region`'s bytes and partitions, False if apart, None if
    it overlaps it only in part."""
    if t.mem != region.mem:
        return False
    p0, p1 = t.start_partition, t.start_partition + t.num_partitions
    q0, q1 = region.start_partition, region.start_partition + region.num_partitions
    (lo, hi), (rlo, rhi) = _extent(t), _extent(region)
    if p1 <= q0 or q1 <= p0 or hi <= rlo or rhi <= lo:
        return False
    return True if (q0 <= p0 and p1 <= q1 and rlo <= lo and hi <= rhi) else None


def _relocate(t: Tile, plans: list[dict]) -> Tile:
    for p in plans:
        a = p["load"].dst
        inside = _within(t, a)
        if inside:
            return dataclasses.replace(t, offset=t.offset - a.offset + p["tile"].offset)
        if inside is None:
            raise _Partial(t)
    return t


class _Partial(Exception):
    """A tile overlaps a resident carry's SBUF region only in part."""


def _rewrite(kernel: Kernel, plans: list[dict], end: int) -> Kernel:
    """The per-trip body kernel: loads and stores of the resident carries removed (the
    semaphore counts of their DMA queues renumbered), their tiles moved to the resident
    regions, and each carry's new value written in place into its region (`_in_place`)
    or copied there at the trip's end, after every other instruction of the trip (a
    barrier on every other queue; VectorE, which runs the copy, runs its own queue in
    order)."""
    drop = set().union(*(p["drop"] for p in plans))
    kept, shift = [], {}            # shift[q]: per kept-or-dropped count -> kept count
    for i, ins in enumerate(kernel.instructions):
        seen = shift.setdefault(ins.queue, [0])
        seen.append(seen[-1] + (i not in drop))
        if i not in drop:
            kept.append(ins)
    new = []
    for ins in kept:
        waits = tuple((q, shift[q][min(n, len(shift[q]) - 1)]) if q in shift else (q, n)
                      for q, n in ins.waits)
        fields = {k: _relocate(v, plans) for k, v in vars(ins).items() if isinstance(v, Tile)}
        new.append(dataclasses.replace(ins, waits=tuple(w for w in waits if w[1] > 0),
                                       **fields))
    counts: dict[str, int] = {}
    for ins in new:
        counts[ins.queue] = counts.get(ins.queue, 0) + 1
    barrier = tuple(sorted((q, n) for q, n in counts.items() if q != "vector"))  # in order
    for p in plans:
        if p["store"] is None:
            continue
        src = _relocate(p["store"].src, plans)
        if src == p["tile"]:
            continue
        if _within(src, p["tile"]) is not False:
            raise _Partial(src)
        if _in_place(new, src, p["tile"]):
            continue
        new.append(TensorCopy(name=f"{kernel.name}/carry", waits=barrier, dst=p["tile"],
                              src=src, engine="vector"))
    dram = {n: t for n, t in kernel.dram.items()
            if any(isinstance(v, DramAP) and v.tensor == n for ins in new
                   for v in vars(ins).values())}
    return dataclasses.replace(kernel, instructions=new, dram=dram, sbuf_bytes=end,
                               notes=list(kernel.notes))


_ELEMENTWISE = (TensorScalar, TensorTensor, TensorCopy, Activation)


def _in_place(instrs: list, src: Tile, tile: Tile) -> bool:
    """Makes the one instruction that computes a carry's new value (`src`) write it
    straight into its resident `tile`, when that is the same computation: the
    instruction is elementwise, reads the carry only as the whole `tile`, and no other
    instruction touches `src` or `tile` (so no copy is needed at the trip's end)."""
    writers = [i for i, ins in enumerate(instrs) if src in ins.outputs()]
    if len(writers) != 1:
        return False
    k, w = writers[0], instrs[writers[0]]
    if type(w) not in _ELEMENTWISE or w.outputs() != [src] \
            or getattr(w, "reduce_res", None) is not None:
        return False
    for i, ins in enumerate(instrs):
        for t in ins.tiles():
            if i != k and (_within(t, src) is not False or _within(t, tile) is not False):
                return False
            if i == k and t is not w.dst and _within(t, tile) is not False and t != tile:
                return False
    instrs[k] = dataclasses.replace(w, dst=tile)
    return True
