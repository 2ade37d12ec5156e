"""A guarded function that already holds AD -- ``guard(jax.grad(f))`` --
keeps plain JAX's NaN as a forward value (the contract), so the report must
name it.  Found by a user-style hunt: JAX's own backward pass of ``where(x >
0, log(x), 0)`` divides a where-made zero by ``x`` (``0 / 0``), and
``maximum``'s JVP coefficient is a *nested* selection (``select_n(c,
select_n(t, 0, .5), 1)``, before JAX 0.11 a ``div`` of two) times
``0.5 / sqrt(0)``; the reports were clean.  Each is now an unguarded site, and
code that is correct stays clean."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.special import entr, xlogy

import hlo_guard
from hlo_guard import explain

_X = jnp.array([-1.0, 0.0, 0.5, 2.0], jnp.float32)
_X_NO_TIE = jnp.array([-1.0, -2.0, 0.5, 2.0], jnp.float32)
_T = jnp.ones(4, jnp.float32)


def _pos(x):
    return jnp.where(x > 0, x, 1.0)


def _jvp(f):
    return lambda x: jax.jvp(f, (x,), (_T,))[1]


#: name -> (f, its double where, x)
_CASES = {
    "where log": (
        lambda x: jnp.sum(jnp.where(x > 0, jnp.log(x), 0.0)),
        lambda x: jnp.sum(jnp.where(x > 0, jnp.log(_pos(x)), 0.0)),
        _X,
    ),
    "where xlogy": (
        lambda x: jnp.sum(jnp.where(x > 0, xlogy(2.0, x), 0.0)),
        lambda x: jnp.sum(jnp.where(x > 0, xlogy(2.0, _pos(x)), 0.0)),
        _X,
    ),
    "where entr": (
        lambda x: jnp.sum(jnp.where(x > 0, entr(x), 0.0)),
        lambda x: jnp.sum(jnp.where(x > 0, entr(_pos(x)), 0.0)),
        _X,
    ),
    "where log_sigmoid(log)": (
        lambda x: jnp.sum(jnp.where(x > 0, jax.nn.log_sigmoid(jnp.log(x)), 0.0)),
        lambda x: jnp.sum(jnp.where(x > 0, jax.nn.log_sigmoid(jnp.log(_pos(x))), 0.0)),
        _X,
    ),
    "sqrt of maximum": (
        lambda x: jnp.sum(jnp.sqrt(jnp.maximum(x, 0.0)) * x),
        lambda x: jnp.sum(jnp.where(x > 0, jnp.sqrt(_pos(x)), 0.0) * x),
        _X_NO_TIE,
    ),
    "softplus of maximum of log": (
        lambda x: jnp.sum(jax.nn.softplus(jnp.maximum(jnp.log(jnp.abs(x)), -3.0))),
        lambda x: jnp.sum(
            jnp.where(
                x != 0,
                jax.nn.softplus(jnp.log(jnp.abs(jnp.where(x != 0, x, 1.0)))),
                jax.nn.softplus(-3.0),
            )
        ),
        _X,
    ),
}

_TRANSFORMS = {
    "grad": jax.grad,
    "jacrev": jax.jacrev,
    "jacfwd": jax.jacfwd,
    "hessian": jax.hessian,
    "jvp": _jvp,
}

#: (case, transform) whose plain value is NaN where the double where's is not
_NAN = [
    (case, t)
    for case in ("where log", "where xlogy", "where entr", "where log_sigmoid(log)")
    for t in ("grad", "jacrev", "hessian")
] + [
    (case, t)
    for case in ("sqrt of maximum", "softplus of maximum of log")
    for t in ("grad", "jacrev", "jacfwd", "hessian", "jvp")
]


def _where_made(report):
    return [u for u in report.unguarded if "where-made zero" in u.reason]


@pytest.mark.parametrize("case,transform", _NAN, ids=[f"{c}-{t}" for c, t in _NAN])
def test_ad_inside_the_guard_is_reported_where_its_value_is_nan(case, transform):
    """The guarded function's value is plain JAX's, NaN where the double
    where's is finite; the report names the ``div``/``mul`` and says to
    write ``jax.grad(guard(f))`` -- eager and under ``jax.jit``."""
    f, oracle, x = _CASES[case]
    T = _TRANSFORMS[transform]
    g = hlo_guard.guard(T(f))
    value = np.asarray(g(x))
    np.testing.assert_array_equal(value, np.asarray(T(f)(x)))  # forward values unchanged
    np.testing.assert_array_equal(np.asarray(jax.jit(g)(x)), np.asarray(jax.jit(T(f))(x)))
    assert np.isnan(value).any() and np.isfinite(np.asarray(T(oracle)(x))).all()
    for fn in (g, jax.jit(g)):
        reported = _where_made(explain(fn, x))
        assert reported, (case, transform)
        assert {u.op for u in reported} <= {"div", "mul"}
        assert all("jax.grad(guard(f))" in u.reason for u in reported)


@pytest.mark.parametrize("case", sorted(_CASES))
def test_the_gradient_of_the_guarded_function_is_finite_and_clean(case):
    """``jax.grad(guard(f))`` -- what the report tells the user to write --
    is finite, equal to the double where's gradient, and ``guard(f)``'s
    report names no where-made zero."""
    f, oracle, x = _CASES[case]
    grad = np.asarray(jax.grad(hlo_guard.guard(f))(x))
    np.testing.assert_allclose(grad, np.asarray(jax.grad(oracle)(x)), rtol=1e-6)
    assert not _where_made(explain(hlo_guard.guard(f), x))
    assert not _where_made(explain(f, x))


_M = jnp.array([True, False, True, False])

#: a where-made zero divided by a divisor that is nonzero in its lanes
_SAFE_QUOTIENTS = {
    "masked mean (lanes)": lambda x: jnp.sum(jnp.where(_M, x, 0.0) / jnp.maximum(jnp.sum(_M), 1)),
    "masked mean": lambda x: jnp.sum(jnp.where(_M, x, 0.0)) / jnp.maximum(jnp.sum(_M), 1),
    "by a constant": lambda x: jnp.sum(jnp.where(x > 0, x, 0.0) / 2.0),
    "by a negative constant": lambda x: jnp.sum(jnp.where(x > 0, x, 0.0) / -3.0),
    "double where": lambda x: jnp.sum(jnp.where(x > 0, 1.0, 0.0) / jnp.where(x > 0, x, 1.0)),
}


@pytest.mark.parametrize("name", sorted(_SAFE_QUOTIENTS))
def test_a_where_made_zero_over_a_nonzero_divisor_is_not_reported(name):
    """A divisor known nonzero in the zeroed lanes (``maximum(count, 1)``'s
    lower bound, a constant, the double where's ``where(c, x, 1)`` on the
    same predicate) cannot make ``0 / 0``: clean, also as ``guard(jax.grad)``
    (not the double where's: its backward pass multiplies the where-made zero
    by ``1 / x ** 2``, which the ``mul`` check, blind to lanes, reports)."""
    f = _SAFE_QUOTIENTS[name]
    fns = [hlo_guard.guard(f)] + ([] if name == "double where" else [hlo_guard.guard(jax.grad(f))])
    for fn in fns:
        assert np.isfinite(np.asarray(fn(_X))).all()
        assert not _where_made(explain(fn, _X)), name


def test_a_where_made_zero_over_an_unknown_divisor_is_reported():
    """``where(c, 1, 0) / x``: nothing says ``x`` is nonzero where ``c`` is
    false -- 0 / 0 at ``x = 0`` -- reported on the ``div``."""
    f = lambda x: jnp.sum(jnp.where(x > 0, 1.0, 0.0) / x)  # noqa: E731
    assert np.isnan(np.asarray(f(_X))).any()
    assert [u.op for u in _where_made(explain(f, _X))] == ["div"]


_POINTS = jnp.array([[0.0, 0.0], [1.0, 0.5], [1.0, 0.5]], jnp.float32)
_R2 = jnp.sum((_POINTS[:, None] - _POINTS[None]) ** 2, -1)


def _matern32(ell, double_where=False):
    """A Matern 3/2 kernel sum over pairwise distances (zero on the diagonal
    and for the duplicated point), differentiated in its lengthscale."""
    inner = jnp.where(_R2 > 0, _R2, 1.0) if double_where else _R2
    r = jnp.where(_R2 > 0, jnp.sqrt(inner), 0.0)
    a = np.float32(np.sqrt(3.0)) * r / ell
    return jnp.sum((1 + a) * jnp.exp(-a))


def test_a_where_made_zero_over_a_divisor_shared_by_every_lane_is_not_reported():
    """``r / ell`` with a scalar lengthscale: if ``ell`` is 0 every lane's
    quotient is singular, the user's own division, not the where's (found by
    a user-style hunt: every Matern kernel differentiated in ``ell``)."""
    ell = jnp.float32(0.8)
    assert not _where_made(explain(_matern32, ell))
    for T in (jax.grad, jax.hessian):
        np.testing.assert_allclose(
            T(hlo_guard.guard(_matern32))(ell), T(lambda e: _matern32(e, True))(ell), rtol=1e-6
        )


def test_a_where_made_zero_over_its_own_scalar_divisor_is_still_reported():
    """One lane: the divisor is not shared with any lane the where keeps."""
    f = lambda x: jnp.where(x > 0, 1.0, 0.0) / x  # noqa: E731
    assert np.isnan(np.asarray(f(jnp.float32(0.0))))
    assert [u.op for u in _where_made(explain(f, jnp.float32(0.0)))] == ["div"]


_ROWS = jnp.array([[1.0, 2.0, 2.0], [0.5, -1.0, 3.0], [0.0, 0.0, 0.0]])
_ROW_MASK = jnp.array([True, False, True])
_W = jnp.arange(1.0, 4.0)


def _padded(x):
    return jnp.where(_ROW_MASK[:, None], x, 0.0)


#: the safe normalisation a user writes (the quotient taken only where the
#: predicate makes its divisor nonzero), and its double where
_SELECTED_QUOTIENTS = {
    "n2 > 0, p / sqrt(n2)": (
        lambda p, n2: jnp.where(n2 > 0, p / jnp.sqrt(n2), 0.0),
        lambda p, n2: jnp.where(n2 > 0, p / jnp.sqrt(jnp.where(n2 > 0, n2, 1.0)), 0.0),
    ),
    "norm != 0, p / norm": (
        lambda p, n2: jnp.where(jnp.sqrt(n2) != 0, p / jnp.sqrt(n2), 0.0),
        lambda p, n2: jnp.where(n2 != 0, p / jnp.sqrt(jnp.where(n2 != 0, n2, 1.0)), 0.0),
    ),
    "0 < n2, p / n2": (
        lambda p, n2: jnp.where(0 < n2, p / n2, 0.0),
        lambda p, n2: jnp.where(0 < n2, p / jnp.where(0 < n2, n2, 1.0), 0.0),
    ),
    "n2 <= 0 takes 0": (
        lambda p, n2: jnp.where(n2 <= 0, 0.0, p / jnp.sqrt(n2)),
        lambda p, n2: jnp.where(n2 <= 0, 0.0, p / jnp.sqrt(jnp.where(n2 <= 0, 1.0, n2))),
    ),
}


def _normalised(quotient):
    def f(x):
        p = _padded(x)
        n2 = jnp.sum(p**2, -1, keepdims=True)
        return jnp.sum(quotient(p, n2) * _W)

    return f


@pytest.mark.parametrize("name", sorted(_SELECTED_QUOTIENTS))
def test_a_quotient_taken_only_where_its_divisor_is_nonzero_is_not_reported(name):
    """``where(n2 > 0, p / sqrt(n2), 0)`` with ``p`` where-made: the ``0 / 0``
    lanes are never taken.  It was reported, telling the user to write what
    they had written (a hunt, 2026-11-28: Flax NNX mean-pool then normalise).
    The gradient equals the double where's."""
    quotient, double_where = _SELECTED_QUOTIENTS[name]
    f = _normalised(quotient)
    assert not _where_made(explain(f, _ROWS)), name
    np.testing.assert_allclose(
        jax.grad(hlo_guard.guard(f))(_ROWS), jax.grad(_normalised(double_where))(_ROWS), rtol=1e-6
    )


