"""convolution on trn against JAX's CPU backend: 1-D/2-D/3-D, layouts, strides, padding,
dilations, groups, transposed convs, gradients and a small CNN."""
from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.test_ops import _rand, check

NCHW = ("NCHW", "OIHW", "NCHW")
NHWC = ("NHWC", "HWIO", "NHWC")
F32 = {"rtol": 1e-5, "atol": 1e-4}    # f32 operands at HIGHEST precision


def _data(xshape, wshape, seed=0, dtype="float32"):
    rng = np.random.default_rng(seed)
    return _rand(xshape, dtype, rng, -1.0, 1.0), _rand(wshape, dtype, rng, -1.0, 1.0)


def _shapes(layout, n, c, hw, o, k):
    if layout == "NCHW":
        return (n, c, *hw), (o, c, *k)
    return (n, *hw, c), (*k, c, o)


def _check_conv(jax, trn, cpu, x, w, **kw):
    with jax.default_matmul_precision("highest"):
        check(jax, trn, cpu, lambda x, w: jax.lax.conv_general_dilated(x, w, **kw), x, w, **F32)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("padding", ["SAME", "VALID", ((1, 2), (0, 1))], ids=str)
def test_conv2d(jax, trn, cpu, layout, stride, padding):
    x, w = _data(*_shapes(layout, 2, 3, (9, 8), 5, (3, 3)), seed=stride)
    _check_conv(jax, trn, cpu, x, w, window_strides=(stride, stride), padding=padding,
                dimension_numbers=NCHW if layout == "NCHW" else NHWC)


@pytest.mark.parametrize("c,o,layout,stride", [(3, 130, "NHWC", 1), (130, 130, "NCHW", 1),
                                               (130, 7, "NHWC", 1), (160, 3, "NCHW", 2)])
def test_conv2d_channel_tiles(jax, trn, cpu, c, o, layout, stride):
    """Channels not multiples of 128 and above 128: contraction and output tiles (with
    a stride, the rows of every ci tile of two bands are in flight at once)."""
    x, w = _data(*_shapes(layout, 2 if stride > 1 else 1, c, (6, 5), o, (3, 3)), seed=c + o)
    _check_conv(jax, trn, cpu, x, w, window_strides=(stride, stride), padding="SAME",
                dimension_numbers=NCHW if layout == "NCHW" else NHWC)


@pytest.mark.parametrize("stride,rhs_dilation", [((1, 2), (2, 3)), ((2, 2), (2, 2))])
def test_conv2d_rhs_dilation(jax, trn, cpu, stride, rhs_dilation):
    """rhs dilation; with the stride dividing it every tap reads one phase (then taps
    are packed, shifted by rd / s)."""
    x, w = _data((2, 4, 10, 9), (3, 4, 3, 2), seed=3)
    _check_conv(jax, trn, cpu, x, w, window_strides=stride, padding="SAME",
                rhs_dilation=rhs_dilation)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv_transpose(jax, trn, cpu, layout):
    """lhs dilation: jax.lax.conv_transpose (a strided transposed conv)."""
    dn = NCHW if layout == "NCHW" else NHWC
    x, w = _data(*_shapes(layout, 2, 4, (5, 6), 3, (3, 3)), seed=4)
    with jax.default_matmul_precision("highest"):
        check(jax, trn, cpu, lambda x, w: jax.lax.conv_transpose(
            x, w, (2, 2), "SAME", dimension_numbers=dn), x, w, **F32)
    _check_conv(jax, trn, cpu, x, w, window_strides=(1, 1), padding=((2, 1), (0, 2)),
                lhs_dilation=(2, 3), dimension_numbers=dn)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_conv2d_top_padding_only(jax, trn, cpu, layout):
    """Pad rows but no pad columns: band rows are DMAed straight to their padded place."""
    x, w = _data(*_shapes(layout, 1, 50, (10, 12), 2, (3, 2)), seed=17)
    _check_conv(jax, trn, cpu, x, w, window_strides=(1, 1), padding=((2, 0), (0, 0)),
                rhs_dilation=(1, 2), dimension_numbers=NCHW if layout == "NCHW" else NHWC)


@pytest.mark.parametrize("stride", [1, 2])
def test_conv2d_negative_padding(jax, trn, cpu, stride):
    """Negative padding crops the input (only cases where the CPU backend agrees with
    pad-then-conv: it differs when one side is negative and the other positive)."""
    x, w = _data((1, 2, 8, 9), (3, 2, 3, 3), seed=5)
    _check_conv(jax, trn, cpu, x, w, window_strides=(stride, stride),
                padding=((-1, 0), (-2, -1)))


