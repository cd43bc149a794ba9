"""The error of the kernel language: a kernel the hardware cannot run, named by its line."""
from __future__ import annotations

from jax_trn.lower.errors import LoweringError


class KernelError(LoweringError):
    """A kernel breaks a rule of the hardware or of the language. The message names the
    kernel and the line of its source that did it ("rmsnorm_kernel at norm.py:31: ...");
    under `jax.jit` it is a compile error of the program, as any op that cannot lower."""


# Set by trace.py: the kernel being traced and its current line, for errors raised
# where the tracer is not at hand (indexing, index expressions).
_where = None


def located(msg: str) -> KernelError:
    where = _where() if _where is not None else None
    return KernelError(f"kernel {where[0]} at {where[1]}: {msg}" if where else msg)
