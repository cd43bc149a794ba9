"""Errors raised by hlo_passes; each message names the op and its source location."""


class HloImportError(Exception):
    """The program could not be deserialized or imported into our IR."""


class VerifyError(Exception):
    """The IR broke an invariant (SSA, types, or a per-op shape rule)."""