_LEAKING_QUOTIENTS = {
    # the predicate does not say the divisor is nonzero where the quotient is taken
    "taken where n2 <= 0": lambda p, n2: jnp.where(n2 <= 0, p / jnp.sqrt(n2), 0.0),
    "predicate on another value": lambda p, n2: jnp.where(n2 + 1 > 0, p / jnp.sqrt(n2), 0.0),
    # the quotient has a second, unselected reader
    "read again": lambda p, n2: jnp.where(n2 > 0, p / jnp.sqrt(n2), 0.0) + p / jnp.sqrt(n2),
}


@pytest.mark.parametrize("name", sorted(_LEAKING_QUOTIENTS))
def test_a_quotient_whose_nan_can_be_taken_is_still_reported(name):
    f = _normalised(_LEAKING_QUOTIENTS[name])
    assert np.isnan(np.asarray(f(_ROWS))).any()  # the 0 / 0 reaches the output
    assert [u.op for u in _where_made(explain(f, _ROWS))] == ["div"], name


_TOKENS = jnp.array([0, 2, 1, 0])


def _token_mask():
    return (_TOKENS > 0).astype(jnp.float32)


def test_a_boolean_mask_cast_to_float_is_a_where_made_zero():
    """``cast(mask) * loss`` -- how Keras applies a propagated mask -- is
    ``where(mask, 1, 0) * loss`` written as a conversion: a zero by value,
    ``0 * inf`` behind a row norm of a padded row.  Plain JAX is NaN and the
    report was clean (a hunt, 2026-11-28); it now names the ``mul``."""

    def f(x):
        return jnp.sum(_token_mask() * jnp.sqrt(jnp.sum(x**2, -1)))

    x = jnp.array([[0.0, 0.0], [1.0, 2.0], [3.0, 0.0], [0.0, 0.0]])
    assert np.isnan(np.asarray(jax.grad(hlo_guard.guard(f))(x))).any()
    assert [u.op for u in _where_made(explain(f, x))] == ["mul"]


