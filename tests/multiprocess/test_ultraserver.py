"""Issue 17 at full size: one Trn3 UltraServer (144 chips, 1152 NeuronCores) in 16
processes of 9 chips each, against the same program in one process: a data-parallel
step over every NeuronCore (its gradient all_reduce shared out over the 16 processes),
psum / all_gather / psum_scatter, and a tensor-parallel step whose "model" axis crosses
processes. Same result bits, same collective timeline in every process. Slow: 17
interpreters on this machine's cores."""
from __future__ import annotations

import pytest

from . import launch

_SCRIPT = """
import hashlib
import numpy as np
import jax, jax.numpy as jnp
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import jax_trn

devs = jax.devices()
n, p = jax.process_count(), jax.process_index()
mesh = Mesh(np.array(devs), ("data",))
rng = np.random.default_rng(0)
rows = 2 * len(devs)
X = rng.standard_normal((rows, 32)).astype(np.float32)
Y = rng.standard_normal((rows, 8)).astype(np.float32)
W = (rng.standard_normal((32, 8)) * 0.1).astype(np.float32)
mine = slice(p * rows // n, (p + 1) * rows // n)
data, rep = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
x = jax.make_array_from_process_local_data(data, X[mine])
y = jax.make_array_from_process_local_data(data, Y[mine])
w = jax.make_array_from_process_local_data(rep, W)

@jax.jit
def step(w, x, y):
    l, g = jax.value_and_grad(lambda w: jnp.mean((jnp.tanh(x @ w) - y) ** 2))(w)
    return w - 0.5 * g, l

def collectives(a, s):
    return (jax.lax.psum(a, "data"), jax.lax.all_gather(a, "data", tiled=True),
            jax.lax.psum_scatter(s, "data", tiled=True))

cc = jax.jit(jax.shard_map(collectives, mesh=mesh, in_specs=(P("data"), P("data")),
                           out_specs=(P(), P(), P("data")), check_vma=False))
Z = rng.standard_normal((len(devs) * 2, 3)).astype(np.float32)
z = jax.make_array_from_process_local_data(data, Z[p * len(Z) // n:(p + 1) * len(Z) // n])
S = rng.standard_normal(len(devs) ** 2).astype(np.float32)         # 1152 per device
s = jax.make_array_from_process_local_data(data, S[p * len(S) // n:(p + 1) * len(S) // n])

# Tensor parallel, "model" over 16 devices: one per process (each process's first chip).
grid = np.array(devs).reshape(16, 9, 8)[:, 0, :2].T          # (2 data, 16 model)
tmesh = Mesh(grid, ("data", "model"))
H = (rng.standard_normal((32, 64)) * 0.1).astype(np.float32)
O = (rng.standard_normal((64, 8)) * 0.1).astype(np.float32)
h = jax.device_put(H, NamedSharding(tmesh, P(None, "model")))
o = jax.device_put(O, NamedSharding(tmesh, P("model", None)))
tx = jax.device_put(X[:64], NamedSharding(tmesh, P("data")))
ty = jax.device_put(Y[:64], NamedSharding(tmesh, P("data")))

@jax.jit
def tp_step(h, o, x, y):
    l, (gh, go) = jax.value_and_grad(
        lambda h, o: jnp.mean((jax.nn.relu(x @ h) @ o - y) ** 2), argnums=(0, 1))(h, o)
    return h - 0.5 * gh, o - 0.5 * go, l

with jax_trn.profile() as prof:
    w1, l1 = step(w, x, y)
    w2, l2 = step(w1, x, y)
    outs = cc(z, s)
    tp = tp_step(h, o, tx, ty)
    jax.block_until_ready((w2, l2, outs, tp))

def digest(a):
    a = multihost_utils.process_allgather(a, tiled=True)
    return hashlib.sha256(np.ascontiguousarray(np.asarray(a)).tobytes()).hexdigest()[:16]

got = {k: digest(v) for k, v in {"w2": w2, "loss": l2, "psum": outs[0], "gather": outs[1],
                                  "scatter": outs[2], "tp_h": tp[0], "tp_o": tp[1],
                                  "tp_loss": tp[2]}.items()}
multihost_utils.sync_global_devices("ultraserver done")
report({"digests": got, "loss": float(np.asarray(l2.addressable_data(0))),
        "collectives": [[c.name, c.kind, c.algorithm, c.start_ns, c.end_ns,
                         list(c.arrival_ns)] for ex in prof.executions
                        for c in ex.collectives],
        "local": len(jax.local_devices())})
"""


@pytest.mark.slow
def test_sixteen_processes_run_an_ultraserver_as_one_process_does():
    (one,) = launch.run(_SCRIPT, 1, system="trn3-ultraserver", timeout=900)
    assert one["local"] == 1152 and len(one["collectives"]) >= 4
    reports = launch.run(_SCRIPT, 16, system="trn3-ultraserver", timeout=1500)
    for p, r in enumerate(reports):
        assert r["local"] == 72
        assert r["digests"] == one["digests"], f"process {p}: other result bits"
        assert r["collectives"] == one["collectives"], f"process {p}: another timeline"
