"""A persistent cache of compiled programs, in the directory JAX's own cache uses.

JAX's persistent compilation cache engages only for the platforms it knows ("tpu",
"gpu", "cpu", "neuron"), so on trn `jax_compilation_cache_dir` did nothing. The client
keeps its own cache there instead, under `<dir>/jax-trn/`, following JAX's settings
(`jax_trn.config.PersistentCache`, read from JAX's config at each compile):

- off unless `jax_compilation_cache_dir` is set and `jax_enable_compilation_cache` is on;
- a program is written only if it took at least
  `jax_persistent_cache_min_compile_time_secs` to compile and its entry is at least
  `jax_persistent_cache_min_entry_size_bytes` long;
- the directory is kept under `jax_compilation_cache_max_size` bytes (-1: no limit),
  dropping the entries read or written longest ago.

The key is a SHA-256 of everything the compiled program depends on: the StableHLO, JAX's
compile options (replicas, partitions, device assignment, compiler options), the jax-trn options the program compiles with (the system and
its chip included: another `JAX_TRN_SYSTEM` is another program) and the plugin's own
code (`plugin_digest`: any change to jax-trn, even without a new version number, misses).
Programs that call host functions are never written: their callbacks live in this
process only.

An entry is one file: a header line, the SHA-256 of the payload and the payload (a
pickle). Writes go to a temporary file renamed into place, so two processes compiling the
same program both write a whole entry and one wins; a truncated, foreign or unreadable
file is ignored (and replaced by the next write). The same format is what
`PJRT_Executable_Serialize` returns (`dumps` / `loads`).
"""
from __future__ import annotations

import functools
import gc
import hashlib
import io
import os
import pathlib
import pickle
import tempfile
import threading

from jax_trn.config import PersistentCache
from jax_trn.hw.operands import DramAP, Tile
from jax_trn.hw.program import Kernel

from .gc_pause import gc_paused

_SHARED = (Tile, DramAP)

MAGIC = b"jax-trn compiled program, format 2\n"
SUBDIR = "jax-trn"
_PACKAGES = ("jax_trn", "hlo_passes", "pjrt_plugin")


class CacheFormatError(ValueError):
    """Bytes that are not a whole entry of this jax-trn."""


