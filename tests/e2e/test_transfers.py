"""Host <-> device transfers of every dtype the hardware has; clear errors for the rest."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

DTYPES = [np.float32, np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn,
          ml_dtypes.float8_e5m2, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
          np.uint32, np.uint64, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", [(), (0,), (5,), (3, 130), (2, 0, 4)])
def test_round_trip(jax, trn_devices, dtype, shape):
    if np.dtype(dtype).itemsize == 8 and not jax.config.jax_enable_x64:
        pytest.skip("64-bit types need jax_enable_x64")
    a = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
    y = jax.device_put(a, trn_devices[2])
    assert y.devices() == {trn_devices[2]}
    assert y.dtype == a.dtype and y.shape == a.shape
    np.testing.assert_array_equal(np.asarray(y), a)


def test_round_trip_64_bit(jax, trn_devices):
    with jax.enable_x64(True):
        for dtype in (np.int64, np.uint64):
            a = np.array([0, 1, 2**40, 2**62], dtype)
            np.testing.assert_array_equal(np.asarray(jax.device_put(a, trn_devices[1])), a)


def test_non_contiguous_host_array(jax, trn):
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    np.testing.assert_array_equal(np.asarray(jax.device_put(a, trn)), a)


def test_complex64_round_trips(jax, trn):
    a = (np.arange(6) - 2.5j * np.arange(6)).astype(np.complex64).reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(jax.device_put(a, trn)), a)


def test_unsupported_dtype_is_a_clear_error(jax, trn):
    with jax.enable_x64(True):
        with pytest.raises(Exception, match="complex128 is not supported by the Trainium"):
            jax.device_put(np.ones(3, np.complex128), trn)


def test_float64_is_a_clear_error_under_x64(jax, trn):
    with jax.enable_x64(True):
        with pytest.raises(Exception, match="float64 is not supported"):
            jax.device_put(np.ones(3, np.float64), trn)


def test_memory_stats_track_buffers(jax, trn_devices):
    d = trn_devices[6]
    before = d.memory_stats()["bytes_in_use"]
    y = jax.device_put(np.ones((1024,), np.float32), d)
    stats = d.memory_stats()
    assert stats["bytes_in_use"] == before + 4096
    assert stats["bytes_limit"] == 96 * 2**30 // 8
    y.delete()
    assert d.memory_stats()["bytes_in_use"] == before


def test_copy_between_devices(jax, trn_devices):
    a = np.arange(10, dtype=np.int32)
    y = jax.device_put(jax.device_put(a, trn_devices[0]), trn_devices[4])
    assert y.devices() == {trn_devices[4]}
    np.testing.assert_array_equal(np.asarray(y), a)


def test_device_put_of_views_with_negative_strides(jax, trn):
    u = np.arange(24, dtype=np.float32).reshape(4, 6)
    for v in (u[::-1], u[:, ::-2], u[::-2, ::-1].T):
        np.testing.assert_array_equal(np.asarray(jax.device_put(v, trn)), v)
