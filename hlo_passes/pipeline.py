"""Runs passes in order, with fixpoints, verification, IR dumps and disabling by name.

A pass is anything with `name: str` and `run(module) -> bool` (changed): a module in
hlo_passes/passes/, or an object such as `Fix([...])` or `InlineCalls(...)`.

    JAX_TRN_DUMP=<dir>                writes <dir>/<module>.<NN>.<pass>.txt after every
                                      pass, plus <module>.00.import.txt (the input)
    JAX_TRN_DISABLE_PASSES=dce,cse    skips passes by name (also inside Fix)
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Protocol, Sequence

from hlo_passes import ir
from hlo_passes.errors import VerifyError
from hlo_passes.verifier import verify

_FROM_ENV = object()


class Pass(Protocol):
    name: str

    def run(self, module: ir.Module) -> bool: ...


@dataclass
class PassRun:
    """One pass execution, for logs and the profiler."""
    name: str
    changed: bool
    seconds: float


class Fix:
    """Runs `passes` in order until none of them changes the module."""

    def __init__(self, passes: Sequence[Pass], max_iterations: int = 16):
        self.passes = list(passes)
        self.max_iterations = max_iterations
        self.name = "fix(" + ",".join(p.name for p in self.passes) + ")"


class Pipeline:
    """An ordered list of passes; `run(module)` returns True if any pass changed it."""

    def __init__(self, passes: Sequence[Pass | Fix], verify: bool = True,
                 dump_dir: str | None = _FROM_ENV):  # type: ignore[assignment]
        self.passes = list(passes)
        self.verify = verify
        self.dump_dir = os.environ.get("JAX_TRN_DUMP") if dump_dir is _FROM_ENV else dump_dir
        self.log: list[PassRun] = []
        self._step = 0

    def run(self, module: ir.Module) -> bool:
        disabled = _disabled()
        self.log, self._step = [], 0
        self._dump(module, "import")
        if self.verify:
            _verify_after(module, "import")
        changed = False
        for p in self.passes:
            changed |= self._run_any(p, module, disabled)
        return changed

    def _run_any(self, p: Pass | Fix, module: ir.Module, disabled: set[str]) -> bool:
        if p.name in disabled:
            return False
        if isinstance(p, Fix):
            return self._run_fix(p, module, disabled)
        return self._run_one(p, module)

    def _run_fix(self, fix: Fix, module: ir.Module, disabled: set[str]) -> bool:
        changed = False
        for _ in range(fix.max_iterations):
            round_changed = False
            for p in fix.passes:
                round_changed |= self._run_any(p, module, disabled)
            if not round_changed:
                return changed
            changed = True
        raise VerifyError(f"{fix.name} did not converge in {fix.max_iterations} rounds")

    def _run_one(self, p: Pass, module: ir.Module) -> bool:
        start = time.perf_counter()
        changed = bool(p.run(module))
        self.log.append(PassRun(p.name, changed, time.perf_counter() - start))
        self._dump(module, p.name)
        if self.verify:
            _verify_after(module, p.name)
        return changed

    def _dump(self, module: ir.Module, pass_name: str) -> None:
        if not self.dump_dir:
            return
        os.makedirs(self.dump_dir, exist_ok=True)
        stem = re.sub(r"[^\w.-]", "_", module.name)
        path = os.path.join(self.dump_dir, f"{stem}.{self._step:02d}.{pass_name}.txt")
        with open(path, "w") as f:
            f.write(ir.format_module(module))
        self._step += 1


def _verify_after(module: ir.Module, pass_name: str) -> None:
    try:
        verify(module)
    except VerifyError as e:
        raise VerifyError(f"after pass {pass_name}: {e}") from e


def _disabled() -> set[str]:
    names = os.environ.get("JAX_TRN_DISABLE_PASSES", "")
    return {n.strip() for n in names.split(",") if n.strip()}
