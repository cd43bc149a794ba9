"""MX (microscaling) truth tables: packing, E8M0 scales, group quantization (§2.2, §4)."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.hw import mx


@pytest.mark.parametrize("packed, values, raw", [
    ("float8_e4m3fn_x4", [1, 2, -0.5, 448], 0x7EB04038),    # bytes 38 40 B0 7E, value 0 low
    ("float8_e5m2_x4", [1, 2, -0.5, 57344], 0x7BB8403C),
    ("float4_e2m1fn_x4", [1, 2, -0.5, 6], 0x7942),            # nibbles 2 4 9 7
])
def test_pack_unpack(packed, values, raw):
    v = np.float32(values).reshape(1, 1, 4)
    assert int(mx.pack(v, packed)[0, 0]) == raw
    np.testing.assert_array_equal(mx.unpack(mx.pack(v, packed), packed), v)


@pytest.mark.parametrize("partitions, rows", [
    (32, [0, 1, 2, 3]),                      # a 32-partition tile: a 4-partition scale tile
    (64, [0, 1, 2, 3, 32, 33, 34, 35]),      # else: the first 4 partitions of each quadrant
    (128, [0, 1, 2, 3, 32, 33, 34, 35, 64, 65, 66, 67, 96, 97, 98, 99]),
])
def test_scale_layout(partitions, rows):
    np.testing.assert_array_equal(mx.scale_rows(partitions), rows)
    assert mx.scale_partitions(partitions) == (4 if partitions == 32 else partitions)


def _rne(x, dtype):
    return x.astype(dtype)


@pytest.mark.parametrize("group, element, scale_bits", [
    ([448.0] + [1.0] * 31, "float8_e4m3fn", 128),    # 2 * 2**(8 - 8): twice OCP's 2**0
    ([1.0] * 32, "float8_e4m3fn", 120),              # 2 * 2**(0 - 8)
    ([3.0] * 32, "float8_e5m2", 114),                # 2 * 2**(1 - 15)
    ([0.0] * 32, "float8_e4m3fn", 0),                # all zero: the smallest scale
    ([np.inf] + [1.0] * 31, "float8_e4m3fn", 255),   # Inf: NaN scale
    ([np.nan] + [1.0] * 31, "float8_e5m2", 255),
    ([2.0 ** -140] * 32, "float8_e4m3fn", 0),        # clamped at 2**-127
])
def test_quantize_scale(group, element, scale_bits):
    x = np.float32(group).reshape(8, 4)
    _, bits = mx.quantize(x, element, _rne)
    assert bits.shape == (1, 1) and int(bits[0, 0]) == scale_bits


def test_quantize_never_overflows_the_element_type():
    x = np.float32([480.0, 479.0, -500, 1] + [0.0] * 28).reshape(8, 4)   # amax 500
    codes, bits = mx.quantize(x, "float8_e4m3fn", _rne)
    scale = 2.0 ** (int(bits[0, 0]) - 127)
    assert scale == 2.0                                   # OCP's 2**0: 500 -> NaN in e4m3fn
    assert np.isfinite(codes.astype(np.float32)).all()
    np.testing.assert_array_equal(codes.astype(np.float32).reshape(-1)[:4] * scale,
                                  [480, 480, -512, 1])


def test_mx_groups_isolate_an_outlier():
    """The Trn3 talk's example: one outlier 1000x the rest. Per-tensor absmax scaling
    would squash every small value; with MX only the outlier's own group loses them."""
    small = np.float32(np.linspace(0.001, 0.002, 32))
    outlier_group = small.copy()
    outlier_group[0] = 1000.0
    x = np.concatenate([outlier_group, small]).reshape(16, 4)     # groups: partitions 0-7, 8-15
    codes, bits = mx.quantize(x, "float8_e4m3fn", _rne)
    scales = 2.0 ** (bits.astype(np.int32) - 127)
    back = codes.astype(np.float32).reshape(16, 4) * np.repeat(scales, 8, axis=0)
    first, second = back[:8].reshape(-1), back[8:].reshape(-1)
    assert first[0] == 1024.0 and (first[1:] == 0).all()          # squashed next to the outlier
    rel = np.abs(second - x[8:].reshape(-1)) / x[8:].reshape(-1)
    assert rel.max() <= 2.0 ** -4                                  # 3 mantissa bits, RNE
