"""dot_general lowered to TensorE matmuls, run on the simulated NeuronCore."""
from __future__ import annotations

import math
from collections import Counter

import ml_dtypes
import numpy as np
import pytest

from hlo_passes import ir
from jax_trn.hw import isa
from jax_trn.hw.numerics import round_tf32

from .irbuild import FnBuilder
from .runner import SPEC, run
from jax_trn.lower import LoweringError, lower_module

BF16 = ml_dtypes.bfloat16


def _free(rank, batch, contract):
    return [d for d in range(rank) if d not in (*batch, *contract)]


def dot_module(ls, rs, lb=(), rb=(), lc=(1,), rc=(0,), dtype="float32", rdtype=None,
               out_dtype=None, precision=()):
    b = FnBuilder()
    x, y = b.arg(ls, dtype), b.arg(rs, rdtype or dtype)
    out = [ls[d] for d in lb] + [ls[d] for d in _free(len(ls), lb, lc)] + \
        [rs[d] for d in _free(len(rs), rb, rc)]
    r = b.op("dot_general", [x, y], out, out_dtype or dtype, lhs_batching_dimensions=lb,
             rhs_batching_dimensions=rb, lhs_contracting_dimensions=lc,
             rhs_contracting_dimensions=rc, precision_config=precision)
    return b.ret(r)


def dot_ref(x, y, lb=(), rb=(), lc=(1,), rc=(0,)) -> np.ndarray:
    """float64 dot_general: transpose to [B, M, K] x [B, K, N], matmul, reshape."""
    lf, rf = _free(x.ndim, lb, lc), _free(y.ndim, rb, rc)
    xs, ys = np.transpose(x, (*lb, *lf, *lc)), np.transpose(y, (*rb, *rc, *rf))
    bsz = [x.shape[d] for d in lb]
    m, n, k = (math.prod(x.shape[d] for d in lf), math.prod(y.shape[d] for d in rf),
               math.prod(x.shape[d] for d in lc))
    out = np.matmul(xs.reshape(math.prod(bsz), m, k).astype(np.float64),
                    ys.reshape(math.prod(bsz), k, n).astype(np.float64))
    return out.reshape(tuple(bsz + [x.shape[d] for d in lf] + [y.shape[d] for d in rf]))


def rand(shape, dtype, seed):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return x.astype(ir.np_dtype(dtype))


