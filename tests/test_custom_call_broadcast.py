"""A parameter a custom-derivative call broadcasts inside its body.

``where(x > 0, xlogy(a, x), 0)`` with a *scalar* ``a`` (a gamma shape fitted
to zero-padded data): ``xlogy`` is a ``custom_jvp`` whose body broadcasts
``a`` over the lanes, so ``a``'s cotangent is the rule's own sum
``sum(ct * log(x))`` -- and a padded lane's ``0 * log(0)`` is NaN inside
that sum.  A select on ``a`` cannot reach it; the report used to list that
select as a guard and say nothing was missed (found 2026-11-27 by a
user-style hunt: ``stats.gamma.logpdf``, ``logaddexp``, ``xlog1py``,
``zeta``, ``rel_entr``).

A lane-wise ``custom_jvp`` call now gets its JVP written out for such an
operand: the rule's slope at a unit tangent, dead lanes selected to zero,
times the broadcast tangent.  A ``custom_vjp`` (no JVP to write out) and an
operand broadcast along some axes only (a row of per-class parameters) are
reported as unguarded sites.

Oracles: a per-lane Python loop over the kept lanes, and the hand double
where, in reverse, forward and second-order modes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy import special, stats

import hlo_guard

X = jnp.asarray([0.0, 0.5, 2.0, 0.0, 1.5])
KEEP = X > 0
A = jnp.float32(0.7)


def _pads(value):
    return jnp.where(KEEP, X, value)


#: name -> elementwise function of (scalar parameter, data lane)
CALLS = {
    "xlogy": lambda a, x: special.xlogy(a, x),
    "xlog1py": lambda a, x: special.xlog1py(a, x - 1.0),
    "logaddexp": lambda a, x: jnp.logaddexp(a, jnp.log(x)),
    "gamma_logpdf": lambda a, x: stats.gamma.logpdf(x, a + 1.0),
}


def _masked(call, pad):
    def f(a):
        x = _pads(pad)
        return jnp.sum(jnp.where(KEEP, call(a, x), 0.0))

    return f


def _per_lane(call):
    """d/da of the sum over kept lanes, one lane at a time."""

    def g(a):
        return sum(jax.grad(lambda a: call(a, X[i]))(a) for i in range(len(X)) if bool(KEEP[i]))

    return g


def _double_where(call, pad):
    def f(a):
        x = _pads(pad)
        return jnp.sum(jnp.where(KEEP, call(a, jnp.where(KEEP, x, 1.0)), 0.0))

    return f


@pytest.mark.parametrize("pad", [0.0, jnp.inf, jnp.nan], ids=["zero", "inf", "nan"])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_scalar_parameter_broadcast_inside_the_call(name, pad):
    call = CALLS[name]
    f = _masked(call, pad)
    # the bug is there for most pads (logaddexp of log(0) = -inf is clean)
    buggy = {(n, p) for n in CALLS for p in ("zero", "inf", "nan")} - {
        ("logaddexp", "zero"),
        ("logaddexp", "inf"),
        ("gamma_logpdf", "nan"),
    }
    pad_name = {0.0: "zero"}.get(float(pad), "inf" if np.isinf(pad) else "nan")
    assert np.isnan(np.asarray(jax.grad(f)(A))) == ((name, pad_name) in buggy)
    report = hlo_guard.explain(f, A)
    assert report.unguarded == []
    want = np.asarray(_per_lane(call)(A))
    assert np.isfinite(want)
    for g in (jax.grad(hlo_guard.guard(f)), jax.jit(jax.grad(hlo_guard.guard(f)))):
        # the loop sums the lanes in another order: a few ulp
        np.testing.assert_allclose(np.asarray(g(A)), want, rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(hlo_guard.guard(f)(A)), np.asarray(f(A)))


DERIVATIVES = {
    "jacfwd": jax.jacfwd,
    "hessian": jax.hessian,
    "jacrev_grad": lambda f: jax.jacrev(jax.grad(f)),
    "jacfwd_grad": lambda f: jax.jacfwd(jax.grad(f)),
}


@pytest.mark.parametrize("pad", [0.0, jnp.inf], ids=["zero", "inf"])
@pytest.mark.parametrize("mode", sorted(DERIVATIVES))
@pytest.mark.parametrize("name", ["xlogy", "logaddexp", "gamma_logpdf"])
def test_every_mode_matches_the_double_where(name, mode, pad):
    """(With a zero pad, ``jacrev(grad)`` of ``xlogy`` was NaN where plain
    JAX gives the right 0: the slope the JVP takes, ``da * log(x) + dx * a /
    x`` with ``dx`` an exact zero, depends on ``a`` through ``0 * a / 0``;
    the slope is now taken where a dead lane holds a live lane's ``x``.)"""
    call, d = CALLS[name], DERIVATIVES[mode]
    f, oracle = _masked(call, pad), _double_where(call, pad)
    want = np.asarray(d(oracle)(A))
    assert np.isfinite(want).all()
    for guarded in (hlo_guard.guard(f), jax.jit(hlo_guard.guard(f))):
        np.testing.assert_allclose(np.asarray(d(guarded)(A)), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("wrap", ["guard", "guarded_jit"])
def test_both_operands_under_reverse_over_reverse(wrap):
    """``xlogy(b, a - x)``: the data operand's term ``d(a - x) * b / (a - x)``
    read the scalar ``b`` rank-0 and a padded lane's ``a - x = 0``; its
    derivative in ``b`` summed ``0 / 0`` (a user-style hunt, 2026-11-27)."""
    x = jnp.asarray([0.5, 2.0, 1.0])
    keep = jnp.asarray([True, False, True])

    def f(a, b):
        return jnp.sum(jnp.where(keep, special.xlogy(b, a - x), 0.0))

    def oracle(a, b):
        return jnp.sum(jnp.where(keep, special.xlogy(b, jnp.where(keep, a - x, 1.0)), 0.0))

    args = (jnp.float32(2.0), jnp.float32(0.7))
    d = lambda F: jax.jacrev(jax.grad(F, (0, 1)), (0, 1))  # noqa: E731
    want = np.asarray(jax.tree_util.tree_leaves(d(oracle)(*args)))
    got = np.asarray(jax.tree_util.tree_leaves(d(getattr(hlo_guard, wrap)(f))(*args)))
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("mode", sorted(DERIVATIVES))
def test_every_lane_dead(mode):
    """No live lane to take the slope at: the scalar is read through a
    select that discards what the dead lanes send it (a padded lane at
    ``x = 0`` made ``jacrev(grad)`` NaN; plain JAX gives 0)."""
    x = jnp.asarray([0.0, 2.0, 0.0])
    keep = jnp.zeros(3, bool)

    def f(a):
        return jnp.sum(jnp.where(keep, special.xlogy(a, x), 0.0))

    d = DERIVATIVES[mode]
    for guarded in (hlo_guard.guard(f), jax.jit(hlo_guard.guard(f))):
        np.testing.assert_array_equal(np.asarray(d(guarded)(A)), 0.0)


def test_the_data_operand_keeps_its_own_guard():
    """Both operands differentiated: the data's padded lanes are zero, its
    live lanes the rule's, and the parameter's as above."""

    def f(a, x):
        return jnp.sum(jnp.where(KEEP, special.xlogy(a, x), 0.0))

    def oracle(a, x):
        return jnp.sum(jnp.where(KEEP, special.xlogy(a, jnp.where(KEEP, x, 1.0)), 0.0))

    x = _pads(0.0)
    got = jax.grad(hlo_guard.guard(f), argnums=(0, 1))(A, x)
    for g, w in zip(got, jax.grad(oracle, argnums=(0, 1))(A, x)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


def test_a_user_custom_jvp_with_a_scalar_parameter():
    @jax.custom_jvp
    def scaled_log(a, x):
        return a * jnp.log(x)

    @scaled_log.defjvp
    def _(primals, tangents):
        (a, x), (da, dx) = primals, tangents
        return scaled_log(a, x), da * jnp.log(x) + a * dx / x

    f = _masked(scaled_log, 0.0)
    assert np.isnan(np.asarray(jax.grad(f)(A)))
    want = np.asarray(_per_lane(scaled_log)(A))
    np.testing.assert_allclose(np.asarray(jax.grad(hlo_guard.guard(f))(A)), want, rtol=1e-6)


def test_a_genuine_singularity_in_a_kept_lane_stays():
    """A kept lane at ``x = 0``: ``xlogy(a, 0)`` is ``-inf`` there and so is
    its derivative in ``a``; the guard leaves it, as plain JAX does."""
    keep = jnp.ones_like(KEEP)
    f = lambda a: jnp.sum(jnp.where(keep, special.xlogy(a, X), 0.0))
    got = np.asarray(jax.grad(hlo_guard.guard(f))(A))
    assert np.isneginf(got)
    assert np.isneginf(np.asarray(jax.grad(f)(A)))


def test_a_custom_vjp_with_a_scalar_parameter_is_reported():
    """No JVP to write the sum out with: the site is reported unguarded."""

    @jax.custom_vjp
    def scaled_log(a, x):
        return a * jnp.log(x)

    def fwd(a, x):
        return scaled_log(a, x), (a, x)

    def bwd(res, ct):
        a, x = res
        return jnp.sum(ct * jnp.log(x)), ct * a / x

    scaled_log.defvjp(fwd, bwd)
    f = _masked(scaled_log, 0.0)
    report = hlo_guard.explain(f, A)
    assert any("broadcast inside the call" in u.reason for u in report.unguarded), report


def test_a_row_of_parameters_broadcast_over_the_batch_is_reported():
    """``xlogy(c - 1, x)`` with one parameter per column, read by every row:
    the call is not lane-wise, and the sum over rows is the rule's."""
    x = jnp.asarray([[0.2, 0.3, 0.5], [0.0, 0.4, 0.6], [0.1, 0.1, 0.8]])
    rows = (x > 0).all(-1)
    c = jnp.asarray([0.5, 2.0, 1.5])
    f = lambda c: jnp.sum(jnp.where(rows[:, None], special.xlogy(c - 1, x), 0.0))
    report = hlo_guard.explain(f, c)
    assert any("broadcast inside the call" in u.reason for u in report.unguarded), report
