"""What the runtime takes from the options (`jax_trn.config.Options`) for the hardware
model and the collectives: each NeuronCore's `Numerics` (JAX_TRN_STOCHASTIC_ROUNDING,
_SEED, JAX_TRN_STRICT_ACTIVATION_RANGES) and the forced collective algorithm
(JAX_TRN_COLLECTIVE_ALGORITHM). `jax_trn.hw` and `jax_trn.collectives` take these as
parameters and read no settings themselves.

By default these are the options of the running backend (`config.current()`: the live
options, or those it would start with), read where a core is made and where a
collective runs: the smallest step from the environment reads that used to sit in the
hardware model. Passing the client's `Options` down to those call sites removes the
lookup.
"""
from __future__ import annotations

from jax_trn import config
from jax_trn.hw.numerics import Numerics

__all__ = ["core_numerics", "collective_algorithm"]


def core_numerics(options: config.Options | None = None) -> Numerics:
    """The rounding context of a NeuronCore under `options`."""
    o = options or config.current()
    return Numerics("stochastic" if o.stochastic_rounding else "rne",
                    o.stochastic_rounding_seed, o.strict_activation_ranges)


def collective_algorithm(options: config.Options | None = None) -> str | None:
    """The algorithm every collective uses under `options` (None: the choice rule)."""
    return (options or config.current()).collective_algorithm
