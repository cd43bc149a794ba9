"""complex64 on trn against the CPU backend: buffers, elementwise math, matmuls,
reductions, movement, control flow, FFTs, grad / vmap / scan and a sharded array
(hlo_passes/passes/complex_planes.py splits every complex value into float32 planes)."""
from __future__ import annotations

import numpy as np
import pytest

RNG = np.random.default_rng(0)


def _c(*shape, scale=1.0):
    return ((RNG.normal(size=shape) + 1j * RNG.normal(size=shape)) * scale).astype(np.complex64)


Z = _c(4, 6)
W = _c(4, 6)
X = RNG.normal(size=(4, 6)).astype(np.float32)


def check(jax, trn, f, *args, rtol=2e-5, atol=2e-5):
    """`jax.jit(f)` on trn (arguments put on the device) equals it on CPU."""
    g = jax.jit(f)
    got = g(*[jax.device_put(a, trn) for a in args])
    want = g(*args)
    for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)
    return got


def test_buffers_round_trip_and_stay_complex(jax, trn):
    z = jax.device_put(Z, trn)
    assert z.dtype == np.complex64
    np.testing.assert_array_equal(np.asarray(z), Z)
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda a: a)(z)), Z)


ELEMENTWISE = {
    "add": lambda z, w: z + w, "sub": lambda z, w: z - w, "mul": lambda z, w: z * w,
    "div": lambda z, w: z / w, "neg": lambda z, w: -z, "conj": lambda z, w: jax_conj(z),
    "real_imag": lambda z, w: (z.real, z.imag), "abs": lambda z, w: abs(z),
    "exp": lambda z, w: jnp_(z, "exp"), "log": lambda z, w: jnp_(z, "log"),
    "sqrt": lambda z, w: jnp_(z, "sqrt"), "sin": lambda z, w: jnp_(z, "sin"),
    "cos": lambda z, w: jnp_(z, "cos"), "tan": lambda z, w: jnp_(z, "tan"),
    "tanh": lambda z, w: jnp_(z, "tanh"), "expm1": lambda z, w: jnp_(z, "expm1"),
    "log1p": lambda z, w: jnp_(z, "log1p"), "pow": lambda z, w: z ** w,
    "sign": lambda z, w: jnp_(z, "sign"), "eq_ne": lambda z, w: (z == w, z != z),
    "select": lambda z, w: jax_where(z.real > 0, z, w),
    "angle": lambda z, w: jnp_(z, "angle"),
    "reciprocal": lambda z, w: 1 / z,
}


def jnp_(z, name):
    import jax.numpy as jnp
    return getattr(jnp, name)(z)


def jax_conj(z):
    import jax.numpy as jnp
    return jnp.conj(z)


def jax_where(p, a, b):
    import jax.numpy as jnp
    return jnp.where(p, a, b)


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise(jax, trn, name):
    check(jax, trn, ELEMENTWISE[name], Z, W, rtol=1e-5, atol=1e-5)


def test_abs_does_not_overflow(jax, trn):
    z = np.array([3e30 + 4e30j, 1e-30 + 1e-30j, 0j, np.inf + 1j], np.complex64)
    check(jax, trn, lambda z: abs(z), z, rtol=1e-6)


def test_exp_of_1j_x(jax, trn):
    x = np.linspace(-20, 20, 64, dtype=np.float32)
    check(jax, trn, lambda x: jax.numpy.exp(1j * x), x, rtol=1e-5, atol=1e-6)


def test_converts(jax, trn):
    jnp = jax.numpy
    check(jax, trn, lambda x, z: (x.astype(jnp.complex64), jax.lax.complex(x, 2 * x),
                                  z.real.astype(jnp.int32), jnp.asarray(z, jnp.complex64)),
          X, Z)


@pytest.mark.parametrize("precision", ["highest", "default"])
def test_matmul(jax, trn, precision):
    a, b = _c(8, 40), _c(40, 24)
    tol = 2e-5 if precision == "highest" else 5e-2
    with jax.default_matmul_precision(precision):
        check(jax, trn, lambda a, b: a @ b, a, b, rtol=tol, atol=tol * 10)


