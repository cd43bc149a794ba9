"""The key-value store the processes of a multi-controller run share (issue 17).

JAX's coordination service (started by `jax.distributed.initialize`) gives every PJRT
client one store: `pjrt_plugin` wraps the three callbacks of `PJRT_Client_Create` as a
`KVStore` (put bytes, blocking get with a timeout, try-get). The runtime only sees this
interface; `LocalKVStore` is the same store within one process (tests, and the
single-process reference of a multi-process run).

Keys are strings; values bytes. A key is written once (the coordination service refuses
to overwrite by default), so every key names what it holds uniquely: see
`spmd_remote.Exchange` for the collectives' keys. All keys of jax-trn start with
`PREFIX` (the store is shared with JAX and other plugins).
"""
from __future__ import annotations

import threading
import time

PREFIX = "jax_trn/"
# How long a process waits for another's data before it fails (JAX_TRN_* settings may
# override this later): long enough for a slow peer's simulated step, short enough that a
# dead peer fails the run instead of hanging it.
DEFAULT_TIMEOUT_S = 300.0


class KVError(RuntimeError):
    """A store operation that failed: `code` the PJRT/absl status name
    ("NOT_FOUND", "DEADLINE_EXCEEDED", ...)."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class KVTimeout(KVError, TimeoutError):
    """A blocking get that ran out of time: the peer that should have written the key
    is dead, stuck or took another path through the program."""


class KVStore:
    """The store's three operations (see module doc)."""

    def put(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def get(self, key: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bytes:
        """The value of `key`, waiting until some process puts it; KVTimeout after
        `timeout_s` seconds."""
        raise NotImplementedError

    def try_get(self, key: str) -> bytes | None:
        """The value of `key`, or None if nobody has put it yet."""
        raise NotImplementedError

    def delete_dir(self, directory: str) -> bool:
        """Deletes `directory` and every key under it (`directory/...`), if this store
        can; returns whether it did (the PJRT callbacks have no delete)."""
        return False


class LocalKVStore(KVStore):
    """A store within one process (threads may share it)."""

    def __init__(self):
        self._values: dict[str, bytes] = {}
        self._changed = threading.Condition()

    def put(self, key: str, value: bytes) -> None:
        with self._changed:
            if key in self._values:
                raise KVError("ALREADY_EXISTS", f"key {key!r} was already written")
            self._values[key] = bytes(value)
            self._changed.notify_all()

    def get(self, key: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bytes:
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while key not in self._values:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KVTimeout("DEADLINE_EXCEEDED",
                                    f"no value for key {key!r} after {timeout_s:g} s")
                self._changed.wait(left)
            return self._values[key]

    def try_get(self, key: str) -> bytes | None:
        with self._changed:
            return self._values.get(key)

    def delete_dir(self, directory: str) -> bool:
        with self._changed:
            for key in [k for k in self._values
                        if k == directory or k.startswith(directory + "/")]:
                del self._values[key]
        return True