CASES = [  # lhs, rhs, lb, rb, lc, rc
    ((7, 5), (5, 3), (), (), (1,), (0,)),
    ((130, 200), (200, 70), (), (), (1,), (0,)),
    ((2, 130, 200), (2, 200, 70), (0,), (0,), (2,), (1,)),
    ((130, 200), (70, 200), (), (), (1,), (1,)),          # rhs [N, K]: TensorE transposes
    ((200, 130), (200, 70), (), (), (0,), (0,)),          # lhs [K, M]: direct load
    ((300,), (300, 600), (), (), (0,), (0,)),             # vector x matrix
    ((300,), (300,), (), (), (0,), (0,)),                 # inner product -> scalar
    ((3, 4, 50), (4, 50, 6), (), (), (1, 2), (0, 1)),     # two contracting dims
    ((3, 4, 5), (5, 2, 4), (), (), (1,), (2,)),
    ((4, 3, 6), (6, 3, 4), (1,), (1,), (2, 0), (0, 2)),   # non-mergeable: copied first
    ((300, 70), (300, 70), (0,), (0,), (1,), (1,)),      # batched inner products
    ((2, 3, 50), (50, 3, 2), (0, 1), (2, 1), (2,), (0,)),
    ((0, 5), (5, 3), (), (), (1,), (0,)),
    ((4, 0), (0, 3), (), (), (1,), (0,)),                 # K = 0 -> zeros
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_dot_bf16(case):
    ls, rs, lb, rb, lc, rc = case
    x, y = rand(ls, "bfloat16", 1), rand(rs, "bfloat16", 2)
    out = run(dot_module(ls, rs, lb, rb, lc, rc, "bfloat16", out_dtype="float32"), x, y)
    np.testing.assert_allclose(out.outputs[0], dot_ref(x, y, lb, rb, lc, rc), rtol=1e-5,
                               atol=1e-4)


@pytest.mark.parametrize("case", CASES[:5] + CASES[10:12], ids=lambda c: f"{c[0]}x{c[1]}")
def test_dot_f32_default_runs_bf16_operands(case):
    ls, rs, lb, rb, lc, rc = case
    x, y = rand(ls, "float32", 3), rand(rs, "float32", 4)
    out = run(dot_module(ls, rs, lb, rb, lc, rc), x, y).outputs[0]
    rounded = dot_ref(x.astype(BF16), y.astype(BF16), lb, rb, lc, rc)
    np.testing.assert_allclose(out, rounded, rtol=1e-5, atol=1e-4)
    assert np.abs(out - dot_ref(x, y, lb, rb, lc, rc)).max() > 1e-4   # not fp32


@pytest.mark.parametrize("config,how", [(("HIGHEST", "HIGHEST"), {}),
                                        ((), {"matmul_precision": "highest"})])
def test_dot_f32_highest_is_fp32(config, how):
    x, y = rand((130, 200), "float32", 5), rand((200, 70), "float32", 6)
    out = run(dot_module((130, 200), (200, 70), precision=config), x, y, **how).outputs[0]
    np.testing.assert_allclose(out, dot_ref(x, y), rtol=1e-5, atol=1e-5)


def test_dot_f32_high_is_tf32():
    x, y = rand((130, 200), "float32", 7), rand((200, 70), "float32", 8)
    out = run(dot_module((130, 200), (200, 70)), x, y, matmul_precision="high").outputs[0]
    np.testing.assert_allclose(out, dot_ref(round_tf32(x), round_tf32(y)), rtol=1e-5,
                               atol=1e-4)


def test_lowering_reads_no_environment(monkeypatch):
    """What DEFAULT means is an argument of lower_module; $JAX_TRN_MATMUL_PRECISION is
    the options module's to read (lower_module used to read it)."""
    monkeypatch.setenv("JAX_TRN_MATMUL_PRECISION", "highest")
    program = lower_module(dot_module((130, 200), (200, 70)), SPEC)
    operands = {i.moving.dtype for k in program.kernels for i in k.instructions
                if isinstance(i, isa.NcMatmul)}
    assert operands == {"bfloat16"}


@pytest.mark.parametrize("spelling", ["float32", "tensorfloat32", "bfloat16", "HIGH"])
def test_lower_module_takes_canonical_precisions_only(spelling):
    """The user's spellings are mapped by the caller (jax_trn.config's options)."""
    with pytest.raises(LoweringError, match="unknown matmul precision"):
        lower_module(dot_module((8, 8), (8, 8)), SPEC, matmul_precision=spelling)


@pytest.mark.parametrize("gen,widest", [("trn1", 512), ("trn2", 512), ("trn3", 1024)])
@pytest.mark.parametrize("dtype,ls,rs,lc,rc", [
    ("bfloat16", (300, 256), (256, 1100), (1,), (0,)),
    ("float32", (130, 200), (1100, 200), (1,), (1,)),   # rhs transposed on TensorE (trn1)
    ("float8_e5m2", (130, 512), (512, 900), (1,), (0,)),   # double_row on trn2 / trn3
])
def test_matmul_moving_size_per_generation(gen, widest, dtype, ls, rs, lc, rc):
    """One PSUM bank of columns per matmul on v2/v3 (moving free <= 512, §2.2); on
    NeuronCore-v4 a matmul writes a whole column group across banks (moving free up to
    4096). The results do not depend on it."""
    from jax_trn.hw.spec import CHIPS
    spec = CHIPS[gen].core
    x, y = rand(ls, dtype, 21), rand(rs, dtype, 22)
    res = run(dot_module(ls, rs, lc=lc, rc=rc, dtype=dtype, out_dtype="float32"), x, y,
              spec=spec, matmul_precision="highest")
    n = {i.n for k in res.program.kernels for i in k.instructions
         if isinstance(i, isa.NcMatmul)}
    assert max(n) == min(widest, rs[1 - rc[0]])
    want = dot_ref(x.astype(np.float32), y.astype(np.float32), lc=lc, rc=rc)
    np.testing.assert_allclose(res.outputs[0], want, rtol=2e-2, atol=2e-2 * np.sqrt(ls[1]))


def test_dot_bf16_result_rounds_once():
    x, y = rand((130, 200), "bfloat16", 9), rand((200, 70), "bfloat16", 10)
    out = run(dot_module((130, 200), (200, 70), dtype="bfloat16"), x, y).outputs[0]
    assert out.dtype == BF16
    np.testing.assert_allclose(out.astype(np.float32), dot_ref(x, y), rtol=1e-2, atol=1e-2)


def test_dot_int32_is_exact_below_2_24():
    rng = np.random.default_rng(11)
    x, y = rng.integers(-50, 50, (130, 200), np.int32), rng.integers(-50, 50, (200, 70), np.int32)
    out = run(dot_module((130, 200), (200, 70), dtype="int32"), x, y).outputs[0]
    np.testing.assert_array_equal(out, x.astype(np.int64) @ y)


def test_dot_mixed_bf16_f32_casts_up():
    x, y = rand((7, 5), "bfloat16", 12), rand((5, 3), "float32", 13)
    m = dot_module((7, 5), (5, 3), rdtype="float32", precision=("HIGHEST", "HIGHEST"))
    out = run(m, x, y).outputs[0]
    np.testing.assert_allclose(out, dot_ref(x, y), rtol=1e-6, atol=1e-6)


def test_dot_fp8_runs_natively():
    m = dot_module((64, 128), (128, 32), dtype="float8_e4m3", rdtype="float8_e5m2",
                   out_dtype="float32")
    mm = [i for i in lower_module(m, SPEC).kernels[0].instructions
          if type(i).__name__ == "NcMatmul"]
    assert {(i.stationary.dtype, i.moving.dtype) for i in mm} == {("float8_e4m3",
                                                                  "float8_e5m2")}


def test_dot_fp8_numerics():
    x, y = rand((64, 128), "float8_e4m3", 14), rand((128, 32), "float8_e5m2", 15)
    m = dot_module((64, 128), (128, 32), dtype="float8_e4m3", rdtype="float8_e5m2",
                   out_dtype="float32")
    out = run(m, x, y).outputs[0]
    np.testing.assert_allclose(out, dot_ref(x, y), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("ls, rs, lc, rc", [
    ((200, 640), (640, 300), (1,), (0,)),   # 5 k-tiles: 2 double_row pairs + 1 single
    ((70, 300), (300, 600), (1,), (0,)),    # 128 + 128 paired, a partial 44 alone
    ((300, 130), (300, 520), (0,), (0,)),   # lhs K-major: no transposes, 2 k-tiles
    ((2, 64, 256), (2, 256, 40), (2,), (1,)),
    ((640, 512), (512, 256), (1,), (0,)),   # 5 row tiles: the first 4 bunched
    ((300, 768), (768, 200), (1,), (0,)),   # K in 256-row blocks: 16-bit dma_transpose
    ((2, 130, 512), (2, 512, 70), (2,), (1,)),
    ((130, 512), (70, 512), (1,), (1,)),    # rhs [N, K]: transposed on TensorE, paired
])
def test_dot_fp8_double_row(ls, rs, lc, rc):
    """FP8 x FP8 on trn2 runs double_row (K = 256 per matmul, §2.2) wherever two full
    k-tiles pair up; numerics as the float64 reference of the fp8 values (FP32
    accumulation)."""
    lb = rb = (0,) if len(ls) == 3 else ()
    x, y = rand(ls, "float8_e4m3", 40), rand(rs, "float8_e5m2", 41)
    m = dot_module(ls, rs, lb, rb, lc, rc, dtype="float8_e4m3", rdtype="float8_e5m2",
                   out_dtype="float32")
    res = run(m, x, y)
    np.testing.assert_allclose(res.outputs[0], dot_ref(x, y, lb, rb, lc, rc),
                               rtol=1e-5, atol=1e-4)
    modes = Counter(i.perf_mode for k in res.program.kernels for i in k.instructions
                    if type(i).__name__ == "NcMatmul")
    k = ls[lc[0]]
    assert modes["double_row"] > 0 and (k % 256 == 0) == (modes["none"] == 0), modes


def test_dot_fp8_lhs_transposed_as_16_bit_pairs():
    """A row-major FP8 lhs over whole 256-row blocks of K is transposed by DMA as 16-bit
    words (§3.4 is 2/4-byte only), nothing on TensorE; the stationary reads each word
    pair as [P, 2, M] with strides (1, 2) (§3.1) and the moving tiles hold rows 2p and
    2p + 1 of each block, so the result is exact to FP32 accumulation."""
    x, y = rand((256, 1024), "float8_e5m2", 44), rand((1024, 384), "float8_e5m2", 45)
    res = run(dot_module((256, 1024), (1024, 384), dtype="float8_e5m2", out_dtype="float32"), x, y)
    np.testing.assert_allclose(res.outputs[0], dot_ref(x, y), rtol=1e-5, atol=1e-4)
    ins = [i for k in res.program.kernels for i in k.instructions]
    kinds = Counter(type(i).__name__ for i in ins)
    assert kinds["NcTranspose"] == 0 and kinds["DmaTranspose"] == 2 * 4, kinds
    assert {i.dst.dtype for i in ins if type(i).__name__ == "DmaTranspose"} == {"uint16"}
    mms = [i for i in ins if type(i).__name__ == "NcMatmul"]
    assert {(i.perf_mode, i.stationary.strides) for i in mms} == {("double_row", (1, 2))}


def test_dot_fp8_pairs_with_k_blocks():
    """K blocks (tiny SBUF) of whole 256-row blocks keep the 16-bit transposes; an odd
    number of k-tiles per block falls back to TensorE transposes. Both exact."""
    import dataclasses
    from .runner import run_program
    for k, extra, words in ((2048, 3000, True), (1536, 3000, False)):   # kb 512 / 384
        x, y = rand((130, k), "float8_e5m2", 46), rand((k, 70), "float8_e5m2", 47)
        m = dot_module((130, k), (k, 70), dtype="float8_e5m2", out_dtype="float32")
        spec = dataclasses.replace(SPEC, sbuf_partition_bytes=SPEC.sbuf_reserved_bytes + extra)
        program = lower_module(m, spec)
        out = run_program(program, [x, y], spec).outputs[0]
        np.testing.assert_allclose(out, dot_ref(x, y), rtol=1e-5, atol=1e-4)
        kinds = Counter(type(i).__name__ for kn in program.kernels for i in kn.instructions)
        assert (kinds["NcTranspose"] == 0) == words == (kinds["DmaTranspose"] > 0), kinds


def test_dot_fp8_trn1_has_no_double_row():
    from jax_trn.hw.spec import CHIPS
    m = dot_module((128, 512), (512, 128), dtype="float8_e5m2", out_dtype="float32")
    modes = {i.perf_mode for i in lower_module(m, CHIPS["trn1"].core).kernels[0].instructions
             if type(i).__name__ == "NcMatmul"}
    assert modes == {"none"}


def test_dot_large_k_and_n_blocks():
    """K deep enough for 512-column groups, N over several groups, M over 128."""
    x, y = rand((200, 1100), "bfloat16", 16), rand((1100, 1300), "bfloat16", 17)
    out = run(dot_module((200, 1100), (1100, 1300), dtype="bfloat16", out_dtype="float32"),
              x, y).outputs[0]
    np.testing.assert_allclose(out, dot_ref(x, y), rtol=1e-4, atol=1e-3)


def _deep_k(rows: int, seeds: tuple[int, int]):
    """A [rows, 1024] x [1024, 70] bf16 dot on a core with 4000 bytes of SBUF per
    partition, which forces K blocks: summed in SBUF while every row tile's FP32 sums
    fit there (rows <= ~1400), else accumulated across blocks in PSUM. Its program,
    checked against numpy."""
    import dataclasses
    from .runner import run_program
    spec = dataclasses.replace(SPEC, sbuf_partition_bytes=SPEC.sbuf_reserved_bytes + 4000)
    x, y = rand((rows, 1024), "bfloat16", seeds[0]), rand((1024, 70), "bfloat16", seeds[1])
    m = dot_module((rows, 1024), (1024, 70), dtype="bfloat16", out_dtype="float32")
    program = lower_module(m, spec)
    out = run_program(program, [x, y], spec).outputs[0]
    np.testing.assert_allclose(out, dot_ref(x, y), rtol=1e-4, atol=1e-3)
    return program


def _loads(kernel, arg: str) -> list:
    return [i for i in kernel.instructions if type(i).__name__ in ("DmaCopy", "DmaTranspose")
            and getattr(i.src, "tensor", None) == arg]


def test_deep_k_sums_in_sbuf_read_each_operand_once():
    """K blocks whose row tiles' FP32 sums fit in SBUF (`Plan.sbuf_acc`): every rhs K
    block and lhs strip is loaded once; each row tile's block product is copied into
    its sums, then added (VectorE) for each later block, the last add casting into the
    result."""
    (kernel,) = _deep_k(640, (20, 21)).kernels
    kinds = Counter(type(i).__name__ for i in kernel.instructions)
    assert len(_loads(kernel, "arg1")) == 8             # each rhs k-tile once
    assert len(_loads(kernel, "arg0")) == 5 * 8         # 5 row tiles x 8 k-tiles, once
    adds = kinds["TensorTensor"]
    assert adds > 0 and adds % 5 == 0 and kinds["TensorCopy"] == 5


def test_deep_k_row_tiles_share_each_rhs_block():
    """K blocks with M too large for SBUF sums: the row tiles accumulate together in
    PSUM, so each rhs K block is read once per bunch, not once per row tile."""
    (kernel,) = _deep_k(1700, (20, 21)).kernels
    rhs, lhs = _loads(kernel, "arg1"), _loads(kernel, "arg0")
    kinds = Counter(type(i).__name__ for i in kernel.instructions)
    assert kinds["TensorTensor"] == 0 and rhs and len(rhs) * 4 <= len(lhs)


# --- structure -------------------------------------------------------------------------------

def test_dot_1024_bf16_instruction_counts():
    m = dot_module((1024, 1024), (1024, 1024), dtype="bfloat16")
    k = lower_module(m, SPEC).kernels[0]
    counts = Counter(type(i).__name__ for i in k.instructions)
    assert counts["NcMatmul"] == 8 * 8 * 2          # M tiles x K tiles x 512-col tiles
    assert counts["NcTranspose"] == 0               # lhs k-tiles come by dma_transpose
    assert counts["DmaTranspose"] == 8 * 8          # one per (128-row strip, k-tile)
    assert counts["DmaCopy"] == 8 + 8               # rhs k-tiles, stores (one
                                                    # 1024-column group: 2 KiB DMA rows)
    assert k.flops == 2 * 1024 ** 3
    assert k.psum_bytes <= 16 * 1024 and k.sbuf_bytes <= SPEC.sbuf_usable_bytes


def test_dot_1024_bf16_trn1_transposes_on_tensore():
    """No dma_transpose on NC-v2 (§3.4): lhs rows are transposed on TensorE."""
    from jax_trn.hw.spec import CHIPS
    m = dot_module((1024, 1024), (1024, 1024), dtype="bfloat16")
    counts = Counter(type(i).__name__ for i in lower_module(m, CHIPS["trn1"].core)
                     .kernels[0].instructions)
    assert counts["NcTranspose"] == 8 * 8 and counts["DmaTranspose"] == 0
    assert counts["DmaCopy"] == 8 + 8 + 8           # lhs rows, rhs k-tiles, stores


def test_dot_f32_default_transposes_on_tensore():
    """f32 lhs cast to bf16 on load: dma_transpose cannot cast (§3.4), TensorE does it."""
    m = dot_module((256, 256), (256, 256), dtype="float32")
    counts = Counter(type(i).__name__ for i in lower_module(m, SPEC).kernels[0].instructions)
    assert counts["NcTranspose"] == 2 * 2 and counts["DmaTranspose"] == 0


def test_dot_1024_bf16_time_near_roofline():
    """Simulated time of a 1024^3 bf16 matmul on one trn2 core vs the 79 TFLOPS peak."""
    a = rand((1024, 1024), "bfloat16", 20)
    res = run(dot_module((1024, 1024), (1024, 1024), dtype="bfloat16"), a, a)
    roofline_ns = 2 * 1024 ** 3 / 79e12 * 1e9
    assert roofline_ns < res.ns < 1.4 * roofline_ns, res.ns


def test_dot_2048_bf16_timing_over_90_percent_of_peak():
    """Timing only (simulated time never depends on data): dma_transpose lhs loads and
    1024-column groups keep TensorE fed at 2048^3 on trn2."""
    from jax_trn.hw.core import NeuronCore
    m = dot_module((2048, 2048), (2048, 2048), dtype="bfloat16")
    prog = lower_module(m, SPEC)
    run_ = NeuronCore(SPEC).run(prog.kernels[0], {}, execute=False)
    assert 2 * 2048 ** 3 / 79e12 * 1e9 / run_.duration_ns > 0.90, run_.duration_ns


def test_dot_kmajor_lhs_loads_the_block_per_k_tile():
    """lhs given as [K, M] (x.T @ y, weight gradients): one DMA per k-tile for the
    whole row block (rows of M elements, §3.4), strips are views into it."""
    x, y = rand((300, 384), "bfloat16", 50), rand((300, 200), "bfloat16", 51)
    m = dot_module((300, 384), (300, 200), lc=(0,), rc=(0,), dtype="bfloat16",
                   out_dtype="float32")
    res = run(m, x, y)
    np.testing.assert_allclose(res.outputs[0], dot_ref(x, y, lc=(0,), rc=(0,)),
                               rtol=1e-4, atol=1e-3)
    loads = [i for i in res.program.kernels[0].instructions
             if type(i).__name__ == "DmaCopy" and getattr(i.src, "tensor", None)
             == res.program.params[0].name]
    assert len(loads) == 3 and {i.dst.free_size for i in loads} == {384}


def test_dma_cast_rhs_bunches_more_row_tiles():
    """FP32 weights of a bf16 layer arrive DMA-cast (convert-into-dot), twice the bytes
    per k-tile: the first column group computes 3 row tiles per arriving rhs k-tile,
    not 2, before its first PSUM drain; bf16 weights keep 2. Same results."""
    def first_drain_accs(rdtype):
        b = FnBuilder()
        x, w = b.arg((512, 256), "bfloat16"), b.arg((256, 1024), rdtype)
        r = b.op("dot_general", [x, w], [512, 1024], "bfloat16",
                 lhs_batching_dimensions=(), rhs_batching_dimensions=(),
                 lhs_contracting_dimensions=(1,), rhs_contracting_dimensions=(0,),
                 operand_types=("bfloat16", "bfloat16"))
        xv, wv = rand((512, 256), "bfloat16", 50), rand((256, 1024), rdtype, 51)
        res = run(b.ret(r), xv, wv)
        ref = dot_ref(xv.astype(np.float32), wv.astype(BF16).astype(np.float32))
        np.testing.assert_allclose(res.outputs[0].astype(np.float32), ref, rtol=2e-2, atol=0.5)
        accs = set()
        for i in (i for k in res.program.kernels for i in k.instructions):
            if type(i).__name__ != "NcMatmul":
                if accs and i.engine in ("vector", "scalar"):
                    return len(accs)
                continue
            accs.add(i.dst.offset)
    assert first_drain_accs("bfloat16") == 2 * 2       # 2 row tiles x 2 column banks
    assert first_drain_accs("float32") == 3 * 2


@pytest.mark.parametrize("lc", [(0,), (1,)])
def test_one_column_group_loads_the_rhs_once(lc):
    """N within one column group and M over several blocks (a small SBUF): the rhs slice
    stays resident across the M blocks, loaded once (it was reloaded per block), for a
    K-major lhs (whole-block loads) and a row-major one (strips)."""
    import dataclasses
    from .runner import run_program
    spec = dataclasses.replace(SPEC, sbuf_partition_bytes=SPEC.sbuf_reserved_bytes + 12000)
    ls = (256, 2048) if lc == (0,) else (2048, 256)
    x, y = rand(ls, "bfloat16", 60), rand((256, 512), "bfloat16", 61)
    m = dot_module(ls, (256, 512), lc=lc, dtype="bfloat16", out_dtype="float32")
    program = lower_module(m, spec)
    out = run_program(program, [x, y], spec).outputs[0]
    np.testing.assert_allclose(out, dot_ref(x, y, lc=lc), rtol=1e-4, atol=1e-3)
    (kernel,) = program.kernels
    assert len(_loads(kernel, "arg1")) == 2      # its 2 k-tiles (before: 2 per M block)


def test_k_major_lhs_starts_after_one_k_tile_of_each_operand():
    """A K-major lhs ([K, M], loaded as whole blocks: flax's weight gradients x^T dy):
    its k-tile DMAs alternate with the rhs's, so the first matmul waits for one k-tile
    of each, not for the whole lhs block; the first k-step then feeds 3 row tiles (two
    loads per k-step double the bunch; PSUM holds 3 with one set free)."""
    x, y = rand((512, 512), "bfloat16", 70), rand((512, 1024), "bfloat16", 71)
    res = run(dot_module((512, 512), (512, 1024), lc=(0,), dtype="bfloat16",
                         out_dtype="float32"), x, y)
    np.testing.assert_allclose(res.outputs[0], dot_ref(x, y, lc=(0,)), rtol=1e-4, atol=1e-3)
    ins = res.program.kernels[0].instructions
    first = next(i for i, x in enumerate(ins) if type(x).__name__ == "NcMatmul")
    srcs = [x.src.tensor for x in ins[:first] if type(x).__name__ == "DmaCopy"]
    assert srcs[:2] == ["arg0", "arg1"] and srcs[2:4] == ["arg0", "arg1"]
    step = [x for x in ins if type(x).__name__ == "NcMatmul"][:6]
    assert len({x.stationary.offset for x in step}) == 3       # 3 row tiles per k-step
