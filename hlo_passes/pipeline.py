"""Runs passes in order, with fixpoints, verification, IR dumps and disabling by name.

A pass is anything with `name: str` and `run(module) -> bool` (changed): a module in
hlo_passes/passes/, or an object such as `Fix([...])` or `InlineCalls(...)`.

    Pipeline(passes, verify=True, dump_dir=None, disabled=frozenset())

`dump_dir` writes <dir>/<module>.<NN>.<pass>.txt after every pass that ran, plus
<module>.00.import.txt (the input); the directory is checked (created if missing) once
when `run` starts, so an unusable one is a clear error before any pass runs. `disabled`
skips passes by name, also inside `Fix` (a Fix itself has no name of its own to
disable: disable its members). Names that no pass of the pipeline has are a ValueError.
Everything comes in as parameters: this module reads no environment.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

from hlo_passes import ir
from hlo_passes.errors import VerifyError
from hlo_passes.verifier import verify


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


def names_of(passes: Iterable[Pass | Fix]) -> tuple[str, ...]:
    """The names that can be disabled in `passes`, in order, members of a Fix included."""
    out: list[str] = []
    for p in passes:
        out.extend(names_of(p.passes) if isinstance(p, Fix) else [p.name])
    return tuple(dict.fromkeys(out))


def check_disabled(disabled: Iterable[str], valid: Sequence[str]) -> frozenset[str]:
    """`disabled` as a frozenset; a ValueError names the unknown ones and the valid ones."""
    disabled = frozenset(disabled)
    unknown = sorted(disabled - set(valid))
    if unknown:
        raise ValueError(f"unknown pass{'es' * (len(unknown) > 1)} {', '.join(unknown)} "
                         f"(passes: {', '.join(valid)})")
    return disabled


class Pipeline:
    """An ordered list of passes; `run(module)` returns True if any pass changed it."""

    def __init__(self, passes: Sequence[Pass | Fix], verify: bool = True,
                 dump_dir: str | os.PathLike | None = None,
                 disabled: Iterable[str] = frozenset()):
        self.passes = list(passes)
        self.verify = verify
        self.dump_dir = os.fspath(dump_dir) if dump_dir else None
        self.disabled = check_disabled(disabled, names_of(self.passes))
        self.log: list[PassRun] = []
        self._step = 0

    def run(self, module: ir.Module) -> bool:
        if self.dump_dir:
            prepare_dump_dir(self.dump_dir)
        self.log, self._step = [], 0
        self._dump(module, "import")
        if self.verify:
            _verify_after(module, "import")
        changed = False
        for p in self.passes:
            changed |= self._run_any(p, module)
        return changed

    def _run_any(self, p: Pass | Fix, module: ir.Module) -> bool:
        if isinstance(p, Fix):
            return self._run_fix(p, module)
        if p.name in self.disabled:
            return False
        return self._run_one(p, module)

    def _run_fix(self, fix: Fix, module: ir.Module) -> bool:
        changed = False
        for _ in range(fix.max_iterations):
            round_changed = False
            for p in fix.passes:
                round_changed |= self._run_any(p, module)
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
        stem = re.sub(r"[^\w.-]", "_", module.name)
        path = os.path.join(self.dump_dir, f"{stem}.{self._step:02d}.{pass_name}.txt")
        with open(path, "w") as f:
            f.write(ir.format_module(module))
        self._step += 1


def prepare_dump_dir(path: str) -> None:
    """Creates the dump directory if missing; a ValueError names it and says why it
    cannot hold dumps (an existing file, a parent that is a file, not writable)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"IR dump directory {path}: exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"IR dump directory {path}: cannot be created "
                         f"({e.strerror or e})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"IR dump directory {path}: not writable")


def _verify_after(module: ir.Module, pass_name: str) -> None:
    try:
        verify(module)
    except VerifyError as e:
        raise VerifyError(f"after pass {pass_name}: {e}") from e
