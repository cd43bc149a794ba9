"""spmd_memo: a follower takes a kernel's recorded outputs only when its inputs hold the
recorded bits (tests/multichip/test_spmd_batch.py checks whole programs, batched ==
every device timed)."""
from __future__ import annotations

from types import SimpleNamespace as T

import numpy as np

from jax_trn.hw.program import Kernel
from jax_trn.runtime.dram import Dram
from jax_trn.runtime.spmd_memo import Memo


class _Toucher:
    """(names, written names) of each kernel, as StepRunner._touches gives them."""

    def __init__(self, touches: dict):
        self.touches = touches

    def _touches(self, step):
        return self.touches[step.name]


def _setup():
    """k1: t = x + 1 (t a temporary only k1 writes); k2: out = t * 2 (out an output)."""
    k1, k2 = Kernel("k1", [], {}), Kernel("k2", [], {})
    temps = [T(name="t", size=4, dtype="float32")]
    prog = T(steps=[k1, k2], temps=temps, slot_bytes=None, temp_slot={},
             outputs=[T(name="out", size=4, dtype="float32")])
    touches = {"k1": (frozenset({"x", "t"}), frozenset({"t"})),
               "k2": (frozenset({"t", "out"}), frozenset({"out"}))}
    memo = Memo(prog, _Toucher(touches))

    def dram(x):
        return Dram({"x": np.asarray(x, np.float32), "out": np.zeros(4, np.float32)}, prog)

    def run(d):                      # the leader's kernels, recorded
        memo.record(k1, d, lambda: d["t"].__setitem__(Ellipsis, d["x"] + 1))
        memo.record(k2, d, lambda: d["out"].__setitem__(Ellipsis, d["t"] * 2))
    return memo, k1, k2, dram, run


def test_matching_inputs_give_the_recorded_outputs_and_share_single_writer_temps():
    memo, k1, k2, dram, run = _setup()
    lead, other = dram([1, 2, 3, 4]), dram([1, 2, 3, 4])
    run(lead)
    assert memo.apply(k1, other) and memo.apply(k2, other)
    assert other["out"].tolist() == [4, 6, 8, 10]
    assert other["t"] is lead["t"] and not other["t"].flags.writeable  # one shared array
    # an output only k2 writes: one read-only array for the followers, which their
    # output buffers adopt; the leader keeps its own (the buffer it writes)
    assert lead["out"].flags.writeable and not other["out"].flags.writeable
    bufs = [[T(data=np.zeros(4, np.float32))], [T(data=np.zeros(4, np.float32))]]
    from jax_trn.runtime.spmd_batch import adopt
    adopt(T(outputs=[T(name="out")]), bufs, [lead, other])
    assert bufs[0][0].data.tolist() == [0] * 4               # leader's: its own array
    assert bufs[1][0].data is not None and bufs[1][0].data.tolist() == [4, 6, 8, 10]


def test_a_diverged_call_gets_its_own_output_arrays_back():
    memo, k1, k2, dram, run = _setup()
    lead, other = dram([1, 2, 3, 4]), dram([1, 2, 3, 4])
    own = other["out"]
    run(lead)
    assert memo.apply(k1, other) and memo.apply(k2, other) and other["out"] is not own
    memo.restore()
    assert other["out"] is own


def test_other_inputs_drop_the_entry_and_the_kernel_is_replayed():
    memo, k1, k2, dram, run = _setup()
    lead = dram([1, 2, 3, 4])
    run(lead)
    assert not memo.apply(k1, dram([1, 2, 3, 5]))
    assert not memo.apply(k1, dram([1, 2, 3, 4]))      # dropped: not compared again


def test_bits_decide_not_values():
    memo, k1, _, dram, run = _setup()
    run(dram([0.0, 1, 2, 3]))
    assert not memo.apply(k1, dram([-0.0, 1, 2, 3]))   # -0.0 == 0.0, other bits


def test_the_same_nan_bits_match():
    memo, k1, _, dram, run = _setup()
    run(dram([np.nan, 1, 2, 3]))
    assert memo.apply(k1, dram([np.nan, 1, 2, 3]))     # nan != nan, same bits


def test_a_written_temporary_already_made_is_not_fresh():
    """The recorded outputs assume the kernel wrote into fresh zeros; a device whose
    temporary already holds something replays it."""
    memo, k1, _, dram, run = _setup()
    run(dram([1, 2, 3, 4]))
    other = dram([1, 2, 3, 4])
    other["t"][:] = 9
    assert not memo.apply(k1, other)


def test_only_the_programs_own_steps_are_recorded():
    """A kernel nested in a loop (or an on-chip loop's enter / body / exit, which keep
    carries in SBUF between kernels) is always replayed."""
    memo, k1, k2, dram, run = _setup()
    nested = Kernel("k3", [], {})
    assert memo.wants(k1) and not memo.wants(nested)
    assert not memo.apply(nested, dram([1, 2, 3, 4]))
