"""`nki.typing`'s annotations, accepted and ignored: `def k(a: nt.tensor[128, 512]):`."""
from __future__ import annotations


class _Annotation:
    def __class_getitem__(cls, item):
        return cls


class tensor(_Annotation):
    """An HBM tensor argument (its shape and dtype come from the call)."""


class scalar(_Annotation):
    """A static scalar argument."""
