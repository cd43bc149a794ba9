"""The profiler reports what ran, once (issue 12, item 7): FLOPs counted once per useful
operation, multi-device pages per device and per program, JAX's program names, fused
kernels attributed to the op that dominates them. Each test failed before its fix."""
from __future__ import annotations

import numpy as np
import pytest

from jax_trn.profiler import summary as summary_page
from tests.profiler.helpers import profiled

DN = ("NHWC", "HWIO", "NHWC")


@pytest.fixture(scope="module")
def conv_ex(jax, trn):
    """An f32 convolution under the default auto-cast (bf16 operands): a staging
    kernel, the tap loop and an output relayout, each with TensorE work."""
    x = jax.device_put(np.ones((8, 32, 32, 16), np.float32), trn)
    w = jax.device_put(np.ones((3, 3, 16, 32), np.float32), trn)
    f = jax.jit(lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                                          dimension_numbers=DN))
    return profiled(jax, f, x, w).executions[-1]


def test_conv_flops_are_counted_once(conv_ex):
    model = 2 * (8 * 32 * 32 * 32) * (3 * 3 * 16)
    assert len(conv_ex.kernels) > 1
    assert conv_ex.flops == model                    # was 2x: every kernel credited
    assert conv_ex.summary_dict()["flops"] == model


def test_conv_flops_belong_to_the_kernel_that_runs_the_taps(conv_ex):
    credited = [k for k in conv_ex.kernels if k.flops]
    assert [k.name for k in credited] == ["convolution.0.conv"]


def test_executed_flops_are_shown_beside_model_flops(conv_ex):
    d = conv_ex.summary_dict()
    executed = sum(e.flops for k in conv_ex.kernels for e in k.events)
    assert d["tensor_flops"] == executed >= d["flops"]
    assert "executed" in str(conv_ex.summary())


# --- several devices ----------------------------------------------------------------


@pytest.fixture(scope="module")
def pmap_ex(jax, trn_devices):
    n = len(trn_devices)
    f = jax.pmap(lambda x, w: jax.lax.psum(jax.numpy.tanh(x @ w), "i"), axis_name="i",
                 devices=trn_devices)
    x, w = np.ones((n, 128, 256), np.float32), np.ones((n, 256, 256), np.float32) / 256
    f(x, w)
    return profiled(jax, f, x, w).executions[-1]


def test_device_lists_are_compressed():
    assert summary_page.ranges([3, 0, 1, 2, 8, 10, 11]) == "0-3, 8, 10-11"
    assert summary_page.ranges(range(128)) == "0-127"
    assert summary_page.ranges([5]) == "5"


def test_multi_device_page_lists_devices_as_ranges(pmap_ex):
    n = len(pmap_ex.devices)
    assert n > 1
    text = str(pmap_ex.summary())
    assert f"devices 0-{n - 1}" in text.splitlines()[0]
    assert ", ".join(map(str, range(n))) not in text
    assert f"0-{n - 1}" in repr(pmap_ex)


def test_multi_device_mfu_is_against_the_peak_of_every_device(pmap_ex):
    d, n = pmap_ex.summary_dict(), len(pmap_ex.devices)
    assert d["peak_tflops"] == pytest.approx(n * d["peak_tflops_per_core"])
    assert d["mfu_estimated_percent"] == pytest.approx(
        100 * d["achieved_tflops"] / d["peak_tflops"])
    assert d["achieved_tflops_per_device"] == pytest.approx(d["achieved_tflops"] / n)
    assert f"of {d['peak_tflops']:.0f} TFLOP/s on {n} devices" in str(pmap_ex.summary())


def test_kernel_time_is_per_device_and_fits_in_the_step(pmap_ex):
    d, n = pmap_ex.summary_dict(), len(pmap_ex.devices)
    rows = d["kernels"]
    assert sum(r["time_s"] for r in rows) <= d["total_time_s"] * (1 + 1e-9)
    for r in rows:
        assert r["device_count"] == n and r["calls"] == 1
        assert r["device_time_s"] == pytest.approx(n * r["time_s"], rel=0.2)
    assert "time/dev" in str(pmap_ex.summary())


