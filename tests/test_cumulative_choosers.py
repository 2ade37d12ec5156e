"""Selections whose JVP multiplies by 0/1 coefficients: ``cummax``/``cummin``
(running maxima) and ``scatter-max``/``scatter-min`` (``segment_max``,
``x.at[i].max(u)``).  A lane no live output lane chooses has a structurally
zero derivative, as the losing side of ``max``.

``cummax`` read with ``cumsum``'s lane structure was fully live behind any
live output lane, so a ``log(0) = -inf`` that never wins kept its ``0 *
inf``: NaN in the gradient, no guard, no report (found 2026-11-26 trying
``lax`` cumulative ops as a user would); ``scatter-max`` had no rule (it was
reported).  Oracle: the hand double where, whose author knows which lanes
lose and moves them to a value that still loses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from double_where import assert_like_double_where, modes
from jax import lax

from hlo_guard import explain, guard

MODES = modes("grad", "jacfwd", "hessian", "jacfwd_jacfwd", "jacrev_grad")

#: log(0) = -inf at lanes 0 and 4: never a running maximum of the outputs
#: kept ([1:]); the running maxima are lanes 1, 3 and 5
X = jnp.array([0.0, 1.0, 0.5, 2.0, 0.0, 3.0], jnp.float32)
LOSING = np.array([True, False, True, False, True, False])


def running_max_of_log(x):
    return jnp.sum(lax.cummax(jnp.log(x))[1:] * jnp.arange(1.0, 6.0))


def running_max_of_log_oracle(x):
    safe = jnp.where(LOSING, 1e-3, x)  # log(1e-3) still loses everywhere
    return jnp.sum(lax.cummax(jnp.log(safe))[1:] * jnp.arange(1.0, 6.0))


def running_min_of_reciprocal(x):
    """``1 / 0 = inf`` never the running minimum: ``cummin``, from the right."""
    return jnp.sum(lax.cummin(1.0 / x[::-1], reverse=True)[:-1] * jnp.arange(1.0, 6.0))


def running_min_of_reciprocal_oracle(x):
    safe = jnp.where(LOSING, 1e-3, x)[::-1]  # 1 / 1e-3 still loses everywhere
    return jnp.sum(lax.cummin(1.0 / safe, reverse=True)[:-1] * jnp.arange(1.0, 6.0))


SEGMENTS = jnp.array([0, 0, 1, 1, 2, 2])


def segment_max_of_sqrt(x):
    """Each segment's maximum of ``sqrt``: lanes 0, 2 and 4 lose."""
    return jnp.sum(
        jax.ops.segment_max(jnp.sqrt(x), SEGMENTS, num_segments=3) * jnp.arange(1.0, 4.0)
    )


def segment_max_of_sqrt_oracle(x):
    safe = jnp.where(LOSING, 1e-4, x)
    return jnp.sum(
        jax.ops.segment_max(jnp.sqrt(safe), SEGMENTS, num_segments=3) * jnp.arange(1.0, 4.0)
    )


def indexed_max_of_log(x):
    """``.at[].max`` into a constant operand (-5, which never wins): the
    updates at lanes 0 and 4 are ``log(0) = -inf`` and lose, lane 2's
    ``log(0.5)`` loses to lane 3's ``log(2)``."""
    return jnp.sum(jnp.full(3, -5.0).at[SEGMENTS].max(jnp.log(x)) * jnp.arange(1.0, 4.0))


def indexed_max_of_log_oracle(x):
    safe = jnp.where(LOSING, 1e-3, x)
    return jnp.sum(jnp.full(3, -5.0).at[SEGMENTS].max(jnp.log(safe)) * jnp.arange(1.0, 4.0))


def segment_min_of_negative_sqrt(x):
    return jnp.sum(jax.ops.segment_min(-jnp.sqrt(x), SEGMENTS, num_segments=3))


def segment_min_of_negative_sqrt_oracle(x):
    safe = jnp.where(LOSING, 1e-4, x)
    return jnp.sum(jax.ops.segment_min(-jnp.sqrt(safe), SEGMENTS, num_segments=3))


CASES = {
    "cummax": (running_max_of_log, running_max_of_log_oracle),
    "cummin_reverse": (running_min_of_reciprocal, running_min_of_reciprocal_oracle),
    "segment_max": (segment_max_of_sqrt, segment_max_of_sqrt_oracle),
    "at_max": (indexed_max_of_log, indexed_max_of_log_oracle),
    "segment_min": (segment_min_of_negative_sqrt, segment_min_of_negative_sqrt_oracle),
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_losing_lanes_of_a_running_selection_are_structural_zeros(case, mode):
    f, oracle = CASES[case]
    assert np.isnan(np.asarray(MODES[mode](f)(X))).any()  # the leak is real
    assert_like_double_where(MODES[mode], f, oracle, X)
    np.testing.assert_array_equal(np.asarray(guard(f)(X)), np.asarray(f(X)))


def test_a_winning_singular_lane_stays_infinite():
    """A running maximum that *is* singular keeps its derivative: ``sqrt``'s
    inf at a lane that is the maximum of a kept output is genuine."""

    def f(x):
        return jnp.sum(lax.cummax(-jnp.sqrt(x))[1:])

    x = jnp.array([0.0, 1.0, 4.0], jnp.float32)  # -sqrt: 0 wins every prefix
    g = np.asarray(jax.grad(guard(f))(x))
    assert np.isinf(g[0])
    np.testing.assert_array_equal(g[1:], [0.0, 0.0])


@pytest.mark.parametrize("case", ["cummax", "segment_max"])
def test_the_report_names_the_selection(case):
    report = explain(CASES[case][0], X)
    assert not report.unguarded
    op = "scatter-max" if case == "segment_max" else "cummax"
    assert any(op in str(site.origins) for site in report.guards)


@pytest.mark.parametrize("mode", ["grad", "jacfwd", "hessian"])
def test_a_losing_scatter_max_operand_with_many_updates_is_dead(mode):
    """JAX's own coefficient of a losing ``scatter-max`` operand lane is
    ``1 + 11 * (-1 / 11)``, a few ulp off zero: plain JAX gives
    ``-6e-8 * log'(0) = -inf``, and a mask from JAX's VJP read the lane as
    live (unguarded, unreported).  The operand's mask is decided by value."""
    ids = jnp.zeros(11, jnp.int32)

    def f(v):
        return jnp.sum(jnp.log(v[:1]).at[ids].max(1.0 + v[1:]))

    def oracle(v):
        loses = jnp.array([True])  # log(0) = -inf never beats 1 + v
        return jnp.sum(jnp.log(jnp.where(loses, 1.0, v[:1])).at[ids].max(1.0 + v[1:]))

    v = jnp.concatenate([jnp.zeros(1), jnp.arange(11.0)])
    assert not np.isfinite(np.asarray(jax.grad(f)(v))[0])  # JAX's own derivative
    d = MODES[mode]
    np.testing.assert_array_equal(np.asarray(d(guard(f))(v)), np.asarray(d(oracle)(v)))


def test_a_winning_singular_segment_lane_stays_infinite():
    """``-sqrt(0) = 0`` is its segment's maximum: ``sqrt'(0)`` there is
    genuine; the losing ``-sqrt(1)`` gets an exact 0."""

    def f(x):
        return jnp.sum(jax.ops.segment_max(-jnp.sqrt(x), jnp.array([0, 0]), num_segments=1))

    g = np.asarray(jax.grad(guard(f))(jnp.array([0.0, 1.0])))
    assert np.isinf(g[0]) and g[1] == 0.0