_LOGITS = jnp.array([[1.0, -2.0, 0.5], [0.0, 3.0, -1.0], [2.0, 2.0, 2.0], [-5.0, 0.0, 1.0]])

#: one-hot cross-entropies: a 0/1 mask times a softmax's max-shifted log,
#: whose derivative is bounded -- no ``0 * inf``, nothing to report
_ONE_HOT_LOSSES = {
    "one_hot * log_softmax": lambda z: -jnp.sum(jax.nn.one_hot(_TOKENS, 3) * jax.nn.log_softmax(z)),
    "logsumexp - picked": lambda z: jnp.sum(
        jax.nn.logsumexp(z, -1) - jnp.sum(jax.nn.one_hot(_TOKENS, 3) * z, -1)
    ),
    "masked token mean": lambda z: (
        -jnp.sum(_token_mask()[:, None] * jax.nn.one_hot(_TOKENS, 3) * jax.nn.log_softmax(z))
    ),
}


@pytest.mark.parametrize("name", sorted(_ONE_HOT_LOSSES))
def test_a_one_hot_cross_entropy_is_not_reported(name):
    f = _ONE_HOT_LOSSES[name]
    assert np.isfinite(np.asarray(jax.grad(f)(_LOGITS))).all()
    assert not _where_made(explain(f, _LOGITS)), name


