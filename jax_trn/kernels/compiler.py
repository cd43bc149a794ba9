"""`nki.compiler`'s names a kernel may use: explicit buffer placement (`sbuf.mod_alloc`,
`psum.mod_alloc`), scheduling directives and compiler switches.

    buf = nl.ndarray((nl.par_dim(128), 4, 512), dtype=nl.float32,
                     buffer=ncc.sbuf.mod_alloc(base_addr=0, num_free_tiles=(4,)))

A placed tensor sits at the given byte offset of each partition (and, in PSUM, from the
given bank), reserved there so the kernel's other tensors keep out; `num_free_tiles` /
`num_bank_tiles` give a block-tiled tensor's blocks their own buffers (in PSUM, one bank
each). Directives and switches (`no_reorder()`, `skip_middle_end_transformations`) are
accepted: this simulator keeps program order and has no middle end.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Where a tensor goes (`nl.ndarray(..., buffer=placement)`)."""
    mem: str                    # "sbuf" | "psum"
    offset: int                 # bytes from the start of each partition
    partition: int = 0          # first partition
    blocks: int = 1             # buffers for the tensor's block axes
    block_bytes: int = 0        # distance between blocks (0: packed)


class _Sbuf:
    @staticmethod
    def mod_alloc(base_addr: int, base_partition: int = 0, num_par_tiles=(),
                  num_free_tiles=()) -> Placement:
        return Placement("sbuf", int(base_addr), int(base_partition),
                         math.prod(num_free_tiles) if num_free_tiles else 1)


class _Psum:
    BANK = 2048                 # bytes per partition of a PSUM bank (§3.2)

    @classmethod
    def mod_alloc(cls, base_bank: int, base_addr: int = 0, base_partition: int = 0,
                  num_bank_tiles=(), num_par_tiles=(), num_free_tiles=()) -> Placement:
        blocks = math.prod(num_bank_tiles) if num_bank_tiles else 1
        return Placement("psum", int(base_bank) * cls.BANK + int(base_addr),
                         int(base_partition), blocks, cls.BANK if num_bank_tiles else 0)


sbuf = _Sbuf()
psum = _Psum()


def skip_middle_end_transformations(fn):
    """Accepted (a decorator): there is no middle end here."""
    return fn


def enable_stack_allocator(fn=None, **_):
    return fn if fn is not None else (lambda f: f)


def force_auto_alloc(fn=None, **_):
    return fn if fn is not None else (lambda f: f)


class no_reorder:
    """A loop directive (`nl.sequential_range(n, directives=no_reorder())`): accepted;
    instructions are always issued in program order here."""
