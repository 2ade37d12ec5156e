"""A value computed before a ``cond``/``switch`` and read only by branches the
index may not take.

The untaken branch's transpose sends that operand an instantiated zero, and
``1 / n`` or ``sqrt`` computed before the ``cond`` turns it into NaN: jaxopt's
``projection_l2_ball`` (``cond(n <= 1, lambda: x, lambda: x / n)``) at
``x = 0``.  The operand is dead whenever the index picks a branch that does not
read it, so it is guarded before the ``cond`` with that one-bit mask.  Oracles:
the same computation moved into the branch that reads it, or made safe with a
hand double where.  (Found by a user-style hunt, 2026-11-28; it was a silent
miss: no guard and nothing reported.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hlo_guard
from hlo_guard.inspect.explain import explain


def project_to_ball(x):
    """jaxopt's ``projection_l2_ball`` with radius 1, written out."""
    n = jnp.sqrt(jnp.sum(x**2))
    factor = 1.0 / n
    return lax.cond(n <= 1.0, lambda: x, lambda: factor * x)


def project_to_ball_double_where(x):
    n2 = jnp.sum(x**2)
    factor = 1.0 / jnp.sqrt(jnp.where(n2 <= 1.0, 1.0, n2))
    return lax.cond(n2 <= 1.0, lambda: x, lambda: factor * x)


def _loss(project):
    return lambda x: jnp.sum(project(x) * jnp.arange(1.0, 4.0))


POINTS = [jnp.zeros(3), jnp.array([0.3, 0.0, -0.4]), jnp.array([3.0, 4.0, 0.0])]


@pytest.mark.parametrize("x", POINTS, ids=["origin", "inside", "outside"])
@pytest.mark.parametrize(
    "transform",
    [jax.grad, jax.jacfwd, jax.hessian, lambda f: jax.jit(jax.grad(f))],
    ids=["grad", "jacfwd", "hessian", "jit_grad"],
)
def test_projection_equals_the_double_where(transform, x):
    guarded = transform(hlo_guard.guard(_loss(project_to_ball)))(x)
    want = transform(_loss(project_to_ball_double_where))(x)
    np.testing.assert_allclose(np.asarray(guarded), np.asarray(want), rtol=1e-6, atol=1e-7)
    assert np.isfinite(np.asarray(guarded)).all()


def test_the_origin_was_nan_and_the_forward_is_unchanged():
    x = jnp.zeros(3)
    assert np.isnan(np.asarray(jax.grad(_loss(project_to_ball))(x))).all()
    for p in POINTS:
        np.testing.assert_array_equal(
            hlo_guard.guarded_jit(project_to_ball)(p), jax.jit(project_to_ball)(p)
        )


def test_explain_names_the_cond_as_the_selection():
    report = explain(_loss(project_to_ball), jnp.zeros(3))
    assert not report.unguarded
    (site,) = report.sites
    assert [o.op for o in site.origins] == ["cond"]


def test_explain_says_which_branch_leaves_the_operand_dead():
    """The origin names the predicate's value (``cond``) or the branch
    numbers (``switch``) under which the operand is dead, not just "lanes
    `cond` drops"."""

    def sqrt_before_cond(x):
        s = jnp.sqrt(x)
        return lax.cond(x > 0, lambda: s, lambda: -x)

    (site,) = explain(sqrt_before_cond, 0.0).sites
    assert [o.meaning for o in site.origins] == ["every lane, when `x > 0` is false"]
    meanings = {s.op: s.origins[0].meaning for s in explain(_switch, 0.0).sites}
    assert "picks branches 0, 2 (which do not read it)" in meanings["sqrt"]
    assert "picks branches 0, 1 (which do not read it)" in meanings["log"]


def _switch(x):
    s, lg = jnp.sqrt(x), jnp.log(x)  # infinite derivatives at 0
    i = jnp.where(x > 1, 2, jnp.where(x > 0, 1, 0))
    return lax.switch(i, [lambda: -x, lambda: s, lambda: lg + 1.0])


def _switch_moved_inside(x):
    i = jnp.where(x > 1, 2, jnp.where(x > 0, 1, 0))
    return lax.switch(i, [lambda: -x, lambda: jnp.sqrt(x), lambda: jnp.log(x) + 1.0])


@pytest.mark.parametrize("x", [-1.0, 0.0, 0.25, 4.0])
def test_switch_operands_equal_the_computation_moved_into_its_branch(x):
    x = jnp.float32(x)
    for transform in (jax.grad, jax.jacfwd, jax.hessian):
        got = transform(hlo_guard.guard(_switch))(x)
        np.testing.assert_allclose(got, transform(_switch_moved_inside)(x), rtol=1e-6)


def test_taken_branch_keeps_its_genuine_singularity():
    """``x = 0`` with the branch reading ``1 / x`` taken: infinite, as in
    the computation moved into the branch."""

    def f(x):
        r = 1.0 / x
        return lax.cond(x >= 0, lambda: r, lambda: x)

    def moved(x):
        return lax.cond(x >= 0, lambda: 1.0 / x, lambda: x)

    got = jax.grad(hlo_guard.guard(f))(jnp.float32(0.0))
    assert not np.isfinite(got) and not np.isfinite(jax.grad(moved)(jnp.float32(0.0)))
    np.testing.assert_array_equal(jax.grad(hlo_guard.guard(f))(jnp.float32(-2.0)), 1.0)


def test_vector_operand_read_by_one_branch():
    def g(v):
        r = 1.0 / v
        return lax.cond(v[0] > 0, lambda: jnp.sum(r * v[0]), lambda: jnp.sum(v))

    v = jnp.array([0.0, 1.0, 2.0])
    assert np.isnan(np.asarray(jax.grad(g)(v))).any()
    np.testing.assert_array_equal(jax.grad(hlo_guard.guard(g))(v), [1.0, 1.0, 1.0])


def test_per_example_cond_under_vmap():
    """Batched, the ``cond`` becomes a ``select`` per example."""
    batch = jnp.stack(POINTS)
    got = jax.vmap(jax.grad(hlo_guard.guard(_loss(project_to_ball))))(batch)
    want = jax.vmap(jax.grad(_loss(project_to_ball_double_where)))(batch)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
