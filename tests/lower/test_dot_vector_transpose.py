"""Trn1 lhs transposes on VectorE, k-tiles of every w-th k (jax_trn/lower/matmul_quarters.py,
matmul_vector.py): which engine transposes what, and results against numpy."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from jax_trn.hw.spec import CHIPS
from jax_trn.lower import lower_module

from jax_trn.lower.matmul_vector import CUT, PRE_SPLIT, SPLIT_PE, WIDE_SPLIT

from .runner import run
from .test_dot import dot_module, dot_ref, rand

TRN1 = CHIPS["trn1"].core
START = 4           # row tiles of the start, transposed on TensorE (8 PSUM banks / 2)
WIDE_START = 3      # ... of the wide start (N in (1280, 2560], M >= 1024, K >= 2048):
                    # 3 row tiles x 1280 columns (2.5 banks each)


def _split(k: int) -> int:
    """VectorE transposes of the start's last tile: its k-tiles from SPLIT_PE on."""
    return (k // 128 - SPLIT_PE) * 8


def _wide(k: int) -> int:
    """k-tiles the wide start moves from TensorE to VectorE: the last start tile's from
    WIDE_SPLIT on, less the first PRE_SPLIT of the tile after it (TensorE's)."""
    return k // 128 - WIDE_SPLIT - PRE_SPLIT


def _transposes(program) -> Counter:
    return Counter(i.engine for k in program.kernels for i in k.instructions
                   if type(i).__name__ == "NcTranspose")


def _check(m, k, n, dtype="bfloat16", precision=(), rtol=1e-5) -> Counter:
    x, y = rand((m, k), dtype, 1), rand((k, n), dtype, 2)
    res = run(dot_module((m, k), (k, n), dtype=dtype, out_dtype="float32",
                         precision=precision), x, y, spec=TRN1)
    ref = dot_ref(x, y)
    np.testing.assert_allclose(res.outputs[0], ref, rtol=rtol,
                               atol=rtol * np.abs(ref).max())
    return _transposes(res.program)


@pytest.mark.parametrize("m,k,n", [(640, 2048, 2048), (700, 2048, 1800),
                                   (640, 2304, 2048)])     # K = 9 x 256, not 512s
def test_bf16_rows_after_the_start_on_vector(m, k, n):
    """bf16: each full row tile after the start is K / 64 x 4 VectorE transposes of
    32x32 words (2 bf16 each); the start's tiles and a partial last one go through
    TensorE (K / 128 each), but for the last start tile's k-tiles from SPLIT_PE on."""
    engines = _check(m, k, n)
    full_rest = m // 128 - START
    assert engines["vector"] == full_rest * k // 64 * 4 + _split(k)
    assert engines["tensor"] == k // 128 * (START + (m % 128 > 0)) - _split(k) // 8


def test_f32_highest_one_element_words():
    """FP32 at HIGHEST (FP32 in SBUF) transposes the 32-bit elements themselves."""
    engines = _check(640, 1024, 1024, "float32", ("HIGHEST",), rtol=1e-6)
    assert engines["vector"] == 1024 // 32 * 4 + (1024 // 128 - SPLIT_PE) * 16


@pytest.mark.parametrize("m,k,n", [
    (640, 1920, 2048),      # K not a multiple of 256 (128 partitions x 2 per word)
    (640, 2000, 2048),      # nor of 128
    (512, 2048, 2048),      # every row tile is in the start
    (1024, 1024, 1024),     # VectorE would fall behind TensorE (matmul_vector._paces)
])
def test_falls_back_to_tensor(m, k, n):
    engines = _check(m, k, n)
    assert engines["vector"] == 0 and engines["tensor"] > 0


def test_trn2_keeps_dma_transpose():
    program = lower_module(dot_module((640, 2048), (2048, 2048), dtype="bfloat16"),
                           CHIPS["trn2"].core)
    assert not _transposes(program)


def test_f32_default_cast_on_load():
    """FP32 operands at DEFAULT run as bf16: the row load casts on the way."""
    engines = _check(640, 2048, 2048, "float32", rtol=1e-2)
    assert engines["vector"] == 2048 // 64 * 4 + _split(2048)


def test_batched():
    """Each batch index runs the start and the VectorE tiles."""
    ls, rs = (2, 640, 2048), (2, 2048, 2048)
    x, y = rand(ls, "bfloat16", 3), rand(rs, "bfloat16", 4)
    res = run(dot_module(ls, rs, (0,), (0,), (2,), (1,), "bfloat16", out_dtype="float32"),
              x, y, spec=TRN1)
    ref = dot_ref(x, y, (0,), (0,), (2,), (1,))
    np.testing.assert_allclose(res.outputs[0], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert _transposes(res.program)["vector"] == 2 * (2048 // 64 * 4 + _split(2048))


def test_rows_beyond_sbuf_still_on_vector():
    """A lhs whose transposed strips do not all fit SBUF (the plan's M block is smaller
    than M) still goes through VectorE: the loop order keeps only a few strips."""
    program = lower_module(dot_module((4096, 2048), (2048, 2048), dtype="bfloat16"), TRN1)
    engines = _transposes(program)
    assert engines["vector"] == (4096 // 128 - WIDE_START) * 2048 // 64 * 4 + _wide(2048) * 8
    assert engines["tensor"] == WIDE_START * 16 - _wide(2048)


@pytest.mark.parametrize("m,k,n", [(1024, 2048, 2048), (1152, 2048, 1536),
                                   (1024, 2304, 2304), (1100, 2048, 2048)])
def test_wide_start(m, k, n):
    """N in (1280, 2560] with enough rows and K: the first column group is 1280 columns
    wide, 3 row tiles at the start (2.5 PSUM banks each; the narrow pieces of two tiles
    share a bank), the next 2 tiles' first group before the second group's pass over
    all 5 (matmul_vector `_wide_kernel`): values against numpy, and TensorE transposes
    only the start's tiles (the last one's first WIDE_SPLIT k-tiles) and the next
    tile's first PRE_SPLIT k-tiles."""
    engines = _check(m, k, n)
    full_rest = m // 128 - WIDE_START
    assert engines["vector"] == full_rest * k // 64 * 4 + _wide(k) * 8
    assert engines["tensor"] == k // 128 * (WIDE_START + (m % 128 > 0)) - _wide(k)


def test_wide_start_batched():
    """Each batch index runs the wide start (the PSUM banks it packs rotate on)."""
    ls, rs = (2, 1024, 2048), (2, 2048, 2048)
    x, y = rand(ls, "bfloat16", 5), rand(rs, "bfloat16", 6)
    res = run(dot_module(ls, rs, (0,), (0,), (2,), (1,), "bfloat16", out_dtype="float32"),
              x, y, spec=TRN1)
    ref = dot_ref(x, y, (0,), (0,), (2,), (1,))
    np.testing.assert_allclose(res.outputs[0], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    assert _transposes(res.program)["tensor"] == 2 * (16 * WIDE_START - _wide(2048))


def test_wide_start_gemm_2048_time():
    """The 2048^3 bf16 GEMM (issue 15's gemm row) on trn1: 199.7 us with the 1024-column
    start (4 row tiles), 198.0 us with the wide one, 197.3 us with its loads reordered
    (`_wide_start`); TensorE's matmuls take 187.3 us, and this model allows no less
    than ~197.05 us (matmul_vector's docstring)."""
    res = run(dot_module((2048, 2048), (2048, 2048), dtype="bfloat16"),
              rand((2048, 2048), "bfloat16", 1), rand((2048, 2048), "bfloat16", 2),
              spec=TRN1)
    assert res.ns < 197.4e3, res.ns


def test_lhs_rows_load_whole():
    """Every lhs row tile loads its rows naturally, one descriptor per row (K x 2
    bytes: full DMA rate, §3.4), VectorE tiles included: their transposes move word
    blocks across quadrants (§2.3) instead of needing K quartered on load (1 KiB).
    The wide start's last tile alone loads in two column ranges: its first CUT k-tiles
    (2560 B rows, the full rate) before the rest (matmul_vector `_wide_start`)."""
    from jax_trn.hw import costs, isa
    m, k = 1024, 2048
    program = lower_module(dot_module((m, k), (k, 2048), dtype="bfloat16"), TRN1)
    lhs = program.params[0].name
    loads = [i for kern in program.kernels for i in kern.instructions
             if isinstance(i, isa.DmaCopy) and getattr(i.src, "tensor", None) == lhs]
    assert _transposes(program)["vector"] > 0
    assert sum(i.nbytes for i in loads) == m * k * 2
    sizes = Counter(costs.dma_shape(i, TRN1)[0] for i in loads)
    assert sizes == {k * 2: m // 128 - 1, CUT * 256: 1, k * 2 - CUT * 256: 1}


def test_last_evacuation_split_over_both_engines():
    """The kernel's last accumulator (one PSUM bank) is evacuated in two parts, one on
    VectorE and one on ScalarE, before the final store: ~0.37 -> ~0.23 us less on
    trn1's critical path (matmul_vector `_last`); the parts sized so both end
    together (1.12 vs 1.4 GHz, §1.2: VectorE's the smaller)."""
    from jax_trn.hw import isa
    program = lower_module(dot_module((640, 2048), (2048, 2048), dtype="bfloat16"), TRN1)
    instrs = program.kernels[-1].instructions
    assert isinstance(instrs[-1], isa.DmaCopy)
    copies = [i for i in instrs if isinstance(i, isa.TensorCopy) and i.src.mem == "psum"]
    last = copies[-2:]
    assert {i.engine for i in last} == {"vector", "scalar"}
    assert [i.engine for i in last] == ["vector", "scalar"]
    assert sum(i.src.free_size for i in last) == 512
    assert 0 < last[0].src.free_size < 256