@pytest.mark.parametrize("stride,padding", [(1, "SAME"), (3, ((2, 1),))], ids=str)
def test_conv1d(jax, trn, cpu, stride, padding):
    x, w = _data((2, 3, 40), (5, 3, 4), seed=6)
    _check_conv(jax, trn, cpu, x, w, window_strides=(stride,), padding=padding)


def test_conv1d_wide_rows(jax, trn, cpu):
    """Output rows longer than one PSUM bank (512 FP32) are cut in column chunks."""
    x, w = _data((1, 4, 1100), (2, 4, 5), seed=7)
    _check_conv(jax, trn, cpu, x, w, window_strides=(1,), padding="SAME",
                dimension_numbers=("NCH", "OIH", "NCH"))


@pytest.mark.parametrize("stride,lhs_dilation", [(2, 1), (1, 2)])
def test_conv1d_phases_of_wide_rows(jax, trn, cpu, stride, lhs_dilation):
    """A strided / lhs-dilated row wider than 128 columns is split into phases by one
    selection matmul per 128-column block, accumulated in PSUM."""
    x, w = _data((2, 3, 300 // lhs_dilation), (2, 3, 4), seed=16)
    _check_conv(jax, trn, cpu, x, w, window_strides=(stride,), padding=((2, 1),),
                lhs_dilation=(lhs_dilation,))


@pytest.mark.parametrize("mode", ["full", "same", "valid"])
def test_jnp_convolve(jax, trn, cpu, mode):
    import jax.numpy as jnp
    rng = np.random.default_rng(8)
    a, v = _rand((50,), "float32", rng), _rand((7,), "float32", rng)
    with jax.default_matmul_precision("highest"):
        check(jax, trn, cpu, lambda a, v: jnp.convolve(a, v, mode=mode), a, v, **F32)


@pytest.mark.parametrize("groups,c,o", [(2, 6, 4), (8, 8, 16), (130, 130, 130)], ids=str)
def test_grouped_and_depthwise(jax, trn, cpu, groups, c, o):
    """feature_group_count: small groups pack into block-diagonal 128-channel weights."""
    x, w = _data((2, c, 7, 6), (o, c // groups, 3, 3), seed=groups)
    _check_conv(jax, trn, cpu, x, w, window_strides=(1, 1), padding="SAME",
                feature_group_count=groups)


def test_batch_group_count(jax, trn, cpu):
    x, w = _data((4, 3, 6, 6), (6, 3, 3, 3), seed=9)
    _check_conv(jax, trn, cpu, x, w, window_strides=(1, 1), padding="VALID",
                batch_group_count=2)


def test_conv3d(jax, trn, cpu):
    x, w = _data((1, 2, 5, 6, 7), (3, 2, 3, 3, 2), seed=10)
    _check_conv(jax, trn, cpu, x, w, window_strides=(1, 2, 1), padding="SAME")


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_grad(jax, trn, cpu, layout, groups):
    """d/dx (lhs-dilated conv) and d/dw (batch <-> feature swapped, the stride as rhs
    dilation; batch_group_count for grouped convs) of a strided conv."""
    import jax.numpy as jnp
    dn = NCHW if layout == "NCHW" else NHWC
    x, w = _data(*_shapes(layout, 2, 4, (8, 7), 6, (3, 3)), seed=11)
    w = w[:, : 4 // groups] if layout == "NCHW" else w[:, :, : 4 // groups]

    def loss(x, w):
        y = jax.lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=dn,
                                         feature_group_count=groups)
        return jnp.sum(jnp.tanh(y))
    with jax.default_matmul_precision("highest"):
        check(jax, trn, cpu, jax.grad(loss, argnums=(0, 1)), x, w, **F32)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_default_precision_bf16_operands(jax, trn, cpu, layout):
    """DEFAULT precision: f32 operands run as bf16 with FP32 accumulation (an NHWC f32
    input is made channel-major by relayout: dma_transpose cannot cast)."""
    dn = NCHW if layout == "NCHW" else NHWC
    x, w = _data(*_shapes(layout, 2, 16, (8, 8), 8, (3, 3)), seed=12)
    check(jax, trn, cpu, lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=dn), x, w, rtol=2e-2, atol=3e-2)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_bf16_in_f32_out(jax, trn, cpu, layout):
    """bf16 operands (read without a cast: dma_transpose for NHWC rows and OIHW
    weights), f32 result via preferred_element_type."""
    dn = NCHW if layout == "NCHW" else NHWC
    x, w = _data(*_shapes(layout, 2, 5, (6, 6), 4, (3, 3)), seed=13, dtype="bfloat16")
    check(jax, trn, cpu, lambda x, w: jax.lax.conv_general_dilated(
        x, w, (1, 1), "SAME", dimension_numbers=dn, preferred_element_type=np.float32),
        x, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("c,k,stride,padding", [
    (3, (7, 7), 2, ((3, 3), (3, 3))),     # ResNet stem: polyphase, no tap packing
    (20, (5, 5), 1, "SAME"),              # packing whole kernel rows (6 replicas -> 5)
    (8, (1, 20), 1, "SAME"),              # packing runs of 16 kw, then the last 4
    (48, (3, 3), 1, ((0, 2), (1, 0))),    # 2 replicas: pairs of kw, then singles
], ids=str)
def test_tap_packing_and_kernel_shapes(jax, trn, cpu, c, k, stride, padding):
    x, w = _data((2, c, 13, 24), (6, c, *k), seed=c)
    _check_conv(jax, trn, cpu, x, w, window_strides=(stride, stride), padding=padding)


def test_small_cnn(jax, trn, cpu):
    """conv -> relu -> conv stride 2 -> global mean -> dense."""
    import jax.numpy as jnp
    rng = np.random.default_rng(14)
    x = _rand((2, 12, 12, 3), "float32", rng, -1.0, 1.0)
    w1, w2 = _rand((3, 3, 3, 8), "float32", rng, -0.5, 0.5), _rand((3, 3, 8, 16), "float32", rng, -0.5, 0.5)
    dense = _rand((16, 10), "float32", rng, -0.5, 0.5)

    def cnn(x, w1, w2, dense):
        y = jax.nn.relu(jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=NHWC))
        y = jax.lax.conv_general_dilated(y, w2, (2, 2), "SAME", dimension_numbers=NHWC)
        return jnp.mean(y, axis=(1, 2)) @ dense
    with jax.default_matmul_precision("highest"):
        check(jax, trn, cpu, cnn, x, w1, w2, dense, **F32)


def test_four_spatial_dims_is_a_lowering_error(jax, trn):
    x, w = _data((1, 1, 3, 3, 3, 3), (1, 1, 2, 2, 2, 2))
    f = jax.jit(lambda x, w: jax.lax.conv_general_dilated(x, w, (1,) * 4, "VALID"))
    with pytest.raises(Exception) as err:
        f(jax.device_put(x, trn), jax.device_put(w, trn))
    msg = str(err.value)
    assert "convolution" in msg and "float32[1,1,3,3,3,3]" in msg and "test_conv.py" in msg


@pytest.mark.parametrize("layout,n,c,padding,stride", [
    ("NCHW", 2, 3, "SAME", 1), ("NHWC", 2, 3, "SAME", 1), ("NCH", 1, 130, ((2, 0),), 1),
    ("NCHW", 2, 3, "SAME", 2), ("NHWC", 2, 3, ((1, 2), (0, 1)), 2)], ids=str)
def test_weight_grad_contracts_over_the_window(jax, trn, cpu, layout, n, c, padding, stride):
    """d/dw of a conv (a window of 12x12 positions for a 3x3 output, or 64 for 3 in
    1-D): the window is the contraction (conv/wgrad.py); 130 input channels tile the
    output; a forward stride is the rhs dilation: the input is split into phases."""
    import jax.numpy as jnp
    dn = {"NCHW": NCHW, "NHWC": NHWC, "NCH": ("NCH", "OIH", "NCH")}[layout]
    shapes = ((n, c, 64), (4, c, 3)) if layout == "NCH" else \
        _shapes(layout, n, c, (12 * stride, 12 * stride), 4, (3, 3))
    x, w = _data(*shapes, seed=15)

    def loss(w, x):
        y = jax.lax.conv_general_dilated(x, w, (stride,) * (x.ndim - 2), padding,
                                         dimension_numbers=dn)
        return jnp.sum(jnp.tanh(y))
    with jax.default_matmul_precision("highest"):
        check(jax, trn, cpu, jax.grad(loss), w, x, **F32)


@pytest.mark.parametrize("layout,stride", [("NCHW", 1), ("NHWC", 2)])
def test_weight_grad_window_in_row_blocks(jax, trn, cpu, monkeypatch, layout, stride):
    """A window too tall for SBUF (ResNet's 7x7 stem at 224x224) is contracted in
    blocks of window rows, each with its own input rows (here blocks of 5 of 12)."""
    import jax.numpy as jnp

    from jax_trn.lower.conv import wgrad as conv_wgrad
    monkeypatch.setattr(conv_wgrad, "_window_rows", lambda cv, dtype, budget: 5)
    dn = NCHW if layout == "NCHW" else NHWC
    x, w = _data(*_shapes(layout, 2, 3, (12 * stride, 12 * stride), 4, (3, 3)), seed=18)

    def loss(w, x):
        y = jax.lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=dn)
        return jnp.sum(jnp.tanh(y))
    with jax.default_matmul_precision("highest"):
        check(jax, trn, cpu, jax.grad(loss), w, x, **F32)
