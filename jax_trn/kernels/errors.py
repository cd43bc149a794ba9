"""The error of the kernel language: a kernel the hardware cannot run, named by its line."""
from __future__ import annotations

from jax_trn.lower.errors import LoweringError


class KernelError(LoweringError):
    """A kernel breaks a rule of the hardware or of the language. The message names the
    kernel and the line of its source that did it ("rmsnorm_kernel at norm.py:31: ...");
    under `jax.jit` it is a compile error of the program, as any op that cannot lower."""
