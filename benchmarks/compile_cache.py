"""The persistent compilation cache on an lm1b-size training step (issue 19).

Compiles flax lm1b's model shape (`workloads.flax_lm`: 6 decoder layers, width 512, 8 heads, MLP 2048, causal
self-attention, tied embedding over a 30k vocabulary, optax adamw) twice, each time in a
fresh process with the same `jax_compilation_cache_dir`: the first compiles and writes
the cache, the second reads it. Prints, for each run, wall seconds of JAX's tracing
(`.lower()`, which no cache skips, on CPU either), wall and CPU seconds of the compile
(`.compile()`), a digest of the compiled program (the same both times), and the target:
second compile <= 5% of the first. The CPU figure is the one to read on a busy machine
(wall seconds there depend on what else runs). With --call, also the first call of the
compiled step (a program read from the cache makes each kernel's instructions when the
kernel first runs: that part of a load is paid there).

In this benchmark JAX's own persistent cache engages for trn too (the model's
`jax.random.key` compiles a CPU program first, and JAX decides once per process), so
the second run reads JAX's entry (PJRT_Executable_DeserializeAndLoad); without a CPU
program first, it reads jax-trn's entry under `<dir>/jax-trn/`. Both hold the same bytes.

    python benchmarks/compile_cache.py [--layers 6] [--keep DIR] [--call]
"""
from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[1]

STEP = """
    import hashlib, sys, time
    import jax

    jax.config.update("jax_compilation_cache_dir", sys.argv[1])
    sys.path.insert(0, "benchmarks")
    from workloads import flax_lm
    step, args = flax_lm(layers=int(sys.argv[2]), width=512, heads=8, mlp=2048, vocab=30000,
                         length=256, batch=4)
    params, opt, tokens = jax.device_put(args, jax.devices("trn")[0])

    start = time.perf_counter()
    lowered = step.lower(params, opt, tokens)
    lower_s = time.perf_counter() - start
    start, cpu = time.perf_counter(), time.process_time()
    compiled = lowered.compile()
    compile_s, compile_cpu = time.perf_counter() - start, time.process_time() - cpu
    call_s = 0.0
    if int(sys.argv[3]):
        start = time.perf_counter()
        jax.block_until_ready(compiled(params, opt, tokens))
        call_s = time.perf_counter() - start
    print(lower_s, compile_s, compile_cpu, call_s,
          hashlib.sha256(compiled.as_text().encode()).hexdigest()[:16])
"""


def run(cache_dir: str, layers: int, call: bool) -> tuple[float, float, float, float, str]:
    """(lower s, compile wall s, compile CPU s, first call s, program digest)"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(STEP), cache_dir, str(layers),
                          str(int(call))],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    if out.returncode:
        sys.exit(out.stderr[-3000:])
    *numbers, program = out.stdout.split()[-5:]
    return (*map(float, numbers), program)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--keep", help="cache directory to use (default: a temporary one)")
    parser.add_argument("--call", action="store_true",
                        help="also time the first call of the compiled step")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache_dir = args.keep or tmp
        cold = run(cache_dir, args.layers, args.call)
        warm = run(cache_dir, args.layers, args.call)
    print(f"lm1b-size training step ({args.layers} layers): seconds of JAX's tracing "
          f"(.lower(), wall) and of the trn compile (.compile(), wall and CPU)")
    print(f"{'run':<22}{'lower s':>9}{'compile s':>11}{'CPU s':>8}"
          f"{'1st call s' if args.call else '':>12}  program")
    for name, (low, comp, cpu, call, prog) in (("first (cache empty)", cold),
                                               ("second (cache hit)", warm)):
        call_text = f"{call:.2f}" if args.call else ""
        print(f"{name:<22}{low:>9.2f}{comp:>11.2f}{cpu:>8.2f}{call_text:>12}  {prog}")
    for what, k in (("wall", 1), ("CPU", 2)):
        ratio = warm[k] / cold[k]
        print(f"second compile / first ({what}): {ratio:.1%} (target <= 5%: "
              f"{'met' if ratio <= 0.05 else 'NOT met'})")
    print(f"same program: {warm[-1] == cold[-1]}")


if __name__ == "__main__":
    main()
