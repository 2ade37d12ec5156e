"""``jax.random.gamma`` (and ``beta``, which draws two gammas) behind a
``where``: the sample's lane ``i`` is drawn with ``a[i]`` alone, and its
derivative, ``random_gamma_grad(a, sample)``, is NaN for ``a <= 0`` -- a
dead lane of a masked shape parameter.  Found by a user-style hunt
(2026-11-28): it had no rule, so the guard left it (reported) and the
gradient stayed NaN where the double where gives 0."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlo_guard import explain, guard

A = jnp.array([-1.0, 0.0, 0.5, 3.0, 2.0, -2.5])
KEY = jax.random.key(0)


def masked_gamma(a, key):
    return jnp.sum(jnp.where(a > 0, jax.random.gamma(key, a), 0.0))


def masked_gamma_dw(a, key):
    safe = jnp.where(a > 0, a, 1.0)
    return jnp.sum(jnp.where(a > 0, jax.random.gamma(key, safe), 0.0))


def masked_beta(a, key):
    return jnp.sum(jnp.where(a > 0, jax.random.beta(key, a, 2.0 + a), 0.0))


def masked_beta_dw(a, key):
    safe = jnp.where(a > 0, a, 1.0)
    return jnp.sum(jnp.where(a > 0, jax.random.beta(key, safe, 2.0 + safe), 0.0))


CASES = [(masked_gamma, masked_gamma_dw), (masked_beta, masked_beta_dw)]


@pytest.mark.parametrize("f, dw", CASES, ids=["gamma", "beta"])
@pytest.mark.parametrize("transform", [jax.grad, jax.jacfwd], ids=["grad", "jacfwd"])
def test_masked_shape_parameter_has_exact_zeros(f, dw, transform):
    assert not np.all(np.isfinite(jax.grad(f)(A, KEY)))  # the problem is real
    want = np.asarray(transform(dw)(A, KEY))
    for g in (guard(f), jax.jit(guard(f))):
        got = np.asarray(transform(g)(A, KEY))
        np.testing.assert_allclose(got, want, rtol=1e-5)
        assert np.all(got[np.asarray(A) <= 0] == 0)
    np.testing.assert_array_equal(guard(f)(A, KEY), f(A, KEY))


def test_live_lanes_keep_their_derivative_and_the_report_is_clean():
    report = explain(masked_gamma, A, KEY)
    assert not report.unguarded
    g = np.asarray(jax.grad(guard(masked_gamma))(A, KEY))
    assert np.all(np.isfinite(g)) and np.all(g[np.asarray(A) > 0] != 0)
