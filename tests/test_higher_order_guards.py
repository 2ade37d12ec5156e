"""Derivatives of derivatives through guards written as a ``custom_jvp``.

A scalar ``c`` in ``where(m, c * x * x, 0)`` is broadcast by the ``mul``
itself; its guard sits inside a ``custom_jvp`` (the forward program is the
bare ``mul``).  Reverse over reverse -- ``jacrev(grad_x)`` in ``c``, a
gradient penalty ``grad_c(|grad_x f|^2)``, force matching's ``d/d eps`` of
``-grad_r E`` -- differentiates that JVP again, and two things there read
unguarded values (found 2026-11-27 by a user-style hunt; plain ``grad``,
``hessian`` and ``jacfwd`` were right, these were NaN with a clean report):

* the JVP returned the *bare* operation as its primal, so the primal seen by
  the next derivative had no guard at all;
* the other operand's term ``c * dx`` read the unbroadcast ``c``: its
  derivative in ``c`` sums every lane, and the dead lanes' second-order
  cotangents (``inf * 0`` behind the boundary guard) were summed in.

Now the JVP's primal is the guarded operation itself, and its tangent terms
read the broadcast operand broadcast and guarded (for ``mul``-like ops, where
that gives the same bits).  A division keeps its rank-0 divisor in the
numerator's term ``dx / w`` (XLA divides by a scalar through its reciprocal,
by a broadcast one exactly: the first derivative's bits), and reads it
broadcast and guarded only in the divisor's own term ``-dw * x / w**2``:
that term's derivative in ``w`` is what a second derivative sums over the
lanes, a dead lane's ``x = log(0)`` included (numpyro's LogNormal scale,
below; an xfail until the terms were split).  Oracle: the hand double
where, eagerly and under ``jit``, also through ``guarded_jit``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard

X = jnp.asarray([0.5, jnp.inf, -2.0])
M = jnp.isfinite(X)
C = jnp.float32(3.0)


def f(x, c):
    return jnp.sum(jnp.where(M, c * x * x, 0.0))


def double_where(x, c):
    xs = jnp.where(M, x, 0.0)
    return jnp.sum(jnp.where(M, c * xs * xs, 0.0))


SECOND_ORDER = {
    "jacrev_of_grad_x_in_c": lambda F: jax.jacrev(jax.grad(F, 0), 1)(X, C),
    "jacrev_jacrev_cross": lambda F: jax.jacrev(jax.jacrev(F, (0, 1)), (0, 1))(X, C)[0][1],
    "gradient_penalty": lambda F: jax.grad(lambda c: jnp.sum(jax.grad(F, 0)(X, c) ** 2))(C),
    "hessian_cross": lambda F: jax.hessian(F, (0, 1))(X, C)[0][1],
    "jacfwd_of_grad_x_in_c": lambda F: jax.jacfwd(jax.grad(F, 0), 1)(X, C),
}


@pytest.mark.parametrize("case", sorted(SECOND_ORDER))
def test_a_scalar_broadcast_by_the_op_under_second_order(case):
    d = SECOND_ORDER[case]
    want = np.asarray(d(double_where))
    assert np.isfinite(want).all()
    for guarded in (hlo_guard.guard(f), hlo_guard.guarded_jit(f)):
        np.testing.assert_allclose(np.asarray(d(guarded)), want, rtol=1e-6)
    np.testing.assert_allclose(
        np.asarray(jax.jit(lambda: d(hlo_guard.guard(f)))()), want, rtol=1e-6
    )


def test_the_bug_is_in_plain_jax():
    assert np.isnan(np.asarray(SECOND_ORDER["jacrev_of_grad_x_in_c"](f))).all()


R = jnp.asarray([1.1, 0.0, 1.5, 0.0])  # pair distances; 0 = padding
PAIRS = R > 0
F_REF = jnp.asarray([0.3, 0.0, -0.1, 0.0])


def energy(r, eps):
    return jnp.sum(jnp.where(PAIRS, eps * r**-6, 0.0))


def energy_double_where(r, eps):
    rs = jnp.where(PAIRS, r, 1.0)
    return jnp.sum(jnp.where(PAIRS, eps * rs**-6, 0.0))


def _force_matching(e):
    return lambda eps: jnp.sum((-jax.grad(e, 0)(R, eps) - F_REF) ** 2)


@pytest.mark.parametrize("mode", ["gradient", "value"])
def test_a_numpyro_log_prob_with_scalar_parameters_under_second_order(mode):
    dist = pytest.importorskip("numpyro.distributions")
    y = jnp.asarray([0.5, 0.0, 2.0, jnp.inf])
    keep = (y > 0) & jnp.isfinite(y)

    def nll(loc, scale):
        return -jnp.sum(jnp.where(keep, dist.LogNormal(loc, scale).log_prob(y), 0.0))

    def nll_double_where(loc, scale):
        ys = jnp.where(keep, y, 1.0)
        return -jnp.sum(jnp.where(keep, dist.LogNormal(loc, scale).log_prob(ys), 0.0))

    args = (jnp.float32(0.2), jnp.float32(1.3))
    hess = lambda F: jax.jacrev(jax.grad(F, (0, 1)), (0, 1))(*args)
    want = jax.tree_util.tree_leaves(hess(nll_double_where))
    got = jax.tree_util.tree_leaves(hess(hlo_guard.guard(nll, mode=mode)))
    for g, w in zip(got, want):
        assert np.isfinite(np.asarray(w)).all()
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5)


def lj_energy(r, sigma):
    return jnp.sum(jnp.where(PAIRS, (sigma / r) ** 6, 0.0))


def lj_energy_double_where(r, sigma):
    rs = jnp.where(PAIRS, r, 1.0)
    return jnp.sum(jnp.where(PAIRS, (sigma / rs) ** 6, 0.0))


#: name -> (energy, its double where, the parameter's value)
ENERGIES = {
    # d/d eps of a loss on the forces -grad_r E: the README says to guard the
    # function the inner grad differentiates
    "a_product_eps_r6": (energy, energy_double_where, 0.5),
    # (sigma / r)**6, jax_md's Lennard-Jones idr = sigma / dr (numpyro's Levy
    # scale / (x - loc)): the divisor's term -dr * sigma / r**2 read sigma
    # unbroadcast, and its derivative in sigma summed the padded pair's
    # 0 * inf (found 2026-11-27 by a user-style hunt)
    "a_scalar_numerator_sigma_over_r": (lj_energy, lj_energy_double_where, 1.0),
}


@pytest.mark.parametrize("wrap", ["guard", "guarded_jit"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("case", sorted(ENERGIES))
def test_force_matching_through_a_guarded_energy(case, wrap, jit):
    """``d/d p`` of a loss on the forces ``-grad_r E(r, p)``, a padded pair
    at ``r = 0``: the double where's value, where plain JAX is NaN."""
    plain, double_where, value = ENERGIES[case]
    e = getattr(hlo_guard, wrap)(plain)
    d = jax.grad(_force_matching(e))
    d = jax.jit(d) if jit else d
    want = np.asarray(jax.grad(_force_matching(double_where))(jnp.float32(value)))
    assert np.isfinite(want)
    np.testing.assert_allclose(np.asarray(d(jnp.float32(value))), want, rtol=1e-6)
    assert np.isnan(np.asarray(jax.grad(_force_matching(plain))(jnp.float32(value))))