def test_a_log_of_a_softmax_is_still_reported():
    """``log(softmax(z))`` is not shifted: a softmax lane can underflow to 0,
    and ``log'(0)`` is infinite -- the mask's zero meets it."""
    f = lambda z: -jnp.sum(jax.nn.one_hot(_TOKENS, 3) * jnp.log(jax.nn.softmax(z)))  # noqa: E731
    assert [u.op for u in _where_made(explain(f, _LOGITS))] == ["mul"]


@pytest.mark.parametrize(
    "f",
    [
        lambda x: jnp.sum(jax.nn.relu(x) ** 2 + jnp.maximum(x, 0.0) * 3),
        lambda x: jnp.sum(jnp.clip(x, -0.5, 1.0) ** 2),
    ],
    ids=["relu", "clip"],
)
def test_a_selection_s_coefficient_times_a_bounded_cotangent_is_not_reported(f):
    """``maximum``'s and ``clip``'s JVP coefficients are where-made zeros
    (before JAX 0.11 a ``div`` of two selections between constants); times a
    cotangent with no singular operation behind it -- or times each other,
    with no derivative at all -- they are no ``0 * inf``: clean, and finite."""
    for T in (jax.grad, jax.hessian):
        g = hlo_guard.guard(T(f))
        assert np.isfinite(np.asarray(g(_X))).all()
        assert not _where_made(explain(g, _X))


