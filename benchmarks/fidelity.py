"""The simulated NeuronCore against the published Trainium figures ("the paper's table").

    python benchmarks/fidelity.py

For each published figure: the published value, the simulated value and the error.
Measurements (jax_trn/hw/fidelity.py) run hw instructions directly on simulated
NeuronCores, no JAX; `tests/sim/test_fidelity.py` fails if a row drifts past +-10%.
Sources are sections of shared/reference/trainium-hardware.md.
"""
from __future__ import annotations

import time

from jax_trn.hw import fidelity


def _fmt(v: float | None) -> str:
    if v is None:
        return "pending"
    return f"{v:,.1f}" if abs(v) < 1e4 else f"{v:,.0f}"


def main() -> None:
    t0 = time.perf_counter()
    results = fidelity.table()
    wall = time.perf_counter() - t0
    head = (f"{'figure':<32} {'chip':<5} {'published':>10} {'simulated':>10} "
            f"{'error':>7}  {'unit':<12} source")
    print(head)
    print("-" * len(head))
    for row, value, err in results:
        e = "" if err is None else f"{err:+.1%}"
        mark = "" if err is None or abs(err) <= fidelity.TOLERANCE else "  <-- off"
        print(f"{row.figure:<32} {row.chip:<5} {_fmt(row.published):>10} "
              f"{_fmt(value):>10} {e:>7}  {row.unit:<12} {row.source}{mark}")
    errs = [abs(e) for _, _, e in results if e is not None]
    pending = sum(e is None for _, _, e in results)
    print(f"\n{len(errs)} rows measured, worst error {max(errs):.1%}, "
          f"{pending} pending; {wall:.2f} s of wall clock\n")
    print(fidelity.NOTES)


if __name__ == "__main__":
    main()
