"""Structure of lowered programs: errors, buffers, kernels, instruction streams, listing.
No simulator needed."""
from __future__ import annotations

import dataclasses
import doctest
from collections import Counter

import pytest

from jax_trn.hw import isa
from jax_trn.hw.spec import CHIPS
from jax_trn.lower import LoweringError, RuleKind, StepCtx, lower_module, register_lowering
from jax_trn.lower import argreduce, dot, layout, registry, relayout, slicing
from jax_trn.lower.builder import KernelBuilder
from jax_trn.lower.registry import lookup
from jax_trn.lower.target import Target

from .irbuild import FnBuilder, binary, unary
from .runner import SPEC


@pytest.mark.parametrize("module", [layout, dot, relayout, slicing])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


@pytest.mark.parametrize("n,size", [(0, 128), (1, 128), (128, 128), (300, 128), (7, 2)])
def test_tiles_cover_the_range(n, size):
    chunks = layout.tiles(n, size)
    assert [i for s, c in chunks for i in range(s, s + c)] == list(range(n))
    assert all(0 < c <= size for _, c in chunks)


@pytest.mark.parametrize("n", [0, 1, 7, 127, 128, 129, 390, 128 * 4096 + 5])
def test_flat_tiles_cover_each_element_once(n):
    seen = Counter()
    for t in layout.flat_tiles(n, 2048, 128):
        assert 1 <= t.parts <= 128 and 1 <= t.free <= 2048
        seen.update(t.offset + p * t.pstride + f for p in range(t.parts) for f in range(t.free))
    assert seen == Counter(range(n))


@pytest.mark.parametrize("sizes,cap", [((10, 3, 7), 128), ((2, 300), 128), ((5,), 2),
                                       ((3, 1, 4), 5)])
def test_box_tiles_cover_each_index_once(sizes, cap):
    import itertools
    seen = Counter()
    for starts, counts in layout.box_tiles(sizes, cap):
        assert layout.box_size((starts, counts)) <= cap
        seen.update(itertools.product(*(range(s, s + c) for s, c in zip(starts, counts))))
    assert seen == Counter(itertools.product(*map(range, sizes)))


# --- errors ---------------------------------------------------------------------------------

def test_unsupported_op_names_op_types_and_location():
    with pytest.raises(LoweringError) as e:
        lower_module(unary("cholesky", (8,)), SPEC)
    assert str(e.value) == ("no lowering for stablehlo.cholesky(float32[8]) -> "
                            "(float32[8]) "
                            "at test.py:1")


@pytest.mark.parametrize("dtype", ["float64", "complex64", "complex128"])
def test_unsupported_dtype(dtype):
    with pytest.raises(LoweringError) as e:
        lower_module(binary("add", (3,), dtype), SPEC)
    assert str(e.value).startswith(f"{dtype} is not supported by the Trainium hardware")
    assert f"stablehlo.add({dtype}[3], {dtype}[3]) -> ({dtype}[3]) at test.py:1" in str(e.value)


def test_unsupported_dtype_of_an_unused_argument():
    b = FnBuilder()
    b.arg((2,), "float64")
    x = b.arg((2,))
    with pytest.raises(LoweringError, match=r"float64 is not supported .*argument 0"):
        lower_module(b.ret(x), SPEC)


def test_kernel_too_big_for_sbuf():
    tiny = dataclasses.replace(SPEC, sbuf_partition_bytes=SPEC.sbuf_reserved_bytes + 256)
    with pytest.raises(LoweringError, match=r"more SBUF than the core has.*stablehlo.add"):
        lower_module(binary("add", (128, 4096)), tiny)


def test_psum_allocator_counts_banks():
    kb = KernelBuilder("k", Target.of(SPEC))
    for _ in range(8):
        kb.tile(1, "float32", mem="psum")
    with pytest.raises(LoweringError, match="PSUM"):
        kb.tile(1, "float32", mem="psum")


def test_allocator_reuses_freed_space():
    kb = KernelBuilder("k", Target.of(SPEC))
    a, b = kb.tile(100, "float32"), kb.tile(100, "float32")
    kb.release(a)
    c = kb.tile(50, "float32")
    assert c.offset == a.offset and kb.sbuf.peak == b.offset + 448


