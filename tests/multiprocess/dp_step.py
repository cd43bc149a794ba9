"""The program the multi-process tests run in 1, 2 or 4 processes (`launch.run`): a
data-parallel training step and the three collectives on their own, on devices of every
process; it reports result digests and the simulated timeline of each call."""
import hashlib

import numpy as np
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_trn

# 4 devices on the first chip of every quarter of trn2.48xlarge (chips 0, 4, 8, 12):
# with 2 or 4 processes the mesh spans all of them.
IDS = [c * 32 + k for c in range(4) for k in range(4)]
devs = {d.id: d for d in jax.devices()}
mesh = Mesh(np.array([devs[i] for i in IDS]), ("data",))
n = jax.process_count()
rng = np.random.default_rng(0)
X = rng.standard_normal((128, 64)).astype(np.float32)
Y = rng.standard_normal((128, 32)).astype(np.float32)
W = (rng.standard_normal((64, 32)) * 0.1).astype(np.float32)
rows = slice(PROCESS_ID * 128 // n, (PROCESS_ID + 1) * 128 // n)
data = NamedSharding(mesh, P("data"))
x = jax.make_array_from_process_local_data(data, X[rows])
y = jax.make_array_from_process_local_data(data, Y[rows])
w = jax.make_array_from_process_local_data(NamedSharding(mesh, P()), W)
Z = rng.standard_normal((256, 16)).astype(np.float32)
z = jax.make_array_from_process_local_data(
    data, Z[PROCESS_ID * 256 // n:(PROCESS_ID + 1) * 256 // n])


def loss(w, x, y):
    return jnp.mean((x @ w - y) ** 2)


@jax.jit
def step(w, x, y):
    l, g = jax.value_and_grad(loss)(w, x, y)
    return w - 0.5 * g, l


def collectives(a):
    return (jax.lax.psum(a, "data"), jax.lax.all_gather(a, "data", tiled=True),
            jax.lax.psum_scatter(a, "data", tiled=True),
            jax.lax.all_to_all(a, "data", 0, 0, tiled=True))


cc = jax.jit(jax.shard_map(collectives, mesh=mesh, in_specs=P("data"),
                           out_specs=(P(), P(), P("data"), P("data")), check_vma=False))


# Uneven: 3, 1, 2 and 2 devices on chips 0, 4, 8 and 12 (a process may own 1 to 4).
IDS2 = [0, 1, 2, 32, 64, 65, 96, 97]
mesh2 = Mesh(np.array([devs[i] for i in IDS2]), ("d",))
mine2 = [k for k, i in enumerate(IDS2) if devs[i].process_index == PROCESS_ID]
A = rng.standard_normal((8 * 128, 256)).astype(np.float32)
B = (rng.standard_normal((256, 256)) * 0.1).astype(np.float32)
a = jax.make_array_from_process_local_data(NamedSharding(mesh2, P("d")),
                                           A[mine2[0] * 128:(mine2[-1] + 1) * 128], A.shape)
b = jax.make_array_from_process_local_data(NamedSharding(mesh2, P()), B)


def _uneven(a, b):
    """A loop whose trip count each device reads from its data (1 to 4): the devices
    reach the psum at different simulated times."""
    trips = (jnp.abs(a[0, 0]) * 8).astype(jnp.int32) % 4 + 1
    v = jax.lax.fori_loop(0, trips, lambda i, v: jnp.tanh(v @ b), a)
    return jax.lax.psum(v, "d")


uneven = jax.jit(jax.shard_map(_uneven, mesh=mesh2, in_specs=(P("d"), P()), out_specs=P(),
                               check_vma=False))


# Tensor parallel: a 2-layer MLP, the hidden dimension split over "model" (column- then
# row-parallel, an all-reduce in the forward pass and in the gradient of x), the batch
# over "data"; once with "model" inside each chip, once across the chips (and processes).
H = (rng.standard_normal((64, 128)) * 0.1).astype(np.float32)
O = (rng.standard_normal((128, 32)) * 0.1).astype(np.float32)


def tp_loss(h, o, x, y):
    return jnp.mean((jax.nn.relu(x @ h) @ o - y) ** 2)


def tp_program(grid):
    tmesh = Mesh(grid, ("data", "model"))
    col, row = NamedSharding(tmesh, P(None, "model")), NamedSharding(tmesh, P("model", None))
    batch = NamedSharding(tmesh, P("data"))
    h = jax.device_put(H, col)                 # every process holds the same host value
    o = jax.device_put(O, row)
    xs = jax.device_put(X, batch)
    ys = jax.device_put(Y, batch)

    @jax.jit
    def tp_step(h, o, x, y):
        l, (gh, go) = jax.value_and_grad(tp_loss, argnums=(0, 1))(h, o, x, y)
        return h - 0.5 * gh, o - 0.5 * go, l
    return tp_step, (h, o, xs, ys)


grid = np.array([devs[i] for i in IDS]).reshape(4, 4)     # rows: chips 0, 4, 8, 12
tp_inside, tp_inside_args = tp_program(grid)
tp_across, tp_across_args = tp_program(grid.T)


def digest(a) -> str:
    return hashlib.sha256(np.ascontiguousarray(np.asarray(a)).tobytes()).hexdigest()[:16]


def timeline(ex) -> dict:
    mine = {d.id for d in jax.local_devices()}
    return {"name": ex.name,
            "kernels": sorted([k.device, k.name, k.start_ns, k.end_ns] for k in ex.kernels
                              if k.device in mine),
            "collectives": [[c.name, c.kind, c.algorithm, c.start_ns, c.end_ns,
                             list(c.arrival_ns), [list(s) for s in c.spans]]
                            for c in ex.collectives]}


with jax_trn.profile() as prof:
    w1, l1 = step(w, x, y)
    w2, l2 = step(w1, x, y)
    outs = cc(z)
    u = uneven(a, b)
    tp1 = tp_inside(*tp_inside_args)
    tp2 = tp_across(*tp_across_args)
    jax.block_until_ready((w2, l2, outs, u, tp1, tp2))
with jax_trn.profile() as timed, jax_trn.timing_only():
    jax.block_until_ready(step(w, x, y))
results = {"w2": w2, "loss": l2, "psum": outs[0], "gather": outs[1], "uneven": u,
           "tp_inside_h": tp1[0], "tp_inside_o": tp1[1], "tp_inside_loss": tp1[2],
           "tp_across_h": tp2[0], "tp_across_o": tp2[1], "tp_across_loss": tp2[2]}
got = {k: digest(multihost_utils.process_allgather(v, tiled=True)) for k, v in results.items()}
got["scatter"] = digest(multihost_utils.process_allgather(outs[2], tiled=True))
got["all_to_all"] = digest(multihost_utils.process_allgather(outs[3], tiled=True))
multihost_utils.sync_global_devices("dp_step done")
report({"digests": got, "loss": float(np.asarray(l2.addressable_data(0))),
        "tp_loss": [float(np.asarray(t[2].addressable_data(0))) for t in (tp1, tp2)],
        "timelines": [timeline(ex) for ex in prof.executions],
        "timing_only": [ex.span_ns for ex in timed.executions]})
