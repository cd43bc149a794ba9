"""JAX's own tests on trn against the CPU backend (issue 13): what passes on CPU must
pass on trn.

    python benchmarks/jax_conformance.py --jax-tests <JAX's tests/ at jax-v0.10.2>
        [--files lax_test.py ...] [--timeout 180] [-k EXPR] [--sample N] [--jobs N]
        [--out DIR] [--rerun-cpu] [--report-only]

Each file runs in pytest subprocesses twice, with `JAX_TRN_MATMUL_PRECISION=highest`,
`JAX_NUM_GENERATED_CASES=3` and 8 host CPU devices (the default trn chip has 8
NeuronCores, so multi-device tests run on both): on trn (`JAX_PLATFORMS=trn,cpu`) and
on CPU (`JAX_PLATFORMS=cpu`), each test under pytest-timeout's `--timeout`. Outcomes
come from pytest's JUnit XML in --out (default ./jax_conformance_out); the CPU results
are cached there with the settings that made them and reused until those change (or
--rerun-cpu). The project's packages are imported from this checkout (PYTHONPATH).

`--sample N` keeps every Nth case of the big parametrized groups (test methods with
more than 50 cases; all others run whole), a deterministic subset, e.g. `--sample 4`
for lax_control_flow_test.py as in issue 13. `--jobs N` runs N pytest processes at a
time (files x platforms).

Printed: per file, the CPU-passing tests that ran on trn (tests JAX skips on trn, e.g.
`jtu.run_on_devices("cpu")`, are listed apart and not counted), how many passed, the
rate; the trn failures among them grouped by the first line of their error (count and
a few test ids); the slowest tests on trn beside their CPU time.

Needs the `[test]` extra plus absl-py and pytest-timeout (JAX's tests import absl):
`pip install -e '.[conformance]'`. JAX's tests are not part of this project; get them
with `git archive jax-v0.10.2 tests` from the JAX repository.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib.metadata import version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = ("lax_test.py", "lax_control_flow_test.py", "lax_autodiff_test.py", "nn_test.py",
         "random_lax_test.py")
SETTINGS = {"JAX_TRN_MATMUL_PRECISION": "highest", "JAX_NUM_GENERATED_CASES": "3",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
PLATFORMS = {"trn": "trn,cpu", "cpu": "cpu"}
BIG_GROUP = 50          # --sample thins only test methods with more cases than this


@dataclass
class Outcome:
    status: str          # passed / failed / skipped
    seconds: float
    message: str = ""    # first line of the error or skip reason


# --- running -------------------------------------------------------------------------

def env_for(platform: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, **SETTINGS, "JAX_PLATFORMS": PLATFORMS[platform],
            "PYTHONPATH": path}


def pytest_args(opts, test_file: str, timeout: bool = True) -> list[str]:
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "--rootdir", opts.jax_tests, test_file]
    if timeout:
        args += ["--timeout", str(opts.timeout)]
    return args + (["-k", opts.k] if opts.k else [])


def collect(opts, name: str, platform: str) -> list[str]:
    """The node ids pytest collects for `name` on `platform`."""
    args = pytest_args(opts, os.path.join(opts.jax_tests, name), timeout=False)
    out = subprocess.run(args + ["--collect-only"], capture_output=True, text=True,
                         env=env_for(platform), cwd=opts.jax_tests).stdout
    return [line for line in out.splitlines() if "::" in line]


def sample(ids: list[str], methods: list[str], every: int) -> list[str]:
    """Every `every`-th id of each method with more than BIG_GROUP ids, all others.
    An id belongs to the longest method name that prefixes its test name."""
    groups: dict[str, list[str]] = defaultdict(list)
    for node in ids:
        test = node.split("::")[-1]
        groups[max((m for m in methods if test.startswith(m)), key=len, default=test)
               ].append(node)
    kept = set()
    for members in groups.values():
        kept.update(members[::every] if len(members) > BIG_GROUP else members)
    return [node for node in ids if node in kept]


def test_methods(path: str) -> list[str]:
    tree = ast.parse(open(path).read())
    return [n.name for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.name.startswith("test")]


def run_file(opts, name: str, platform: str) -> str:
    """Runs one file on one platform; returns the JUnit XML path."""
    xml = os.path.join(opts.out, f"{name}.{platform}.xml")
    target = os.path.join(opts.jax_tests, name)
    if opts.sample > 1:
        ids = sample(collect(opts, name, platform), test_methods(target), opts.sample)
        argsfile = os.path.join(opts.out, f"{name}.{platform}.ids")
        with open(argsfile, "w") as f:
            f.write("\n".join(ids) + "\n")
        target = "@" + argsfile
    log = open(os.path.join(opts.out, f"{name}.{platform}.log"), "w")
    subprocess.run(pytest_args(opts, target) + ["--junitxml", xml], stdout=log,
                   stderr=subprocess.STDOUT, env=env_for(platform), cwd=opts.jax_tests)
    return xml


def cpu_key(opts, name: str) -> dict:
    return {"file": name, "k": opts.k, "sample": opts.sample, "timeout": opts.timeout,
            "settings": SETTINGS, "jax": version("jax")}


def cpu_cached(opts, name: str) -> bool:
    stamp = os.path.join(opts.out, f"{name}.cpu.json")
    if opts.rerun_cpu or not os.path.exists(stamp):
        return False
    return (json.load(open(stamp)) == cpu_key(opts, name)
            and os.path.exists(os.path.join(opts.out, f"{name}.cpu.xml")))


def run_all(opts) -> None:
    jobs = [(n, "trn") for n in opts.files]
    jobs += [(n, "cpu") for n in opts.files if not cpu_cached(opts, n)]
    with ThreadPoolExecutor(max_workers=opts.jobs) as pool:
        for (name, platform), _ in zip(jobs, pool.map(lambda j: run_file(opts, *j), jobs)):
            if platform == "cpu":
                with open(os.path.join(opts.out, f"{name}.cpu.json"), "w") as f:
                    json.dump(cpu_key(opts, name), f)


# --- reading -------------------------------------------------------------------------

def read_junit(path: str) -> dict[str, Outcome]:
    """test id -> Outcome; an empty dict when the run left no XML (it crashed)."""
    if not os.path.exists(path):
        return {}
    out = {}
    for case in ET.parse(path).iter("testcase"):
        test = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        out[test] = _outcome(case)
    return out


def _outcome(case: ET.Element) -> Outcome:
    seconds = float(case.get("time") or 0)
    for tag, status in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
        child = case.find(tag)
        if child is not None:
            text = child.get("message") or child.text or tag
            return Outcome(status, seconds, first_line(text))
    return Outcome("passed", seconds)


def first_line(text: str) -> str:
    """The first non-empty line, with value numbers, shapes and user paths made
    generic (so one cause is one group, whatever the test's shapes)."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = re.sub(r"%v\d+", "%vN", line)
    line = re.sub(r"\b(\w+)\[[\d,]*\]", r"\1[..]", line)
    line = re.sub(r" at [^ )]+\.py:\d+", "", line)
    return line[:200]


# --- reporting -----------------------------------------------------------------------

def report(opts) -> None:
    rows, causes, skips, slow = [], defaultdict(list), defaultdict(list), []
    for name in opts.files:
        cpu = read_junit(os.path.join(opts.out, f"{name}.cpu.xml"))
        trn = read_junit(os.path.join(opts.out, f"{name}.trn.xml"))
        passing = [t for t, o in cpu.items() if o.status == "passed"]
        reached = [t for t in passing if t in trn]
        ran = [t for t in reached if trn[t].status != "skipped"]
        ok = [t for t in ran if trn[t].status == "passed"]
        rows.append((name, len(passing), len(reached) - len(ran), len(ran), len(ok)))
        if passing and not trn:
            print(f"{name}: no trn results (the run died?): see "
                  f"{os.path.join(opts.out, name)}.trn.log")
        for t in reached:
            if trn[t].status != "passed":
                group = skips if trn[t].status == "skipped" else causes
                group[trn[t].message].append(f"{name}::{t}")
        slow += [(trn[t].seconds, cpu[t].seconds, f"{name}::{t}") for t in ran]
    print_table(rows)
    print_causes("Failures on trn of CPU-passing tests", causes)
    print_causes("Skipped on trn, passing on CPU (not counted)", skips)
    print_slowest(slow)


def print_table(rows) -> None:
    print("| file | CPU-passing | skipped on trn | run on trn | trn passes | rate |")
    print("|---|---|---|---|---|---|")
    for name, passing, skipped, ran, ok in rows:
        rate = f"{100 * ok / ran:.1f}%" if ran else "-"
        lost = passing - skipped - ran
        missing = f" ({lost} not reached)" if lost else ""
        print(f"| {name} | {passing} | {skipped} | {ran}{missing} | {ok} | {rate} |")


def print_causes(title: str, causes, examples: int = 3) -> None:
    print(f"\n{title}: {sum(len(v) for v in causes.values())}, by first line")
    for cause, tests in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        print(f"\n{len(tests):4d}  {cause}")
        for t in tests[:examples]:
            print(f"        {t}")


def print_slowest(slow, n: int = 10) -> None:
    print("\nSlowest on trn (seconds, trn vs CPU):")
    for trn_s, cpu_s, test in sorted(slow, reverse=True)[:n]:
        print(f"  {trn_s:8.1f}  {cpu_s:7.2f}  {test}")
    trn_total, cpu_total = sum(s[0] for s in slow), sum(s[1] for s in slow)
    print(f"  total {trn_total:.0f} s on trn, {cpu_total:.0f} s on CPU "
          f"for the {len(slow)} tests run on both")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jax-tests", required=True, help="JAX's tests/ directory")
    p.add_argument("--files", nargs="+", default=list(FILES))
    p.add_argument("--timeout", type=float, default=180, help="seconds per test")
    p.add_argument("-k", default="", help="pytest -k expression, for both platforms")
    p.add_argument("--sample", type=int, default=1,
                   help=f"every Nth case of methods with > {BIG_GROUP} cases")
    p.add_argument("--jobs", type=int, default=1, help="pytest processes at a time")
    p.add_argument("--out", default="jax_conformance_out", help="XMLs, logs, CPU cache")
    p.add_argument("--rerun-cpu", action="store_true", help="ignore cached CPU results")
    p.add_argument("--report-only", action="store_true", help="print from --out")
    opts = p.parse_args(argv)
    opts.jax_tests, opts.out = os.path.abspath(opts.jax_tests), os.path.abspath(opts.out)
    os.makedirs(opts.out, exist_ok=True)
    if not opts.report_only:
        run_all(opts)
    report(opts)


if __name__ == "__main__":
    main()
