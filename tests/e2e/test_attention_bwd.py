"""Gradients of attention on trn against the CPU backend: the attention-bwd-fusion pass
(hlo_passes/passes/attention_bwd_fusion.py) makes the joint forward + backward graph a
forward fusion that also writes logsumexp and one "attention_bwd" fusion, lowered as
flash kernels (jax_trn/lower/attention.py, attention_bwd.py). Each test checks that the
kernels really ran (their notes), not only the numbers."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import assert_close
from tests.e2e.test_attention import causal_attention
from tests.e2e.test_attention_forms import dropout_attention

FWD_NOTE = "attention: flash-attention kernel"
BWD_NOTE = "attention_bwd: flash-attention backward kernel"


def _args(shapes, seed, dtype="bfloat16"):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32).astype(np.dtype(dtype))
            for s in shapes]


def _run(jax, trn, cpu, f, args):
    """(trn results, cpu results, trn kernel records) of jit(f)(*args)."""
    import jax_trn
    g = jax.jit(f)
    with jax_trn.profile() as prof:
        out = jax.block_until_ready(g(*(jax.device_put(a, trn) for a in args)))
    ref = g(*(jax.device_put(a, cpu) for a in args))
    leaves = jax.tree_util.tree_leaves
    return [np.asarray(x) for x in leaves(out)], [np.asarray(x) for x in leaves(ref)], \
        prof.executions[-1].kernels


def _benchmarks_compiler():
    """benchmarks/compiler.py (it imports its sibling modules by their plain names)."""
    import importlib
    import os
    import sys
    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module("compiler")


def _notes(kernels) -> list[str]:
    return [n for k in kernels for n in k.kernel.notes]


def _fused(kernels) -> tuple[bool, bool]:
    notes = _notes(kernels)
    return any(n.startswith(FWD_NOTE) for n in notes), \
        any(n.startswith(BWD_NOTE) for n in notes)


def _vjp(f):
    import jax

    def g(q, k, v, do):
        o, vjp = jax.vjp(f, q, k, v)
        return (o,) + vjp(do)
    return g


@pytest.mark.parametrize("shape", [(1, 2, 256, 128), (1, 1, 384, 64), (2, 1, 200, 32)])
def test_causal_vjp_matches_cpu_and_runs_flash_kernels(jax, trn, cpu, shape):
    import ml_dtypes  # noqa: F401
    out, ref, kernels = _run(jax, trn, cpu, _vjp(causal_attention), _args([shape] * 4, 0))
    assert _fused(kernels) == (True, True), _notes(kernels)
    assert len(kernels) == 2, [k.name for k in kernels]
    for a, b in zip(out, ref):
        assert a.dtype == b.dtype
        assert_close(a, b, "bfloat16")


# One q-tile and one key block per head: one job per head in both kernels' pipelines.
ONE_JOB_PER_HEAD = [(1, 3, 128, 32), (1, 4, 128, 32), (1, 8, 128, 32), (2, 3, 128, 64),
                    (3, 1, 128, 32), (4, 2, 128, 128), (2, 3, 100, 32)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", ONE_JOB_PER_HEAD)
def test_one_job_per_head_vjp_matches_cpu(jax, trn, cpu, shape, dtype):
    """Sq <= 128 with more than two heads (or batch indices): the forward's P @ V of
    head u read head u + 2's V (two V slots for a lag of two jobs), so o was wrong and,
    through Dr = rowsum(dO * o), the backward's dq and dk (not dv); float16 was NaN
    (the -3e38 mask bias is -inf in float16)."""
    import ml_dtypes  # noqa: F401
    out, ref, kernels = _run(jax, trn, cpu, _vjp(causal_attention),
                             _args([shape] * 4, 9, dtype))
    assert _fused(kernels) == (True, True), _notes(kernels)
    for a, b in zip(out, ref):      # o, dq, dk, dv
        assert a.dtype == b.dtype
        scale = max(1.0, float(np.abs(b.astype(np.float32)).max()))
        assert_close(a.astype(np.float32) / scale, b.astype(np.float32) / scale, dtype)


def test_grad_of_a_loss_without_o_fuses(jax, trn, cpu):
    """jax.grad of sum(o * w): o itself is dead in the program; the forward fusion
    still makes it (the backward's rowsum(do * o) needs it)."""
    import jax.numpy as jnp
    import ml_dtypes  # noqa: F401
    shape = (1, 2, 256, 64)

    def loss(q, k, v, w):
        return (causal_attention(q, k, v).astype(jnp.float32) * w).sum()
    f = jax.grad(loss, argnums=(0, 1, 2))
    out, ref, kernels = _run(jax, trn, cpu, f, _args([shape] * 4, 1))
    assert _fused(kernels) == (True, True), _notes(kernels)
    for a, b in zip(out, ref):
        assert_close(a, b, "bfloat16")


def test_value_and_grad_of_the_benchmark_block(jax, trn, cpu):
    """benchmarks/compiler.py's transformer block (small): value_and_grad of its loss."""
    import jax.numpy as jnp
    import ml_dtypes  # noqa: F401
    transformer_block = _benchmarks_compiler().transformer_block
    d, s = 256, 256
    shapes = {"g1": (d,), "b1": (d,), "g2": (d,), "b2": (d,), "wqkv": (d, 3 * d),
              "wo": (d, d), "w1": (d, 4 * d), "w2": (4 * d, d)}
    rng = np.random.default_rng(2)
    params = {k: (rng.standard_normal(v) * (0.05 if len(v) > 1 else 1.0))
              .astype(jnp.bfloat16) for k, v in shapes.items()}
    x = rng.standard_normal((s, d)).astype(jnp.bfloat16)

    def f(p, x):
        return jax.value_and_grad(
            lambda p, x: transformer_block(p, x, heads=2).astype(jnp.float32).sum(),
            argnums=(0, 1))(p, x)
    out, ref, kernels = _run(jax, trn, cpu, f, [params, x])
    assert _fused(kernels) == (True, True), _notes(kernels)
    for a, b in zip(out, ref):
        scale = max(1.0, float(np.abs(b.astype(np.float32)).max()))
        assert_close(a / scale, b / scale, "bfloat16")


def test_float32_attention_grad_falls_back_and_matches_cpu(jax, trn, cpu):
    """f32 q/k/v: both fusions exist, but the kernels raise Unsupported (16-bit only):
    their regions run op by op (the forward's with its logsumexp), still exact."""
    shape = (1, 1, 128, 32)
    with jax.default_matmul_precision("highest"):
        out, ref, kernels = _run(jax, trn, cpu, _vjp(causal_attention),
                                 _args([shape] * 4, 3, "float32"))
    assert _fused(kernels) == (False, False)
    assert any(n.startswith("fallback") for n in _notes(kernels)), _notes(kernels)
    for a, b in zip(out, ref):
        assert_close(a, b, "float32", rtol=1e-4, atol=1e-5)


def unmasked_attention(q, k, v):
    import jax
    import jax.numpy as jnp
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.125
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v)


