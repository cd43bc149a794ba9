"""The complex-planes pass: after it no value of the program is complex, complex
parameters and results are float32[..., 2] behind trn.deinterleave / trn.interleave,
and each op class becomes the real ops documented in the pass."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_passes
from hlo_passes import complex_fft, ir
from hlo_passes.errors import HloImportError
from hlo_passes.passes import complex_planes

from .helpers import artifact_of, from_text

C = np.zeros((4, 6), np.complex64)
X = np.zeros((4, 6), np.float32)


def compiled(f, *args, fuse=False):
    return hlo_passes.compile_to_ir(artifact_of(f, *args), fuse=fuse)


def kinds(module) -> list[str]:
    return [op.kind for op in ir.walk(module.main.body)]


def no_complex(module) -> bool:
    fn = module.main
    values = [*fn.args, *(v for op in ir.walk(fn.body) for v in (*op.operands, *op.results))]
    values += [a for op in ir.walk(fn.body) for r in op.regions for b in r.blocks for a in b.args]
    return not any(v.dtype.startswith("complex") for v in values)


def test_boundary_is_interleaved_float32_and_remembered():
    m = compiled(lambda z, x: (z * 2, x + 1, z.real), C, X)
    fn = m.main
    assert [a.type for a in fn.args] == [ir.TensorType((4, 6, 2), "float32"),
                                         ir.TensorType((4, 6), "float32")]
    assert fn.result_types[0] == ir.TensorType((4, 6, 2), "float32")
    params, results = m.attrs[complex_planes.BOUNDARY]
    assert [t.dtype for t in params] == ["complex64", "float32"]
    assert [t.dtype for t in results] == ["complex64", "float32", "float32"]
    assert kinds(m).count("trn.deinterleave") == 1 and kinds(m).count("trn.interleave") == 1
    assert no_complex(m)


def test_real_programs_are_untouched():
    m = compiled(lambda x: jnp.sin(x) @ x.T, X)
    assert complex_planes.BOUNDARY not in m.attrs
    assert not any(k.startswith("trn.") for k in kinds(m))


@pytest.mark.parametrize("f", [
        lambda z: z * z, lambda z: z / (z + 1), lambda z: jnp.exp(z), lambda z: jnp.log(z),
        lambda z: jnp.sqrt(z), lambda z: z ** z, lambda z: jnp.sin(z), lambda z: jnp.cos(z),
        lambda z: jnp.tan(z), lambda z: jnp.tanh(z), lambda z: jnp.expm1(z),
        lambda z: jnp.log1p(z), lambda z: jnp.sign(z), lambda z: abs(z),
        lambda z: (z == z, z != z), lambda z: jnp.where(z.real > 0, z, -z),
        lambda z: jax.lax.convert_element_type(z, jnp.float32), lambda z: jnp.sum(z, 0), lambda z: jnp.prod(z),
        lambda z: jnp.sort(z, axis=1), lambda z: z.T.reshape(3, 8)[1:, ::2],
        lambda z: jnp.concatenate([z, jnp.pad(z, ((0, 0), (1, 1)))[:, 1:-1]]),
        lambda z: z.at[jnp.array([1, 3])].add(z[:2]), lambda z: z[jnp.array([2, 0])],
        lambda z: jax.lax.fori_loop(0, 3, lambda i, c: c * c, z),
        lambda z: jax.lax.cond(z[0, 0].real > 0, lambda v: v, lambda v: -v, z),
        lambda z: jnp.fft.fft2(z), lambda z: jnp.fft.irfft(z), lambda z: z @ z.T,
], ids=lambda f: "")
def test_no_complex_value_survives(f):
    assert no_complex(compiled(f, C))


def test_complex_matmul_is_four_real_matmuls_with_the_users_precision():
    m = compiled(lambda a, b: jnp.matmul(a, b, precision="high"), C, C.T)
    dots = [op for op in ir.walk(m.main.body) if op.kind == "dot_general"]
    assert len(dots) == 4
    assert all(op.attrs["precision_config"] == ("HIGH", "HIGH") for op in dots)


def test_fft_is_fp32_dft_matmuls():
    m = compiled(lambda z: jnp.fft.fft(z), np.zeros((4, 16), np.complex64))
    dots = [op for op in ir.walk(m.main.body) if op.kind == "dot_general"]
    assert len(dots) == 1 and dots[0].attrs["precision_config"] == ("HIGHEST", "HIGHEST")
    assert dots[0].operands[1].shape == (32, 32)


def test_long_fft_is_split_cooley_tukey():
    m = compiled(lambda z: jnp.fft.fft(z), np.zeros((2, 4096), np.complex64))
    dots = [op for op in ir.walk(m.main.body) if op.kind == "dot_general"]
    assert [op.operands[1].shape for op in dots] == [(128, 128), (128, 128)]


@pytest.mark.parametrize("n,inverse", [(8, False), (7, True), (12, False)])
def test_dft_matrix_is_numpys_fft(n, inverse):
    """[re | im] of y from [re | im] of x through the one [2n, 2n] matrix."""
    x = np.random.default_rng(n).normal(size=(3, n)) + 1j * np.random.default_rng(1).normal(
        size=(3, n))
    y = np.concatenate([x.real, x.imag], 1) @ complex_fft.complex_matrix(n, inverse)
    want = np.fft.ifft(x) if inverse else np.fft.fft(x)
    np.testing.assert_allclose(y[:, :n] + 1j * y[:, n:], want, atol=1e-12)


def test_sort_comparator_sees_planes_in_operand_order():
    m = compiled(lambda z: jnp.sort(z, axis=1), C)
    sort = next(op for op in ir.walk(m.main.body) if op.kind == "sort")
    assert len(sort.operands) == 2 and len(sort.regions[0].block.args) == 4


def test_while_carries_two_planes_per_complex_value():
    m = compiled(lambda z: jax.lax.fori_loop(0, 3, lambda i, c: c * 2j, z), C)
    loop = next(op for op in ir.walk(m.main.body) if op.kind == "while")
    assert [v.dtype for v in loop.results].count("float32") == 2


def test_unsupported_complex_op_names_op_and_types():
    text = """
      func.func @main(%x: tensor<4xcomplex<f32>>) -> tensor<4xf32> {
        %0 = stablehlo.custom_call @foo(%x) : (tensor<4xcomplex<f32>>) -> tensor<4xf32>
        return %0 : tensor<4xf32>
      }"""
    with pytest.raises(HloImportError, match=r"complex numbers are not supported in "
                                             r"stablehlo.custom_call\(complex64\[4\]\)"):
        complex_planes.run(from_text(text))


def test_complex_sdy_constant_is_read_as_a_value():
    """A sharded program's complex constants (sdy.constant) import as arrays, so
    localize can slice them (they were the attribute's text before)."""
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((4,), ("x",), devices=jax.devices("cpu")[:4])
    z = jax.device_put(np.zeros((8, 6), np.complex64), NamedSharding(mesh, P("x")))
    m = compiled(lambda z: z * 1j + z.sum(), z)
    assert no_complex(m)


@pytest.mark.parametrize("f,what", [
        (lambda z: jnp.cumprod(z, 0), "complex reduce_window with the combiner"),
        (lambda z: z.at[np.array([0, 0])].multiply(2j),
         "complex scatter with a multiply combiner needs unique indices"),
])
def test_unsupported_combiners_are_named(f, what):
    with pytest.raises(HloImportError, match=what):
        compiled(f, C)
