"""Compiled kernel plans (hw/plan.py) agree bit for bit with the per-instruction
interpreter (semantics.py), the reference: instruction by instruction on memories full of
random bytes (NaNs, infinities, huge and tiny values included), and program by program
on the pinned corpus and an op corpus of jitted programs."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from jax_trn.hw import CHIPS, Kernel, NeuronCore, Numerics, Tile, plan
from jax_trn.hw import isa
from jax_trn.hw.operands import DramAP

from .pinned_corpus import fingerprint_one

P = 64


def _t(mem, offset, free, dtype):
    return Tile(mem, 0, P, offset, free, dtype)


def _cores(gen: str, seed: int):
    cores = []
    for _ in range(2):
        c = NeuronCore(CHIPS[gen].core, numerics=Numerics())
        rng = np.random.default_rng(seed)
        c.sbuf.data[:, :20480] = rng.integers(0, 256, (c.sbuf.data.shape[0], 20480), np.uint8)
        c.psum.data[:, :8192] = rng.integers(0, 256, (c.psum.data.shape[0], 8192), np.uint8)
        c.psum.by_matmul[:, :4096] = True
        c.dram = {"x": rng.normal(size=P * 128).astype(np.float32) * 100,
                  "y": np.zeros(P * 128, np.float32)}
        cores.append(c)
    return cores


def _outcome(fn):
    try:
        fn()
        return None
    except Exception as e:                  # noqa: BLE001 - both must fail alike
        return type(e), str(e)


def _agree(ins, gen="trn2", seed=0):
    ref, fast = _cores(gen, seed)
    compiled = plan.kernel_plan(Kernel("k", [ins], {}), fast)[0]
    with np.errstate(all="ignore"):         # random bytes: NaN / inf arithmetic is the point
        assert _outcome(lambda: ins.execute(ref)) == _outcome(compiled)
    for a, b in ((ref.sbuf.data[:, :20480], fast.sbuf.data[:, :20480]),
                 (ref.psum.data[:, :8192], fast.psum.data[:, :8192]),
                 (ref.psum.by_matmul[:, :8192], fast.psum.by_matmul[:, :8192]),
                 (ref.dram["y"].view(np.uint32), fast.dram["y"].view(np.uint32))):
        if not np.array_equal(a, b):
            np.testing.assert_array_equal(a, b)


FLOATS = ("float32", "bfloat16", "float16", "float8_e4m3")
INTS = ("int32", "int8", "uint8", "int16")
DTYPES = FLOATS + INTS


def _s(offset, dtype, free=(32,)):
    return _t("sbuf", offset, free, dtype)


def _cases():
    out = []
    for src, dst in itertools.product(DTYPES, DTYPES):
        out.append(isa.TensorCopy(dst=_s(8192, dst), src=_s(0, src)))
        out.append(isa.TensorTensor(dst=_s(8192, dst), data1=_s(0, src), data2=_s(4096, src),
                                    op="add"))
    for dtype in DTYPES:
        for op in ("multiply", "subtract", "max", "divide", "bitwise_and", "is_ge"):
            out.append(isa.TensorTensor(dst=_s(8192, dtype), data1=_s(0, dtype),
                                        data2=_s(4096, "float32"), op=op))
            out.append(isa.TensorScalar(dst=_s(8192, dtype), data=_s(0, dtype), op0=op,
                                        operand0=3, op1="add", operand1=_s(12288, dtype, (1,)),
                                        reverse1=True))
            out.append(isa.TensorScalar(dst=_s(8192, dtype), data=_s(0, dtype), op0=op,
                                        operand0=0.5, reverse0=True))
        for op, negate in (("add", False), ("max", True), ("multiply", False)):
            out.append(isa.TensorReduce(dst=_s(8192, dtype, (4,)), data=_s(0, dtype, (4, 8)),
                                        op=op, negate=negate))
        out.append(isa.Select(dst=_s(8192, dtype), pred=_s(0, "uint8"),
                              on_true=_s(4096, dtype), on_false=_s(12288, dtype)))
        out.append(isa.DmaCopy(dst=_s(8192, dtype, (128,)),
                               src=DramAP("x", 0, ((128, P), (1, 128)), "float32")))
        out.append(isa.DmaCopy(dst=DramAP("y", 0, ((128, P), (1, 128)), "float32"),
                               src=_s(0, dtype, (128,))))
        out.append(isa.DmaCopy(dst=_s(8192, "float32", (16,)), src=_s(0, dtype, (16,))))
    for src, dst, op in itertools.product(("int32", "uint32"), ("int32", "uint32", "uint8",
                                                                "float32", "bool"),
                                          ("add", "multiply", "bitwise_xor", "shift_left",
                                           "shift_right_logical", "subtract")):
        out.append(isa.TensorTensor(dst=_s(8192, dst), data1=_s(0, src), data2=_s(4096, src),
                                    op=op))
        for imm in (13, -3, 40, (1 << 32) + 3):
            out.append(isa.TensorScalar(dst=_s(8192, dst), data=_s(0, src), op0=op,
                                        operand0=imm, op1="shift_right_logical",
                                        operand1=_s(12288, "uint32", (1,)), reverse1=True))
    for func in ("exp", "tanh", "gelu", "rsqrt", "relu", "sigmoid", "log", "copy"):
        for dtype in ("float32", "bfloat16"):
            out.append(isa.Activation(dst=_s(8192, dtype), data=_s(0, dtype), func=func))
            out.append(isa.Activation(dst=_s(8192, dtype), data=_s(0, "float32"), func=func,
                                      scale=_s(12288, "float32", (1,)), bias=0.25,
                                      reduce_res=_s(16384, "float32", (1,))))
    for dtype, acc in itertools.product(("bfloat16", "float32", "float8_e4m3"), (False, True)):
        out.append(isa.NcMatmul(dst=_t("psum", 0, (64,), "float32"),
                                stationary=_s(0, dtype, (64,)), moving=_s(4096, dtype, (64,)),
                                accumulate=acc))
    for dtype in ("bfloat16", "float32"):
        out.append(isa.NcTranspose(dst=_t("psum", 0, (P,), dtype), data=_s(0, dtype, (P,))))
        out.append(isa.DmaTranspose(dst=_s(8192, dtype, (32,)),
                                    src=DramAP("x", 4, ((P, 32), (1, P)), dtype)))
        out.append(isa.DmaTranspose(dst=Tile("sbuf", 0, 32, 8192, (P,), dtype),
                                    src=_s(0, dtype, (32,))))
    return out


CASES = _cases()


@pytest.mark.parametrize("ins", CASES, ids=[f"{i}-{type(c).__name__}" for i, c in
                                            enumerate(CASES)])
def test_compiled_instruction_agrees_with_its_semantics(ins):
    _agree(ins)


def test_every_compiled_kind_is_covered():
    covered = {type(c).semantics for c in CASES}
    assert set(plan._COMPILERS) <= covered


def test_matmul_accumulating_onto_non_matmul_psum_fails_alike():
    ins = isa.NcMatmul(dst=_t("psum", 4096, (64,), "float32"),
                       stationary=_s(0, "bfloat16", (64,)),
                       moving=_s(4096, "bfloat16", (64,)), accumulate=True)
    _agree(ins, gen="trn1")


@pytest.fixture
def interpreter():
    plan.ENABLED = False
    try:
        yield
    finally:
        plan.ENABLED = True


CORPUS_OPS = {
    "unary": lambda jnp: (lambda x: (jnp.exp(x), jnp.log1p(jnp.abs(x)), jnp.sin(x),
                                     jnp.round(x), jnp.sign(x), -x)),
    "int": lambda jnp: (lambda x: ((x * 7).astype(jnp.int32) // 3,
                                   (x * 100).astype(jnp.int8) + 1)),
    "cast": lambda jnp: (lambda x: (x.astype(jnp.bfloat16), x.astype(jnp.float16) * 3,
                                    x.astype(jnp.float8_e4m3fn))),
    "matmul": lambda jnp: (lambda x: (x @ x.T, x.astype(jnp.bfloat16) @ x.T.astype(jnp.bfloat16))),
    "reduce": lambda jnp: (lambda x: (x.sum(), x.max(0), jnp.cumsum(x, 1), x.argmin(1))),
    "where": lambda jnp: (lambda x: jnp.where(x > 0, x, x * 0.1)),
    "bits": lambda jnp: _bit_ops,
    "sort": lambda jnp: (lambda x: jnp.sort(x, axis=1)),
}


def _bit_ops(x):
    """Threefry's kind of integer math (JAX's PRNG): rotations, xors, wrapping adds and
    multiplies on uint32, shifts by in- and out-of-range amounts, narrowing stores."""
    import jax
    import jax.numpy as jnp
    u = jax.lax.bitcast_convert_type(x, jnp.uint32)
    amount = (u & 63).astype(jnp.uint32)
    r = (u << 13) | (u >> 19)
    mixed = (r + u * jnp.uint32(2654435761)) ^ (u >> amount) ^ (u << amount)
    return (mixed, (mixed - u).astype(jnp.int32), (mixed >> 24).astype(jnp.uint8),
            jax.random.bits(jax.random.key(3), (64, 96)),
            jax.random.uniform(jax.random.key(4), (64, 96)))


def test_narrow_int_ops_agree_with_int64_ops():
    """alu.narrow_int_op on uint32 views gives int_op's result mod 2**32 for 32-bit
    operands, shift amounts in and out of range included."""
    from jax_trn.hw import alu
    rng = np.random.default_rng(0)
    for dtype in (np.int32, np.uint32):
        a = rng.integers(0, 1 << 32, 4096, np.uint64).astype(np.uint32).view(dtype)
        b = np.concatenate([np.arange(-40, 70), rng.integers(-(1 << 31), 1 << 31, 3986)])
        b = b.astype(np.int64).astype(dtype)
        for op in sorted(alu.NARROW_OPS):
            wide = alu.int_op(op, a.astype(np.int64), b.astype(np.int64), 32)
            narrow = alu.narrow_int_op(op, a.view(np.uint32), b.view(np.uint32))
            assert narrow.dtype == np.uint32
            np.testing.assert_array_equal(narrow, wide.astype(np.uint32), err_msg=op)
            for s in (0, 5, 31, 32, 4294967295):
                imm = alu.narrow_operand(s)
                np.testing.assert_array_equal(
                    alu.narrow_int_op(op, a.view(np.uint32), imm),
                    alu.int_op(op, a.astype(np.int64), np.int64(s), 32).astype(np.uint32))


def assert_same_bits_without(jax, trn, name: str, switch, warm: bool = False) -> None:
    """Corpus op `name` on trn gives the same dtypes and bytes with `switch.ENABLED`
    (a module's flag: plan, lanes) on and off; `warm`: one call first, so the compared
    calls replay its timeline."""
    x = jax.device_put(np.random.default_rng(3).normal(size=(96, 80)).astype(np.float32), trn)
    f = jax.jit(CORPUS_OPS[name](jax.numpy))
    if warm:
        f(x)
    fast = [np.asarray(a) for a in jax.tree.leaves(f(x))]
    switch.ENABLED = False
    try:
        ref = [np.asarray(a) for a in jax.tree.leaves(f(x))]
    finally:
        switch.ENABLED = True
    for a, b in zip(fast, ref):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.atleast_1d(a).view(np.uint8),
                                      np.atleast_1d(b).view(np.uint8))


@pytest.mark.parametrize("name", sorted(CORPUS_OPS))
def test_op_corpus_plans_agree_with_the_interpreter(jax, trn, name):
    assert_same_bits_without(jax, trn, name, plan)


@pytest.mark.parametrize("name", ["elementwise", "matmul_bf16", "scan_loop", "gather_scatter",
                                  "flax_train_step"])
def test_pinned_corpus_with_the_interpreter_alone(jax, interpreter, name):
    """test_pinned_corpus runs with plans; the same pins hold for the interpreter."""
    import json

    from .pinned_corpus import PINNED, comparable
    assert comparable(fingerprint_one(jax, name)) == comparable(
        json.loads(PINNED.read_text())[name])


@pytest.mark.parametrize("dst", ["float4_e2m1fn", "float8_e5m2", "float16"])
def test_stores_into_narrow_floats_agree(dst):
    """A compiled store converts into the tile as `numerics.cast` does, float4's
    NaN -> -0 rule included (random bytes: NaNs among them)."""
    _agree(isa.TensorCopy(dst=_s(8192, dst), src=_s(0, "float32")), gen="trn3")
    _agree(isa.Activation(dst=_s(8192, dst), data=_s(0, "float32"), func="copy"), gen="trn3")
