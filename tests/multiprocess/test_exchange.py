"""spmd_remote's values and the shared-memory channel, in one process (no JAX)."""
from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from jax_trn.runtime import channel, spmd_remote
from jax_trn.runtime.kvstore import LocalKVStore
from jax_trn.runtime.spmd import Arrival


def _tensor(name, shape, dtype="float32"):
    return SimpleNamespace(name=name, shape=shape, dtype=dtype, size=int(np.prod(shape)))


def test_a_rendezvous_value_carries_arrivals_and_operands_exactly():
    a, b = _tensor("a", (2, 3)), _tensor("b", (4,), "bfloat16")
    out = _tensor("out", (2, 3))
    step = SimpleNamespace(name="all_reduce.3", operands=[a, b], results=[out])
    import ml_dtypes
    drams = [{"a": np.arange(6, dtype=np.float32) + k,
              "b": np.arange(4).astype(ml_dtypes.bfloat16)} for k in range(2)]
    pending = [Arrival(step, 1.25, "loop 2", None, False), Arrival(step, 1 / 3, "", 7.5, True)]
    blob = spmd_remote._encode(step, [5, 9], pending, drams)
    name, got = spmd_remote._decode(blob, step, {})
    assert name == "all_reduce.3" and sorted(got) == [5, 9]
    for k, p in enumerate([5, 9]):
        arrival, dram = got[p]
        assert (arrival.t, arrival.ready, arrival.overlaps, arrival.context) == (
            pending[k].t, pending[k].ready, pending[k].overlaps, pending[k].context)
        for t in (a, b):
            assert dram[t.name].dtype == drams[k][t.name].dtype
            assert dram[t.name].tobytes() == drams[k][t.name].tobytes()
        # A result tensor of a remote device is scratch, shared by all of them.
        assert dram["out"] is got[5 if k else 9][1]["out"]
    with pytest.raises(KeyError):
        got[5][1]["other"]


def test_shared_memory_values_are_read_back_and_deleted_on_release():
    kv = LocalKVStore()
    ch = channel.Channel(kv, shared=True)
    ch.put("k", b'{"step": "x"}\n\x00\x01', "all_gather.1")
    value = kv.get("k", 1)
    assert channel.Channel.label(value) == "all_gather.1"
    assert bytes(channel.Channel.read(value)) == b'{"step": "x"}\n\x00\x01'
    path = value[len(b"SHM\n"):].split(b"\n")[0].decode()
    assert os.path.exists(path)
    ch.release()
    assert not os.path.exists(path)
    inline = channel.Channel(kv, shared=False)
    inline.put("j", b"abc")
    assert channel.Channel.read(kv.get("j", 1)) == b"abc" and channel.Channel.label(b"abc") is None


def test_processes_on_this_host_use_shared_memory():
    kv = LocalKVStore()
    channel.announce(kv, 0)
    channel.announce(kv, 1)
    assert channel.all_on_this_host(kv, 0, [1], 1.0) is True
    other = LocalKVStore()
    channel.announce(other, 0)
    other.put("jax_trn/host/1", b"elsewhere/boot")
    assert channel.all_on_this_host(other, 0, [1], 1.0) is False


def test_calls_are_counted_per_program_and_store():
    kv1, kv2 = LocalKVStore(), LocalKVStore()
    assert [spmd_remote.next_call(kv1, "p") for _ in range(3)] == [1, 2, 3]
    assert spmd_remote.next_call(kv1, "q") == 1
    assert spmd_remote.next_call(kv2, "p") == 1


def test_files_of_dead_processes_are_swept_and_live_ones_kept():
    """A process killed outright leaves its shared-memory files; the next client made on
    this host deletes them (`channel.sweep`), and not those of live processes."""
    import subprocess
    import sys
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    prefix = os.path.join(channel._SHM_DIR, channel._prefix())
    paths = [f"{prefix}{dead.pid}-0", f"{prefix}{os.getpid()}-999999", f"{prefix}x-1"]
    for path in paths:
        with open(path, "wb") as f:
            f.write(b"data")
    try:
        gone = channel.sweep()
        assert paths[0] in gone and not os.path.exists(paths[0])
        assert os.path.exists(paths[1]) and os.path.exists(paths[2])
    finally:
        for path in paths:
            if os.path.exists(path):
                os.unlink(path)


def test_a_swap_value_gives_each_peer_its_array_and_refuses_another_path():
    """`Exchange.swap`'s values: each receiver reads its own array, in its shape and
    dtype; a value of another collective is an error naming both."""
    import ml_dtypes
    sends = [np.arange(6, dtype=np.float32).reshape(2, 3), None,
             np.ones((1, 2, 2, 1), ml_dtypes.bfloat16), np.zeros((0, 4), np.int32)]
    blob = b"".join(bytes(p) for p in spmd_remote._encode_swap("all_reduce.7", sends))
    for k, want in enumerate(sends):
        if want is None:
            continue
        got = spmd_remote._decode_swap(blob, "all_reduce.7", k, 1)
        assert got.shape == want.shape and got.dtype == want.dtype
        assert got.tobytes() == want.tobytes()
    with pytest.raises(spmd_remote.RemoteCollectiveError, match="all_reduce.8.*different paths"):
        spmd_remote._decode_swap(blob, "all_reduce.8", 0, 1)
    with pytest.raises(spmd_remote.RemoteCollectiveError, match="sent nothing"):
        spmd_remote._decode_swap(blob, "all_reduce.7", 1, 1)
