"""A corpus of small programs whose simulated timelines and results are pinned.

Issue 14 makes the simulator faster (one BLAS thread, timelines computed once, numerics
at tensor granularity) under one promise: simulated times and results stay bit for bit
what they were. `fingerprint(jax)` runs every program of the corpus on the trn backend
and returns, per program, the simulated time of each call (as `float.hex`, exact), a
digest of every trace event of every call (queue, opcode, start, end, bytes: the whole
timeline), a digest of the collectives' records, and a digest of the result bytes.

`tests/sim/test_pinned_corpus.py` compares it with `pinned_corpus.json`, written on main
before the speed work by `python -m tests.sim.pinned_corpus --write` (which refuses to
overwrite the file without `--force`: regenerate only for a change that is meant to
move simulated times, and say so in the commit).
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import sys

import numpy as np

PINNED = pathlib.Path(__file__).with_name("pinned_corpus.json")
# The OpenBLAS kernel whose FP32 sums the pinned result digests hold (jax_trn/hw/sgemm.py
# picks it on every CPU with AVX-512). The order of a product's FP32 sums is the GEMM
# kernel's, so where the simulator runs another one (a CPU without AVX-512,
# JAX_TRN_BLAS_CORETYPE) the results of programs with FP32 products differ in last bits:
# there only the timelines are compared (`comparable`).
PINNED_GEMM = "SkylakeX"
_RNG_SEED = 0


def _rng(k: int):
    return np.random.default_rng(_RNG_SEED + k)


def _normal(k, *shape, dtype=np.float32):
    return _rng(k).normal(size=shape).astype(dtype)


# --- the programs: (name, build(jax) -> (callable, args)) ----------------------------


def elementwise(jax):
    jnp = jax.numpy
    f = jax.jit(lambda a, b: jnp.tanh(a) * b + jnp.exp(-a * a) - jnp.sqrt(jnp.abs(b) + 1))
    return f, (_normal(1, 256, 384), _normal(2, 256, 384))


def matmul_bf16(jax):
    jnp = jax.numpy
    f = jax.jit(lambda a, b: jax.nn.gelu(a @ b))
    return f, (_normal(3, 256, 512, dtype=jnp.bfloat16), _normal(4, 512, 384, dtype=jnp.bfloat16))


def matmul_f32(jax):
    f = jax.jit(lambda a, b: a @ b)
    return f, (_normal(5, 200, 300), _normal(6, 300, 130))


def reductions(jax):
    jnp = jax.numpy
    f = jax.jit(lambda a: (a.sum(0), a.max(1), jax.nn.softmax(a, axis=-1),
                           jnp.argmax(a, axis=1)))
    return f, (_normal(7, 300, 257),)


def scan_loop(jax):
    jnp = jax.numpy

    def f(h, xs, w):
        def cell(h, x):
            h = jnp.tanh(h @ w + x)
            return h, h.sum()
        return jax.lax.scan(cell, h, xs)
    return jax.jit(f), (_normal(8, 4, 32), _normal(9, 6, 4, 32), _normal(10, 32, 32) * 0.2)


def while_loop(jax):
    def f(x):
        return jax.lax.while_loop(lambda c: c[0] < 5,
                                  lambda c: (c[0] + 1, c[1] * 1.5 + 1.0), (0, x))[1]
    return jax.jit(f), (_normal(11, 64, 64),)


def conditional(jax):
    jnp = jax.numpy

    def f(i, x):
        return jax.lax.switch(i, [jnp.sin, jnp.cos, lambda v: v * 2.0], x)
    return jax.jit(f), (np.int32(1), _normal(12, 128, 64))


def gather_scatter(jax):
    jnp = jax.numpy
    idx = _rng(13).integers(0, 500, 200).astype(np.int32)

    def f(table, idx, upd):
        rows = jnp.take(table, idx, axis=0)
        return rows * 2.0, table.at[idx].add(upd)
    return jax.jit(f), (_normal(14, 500, 64), idx, _normal(15, 200, 64))


def collective(jax):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(jax.devices("trn")[:4]), ("x",))

    def body(a):
        return jax.lax.psum(a * 2.0, "x"), jax.lax.all_gather(a, "x", tiled=True)
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=(P(), P("x"))))
    x = jax.device_put(_normal(16, 64, 32), NamedSharding(mesh, P("x")))
    return f, (x,)


def host_callback(jax):
    jnp = jax.numpy

    def host(v):
        return np.asarray(v) * 3.0 + 1.0

    def f(x):
        y = jax.pure_callback(host, jax.ShapeDtypeStruct(x.shape, x.dtype), jnp.sin(x))
        return y * 2.0
    return jax.jit(f), (_normal(17, 32, 16),)


def flax_train_step(jax):
    """Two steps of tests/programs' linen MLP with the optax chain (clip + adamw)."""
    from tests.programs.programs import linen_mlp
    run = linen_mlp(jax, 2)
    return run.step, run.args


