"""The layering rules of ARCHITECTURE.md, checked on the source (no imports run).

    python tests/test_layering.py            # prints the import graph of our packages
    python tests/test_layering.py --cycles   # prints only the cycles

- no import cycles among our modules (an import inside a function counts: a lazy import
  hides a cycle, it does not remove it);
- dependencies point down: `hlo_passes` never imports `jax_trn`; `jax_trn.hw` imports
  nothing of ours but `jax_trn.hw`; nothing below the plugin imports `pjrt_plugin`;
- the environment is read in one module only (`jax_trn/config.py`).
"""
from __future__ import annotations

import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("jax_trn", "hlo_passes", "pjrt_plugin")
ENV_MODULE = "jax_trn.config"


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, pathlib.Path]:
    """Every module of our packages, by dotted name."""
    found = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _is_package(name: str, mods: dict[str, pathlib.Path]) -> bool:
    return mods[name].name == "__init__.py"


def _resolve(importer: str, node: ast.ImportFrom, mods) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    if not _is_package(importer, mods):
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, mods: dict[str, pathlib.Path]) -> set[str]:
    """Our modules that module `name` imports (anywhere in its file)."""
    tree = ast.parse(mods[name].read_text(), str(mods[name]))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(name, node, mods)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                       for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in mods:          # "jax_trn.hw.isa.Tile" -> its module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {m: imports_of(m, mods) for m in mods}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


@pytest.mark.parametrize("package", ["jax_trn.hw", "jax_trn.lower", "jax_trn.runtime",
                                     "jax_trn.profiler", "jax_trn", "hlo_passes",
                                     "pjrt_plugin"])
def test_no_import_cycles(package):
    found = [c for c in cycles(graph()) if any(_in(m, package) for m in c)]
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_hw_imports_only_hw():
    bad = {m: sorted(i for i in deps if not _in(i, "jax_trn.hw"))
           for m, deps in graph().items() if _in(m, "jax_trn.hw")}
    assert not {m: d for m, d in bad.items() if d}


def test_hlo_passes_never_import_jax_trn():
    bad = {m: sorted(i for i in deps if _in(i, "jax_trn") or _in(i, "pjrt_plugin"))
           for m, deps in graph().items() if _in(m, "hlo_passes")}
    assert not {m: d for m, d in bad.items() if d}


def test_only_the_plugin_imports_the_plugin():
    bad = {m: sorted(i for i in deps if _in(i, "pjrt_plugin"))
           for m, deps in graph().items() if not _in(m, "pjrt_plugin")}
    assert not {m: d for m, d in bad.items() if d}


def test_environment_read_only_by_the_options_module():
    readers = []
    for name, path in modules().items():
        if name == ENV_MODULE:
            continue
        text = path.read_text()
        if "os.environ" in text or "os.getenv" in text:
            readers.append(name)
    assert not readers, f"modules reading the environment: {readers}"


if __name__ == "__main__":
    g = graph()
    if "--cycles" not in sys.argv:
        for m in sorted(g):
            print(f"{m}: {', '.join(sorted(g[m])) or '-'}")
    for c in cycles(g):
        print("CYCLE:", " <-> ".join(c))
