"""Unit tests of :mod:`hlo_guard.jax_frontend.rules.shifted_exp`: which
``exp``/``log`` equations count as bounded by a max shift."""

import jax
import jax.numpy as jnp
import pytest

from hlo_guard.jax_frontend.graph import JaxprGraph
from hlo_guard.jax_frontend.rules.shifted_exp import bounded_by_max_shift

Z = jnp.ones((3, 4))


def _bounded(f, *args):
    """{primitive name: [bounded?, ...]} over the exp/log equations of ``f``,
    inside calls too, in order."""
    found: dict = {}

    def visit(graph):
        for node, eqn in enumerate(graph.eqns):
            name = eqn.primitive.name
            if name in ("exp", "log"):
                found.setdefault(name, []).append(bounded_by_max_shift(graph, eqn))
            if name in ("jit", "pjit", "closed_call"):
                visit(graph.call_body_graph(node))

    visit(JaxprGraph(jax.make_jaxpr(f)(*args).jaxpr))
    return found


def test_log_softmax_and_logsumexp_are_bounded():
    assert _bounded(jax.nn.log_softmax, Z) == {"exp": [True], "log": [True]}
    assert _bounded(lambda z: jax.nn.logsumexp(z, -1), Z) == {"exp": [True], "log": [True]}


@pytest.mark.parametrize(
    "f,expected",
    [
        # not shifted: the exp may overflow, the sum underflow to 0
        (lambda z: jnp.log(jnp.sum(jnp.exp(z), -1)), {"exp": [False], "log": [False]}),
        # shifted by the maximum of another value, or by the minimum
        (lambda z: jnp.exp(z - jnp.max(z + 1.0, -1, keepdims=True)), {"exp": [False]}),
        (lambda z: jnp.exp(z - jnp.min(z, -1, keepdims=True)), {"exp": [False]}),
        # a softmax's exp is shifted, but one of its lanes may underflow to 0
        (lambda z: jnp.log(jax.nn.softmax(z)), {"exp": [True], "log": [False]}),
    ],
    ids=["unshifted", "other value", "minimum", "log of softmax"],
)
def test_anything_else_is_not(f, expected):
    assert _bounded(f, Z) == expected


def test_a_sum_over_other_axes_than_the_maximum_is_not():
    """``sum(exp(z - max(z, 1)), 0)``: the maximal lane of each row is in a
    different column sum, so a column sum can be below 1."""

    def f(z):
        shifted = jnp.exp(z - jax.lax.stop_gradient(jnp.max(z, 1, keepdims=True)))
        return jnp.log(jnp.sum(shifted, 0))

    assert _bounded(f, Z) == {"exp": [True], "log": [False]}
