"""Control flow between kernels on trn against the CPU backend: while / fori_loop / scan
(loop-carried values in DRAM, the predicate read from HBM), cond / switch (stablehlo.case),
nesting, autodiff through scan, and the timing / profile / as_text of loops."""
from __future__ import annotations

import numpy as np
import pytest

from tests.e2e.test_ops import _rand, check


@pytest.fixture(scope="module")
def lax(jax):
    return jax.lax


@pytest.fixture(scope="module")
def jnp(jax):
    return jax.numpy


def _both(jax, trn, cpu, f, *args):
    """f jitted on trn and on CPU: (trn results, CPU results) as numpy trees."""
    g = jax.jit(f)
    out = g(*(jax.device_put(a, trn) for a in args))
    ref = g(*(jax.device_put(a, cpu) for a in args))
    for o in jax.tree.leaves(out):
        assert o.devices() == {trn}
    return jax.tree.map(np.asarray, out), jax.tree.map(np.asarray, ref)


# --- loops ---------------------------------------------------------------------------------

def test_fori_loop_static(jax, trn, cpu, lax):
    x = _rand((4, 8), "float32", np.random.default_rng(0))
    check(jax, trn, cpu, lambda x: lax.fori_loop(0, 3, lambda i, c: c * 2 + 1, x), x)


def test_fori_loop_uses_index(jax, trn, cpu, lax):
    x = _rand((3, 5), "float32", np.random.default_rng(1))
    check(jax, trn, cpu, lambda x: lax.fori_loop(1, 5, lambda i, c: c * 0.5 + i, x), x)


def test_fori_loop_dynamic_trip_count(jax, trn, cpu, lax):
    x = _rand((6,), "float32", np.random.default_rng(2))
    f = lambda x, n: lax.fori_loop(0, n, lambda i, c: c + i.astype(c.dtype) * c, x)
    for n in (0, 1, 4):
        out, ref = _both(jax, trn, cpu, f, x, np.int32(n))
        np.testing.assert_allclose(out, ref, rtol=2e-5, atol=1e-6)


def test_while_data_dependent(jax, trn, cpu, lax):
    """Halve until the sum drops below 1: the trip count depends on the data."""
    f = lambda x: lax.while_loop(lambda c: c[0].sum() > 1.0,
                                 lambda c: (c[0] * 0.5, c[1] + 1), (x, np.int32(0)))
    for scale in (1.0, 40.0, 0.01):
        x = np.abs(_rand((8,), "float32", np.random.default_rng(3))) * scale
        (y, n), (y_ref, n_ref) = _both(jax, trn, cpu, f, x)
        assert n == n_ref
        np.testing.assert_allclose(y, y_ref, rtol=2e-5)


def test_zero_iterations(jax, trn, cpu, lax):
    x = _rand((5,), "float32", np.random.default_rng(4))
    check(jax, trn, cpu, lambda x: lax.fori_loop(3, 3, lambda i, c: c * 7, x), x)
    check(jax, trn, cpu, lambda x: lax.while_loop(lambda c: c.sum() > 1e9, lambda c: c + 1, x), x)


def test_swapped_carries(jax, trn, cpu, lax):
    """(a, b) -> (b, a): each copy must read the old value of the other."""
    a = _rand((4, 3), "float32", np.random.default_rng(5))
    b = _rand((4, 3), "float32", np.random.default_rng(6))
    for n in (1, 2, 3):
        check(jax, trn, cpu, lambda a, b, n=n: lax.fori_loop(
            0, n, lambda i, c: (c[1], c[0]), (a, b)), a, b)
        check(jax, trn, cpu, lambda a, b, n=n: lax.fori_loop(
            0, n, lambda i, c: (c[1] + 1, c[0] * 2, c[0]), (a, b, a)), a, b)
        check(jax, trn, cpu, lambda a, b, n=n: lax.fori_loop(
            0, n, lambda i, c: (c[1] + 1, c[0]), (a, b)), a, b)


def test_nested_loops_and_cond_in_loop(jax, trn, cpu, lax, jnp):
    x = _rand((4, 4), "float32", np.random.default_rng(7))

    def f(x):
        def outer(i, c):
            c = lax.fori_loop(0, i, lambda j, d: d * 0.9 + 0.1, c)
            return lax.cond(i % 2 == 0, lambda d: d + 1.0, lambda d: jnp.tanh(d), c)
        return lax.fori_loop(0, 4, outer, x)
    check(jax, trn, cpu, f, x)


