"""The flash-attention kernels' software pipelines (jax_trn/lower/attention.py,
attention_bwd.py): a tile loaded at a job's stage A must keep its slot until the
lagging stage that reads it has run for the run's last job (`pipeline_slots`), and the
causal mask's additive bias must be finite in the matmul dtype."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.lower.attention import pipeline_slots
from tests.e2e.test_attention import causal_attention


@pytest.mark.parametrize("jobs, lag, slots", [(1, 2, 3), (2, 2, 2), (7, 2, 2), (1, 3, 4),
                                              (2, 3, 3), (3, 3, 2), (0, 3, 4)])
def test_pipeline_slots_cover_the_lag(jobs, lag, slots):
    """Runs of `jobs` jobs, read `lag` jobs after their last: the run `slots` later may
    take the slot (the forward's V: lag 2; the backward's rows: lag 3)."""
    assert pipeline_slots(jobs, lag) == slots
    d = slots - 1                    # the run that reuses the slot: d runs later
    assert d * max(1, jobs) >= lag   # its first stage A follows the last lagging read


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(1, 4, 128, 32), (2, 3, 64, 64), (1, 8, 128, 128)])
def test_each_head_reads_its_own_v(jax, trn, dtype, shape):
    """q = k = 0: every causal row's softmax is uniform over its keys with P = 1
    exactly, so head h's output is V's constant h + 1, bit for bit. One job per head
    (Sq <= 128): with two V slots head h read head h + 2's V (bfloat16); float16 was
    NaN (a -3e38 mask bias is -inf there, and I @ bias gives 0 * -inf)."""
    import jax_trn
    b, h = shape[:2]
    q = np.zeros(shape, dtype)
    v = np.broadcast_to(np.arange(1, b * h + 1, dtype=np.float32).reshape(b, h, 1, 1),
                        shape).astype(dtype)
    with jax_trn.profile() as prof:
        out = np.asarray(jax.jit(causal_attention)(*jax.device_put((q, q, v), trn)))
    notes = [n for k in prof.executions[-1].kernels for n in k.kernel.notes]
    assert any(n.startswith("attention: flash-attention kernel") for n in notes), notes
    np.testing.assert_array_equal(out.astype(np.float32), v.astype(np.float32))
