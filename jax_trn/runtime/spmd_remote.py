"""Collectives whose devices span the processes of a multi-controller run (issue 17).

Each process runs its own devices of an SPMD program (`spmd.drive` over its local
runners, `spmd_batch` as in one process). At every rendezvous (a `Collective` step),
once its local devices have arrived, a process publishes through the run's key-value
store (`kvstore`) what the others need of its devices, and reads what they published:

  - for the numerics: each local device's operands of the collective (its DRAM tensors
    `step.operands`, as the collective reads them);
  - for the timeline: each local device's arrival (`spmd.Arrival`: its clock, when its
    CC cores are free, whether it overlaps compute) and the collective's name (a process
    on another path through the program is an error, not a hang).

Then every process calls `spmd.execute` with the operands and arrivals of *all* the
program's devices, in partition order: the same call the single-process runtime makes,
so every process computes the same result bits (the algorithm's reduction order is the
single-process one) and the same span for each device (start at the slowest member's
arrival, end after the algorithm's time), and records the same `CollectiveRecord`. A
process keeps its own devices' results and spans; the others' go to scratch arrays.

Why the arrivals agree with one process: a device's timeline depends only on its own
kernels, its chip's HBM (a process owns whole chips, `processes`) and the spans its
collectives give back, which every process computes alike.

Keys: `jax_trn/cc/<program>/<call>/<process>/<rendezvous>`, one value per process per
rendezvous (all its devices at once: one store round trip per process, not per device):
<program> a digest of the program text and its device ids, <call> the count of calls of
that program in this process (`next_call`; every process calls a multi-process program
in the same order, as JAX's multi-controller model requires), <rendezvous> the
collective's index within the call. At the end of a call each process publishes an end
marker at the next index and reads the peers' (a barrier: a peer still waiting in a
collective learns that this process finished instead of timing out, and this process
that the peer did not); a call that fails publishes a failure marker there, so the peers
fail at once with its message.
A peer that publishes nothing (dead, stuck) fails the others after
`Options.process_timeout` seconds (JAX_TRN_PROCESS_TIMEOUT; JAX's coordination service
also ends a run whose process died, after its heartbeat timeout). A peer whose program
ended, or raised, while the others wait for it says so as its interpreter exits
(`watch_exit`: `jax_trn/exit/<process>`, published before JAX's own exit handler, which
waits at the coordination service's shutdown barrier); a waiting process polls for that
marker and fails at once with the peer's reason.

Values: a JSON header line (step name, arrivals, arrays: partition, tensor, dtype, byte
count) and the arrays' raw bytes, carried by `channel` (shared memory when every
process is on this host; the store carries the file's name).

A host callback one device makes for all (`step.device`, e.g. jax.debug.print under
automatic sharding) is two rendezvous: every process publishes its arrivals (for the
spans), then the caller's process runs the function and publishes the results.

Keys are `.../<call>/<process>/<rendezvous>`: at the end of call c each process deletes
its keys of call c - 1 (every peer has read them: it finished call c - 1 before it could
reach call c's end), through JAX's own client of the coordination service
(`KVStore.delete_dir`), so a long run keeps at most two calls' keys per program.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
import weakref

import numpy as np

from jax_trn.hw import dtypes as _dt

from .kvstore import DEFAULT_TIMEOUT_S, PREFIX, KVError, KVTimeout


# Bytes this process published for collectives (benchmarks/multiprocess.py).
STATS = {"bytes_put": 0}
_END = b"END\n"
_FAILED = b"FAILED\n"


# The settings every process of a run must share: they decide the programs, their
# numerics or their timeline (per-process ones, e.g. dump or threads, may differ).
SHARED_SETTINGS = ("system", "matmul_precision", "disable_passes", "stochastic_rounding",
                   "stochastic_rounding_seed", "strict_activation_ranges",
                   "collective_algorithm", "max_while_iterations", "blas_coretype")
_checked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # kv -> {peer tuples}


def shared_settings(options) -> dict:
    """`options`' values of SHARED_SETTINGS, as text (a system by its name and a digest
    of its whole description: a custom system of the same name differs)."""
    out = {}
    for name in SHARED_SETTINGS:
        value = getattr(options, name)
        if name == "system":
            value = f"{value.name} ({hashlib.sha256(repr(value).encode()).hexdigest()[:8]})"
        elif isinstance(value, frozenset):
            value = ",".join(sorted(value))
        out[name] = str(value)
    return out


def publish_settings(kv, me: int, options) -> None:
    """This process's shared settings (when its client is made), for `check_settings`."""
    kv.put(f"{PREFIX}settings/{me}", json.dumps(shared_settings(options)).encode())