def test_bad_matmul_precision():
    with pytest.raises(LoweringError, match="unknown matmul precision"):
        lower_module(binary("add", (3,)), SPEC, matmul_precision="fastest")


# --- program shape ----------------------------------------------------------------------------

def test_params_outputs_and_temps():
    b = FnBuilder()
    x, y = b.arg((130, 3)), b.arg((130, 3))
    s = b.op("add", [x, y], (130, 3), "float32")
    e = b.op("exponential", [s], (130, 3), "float32")
    p = lower_module(b.ret(e), SPEC)
    assert [t.name for t in p.params] == ["arg0", "arg1"]
    assert [(t.name, t.shape) for t in p.outputs] == [("out0", (130, 3))]
    assert [t.name for t in p.temps] == ["t0"]
    assert [k.name for k in p.kernels] == ["add.0", "exponential.1"]
    assert p.kernels[1].ops == ["exponential at test.py:1"]


def test_add_instruction_stream():
    k = lower_module(binary("add", (130, 3)), SPEC).kernels[0]
    kinds = [type(i).__name__ for i in k.instructions]
    # a [128, 3] block and a [2, 1] tail: load, load, add, store each
    assert kinds == ["DmaCopy", "DmaCopy", "TensorTensor", "DmaCopy"] * 2
    assert {i.name for i in k.instructions} == {"add.0/dma_copy", "add.0/tensor_tensor"}
    queues = [i.dma_queue for i in k.instructions if isinstance(i, isa.DmaCopy)]
    assert queues == list(range(6))                     # round-robin
    assert k.instructions[2].waits == (("dma0", 1), ("dma1", 1))   # semaphores set


def test_engines_follow_dtype():
    def engines(kind, dtype):
        k = lower_module(binary(kind, (7,), dtype) if kind != "exponential"
                         else unary(kind, (7,), dtype), SPEC).kernels[0]
        return {i.engine for i in k.instructions if not isinstance(i, isa.DmaCopy)}
    assert engines("add", "float32") == {"vector"}
    assert engines("add", "int32") == {"gpsimd"}
    assert engines("power", "float32") == {"gpsimd"}
    assert engines("exponential", "bfloat16") == {"scalar"}


def test_size_zero_output_is_an_empty_kernel():
    p = lower_module(binary("add", (0, 5)), SPEC)
    assert len(p.kernels) == 1 and p.kernels[0].instructions == []


def test_program_text_lists_kernels():
    text = lower_module(binary("add", (130, 3)), SPEC).text
    assert "params: arg0: float32[130,3], arg1: float32[130,3]" in text
    assert "kernel add.0  [add at test.py:1]" in text
    assert "8 instrs (dma 6, vector 1, gpsimd 1)" in text     # tiles spread (spread.py)


def test_rules_table():
    for kind in ("add", "exponential", "compare", "select", "convert", "broadcast_in_dim",
                 "reshape", "transpose", "dot_general", "reduce", "iota", "fusion"):
        assert lookup(kind).kind is RuleKind.KERNEL
    assert lookup("add").fn.func is lookup("multiply").fn.func    # one generic rule
    for kind in ("while", "case", "func.call", "all_reduce", "all_gather", "reduce_scatter",
                 "all_to_all", "collective_permute"):
        assert lookup(kind).kind is RuleKind.STEP
    assert lookup("constant") is None           # the driver's own (driver.py)


def test_one_registry_for_variadic_reduce():
    """argmax's two-operand reduce is a rule of the one table, chosen by operand count."""
    assert lookup("reduce", operands=4).fn is argreduce.lower_argreduce
    assert lookup("reduce", operands=2) is lookup("reduce")
    assert lookup("reduce", operands=2).fn is not argreduce.lower_argreduce


def test_a_kind_registered_twice_is_an_error():
    with pytest.raises(ValueError, match="already registered"):
        register_lowering("add")(lambda ctx, x, y: None)


