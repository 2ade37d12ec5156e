"""Matrix decompositions and solves (``hlo_guard/jax_frontend/rules/linalg.py``):
a batch element none of whose output lanes is used is dead in every lane, so
the NaN of its decomposition (a matrix that is not positive definite,
repeated eigenvalues, a zero pivot) stays out of the gradient; a matrix with
one live output lane is live in every lane, and the site is reported (lanes
within a matrix are not followed).  Oracles: the double where
(dead batch elements replaced by a harmless matrix before the
decomposition) and the plain program where nothing is structurally dead."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard

VALID = jnp.array([True, False, True])


def _batch(good, bad):
    return jnp.stack([jnp.asarray(good[0]), jnp.asarray(bad), jnp.asarray(good[1])])


SPD = ([[4.0, 1.0], [1.0, 3.0]], [[2.0, 0.5], [0.5, 5.0]])

CASES = {
    # the dead element is not positive definite: its Cholesky factor is NaN
    "cholesky": (
        lambda a: jnp.sum(jnp.log(jnp.diagonal(jnp.linalg.cholesky(a), axis1=-2, axis2=-1)), -1),
        _batch(SPD, [[1.0, 2.0], [2.0, 1.0]]),
    ),
    # repeated eigenvalues: the eigenvector derivative divides by w_i - w_j = 0
    "eigh": (
        lambda a: jnp.sum(jnp.linalg.eigh(a)[1][..., 0] ** 2 * jnp.arange(1.0, 3.0), -1),
        _batch(SPD, [[1.0, 0.0], [0.0, 1.0]]),
    ),
    # repeated singular values, the same division
    "svd": (
        lambda a: jnp.sum(jnp.linalg.svd(a)[0][..., 0] * jnp.arange(1.0, 3.0), -1),
        _batch(SPD, [[2.0, 0.0], [0.0, 2.0]]),
    ),
    # a zero on the diagonal: the solve divides by it
    "triangular_solve": (
        lambda a: jnp.sum(
            jax.scipy.linalg.solve_triangular(a, jnp.ones(a.shape[:-1])[..., None], lower=True),
            (-2, -1),
        ),
        _batch(SPD, [[0.0, 0.0], [1.0, 1.0]]),
    ),
    # an LU of a singular matrix: the factors' derivative divides by the zero pivot
    "lu": (
        lambda a: jnp.sum(jax.lax.linalg.lu(a)[0][..., 1, :] * jnp.arange(1.0, 3.0), -1),
        _batch(SPD, [[0.0, 0.0], [0.0, 0.0]]),
    ),
    # a QR of a rank-deficient matrix: R's derivative divides by its zero diagonal
    "qr": (
        lambda a: jnp.sum(jnp.diagonal(jnp.linalg.qr(a)[1], axis1=-2, axis2=-1) ** 3, -1),
        _batch(SPD, [[0.0, 0.0], [0.0, 0.0]]),
    ),
}


def masked(case, safe=False):
    body, _ = CASES[case]

    def f(a):
        if safe:
            a = jnp.where(VALID[:, None, None], a, jnp.eye(2) * jnp.array([1.0, 2.0]))
        return jnp.sum(jnp.where(VALID, body(a), 0.0))

    return f


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_dead_batch_element_is_dead_in_every_lane(case):
    _, a = CASES[case]
    f, oracle = masked(case), masked(case, safe=True)
    plain = jax.grad(f)(a)
    assert not np.isfinite(np.asarray(plain)).all(), "plain program should leak"
    want = jax.grad(oracle)(a)
    assert np.isfinite(np.asarray(want)).all()
    g = hlo_guard.guard(f)
    for got in (jax.grad(g)(a), jax.jit(jax.grad(g))(a)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)
    assert jnp.array_equal(g(a), f(a), equal_nan=True)
    # reported, as an op without a rule is: lanes within a matrix are not followed
    report = hlo_guard.explain(f, a)
    names = {s.op for s in report.unguarded}
    assert any(case in n for n in names), str(report)
    assert all("within one matrix" in s.reason for s in report.unguarded), str(report)


def test_a_dead_cholesky_batch_element_in_forward_mode_and_second_order():
    _, a = CASES["cholesky"]
    f, oracle = masked("cholesky"), masked("cholesky", safe=True)
    g = hlo_guard.guard(f)
    np.testing.assert_allclose(jax.jacfwd(g)(a), jax.jacfwd(oracle)(a), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(jax.hessian(g)(a), jax.hessian(oracle)(a), rtol=1e-4, atol=1e-5)


def test_a_matrix_with_one_live_output_lane_is_live_in_every_lane():
    """Only ``L[0, 0]`` of each factor is read: every other output lane is
    dead, the matrix is kept live (no lane guarded), the gradient is the
    plain one, and the report says lanes within the matrix are not followed."""
    a = _batch(SPD, [[3.0, 1.0], [1.0, 2.0]])

    def f(a):
        return jnp.sum(jnp.sqrt(jnp.linalg.cholesky(a)[:, 0, 0]))

    np.testing.assert_array_equal(jax.grad(hlo_guard.guard(f))(a), jax.grad(f)(a))
    report = hlo_guard.explain(f, a)
    assert any("within one matrix" in s.reason for s in report.unguarded), str(report)


def test_an_unread_triangle_is_reported_not_silent():
    """``triangular_solve`` never reads the upper triangle of ``a``: a NaN
    made there meets a zero cotangent.  Lanes within a matrix are not
    followed, so the guarded gradient keeps the plain program's NaN -- and
    the report must say so (it would be a silent miss otherwise)."""
    x = jnp.array([[4.0, 0.0], [1.0, 2.0]])

    def f(x):
        a = jnp.tril(x) + jnp.triu(jnp.sqrt(x), 1)  # sqrt'(0) on the unread entry
        return jnp.sum(jax.scipy.linalg.solve_triangular(a, jnp.ones((2, 1)), lower=True))

    plain = jax.grad(f)(x)
    assert np.isnan(np.asarray(plain)).any()
    got = jax.grad(hlo_guard.guard(f))(x)
    assert np.isnan(np.asarray(got)).any()
    report = hlo_guard.explain(f, x)
    assert any(
        "triangular_solve" in s.op and "within one matrix" in s.reason for s in report.unguarded
    ), str(report)
