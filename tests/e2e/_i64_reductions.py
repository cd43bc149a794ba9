"""Run by test_ops.py in a fresh interpreter (x64 on): int64/uint64 reductions vs CPU."""
import jax
import numpy as np

jax.config.update("jax_enable_x64", True)
t = jax.devices("trn")[0]
x = (np.arange(1000, dtype=np.int64) * 3_000_000_007) % (1 << 40)
u = x.astype(np.uint64) * np.uint64(1 << 23)
cases = [(lambda x: x.sum(), x), (lambda x: x.max(), x), (lambda x: x.min(), x),
         (lambda x: x.reshape(10, 100).sum(1), x), (lambda u: u.sum(), u)]
for f, a in cases:
    print(np.array_equal(np.asarray(jax.jit(f)(jax.device_put(a, t))), np.asarray(jax.jit(f)(a))))
try:
    jax.jit(lambda u: u.max())(jax.device_put(u, t))
except Exception as e:
    print("uint64-max-error" if "uint64 is not supported" in str(e) else e)
