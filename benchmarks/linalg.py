"""Simulated and wall time of jnp.linalg.eigh, svd, qr and cholesky on one NeuronCore.

    python benchmarks/linalg.py [--sizes 32 64 128]

eigh and svd run as parallel Jacobi (jax_trn/linalg_jacobi.py): sweeps of n - 1 rotation
steps (one loop trip per `UNROLL` steps); qr and cholesky as one `fori_loop` trip per
column (jax_trn/jax_rules.py); float32 with HIGHEST matmuls. Per size the table gives the
simulated time of one execution, the kernels it ran, the wall time of that execution in
the simulator (compiled beforehand) and the compile time, for a random symmetric matrix
(eigh), a random square matrix (svd with full U and V^T; qr) and an SPD one (cholesky).
"""
from __future__ import annotations

import argparse
import os
import time

# The simulator multiplies tiles with numpy; OpenBLAS's threads fighting over a loaded
# 2-core machine made each 128 x 128 float32 product ~15 ms instead of ~0.1 ms (wall time
# of eigh at n = 128: 55 s -> 11 s). Set before numpy loads; an explicit setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402


def measure(jax, fn, x) -> dict:
    import jax_trn
    trn = jax.devices("trn")[0]
    arg = jax.device_put(x, trn)
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(arg).compile()
    t1 = time.perf_counter()
    with jax_trn.profile() as prof:
        jax.block_until_ready(compiled(arg))
    t2 = time.perf_counter()
    ex = prof.executions[-1]
    return {"sim_us": ex.simulated_time_s * 1e6, "kernels": len(ex.kernels),
            "wall_s": t2 - t1, "compile_s": t1 - t0}


def loop_trip_us(jax) -> float:
    """Simulated time of one fori_loop trip whose body is one [32, 32] multiply: the
    difference of 110 and 10 trips, over 100."""
    import jax_trn
    x = jax.device_put(np.ones((32, 32), np.float32), jax.devices("trn")[0])
    times = []
    for trips in (10, 110):
        f = jax.jit(lambda x, t=trips: jax.lax.fori_loop(0, t, lambda i, y: y * 1.0001, x))
        jax.block_until_ready(f(x))
        with jax_trn.profile() as prof:
            jax.block_until_ready(f(x))
        times.append(prof.executions[-1].simulated_time_s * 1e6)
    return (times[1] - times[0]) / 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128])
    sizes = parser.parse_args().sizes
    import jax
    jax.config.update("jax_default_matmul_precision", "highest")
    rng = np.random.default_rng(0)
    print(f"{'op':8s} {'n':>5s} {'simulated us':>13s} {'kernels':>8s} {'wall s':>7s} "
          f"{'compile s':>9s}")
    for n in sizes:
        x = rng.normal(size=(n, n)).astype(np.float32)
        rows = [("eigh", jax.numpy.linalg.eigh, (x + x.T) / 2),
                ("svd", jax.numpy.linalg.svd, x),
                ("qr", jax.numpy.linalg.qr, x),
                ("cholesky", jax.numpy.linalg.cholesky, x @ x.T + n * np.eye(n, dtype=x.dtype))]
        for name, fn, arg in rows:
            r = measure(jax, fn, arg)
            print(f"{name:8s} {n:5d} {r['sim_us']:13.0f} {r['kernels']:8d} {r['wall_s']:7.1f} "
                  f"{r['compile_s']:9.1f}", flush=True)
    print(f"one fori_loop trip (body: one [32, 32] multiply): {loop_trip_us(jax):.1f} us simulated")


if __name__ == "__main__":
    main()
