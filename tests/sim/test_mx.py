"""MX (microscaling) truth tables: packing, E8M0 scales, quantize_mx, nc_matmul_mx (§2.2, §4)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jax_trn.hw import CHIPS, Kernel, isa, mx
from jax_trn.hw import dtypes as dt
from tests.sim.helpers import core, tile

BF16 = ml_dtypes.bfloat16


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


def _write(c, t, values):
    c.mem(t).write(t, np.asarray(values).astype(dt.np_dtype(t.dtype)).reshape(t.shape))


def _read(c, t):
    return np.array(c.mem(t).read(t))


def test_quantize_mx_instruction_truth_table():
    src = tile((32, 8), "bfloat16")
    dst = tile((32, 2), "float8_e4m3fn_x4")
    scale = tile((4, 2), "uint8")
    x = np.ones((32, 8), np.float32)
    x[0, 0] = 448.0                  # group (partitions 0-7, values 0-3): scale 2
    x[8:16, 4:8] = 0.25              # group (8-15, 4-7): scale 2**-9
    x[31, 7] = -3.0                  # group (24-31, 4-7): scale 2**-6
    c = core("trn3")
    _write(c, src, x.astype(BF16))
    c.run(Kernel("q", [isa.QuantizeMx(dst=dst, src=src, dst_scale=scale)], {}), {})
    np.testing.assert_array_equal(_read(c, scale).astype(int) - 127, [[1, -7], [-7, -9], [-7, -7], [-7, -6]])
    values = mx.unpack(_read(c, dst), "float8_e4m3fn_x4")          # [32, 2, 4]
    assert values[0, 0, 0] == 224.0 and values[0, 0, 1] == 0.5
    back = mx.dequantize(_read(c, dst), "float8_e4m3fn_x4", _read(c, scale))
    np.testing.assert_array_equal(back.reshape(32, 8), x)         # all exactly representable


def test_quantize_mx_64_partitions_writes_the_quadrant_layout():
    src, dst = tile((64, 4), "float16"), tile((64, 1), "float8_e5m2_x4")
    scale = tile((64, 1), "float8_e8m0fnu")
    x = np.repeat(2.0 ** np.arange(8, dtype=np.float32), 8)[:, None] * np.ones((1, 4))
    c = core("trn3")
    _write(c, src, x.astype(np.float16))
    _write(c, scale, np.full((64, 1), 2.0 ** 100, np.float32))     # untouched rows keep it
    c.run(Kernel("q", [isa.QuantizeMx(dst=dst, src=src, dst_scale=scale)], {}), {})
    bits = _read(c, scale).view(np.uint8)[:, 0].astype(int) - 127
    np.testing.assert_array_equal(bits[[0, 1, 2, 3, 32, 33, 34, 35]],
                                  np.arange(8) - 15 + 1)           # 2 * 2**(g - 15)
    assert (bits[4:32] == 100).all() and (bits[36:] == 100).all()


def _mx_operand(c, data, scale, values, scale_exp):
    """Write values [P, F, 4] (exact in the element type) and per-group exponents."""
    _write(c, data, mx.pack(np.float32(values), data.dtype))
    rows = np.full((scale.num_partitions, scale.free_size), 127, np.int32)
    rows[mx.scale_rows(data.num_partitions)] = np.asarray(scale_exp) + 127
    _write(c, scale, rows.astype(np.uint8))


def _reference(values, scale_exp):
    """[K = 4P, F] float64 matrix: row 4p + i is value i of partition p x its scale."""
    v = np.float64(values) * 2.0 ** np.repeat(np.asarray(scale_exp), 8, axis=0)[..., None]
    return v.transpose(0, 2, 1).reshape(-1, v.shape[1])


@pytest.mark.parametrize("st_type, mv_type, p", [
    ("float8_e4m3fn_x4", "float8_e5m2_x4", 32),
    ("float4_e2m1fn_x4", "float8_e4m3fn_x4", 64),       # MXFP4 x MXFP8 may mix
])
def test_nc_matmul_mx(st_type, mv_type, p):
    m, n = 2, 3
    rng = np.random.default_rng(0)
    grid = np.float32([0, 0.5, 1, 1.5, 2, 3, -1, -4])        # exact in every element type
    a, b = rng.choice(grid, (p, m, 4)), rng.choice(grid, (p, n, 4))
    sa, sb = rng.integers(-3, 4, (p // 8, m)), rng.integers(-3, 4, (p // 8, n))
    st, mv = tile((p, m), st_type), tile((p, n), mv_type)
    sts, mvs = tile((mx.scale_partitions(p), m), "uint8"), tile((mx.scale_partitions(p), n), "uint8")
    d = tile((m, n), "float32", mem="psum")
    c = core("trn3")
    _mx_operand(c, st, sts, a, sa)
    _mx_operand(c, mv, mvs, b, sb)
    ins = isa.NcMatmulMx(dst=d, stationary=st, moving=mv, stationary_scale=sts, moving_scale=mvs)
    c.run(Kernel("mm", [ins, ins.__class__(**{**ins.__dict__, "accumulate": True})], {}), {})
    expected = _reference(a, sa).T @ _reference(b, sb)
    np.testing.assert_array_equal(_read(c, d), 2 * expected)
    assert ins.flops == 2 * 4 * p * m * n


def test_quantize_then_matmul_mx_tracks_the_bf16_matmul():
    k, m, n = 32, 4, 8                            # K = 128 real rows
    rng = np.random.default_rng(1)
    a = rng.normal(size=(k, 4 * m)).astype(BF16)  # src [P, 4F]: 4 K-values per packed elem
    b = rng.normal(size=(k, 4 * n)).astype(BF16)
    c = core("trn3")
    tiles = {}
    for name, x, f in (("a", a, m), ("b", b, n)):
        src, q, s = tile((k, 4 * f), "bfloat16"), tile((k, f), "float8_e4m3fn_x4"), tile((4, f), "uint8")
        _write(c, src, x)
        c.run(Kernel("q", [isa.QuantizeMx(dst=q, src=src, dst_scale=s)], {}), {})
        tiles[name] = (q, s)
    d = tile((m, n), "float32", mem="psum")
    c.run(Kernel("mm", [isa.NcMatmulMx(dst=d, stationary=tiles["a"][0], moving=tiles["b"][0],
                                      stationary_scale=tiles["a"][1],
                                      moving_scale=tiles["b"][1])], {}), {})
    ka = a.astype(np.float32).reshape(k, m, 4).transpose(0, 2, 1).reshape(4 * k, m)
    kb = b.astype(np.float32).reshape(k, n, 4).transpose(0, 2, 1).reshape(4 * k, n)
    exact = ka.T @ kb
    err = np.abs(_read(c, d) - exact).max() / np.abs(exact).max()
    assert 0 < err < 0.05                         # FP8 data, exact FP32 accumulation


def test_mx_matmul_cost_is_4x_bf16_rate_on_trn3():
    st, mv = tile((128, 128), "float8_e4m3fn_x4"), tile((128, 512), "float8_e4m3fn_x4")
    ins = isa.NcMatmulMx(dst=tile((128, 512), "float32", mem="psum", offset=0),
                         stationary=st, moving=mv,
                         stationary_scale=tile((128, 128), "uint8"),
                         moving_scale=tile((128, 512), "uint8"))
    assert ins.cycles(CHIPS["trn3"].core) == 512             # a BF16 128x128x512 matmul's
    assert ins.flops == 4 * 2 * 128 * 128 * 512


def test_quantize_mx_cost_is_4_elements_per_cycle():
    ins = isa.QuantizeMx(dst=tile((128, 512), "float8_e4m3fn_x4"), src=tile((128, 2048), "bfloat16"),
                         dst_scale=tile((128, 512), "uint8"))
    assert ins.cycles(CHIPS["trn3"].core) == 512


def test_stochastic_quantize_mx_is_unbiased():
    x = np.full((32, 4096), 1 + 2 ** -5, np.float32)    # scale 2**-7: 132 between 128, 144
    src, dst = tile((32, 4096), "bfloat16"), tile((32, 1024), "float8_e4m3fn_x4")
    scale = tile((4, 1024), "uint8")
    c = core("trn3", rounding="stochastic", seed=3)
    _write(c, src, x.astype(BF16))
    c.run(Kernel("q", [isa.QuantizeMx(dst=dst, src=src, dst_scale=scale)], {}), {})
    back = mx.dequantize(_read(c, dst), dst.dtype, _read(c, scale))
    assert set(np.unique(back)) == {1.0, 1.125}
    assert abs(back.mean() - (1 + 2 ** -5)) < 2e-3
