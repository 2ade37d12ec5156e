"""Real library code, as users write it (the "ordinary user code" rule).

* numpyro's ``validate_sample`` wraps ``log_prob`` in
  ``where(support.check(x), log_prob, -inf)``.  At a point outside the
  support (``Gamma`` at ``x = 0``) the log-density branch is dead, yet its
  ``lgamma``/``log`` derivatives poison the gradient: plain JAX gives NaN for
  d/d(concentration) of a constant ``-inf``.  Oracle: a per-point Python
  ``if`` -- 0 outside the support, the analytic derivative inside.
* jax_md's pair energies already make their distances safe by hand
  (``safe_mask``); the guard must then change nothing: eager gradients bitwise
  equal, every dead lane reached is guarded (nothing reported unguarded).
  Except with a sharp cutoff (``r_onset == r_cutoff``), where the untaken
  smoothing branch divides by zero: NaN forces that the guard mends.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import digamma

from hlo_guard import explain, guard, guarded_jit

dist = pytest.importorskip("numpyro.distributions")


def _gamma_dlogp_dconcentration(c, rate, x):
    """d/dc of log Gamma(x | c, rate) = c log(rate) + (c-1) log x - rate x - lgamma(c)."""
    return np.log(rate) + np.log(x) - digamma(c)


@pytest.mark.parametrize("x", [0.0, -1.0, 0.5, 2.0])
def test_numpyro_gamma_log_prob_outside_the_support(x):
    def logp(c):
        return dist.Gamma(c, 1.0).log_prob(jnp.float32(x))

    c = jnp.float32(1.5)
    inside = x > 0
    want = _gamma_dlogp_dconcentration(1.5, 1.0, x) if inside else 0.0
    if not inside:
        assert np.isnan(jax.grad(logp)(c))  # the bug is real
    np.testing.assert_array_equal(guard(logp)(c), logp(c))
    for got in (jax.grad(guard(logp))(c), jax.grad(guarded_jit(logp))(c)):
        np.testing.assert_allclose(got, want, rtol=1e-5)


def test_numpyro_masked_batch_log_likelihood():
    """A batch with points outside the support: their terms are -inf in the
    log likelihood a user would mask; the gradient over the valid points
    equals the per-point oracle summed over them."""
    xs = jnp.array([0.0, 0.5, 1.0, 2.0, -1.0])
    valid = np.asarray(xs) > 0

    def loglik(c):
        lp = dist.Gamma(c, 1.0).log_prob(xs)
        return jnp.sum(jnp.where(xs > 0, lp, 0.0))

    want = sum(_gamma_dlogp_dconcentration(1.5, 1.0, float(x)) for x in np.asarray(xs)[valid])
    assert np.isnan(jax.grad(loglik)(jnp.float32(1.5)))
    np.testing.assert_allclose(jax.grad(guarded_jit(loglik))(jnp.float32(1.5)), want, rtol=1e-5)


def test_jax_md_pair_energy_is_left_as_it_was():
    space = pytest.importorskip("jax_md.space")
    energy = pytest.importorskip("jax_md.energy")
    displacement, _ = space.periodic(10.0)
    positions = jnp.asarray(np.random.default_rng(0).uniform(0, 10, (32, 3)), jnp.float32)
    for pair in (energy.lennard_jones_pair, energy.soft_sphere_pair, energy.morse_pair):
        e = pair(displacement)
        plain = jax.grad(e)(positions)
        assert np.all(np.isfinite(plain))  # jax_md's own safe_mask
        np.testing.assert_array_equal(guard(e)(positions), e(positions))
        np.testing.assert_array_equal(jax.grad(guard(e))(positions), plain)
        jitted = jax.jit(jax.grad(guard(e)))(positions)
        np.testing.assert_allclose(jitted, jax.jit(jax.grad(e))(positions), rtol=1e-5, atol=1e-3)
        assert not explain(e, positions).unguarded


def test_jax_md_sharp_cutoff_forces():
    """jax_md's Lennard-Jones with ``r_onset == r_cutoff`` (a sharp cutoff, as
    a user who wants no smoothing writes it): the smoothing polynomial's
    branch for ``r_onset <= r < r_cutoff`` is never taken, but it divides by
    ``(r_cutoff - r_onset) ** 3 = 0``, and its dead lanes make every force
    NaN in plain JAX (found 2026-11-26 trying jax_md as a user would).  The
    oracle: the same energy written by hand with a double where (pairs inside
    the cutoff, diagonal excluded)."""
    space = pytest.importorskip("jax_md.space")
    energy = pytest.importorskip("jax_md.energy")
    box = 6.0
    displacement, _ = space.periodic(box)
    positions = jnp.asarray(np.random.default_rng(0).uniform(0, box, (24, 3)), jnp.float32)
    e = energy.lennard_jones_pair(displacement, r_onset=2.0, r_cutoff=2.0)

    def oracle(positions):
        d = space.map_product(displacement)(positions, positions)
        r2 = jnp.sum(d**2, axis=-1)
        keep = ~jnp.eye(positions.shape[0], dtype=bool) & (r2 < 4.0)
        s6 = (1.0 / jnp.sqrt(jnp.where(keep, r2, 1.0))) ** 6
        return 0.5 * jnp.sum(jnp.where(keep, 4.0 * (s6 * s6 - s6), 0.0))

    assert not np.isfinite(np.asarray(jax.grad(e)(positions))).any()  # the bug is real
    want = np.asarray(jax.grad(oracle)(positions))
    np.testing.assert_array_equal(guard(e)(positions), e(positions))
    for got in (jax.grad(guard(e))(positions), jax.jit(jax.grad(guard(e)))(positions)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)
    assert not explain(e, positions).unguarded


def test_optax_meta_gradient_through_gradient_clipping_at_zero_gradients():
    """A meta-gradient (d loss after one update / d learning inputs) through
    ``clip_by_global_norm`` and ``clip_by_block_rms`` when the gradients are
    zero: the clip's ``where(norm < max, 1, max / norm)`` takes 1, and the
    norm's ``sqrt'(0)`` is dead.  optax computes the norm through ``x.real``,
    an identity call the placement used to lose the dead region in (NaN, and
    a clean report); the oracle is the same step without the clip, which is
    what the taken branch computes."""
    optax = pytest.importorskip("optax")

    params = jnp.array([0.5, -1.0, 2.0])
    target = jnp.array([1.0, 0.0, 1.0])

    def meta(opt):
        def after_one_step(g):
            updates, _ = opt.update(g, opt.init(params), params)
            p = optax.apply_updates(params, updates)
            return jnp.sum((p - target) ** 2)

        return after_one_step

    oracle = meta(optax.sgd(0.1))
    zero = jnp.zeros(3)
    for clip in (optax.clip_by_global_norm(1.0), optax.clip_by_block_rms(1.0)):
        f = meta(optax.chain(clip, optax.sgd(0.1)))
        assert np.isnan(np.asarray(jax.grad(f)(zero))).any()
        want = np.asarray(jax.grad(oracle)(zero))
        for d in (jax.grad, lambda h: jax.jit(jax.grad(h))):
            np.testing.assert_allclose(np.asarray(d(guard(f))(zero)), want, rtol=1e-6)


@pytest.mark.parametrize("family", ["Dirichlet", "Beta"])
def test_numpyro_concentration_gradient_with_rows_outside_the_support_masked(family):
    """The concentration is broadcast over a batch whose masked rows lie
    outside the support (``log(-0.1)``): ``(c - 1) * log(v)`` sums their
    ``0 * nan`` into ``c``'s gradient.  jnp reaches that multiply through a
    rank promotion (``broadcast_in_dim`` to ``[1, K]``), which used to carry
    the guard away from the multiply (fixed 2026-11-26).  Oracle: the same
    log-density of the valid rows alone."""
    if family == "Dirichlet":
        v = jnp.array([[0.2, 0.3, 0.5], [-0.1, 0.6, 0.5], [0.0, 0.5, 0.5]])
        ok = jnp.array([True, False, False])
        c = jnp.array([1.5, 2.0, 0.7])

        def f(c):
            return jnp.sum(jnp.where(ok, dist.Dirichlet(c).log_prob(v), 0.0))

        def oracle(c):
            return dist.Dirichlet(c).log_prob(v[0])

    else:
        xb = jnp.array([0.3, 0.7, 1.5, -0.2])
        ok = (xb > 0) & (xb < 1)
        c = jnp.array([2.0, 3.0])

        def f(c):
            return jnp.sum(jnp.where(ok, dist.Beta(c[0], c[1]).log_prob(xb), 0.0))

        def oracle(c):
            return jnp.sum(dist.Beta(c[0], c[1]).log_prob(xb[:2]))

    assert np.isnan(np.asarray(jax.grad(f)(c))).any()
    want = np.asarray(jax.grad(oracle)(c))
    for d in (jax.grad, lambda h: jax.jit(jax.grad(h))):
        np.testing.assert_allclose(np.asarray(d(guard(f))(c)), want, rtol=2e-6, atol=1e-7)
