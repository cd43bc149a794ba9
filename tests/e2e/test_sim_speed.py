"""Issue 14's speed-ups keep behaviour: tile math on one BLAS thread only inside our
calls (`runtime.blas`), timelines computed once and reused (`runtime.replay`)."""
from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits


def _blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def test_tile_math_runs_on_one_blas_thread_and_the_users_setting_is_kept(jax, trn):
    seen = []

    def host(v):
        seen.append(_blas_threads())
        return np.asarray(v)

    def f(a, b):
        c = a @ b
        return jax.pure_callback(host, jax.ShapeDtypeStruct(c.shape, c.dtype), c)

    a = np.ones((64, 64), np.float32)
    with threadpool_limits(limits=2, user_api="blas"):
        out = jax.jit(f)(jax.device_put(a, trn), jax.device_put(a, trn))
        np.testing.assert_array_equal(np.asarray(out), a @ a)
        after = _blas_threads()
    assert seen and all(n == 1 for n in seen[0]), seen
    assert after and all(n == 2 for n in after), after


def test_one_thread_nests_and_restores():
    from jax_trn.runtime import blas
    with threadpool_limits(limits=2, user_api="blas"):
        with blas.one_thread():
            with blas.one_thread():
                assert set(_blas_threads()) == {1}
            assert set(_blas_threads()) == {1}
        assert set(_blas_threads()) == {2}
        with blas.one_thread(needed=False):
            assert set(_blas_threads()) == {2}