def test_einsum_and_mixed_matmul(jax, trn):
    jnp = jax.numpy
    a, b = _c(3, 5, 7), _c(3, 7, 4)
    r = RNG.normal(size=(7, 2)).astype(np.float32)
    with jax.default_matmul_precision("highest"):
        check(jax, trn, lambda a, b, r: (jnp.einsum("bij,bjk->bik", a, b), a @ r), a, b, r,
              rtol=1e-4, atol=1e-4)


def test_reductions(jax, trn):
    jnp = jax.numpy
    with jax.default_matmul_precision("highest"):      # vdot is a matmul
        check(jax, trn, lambda z: (jnp.sum(z), jnp.sum(z, axis=0), jnp.mean(z, axis=1),
                                   jnp.linalg.norm(z), jnp.vdot(z, z)), Z, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis", [None, 1, (0, 2)])
def test_products_are_trees_of_complex_multiplies(jax, trn, axis):
    check(jax, trn, lambda z: jax.numpy.prod(z, axis=axis), _c(3, 5, 7, scale=0.7),
          rtol=2e-6, atol=1e-6)


def test_movement(jax, trn):
    jnp = jax.numpy
    i = np.array([3, 0, 2], np.int32)
    check(jax, trn, lambda z, w, i: (z.T, z.reshape(6, 4), z[1:3, ::2], jnp.concatenate([z, w]),
                                     jnp.pad(z, ((1, 0), (0, 2))), z[i], jnp.flip(z, 1),
                                     jnp.broadcast_to(z[0], (3, 6)), jnp.roll(z, 2, axis=1),
                                     jax.lax.dynamic_slice(z, (i[0], 1), (1, 3)),
                                     z.at[i, 1].set(w[0, :3]), z.at[i].add(w[:3]),
                                     jnp.arange(4, dtype=jnp.complex64), jnp.full((2,), 1 - 2j)),
          Z, W, i)


def test_sort_is_lexicographic(jax, trn):
    z = np.array([1 + 2j, 1 - 1j, -3 + 0j, 1 + 0j, -3 - 5j, 0j], np.complex64)
    check(jax, trn, lambda z: jax.numpy.sort(z), z)


def test_while_scan_and_cond(jax, trn):
    lax = jax.lax

    def f(z, w):
        loop = lax.fori_loop(0, 3, lambda i, c: c * w + 1j, z)
        scanned = lax.scan(lambda c, x: (c * 0.5 + x, c.conj()), z[0], z)
        branch = lax.cond(z[0, 0].real > 0, lambda v: v * 2j, lambda v: -v, w)
        return loop, scanned, branch
    check(jax, trn, f, Z, W, rtol=1e-4, atol=1e-4)


def test_grad_of_a_real_loss_of_complex_intermediates(jax, trn):
    jnp = jax.numpy

    def loss(x, y):
        z = jax.lax.complex(x, y)
        return jnp.sum(jnp.abs(jnp.exp(1j * z) * z + z * z) ** 2).real
    g = jax.grad(loss, argnums=(0, 1))
    check(jax, trn, g, X, X[::-1].copy(), rtol=1e-4, atol=1e-4)


def test_grad_through_complex_matmul_and_vmap(jax, trn):
    jnp = jax.numpy
    a = _c(5, 5)

    def loss(x):
        return jnp.real(jnp.sum(jnp.conj(a @ x) * (a @ x)))
    with jax.default_matmul_precision("highest"):
        check(jax, trn, jax.grad(loss), _c(5, 3), rtol=1e-4, atol=1e-4)
        check(jax, trn, jax.vmap(lambda z: jnp.vdot(z, a @ z)), _c(4, 5), rtol=1e-4,
              atol=1e-4)


FFT_SIZES = [(8,), (7,), (16, 5), (3, 4, 6), (129,), (300,), (1024,)]


@pytest.mark.parametrize("shape", FFT_SIZES, ids=lambda s: "x".join(map(str, s)))
def test_fft_ifft(jax, trn, shape):
    fft = jax.numpy.fft
    z = _c(2, *shape)
    axes = tuple(range(-len(shape), 0))
    check(jax, trn, lambda z: (fft.fftn(z, axes=axes), fft.ifftn(z, axes=axes)), z,
          rtol=2e-5, atol=2e-5 * np.sqrt(np.prod(shape)))


@pytest.mark.parametrize("shape", FFT_SIZES, ids=lambda s: "x".join(map(str, s)))
def test_rfft_irfft(jax, trn, shape):
    fft = jax.numpy.fft
    x = RNG.normal(size=(2, *shape)).astype(np.float32)
    axes = tuple(range(-len(shape), 0))
    spectrum = np.fft.rfftn(x, axes=axes).astype(np.complex64)
    tol = 2e-5 * np.sqrt(np.prod(shape))
    check(jax, trn, lambda x: fft.rfftn(x, axes=axes), x, rtol=2e-5, atol=tol)
    check(jax, trn, lambda s: fft.irfftn(s, s=shape, axes=axes), spectrum, rtol=2e-5, atol=tol)


def test_fft_family(jax, trn):
    fft = jax.numpy.fft
    z = _c(6, 10)
    check(jax, trn, lambda z: (fft.fft(z, axis=0), fft.fft2(z), fft.ifft2(z), fft.fftshift(z),
                               fft.fft(z, n=16), fft.hfft(z[0])), z, rtol=2e-5, atol=2e-4)


def test_fft_matches_numpy_to_float32_precision(jax, trn):
    """Relative to the spectrum's scale, about 1e-6 at n = 4096 (FP32 matmuls)."""
    z = _c(4096)
    got = np.asarray(jax.jit(jax.numpy.fft.fft)(jax.device_put(z, trn)))
    want = np.fft.fft(z.astype(np.complex128))
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 1e-5


def test_sharded_complex_array(jax, trn_devices):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    mesh = Mesh(np.array(trn_devices[:4]), ("x",))
    z = jax.device_put(_c(8, 6), NamedSharding(mesh, P("x")))
    f = jax.jit(lambda z: (z * 1j + z.sum(), jax.numpy.fft.fft(z, axis=1)))
    got = f(z)
    want = f(np.asarray(z))
    for x, y in zip(got, want):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["solve", "inv", "cholesky", "det", "slogdet", "norm",
                                  "triangular"])
