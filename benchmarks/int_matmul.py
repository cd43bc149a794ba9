"""Simulated time of integer matmuls on one NeuronCore, and their exactness against the
CPU backend (XLA: exact two's-complement products and sums, wrapping to the result type).

    python benchmarks/int_matmul.py [--sizes 512] [--system trn2.3xlarge]

Rows: int8 x int8 -> int8 (`a @ b`), int8 x int8 -> int32 (`preferred_element_type`),
int32 x int32 -> int32, and bf16 for scale. Operands are random over each type's full
range; "exact" compares every element with the CPU result. Simulated figures are
deterministic (lower/intmatmul.py's module docstring explains the integer path).
"""
from __future__ import annotations

import argparse
import os


def _cases(jnp, lax):
    def mm(pref=None):
        return lambda a, b: lax.dot(a, b, preferred_element_type=pref)
    return [("int8 -> int8", "int8", mm()), ("int8 -> int32", "int8", mm(jnp.int32)),
            ("int32 -> int32", "int32", mm()), ("uint8 -> uint32", "uint8", mm(jnp.uint32)),
            ("int16 -> int32", "int16", mm(jnp.int32)), ("bf16 -> bf16", "bfloat16", mm())]


def _operand(np, dtype: str, shape, seed: int):
    rng = np.random.default_rng(seed)
    if dtype == "bfloat16":
        import ml_dtypes
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[512])
    parser.add_argument("--system", default=None)
    opts = parser.parse_args()
    if opts.system:
        os.environ["JAX_TRN_SYSTEM"] = opts.system
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    import jax_trn

    system = jax_trn.get_system()
    trn, cpu = jax.devices("trn")[0], jax.devices("cpu")[0]
    print(f"integer matmuls on one {system.chip_name} {system.chip.core.name} ({system.name})")
    print(f"{'case':>16} {'M=K=N':>6} {'simulated':>12} {'TensorE busy':>12} {'exact':>6}")
    for n in opts.sizes:
        for name, dtype, fn in _cases(jnp, lax):
            a, b = (_operand(np, dtype, (n, n), s) for s in (0, 1))
            f = jax.jit(fn)
            with jax_trn.profile() as prof:
                got = f(jax.device_put(a, trn), jax.device_put(b, trn)).block_until_ready()
            want = f(jax.device_put(a, cpu), jax.device_put(b, cpu))
            ex = prof.executions[-1]
            exact = np.array_equal(np.asarray(got), np.asarray(want)) if dtype != "bfloat16" \
                else "-"
            print(f"{name:>16} {n:>6} {ex.simulated_time_s * 1e6:10.1f}us "
                  f"{ex.engine_utilization['tensor']:12.1%} {str(exact):>6}")


if __name__ == "__main__":
    main()
