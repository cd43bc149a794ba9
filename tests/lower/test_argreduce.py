"""argmax / argmin lowering (argreduce.py): the body recognised structurally, two kernels
(values, then the smallest index holding them), run on the simulated NeuronCore."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from hlo_passes import compile_to_ir, ir
from jax_trn.lower import LoweringError, lower_module
from jax_trn.lower.argreduce import match

from .runner import SPEC, run_program


def _module(fn, x) -> ir.Module:
    import jax
    return compile_to_ir(jax.jit(fn).lower(x).as_text())


def _walk(block):
    for o in block.ops:
        yield o
        for r in o.regions:
            for b in r.blocks:
                yield from _walk(b)


def _argmax_module(name="argmax", axis=1, shape=(4, 600)):
    import jax.numpy as jnp
    x = np.zeros(shape, np.float32)
    return _module(lambda v: getattr(jnp, name)(v, axis=axis), x)


def _find_reduce(module: ir.Module) -> ir.Op:
    return next(o for f in module.functions.values() for o in _walk(f.body)
                if o.kind == "reduce" and len(o.operands) == 4)


def test_match_argmax_and_argmin():
    assert match(_find_reduce(_argmax_module("argmax"))) == ("max", True)
    assert match(_find_reduce(_argmax_module("argmin"))) == ("min", True)


def test_match_rejects_other_tie_break():
    op = _find_reduce(_argmax_module("argmax"))
    block = op.regions[0].block
    lt = next(o for o in block.ops if o.kind == "compare"
              and o.attrs.get("comparison_direction") == "LT")
    lt.attrs = {**lt.attrs, "comparison_direction": "GT"}   # ties: the larger index
    assert match(op) is None


def test_two_kernels_and_result():
    module = _argmax_module("argmax", axis=1, shape=(4, 600))
    program = lower_module(module, SPEC)
    names = [k.name for k in program.kernels]
    assert any(n.endswith(".index") for n in names), names
    index = next(k for k in program.kernels if k.name.endswith(".index"))
    counts = Counter(type(i).__name__ for i in index.instructions)
    assert counts["Select"] >= 1 and counts["TensorReduce"] >= 1
    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, (4, 600)).astype(np.float32)
    x[2, 17] = x[2, 400] = np.nan
    (out,) = run_program(program, [x]).outputs
    expected = np.argmax(np.where(np.isnan(x), np.inf, x), axis=1)
    expected[2] = 17                                # the first NaN
    np.testing.assert_array_equal(out, expected)


def test_non_argmax_variadic_reduce_names_the_op():
    module = _argmax_module("argmax")
    op = _find_reduce(module)
    eq = next(o for o in op.regions[0].block.ops if o.kind == "compare"
              and o.attrs.get("comparison_direction") == "EQ")
    eq.attrs = {**eq.attrs, "comparison_direction": "NE"}
    with pytest.raises(LoweringError, match=r"reduce of 2 operands at once that is not an "
                                            r"argmax / argmin is not supported \(.*reduce"):
        lower_module(module, SPEC)