@pytest.mark.parametrize("shape", [(1, 1, 256, 64), (1, 2, 320, 128)])
def test_unmasked_vjp_matches_cpu(jax, trn, cpu, shape):
    """No mask, bf16 softmax; 320 keys: a partial last key block (keys not grouped)."""
    import ml_dtypes  # noqa: F401
    out, ref, kernels = _run(jax, trn, cpu, _vjp(unmasked_attention), _args([shape] * 4, 4))
    assert _fused(kernels) == (True, True), _notes(kernels)
    for a, b in zip(out, ref):
        assert_close(a, b, "bfloat16")


def test_cross_attention_vjp_matches_cpu(jax, trn, cpu):
    """Sq = 200 queries against Sk = 384 keys (a partial q-tile, grouped keys)."""
    import ml_dtypes  # noqa: F401
    q, k, v, do = _args([(1, 2, 200, 64), (1, 2, 384, 64), (1, 2, 384, 64),
                         (1, 2, 200, 64)], 5)
    out, ref, kernels = _run(jax, trn, cpu, _vjp(unmasked_attention), [q, k, v, do])
    assert _fused(kernels) == (True, True), _notes(kernels)
    for a, b in zip(out, ref):
        assert_close(a, b, "bfloat16")


def test_long_sequence_accumulates_dq_in_sbuf(jax, trn, cpu):
    """S = 2688, D = 128: dQ for 21 q-tiles needs 6 PSUM banks, more than the 5 left:
    the kernel accumulates it in SBUF instead (its other path)."""
    import ml_dtypes  # noqa: F401
    shape = (1, 1, 2688, 128)
    out, ref, kernels = _run(jax, trn, cpu, _vjp(causal_attention), _args([shape] * 4, 6))
    assert _fused(kernels) == (True, True), _notes(kernels)
    for a, b in zip(out, ref):
        assert_close(a, b, "bfloat16")


def test_causal_backward_skips_fully_masked_tiles(jax, trn, cpu):
    """4 x 4 tile pairs: the causal backward computes the 10 on or below the diagonal
    (5 matmuls each, + a bias pass on the 4 diagonal ones, + 4 row-statistic matmuls);
    without the mask all 16."""
    import ml_dtypes  # noqa: F401
    from jax_trn.hw import isa
    counts = []
    for f in (causal_attention, unmasked_attention):
        _, _, kernels = _run(jax, trn, cpu, _vjp(f), _args([(1, 1, 512, 64)] * 4, 7))
        (bwd,) = [k for k in kernels if BWD_NOTE in " ".join(k.kernel.notes)]
        counts.append(sum(isinstance(i, isa.NcMatmul) for i in bwd.kernel.instructions))
    assert counts == [10 * 5 + 4 + 4, 16 * 5 + 4]