CORPUS = {f.__name__: f for f in (elementwise, matmul_bf16, matmul_f32, reductions, scan_loop,
                                  while_loop, conditional, gather_scatter, collective,
                                  host_callback, flax_train_step)}


# --- fingerprints ----------------------------------------------------------------------


def _digest(parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else repr(p).encode())
    return h.hexdigest()[:24]


def _timeline(executions) -> dict:
    events, colls = [], []
    for ex in executions:
        for k in ex.kernels:
            events.append((k.name, k.device, k.context, k.start_ns.hex(), k.end_ns.hex()))
            events.extend((e.queue, e.opcode, e.name, e.start_ns.hex(), e.end_ns.hex(),
                           e.wait_start_ns.hex(), e.bytes, e.flops, e.core) for e in k.events)
        for c in ex.collectives:
            colls.append((c.kind, c.name, c.algorithm, c.bytes, c.start_ns.hex(),
                          c.end_ns.hex(), tuple(a.hex() for a in c.arrival_ns)))
    return {"simulated_time_s": [float(ex.simulated_time_s).hex() for ex in executions],
            "events": _digest(events), "n_events": len(events) - sum(
                len(ex.kernels) for ex in executions),
            "collectives": _digest(colls)}


def _results(jax, out) -> str:
    leaves = [np.asarray(a) for a in jax.tree.leaves(out)]
    return _digest([(a.dtype.str, a.shape) for a in leaves]
                   + [np.ascontiguousarray(a).tobytes() for a in leaves])


def fingerprint_one(jax, name: str) -> dict:
    """Runs corpus program `name` twice on the trn backend (the second call is the
    one a cached timeline would serve) and fingerprints both calls."""
    import jax_trn
    trn = jax.devices("trn")[0]
    with jax.default_device(trn):
        f, args = CORPUS[name](jax)
        f(*args)                                 # compile (and run) outside the profile
        with jax_trn.profile() as prof:
            outs = [f(*args) for _ in range(2)]
            jax.block_until_ready(outs)
    return {**_timeline(prof.executions), "results": [_results(jax, o) for o in outs]}


def comparable(fp: dict) -> dict:
    """A fingerprint as far as this machine reproduces the pinned one: without its
    result digests when the simulator's GEMM kernel is not `PINNED_GEMM`."""
    from jax_trn.hw import sgemm
    if sgemm.kernel() == PINNED_GEMM:
        return fp
    return {k: v for k, v in fp.items() if k != "results"}


def fingerprint(jax, names=None) -> dict:
    return {n: fingerprint_one(jax, n) for n in (names or CORPUS)}


def main(argv: list[str]) -> int:
    if "--write" not in argv:
        import jax
        print(json.dumps(fingerprint(jax), indent=1, sort_keys=True))
        return 0
    if PINNED.exists() and "--force" not in argv:
        print(f"{PINNED} exists: it pins simulated results from before a change; "
              "pass --force to overwrite it (only for a change meant to move them)",
              file=sys.stderr)
        return 1
    import jax
    PINNED.write_text(json.dumps(fingerprint(jax), indent=1, sort_keys=True) + "\n")
    print(f"wrote {PINNED}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
