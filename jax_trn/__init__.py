"""jax-trn: a JAX PJRT plugin for a simulated AWS Trainium.

    import jax, jax_trn
    x = jax.device_put(jnp.ones((1024, 1024), jnp.bfloat16), jax.devices("trn")[0])
    with jax_trn.profile() as prof:
        jax.jit(lambda a: a @ a)(x).block_until_ready()
    prof.executions[-1].simulated_time_s
    print(prof.summary()); prof.save_trace("trace.json")     # ui.perfetto.dev
    print(jax_trn.compare(lambda a: a @ a, x))                # Trn1 vs Trn2 vs Trn3
    jax_trn.estimate(step, *shapes, system="trn3-ultraserver")   # timing only
"""
from __future__ import annotations

__version__ = "0.1.0"

import jax_trn.cluster  # noqa: E402,F401  (jax.distributed.initialize() under jax_trn.launch)
from jax_trn.comparison import compare  # noqa: E402
from jax_trn.config import configure, get_system  # noqa: E402
from jax_trn.estimation import estimate, timing_only  # noqa: E402
from jax_trn.profiler import last_execution, profile  # noqa: E402
from jax_trn.systems import SYSTEMS  # noqa: E402

__all__ = ["profile", "last_execution", "compare", "estimate", "timing_only", "configure", "get_system", "SYSTEMS", "__version__"]
