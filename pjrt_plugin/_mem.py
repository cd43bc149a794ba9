"""Raw memory helpers for the C boundary.

Shims read and write pointer-typed fields through their byte offsets, so they do not
depend on how `_c_api` spells a pointer type (c_void_p, c_char_p or POINTER(T)).
Everything handed to C (strings, arrays) is kept alive by its owner in `Keep`.
"""
from __future__ import annotations

import ctypes

c_void_p = ctypes.c_void_p


_OFFSETS: dict[tuple[type, str], int] = {}     # (struct type, field) -> byte offset


def _offset(struct: ctypes.Structure, name: str) -> int:
    key = (type(struct), name)
    offset = _OFFSETS.get(key)
    if offset is None:                 # a descriptor lookup: once per field
        offset = _OFFSETS[key] = getattr(key[0], name).offset
    return ctypes.addressof(struct) + offset


def get_ptr(struct: ctypes.Structure, name: str) -> int:
    """The address stored in a pointer field (0 for NULL)."""
    return c_void_p.from_address(_offset(struct, name)).value or 0


def set_ptr(struct: ctypes.Structure, name: str, address: int) -> None:
    c_void_p.from_address(_offset(struct, name)).value = address or None


def set_arrays(struct: ctypes.Structure, ptr_fields: tuple[str, ...], count_field: str,
               value: tuple[int, ...]) -> None:
    """Fills out-pointers and their shared count (or size) field from a tuple
    (address, ..., n), one address per pointer field."""
    *addresses, n = value
    for name, address in zip(ptr_fields, addresses, strict=True):
        set_ptr(struct, name, address)
    setattr(struct, count_field, n)


def set_array(struct: ctypes.Structure, ptr_field: str, count_field: str,
              pair: tuple[int, int]) -> None:
    """Fills an out-pointer and its count (or size) field from an (address, n) pair."""
    set_arrays(struct, (ptr_field,), count_field, pair)


def clear_outputs(args_address: int) -> None:
    """Zeroes everything after a *_Args header (struct_size, extension_start): the
    answer of an infallible entry point that could not answer (NULL, 0, false)."""
    size = ctypes.c_size_t.from_address(args_address).value
    if size > _ARGS_HEADER:
        ctypes.memset(args_address + _ARGS_HEADER, 0, size - _ARGS_HEADER)


_ARGS_HEADER = 16


def read_bytes(address: int, size: int) -> bytes:
    return ctypes.string_at(address, size) if size else b""


def read_array(address: int, ctype, n: int) -> list:
    if not n:
        return []
    return list((ctype * n).from_address(address))


class Keep:
    """Owns C-visible copies of Python data; addresses stay valid while it lives."""

    def __init__(self):
        self._items: list = []

    def bytes(self, data: bytes | str) -> tuple[int, int]:
        """(address, size) of a NUL-terminated copy of `data`."""
        raw = data.encode() if isinstance(data, str) else data
        buf = ctypes.create_string_buffer(raw, len(raw) + 1)
        self._items.append(buf)
        return ctypes.addressof(buf), len(raw)

    def array(self, ctype, values) -> int:
        values = list(values)
        arr = (ctype * max(1, len(values)))(*values)
        self._items.append(arr)
        return ctypes.addressof(arr)

    def pointers(self, addresses) -> int:
        return self.array(c_void_p, addresses)

    def obj(self, cobj) -> int:
        self._items.append(cobj)
        return ctypes.addressof(cobj)
