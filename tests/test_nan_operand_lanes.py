"""A NaN operand of ``max``/``min``/``clamp``/``reduce_max`` is a taken path.

XLA propagates a NaN through these selections, so a NaN result lane holds
the NaN operand's value, and its gradient must stay NaN (contract 3), as
plain JAX's is.  JAX's own indicators (``x == ans``, strict clamp bounds) are
false for NaN on every side; read literally they made every operand of such
a lane dead, the guards zeroed its gradient under a NaN loss, and reverse
and forward mode disagreed (``log(maximum(nan, eps))``: grad 0, jacfwd NaN).
Found 2026-11-28 by a user-style hunt: the angle between two vectors,
``arccos(clip(dot / (|a| |b|), -1, 1))``, with a zero vector.

Oracle: the hand double where that moves each losing lane to a value that
still loses, and leaves a NaN lane alone (so its NaN stays, as in plain JAX).
Each function also has a losing lane with an infinite local derivative, so
the guards' work on the ordinary lanes is checked in the same call.
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

NAN = np.float32(np.nan)
#: lane 0 NaN (taken), lanes 1 and 3 lose (sqrt'(0) = inf at lane 1), lane 2 wins
X = jnp.array([NAN, 0.0, 4.0, 1e-4], jnp.float32)
LOSING = np.array([False, True, False, True])


def _still_losing(x):
    """sqrt(1e-4) = 0.01: below every bound used here, with a finite derivative."""
    return jnp.where(LOSING, 1e-4, x)


def log_of_maximum(x):
    return jnp.sum(jnp.log(jnp.maximum(jnp.sqrt(x), 0.1)))


def log_of_maximum_oracle(x):
    return jnp.sum(jnp.log(jnp.maximum(jnp.sqrt(_still_losing(x)), 0.1)))


def log_of_minimum(x):
    return jnp.sum(jnp.log(-jnp.minimum(-jnp.sqrt(x), -0.1)))


def log_of_minimum_oracle(x):
    return jnp.sum(jnp.log(-jnp.minimum(-jnp.sqrt(_still_losing(x)), -0.1)))


def log_of_clip(x):
    """``jnp.clip``: a ``maximum`` then a ``minimum``."""
    return jnp.sum(jnp.log(jnp.clip(jnp.sqrt(x), 0.1, 1.5)))


def log_of_clip_oracle(x):
    return jnp.sum(jnp.log(jnp.clip(jnp.sqrt(_still_losing(x)), 0.1, 1.5)))


def log_of_clamp(x):
    """``lax.clamp``: one primitive, with strict bounds in its JVP."""
    return jnp.sum(jnp.log(lax.clamp(0.1, jnp.sqrt(x), 1.5)))


def log_of_clamp_oracle(x):
    return jnp.sum(jnp.log(lax.clamp(0.1, jnp.sqrt(_still_losing(x)), 1.5)))


def clamp_bound_nan(x):
    """A computed lower bound that is NaN (``sqrt(-1)``) is what ``clamp``
    returns: its lane is taken."""
    return jnp.sum(jnp.log(lax.clamp(jnp.sqrt(x - 1.0), jnp.full_like(x, 0.5), 2.0)))


def clamp_bound_nan_oracle(x):
    # lane 1 (x = 1): sqrt(0) = 0 loses to 0.5, moved to 1.01 (sqrt 0.1, still losing)
    safe = jnp.where(jnp.array([False, True, False, False]), 1.01, x)
    return jnp.sum(jnp.log(lax.clamp(jnp.sqrt(safe - 1.0), jnp.full_like(x, 0.5), 2.0)))


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
@pytest.mark.parametrize(
    "f, oracle",
    [
        (log_of_maximum, log_of_maximum_oracle),
        (log_of_minimum, log_of_minimum_oracle),
        (log_of_clip, log_of_clip_oracle),
        (log_of_clamp, log_of_clamp_oracle),
    ],
    ids=["maximum", "minimum", "clip", "clamp"],
)
def test_nan_lane_keeps_its_nan_and_losing_lanes_are_guarded(mode, f, oracle):
    assert_like_double_where(mode, f, oracle, X)
    got = np.asarray(jax.grad(guard(f))(X))
    assert np.isnan(got[0]) and np.isfinite(got[1:]).all()


#: row 0 holds a NaN: its maximum is NaN, so the NaN element is taken and the
#: finite one lost to it; rows 1 and 2 each have a losing sqrt(0)
ROWS = jnp.array([[NAN, 1.0], [0.0, 4.0], [0.0, 0.25]], jnp.float32)
ROWS_LOSING = np.array([[False, True], [True, False], [True, False]])


def log_of_row_max(x):
    return jnp.sum(jnp.log(jnp.max(jnp.sqrt(x), axis=1)))


def log_of_row_min(x):
    return jnp.sum(jnp.log(-jnp.min(-jnp.sqrt(x), axis=1)))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("f", [log_of_row_max, log_of_row_min], ids=["reduce_max", "reduce_min"])
def test_a_nan_element_of_a_reduction_keeps_its_nan(f, jit):
    """The NaN element's gradient is NaN (JAX's indicator over count is
    ``0 / 0``); the finite element beside it lost to the NaN and gets an
    exact zero, where plain JAX's ``0 / 0`` reaches it too.  Rows 1 and 2 are
    compared with the hand double where (JAX's reduction over a NaN row has
    no finite double where)."""
    d = jax.grad(guard(f))
    got = np.asarray((jax.jit(d) if jit else d)(ROWS))
    assert np.isnan(got[0, 0]) and got[0, 1] == 0.0
    assert np.isnan(np.asarray(jax.grad(f)(ROWS))[0]).all()
    want = np.asarray(jax.grad(lambda x: f(jnp.where(ROWS_LOSING, 1e-4, x)))(ROWS))
    np.testing.assert_allclose(got[1:], want[1:], rtol=1e-6)


def angle(a, b):
    cosine = jnp.dot(a, b) / (jnp.linalg.norm(a) * jnp.linalg.norm(b))
    return jnp.arccos(jnp.clip(cosine, -1.0, 1.0))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
def test_angle_with_a_zero_vector_has_plain_jaxs_nan_gradient(jit):
    """0 / 0 = NaN flows through the clip into the result: the gradient is
    NaN, as plain JAX's, not a zero under a NaN angle."""
    a, b = jnp.zeros(3), jnp.array([1.0, 0.0, 0.0])
    guarded = guard(angle)
    d = jax.jit(jax.grad(guarded)) if jit else jax.grad(guarded)
    assert np.isnan(guarded(a, b))
    assert np.isnan(np.asarray(d(a, b))).all()
    assert np.isnan(np.asarray(jax.jacfwd(guarded)(a, b))).all()
    a = jnp.array([2.0, 1.0, 0.0])
    np.testing.assert_array_equal(np.asarray(d(a, b)), np.asarray(jax.grad(angle)(a, b)))


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_a_nan_clamp_bound_keeps_its_nan(mode):
    x = jnp.array([0.0, 1.0, 4.0, 2.0], jnp.float32)  # lane 0: the bound is sqrt(-1)
    assert_like_double_where(mode, clamp_bound_nan, clamp_bound_nan_oracle, x)
    assert np.isnan(np.asarray(jax.grad(guard(clamp_bound_nan))(x))[0])