def check_settings(kv, me: int, peers: list[int], timeout_s: float) -> None:
    """Fails (RemoteCollectiveError) if a peer's client runs with other shared settings
    than this process's (as both published them, `publish_settings`): its programs, bits
    or times would differ, and the run would hang or diverge. Once per store and peer
    set, at the first program that spans processes."""
    key = tuple(peers)
    done = _checked.setdefault(kv, set())
    if key in done:
        return
    mine = json.loads(kv.get(f"{PREFIX}settings/{me}", timeout_s))
    for q in peers:
        try:
            theirs = json.loads(kv.get(f"{PREFIX}settings/{q}", timeout_s))
        except KVError as exc:
            raise RemoteTimeout(f"process {q} did not publish its settings within "
                                f"{timeout_s:g} s: {exc}") from None
        differ = [f"{k}: {theirs.get(k)!r} in process {q}, {v!r} in process {me}"
                  for k, v in mine.items() if theirs.get(k) != v]
        if differ:
            raise RemoteCollectiveError(
                "the processes of this run have different jax-trn settings (JAX_TRN_* / "
                "jax_trn.configure), so their programs or results would differ: "
                + "; ".join(differ))
    done.add(key)


# How often a process waiting for a peer's value checks whether the peer is exiting.
POLL_S = 1.0
_exit_reason: list[str] = []


def watch_exit(kv, me: int) -> None:
    """At interpreter exit, publishes that process `me` is exiting and why (its uncaught
    exception, if any), so peers waiting for it fail at once (`Exchange._get`). The
    handler is registered after JAX's (`jax.distributed.initialize` registers its
    shutdown first), so it runs before JAX's shutdown barrier blocks."""
    import atexit
    import sys
    previous = sys.excepthook

    def hook(kind, value, tb):
        _exit_reason[:] = [f"it raised {kind.__name__}: {value}"[:1000]]
        previous(kind, value, tb)
    sys.excepthook = hook

    def exiting() -> None:
        reason = _exit_reason[0] if _exit_reason else "its program ended or called sys.exit"
        try:
            kv.put(f"{PREFIX}exit/{me}", reason.encode())
        except Exception:       # noqa: BLE001 - the store is gone: nobody is waiting
            pass
    atexit.register(exiting)


class RemoteCollectiveError(RuntimeError):
    """A collective across processes that cannot complete: a peer took another path,
    finished early or failed (the call is ABORTED, the message told as it is)."""
    pjrt_code = "ABORTED"


class RemoteTimeout(RemoteCollectiveError):
    """A peer did not publish its data in time (dead or stuck)."""
    pjrt_code = "DEADLINE_EXCEEDED"


def program_key(program, device_ids) -> str:
    h = hashlib.sha256(program.text.encode())
    h.update(",".join(map(str, device_ids)).encode())
    return h.hexdigest()[:24]


_calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # kv -> {program: n}
_calls_lock = threading.Lock()


def next_call(kv, program: str) -> int:
    """The number of this call of `program` (a `program_key`) in this process, counted
    over every executable of that program (one compiled twice shares the count, so its
    keys never collide with the first's)."""
    with _calls_lock:
        counts = _calls.setdefault(kv, {})
        counts[program] = n = counts.get(program, 0) + 1
        return n


