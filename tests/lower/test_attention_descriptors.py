"""Issue 15 point 3 for the flash-attention kernels (jax_trn/lower/attention.py,
attention_bwd.py) at head dim 64 in the [B, S, N, H] layout: no DMA whose descriptors
(contiguous chunks, `hw.costs.dma_shape`) are below 512 bytes. A head's row there is 128
bytes; the kernels move runs of adjacent heads per DMA (`attention_layout.HeadStores`)
and store the rows' logsumexp as rows (`attention_layout.LseRows`), not as [qt, 1]
columns of 4-byte descriptors. (Left out: the compile-time mask's blocks, read once
per distinct partially masked block, [128, 128] bool: not per head traffic.)"""
from __future__ import annotations

import pytest

from jax_trn.hw import costs, isa

NOTES = ("attention: flash-attention kernel", "attention_bwd: flash-attention backward")


def _kernels(ex):
    kernels = [k for k in ex.kernels if any(n.startswith(NOTES) for n in k.kernel.notes)]
    return kernels, ex.chip_spec.core


def _dpa(jax, shape):
    """jax.nn.dot_product_attention, causal, forward."""
    import jax.numpy as jnp
    import jax_trn
    q = jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    return _kernels(jax_trn.estimate(
        lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True), q, q, q,
        system="trn2.3xlarge"))


def _linen_grad(jax, shape):
    """The LM row's attention (benchmarks/models.py): flax linen
    MultiHeadDotProductAttention with a causal mask, gradient of params and input."""
    import flax.linen as nn
    import jax.numpy as jnp
    import jax_trn
    b, s, heads, d = shape
    layer = nn.MultiHeadDotProductAttention(heads, qkv_features=heads * d,
                                            dtype=jnp.bfloat16)
    x = jax.ShapeDtypeStruct((b, s, heads * d), jnp.float32)
    with jax.default_device(jax.devices("cpu")[0]):
        params = jax.eval_shape(layer.init, jax.random.key(0), x, x)

    def loss(p, x):
        mask = nn.make_causal_mask(jnp.zeros(x.shape[:2], jnp.int32))
        return layer.apply(p, x, x, mask=mask).astype(jnp.float32).sum()
    return _kernels(jax_trn.estimate(jax.grad(loss, argnums=(0, 1)), params, x,
                                     system="trn2.3xlarge"))


def _constant(src) -> bool:
    return isinstance(src, isa.DramAP) and src.tensor.startswith("const:")


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("shape", [(2, 256, 8, 64), (1, 384, 16, 64)])
def test_no_dma_descriptor_below_512_bytes(jax, grad, shape):
    kernels, spec = (_linen_grad if grad else _dpa)(jax, shape)
    assert len(kernels) == 1 + grad, [k.name for k in kernels]
    small = []
    for k in kernels:
        for ins in k.kernel.instructions:
            if isinstance(ins, isa.DmaCopy) and not _constant(ins.src):
                chunk, _ = costs.dma_shape(ins, spec)
                if chunk < 512:
                    small.append((k.name, type(ins).__name__, chunk, ins.nbytes))
    assert not small, small[:8]