_R = jnp.array([0.5, 1.0, 1.8, 2.5, 3.0], jnp.float32)
_XR = jnp.array([1.0, -2.0, 0.5, 3.0, 1.5], jnp.float32)


def _smooth(r):
    """jax_md's ``multiplicative_isotropic_cutoff`` switch: 1 below the
    onset, a polynomial to the cutoff, a where-made 0 beyond it."""
    inner = jnp.where(r < 2.0, (4.0 - r**2) ** 2 * (4.0 + 2 * r**2 - 3 * 1.5**2) / 1.75**3, 0.0)
    return jnp.where(r < 1.5, 1.0, inner)


def _smooth_lanes(r):
    """The switch per lane, in Python."""
    out = []
    for ri in np.asarray(r, np.float64):
        if ri < 1.5:
            out.append(1.0)
        elif ri < 2.0:
            out.append((4.0 - ri**2) ** 2 * (4.0 + 2 * ri**2 - 3 * 1.5**2) / 1.75**3)
        else:
            out.append(0.0)
    return np.array(out)


def test_a_cutoff_times_a_quotient_by_the_cut_distance_is_not_reported():
    """jax_md's ``lennard_jones_pair(..., r_onset, r_cutoff)`` differentiated
    in ``sigma``: the switch is zero only where ``dr >= r_cutoff > 0``, where
    ``sigma / dr`` is finite.  It was reported as ``0 * inf`` (a hunt,
    2026-11-28).  The derivative equals the per-lane one."""

    def energy(sigma):
        idr6 = (sigma / _R) ** 6
        return jnp.sum(_smooth(_R) * 4.0 * (idr6 * idr6 - idr6))

    assert not _where_made(explain(energy, jnp.float32(1.0)))
    r = np.asarray(_R, np.float64)
    per_lane = _smooth_lanes(_R) * 4.0 * (12.0 / r**12 - 6.0 / r**6)
    got = jax.grad(hlo_guard.guard(energy))(jnp.float32(1.0))
    np.testing.assert_allclose(float(got), per_lane.sum(), rtol=1e-5)


def test_a_mask_times_a_where_taken_sqrt_is_not_reported():
    """``m * where(x > 0, sqrt(x), 0)``: the ``sqrt`` is taken only where
    ``x > 0``, so its derivative is finite in every lane the mask zeroes."""
    m = jnp.array([True, False, True, False, True])
    x = jnp.array([4.0, 0.0, -1.0, 0.0, 0.25])

    def f(x):
        return jnp.sum(m.astype(jnp.float32) * jnp.where(x > 0, jnp.sqrt(x), 0.0))

    assert not _where_made(explain(f, x))
    per_lane = [0.5 / np.sqrt(xi) if (mi and xi > 0) else 0.0 for mi, xi in zip(m, x)]
    np.testing.assert_array_equal(jax.grad(hlo_guard.guard(f))(x), np.float32(per_lane))


_DEGREES = jnp.array([1.0, 2.0, 0.5, 0.0], jnp.float32)
_EDGE_MASK = jnp.array([True, True, True, False, False])


