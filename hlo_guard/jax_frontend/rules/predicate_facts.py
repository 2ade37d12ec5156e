"""What a ``where``'s predicate says about a value in the lanes it picks.

``where(n2 > 0, p / sqrt(n2), 0)`` takes the quotient only where ``n2`` is
positive; jax_md's smooth cutoff ``where(dr < r_c, poly(dr), 0)`` is zero
only where ``dr >= r_c > 0``, so the ``sigma / dr`` it multiplies has a
finite derivative in every lane it zeroes.  The reports
(:mod:`where_made_zeros`) ask this to tell such code from a real ``0 / 0``
or ``0 * inf``: a comparison of a value against a constant, read off the
predicate beneath its lane copies, gives a :class:`Fact` -- "this value is
nonzero (positive) in these lanes" -- and a singular operation's operand is
matched against the facts through the operations that keep a value nonzero
(``sqrt``, ``abs``, ``neg``) and the same lane copies.

Overflow near the bound is not considered (``1 / x`` at ``x = 1e-30`` in
float32): the lanes the user's own ``where`` keeps have the same overflow,
and the reports look for the singular point itself.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from hlo_guard.jax_frontend.graph import is_bool, is_literal
from passes.comparisons import BOUNDED_ABOVE_WHEN, COMPARISONS, IMPLIED_WHEN

#: lane-wise operations under which a value is nonzero exactly where its
#: operand is (``sqrt`` of a positive value is positive)
_ZERO_PRESERVING = frozenset({"sqrt", "abs", "neg"})
#: copies that move lanes; the predicate must have made the same ones
LANE_COPIES = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims"})


class Fact(NamedTuple):
    """``value`` (in ``graph``) is nonzero -- and ``positive`` if so -- in the
    lanes of a selection, reached from them by the lane ``copies``; or, when
    ``bounded``, only that it is at most a finite constant there."""

    graph: Any
    value: Any
    copies: tuple
    positive: bool
    bounded: bool = False


def zero_preserving_chain(graph, atom, copies: tuple = (), depth: int = 8) -> list:
    """``(graph, value, copies, same_sign)`` for ``atom`` and each value it is
    computed from by zero-preserving operations and lane copies: ``atom`` is
    nonzero wherever any of them is, and positive wherever one with
    ``same_sign`` is (only copies and ``sqrt`` between).  ``copies`` are the
    lane copies between that value and ``atom``'s reader (``copies`` given:
    the reader's own implicit broadcast)."""
    chain = []
    same_sign = True
    for _ in range(depth):
        graph, atom = graph.value_source(atom)
        chain.append((graph, atom, copies, same_sign))
        found = None if is_literal(atom) else graph.producer(atom)
        if found is None:
            break
        eqn = graph.eqns[found[0]]
        name = eqn.primitive.name
        if name in LANE_COPIES:
            copies = (copy_key(eqn), *copies)
        elif name in _ZERO_PRESERVING:
            same_sign = same_sign and name == "sqrt"
        else:
            break
        atom = eqn.invars[0]
    return chain


def through_copies(graph, atom):
    """(graph, the equation that computes ``atom`` beneath lane copies, the
    copies' keys innermost first) -- the comparison a ``where``'s broadcast
    predicate is; (graph, None, ()) when there is none."""
    passed: list = []
    found = graph.beneath(atom, LANE_COPIES, passed=passed)
    if found is None:
        return graph, None, ()
    return found[0], found[1], tuple(copy_key(e) for e in reversed(passed))


def copy_key(eqn):
    return (
        eqn.primitive.name,
        tuple(eqn.outvars[0].aval.shape),
        tuple(eqn.params.get("broadcast_dimensions", ()) or ()),
        tuple(eqn.params.get("dimensions", ()) or ()),
    )


def case_facts(graph, select, case: int, bounds: bool = False) -> tuple[Fact, ...]:
    """What holds in the lanes where ``select`` -- a two-way ``select_n`` on
    a boolean, or a boolean converted to a number (the ``select_n(m, 0, 1)``
    it stands for) -- takes its case ``case`` (0: where the predicate is
    false), from a comparison of a value against a constant beneath the
    predicate's lane copies.  ``bounds``: also the ``bounded`` facts (asked
    for the zeroing selection only: on every ``where`` a walk passes they
    would multiply the fact sets it tells apart, for an ``exp`` it rarely
    meets)."""
    name = select.primitive.name
    if name == "select_n" and len(select.invars) != 3:
        return ()
    if name not in ("select_n", "convert_element_type") or not is_bool(select.invars[0]):
        return ()
    cmp_graph, cmp, pred_copies = through_copies(graph, select.invars[0])
    if cmp is None or cmp.primitive.name not in COMPARISONS:
        return ()

    def constant(x, test) -> bool:
        val = cmp_graph.known_constant(x)
        return val is not None and bool(np.all(test(np.asarray(val))))

    facts: list[Fact] = []
    for op, side, test in BOUNDED_ABOVE_WHEN[case == 1] if bounds else ():
        if cmp.primitive.name == op and constant(cmp.invars[1 - side], test):
            facts.append(Fact(cmp_graph, cmp.invars[side], pred_copies, False, bounded=True))
    for op, side, test, positive in IMPLIED_WHEN[case == 1]:
        if cmp.primitive.name != op or not constant(cmp.invars[1 - side], test):
            continue
        # the compared value may itself be a zero-preserving function of
        # another (``sqrt(n2) != 0`` says ``n2 != 0``)
        for g, v, copies, same_sign in zero_preserving_chain(cmp_graph, cmp.invars[side]):
            if not copies:
                facts.append(Fact(g, v, pred_copies, positive and same_sign))
    return tuple(facts)


def implied_nonzero(graph, atom, implicit: tuple, facts, positive: bool = False) -> bool:
    """Whether ``facts`` make ``atom`` (read with the reader's ``implicit``
    broadcast) nonzero -- ``positive``: positive -- in their lanes."""
    if not facts:
        return False
    for g, v, copies, same_sign in zero_preserving_chain(graph, atom, implicit):
        if positive and not same_sign:
            break
        for fact in facts:
            if (
                not fact.bounded
                and fact.copies == copies
                and (fact.positive or not positive)
                and fact.graph.same_value(fact.value, g, v)
            ):
                return True
    return False


def implied_bounded_above(graph, atom, implicit: tuple, facts) -> bool:
    """Whether ``facts`` bound ``atom`` (read with the reader's ``implicit``
    broadcast) above by a finite constant in their lanes."""
    return any(
        fact.bounded and fact.copies == implicit and fact.graph.same_value(fact.value, graph, atom)
        for fact in facts
    )


def implicit_broadcast(operand, out) -> tuple | None:
    """The copy key of the size-1 broadcast a lane-wise op makes of
    ``operand`` to its output ``out`` (``div`` of ``[n, 1]`` by ``[n, k]``),
    ``()`` when the shapes agree, None when they do not line up."""
    shape = tuple(out.aval.shape)
    own = tuple(getattr(operand.aval, "shape", ()))
    if own == shape:
        return ()
    if len(own) != len(shape):
        return None
    return (("broadcast_in_dim", shape, tuple(range(len(shape))), ()),)