def test_a_taken_zero_distance_stays_a_genuine_singularity_at_second_order():
    """The same force matching with one pair at ``r = 0`` *kept* (the other
    still padded, so the guards are in place): its force is infinite on a
    taken path, and the second derivative must stay non-finite, as in the
    double where -- no guard hides it."""
    keep = jnp.asarray([True, True, True, False])

    def one_taken(r, sigma):
        return jnp.sum(jnp.where(keep, (sigma / r) ** 6, 0.0))

    def one_taken_double_where(r, sigma):
        return jnp.sum(jnp.where(keep, (sigma / jnp.where(keep, r, 1.0)) ** 6, 0.0))

    d = lambda e: jax.grad(_force_matching(e))(jnp.float32(1.0))  # noqa: E731
    assert not np.isfinite(np.asarray(d(one_taken_double_where)))
    assert hlo_guard.explain(one_taken, R, jnp.float32(1.0)).guards
    for wrap in (hlo_guard.guard, hlo_guard.guarded_jit):
        assert not np.isfinite(np.asarray(d(wrap(one_taken))))


T_DATA = jnp.asarray([0.5, jnp.inf, -1.5])  # inf: padding
T_KEEP = jnp.isfinite(T_DATA)


def student_t_like(df, loc):
    return jnp.sum(jnp.where(T_KEEP, df * jnp.log1p((T_DATA - loc) ** 2 / df), 0.0))


def student_t_like_double_where(df, loc):
    xs = jnp.where(T_KEEP, T_DATA, 0.0)
    return jnp.sum(jnp.where(T_KEEP, df * jnp.log1p((xs - loc) ** 2 / df), 0.0))


STAGED = {
    "jit(jacrev(grad))": lambda F: jax.jit(jax.jacrev(jax.grad(F, (0, 1)), (0, 1))),
    "jacrev(jit(grad))": lambda F: jax.jacrev(jax.jit(jax.grad(F, (0, 1))), (0, 1)),
}


@pytest.mark.parametrize("wrap", ["guard", "guarded_jit"])
@pytest.mark.parametrize("staged", sorted(STAGED))
def test_a_scalar_divisor_under_reverse_over_a_staged_reverse_pass(wrap, staged):
    """``df * log1p((x - loc)**2 / df)`` (numpyro's StudentT) with an inf
    padding lane, differentiated twice with the first derivative staged:
    JAX inlines the guards' ``custom_jvp`` rules there, and the reverse pass
    over it seeds the dead lane with ``0 * inf`` (the square's derivative
    at ``x = inf``).  The numerator's term ``d(x**2) / df`` summed that seed
    into ``df`` through the rank-0 divisor, NaN with a clean report, while
    eager was exact (found 2026-11-27 by a user-style hunt).  Now the term is
    ``d(x**2) * r`` with ``r = 1 / df`` broadcast and guarded."""
    args = (jnp.float32(3.0), jnp.float32(0.2))
    d = STAGED[staged]
    want = np.asarray(jax.tree_util.tree_leaves(d(student_t_like_double_where)(*args)))
    got = np.asarray(jax.tree_util.tree_leaves(d(getattr(hlo_guard, wrap)(student_t_like))(*args)))
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=1e-5)
