"""A plain-text table for the benchmarks that print one (simspeed.py, models.py)."""
from __future__ import annotations


def print_table(title: str, rows: list[list[str]]) -> None:
    """`title`, then `rows` (the first is the header, underlined) in left-aligned columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(title)
    for i, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
