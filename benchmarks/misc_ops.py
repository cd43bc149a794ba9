"""Simulated time of reverse, rng_bit_generator and reduce_precision on one NeuronCore.

    python benchmarks/misc_ops.py [--n 1024]

Each op runs on an [n, n] array (float32; uint32 bits for the RNG) through jax.jit on
the default trn system; the table gives the simulated time of the execution and, for
scale, of `x * 2` (a memory-bound elementwise op of the same size).
"""
from __future__ import annotations

import argparse

import numpy as np


def simulated_us(jax, fn, *args) -> float:
    import jax_trn
    with jax_trn.profile() as prof:
        jax.block_until_ready(jax.jit(fn)(*args))
    return prof.executions[-1].simulated_time_s * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1024)
    n = parser.parse_args().n
    import jax
    trn = jax.devices("trn")[0]
    x = jax.device_put(np.ones((n, n), np.float32), trn)
    state = jax.device_put(np.arange(4, dtype=np.uint32), trn)
    rows = [
        ("x * 2 (reference)", lambda a: a * 2, x),
        ("reverse axis 0 (DMA pattern)", lambda a: a[::-1], x),
        ("reverse axis 1 (on-chip columns)", lambda a: a[:, ::-1], x),
        ("rng_bit_generator uint32 (Philox)",
         lambda s: jax.lax.rng_bit_generator(s, (n, n), np.uint32)[1], state),
        ("rng_bit_generator uint32 (Threefry)",
         lambda s: jax.lax.rng_bit_generator(
             s, (n, n), np.uint32, algorithm=jax.lax.RandomAlgorithm.RNG_THREE_FRY)[1], state),
        ("reduce_precision(5, 10)", lambda a: jax.lax.reduce_precision(a, 5, 10), x),
    ]
    print(f"{'op on [' + str(n) + ', ' + str(n) + ']':36s} {'simulated us':>14s}")
    for name, fn, arg in rows:
        print(f"{name:36s} {simulated_us(jax, fn, arg):14.1f}")


if __name__ == "__main__":
    main()
