"""Compiled-code quality on one simulated NeuronCore: goal vs measured, PASS / MISS.

    python benchmarks/compiler.py [--system trn2.3xlarge] [--rows gemm fp8 attn chain block compile]

Every program is written in plain JAX and compiled by our compiler exactly as PJRT
does (`hlo_passes.compile_to_ir` + `jax_trn.lower.lower_module` on the StableHLO that
`jax.jit(f).lower(...)` produces for the trn platform); it then runs through the
runtime's timing-only `simulate()` (simulated time never depends on the data).
Figures are deterministic.

Definitions (jax_trn/profiler/metrics.py):

- TensorE utilization = TensorE busy time / simulated time. Busy time is every
  TensorE instruction from the later of its LoadStationary start and the previous
  MultiplyMoving's end to its MM end (tensor_pipe.py): a LoadStationary hidden behind
  the previous MM costs nothing, an exposed one counts as busy, and so do TensorE
  transposes (identity matmuls). MFU (model FLOPs over the published per-core peak for
  the dtype, §1.2) is printed beside it; it counts no transposes or exposed LS. The
  Trn2 power throttle (§2.2) stretches MultiplyMoving time, and busy time with it.
  Attention's model FLOPs are those of the program's two full matmuls, masked half
  included (what the unfused program counts), so its MFU can exceed what TensorE ran.
- throughput = model FLOPs / simulated time.
- DMA roofline = the bytes the program must move once (read x and y, write the result)
  at the core's DMA ceiling (§3.4, §9: 368 GB/s on Trn2) over the simulated time.
- compile time = wall clock of `jax.jit(f).lower(...).compile()` for the trn device
  vs the CPU device (best of --repeat), including JAX's own tracing and lowering.

Rows a program cannot run yet print the reason (e.g. the compile error) instead.
"""
from __future__ import annotations

import argparse
import os
import time
import traceback
from dataclasses import dataclass

import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fusion import stablehlo  # noqa: E402  (benchmarks/fusion.py)

ROWS = ("gemm", "fp8", "attn", "chain", "block", "compile")


@dataclass
class Row:
    kernel: str
    goal: str
    measured: str
    ok: bool | None          # None: reported only (no pass/fail goal)

    def line(self) -> str:
        verdict = {True: "PASS", False: "MISS", None: ""}[self.ok]
        return f"{self.kernel:<48} {self.goal:<30} {self.measured:<46} {verdict}"


# --- programs --------------------------------------------------------------------------

def gemm(dtype, n: int = 4096):
    import jax
    import jax.numpy as jnp
    arg = jax.ShapeDtypeStruct((n, n), dtype)
    out = jnp.bfloat16

    def f(a, b):
        return jax.lax.dot(a, b, preferred_element_type=out)
    return f, (arg, arg)


def causal_attention(q, k, v):
    """Plain JAX causal attention, [B, H, S, D] inputs."""
    import jax
    import jax.numpy as jnp
    s = q.shape[2]
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k) * (q.shape[-1] ** -0.5)
    mask = jnp.tril(jnp.ones((s, s), bool))
    scores = jnp.where(mask, scores, -jnp.inf)
    p = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
    return jnp.einsum("bhqk,bhkd->bhqd", p, v)


def attention_args(b=1, h=8, s=2048, d=128, dtype="bfloat16"):
    import jax
    arg = jax.ShapeDtypeStruct((b, h, s, d), dtype)
    return causal_attention, (arg, arg, arg)