# --- conditionals --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int32"])
def test_cond(jax, trn, cpu, lax, jnp, dtype):
    x = _rand((3, 7), dtype, np.random.default_rng(8))
    f = lambda p, x: lax.cond(p > 0, lambda a: a * 2, lambda a: jnp.maximum(a, 1) - a, x)
    for p in (1, -1):
        check(jax, trn, cpu, f, np.float32(p), x)


def test_cond_mixed_operands(jax, trn, cpu, lax, jnp):
    """Several operands of different dtypes, a branch returning an operand unchanged."""
    x = _rand((5,), "float32", np.random.default_rng(9))
    i = _rand((5,), "int32", np.random.default_rng(10))
    h = _rand((2, 3), "bfloat16", np.random.default_rng(11))
    f = lambda x, i, h: lax.cond(x.sum() > 0,
                                 lambda x, i, h: (x + i.astype(jnp.float32), i * 2, h),
                                 lambda x, i, h: (x, i - 1, h * h), x, i, h)
    check(jax, trn, cpu, f, x, i, h)
    check(jax, trn, cpu, f, -x, i, h)


def test_switch(jax, trn, cpu, lax, jnp):
    x = _rand((4, 6), "float32", np.random.default_rng(12))
    branches = [lambda a: a + 1, lambda a: jnp.exp(a) * 0.5, lambda a: a.T @ a * 0 + 3]
    branches[2] = lambda a: jnp.sum(a, axis=0, keepdims=True) + a
    f = lambda k, x: lax.switch(k, branches, x)
    for k in (-1, 0, 1, 2, 5):      # lax.switch clamps the index
        check(jax, trn, cpu, f, np.int32(k), x)


# --- scan ----------------------------------------------------------------------------------

def test_scan_cumsum(jax, trn, cpu, lax, jnp):
    x = _rand((6, 5), "float32", np.random.default_rng(13))
    check(jax, trn, cpu, lambda x: lax.scan(lambda c, r: (c + r, c + r), jnp.zeros(5), x), x)


def test_scan_rnn(jax, trn, cpu, lax, jnp):
    rng = np.random.default_rng(14)
    xs = _rand((8, 4, 16), "float32", rng, -1, 1)
    w = _rand((16, 32), "float32", rng, -0.3, 0.3)
    u = _rand((32, 32), "float32", rng, -0.3, 0.3)

    def rnn(xs, w, u):
        def cell(h, x):
            h = jnp.tanh(x @ w + h @ u)
            return h, h
        return lax.scan(cell, jnp.zeros((4, 32), jnp.float32), xs)
    with jax.default_matmul_precision("highest"):
        check(jax, trn, cpu, rnn, xs, w, u, rtol=1e-4, atol=1e-5)


def test_scan_grad(jax, trn, cpu, lax, jnp):
    """jax.grad through a scan: the backward pass is a second (reversed) scan."""
    rng = np.random.default_rng(15)
    xs = _rand((5, 6), "float32", rng, -1, 1)
    w = _rand((6,), "float32", rng, -1, 1)

    def loss(w, xs):
        h, _ = lax.scan(lambda h, x: (jnp.sin(h * w + x), None), jnp.zeros(6), xs)
        return jnp.sum(h * h)
    check(jax, trn, cpu, jax.grad(loss), w, xs, rtol=1e-4, atol=1e-5)


def test_scan_remat(jax, trn, cpu, lax, jnp):
    rng = np.random.default_rng(16)
    xs = _rand((4, 8), "float32", rng, -1, 1)
    w = _rand((8,), "float32", rng, -1, 1)

    def loss(w, xs):
        body = jax.checkpoint(lambda h, x: (jnp.tanh(h * w + x), None))
        h, _ = lax.scan(body, jnp.ones(8), xs)
        return jnp.sum(h)
    check(jax, trn, cpu, jax.value_and_grad(loss), w, xs, rtol=1e-4, atol=1e-5)


# --- timing, profile, text -----------------------------------------------------------------

def _loop(lax, n):
    return lambda x: lax.fori_loop(0, n, lambda i, c: c * 2 + 1, x)


def _trip_times(jax, trn, f) -> dict[int, float]:
    import jax_trn
    x = jax.device_put(np.ones((64, 64), np.float32), trn)
    times = {}
    for n in (2, 3, 10):            # (n = 1 differs: its bound and step CSE to one constant)
        with jax_trn.profile() as prof:
            jax.block_until_ready(jax.jit(f(n))(x))
        times[n] = prof.executions[-1]
    return times


