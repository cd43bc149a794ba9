"""Complex matmul and FFT on the simulated NeuronCore: simulated time and error vs CPU.

    python benchmarks/complex_matmul.py [--gauss]

Prints, for complex64 matmuls under the default precision (bf16 auto-cast) and HIGHEST,
the simulated time and the max error relative to the largest |result| against the CPU
backend, and the same for FFTs of a few lengths. `--gauss` measures Gauss's 3-matmul
form (hlo_passes.passes.complex_planes.GAUSS) instead of the 4-matmul one.
"""
from __future__ import annotations

import argparse

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gauss", action="store_true")
    args = parser.parse_args()
    from hlo_passes.passes import complex_planes
    complex_planes.GAUSS = args.gauss
    import jax
    import jax_trn
    trn = jax.devices("trn")[0]
    rng = np.random.default_rng(0)

    def c(*s):
        return (rng.normal(size=s) + 1j * rng.normal(size=s)).astype(np.complex64)

    def run(label, f, *xs):
        g = jax.jit(f)
        want = np.asarray(g(*xs))
        on = [jax.device_put(x, trn) for x in xs]
        g(*on).block_until_ready()
        with jax_trn.profile() as prof:
            got = np.asarray(g(*on))
        err = np.max(np.abs(got - want)) / np.max(np.abs(want))
        t = prof.executions[-1].simulated_time_s
        print(f"{label:<34} {t * 1e6:10.1f} us   rel err {err:.1e}")

    print("form:", "gauss (3 matmuls)" if args.gauss else "4 matmuls")
    for n in (256, 512, 1024):
        a, b = c(n, n), c(n, n)
        for prec in ("default", "highest"):
            with jax.default_matmul_precision(prec):
                run(f"matmul {n}x{n}x{n} {prec}", lambda a, b: a @ b, a, b)
    for shape in ((64, 128), (64, 1024), (8, 4096), (16, 64, 64)):
        z = c(*shape)
        if len(shape) == 3:
            run(f"fft2 {shape}", jax.numpy.fft.fft2, z)
        else:
            run(f"fft {shape}", jax.numpy.fft.fft, z)


if __name__ == "__main__":
    main()