class Exchange:
    """The cross-process side of one call of a program over `devices` (all of them,
    partition order) of which this process runs those with `addressable` set."""

    def __init__(self, kv, devices, process_index: int, program: str, call: int,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.kv = kv
        self.devices = list(devices)
        self.me = process_index
        self.local = [p for p, d in enumerate(self.devices) if d.addressable]
        self.mine = frozenset(self.local)
        self.processes = sorted({d.process_index for d in self.devices})
        self.peers = [q for q in self.processes if q != process_index]
        self.base = f"{PREFIX}cc/{program}/{call}"
        self.program, self.call = program, call
        self.timeout_s = timeout_s
        self.index = 0
        self._published: set[int] = set()
        self._channel = None

    @property
    def channel(self):
        """How values travel (`channel`): shared memory if every process is on this
        host, else the store; decided at the call's first rendezvous."""
        if self._channel is None:
            from .channel import Channel, all_on_this_host
            try:
                shared = all_on_this_host(self.kv, self.me, self.peers, self.timeout_s)
            except KVError as exc:
                raise RemoteTimeout(f"the processes {self.peers} did not all announce "
                                    f"their host within {self.timeout_s:g} s: {exc}") from None
            self._channel = Channel(self.kv, shared)
        return self._channel

    def restart(self) -> None:
        """The call runs again from its start (`spmd_batch`: a diverged batched run):
        what was published is still right (a device's arrivals and operands are those a
        full run gives), so it is not published twice."""
        self.index = 0

    def _key(self, index: int, process: int) -> str:
        return f"{self.base}/{process}/{index}"

    def gather(self, step, pending: list, drams: list[dict], operands: bool = True):
        """This process's arrivals (`pending`, local runner order) and DRAMs published,
        the peers' read: (arrivals, drams) of every partition. `operands=False`: the
        arrivals only (the DRAMs are empty)."""
        index = self.index
        self.index += 1
        if index not in self._published:
            self._publish(index, _encode(step, self.local, pending, drams, operands),
                          step.name)
        arrivals: list = [None] * len(self.devices)
        full: list = [None] * len(self.devices)
        for p, a, dram in zip(self.local, pending, drams):
            arrivals[p], full[p] = a, dram
        scratch: dict = {}
        for q in self.peers:
            name, remote = _decode(self._read(index, q, step.name), step, scratch)
            if name != step.name:
                raise RemoteCollectiveError(
                    f"process {q} reached collective {name} where process {self.me} is at "
                    f"{step.name}: the processes took different paths through the program")
            for p, (a, dram) in remote.items():
                if self.devices[p].process_index != q:
                    raise RemoteCollectiveError(f"process {q} sent data of partition {p}, "
                                                f"a device of process "
                                                f"{self.devices[p].process_index}")
                arrivals[p], full[p] = a, dram
        missing = [p for p in range(len(self.devices)) if arrivals[p] is None]
        if missing:
            raise RemoteCollectiveError(f"{step.name}: no data of partitions {missing}")
        return arrivals, full

    def split(self, step):
        """For an all_reduce, reduce_scatter or all_to_all: the function `collectives`
        calls with its ranks' device ids to get their `collectives.split.Split` (the
        processes share the work column-wise and swap inputs and results through
        `swap`); None for any other collective (every process runs it on every device's
        operands, `gather`)."""
        from jax_trn.collectives.api import SPLITS
        from jax_trn.collectives.split import Split
        from .spmd import KIND_OPS
        if step.kind not in SPLITS or (step.kind != "all_to_all" and step.op not in KIND_OPS):
            return None
        position = {q: k for k, q in enumerate(self.processes)}
        owner = {d.id: position[d.process_index] for d in self.devices}
        me, count = position[self.me], len(self.processes)

        def swap(sends):
            return self.swap(step, sends)
        return lambda devs: Split([owner[int(d)] for d in devs], me, count, swap)

    def swap(self, step, sends: list) -> list:
        """One rendezvous at which process `processes[k]` gets array sends[k] from this
        one (None at this process's place); returns the arrays each peer sent this one
        (read-only views of the published value), None at this process's place."""
        index = self.index
        self.index += 1
        me = self.processes.index(self.me)
        if index not in self._published:
            self._publish(index, _encode_swap(step.name, sends), step.name)
        out: list = [None] * len(self.processes)
        for k, q in enumerate(self.processes):
            if q != self.me:
                out[k] = _decode_swap(self._read(index, q, step.name), step.name, me, q)
        return out

    def finish(self) -> None:
        """This process's end of the call, published at the next rendezvous index; then
        the peers' ends read there (a barrier: a peer that is in a collective instead
        took another path, and this call fails too)."""
        if self.index not in self._published:
            self.kv.put(self._key(self.index, self.me), _END)
            self._published.add(self.index)
        for q in self.peers:
            got = self._get(self.index, q, "the end of the program", end_ok=True)
            if got != _END:
                name = self.channel.label(got)
                if name is None:
                    name = json.loads(bytes(got[:got.find(b"\n")]))["step"]
                raise RemoteCollectiveError(
                    f"process {q} waits in collective {name} where process {self.me} "
                    f"finished the program: the processes took different paths through "
                    f"the program")
        self.channel.release()
        # Every peer is past this call's end, so past the previous call's reads: this
        # process's keys of that call go (the store would otherwise grow every step).
        if self.call > 1:
            self.kv.delete_dir(f"{PREFIX}cc/{self.program}/{self.call - 1}/{self.me}")

    def host_callback(self, step, pending: list, runners) -> list:
        """A host callback partition `step.device` makes for every device: the
        arrivals go round (for the spans), the caller's process calls the host and
        publishes the results, the others write them into their devices' DRAMs. Each
        local device's `callbacks.Span`, as one process computes them."""
        from . import callbacks
        arrived, _ = self.gather(step, pending, [r.dram for r in runners], operands=False)
        k = step.device
        if not 0 <= k < len(self.devices):
            raise RemoteCollectiveError(f"{step.name} is called by partition {k}; the "
                                        f"program runs on {len(self.devices)} devices")
        owner = self.devices[k].process_index
        index = self.index
        self.index += 1
        if owner == self.me:
            caller = runners[self.local.index(k)]
            outs = (callbacks.call(step, callbacks.read(caller.dram, step.operands))
                    if caller.execute and caller.call_host else callbacks.zeros(step.results))
            if index not in self._published:
                self._publish(index, _encode_arrays(step.name, step.results, outs),
                              step.name)
        else:
            outs = _decode_arrays(self._read(index, owner, step.name, "results"), step)
        for r in runners:
            if r.execute:
                callbacks.write(r.dram, step.results, outs)
        spans = callbacks.shared_spans(step, runners[0].chip_spec, [a.t for a in arrived], k)
        return [spans[p] for p in self.local]

    def _publish(self, index: int, blob, label: str) -> None:
        """`blob` (bytes, or pieces: `Channel.put`) as this process's value at
        rendezvous `index` (a restarted call does not publish it again: its callers
        check `_published`)."""
        self.channel.put(self._key(index, self.me), blob, label)
        STATS["bytes_put"] += sum(memoryview(b).nbytes
                                  for b in (blob if isinstance(blob, list) else [blob]))
        self._published.add(index)

    def _read(self, index: int, q: int, name: str, what: str = "data"):
        """Process q's value at rendezvous `index`, as published (`Channel.read`)."""
        got = self._get(index, q, name)
        try:
            return self.channel.read(got)
        except OSError as exc:
            raise RemoteCollectiveError(f"{name}: cannot read process {q}'s {what} "
                                        f"(did it fail?): {exc}") from None

    def _exiting(self, q: int) -> str | None:
        """Process q's exit reason if it is exiting (`watch_exit`), else None."""
        try:
            got = self.kv.try_get(f"{PREFIX}exit/{q}")
        except KVError:
            return None
        return None if got is None else got.decode(errors="replace")

    def abort(self, exc: BaseException) -> None:
        """This process's call failed (`exc`): said at the next rendezvous index, so
        the peers fail at once instead of waiting out the timeout."""
        if self._channel is not None:
            self._channel.release()
        if self.index in self._published:
            return
        try:
            text = f"{type(exc).__name__}: {exc}"[:2000]
            self.kv.put(self._key(self.index, self.me), _FAILED + text.encode())
            self._published.add(self.index)
        except Exception:        # noqa: BLE001 - the store is gone too: the peers time out
            pass

    def _get(self, index: int, q: int, name: str, end_ok: bool = False) -> bytes:
        key = self._key(index, q)
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                got = self.kv.get(key, max(0.001, min(POLL_S, deadline - time.monotonic())))
                break
            except KVTimeout as exc:
                exiting = self._exiting(q)
                if exiting is not None:
                    got = self.kv.try_get(key)        # published just before it exited?
                    if got is not None:
                        break
                    raise RemoteCollectiveError(
                        f"{name}: process {q} exited ({exiting}) while process {self.me} "
                        f"waits for it here") from None
                if time.monotonic() >= deadline:
                    raise RemoteTimeout(
                        f"{name}: process {q} did not get there within "
                        f"{self.timeout_s:g} s (it died, is stuck, or took another path): "
                        f"{exc}") from None
            except KVError as exc:
                raise RemoteCollectiveError(f"{name}: cannot read process {q}'s data from "
                                            f"the coordination service: {exc}") from None
        if got.startswith(_FAILED):
            raise RemoteCollectiveError(
                f"{name}: process {q} failed: {got[len(_FAILED):].decode(errors='replace')}")
        if got == _END and not end_ok:
            raise RemoteCollectiveError(
                f"process {q} finished the program while process {self.me} waits in "
                f"{name}: the processes took different paths through the program")
        return got


def _encode(step, partitions: list[int], pending: list, drams: list[dict],
            operands: bool = True) -> bytes:
    """Partition p = partitions[k]'s arrival (pending[k]) and operands (drams[k]). The
    header names each operand's type and size once (every partition runs the same
    program); the data follows partition by partition, copied once into the value."""
    arrivals = [[p, a.t, a.ready, bool(a.overlaps), a.context]
                for p, a in zip(partitions, pending)]
    tensors = list(step.operands) if operands and drams else []
    first = [np.asarray(drams[0][t.name]) for t in tensors]
    layout = [[t.name, a.dtype.name, a.nbytes] for t, a in zip(tensors, first)]
    header = json.dumps({"step": step.name, "arrivals": arrivals,
                         "layout": layout}).encode() + b"\n"
    out = bytearray(len(header) + sum(n for *_, n in layout) * len(drams if tensors else ()))
    out[:len(header)] = header
    flat, at = np.frombuffer(out, np.uint8), len(header)
    for dram in drams if tensors else ():
        for t, (_, _, nbytes) in zip(tensors, layout):
            data = np.ascontiguousarray(np.asarray(dram[t.name])).reshape(-1)
            flat[at:at + nbytes] = data.view(np.uint8)
            at += nbytes
    return bytes(out)


def _encode_swap(name: str, sends: list) -> list:
    """A `swap` value: a JSON header line (step name; for each receiver k its array's
    shape, dtype and byte count) and the arrays' bytes, as pieces written one after the
    other (no joined copy)."""
    arrays = [None if a is None else np.ascontiguousarray(a) for a in sends]
    layout = [None if a is None else [list(a.shape), a.dtype.name, a.nbytes] for a in arrays]
    header = json.dumps({"step": name, "swap": layout}).encode() + b"\n"
    return [header] + [a.reshape(-1).view(np.uint8) for a in arrays if a is not None and a.size]


def _decode_swap(blob, name: str, me: int, q: int) -> np.ndarray:
    """The array a peer (process q) sent this process (at place `me`) in a `swap`."""
    end = blob.find(b"\n")
    header = json.loads(bytes(blob[:end]))
    if header.get("step") != name or "swap" not in header:
        raise RemoteCollectiveError(
            f"process {q} reached {header.get('step')} where this process is at {name}: "
            f"the processes took different paths through the program")
    at = end + 1
    for k, entry in enumerate(header["swap"]):
        if entry is None:
            continue
        shape, dtype, nbytes = entry
        if k == me:
            return np.frombuffer(memoryview(blob)[at:at + nbytes],
                                 _dt.np_dtype(dtype)).reshape(shape)
        at += nbytes
    raise RemoteCollectiveError(f"{name}: process {q} sent nothing for this process")


def _decode(blob: bytes, step, scratch: dict):
    """(step name, {partition: (Arrival, DRAM)}) of a peer's value. A remote DRAM holds
    the operands; the collective's results for it go to `scratch` (one array per
    tensor, shared by every remote partition: their bits are not kept)."""
    from .spmd import Arrival
    end = blob.find(b"\n")
    header = json.loads(bytes(blob[:end]))
    if header["step"] != step.name or "arrivals" not in header:
        return header["step"], {}
    out = {}
    for p, t, ready, overlaps, context in header["arrivals"]:
        out[p] = (Arrival(step, t, context, ready, overlaps), _RemoteDram(scratch, step))
    at = end + 1
    view = memoryview(blob)
    if header["layout"]:
        for p, *_ in header["arrivals"]:
            for name, dtype, nbytes in header["layout"]:
                out[p][1][name] = np.frombuffer(view[at:at + nbytes], _dt.np_dtype(dtype))
                at += nbytes
    return header["step"], out


def _encode_arrays(name: str, tensors, values) -> bytes:
    arrays, chunks = [], []
    for t, v in zip(tensors, values):
        data = np.ascontiguousarray(np.asarray(v).reshape(-1))
        arrays.append([t.name, data.dtype.name, data.nbytes])
        chunks.append(data.tobytes())
    return json.dumps({"step": name, "arrays": arrays}).encode() + b"\n" + b"".join(chunks)


def _decode_arrays(blob, step) -> list[np.ndarray]:
    """The results `_encode_arrays` wrote for `step`, in their shapes."""
    end = blob.find(b"\n")
    header = json.loads(bytes(blob[:end]))
    if header["step"] != step.name:
        raise RemoteCollectiveError(f"expected the results of {step.name}, got "
                                    f"{header['step']}'s: the processes took different paths")
    view, at, out = memoryview(blob), end + 1, []
    for t, (_, dtype, nbytes) in zip(step.results, header["arrays"]):
        out.append(np.frombuffer(view[at:at + nbytes], _dt.np_dtype(dtype)).reshape(t.shape))
        at += nbytes
    return out


class _RemoteDram(dict):
    """Another process's device's DRAM as a collective sees it: its operands; any
    other tensor (a result) a scratch array."""

    def __init__(self, scratch: dict, step):
        super().__init__()
        self._scratch = scratch
        self._step = step

    def __missing__(self, name: str):
        got = self._scratch.get(name)
        if got is None:
            t = next((t for t in self._step.results if t.name == name), None)
            if t is None:
                raise KeyError(name)
            got = self._scratch[name] = np.zeros(t.size, _dt.np_dtype(t.dtype))
        return got
