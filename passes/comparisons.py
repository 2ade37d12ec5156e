"""What a comparison against a constant says about the compared value, for
either front end's reports: in the lanes where ``d > c`` holds with ``c >=
0``, ``d`` is positive; where ``d != 0`` holds, nonzero; where ``d <= c`` does
*not* hold (``c >= 0``), positive again.  The reports use it to tell a
singular operation kept away from its singular point by a ``where``'s
predicate (``where(dr < r_c, poly(dr), 0) * (sigma / dr)``: zero only where
``dr >= r_c > 0``) from a real ``0 * inf``.  A NaN compared value satisfies
only the "does not hold" rows; its lanes are NaN in the forward pass already.
"""

from __future__ import annotations


def _nonneg(c):
    return c >= 0


def _positive(c):
    return c > 0


def _zero(c):
    return c == 0


def _finite(c):
    return abs(c) < float("inf")


#: ``(comparison, side, test of the constant on the other side, positive)``:
#: in the lanes where the comparison holds, operand ``side`` is nonzero --
#: and positive too when the last is True: ``d > c >= 0``, ``d != 0``.
#: Comparisons are named as JAX's primitives (``gt``: ``operand 0 > operand
#: 1``); a front end maps its own names.
_HOLDS = (
    ("gt", 0, _nonneg, True),
    ("lt", 1, _nonneg, True),
    ("ge", 0, _positive, True),
    ("le", 1, _positive, True),
    ("ne", 0, _zero, False),
    ("ne", 1, _zero, False),
)
#: a comparison that does not hold is its negation that does (``not (d <=
#: c)`` is ``d > c``; a NaN lane satisfies every negation, and is NaN in the
#: forward pass already)
_NEGATION = {"gt": "le", "lt": "ge", "ge": "lt", "le": "gt", "ne": "eq", "eq": "ne"}

#: per "in the lanes where the predicate holds" (else: where it does not),
#: the rows of :data:`_HOLDS` that apply
IMPLIED_WHEN = {
    True: _HOLDS,
    False: tuple((_NEGATION[op], side, test, positive) for op, side, test, positive in _HOLDS),
}

#: ``(comparison, side, test of the constant)``: in the lanes where the
#: comparison holds, operand ``side`` is at most a finite constant (``p ==
#: 0``, ``d < c``, ``c > d``).  ``exp`` of such a value, or an ``exp`` whose
#: result is such a value, is finite there with a finite derivative: distrax's
#: ``mul_exp`` zeroes its factor where ``exp(logp) == 0``.
_BOUNDED_HOLDS = (
    ("lt", 0, _finite),
    ("le", 0, _finite),
    ("gt", 1, _finite),
    ("ge", 1, _finite),
    ("eq", 0, _finite),
    ("eq", 1, _finite),
)
BOUNDED_ABOVE_WHEN = {
    True: _BOUNDED_HOLDS,
    False: tuple((_NEGATION[op], side, test) for op, side, test in _BOUNDED_HOLDS),
}

COMPARISONS = frozenset({"gt", "ge", "lt", "le", "eq", "ne"})
