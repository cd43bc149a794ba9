"""pjrt_plugin: the PJRT C API (version 0.112) implemented in Python with ctypes.

JAX discovers this module through the `jax_plugins` entry point and calls
`initialize()`, which registers the platform "trn" (and `jax_trn.jax_rules`, the few
JAX lowering rules trn needs). The plugin knows nothing about Trainium: each C entry
point becomes one call into `jax_trn.runtime`.
"""
from __future__ import annotations

import threading

PLATFORM = "trn"
# Below the CPU backend (priority 0), so `jax.devices()` stays CPU unless asked:
# use jax.devices("trn"), or JAX_PLATFORMS=trn,cpu to make trn the default.
PRIORITY = -100

_lock = threading.Lock()
_table = None


def get_api():
    """The process-wide PJRT_Api table (built once)."""
    global _table
    with _lock:
        if _table is None:
            from ._api import build_api
            _table = build_api()
    return _table


def initialize() -> None:
    from jax._src import xla_bridge
    from ._api import capsule
    xla_bridge.register_plugin(PLATFORM, priority=PRIORITY, c_api=capsule(get_api()))
    from jax_trn.jax_rules import register      # JAX lowering rules for platform "trn"
    register()