def test_a_nan_the_where_drops_stays_dead():
    """The NaN-inclusive mask is ANDed with the output's: ``log(-1) = NaN``
    behind a ``where`` that drops it is still guarded to an exact zero."""

    def f(x):
        return jnp.sum(jnp.where(x > 0, jnp.maximum(jnp.log(x), -5.0), 0.0))

    def oracle(x):
        # log(1e-3) = -6.9 still loses to -5, with a finite derivative
        safe = jnp.where(x > jnp.exp(-5.0), x, 1e-3)
        return jnp.sum(jnp.where(x > 0, jnp.maximum(jnp.log(safe), -5.0), 0.0))

    x = jnp.array([-1.0, 0.0, 2.0, np.exp(-10.0)], jnp.float32)
    assert np.isnan(np.asarray(jax.grad(f)(x))).any()
    for mode in MODES.values():
        assert_like_double_where(mode, f, oracle, x)
    assert np.isfinite(np.asarray(jax.grad(guard(f))(x))).all()
    assert explain(f, x).sites


#: a NaN at lane 1 wins every running maximum from there on, and its
#: segment's; lanes 2 and 4 lose with sqrt'(0) = inf
RUNNING = jnp.array([1.0, NAN, 0.0, 4.0, 0.0, 9.0], jnp.float32)


def log_of_running_max(x):
    return jnp.sum(jnp.log(lax.cummax(jnp.sqrt(x) + 0.1)))


def log_of_segment_max(x):
    segments = jnp.array([0, 0, 1, 1, 2, 2])
    return jnp.sum(jnp.log(jax.ops.segment_max(jnp.sqrt(x) + 0.1, segments, 3)))


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize(
    "f", [log_of_running_max, log_of_segment_max], ids=["cummax", "segment_max"]
)
def test_a_nan_that_wins_a_running_or_segment_maximum_keeps_its_nan(f, jit):
    """``cummax`` and ``scatter-max`` probe JAX's own derivative for their
    masks; a NaN operand now wins the probe as it wins the forward value, so
    its lane's gradient is NaN, as plain JAX's (it was 0).  The losing lanes'
    guards are checked against the double where in ``test_cumulative_choosers``."""
    d = jax.grad(guard(f))
    got = np.asarray((jax.jit(d) if jit else d)(RUNNING))
    assert np.isnan(got[1]) and np.isnan(np.asarray(jax.grad(f)(RUNNING))[1])
    assert np.isnan(guard(f)(RUNNING))
