"""Control instructions (hw/isa_control.py): register semantics and the back edge's cost."""
from __future__ import annotations

from jax_trn.hw.isa_control import BranchLess, RegisterAdd, back_edge, back_edge_ns
from jax_trn.hw.spec import NC_V2, NC_V3


def test_register_add_wraps_at_32_bits_and_branch_compares_signed():
    regs = {"r": 2**31 - 1}
    RegisterAdd("r", 1).apply(regs)
    assert regs["r"] == -(2**31)
    assert BranchLess("r", 0).taken(regs) and not BranchLess("r", -(2**31)).taken(regs)


def test_counted_loop_runs_its_trips():
    add, branch, _ = back_edge("r", 3, 10)
    regs, trips = {"r": 1}, 0
    while branch.taken(regs):
        add.apply(regs)
        trips += 1
    assert trips == 3 and regs["r"] == 10


def test_back_edge_is_three_static_overheads_at_the_slowest_clock():
    for spec in (NC_V2, NC_V3):
        slowest = min(dict(spec.clock_ghz).values())
        assert back_edge_ns(back_edge("r", 1, 4), spec) == 3 * spec.static_overhead / slowest
