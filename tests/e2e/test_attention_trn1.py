"""Attention on Trn1 (NeuronCore-v2, no dma_transpose): the flash forward and backward
kernels load Q^T / K^T / V^T / dO^T / O^T and the logsumexp columns through TensorE
transposes instead (jax_trn/lower/transposed.py), the forward reading the rows of
adjacent heads with one descriptor. Before, every attention on Trn1 ran
op by op (1.2% MFU on benchmarks/models.py's dpa row). Checked against the CPU backend,
values and gradients, in a process whose system is trn1.2xlarge; and that the kernels
of a Trn1 program hold no dma_transpose."""
from __future__ import annotations

import json

import pytest

from tests.conftest import run_python

_CASES = r"""
import json, sys
import numpy as np, jax, jax.numpy as jnp, jax_trn
sys.path.insert(0, ".")
from tests.e2e.test_attention_bwd import FWD_NOTE, _args, _fused, _run

trn, cpu = jax.devices("trn")[0], jax.devices("cpu")[0]


def grad(f):
    def loss(q, k, v, *rest):
        *bias, w = rest
        return (f(q, k, v, *bias).astype(jnp.float32) * w).sum()
    return jax.value_and_grad(loss, argnums=(0, 1, 2))


def causal(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True)


def plain(q, k, v):
    return jax.nn.dot_product_attention(q, k, v)


def masked(q, k, v):         # a compile-time mask with partial blocks, -1e9 fill
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) / 8.0
    keep = jnp.arange(s.shape[-1])[None, :] <= jnp.arange(s.shape[-2])[:, None] + 40
    p = jax.nn.softmax(jnp.where(keep, s, -1e9).astype(jnp.float32), -1).astype(q.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


pad = np.arange(256) < 200


def bhsd(q, k, v):                    # [B, H, S, D]: heads not adjacent, runs of one;
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.125   # 4 heads of 2 jobs each, more
    s = jnp.where(jnp.tril(jnp.ones((256, 256), bool)), s, -1e9)   # than Q_AHEAD
    p = jax.nn.softmax(s.astype(jnp.float32), -1).astype(q.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", p, v)


def runtime_both(q, k, v, bias):      # a runtime mask and an additive bias [B, N, T, S]
    mask = (q[:, None, :, 0, :1] < 2.0) & pad
    return jax.nn.dot_product_attention(q, k, v, bias, mask=mask)


def padding(q, k, v):                 # flax's make_attention_mask: rows & columns of a
    valid = (q[:, :, 0, 0] > -5.0) & (jnp.arange(256)[None, :] < 180)   # runtime vector
    mask = (valid[:, None, :, None] & valid[:, None, None, :])
    return jax.nn.dot_product_attention(q, k, v, mask=mask)


cases = {
    "causal_gqa": (causal, [(1, 256, 4, 64), (1, 256, 2, 64), (1, 256, 2, 64),
                            (1, 256, 4, 64)]),
    "plain_tails": (plain, [(1, 200, 2, 128), (1, 300, 2, 128), (1, 300, 2, 128),
                            (1, 200, 2, 128)]),
    "masked": (masked, [(2, 256, 1, 64)] * 4),
    "runtime_both": (runtime_both, [(1, 256, 2, 64)] * 3 + [(1, 2, 256, 256),
                                                          (1, 256, 2, 64)]),
    "padding": (padding, [(1, 256, 2, 64)] * 4),
    "bhsd": (bhsd, [(1, 4, 256, 64)] * 4),
}
out = {}
for name, (f, shapes) in cases.items():
    got, ref, kernels = _run(jax, trn, cpu, grad(f), _args(shapes, 3))
    errs = []
    for a, b in zip(got, ref):
        a, b = a.astype(np.float64), b.astype(np.float64)
        errs.append(float(np.max(np.abs(a - b) - (2e-2 + 2e-2 * np.abs(b)))))
    dma_t = sum(type(i).__name__ == "DmaTranspose" for k in kernels
                for i in k.kernel.instructions)
    forward = [k for k in kernels if any(n.startswith(FWD_NOTE) for n in k.kernel.notes)]
    widest = max(i.src.pattern[-1][1] for k in forward for i in k.kernel.instructions
                 if type(i).__name__ == "DmaCopy" and hasattr(i.src, "pattern"))
    out[name] = {"fused": _fused(kernels), "excess": max(errs), "dma_transposes": dma_t,
                 "widest_row": widest}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def trn1_results():
    r = run_python(_CASES, env={"JAX_TRN_SYSTEM": "trn1.2xlarge"}, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["causal_gqa", "plain_tails", "masked", "runtime_both",
                                  "padding", "bhsd"])
def test_trn1_attention_runs_flash_kernels_and_matches_cpu(trn1_results, case):
    got = trn1_results[case]
    assert got["fused"] == [True, True]           # forward and backward flash kernels
    assert got["dma_transposes"] == 0             # Trn1 has none (§3.4)
    assert got["excess"] <= 0, got                # within bf16 tolerances of CPU


def test_trn1_attention_loads_the_rows_of_adjacent_heads_together(trn1_results):
    """[B, S, N, H] (jax.nn.dot_product_attention): the forward DMAs the rows of the 4 q
    heads (and 2 kv heads) in one descriptor each, 4 x 64 elements, not 64 (§3.4)."""
    assert trn1_results["causal_gqa"]["widest_row"] == 4 * 64
