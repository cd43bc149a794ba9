"""The table of implemented entry points: `@entry("PJRT_X")` registers a shim.

A shim takes the entry point's `*_Args` structure and fills its out-fields; it never
returns a PJRT_Error itself: `_api` turns any exception into one, or, for entry points
on which JAX aborts the process when they fail (`never_fails=True`), logs it and
answers with its out-fields zeroed (see `_api`).
"""
from __future__ import annotations

ENTRIES: dict[str, tuple] = {}


def entry(name: str, *, never_fails: bool = False):
    def register(fn):
        ENTRIES[name] = (fn, never_fails)
        return fn
    return register