def test_linalg(jax, trn, name):
    jnp, sl = jax.numpy, jax.scipy.linalg
    a = _c(4, 4) + 4 * np.eye(4, dtype=np.complex64)
    cases = {"solve": lambda a, b: jnp.linalg.solve(a, b), "inv": lambda a, b: jnp.linalg.inv(a),
             "cholesky": lambda a, b: jnp.linalg.cholesky(a @ a.conj().T),
             "det": lambda a, b: jnp.linalg.det(a), "slogdet": lambda a, b: jnp.linalg.slogdet(a),
             "norm": lambda a, b: jnp.linalg.norm(a),
             "triangular": lambda a, b: sl.solve_triangular(jnp.tril(a), b, lower=True)}
    with jax.default_matmul_precision("highest"):
        check(jax, trn, cases[name], a, _c(4), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", ["svd", "eigh"])
def test_complex_decompositions_run(jax, trn, name):
    """Complex svd / eigh were refused; they run through the real embedding
    (jax_trn/linalg_complex.py): the values match numpy's."""
    a = _c(4, 4)
    h = (a + a.conj().T).astype(np.complex64)
    if name == "svd":
        got = jax.jit(lambda m: jax.numpy.linalg.svd(m, compute_uv=False))(
            jax.device_put(h, trn))
        want = np.linalg.svd(h, compute_uv=False)
    else:
        got = jax.jit(jax.numpy.linalg.eigvalsh)(jax.device_put(h, trn))
        want = np.linalg.eigvalsh(h)
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", ["psum", "all_gather", "ppermute", "psum_scatter",
                                  "all_to_all"])
def test_collectives_on_complex_values(jax, trn_devices, name):
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    lax = jax.lax
    f, spec = {
        "psum": (lambda a: lax.psum(a, "x"), P()),
        "all_gather": (lambda a: lax.all_gather(a, "x", tiled=True), P()),
        "ppermute": (lambda a: lax.ppermute(a, "x", [(i, (i + 1) % 4) for i in range(4)]),
                     P("x")),
        "psum_scatter": (lambda a: lax.psum_scatter(a, "x", tiled=True), P("x")),
        "all_to_all": (lambda a: lax.all_to_all(a, "x", 1, 1, tiled=True), P("x")),
    }[name]
    z = _c(16, 8)
    out = []
    for devices in (trn_devices, jax.devices("cpu")):
        mesh = Mesh(np.array(devices[:4]), ("x",))
        g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=spec,
                                  check_vma=False))
        out.append(np.asarray(g(jax.device_put(z, NamedSharding(mesh, P("x"))))))
    np.testing.assert_allclose(out[0], out[1], rtol=1e-6, atol=1e-6)


