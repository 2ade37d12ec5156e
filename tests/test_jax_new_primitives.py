"""Primitives that jax 0.11/0.12 added and that user code reaches through
``jnp``/``lax`` (``jnp.log2`` binds ``log2`` from 0.11 on, ``lax.polynomial``,
``lax.one_minus_square``).  Each one under a ``where`` must be guarded like
its jax 0.10 equivalent: checked against the hand double-where in grad,
hessian and jacfwd, with a genuine singularity on a taken lane staying
non-finite.  On a JAX without the primitive the test skips, naming it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hlo_guard
from hlo_guard import explain

X = jnp.array([-2.0, -1.0, 0.0, 0.25, 1.0, 3.0])


def _needs(name):
    def has():
        jaxpr = jax.make_jaxpr(CASES[name][0])(X)
        return any(e.primitive.name == name for e in jaxpr.jaxpr.eqns)

    try:
        present = has()
    except AttributeError:  # lax.polynomial / lax.one_minus_square missing
        present = False
    if not present:
        pytest.skip(f"jax {jax.__version__} has no '{name}' primitive (a newer JAX has)")


#: name -> (the singular op, a safe argument for the double where's inner where)
CASES = {
    "log2": (lambda v: jnp.log2(v), 1.0),
    "one_minus_square": (lambda v: jnp.sqrt(lax.one_minus_square(v)), 0.0),
    "polynomial": (lambda v: jnp.sqrt(lax.polynomial(v, [0.0, 1.0, 1.0])), 1.0),
}


def _pred(name, v):
    if name == "one_minus_square":
        return jnp.abs(v) < 1.0
    return v > 0.0


@pytest.mark.parametrize("name", sorted(CASES))
def test_new_primitive_under_where_matches_the_double_where(name):
    _needs(name)
    op, safe = CASES[name]

    def f(v):
        return jnp.sum(jnp.where(_pred(name, v), op(v), 0.0))

    def oracle(v):
        p = _pred(name, v)
        return jnp.sum(jnp.where(p, op(jnp.where(p, v, safe)), 0.0))

    g = hlo_guard.guard(f)
    np.testing.assert_array_equal(g(X), f(X))
    plain = np.asarray(jax.grad(f)(X))
    assert not np.isfinite(plain).all(), "the case must leak in plain JAX"
    np.testing.assert_array_equal(jax.grad(g)(X), jax.grad(oracle)(X))
    np.testing.assert_array_equal(jax.hessian(g)(X), jax.hessian(oracle)(X))
    assert not explain(f, X).unguarded


def test_log2_genuine_singularity_on_a_taken_lane_stays_infinite():
    _needs("log2")
    f = lambda v: jnp.sum(jnp.where(v >= 0.0, jnp.log2(v), 0.0))  # noqa: E731
    g = jax.grad(hlo_guard.guard(f))(X)
    assert np.isinf(np.asarray(g)[2])  # log2'(0) on a taken lane
    assert np.asarray(g)[0] == 0.0 and np.asarray(g)[1] == 0.0