@functools.cache
def plugin_digest() -> str:
    """A SHA-256 of every source file of jax-trn's packages (its version included)."""
    root = pathlib.Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.suffix in (".py", ".c") and path.is_file():
                h.update(str(path.relative_to(root)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()


def key(code: bytes, compile_options, settings) -> str:
    """`compile_options`: JAX's, parsed (`compile_options.Options`): their serialized
    form is not canonical (map fields in any order, XLA's own cache paths)."""
    h = hashlib.sha256()
    jax_side = repr((compile_options.num_replicas, compile_options.num_partitions,
                     compile_options.device_assignment,
                     sorted((str(k), str(v)) for k, v in compile_options.overrides.items())))
    for part in (plugin_digest().encode(), code, jax_side.encode(), repr(settings).encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def _same(value):
    return value


class _Pickler(pickle.Pickler):
    """Stores each distinct operand (`Tile`, `DramAP`: frozen, compared by value) once;
    an equal one elsewhere in the same pickle is a reference to it (the instructions of
    a kernel reuse a few tiles over and over: an lm1b-size step's entry shrinks from 27
    to 16 MB). Each kernel's instructions are a pickle of their own (`PackedKernel`)."""

    def __init__(self, file):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._first: dict = {}

    def reducer_override(self, obj):
        kind = type(obj)
        if kind in _SHARED:
            first = self._first.setdefault(obj, obj)
            if first is not obj:
                return _same, (first,)
        elif kind is Kernel or kind is PackedKernel:
            state = dict(obj.__dict__)
            packed = state.pop("_packed", None)
            if packed is None:
                packed = _pickle(state.pop("instructions"))
            return _packed_kernel, (packed, state)
        return NotImplemented


def _pickle(payload) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer).dump(payload)
    return buffer.getvalue()


class PackedKernel(Kernel):
    """A kernel read back from the cache, its instructions still a pickle until first
    asked for (`__getattr__` runs only while the attribute is missing).

    An lm1b-size step is 130,000 instructions in 821 kernels: making them all took
    0.3-0.75 s of a 0.5-1.0 s cache hit. Nothing between loading a program and running
    it reads instructions (JAX asks for types, layouts, shardings and the program's
    text), and running a kernel reads its own: each kernel's are unpickled when it
    first runs, or when anything else (`code_size_bytes`, the profiler) asks. All 821
    kernels of the step: 0.19 s CPU, spread over its first call."""

    def __getattr__(self, name):
        if name != "instructions":
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        with _unpacking:
            state = self.__dict__
            if "instructions" not in state:
                with gc_paused():
                    state["instructions"] = pickle.loads(state["_packed"])
                    _promote_young_objects()     # all of them: 0.7 s -> 0.19 s CPU
                del state["_packed"]
        return state["instructions"]


_unpacking = threading.Lock()     # one thread unpickles a kernel shared by devices


def _packed_kernel(packed: bytes, state: dict) -> PackedKernel:
    kernel = PackedKernel.__new__(PackedKernel)
    kernel.__dict__.update(state, _packed=packed)
    return kernel


def dumps(payload) -> bytes:
    with gc_paused():        # a program is ~10^6 small objects: see gc_pause
        data = _pickle(payload)
    digest = hashlib.sha256(plugin_digest().encode() + data).digest()
    return MAGIC + digest + data


def loads(blob: bytes):
    """The payload of `dumps`; CacheFormatError for anything else, including an entry
    written by another version of jax-trn."""
    if not blob.startswith(MAGIC):
        raise CacheFormatError("not a jax-trn compiled program")
    digest, data = blob[len(MAGIC):len(MAGIC) + 32], blob[len(MAGIC) + 32:]
    if hashlib.sha256(plugin_digest().encode() + data).digest() != digest:
        raise CacheFormatError("a compiled program of another jax-trn version, or damaged")
    try:
        with gc_paused():    # 6.3 s -> 0.9 s for an lm1b-size step (47 MB)
            payload = pickle.loads(data)
            _promote_young_objects()
            return payload
    except Exception as exc:           # noqa: BLE001 - any unpickling failure is "damaged"
        raise CacheFormatError(f"an unreadable compiled program: {exc}") from exc


def _promote_young_objects() -> None:
    """Moves every object the collector tracks into its oldest generation, unexamined.

    A loaded program is ~500,000 tracked objects (instructions, their dicts and
    tuples), all made while the collector was paused, so all in its youngest
    generation: the next two young collections after the load walk every one of them
    to find nothing to free (1.4-1.9 s after an lm1b-size step's load on this machine,
    more than the load). `gc.freeze()` then `gc.unfreeze()` splices the young lists
    onto the oldest one in constant time. Not done if the user froze objects
    themselves (unfreezing would release theirs)."""
    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()


class DiskCache:
    """Entries `<directory>/jax-trn/<key>`."""

    def __init__(self, settings: PersistentCache):
        self.settings = settings
        self.path = pathlib.Path(settings.directory).expanduser() / SUBDIR

    def load(self, entry_key: str):
        """The cached payload, or None (missing, damaged or from another version)."""
        file = self.path / entry_key
        try:
            payload = loads(file.read_bytes())
            os.utime(file)                      # recently used: evicted last
            return payload
        except (OSError, CacheFormatError):
            return None

    def store(self, entry_key: str, payload, compile_secs: float) -> bool:
        """Writes the entry if JAX's thresholds allow; never raises for a full or
        read-only disk (the program is simply not cached)."""
        s = self.settings
        if s.max_size == 0 or compile_secs < s.min_compile_secs:
            return False
        try:
            blob = dumps(payload)
        except Exception:                     # noqa: BLE001 - not picklable: not cached
            return False
        if len(blob) < s.min_entry_bytes or 0 < s.max_size < len(blob):
            return False
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, self.path / entry_key)
        except OSError:
            return False
        self._evict()
        return True

    def _evict(self) -> None:
        """Drops the least recently used entries while the directory is over its size."""
        if self.settings.max_size < 0:
            return
        entries = []
        for file in self.path.iterdir():
            if file.name.startswith(".tmp-"):       # another process is writing it
                continue
            try:
                st = file.stat()
            except OSError:
                continue
            entries.append((st.st_mtime, st.st_size, file))
        total = sum(size for _, size, _ in entries)
        for _, size, file in sorted(entries):
            if total <= self.settings.max_size:
                break
            try:
                file.unlink()
                total -= size
            except OSError:
                pass
