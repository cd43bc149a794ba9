"""Bulk data between the processes of a multi-controller run (issue 17).

The coordination service's key-value store (`kvstore`) carries every value through one
gRPC server, at ~100 MB/s. A collective's operands are larger than that can bear (a
data-parallel step on 1152 NeuronCores publishes ~150 MB per process per step with two
processes), so when every process of the run is on this host the data goes through
shared memory instead: the writer puts it in a file under /dev/shm (the temporary
directory where there is none) and the store only carries the file's name; readers map
it. The writer deletes its files once every
reader is past them (`release`, after the call's end barrier: `spmd_remote.Exchange`).
Processes on several hosts fall back to the store itself.

Whether all processes share this host is decided once per store: each process publishes
its host id (host name and boot id) under `jax_trn/host/<process>` when its client is
made (`announce`).

Files are named `jax_trn-<host name>-<pid>-<n>`. A process killed outright (SIGKILL, the
OOM killer) cannot delete its own, so a new client deletes those of this host name whose
process is gone (`sweep`).
"""
from __future__ import annotations

import itertools
import mmap
import os
import socket
import tempfile
import threading
import weakref

from .kvstore import PREFIX

# Memory-backed on Linux; elsewhere (macOS) the temporary directory, whose fresh files
# stay in the page cache for as long as a collective reads them.
_SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
_TAG = b"SHM\n"
_counter = itertools.count()
_lock = threading.Lock()
_same_host: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # kv -> all here


def host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def announce(kv, me: int) -> None:
    """Publishes this process's host id (when its client is made), after deleting the
    files dead processes left (`sweep`)."""
    sweep()
    kv.put(f"{PREFIX}host/{me}", host_id().encode())


def _prefix() -> str:
    return f"jax_trn-{socket.gethostname().replace('/', '_')}-"


def sweep() -> list[str]:
    """Deletes the shared-memory files of this host's processes that no longer exist;
    returns their paths."""
    prefix, gone = _prefix(), []
    try:
        names = os.listdir(_SHM_DIR)
    except OSError:
        return gone
    for name in names:
        if not name.startswith(prefix):
            continue
        pid = name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            os.unlink(os.path.join(_SHM_DIR, name))
            gone.append(os.path.join(_SHM_DIR, name))
        except OSError:
            pass
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:                 # another user's process: alive
        return True
    return True


def all_on_this_host(kv, me: int, processes: list[int], timeout_s: float) -> bool:
    """Whether processes `processes` run on this host as `me` does (`announce`d): read
    once per store."""
    with _lock:
        known = _same_host.get(kv)
        if known is not None:
            return known
        mine = host_id()
        same = os.path.isdir(_SHM_DIR) and all(
            kv.get(f"{PREFIX}host/{q}", timeout_s).decode() == mine
            for q in processes if q != me)
        _same_host[kv] = same
        return same


class Channel:
    """Puts and reads the values of one call: through shared memory (`shared`) or the
    store itself."""

    def __init__(self, kv, shared: bool):
        self.kv = kv
        self.shared = shared
        self._files: list[str] = []

    def put(self, key: str, blob, label: str = "") -> None:
        """`blob` (bytes, or a list of bytes-like pieces: their concatenation) under
        `key`; `label` (a line of text) readable without the data (`label`), also once
        the writer has deleted its file."""
        pieces = blob if isinstance(blob, list) else [blob]
        if not self.shared:
            self.kv.put(key, b"".join(pieces))
            return
        path = os.path.join(_SHM_DIR, f"{_prefix()}{os.getpid()}-{next(_counter)}")
        with open(path, "wb") as f:
            for piece in pieces:
                f.write(piece)
        self._files.append(path)
        self.kv.put(key, _TAG + path.encode() + b"\n" + label.encode())

    @staticmethod
    def label(value: bytes) -> str | None:
        """The label of a value published through shared memory (None: inline)."""
        if not value.startswith(_TAG):
            return None
        return value[len(_TAG):].split(b"\n", 1)[-1].decode()

    @staticmethod
    def read(value: bytes):
        """A value as published: its bytes (or a read-only map of its file)."""
        if not value.startswith(_TAG):
            return value
        path = value[len(_TAG):].split(b"\n", 1)[0].decode()
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return b""
            return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)

    def release(self) -> None:
        """Deletes this process's files of the call (every reader has mapped them)."""
        for path in self._files:
            try:
                os.unlink(path)
            except OSError:
                pass
        self._files.clear()