def test_time_grows_linearly_with_trips(jax, trn, lax):
    """Every trip of a loop on chip costs the same: its body kernel plus the sequencers'
    back edge, less than one host-driven control decision."""
    from jax_trn.runtime.executable import control_ns
    ex = _trip_times(jax, trn, lambda n: _loop(lax, n))
    times = {n: e.span_ns for n, e in ex.items()}
    trip = times[3] - times[2]
    assert 0 < trip < control_ns(ex[3].chip_spec.core)
    assert times[10] - times[2] == pytest.approx(8 * trip, rel=1e-6), times


def test_host_driven_trip_pays_a_control_decision(jax, trn, lax):
    """A loop whose trip count is data stays host-driven: each trip pays its kernels
    plus one control-path decision (the predicate read from HBM)."""
    from jax_trn.runtime.executable import control_ns
    ex = _trip_times(jax, trn, lambda n: _data_loop(lax, n))
    times = {n: e.span_ns for n, e in ex.items()}
    trip = times[3] - times[2]
    assert trip > control_ns(ex[3].chip_spec.core) > 1000
    assert times[10] - times[2] == pytest.approx(8 * trip, rel=1e-6), times
    assert times[10] / times[2] > 3


def _data_loop(lax, n):
    """A loop whose limit is data (n for x = ones): host-driven (loop_on_chip.counted)."""
    def f(x):
        limit = x[0, 0].astype("int32") + (n - 1)
        return lax.while_loop(lambda c: c[0] < limit, lambda c: (c[0] + 1, c[1] * 2 + 1),
                              (0, x))[1]
    return f


def test_on_chip_loop_records_each_trip_and_no_condition(jax, trn, lax):
    import jax_trn
    x = jax.device_put(np.ones((8, 8), np.float32), trn)
    with jax_trn.profile() as prof:
        jax.block_until_ready(jax.jit(_loop(lax, 3))(x))
    ex = prof.executions[-1]
    body = [k for k in ex.kernels if "]/" in k.context]
    assert sorted(k.context.split("[")[1].split("]")[0] for k in body) == ["0", "1", "2"]
    assert not [k for k in ex.kernels if ".cond/" in k.context]