def chain_args(mib: int = 64):
    import jax
    import jax.numpy as jnp
    n = mib * 2 ** 20 // 4
    arg = jax.ShapeDtypeStruct((n // 4096, 4096), jnp.float32)
    return (lambda x, y: jnp.tanh(x * 2 + 1) * y), (arg, arg), 3 * n * 4


def transformer_block(params, x, heads: int = 8):
    """Pre-LN block, [S, d]: x + attn(ln(x)); then + mlp(ln(.)) with gelu, 4x."""
    import jax
    import jax.numpy as jnp
    s, d = x.shape

    def ln(h, g, b):
        h32 = h.astype(jnp.float32)
        mu = h32.mean(-1, keepdims=True)
        var = ((h32 - mu) ** 2).mean(-1, keepdims=True)
        return ((h32 - mu) * jax.lax.rsqrt(var + 1e-5) * g + b).astype(h.dtype)

    h = ln(x, params["g1"], params["b1"])
    qkv = (h @ params["wqkv"]).reshape(s, 3, heads, d // heads).transpose(1, 2, 0, 3)
    a = causal_attention(qkv[0][None], qkv[1][None], qkv[2][None])[0]
    x = x + a.transpose(1, 0, 2).reshape(s, d) @ params["wo"]
    h = ln(x, params["g2"], params["b2"])
    return x + jax.nn.gelu(h @ params["w1"]) @ params["w2"]


def block_args(d: int = 1024, s: int = 1024):
    import jax
    import jax.numpy as jnp
    bf = jnp.bfloat16
    shapes = {"g1": (d,), "b1": (d,), "g2": (d,), "b2": (d,), "wqkv": (d, 3 * d),
              "wo": (d, d), "w1": (d, 4 * d), "w2": (4 * d, d)}
    params = {k: jax.ShapeDtypeStruct(v, bf) for k, v in shapes.items()}

    def fwd_bwd(p, x):
        def loss(p, x):
            return transformer_block(p, x).astype(jnp.float32).sum()
        return jax.value_and_grad(loss, argnums=(0, 1))(p, x)
    return fwd_bwd, (params, jax.ShapeDtypeStruct((s, d), bf))


# --- measuring -------------------------------------------------------------------------

def run(name: str, f, args, system, fuse: bool = True):
    """(Execution, program) of `f` on one core: compiled by our compiler, timed."""
    import hlo_passes
    from jax_trn.lower import lower_module
    from jax_trn.runtime.executable import simulate
    program = lower_module(hlo_passes.compile_to_ir(stablehlo(f, args), fuse=fuse),
                           system.chip.core)
    return simulate(name, program, system), program


def tensor_util(ex) -> float:
    return ex.engine_utilization["tensor"]


def mfu(ex) -> float:
    return ex.flops / ex.simulated_time_s / ex.peak_flops_per_s


def row_gemm(system, ctx) -> list[Row]:
    ex, _ = run("gemm bf16", *gemm("bfloat16"), system)
    ctx["gemm_bf16"] = ex
    u = tensor_util(ex)
    return [Row("bf16 GEMM 4096x4096x4096", "TensorE utilization >= 90%",
                f"{u:.1%} busy, MFU {mfu(ex):.1%}, {ex.simulated_time_s * 1e6:.0f} us",
                u >= 0.90)]


def row_fp8(system, ctx) -> list[Row]:
    import jax.numpy as jnp
    bf = ctx.get("gemm_bf16") or run("gemm bf16", *gemm("bfloat16"), system)[0]
    rows = []
    # float8_e4m3fn is a TensorE input on NC-v4 only (§2.2): elsewhere it runs as bf16.
    for dtype in (jnp.float8_e5m2, jnp.float8_e4m3fn):
        name = jnp.dtype(dtype).name
        label = f"fp8 GEMM ({name} -> bf16) 4096^3"
        goal = system.chip.core.ocp_fp8 or dtype == jnp.float8_e5m2
        want = ">= 1.9x bf16 throughput" if goal else "reported (bf16 on this core)"
        try:
            ex, _ = run(f"gemm {name}", *gemm(dtype), system)
        except Exception as e:       # noqa: BLE001 - the row reports why it cannot run
            rows.append(Row(label, want, _why(e), False))
            continue
        speed = bf.simulated_time_s / ex.simulated_time_s
        rows.append(Row(label, want, f"{speed:.2f}x ({ex.flops / ex.simulated_time_s / 1e12:.0f}"
                        f" TFLOP/s, {ex.simulated_time_s * 1e6:.0f} us)",
                        speed >= 1.9 if goal else None))
    return rows


def row_attn(system, ctx) -> list[Row]:
    label = "causal attention B1 H8 S2048 D128 bf16"
    try:
        ex, prog = run("attention", *attention_args(), system)
    except Exception as e:       # noqa: BLE001
        return [Row(label, "TensorE utilization >= 60%", _why(e), False)]
    u = tensor_util(ex)
    return [Row(label, "TensorE utilization >= 60%",
                f"{u:.1%} busy, MFU {mfu(ex):.1%}, {ex.simulated_time_s * 1e6:.0f} us, "
                f"{len(prog.kernels)} kernels", u >= 0.60)]


def row_chain(system, ctx) -> list[Row]:
    f, args, ideal = chain_args()
    fused, _ = run("chain fused", f, args, system, fuse=True)
    unfused, _ = run("chain unfused", f, args, system, fuse=False)
    ceiling = system.chip.core.dma_bytes_per_ns * 1e9
    roof = ideal / ceiling / fused.simulated_time_s
    speed = unfused.simulated_time_s / fused.simulated_time_s
    return [Row("tanh(x*2+1)*y f32 2x64 MiB, fused", ">= 80% of DMA roofline",
                f"{roof:.1%} ({fused.simulated_time_s * 1e6:.0f} us)", roof >= 0.80),
            Row("the same chain unfused vs fused", "speedup reported",
                f"{speed:.2f}x ({unfused.simulated_time_s * 1e6:.0f} us unfused)", None)]


def row_block(system, ctx) -> list[Row]:
    from jax_trn.profiler.metrics import kernel_stats
    label = "transformer block fwd+bwd d1024 S1024 bf16"
    try:
        ex, prog = run("block", *block_args(), system)
    except Exception as e:       # noqa: BLE001
        return [Row(label, "MFU reported per kernel", _why(e), None)]
    rows = [Row(label, "MFU reported per kernel",
                f"MFU {mfu(ex):.1%}, TensorE {tensor_util(ex):.1%}, "
                f"{ex.simulated_time_s * 1e6:.0f} us, {len(prog.kernels)} kernels", None)]
    total = ex.simulated_time_s * 1e9
    kinds = {k.name: _kind(k) for k in prog.kernels}
    for s in kernel_stats([ex])[:12]:
        t = s.totals
        rows.append(Row(f"  {s.name} ({kinds.get(s.name, '?')}, {len(s.ops)} ops)",
                        f"{t.time_ns / total:.1%} of time",
                        f"MFU {t.mfu:.1%}, TensorE {t.active('tensor'):.1%}, "
                        f"{s.bound[0]}", None))
    return rows


def _kind(kernel) -> str:
    for note in kernel.notes:
        if note.startswith("fusion_kind: "):
            return note.split(": ", 1)[1]
    return "op"


def row_compile(system, ctx, repeat: int = 3) -> list[Row]:
    import jax
    from jax.sharding import SingleDeviceSharding
    f, args = block_args()
    label = "compile: transformer block fwd+bwd, trn vs CPU"
    times = {}
    try:
        for platform in ("cpu", "trn"):
            sharding = SingleDeviceSharding(jax.devices(platform)[0])
            placed = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype,
                                                                 sharding=sharding), args)
            best = float("inf")
            for _ in range(repeat):
                g = jax.jit(lambda *a: f(*a))       # a fresh function: no cache hit
                start = time.perf_counter()
                g.lower(*placed).compile()
                best = min(best, time.perf_counter() - start)
            times[platform] = best
    except Exception as e:       # noqa: BLE001
        return [Row(label, "within 2x of CPU", _why(e), False)]
    ratio = times["trn"] / times["cpu"]
    return [Row(label, "within 2x of CPU", f"{ratio:.2f}x ({times['trn'] * 1e3:.0f} ms vs "
                f"{times['cpu'] * 1e3:.0f} ms)", ratio <= 2.0)]


def _why(e: Exception) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"cannot run: {type(e).__name__}: {msg[:160]}"


MEASURE = {"gemm": row_gemm, "fp8": row_fp8, "attn": row_attn, "chain": row_chain,
           "block": row_block, "compile": row_compile}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", default="trn2.3xlarge")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    opts = parser.parse_args()
    os.environ["JAX_TRN_SYSTEM"] = opts.system
    from jax_trn.config import get_system
    system = get_system(opts.system)
    print(f"compiled-code quality on one {system.chip.core.name} of {system.name} "
          f"(simulated, deterministic)\n")
    head = f"{'kernel (one NeuronCore)':<48} {'goal':<30} {'measured':<46} verdict"
    print(head)
    print("-" * len(head))
    ctx: dict = {}
    for name in opts.rows:
        try:
            rows = MEASURE[name](system, ctx)
        except Exception as e:       # noqa: BLE001 - one broken row must not hide the rest
            traceback.print_exc()
            rows = [Row(name, "-", _why(e), False)]
        for r in rows:
            print(r.line(), flush=True)


if __name__ == "__main__":
    main()