def _gcn_norm(d):
    return jnp.where(d > 0, d**-0.5, 0.0)


def _gcn_norm_double_where(d):
    return jnp.where(d > 0, jnp.where(d > 0, d, 1.0) ** -0.5, 0.0)


def _attention(z):
    return jnp.where(_EDGE_MASK, jax.nn.softmax(jnp.where(_EDGE_MASK, z, -jnp.inf)), 0.0)


def _entropy(a, log_of):
    return -jnp.sum(jnp.where(a > 0, a * log_of(a), 0.0))


def _mul_exp(x, logp):
    """distrax's ``utils.math.mul_exp`` (every ``Categorical``/``Softmax``
    entropy and KL, rlax's entropy losses): ``x * exp(logp)``, zero where the
    exponential underflows."""
    p = jnp.exp(logp)
    return jnp.where(p == 0, 0.0, x) * p


def _mul_exp_double_where(x, logp):
    p = jnp.exp(logp)
    return jnp.where(p == 0, 0.0, jnp.where(p == 0, 0.0, x) * p)


#: name -> (f, its double where, x): found by user-style hunts (2026-11-28,
#: graph networks with padded nodes; distrax and rlax entropies): reported,
#: though exact
_WHERE_KEEPS_FINITE = {
    "gcn norm * gcn norm": (
        lambda d: jnp.sum(_gcn_norm(d) * _gcn_norm(d) * jnp.array([1.0, 1.0, 1.0, 0.0])),
        lambda d: jnp.sum(
            _gcn_norm_double_where(d) * _gcn_norm_double_where(d) * jnp.array([1.0, 1.0, 1.0, 0.0])
        ),
        _DEGREES,
    ),
    "entropy of padded attention": (
        lambda z: _entropy(_attention(z), jnp.log),
        lambda z: _entropy(_attention(z), lambda a: jnp.log(jnp.where(a > 0, a, 1.0))),
        jnp.array([0.3, -200.0, 2.0, 0.5, 0.1]),
    ),
    # where exp(logp) == 0 its derivative, exp(logp), is 0 as well
    "distrax mul_exp entropy": (
        lambda z: -jnp.sum(_mul_exp(jax.nn.log_softmax(z), jax.nn.log_softmax(z))),
        lambda z: -jnp.sum(_mul_exp_double_where(jax.nn.log_softmax(z), jax.nn.log_softmax(z))),
        jnp.array([[1.0, 2.0, -1.0, 0.3], [0.5, 0.1, -200.0, -2.0]]),
    ),
    # zero only where exp(y) underflows anyway: y < -50 bounds it
    "where(y < -50, 0, y) * exp(y)": (
        lambda y: jnp.sum(jnp.where(y < -50.0, 0.0, y) * jnp.exp(y)),
        lambda y: jnp.sum(jnp.where(y < -50.0, 0.0, y * jnp.exp(y))),
        jnp.array([1.0, -3.0, -100.0, 49.0]),
    ),
}


@pytest.mark.parametrize("name", sorted(_WHERE_KEEPS_FINITE))
def test_a_where_keeping_the_singular_factor_finite_is_not_reported(name):
    """``where(d > 0, d ** -0.5, 0)`` squared: each factor's zero lanes are
    where ``d <= 0``, and the other's ``pow`` is taken only where ``d > 0``.
    ``where(a > 0, a * log(a), 0)`` never takes the lanes where ``a`` is
    zero.  Gradients equal the double where's."""
    f, double_where, x = _WHERE_KEEPS_FINITE[name]
    assert not _where_made(explain(f, x)), name
    for T in (jax.grad, jax.jacfwd):
        np.testing.assert_allclose(T(hlo_guard.guard(f))(x), T(double_where)(x), rtol=1e-6)


_ZERO_R = jnp.array([0.0, 1.0, 2.5], jnp.float32)
_SQUARE_R = jnp.array([[1.0, 0.0], [3.0, 1.0]], jnp.float32)