def test_a_mask_per_head_reads_each_heads_mask_and_matches_cpu(jax, trn, cpu):
    """A compile-time window that differs per head: the backward kernel reads it per
    head as it reads a runtime mask (once: fused, every head's gradient masked like
    head 0's; then: not fused)."""
    import jax.numpy as jnp
    import ml_dtypes  # noqa: F401

    def attn(q, k, v):
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) * 0.125
        h, i = jnp.arange(2)[:, None, None], jnp.arange(256)
        s = jnp.where((i[None, :] <= i[:, None] - 64 * h)[None] | (i[None, :] == 0), s,
                      -jnp.inf)
        p = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype)
        return jnp.einsum("bhqk,bhkd->bhqd", p, v)
    out, ref, kernels = _run(jax, trn, cpu, _vjp(attn), _args([(1, 2, 256, 64)] * 4, 8))
    assert _fused(kernels) == (True, True), _notes(kernels)
    for a, b in zip(out, ref):
        assert_close(a, b, "bfloat16")


def _masked_by(fill):
    def attn(q, k, v, m):
        import jax
        import jax.numpy as jnp
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k).astype(jnp.float32) * 0.125
        s = jnp.where(m, s, jnp.finfo(jnp.float32).min if fill == "min" else fill)
        p = jax.nn.softmax(s, axis=-1).astype(q.dtype)
        return jnp.einsum("bhqk,bhkd->bhqd", p, v)
    return attn


@pytest.mark.parametrize("const", [False, True])
def test_float16_masks_without_a_finite_bias_fall_back(jax, trn, cpu, const):
    """float16 has no finite -3e38: a runtime mask (a padding mask: an input; forward
    and backward), or a compile-time mask with a row that sees no key (the forward:
    uniform softmax under a finite fill, which a -65504 bias cannot give) runs op by
    op, not NaN (before: the -inf bias times I's zeros made every score NaN)."""
    shape = (1, 2, 128, 32)
    mask = np.random.default_rng(10).random((1, 1, 128, 128)) < 0.6
    mask[..., 3, :] = False                   # a row with no key: uniform over every key
    attn = _masked_by("min")
    if const:
        f, args = (lambda q, k, v: attn(q, k, v, mask)), _args([shape] * 3, 11, "float16")
    else:
        def f(q, k, v, do, m):
            return _vjp(lambda q, k, v: attn(q, k, v, m))(q, k, v, do)
        args = _args([shape] * 4, 11, "float16") + [mask]
    out, ref, kernels = _run(jax, trn, cpu, f, args)
    assert _fused(kernels) == (False, False), _notes(kernels)
    assert any(n.startswith("fallback: attention") for n in _notes(kernels))
    for a, b in zip(out, ref):
        assert not np.isnan(a.astype(np.float32)).any()
        scale = max(1.0, float(np.abs(b.astype(np.float32)).max()))
        assert_close(a.astype(np.float32) / scale, b.astype(np.float32) / scale, "float16")


@pytest.mark.parametrize("form, causal", [("select", False), ("multiply", True),
                                         ("select-then-scale", False)])
def test_dropout_gradients_run_flash_kernels(jax, trn, cpu, form, causal):
    """The forward multiplies each P tile by its dropout block after the row sums; the
    backward reads the same blocks: dV from the dropped P, dP times the block before
    the softmax VJP. The mask (from its own hash kernel) is the CPU backend's exactly:
    another key's gradients are far off."""
    f = dropout_attention(jax, form, causal)
    w = np.random.default_rng(9).standard_normal((1, 256, 4, 64)).astype(np.float32)

    def grads(q, k, v, key):
        return jax.grad(lambda *a: (f(*a, key).astype(np.float32) * w).sum(),
                        argnums=(0, 1, 2))(q, k, v)
    args = _args([(1, 256, 4, 64)] * 3, 3) + [jax.random.key(11)]
    out, ref, kernels = _run(jax, trn, cpu, grads, args)
    assert _fused(kernels) == (True, True), _notes(kernels)
    assert any("dropout" in n for n in _notes(kernels) if n.startswith("decision"))
    for a, b in zip(out, ref):
        assert_close(a, b, "bfloat16")
    other = jax.jit(grads)(*jax.device_put(args[:3] + [jax.random.key(12)], cpu))
    assert max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max()
               for a, b in zip(other, ref)) > 0.1


