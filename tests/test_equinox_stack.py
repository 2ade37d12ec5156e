"""The Equinox stack downstream and around a dead branch: a diffrax solve whose
vector field has a contact force that is singular off contact, and an
optimistix root find fed by a masked ``sqrt``.  Oracle: the same programs
with the hand double-where; plain JAX must leak (NaN) for each case to count.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard as hg

diffrax = pytest.importorskip("diffrax", reason="diffrax is a dev extra")
optx = pytest.importorskip("optimistix", reason="optimistix is a dev extra")


def _contact(y, k, double_where):
    """Hertz contact: force k * d**1.5 while penetrating (d = -y > 0), else 0.
    ``d**1.5`` of a negative d (no contact) is NaN: the dead branch."""
    d = -y
    if double_where:
        d = jnp.where(d > 0, d, 1.0)
    return jnp.where(-y > 0, k * d**1.5, 0.0)


def _drop(k, y0, *, double_where=False, adjoint=None, wrap=lambda field: field):
    """A ball dropped on a spring floor: y'' = -1 + contact force; it crosses
    y = 0 and bounces.  Returns the height at t = 3.  ``wrap`` is applied to
    the vector field (``hg.guard``: the guarded field)."""

    def field(t, state, args):
        y, v = state
        return v, -1.0 + _contact(y, args, double_where)

    term = diffrax.ODETerm(wrap(field))
    kwargs = {} if adjoint is None else {"adjoint": adjoint}
    sol = diffrax.diffeqsolve(
        term,
        diffrax.Tsit5(),
        t0=0.0,
        t1=3.0,
        dt0=0.01,
        y0=(y0, jnp.zeros_like(y0)),
        args=k,
        stepsize_controller=diffrax.ConstantStepSize(),
        max_steps=400,
        **kwargs,
    )
    return jnp.sum(sol.ys[0][-1])


K, Y0 = jnp.float32(50.0), jnp.array([1.0, 0.5, 2.0], jnp.float32)
ADJOINTS = {"recursive_checkpoint": None, "backsolve": "backsolve"}


def _adjoint(name):
    return diffrax.BacksolveAdjoint() if name == "backsolve" else None


@pytest.mark.parametrize("adjoint", sorted(ADJOINTS))
def test_diffrax_guarded_vector_field_matches_double_where(adjoint):
    """Guard the vector field: every adjoint diffrax has differentiates the
    guarded field, so the contact force's dead branch gives exact zeros."""
    adj = _adjoint(adjoint)
    plain = lambda k, y0: _drop(k, y0, adjoint=adj)  # noqa: E731
    guarded = lambda k, y0: _drop(k, y0, adjoint=adj, wrap=hg.guard)  # noqa: E731
    oracle = lambda k, y0: _drop(k, y0, double_where=True, adjoint=adj)  # noqa: E731
    leak = jax.grad(plain, argnums=(0, 1))(K, Y0)
    assert not all(np.isfinite(np.asarray(g)).all() for g in leak)
    got = jax.jit(jax.grad(guarded, argnums=(0, 1)))(K, Y0)
    want = jax.jit(jax.grad(oracle, argnums=(0, 1)))(K, Y0)
    for g, w in zip(got, want):
        assert np.isfinite(np.asarray(g)).all()
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(guarded(K, Y0), plain(K, Y0))


def test_diffrax_guard_around_the_solve_reports_the_dead_branch_it_cannot_reach():
    """Guarding the whole solve cannot fix it: the solve's loop is a
    ``custom_vjp`` whose backward pass re-differentiates the original step
    function.  That must not be silent: ``explain`` names the call and the
    user's ``**1.5`` line inside it."""
    plain = lambda k, y0: _drop(k, y0)  # noqa: E731
    report = hg.explain(plain, K, Y0)
    here = "test_equinox_stack.py"
    hits = [s for s in report.unguarded if s.primitive == "custom_vjp_call" and here in s.reason]
    assert hits, report
    assert "pow" in hits[0].reason


def _root_of_masked_sqrt(x, *, double_where=False):
    """z with z**3 + z = where(x > 0, sqrt(x), 0), found by Newton; d/dx by the
    implicit function theorem (optimistix's ImplicitAdjoint)."""
    safe = jnp.where(x > 0, x, 1.0) if double_where else x
    target = jnp.where(x > 0, jnp.sqrt(safe), 0.0)
    sol = optx.root_find(
        lambda z, t: z**3 + z - t, optx.Newton(rtol=1e-6, atol=1e-6), jnp.zeros_like(x), args=target
    )
    return jnp.sum(sol.value)


def test_optimistix_root_find_downstream_of_a_masked_sqrt():
    x = jnp.array([-1.0, 0.0, 0.25, 4.0], jnp.float32)
    leak = jax.grad(_root_of_masked_sqrt)(x)
    assert not np.isfinite(np.asarray(leak)).all()
    got = jax.grad(hg.guard(_root_of_masked_sqrt))(x)
    want = jax.grad(lambda v: _root_of_masked_sqrt(v, double_where=True))(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_a_whole_optimistix_root_find_is_reported_and_diagnosed():
    """Guarding the whole solve: optimistix's implicit-function rule is a
    ``custom_jvp`` around a loop, which differentiates the residual again,
    where its ``where``'s dead ``sqrt`` lane leaks.  That is reported (it was
    silent: 'nothing to guard'); guarding the residual itself is exact.  And
    ``diagnose`` runs (Equinox's ``nondifferentiable_backward`` refused the
    zero cotangent diagnose handed it, one equation at a time)."""

    def residual(y, a):
        return jnp.where(a > 0, y - jnp.sqrt(a), y)

    def residual_dw(y, a):
        return jnp.where(a > 0, y - jnp.sqrt(jnp.where(a > 0, a, 1.0)), y)

    def root(fn, a):
        solver = optx.Newton(1e-6, 1e-6)
        return optx.root_find(fn, solver, jnp.ones(3), a, max_steps=20).value.sum()

    a = jnp.array([0.0, 1.0, 4.0])
    whole = lambda a: root(residual, a)  # noqa: E731
    hits = [s for s in hg.explain(whole, a).unguarded if s.op == "custom_jvp_call"]
    assert hits and "sqrt" in hits[0].reason
    inner = jax.grad(lambda a: root(hg.guard(residual), a))(a)
    np.testing.assert_allclose(inner, jax.grad(lambda a: root(residual_dw, a))(a), rtol=1e-6)
    assert hg.diagnose(whole, a).groups


def test_equinox_nondifferentiable_backward_passes_lanes_through_unreported():
    """Equinox's ``nondifferentiable_backward`` (four in every optimistix solve)
    is the identity, whose transpose only checks that the cotangent is zero:
    a pass-through op, not a primitive without a rule ('no rule ... treated
    as fully live' for each, which buried the one report that matters)."""

    def residual(y, a):
        return jnp.where(a > 0, y - jnp.sqrt(a), y)

    a = jnp.array([0.0, 1.0, 4.0])
    report = hg.explain(
        lambda a: optx.root_find(
            residual, optx.Newton(1e-6, 1e-6), jnp.ones(3), a, max_steps=20
        ).value.sum(),
        a,
    )
    ops = [s.op for s in report.unguarded]
    assert "nondifferentiable_backward" not in ops
    assert "custom_jvp_call" in ops  # the solve's own rule is still reported
