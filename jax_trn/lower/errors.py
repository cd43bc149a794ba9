"""The one exception of the code generator."""
from __future__ import annotations


class LoweringError(Exception):
    """The program cannot run on the hardware (or this compiler cannot lower it yet).

    Raised at compile time; the message names the op (kind, operand and result types)
    and the source location JAX attached, via `ir.Op.describe()`.
    """