def test_target_specific_rule_wins():
    calls = []

    @register_lowering("negate", target="trn_test")
    def _negate_test(ctx, x):
        calls.append(x.name)

    try:
        assert lookup("negate", 1, "trn_test").fn is _negate_test
        assert lookup("negate", 1).fn is not _negate_test
        target = dataclasses.replace(Target.of(SPEC), generation="trn_test")
        lower_module(unary("negate", (3,)), target)
        assert calls == ["arg0"]
        lower_module(unary("negate", (3,)), SPEC)       # trn2: the default rule
        assert calls == ["arg0"]
    finally:
        registry.unregister("negate", target="trn_test")


def test_step_rules_use_only_the_public_step_context():
    """control.py and collective.py reach the lowering only through StepCtx's public
    methods (no private state of the driver, no attributes added to it)."""
    import ast
    import inspect

    from jax_trn.lower import collective, control
    public = {n for n in dir(StepCtx) if not n.startswith("_")}
    for module in (control, collective):
        tree = ast.parse(inspect.getsource(module))
        used = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name) and node.value.id == "ctx"}
        assert used and used <= public, (module.__name__, sorted(used - public))


# --- the Target ------------------------------------------------------------------------------

@pytest.mark.parametrize("gen", ["trn1", "trn2", "trn3"])
def test_target_from_the_core_spec(gen):
    """Every field the compiler reads comes from the CoreSpec (§1-§3), none is guessed."""
    core = CHIPS[gen].core
    t = Target.of(core)
    assert (t.partitions, t.stationary_max) == (core.pmax, core.pe_cols) == (128, 128)
    assert (t.psum_banks, t.psum_bank_bytes, t.psum_bytes) == (8, 2048, 16 * 1024)
    assert t.psum_bank_fp32 == 512
    assert t.sbuf_bytes == core.sbuf_usable_bytes
    assert (t.dma_queues, t.dma_engines) == (core.dma_queues, core.dma_engines)
    assert t.moving_max == core.max_moving_free == (4096 if gen == "trn3" else 512)
    assert t.matmul_spans_banks == (gen == "trn3") == t.psum_bf16 == t.ocp_fp8
    assert t.dma_transpose == t.transpose_mode == t.fp8_double_row == (gen != "trn1")
    assert t.generation == gen and t.core is core


def test_target_is_cached_and_frozen():
    core = CHIPS["trn2"].core
    assert Target.of(core) is Target.of(core) is Target.of(CHIPS["trn2"])
    assert Target.of(Target.of(core)) is Target.of(core)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Target.of(core).partitions = 64


def test_target_of_anything_else_is_an_error():
    """Limits.of used to fall back to a silent 192 KiB of SBUF for an unknown object."""
    with pytest.raises(TypeError, match="CoreSpec"):
        Target.of(object())


def test_target_says_what_lowering_cannot_serve():
    """Lowering assumes a square PE array and matmuls that fill a PSUM bank: a core
    without them is refused by name instead of miscompiled."""
    with pytest.raises(ValueError, match="square PE array"):
        Target.of(dataclasses.replace(SPEC, pe_cols=64))
    with pytest.raises(ValueError, match="PSUM bank"):
        Target.of(dataclasses.replace(SPEC, max_moving_free=256))


def test_sbuf_comes_from_the_spec():
    """A core with less SBUF gets kernels planned for less SBUF (the builder's
    allocator capacity is the Target's, not a default)."""
    small = dataclasses.replace(SPEC, sbuf_partition_bytes=SPEC.sbuf_reserved_bytes + 4096)
    assert KernelBuilder("k", Target.of(small)).sbuf.capacity == 4096


def test_no_hardware_constants_in_lower():
    """No rule module keeps its own copy of a hardware limit: the partition count,
    PSUM banks and bank size, the moving-free maximum come from the Target."""
    import pathlib
    import re

    root = pathlib.Path(layout.__file__).parent
    pattern = re.compile(r"^(P|PSUM_BANKS?|PSUM_BANK_BYTES|MOVING_MAX)\s*=\s*\d|"
                         r"getattr\((ctx\.)?spec|\.limits\b", re.M)
    found = {str(p.relative_to(root)): pattern.findall(p.read_text())
             for p in root.rglob("*.py")}
    assert not {k: v for k, v in found.items() if v}