def test_per_device_rows_group_devices_that_did_the_same(pmap_ex):
    d, n = pmap_ex.summary_dict(), len(pmap_ex.devices)
    rows = d["per_device"]
    assert sum(r["count"] for r in rows) == n
    for r in rows:
        busy = r["kernel_time_s"] + r["collective_time_s"] + r["idle_s"]
        assert busy == pytest.approx(d["total_time_s"], rel=1e-6)
    assert "per device" in str(pmap_ex.summary())


def test_insight_times_are_per_device(pmap_ex):
    for i in pmap_ex.summary_dict()["insights"]:
        if " us" in i["message"] and i["kind"] in ("waiting", "transposes"):
            assert "per device" in i["message"]


def test_a_profile_of_several_programs_has_a_row_per_program(jax, trn):
    x = jax.device_put(np.ones((128, 128), np.float32), trn)
    f, g = jax.jit(lambda a: a @ a), jax.jit(lambda a: a + 1)
    prof = profiled(jax, lambda a: (f(a), g(a), g(a)), x)
    d = prof.summary_dict()
    rows = {r["name"]: r for r in d["programs"]}
    assert [r["calls"] for r in rows.values()] == [1, 2]
    assert sum(r["time_s"] for r in rows.values()) == pytest.approx(d["total_time_s"])
    assert rows[prof.executions[0].name]["mfu_percent"] > 0
    assert "programs (2)" in str(prof.summary())


# --- source attribution -------------------------------------------------------------


def _masked_column_sums(x, mask, g):
    import jax.numpy as jnp
    y = x * mask                       # a dropout-like multiply, first in program order
    s = jnp.sum(y, axis=0)             # the reduction that dominates the fused kernel
    return s * g


def test_fused_kernel_is_attributed_to_the_op_that_dominates_it(jax, trn):
    import inspect
    args = jax.device_put((np.ones((256, 64), np.float32), np.ones((256, 64), np.float32),
                           np.ones(64, np.float32)), trn)
    ex = profiled(jax, jax.jit(_masked_column_sums), *args).executions[-1]
    lines, start = inspect.getsourcelines(_masked_column_sums)
    reduce_line = start + next(i for i, t in enumerate(lines) if "jnp.sum" in t)
    fused = next(k for k in ex.kernels if len(k.ops) > 1)
    assert fused.ops[0].startswith("reduce at ") and f":{reduce_line}" in fused.ops[0]
    row = next(r for r in ex.summary_dict()["kernels"] if r["name"] == fused.name)
    assert summary_page._source(row["ops"]).startswith(f"reduce test_truthful.py:{reduce_line}")
    assert {i.op for i in ex.instructions if i.kernel == fused.name} == {"reduce"}


def test_a_fused_matmul_is_attributed_to_the_matmul(jax, trn):
    f = jax.jit(lambda x, w, b: x @ w + jax.numpy.tanh(b) * 2)
    args = jax.device_put((np.ones((128, 64), np.float32), np.ones((64, 32), np.float32),
                           np.ones(32, np.float32)), trn)
    ex = profiled(jax, f, *args).executions[-1]
    for k in ex.kernels:
        if any(o.startswith("dot_general") for o in k.ops):
            assert k.ops[0].startswith("dot_general at ")


# --- names --------------------------------------------------------------------------


def _cpu_module_name(jax, f, *args) -> str:
    """The name JAX gives the program: its CPU executable's HloModule."""
    return f.lower(*args).compile().as_text().split()[1].rstrip(",")


def test_program_names_are_the_ones_jax_gives(jax, trn):
    def my_step(x):
        return x * 2
    x = np.ones((4, 4), np.float32)
    ex = profiled(jax, jax.jit(my_step), jax.device_put(x, trn)).executions[-1]
    assert ex.name == "jit_my_step" == _cpu_module_name(jax, jax.jit(my_step), x)
    assert ex.summary_dict()["kind"] == "jit"


def test_a_pmap_is_named_as_jax_names_it_and_marked_pmap(jax, pmap_ex):
    """JAX 0.10 runs pmap(f) as jit(shard_map(_fun)): its own executable is `jit__fun`."""
    cpu = jax.devices("cpu")[:2]
    f = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i", devices=cpu)
    assert pmap_ex.name == _cpu_module_name(jax, f, np.ones((2, 3), np.float32))
    assert pmap_ex.summary_dict()["kind"] == "pmap"
    assert str(pmap_ex.summary()).startswith(f"{pmap_ex.name} (pmap) on ")