def _extremes():
    mags = np.array([0, 1e-30, 1e-15, 1e-5, 0.5, 1, 2, 30, 100, 1e5, 1e20, 3e38, np.inf],
                    np.float32)
    axis = np.concatenate([-mags, mags])
    re, im = np.meshgrid(axis, axis)
    z = np.empty(re.shape, np.complex64)
    z.real, z.imag = re, im
    return z.ravel()


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "absolute", "sin", "cos", "tan", "tanh",
                                  "log1p", "sign", "reciprocal", "divide", "arcsin", "arctan",
                                  "arcsinh", "square"])
def test_special_values_match_cpu(jax, trn, name):
    """Zeros, huge and infinite parts (normal floats: CPU flushes subnormals, trn does
    not), NaN where CPU gives NaN: XLA's special cases, C99 Annex G's division."""
    f = getattr(jax.numpy, name)
    z = _extremes()
    g = jax.jit((lambda a: f(a, a[::-1])) if name == "divide" else f)
    got = np.atleast_1d(np.asarray(g(jax.device_put(z, trn)))).astype(np.complex128)
    want = np.atleast_1d(np.asarray(g(z))).astype(np.complex128)
    for part in (np.real, np.imag):
        np.testing.assert_allclose(_ftz(part(got)), _ftz(part(want)), rtol=1e-5, atol=1e-30)


def _ftz(x: np.ndarray) -> np.ndarray:
    """Subnormal float32 results as zeros (the CPU backend flushes them)."""
    return np.where(np.abs(x) < np.finfo(np.float32).tiny, 0.0, x)


def test_convolution_and_its_gradient(jax, trn):
    lax = jax.lax
    x, k = _c(2, 3, 9, 8), _c(4, 3, 3, 2)

    def f(x, k):
        y = lax.conv_general_dilated(x, k, (1, 1), "SAME", rhs_dilation=(2, 1))
        return y, jax.grad(lambda x: jax.numpy.sum(jax.numpy.abs(
            lax.conv_general_dilated(x, k, (2, 1), "VALID")) ** 2))(x)
    with jax.default_matmul_precision("highest"):
        check(jax, trn, f, x, k, rtol=1e-4, atol=1e-4)


def test_window_sums(jax, trn):
    jnp, lax = jax.numpy, jax.lax
    check(jax, trn, lambda z: (jnp.cumsum(z, 0), jnp.cumsum(z[::-1], 1),
                               lax.reduce_window(z, 0j, lax.add, (2, 2), (1, 1), "VALID")), Z,
          rtol=1e-5, atol=1e-5)


def test_donated_complex_buffer_is_reused(jax, trn_devices):
    import warnings
    d = trn_devices[5]
    before = d.memory_stats()["bytes_in_use"]
    z = jax.device_put(np.ones((64, 64), np.complex64), d)
    f = jax.jit(lambda z: z * 1j + 1, donate_argnums=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            z = f(z)
    assert d.memory_stats()["bytes_in_use"] - before == 64 * 64 * 8
    np.testing.assert_array_equal(np.asarray(z), np.zeros((64, 64), np.complex64))


def test_log_of_tiny_values_keeps_its_angle(jax, trn):
    """JAX's FunctionAccuracyTest: log10(1.2e-38 + 1.2e-38j) had an angle of 0, not
    pi/4: atan2 clamped its denominator at 1e-30 (tileops/mathops.py)."""
    tiny = np.float32(np.finfo(np.float32).tiny)
    z = np.array([tiny * (1 + 1j), 5.2e-31 * (1 + 1j), 3e-35 - 1e-36j, -2e-33 + 0j],
                 np.complex64)
    check(jax, trn, lambda z: (jax.numpy.log(z), jax.numpy.log10(z),
                               jax.numpy.arctan2(z.imag, z.real)), z, rtol=2e-6, atol=0)