def test_flax_attention_layer_with_dropout_in_a_training_step(jax, trn, cpu):
    """flax linen MultiHeadDotProductAttention(dropout_rate=0.1) under jax.grad: its
    broadcast dropout (one [S, S] draw for every head) in both flash kernels; the
    parameters' gradients within bf16 tolerance of the CPU backend's (in norm: bf16
    sums over 256 rows; ~0.5%, as without the attention fusions)."""
    import flax.linen as nn
    jnp = jax.numpy
    layer = nn.MultiHeadDotProductAttention(num_heads=4, qkv_features=256,
                                            dtype=jnp.bfloat16, dropout_rate=0.1)
    x = _args([(1, 256, 256)], 4)[0]
    params = layer.init(jax.random.key(0), x, x, deterministic=True)
    w = np.random.default_rng(5).standard_normal(x.shape).astype(np.float32)

    def step(p, x, key):
        return jax.grad(lambda p: (layer.apply(p, x, x, deterministic=False,
                                               rngs={"dropout": key}) * w).sum())(p)
    out, ref, kernels = _run(jax, trn, cpu, step, [params, x, jax.random.key(2)])
    assert _fused(kernels) == (True, True), _notes(kernels)
    # the key bias's gradient is 0 in exact arithmetic (the softmax ignores a per-row
    # shift): bf16 noise on both backends, so an absolute floor of 1e-3 of the largest
    big = max(np.linalg.norm(b.astype(np.float32)) for b in ref)
    for a, b in zip(out, ref):
        a, b = a.astype(np.float32), b.astype(np.float32)
        assert np.linalg.norm(a - b) <= 2e-2 * np.linalg.norm(b) + 1e-3 * big


def test_dropout_blocks_read_per_job(jax, trn, cpu, monkeypatch):
    """When a unit's dropout rows do not fit SBUF (attention_dropout.ROWS_BYTES), each
    job's block is DMAed: [q-tile, chunk] blocks in the forward (a ring of 128-key
    blocks overran there: wrong causal results), [q-tile, 128] in the backward."""
    import jax_trn.lower.attention_dropout as blocks
    monkeypatch.setattr(blocks, "ROWS_BYTES", 0)
    f = dropout_attention(jax, "select", True)
    w = np.random.default_rng(9).standard_normal((2, 384, 2, 128)).astype(np.float32)

    def grads(q, k, v, key):
        return jax.value_and_grad(lambda *a: (f(*a, key).astype(np.float32) * w).sum(),
                                  argnums=(0, 1, 2))(q, k, v)
    out, ref, kernels = _run(jax, trn, cpu, grads,
                             _args([(2, 384, 2, 128)] * 3, 3) + [jax.random.key(11)])
    assert _fused(kernels) == (True, True), _notes(kernels)
    for a, b in zip(out, ref):
        a, b = a.astype(np.float32), b.astype(np.float32)
        assert np.abs(a - b).max() <= 1e-2 * np.abs(b).max()


def _constant_mask_grads(jax, mask):
    jnp = jax.numpy

    def attn(q, k, v):
        return jax.nn.dot_product_attention(q, k, v, mask=jnp.asarray(mask)[None, None])
    return jax.grad(lambda *a: (attn(*a).astype(jnp.float32) ** 2).sum(), argnums=(0, 1, 2))


def test_compile_time_mask_gradients_run_flash_kernels(jax, trn, cpu):
    """A constant mask (causal, keys past 400 padded) checked in the softmax VJP by its
    leading corner: both flash kernels, gradients as on CPU."""
    s = 512
    mask = np.tril(np.ones((s, s), bool)) & (np.arange(s) < 400)[None, :]
    out, ref, kernels = _run(jax, trn, cpu, _constant_mask_grads(jax, mask),
                             _args([(1, s, 4, 64)] * 3, 21))
    assert _fused(kernels) == (True, True), _notes(kernels)
    for a, b in zip(out, ref):
        assert_close(a, b, "bfloat16")


def test_compile_time_mask_with_a_fully_masked_row_is_not_fused(jax, trn, cpu):
    """Padded queries and keys: rows with no key have a uniform softmax and a masked
    gradient, which the flash backward does not take; the decision says so and the
    ops run fused as ordinary regions, with CPU's gradients."""
    s = 512
    valid = np.arange(s) < 400
    grads = _constant_mask_grads(jax, valid[:, None] & valid[None, :])
    out, ref, kernels = _run(jax, trn, cpu, grads, _args([(1, s, 4, 64)] * 3, 22))
    assert _fused(kernels) == (False, False), _notes(kernels)
    for a, b in zip(out, ref):
        assert_close(a, b, "bfloat16")
    spec = jax.ShapeDtypeStruct((1, s, 4, 64), "bfloat16")
    code = jax.jit(grads).lower(spec, spec, spec).as_text()
    from hlo_passes import compile_to_ir
    from hlo_passes.passes.attention_bwd_fusion import DECISIONS
    module = compile_to_ir(code)
    assert any("leaves a query row no key" in d for d in module.attrs.get(DECISIONS, ())), \
        module.attrs.get(DECISIONS)
