"""Sort keys from a sort op's comparator region (sort.py lowers the sort).

The comparator is recognised structurally (`keys`): the lexicographic form `lax.sort`
emits for `num_keys` keys,

    lt(k0) or (eq(k0) and (lt(k1) or (eq(k1) and ... lt(kn))))

where each lt is compare(LT | GT, f(a_i), f(b_i)) of operand i's two block arguments
(GT, or the arguments swapped: descending) and f is the identity or JAX's float
canonicalisation select(x != x, NaN, select(x == 0, 0, x)). The compare type gives the
order: SIGNED / UNSIGNED for integers, TOTALORDER for floats (with the canonicalisation:
-0 == 0 and every NaN equal and last, as `jnp.sort`; without: IEEE totalOrder, -NaN
first and -0 < 0, as `lax.top_k`'s GT). A FLOAT compare is taken as the canonical order.
Anything else is a LoweringError naming the op.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hlo_passes import ir

from .errors import LoweringError

__all__ = ["Key", "keys"]


@dataclass(frozen=True)
class Key:
    operand: int
    descending: bool
    order: str          # "signed" | "unsigned" | "float" (canonical) | "total"


# --- the comparator ------------------------------------------------------------------------

class _Comparator:
    def __init__(self, op: ir.Op):
        self.op = op
        block = op.regions[0].block
        self.args = [v.name for v in block.args]
        self.defs = {r.name: o for o in block.ops for r in o.results}
        self.consts = {o.results[0].name: o.attrs.get("value") for o in block.ops
                       if o.kind == "constant"}
        self.ret = block.terminator

    def fail(self, why: str):
        raise LoweringError(f"sort comparator not recognised ({why}); supported: the "
                            f"lexicographic LT/GT comparators lax.sort emits "
                            f"({self.op.describe()})")

    def _def(self, v, kind: str):
        o = self.defs.get(v.name)
        return o if o is not None and o.kind == kind else None

    def _const(self, v, test) -> bool:
        """A constant passing `test`; a value from outside the region (JAX hoists the
        comparator's constants into the enclosing function, where the region cannot see
        their values) is accepted on the structure alone."""
        if v.name in self.args:
            return False
        if v.name in self.defs and v.name not in self.consts:
            return False
        value = self.consts.get(v.name)
        if value is None:
            return True
        try:
            return bool(test(float(value.reshape(-1)[0])))
        except (AttributeError, TypeError, ValueError):
            return False

    def _cmp(self, v, direction: str, a, b) -> bool:
        o = self._def(v, "compare")
        return (o is not None and o.attrs.get("comparison_direction") == direction
                and [x.name for x in o.operands] == [a.name, b.name])

    def source(self, v) -> tuple[int, bool]:
        """(block argument index, canonicalised) of a compared value."""
        if v.name in self.args:
            return self.args.index(v.name), False
        outer = self._def(v, "select")
        if outer is not None:
            c1, nan, inner_v = outer.operands
            inner = self._def(inner_v, "select")
            if inner is not None:
                c0, zero, a = inner.operands
                if (a.name in self.args and self._cmp(c1, "NE", a, a)
                        and self._const(nan, math.isnan) and self._const(zero, lambda z: z == 0)
                        and self._def(c0, "compare") is not None
                        and self._def(c0, "compare").attrs.get("comparison_direction") == "EQ"
                        and [x.name for x in self._def(c0, "compare").operands]
                        == [a.name, zero.name]):
                    return self.args.index(a.name), True
        self.fail("a compared value is neither an argument nor JAX's float canonicalisation")

    def less(self, v) -> tuple[Key, frozenset] | None:
        o = self._def(v, "compare")
        if o is None or o.attrs.get("comparison_direction") not in ("LT", "GT"):
            return None
        (ia, ca), (ib, cb) = (self.source(x) for x in o.operands)
        if ia // 2 != ib // 2 or ia == ib or ca != cb:
            self.fail("a compare does not take one operand's two arguments alike")
        descending = (o.attrs["comparison_direction"] == "GT") == (ia < ib)
        kind = o.attrs.get("compare_type") or ""
        order = {"SIGNED": "signed", "UNSIGNED": "unsigned", "FLOAT": "float",
                 "TOTALORDER": "float" if ca else "total"}.get(kind)
        if order is None:
            self.fail(f"compare type {kind or 'unset'}")
        return Key(ia // 2, descending, order), frozenset(x.name for x in o.operands)

    def parse(self, v) -> list[Key]:
        found = self.less(v)
        if found is not None:
            return [found[0]]
        o = self._def(v, "or")
        if o is None or len(o.operands) != 2:
            self.fail("expected compare or an or of compares")
        for first, rest in (o.operands, o.operands[::-1]):
            found = self.less(first)
            conj = self._def(rest, "and")
            if found is None or conj is None:
                continue
            for eq, tail in (conj.operands, conj.operands[::-1]):
                e = self._def(eq, "compare")
                if (e is not None and e.attrs.get("comparison_direction") == "EQ"
                        and frozenset(x.name for x in e.operands) == found[1]):
                    return [found[0]] + self.parse(tail)
        self.fail("an or that is not lt(k) or (eq(k) and ...)")


def keys(op: ir.Op) -> list[Key]:
    """The sort keys of a sort op's comparator, most significant first."""
    c = _Comparator(op)
    if c.ret.kind not in ("return", "func.return") or len(c.ret.operands) != 1:
        c.fail("the region does not return one value")
    return c.parse(c.ret.operands[0])
