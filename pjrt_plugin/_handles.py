"""Opaque C handles for Python objects.

Each handle is the address of a small C block owned here; its first word is the
object's vtable pointer where the C API defines one (PJRT_Error, PJRT_Memory) and
NULL otherwise; the words after it hold what native code answers for the object without
Python (a tag, then e.g. a buffer's `_objects.BUFFER_WORDS`). The registry keeps the
Python object and its block alive until the handle is freed; the registry itself is
never freed, since XLA may still use handles while the interpreter exits.

A freed handle's block loses its tag (second word) and is kept for the next handle of
its length, never returned to malloc: C, which answers some calls from the block alone,
then finds no tag in a stale handle and lets Python report it (as the registry does: an
invalid handle).
"""
from __future__ import annotations

import ctypes
import threading


class InvalidHandle(LookupError):
    pass


_BLOCK_TYPES: dict[int, type] = {}


def _block_type(words: int) -> type:
    """ctypes.c_void_p * words, made once per length."""
    got = _BLOCK_TYPES.get(words)
    if got is None:
        got = _BLOCK_TYPES[words] = ctypes.c_void_p * words
    return got


class Handles:
    def __init__(self):
        self._objects: dict[int, tuple[object, ctypes.Array]] = {}
        self._by_id: dict[int, int] = {}
        self._free: dict[int, list[ctypes.Array]] = {}   # words -> zeroed blocks
        self._lock = threading.Lock()

    def new(self, obj, vtable: int = 0, words: tuple[int, ...] = (0,)) -> int:
        n = 1 + len(words)
        with self._lock:
            free = self._free.get(n)
            if free:
                block = free.pop()
                block[:] = (vtable, *words)
            else:
                block = _block_type(n)(vtable or None, *(w or None for w in words))
            address = ctypes.addressof(block)
            self._objects[address] = (obj, block)
        return address

    def stable(self, obj, vtable: int = 0, words: tuple[int, ...] = (0,)) -> int:
        """One handle per object for its whole life (devices, memories, ...)."""
        with self._lock:
            address = self._by_id.get(id(obj))
        if address is None:
            address = self.new(obj, vtable, words)
            with self._lock:
                self._by_id[id(obj)] = address
        return address

    def get(self, address: int, kind: type | tuple = object):
        entry = self._objects.get(address)
        if entry is None or not isinstance(entry[0], kind):
            raise InvalidHandle(f"invalid or freed handle 0x{address or 0:x}")
        return entry[0]

    def free(self, address: int):
        with self._lock:
            entry = self._objects.pop(address, None)
            if entry is None:
                return None
            block = entry[1]
            block[1] = None            # the tag (or an unused word): C reads no stale block
            self._free.setdefault(len(block), []).append(block)
        return entry[0]


HANDLES = Handles()
ctypes.pythonapi.Py_IncRef(ctypes.py_object(HANDLES))    # see the module doc