def test_profile_records_repeated_kernels(jax, trn, lax):
    import jax_trn
    x = jax.device_put(np.ones((8, 8), np.float32), trn)
    with jax_trn.profile() as prof:
        jax.block_until_ready(jax.jit(_data_loop(lax, 3))(x))
    ex = prof.executions[-1]
    body = [k for k in ex.kernels if "]/" in k.context and ".cond" not in k.context]
    trips = sorted({k.context.split("[")[1].split("]")[0] for k in body})
    assert trips == ["0", "1", "2"]
    per_trip = len(body) // 3
    assert per_trip >= 1 and len(body) == 3 * per_trip
    assert [k.name for k in body[:per_trip]] == [k.name for k in body[per_trip:2 * per_trip]]
    conds = [k for k in ex.kernels if ".cond/" in k.context]
    assert len(conds) == 4 * (len(conds) // 4) and conds    # 4 predicate evaluations
    starts = [k.start_ns for k in ex.kernels]
    assert starts == sorted(starts)


def test_as_text_and_cost_analysis(jax, trn, lax):
    x = jax.device_put(np.ones((8, 8), np.float32), trn)
    compiled = jax.jit(_loop(lax, 3)).lower(x).compile()
    text = compiled.as_text()
    assert "while(" in text and "condition=" in text and "trn.kernel" in text
    k = jax.device_put(np.int32(1), trn)
    text = jax.jit(lambda k, x: lax.switch(k, [lambda a: a + 1, lambda a: a * 2], x)
                   ).lower(k, x).compile().as_text()
    assert "conditional(" in text and "trn.kernel" in text
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    import jax_trn
    with jax_trn.profile() as prof:
        jax.block_until_ready(compiled(x))
    ex = prof.executions[-1]
    # A static trip count: the timing run (zero arguments) makes the same trips.
    assert cost["simulated_time_s"] == pytest.approx(ex.simulated_time_s)
    assert cost["flops"] == ex.flops > 0


def test_compare_times_a_loop(jax, lax):
    """`jax_trn.compare` times a loop on other generations (executing it on zero
    arguments); the execution counts every kernel instance's FLOPs."""
    import jax_trn
    x = np.ones((8, 8), np.float32)
    cmp = jax_trn.compare(_loop(lax, 3), x, systems=("trn1.2xlarge", "trn2.3xlarge"))
    times = [ex.simulated_time_s for ex in cmp.executions.values()]
    assert len(times) == 2 and all(t > 0 for t in times)
    ex = cmp.executions["trn2.3xlarge"]
    loop = [k for k in ex.kernels if k.context.startswith("while")]
    static = {k.name: k.flops for k in ex.kernels}
    assert len(loop) > len({k.name for k in loop})          # kernels ran more than once
    assert ex.flops > sum(static.values())                   # executed > static count


def test_runaway_loop_is_an_error(jax, trn, lax):
    x = jax.device_put(np.float32(0), trn)
    f = jax.jit(_loop(lax, 20)).lower(x).compile({"jax_trn_max_while_iterations": 5})
    with pytest.raises(Exception, match="ran 5 iterations .*JAX_TRN_MAX_WHILE_ITERATIONS"):
        jax.block_until_ready(f(x))
    ok = jax.jit(_loop(lax, 20)).lower(x).compile({"jax_trn_max_while_iterations": 20})
    jax.block_until_ready(ok(x))


# --- hand-written StableHLO (no fusion): cases JAX's programs rarely reach -------------------

def _run_ir(text: str, *args: np.ndarray, listing: list | None = None) -> list[np.ndarray]:
    """Lowers StableHLO `text` for a Trn2 core and runs it on the hardware model (the
    program's listing appended to `listing`)."""
    from hlo_passes import compile_to_ir
    from jax_trn.hw.core import NeuronCore
    from jax_trn.hw.dtypes import np_dtype
    from jax_trn.hw.spec import CHIPS
    from jax_trn.lower import lower_module
    from jax_trn.runtime.executable import bind_dram, run_kernels
    spec = CHIPS["trn2"].core
    prog = lower_module(compile_to_ir(text, fuse=False), spec)
    if listing is not None:
        listing.append(prog.text)
    outs = [np.zeros(t.shape, np_dtype(t.dtype)) for t in prog.outputs]
    dram = bind_dram(prog, [np.ascontiguousarray(a).reshape(-1) for a in args],
                     [o.reshape(-1) for o in outs])
    core = NeuronCore(spec)
    core.begin()
    run_kernels(prog, core, dram, 0, 0)
    return outs


_CASE_CONSTANT = """
func.func @main(%x: tensor<5xf32>, %p: tensor<i32>) -> tensor<5xf32> {
  %k = stablehlo.constant dense<3.0> : tensor<5xf32>
  %y = "stablehlo.case"(%p) ({
    stablehlo.return %x : tensor<5xf32>
  }, {
    %a = stablehlo.multiply %x, %k : tensor<5xf32>
    stablehlo.return %a : tensor<5xf32>
  }) : (tensor<i32>) -> tensor<5xf32>
  %z = stablehlo.add %y, %k : tensor<5xf32>
  return %z : tensor<5xf32>
}
"""


def test_splat_constant_first_used_in_a_branch():
    """The constant's Memset must run before the case, whichever branch is taken."""
    x = np.arange(5, dtype=np.float32)
    for p, want in ((0, x + 3), (1, x * 3 + 3), (7, x * 3 + 3)):   # 7: the last branch
        out, = _run_ir(_CASE_CONSTANT, x, np.array(p, np.int32))
        np.testing.assert_array_equal(out, want)


_NESTED_CARRY = """
func.func @main(%x: tensor<4xf32>, %n: tensor<i32>) -> tensor<4xf32> {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %two = stablehlo.constant dense<2.0> : tensor<4xf32>
  %r:2 = stablehlo.while(%i = %c0, %a = %x) : tensor<i32>, tensor<4xf32>
    cond {
      %lt = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %j = stablehlo.add %i, %c1 : tensor<i32>
      %s:2 = stablehlo.while(%k = %c0, %b = %a) : tensor<i32>, tensor<4xf32>
        cond {
          %lt2 = stablehlo.compare LT, %k, %j : (tensor<i32>, tensor<i32>) -> tensor<i1>
          stablehlo.return %lt2 : tensor<i1>
        } do {
          %k1 = stablehlo.add %k, %c1 : tensor<i32>
          %b1 = stablehlo.multiply %b, %two : tensor<4xf32>
          stablehlo.return %k1, %b1 : tensor<i32>, tensor<4xf32>
        }
      %t = stablehlo.add %s#1, %a : tensor<4xf32>
      stablehlo.return %j, %t : tensor<i32>, tensor<4xf32>
    }
  return %r#1 : tensor<4xf32>
}
"""


def test_nested_while_reads_outer_carry():
    """The inner loop's result is written into the outer carry only after the outer
    carry's last read (`a` is read after the inner loop)."""
    x = np.arange(4, dtype=np.float32)
    listing: list[str] = []
    for n in (0, 1, 3):
        a = x.copy()
        for i in range(n):
            a = a * 2.0 ** (i + 1) + a
        out, = _run_ir(_NESTED_CARRY, x, np.array(n, np.int32), listing=listing)
        np.testing.assert_array_equal(out, a)
    text = listing[0]
    assert "2 loops" in text and text.count("cond -> pred") == 2 and "body:" in text


_KEPT_CALLS = """
func.func private @g(%a: tensor<4xf32>, %b: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %c = stablehlo.add %a, %b : tensor<4xf32>
  return %c, %a : tensor<4xf32>, tensor<4xf32>
}
func.func @main(%x: tensor<4xf32>, %y: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %r:2 = func.call @g(%x, %y) {no_inline}
      : (tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
  %s:2 = func.call @g(%r#0, %r#1) {no_inline}
      : (tensor<4xf32>, tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
  return %s#0, %s#1 : tensor<4xf32>, tensor<4xf32>
}
"""


def test_call_kept_by_the_inliner():
    """A `no_inline` call is lowered in place, once per call site."""
    x, y = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    s0, s1 = _run_ir(_KEPT_CALLS, x, y)
    np.testing.assert_array_equal(s0, (x + y) + x)
    np.testing.assert_array_equal(s1, x + y)


_PASS_THROUGH = """
func.func @main(%x: tensor<4xf32>, %n: tensor<i32>) -> (tensor<4xf32>, tensor<4xf32>) {
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %c1 = stablehlo.constant dense<1> : tensor<i32>
  %one = stablehlo.constant dense<1.0> : tensor<4xf32>
  %two = stablehlo.constant dense<2.0> : tensor<4xf32>
  %r:3 = stablehlo.while(%i = %c0, %a = %x, %u = %x) : tensor<i32>, tensor<4xf32>, tensor<4xf32>
    cond {
      %lt = stablehlo.compare LT, %i, %n : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %lt : tensor<i1>
    } do {
      %s:2 = stablehlo.while(%k = %c0, %b = %a) : tensor<i32>, tensor<4xf32>
        cond {
          %lt2 = stablehlo.compare LT, %k, %c1 : (tensor<i32>, tensor<i32>) -> tensor<i1>
          stablehlo.return %lt2 : tensor<i1>
        } do {
          %k1 = stablehlo.add %k, %c1 : tensor<i32>
          stablehlo.return %k1, %b : tensor<i32>, tensor<4xf32>
        }
      %t = stablehlo.multiply %a, %two : tensor<4xf32>
      %u2 = stablehlo.add %s#1, %one : tensor<4xf32>
      %i1 = stablehlo.add %i, %c1 : tensor<i32>
      stablehlo.return %i1, %t, %u2 : tensor<i32>, tensor<4xf32>, tensor<4xf32>
    }
  return %r#1, %r#2 : tensor<4xf32>, tensor<4xf32>
}
"""


def test_pass_through_carry_is_not_aliased_to_a_written_buffer():
    """The inner loop passes `a` through; its result must not live in the outer loop's
    carried buffer of `a`, which `t = a * 2` overwrites before `u2` reads the result."""
    x = np.arange(4, dtype=np.float32)
    for n in (0, 1, 3):
        a, u = _run_ir(_PASS_THROUGH, x, np.array(n, np.int32))
        np.testing.assert_array_equal(a, x * 2.0 ** n)
        np.testing.assert_array_equal(u, x if n == 0 else x * 2.0 ** (n - 1) + 1)


def test_loop_bodies_are_fused(jax, trn):
    """The fusion pass runs inside loop bodies and branches: an elementwise chain in a
    fori_loop body is one kernel per trip."""
    import jax_trn
    jnp = jax.numpy
    x = np.random.default_rng(0).normal(size=(128, 512)).astype(np.float32)
    f = jax.jit(lambda x: jax.lax.fori_loop(
        0, 10, lambda i, c: jnp.tanh(c * 1.01 + 0.1) * 0.9, x))
    with jax_trn.profile() as prof:
        y = f(jax.device_put(x, trn))
    np.testing.assert_allclose(np.asarray(y), np.asarray(f(x)), rtol=1e-6, atol=1e-6)
    body = [k for k in prof.executions[-1].kernels if "while" in k.context
            and ".cond" not in k.context and "multiply" in " ".join(k.ops)]
    assert len(body) == 10                       # one fused kernel per trip
    assert all(len(k.ops) >= 4 for k in body)    # multiply, add, tanh, multiply
