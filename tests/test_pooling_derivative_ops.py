"""Max pooling's own derivative operations inside a guarded function.

A loss that differentiates a pooling inside it (a gradient penalty, an inner
``jax.jvp``) holds ``select_and_gather_add`` (the JVP of ``reduce_window_max``:
each window's tangent at its argmax) and ``select_and_scatter_add`` (its
transpose).  Both select by the operand's values; a lane that is no window's
maximum is dropped.  They had no rule (reported as fully live): a ``sqrt(0)``
tangent at a losing lane kept its ``0 * inf``.  Oracle: the hand double where.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from double_where import assert_like_double_where, modes
from jax import lax

from hlo_guard import explain, guard

MODES = modes("grad", "jacfwd", "hessian", "jacrev_grad")


def pool(z):
    return lax.reduce_window(z, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "SAME")


#: a 1 x 4 x 3 x 1 image, four 2 x 2 windows (the SAME padding adds a column of
#: -inf); zeros lose in every window, whose maxima are 3, 4, 6 and 1
X = jnp.array([[1.0, 3.0, 0.0], [2.0, 0.0, 4.0], [0.0, 5.0, 0.0], [6.0, 0.0, 1.0]]).reshape(
    1, 4, 3, 1
)
WINNERS = np.zeros((1, 4, 3, 1), bool)
WINNERS[0, [0, 1, 3, 3], [1, 2, 0, 2], 0] = True


def tangent_at_the_maxima(x):
    """``select_and_gather_add``: the pooled tangent ``sqrt(x)`` is read at
    each window's argmax only."""
    return jnp.sum(jax.jvp(pool, (x,), (jnp.sqrt(x),))[1] * jnp.array([1.0, 2.0]))


def tangent_at_the_maxima_oracle(x):
    safe = jnp.where(WINNERS, x, 1.0)
    return jnp.sum(jax.jvp(pool, (x,), (jnp.sqrt(safe),))[1] * jnp.array([1.0, 2.0]))


def gradient_penalty(x):
    """``select_and_scatter_add``: the inner gradient is non-zero at each
    window's argmax only; the loss reads ``sqrt`` of it where it is positive."""
    g = jax.grad(lambda z: jnp.sum(pool(z) ** 2))(x)
    return jnp.sum(jnp.where(g > 0, jnp.sqrt(g), 0.0))


def gradient_penalty_oracle(x):
    g = jax.grad(lambda z: jnp.sum(pool(z) ** 2))(x)
    return jnp.sum(jnp.where(g > 0, jnp.sqrt(jnp.where(g > 0, g, 1.0)), 0.0))


CASES = {
    "select_and_gather_add": (tangent_at_the_maxima, tangent_at_the_maxima_oracle),
    "select_and_scatter_add": (gradient_penalty, gradient_penalty_oracle),
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_pooling_derivative_ops_select_like_the_pooling(case, mode):
    f, oracle = CASES[case]
    assert_like_double_where(MODES[mode], f, oracle, X)
    np.testing.assert_array_equal(np.asarray(guard(f)(X)), np.asarray(f(X)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_ops_are_followed_not_reported(case):
    f = CASES[case][0]
    report = explain(f, X)
    assert not report.unguarded
    assert report.guards


def test_the_gathered_tangent_leaks_without_the_guard():
    assert np.isnan(np.asarray(jax.grad(tangent_at_the_maxima)(X))).any()


def test_a_singular_tangent_at_a_window_maximum_stays_infinite():
    """A window of zeros: its maximum (the first 0, JAX's ``ge`` select) is
    chosen, and ``sqrt'(0)`` there is genuine; the window's other zeros lose."""
    x = jnp.array([[0.0, 0.0], [0.0, 0.0]]).reshape(1, 2, 2, 1)

    def f(x):
        return jnp.sum(jax.jvp(pool, (x,), (jnp.sqrt(x),))[1])

    g = np.asarray(jax.grad(guard(f))(x)).ravel()
    assert np.isinf(g[0])
    np.testing.assert_array_equal(g[1:], [0.0, 0.0, 0.0])
