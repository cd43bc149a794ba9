"""A plain-text table for the benchmarks that print one (simspeed.py, models.py,
kernels.py), and the rows-by-systems table of measures against targets models.py and
kernels.py print."""
from __future__ import annotations


def print_table(title: str, rows: list[list[str]]) -> None:
    """`title`, then `rows` (the first is the header, underlined) in left-aligned columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(title)
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))


def measures_table(title: str, first: str, names, systems, measure, targets: dict,
                   failed_met=lambda system: False, width: int = 60) -> None:
    """One row per name, one column per system: `measure(name, system)` gives an object
    with `.text` and `.met` (True / False / None: no target there); a measure that
    raises shows "cannot run: ..." with `failed_met(system)`. The last columns: the
    name's target and the verdict over every system's `.met`."""
    import sys
    table = [[first] + list(systems) + ["target", "verdict"]]
    for name in names:
        cells, verdicts = [name], []
        for system in systems:
            try:
                m = measure(name, system)
                text, met = m.text, m.met
            except Exception as e:     # noqa: BLE001 (a row that cannot run says why)
                text = f"cannot run: {type(e).__name__}: {str(e).splitlines()[0][:width]}"
                met = failed_met(system)
            cells.append(text)
            if met is not None:
                verdicts.append(met)
        verdict = "-" if not verdicts else "met" if all(verdicts) else "NOT met"
        table.append(cells + [targets[name], verdict])
        print(f"  measured {name}", file=sys.stderr, flush=True)
    print_table(title, table)
