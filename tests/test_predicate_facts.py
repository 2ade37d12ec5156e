"""Unit tests of :mod:`predicate_facts`: what a ``where``'s predicate says
about the compared value in the lanes the ``where`` takes a case.  Checked
against lanes sampled on both sides of each bound, the bound itself included:
every claim must hold on every sampled lane the case takes."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hlo_guard.jax_frontend.graph import JaxprGraph
from hlo_guard.jax_frontend.rules.predicate_facts import (
    case_facts,
    implied_bounded_above,
    implied_nonzero,
)

_COMPARE = {"gt": lax.gt, "ge": lax.ge, "lt": lax.lt, "le": lax.le, "eq": lax.eq, "ne": lax.ne}
_NUMPY = {"gt": np.greater, "ge": np.greater_equal, "lt": np.less, "le": np.less_equal,
          "eq": np.equal, "ne": np.not_equal}  # fmt: skip
_SAMPLES = np.array([-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0], np.float32)


def _claims(op, side, c, case, bounds=False):
    """(nonzero, positive) the facts give for ``x`` in the lanes where
    ``select_n(op(x, c) or op(c, x), a, b)`` takes ``case`` (``bounds``: and
    whether ``x`` is bounded above there, a third element)."""

    def f(x, a, b):
        pred = _COMPARE[op](x, jnp.float32(c)) if side == 0 else _COMPARE[op](jnp.float32(c), x)
        return lax.select_n(pred, a, b)

    z = jnp.zeros(3, jnp.float32)
    jaxpr = jax.make_jaxpr(f)(z, z, z).jaxpr
    graph = JaxprGraph(jaxpr)
    select = next(e for e in jaxpr.eqns if e.primitive.name == "select_n")
    facts = case_facts(graph, select, case, bounds=bounds)
    x = jaxpr.invars[0]
    claims = (
        implied_nonzero(graph, x, (), facts),
        implied_nonzero(graph, x, (), facts, positive=True),
    )
    return (*claims, implied_bounded_above(graph, x, (), facts)) if bounds else claims


_GRID = list(itertools.product(sorted(_COMPARE), (0, 1), (-1.0, 0.0, 1.5), (0, 1)))


@pytest.mark.parametrize("op,side,c,case", _GRID)
def test_every_claim_holds_on_the_lanes_the_case_takes(op, side, c, case):
    nonzero, positive = _claims(op, side, c, case)
    x = _SAMPLES
    pred = _NUMPY[op](x, c) if side == 0 else _NUMPY[op](c, x)
    taken = x[pred == bool(case)]
    if nonzero:
        assert np.all(taken != 0), (op, side, c, case, taken)
    if positive:
        assert nonzero and np.all(taken > 0), (op, side, c, case, taken)


@pytest.mark.parametrize("op,side,c,case", _GRID)
def test_every_bound_holds_on_the_lanes_the_case_takes(op, side, c, case):
    """The "bounded above" facts (for ``exp``) hold where claimed, are made
    by the comparisons that bound, and never add a nonzero claim."""
    nonzero, positive, bounded = _claims(op, side, c, case, bounds=True)
    assert (nonzero, positive) == _claims(op, side, c, case)
    x = _SAMPLES
    pred = _NUMPY[op](x, c) if side == 0 else _NUMPY[op](c, x)
    taken = x[pred == bool(case)]
    if bounded:
        assert np.all(taken <= c), (op, side, c, case, taken)
    # where the taken lanes are bounded by c and the comparison says so
    bounding = {(1, 0): ("lt", "le", "eq"), (1, 1): ("gt", "ge", "eq"),
                (0, 0): ("ge", "gt", "ne"), (0, 1): ("le", "lt", "ne")}  # fmt: skip
    assert bounded == (op in bounding[(case, side)]), (op, side, c, case)


@pytest.mark.parametrize(
    "op,side,c,case,expected",
    [
        ("gt", 0, 0.0, 1, (True, True)),  # where(x > 0, f(x), 0)
        ("lt", 1, 0.0, 1, (True, True)),  # where(0 < x, ...)
        ("lt", 0, 1.5, 0, (True, True)),  # zero beyond a cutoff: not (x < 1.5)
        ("le", 0, 0.0, 0, (True, True)),  # where(x <= 0, 0, f(x))
        ("ne", 0, 0.0, 1, (True, False)),
        ("eq", 0, 0.0, 0, (True, False)),
        ("gt", 0, -1.0, 1, (False, False)),  # x > -1 allows 0
        ("ge", 0, 0.0, 1, (False, False)),  # x >= 0 allows 0
        ("gt", 0, 0.0, 0, (False, False)),  # the other case
    ],
)
def test_the_usual_predicates_are_recognised(op, side, c, case, expected):
    assert _claims(op, side, c, case) == expected


def test_a_value_the_predicate_does_not_compare_gets_no_claim():
    def f(x, y, a):
        return lax.select_n(lax.gt(x, 0.0), a, 1.0 / y)

    z = jnp.ones(3, jnp.float32)
    jaxpr = jax.make_jaxpr(f)(z, z, z).jaxpr
    graph = JaxprGraph(jaxpr)
    select = next(e for e in jaxpr.eqns if e.primitive.name == "select_n")
    assert not implied_nonzero(graph, jaxpr.invars[1], (), case_facts(graph, select, 1))


def test_a_sqrt_of_the_compared_value_is_positive_where_it_is():
    """``x > 0`` makes ``sqrt(x)`` positive (a zero-preserving, sign-keeping
    operation); ``abs(x) > 0`` makes ``x`` nonzero, not positive."""

    def f(x, a):
        s = jnp.sqrt(x)
        t = jnp.abs(x)
        return lax.select_n(lax.gt(x, 0.0), a, s), lax.select_n(lax.gt(t, 0.0), a, a), s

    z = jnp.ones(3, jnp.float32)
    jaxpr = jax.make_jaxpr(f)(z, z).jaxpr
    graph = JaxprGraph(jaxpr)
    first, second = [e for e in jaxpr.eqns if e.primitive.name == "select_n"]
    sqrt_x = next(e for e in jaxpr.eqns if e.primitive.name == "sqrt").outvars[0]
    x = jaxpr.invars[0]
    assert implied_nonzero(graph, sqrt_x, (), case_facts(graph, first, 1), positive=True)
    abs_facts = case_facts(graph, second, 1)
    assert implied_nonzero(graph, x, (), abs_facts)
    assert not implied_nonzero(graph, x, (), abs_facts, positive=True)