#: name -> (f, x): the zeroed lanes do meet an infinite derivative
_ZEROED_LANES_MEET_INF = {
    # the divisor is not the compared value
    "divisor is another value": (
        lambda x: jnp.sum(jnp.where(_R < 2.0, 1.0 - _R, 0.0) * (x / (_R - 3.0))),
        _XR,
    ),
    # zero where r <= 2, and r is 0 there
    "zero where the divisor can be 0": (
        lambda x: jnp.sum(jnp.where(_ZERO_R > 2.0, _ZERO_R, 0.0) * (x / _ZERO_R)),
        jnp.ones(3),
    ),
    # the quotient is transposed: the zeroed lane [1, 0] meets 1 / r[0, 1] = 1 / 0
    "lanes transposed between": (
        lambda x: jnp.sum(jnp.where(_SQUARE_R < 2.0, 1.0, 0.0) * (x / _SQUARE_R.T)),
        jnp.ones((2, 2)),
    ),
    # nor does it make x ** 0.5 finite to differentiate
    "mask times where(x >= 0, x ** 0.5)": (
        lambda x: jnp.sum(
            jnp.array([True, False]).astype(jnp.float32) * jnp.where(x >= 0, x**0.5, 0.0)
        ),
        jnp.array([1.0, 0.0]),
    ),
    # zero where exp(y) is large: exp(100) = inf in float32, and 0 * inf
    "zero where the exponential is large": (
        lambda y: jnp.sum(jnp.where(jnp.exp(y) > 5.0, 0.0, y) * jnp.exp(y)),
        jnp.array([1.0, 100.0]),
    ),
    # a bound on another value says nothing about this exponential
    "zero where another value is bounded": (
        lambda y: jnp.sum(jnp.where(-y < 0.0, 0.0, y) * jnp.exp(y)),
        jnp.array([-1.0, 100.0]),
    ),
    # x >= 0 does not make x nonzero
    "mask times where(x >= 0, sqrt)": (
        lambda x: jnp.sum(
            jnp.array([1.0, 0.0]) * (jnp.array([True, False]).astype(jnp.float32))
            + jnp.array([True, False]).astype(jnp.float32) * jnp.where(x >= 0, jnp.sqrt(x), 0.0)
        ),
        jnp.array([1.0, 0.0]),
    ),
}


@pytest.mark.parametrize("name", sorted(_ZEROED_LANES_MEET_INF))
def test_a_zero_meeting_an_infinite_derivative_is_still_reported(name):
    f, x = _ZEROED_LANES_MEET_INF[name]
    assert np.isnan(np.asarray(jax.grad(hlo_guard.guard(f))(x))).any(), name
    assert "mul" in [u.op for u in _where_made(explain(f, x))], name


def test_a_chain_of_wheres_is_walked_once(monkeypatch):
    """Each ``where`` on the way adds what its predicate says, so the walk
    behind the masked factor could visit a chain of 30 ``where(x > .5,
    sqrt(x), x)`` once per path (2**30).  It takes the values with fewest
    facts first: within a budget of 600 values the chain is excused, and the
    gradient equals the per-lane double where's."""
    from hlo_guard.jax_frontend.rules import where_made_zeros

    monkeypatch.setattr(where_made_zeros, "_MAX_WALK", 600)
    m = jnp.array([True, False, True, True])

    def chain(x, double_where=False):
        for _ in range(30):
            inner = jnp.where(x > 0.5, x, 1.0) if double_where else x
            x = jnp.where(x > 0.5, jnp.sqrt(inner), x) + 0.25
        return x

    def f(x):
        return jnp.sum(m.astype(jnp.float32) * chain(x))

    x = jnp.array([0.1, 1.0, 2.0, 0.0])
    assert not _where_made(explain(f, x))
    lane = jax.grad(lambda xi: chain(xi, double_where=True))
    per_lane = [float(lane(xi)) if mi else 0.0 for mi, xi in zip(m, x)]
    np.testing.assert_allclose(jax.grad(hlo_guard.guard(f))(x), per_lane, rtol=1e-6)
