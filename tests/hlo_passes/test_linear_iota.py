"""The linear-iota pass: a sum of iotas scaled by their shape's row-major strides (JAX's
threefry counters) becomes one flat iota, reshaped; anything else stays."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import hlo_passes
from hlo_passes.passes import linear_iota

from .helpers import artifact_of


def _cleaned(f, *args):
    return hlo_passes.compile_to_ir(artifact_of(f, *args), fuse=False)


def _iotas(module):
    return [(tuple(o.result.shape), o.attrs["iota_dimension"])
            for o in module.main.body.ops if o.kind == "iota"]


def test_threefry_counters_are_one_flat_iota():
    module = _cleaned(lambda k: jax.random.bits(jax.random.wrap_key_data(k), (4, 8, 16)),
                      jnp.zeros((2,), jnp.uint32))
    assert sorted(d for _, d in _iotas(module)) == [0, 1, 2]
    assert linear_iota.run(module)
    hlo_passes.passes.dce.run(module)
    assert _iotas(module) == [((512,), 0)]


def _sum(strides, shape=(3, 5, 7), dtype=np.uint32):
    def f(x):
        terms = [jax.lax.broadcasted_iota(dtype, shape, d) * dtype(s)
                 for d, s in enumerate(strides) if s is not None]
        return sum(terms[1:], terms[0]) + x
    return f


def test_row_major_strides_match_and_others_do_not():
    x = np.zeros((3, 5, 7), np.uint32)
    for strides, linear in [((35, 7, 1), True), ((None, 7, 1), False), ((35, 1, 7), False),
                            ((35, 7, 2), False)]:
        module = _cleaned(_sum(strides), x)
        assert linear_iota.run(module) == linear, strides


def test_size_one_dims_may_be_left_out():
    module = _cleaned(_sum((None, 7, 1), shape=(1, 5, 7)), np.zeros((1, 5, 7), np.uint32))
    assert linear_iota.run(module)


def test_a_type_too_narrow_for_the_count_is_left_alone():
    shape = (300, 300)                   # 90000 elements: more than uint16 holds
    module = _cleaned(_sum((300, 1), shape, np.uint16), np.zeros(shape, np.uint16))
    assert not linear_iota.run(module)


def test_values_equal_the_cpu_backend(jax, trn, cpu):
    f = jax.jit(_sum((35, 7, 1)))
    x = np.arange(105, dtype=np.uint32).reshape(3, 5, 7)
    np.testing.assert_array_equal(np.asarray(f(jax.device_put(x, trn))),
                                  np.asarray(f(jax.device_put(x, cpu))))


def test_int4_iotas_are_looked_at_without_error():
    """numpy's iinfo does not know int4 (the pass asked it: 'Invalid integer data type')."""
    import ml_dtypes
    x = np.zeros((4, 3), ml_dtypes.int4)
    module = _cleaned(lambda x: jax.lax.broadcasted_iota(ml_dtypes.int4, (4, 3), 0) *
                      ml_dtypes.int4(3) + jax.lax.broadcasted_iota(ml_dtypes.int4, (4, 3), 1)
                      + x, x)
    assert not linear_iota.run(module)       # 12 elements: more than int4 holds
