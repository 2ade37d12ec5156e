"""Value mode (``guard(f, mode="value")``, ``guarded_jit(f, guard_mode="value")``):
value-dead lanes get a safe point, so NaN checkers run clean.

Oracles are the hand-written double wheres; forward values must be bitwise
those of ``f``; lanes that still decide the forward (max/min losers, values read
by ``argmax``) must never be substituted.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlo_guard import guard, guarded_jit
from hlo_guard.errors import GuardUsageError

X = jnp.array([-1.0, 0.0, 0.25, 0.5, 2.0, 4.0])


def where_sqrt(x):
    return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))


def where_sqrt_dw(x):
    ok = x > 0
    return jnp.sum(jnp.where(ok, jnp.sqrt(jnp.where(ok, x, 1.0)), 0.0))


def where_recip(x):
    return jnp.sum(jnp.where(x != 0, 1 / x, 0.0))


def where_recip_dw(x):
    ok = x != 0
    return jnp.sum(jnp.where(ok, 1 / jnp.where(ok, x, 1.0), 0.0))


def clipped_arccos(x):
    ok = jnp.abs(x) < 1
    return jnp.sum(jnp.arccos(jnp.where(ok, x, 0.0)) * jnp.where(ok, 1.0, 0.0))


def arccos_under_where(x):
    return jnp.sum(jnp.where(jnp.abs(x) < 1, jnp.arccos(x), 0.0))


def arccos_under_where_dw(x):
    ok = jnp.abs(x) < 1
    return jnp.sum(jnp.where(ok, jnp.arccos(jnp.where(ok, x, 0.0)), 0.0))


def where_log(x):
    return jnp.sum(jnp.where(x > 0, jnp.log(x), 0.0))


def where_log_dw(x):
    ok = x > 0
    return jnp.sum(jnp.where(ok, jnp.log(jnp.where(ok, x, 1.0)), 0.0))


SEEDS = [
    (where_sqrt, where_sqrt_dw),
    (where_recip, where_recip_dw),
    (arccos_under_where, arccos_under_where_dw),
    (where_log, where_log_dw),
]
IDS = ["sqrt", "recip", "arccos", "log"]


@pytest.fixture
def debug_nans():
    jax.config.update("jax_debug_nans", True)
    jax.config.update("jax_debug_infs", True)
    try:
        yield
    finally:
        jax.config.update("jax_debug_nans", False)
        jax.config.update("jax_debug_infs", False)


@pytest.fixture
def nan_checker():
    jax.config.update("jax_debug_nans", True)
    try:
        yield
    finally:
        jax.config.update("jax_debug_nans", False)


@pytest.mark.parametrize("f,oracle", SEEDS, ids=IDS)
def test_value_mode_grad_and_hessian_clean_under_debug_nans(f, oracle, debug_nans):
    want_g = jax.grad(oracle)(X)
    want_h = jax.hessian(oracle)(X)
    for g in (guarded_jit(f, guard_mode="value"), guard(f, mode="value")):
        np.testing.assert_array_equal(jax.grad(g)(X), want_g)
        np.testing.assert_array_equal(jax.hessian(g)(X), want_h)


def _arctanh_with_a_dropped_log_det(v):
    """As ``distrax.Tanh().inverse``: the log-det is computed from the same
    value and then dropped (found by a hunt, 2026-11-28)."""
    x = jnp.arctanh(v)
    _dropped = jnp.logaddexp(-2.0 * x, 0.0)
    return jnp.sum(jnp.where(jnp.abs(v) < 1, x, 0.0))


def _arctanh_double_where(v):
    ok = jnp.abs(v) < 1
    return jnp.sum(jnp.where(ok, jnp.arctanh(jnp.where(ok, v, 0.0)), 0.0))


def _xlogy_under_where(x):
    return jnp.sum(jnp.where(x > 0, jax.scipy.special.xlogy(x, x), 0.0))


def _xlogy_double_where(x):
    ok = x > 0
    safe = jnp.where(ok, x, 1.0)
    return jnp.sum(jnp.where(ok, jax.scipy.special.xlogy(safe, safe), 0.0))


def _entr_under_where(x):
    return jnp.sum(jnp.where(x > 0, jax.scipy.special.entr(x), 0.0))


def _entr_double_where(x):
    ok = x > 0
    return jnp.sum(jnp.where(ok, jax.scipy.special.entr(jnp.where(ok, x, 1.0)), 0.0))


def _logaddexp_of_log(x):
    """A ``custom_jvp`` (``logaddexp``) between the guarded ``log`` and the
    ``where``: its body keeps lanes apart, so the dead lanes stay value-dead."""
    return jnp.sum(jnp.where(x > 0, jnp.logaddexp(jnp.log(x), 0.0), 0.0))


def _logaddexp_of_log_dw(x):
    ok = x > 0
    return jnp.sum(jnp.where(ok, jnp.logaddexp(jnp.log(jnp.where(ok, x, 1.0)), 0.0), 0.0))


@jax.custom_jvp
def _log1m(x):
    """``log(1 - x)`` with its own rule, singular at 1: the probe for a safe
    point must pass over 1.0."""
    return jnp.log1p(-x)


@_log1m.defjvp
def _log1m_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _log1m(x), t / (x - 1.0)


def _log1m_under_where(x):
    return jnp.sum(jnp.where(x < 0.25, _log1m(x), 0.0))


def _log1m_double_where(x):
    ok = x < 0.25
    return jnp.sum(jnp.where(ok, _log1m(jnp.where(ok, x, 0.5)), 0.0))


CUSTOM = [
    (_xlogy_under_where, _xlogy_double_where),
    (_entr_under_where, _entr_double_where),
    (_logaddexp_of_log, _logaddexp_of_log_dw),
    (_log1m_under_where, _log1m_double_where),
]


@pytest.mark.parametrize("f,oracle", CUSTOM, ids=["xlogy", "entr", "logaddexp", "own_rule"])
def test_custom_derivative_calls_clean_under_debug_nans(f, oracle, request):
    """Lane-wise ``custom_jvp`` calls (jax.scipy's ``xlogy``/``entr``,
    ``logaddexp``, a user's own rule) get a safe point found by probing their
    rule, and values pass through them: the gradient and hessian equal the
    double where and the checker stays quiet (before 2026-11-28 each fell back
    to the gradient guard and raised).  Infinities are checked too, except for
    ``entr``, which builds a ``-inf`` constant of its own (the double where
    trips ``jax_debug_infs`` as well)."""
    request.getfixturevalue("nan_checker" if f is _entr_under_where else "debug_nans")
    x = jnp.array([-1.0, 0.0, 0.5, 1.0, 2.0])
    want_g, want_h = jax.grad(oracle)(x), jax.hessian(oracle)(x)
    for g in (guarded_jit(f, guard_mode="value"), guard(f, mode="value")):
        np.testing.assert_allclose(jax.grad(g)(x), want_g, rtol=1e-6)
        np.testing.assert_allclose(jax.hessian(g)(x), want_h, rtol=1e-6)


@pytest.mark.parametrize("f", [f for f, _ in CUSTOM], ids=["xlogy", "entr", "logaddexp", "own"])
def test_custom_derivative_calls_keep_the_forward(f):
    x = jnp.array([-1.0, 0.0, 0.5, 1.0, 2.0])
    np.testing.assert_array_equal(guarded_jit(f, guard_mode="value")(x), jax.jit(f)(x))


def test_custom_derivative_call_keeps_a_live_singularity():
    """``xlogy(x, x)`` taken at 0: ``log 0`` in the live lane stays infinite."""

    def f(x):
        return jnp.sum(jnp.where(x > -0.5, jax.scipy.special.xlogy(x, x), 0.0))

    g = jax.grad(guard(f, mode="value"))(jnp.array([-1.0, 0.0, 2.0]))
    assert g[0] == 0.0 and not np.isfinite(g[1]) and np.isfinite(g[2])


def test_a_computed_and_dropped_use_does_not_block_value_mode(debug_nans):
    """A use whose result no output and no effect reads decides nothing, so it
    does not make the site fall back to the gradient guard (whose ``atanh``
    of the dead lanes would still compute inf under the checker)."""
    v = jnp.array([0.0, 0.3, 0.9, 1.0, 1.5])
    g = guard(_arctanh_with_a_dropped_log_det, mode="value")
    np.testing.assert_array_equal(g(v), _arctanh_double_where(v))
    np.testing.assert_array_equal(jax.grad(g)(v), jax.grad(_arctanh_double_where)(v))


def test_a_use_with_an_effect_still_observes_the_value(capsys):
    """``jax.debug.print`` of the value is an observer: the site keeps its
    gradient guard, so the printed dead lane is the function's own NaN, not
    a safe point."""

    def f(v):
        x = jnp.arctanh(v)
        jax.debug.print("x = {x}", x=x)
        return jnp.sum(jnp.where(jnp.abs(v) < 1, x, 0.0))

    g = guard(f, mode="value")
    jax.block_until_ready(g(jnp.array([0.5, 1.5])))
    jax.effects_barrier()
    assert "nan" in capsys.readouterr().out


def test_gradient_mode_trips_debug_nans(debug_nans):
    """The reason value mode exists: the default gradient guards keep NaN/inf
    intermediates in dead lanes, which the checker sees."""
    with pytest.raises(FloatingPointError):
        jax.hessian(guarded_jit(where_sqrt))(X)


@pytest.mark.parametrize("wrap", [guard, guarded_jit], ids=["guard", "guarded_jit"])
def test_debug_nans_raises_floating_point_error_like_jax(debug_nans, wrap):
    """A genuine NaN under ``jax_debug_nans`` is JAX's public
    ``FloatingPointError``, as plain ``jax.jit`` raises it, not the internal
    exception an eagerly re-bound ``jit(sqrt)`` equation throws."""

    def f(x):
        return jnp.sqrt(x).sum()

    # jax 0.12 skips the check on a cache hit of an eagerly bound inline jit
    # compiled earlier (by value mode, here): start from empty caches
    jax.clear_caches()
    with pytest.raises(FloatingPointError):
        jax.grad(jax.jit(f))(X)  # the oracle: what JAX does
    with pytest.raises(FloatingPointError):
        jax.grad(wrap(f))(X)


@pytest.mark.parametrize("f", [s[0] for s in SEEDS] + [clipped_arccos], ids=IDS + ["clip"])
def test_value_mode_forward_bitwise_identical(f):
    x = jnp.linspace(-3.0, 3.0, 1001)
    want = np.asarray(jax.jit(lambda x: jax.vmap(f)(x))(x))
    got = np.asarray(jax.jit(lambda x: jax.vmap(guard(f, mode="value"))(x))(x))
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    ev = np.asarray(guard(f, mode="value")(x))
    np.testing.assert_array_equal(ev, np.asarray(f(x)))


def test_max_loser_is_never_substituted():
    """``max(log x, -5)`` at 1e-30: log loses (-69 < -5) and is gradient-dead, but
    substituting log's safe point 1 would make it win (0 > -5)."""

    def f(x):
        return jnp.sum(jnp.maximum(jnp.log(x), -5.0))

    x = jnp.array([1e-30, 2.0])
    for g in (guard(f, mode="value"), guarded_jit(f, guard_mode="value")):
        assert float(g(x)) == float(f(x)) == pytest.approx(-5.0 + np.log(2.0))
        np.testing.assert_array_equal(jax.grad(g)(x), [0.0, 0.5])


def test_value_read_by_argmax_is_never_substituted():
    """The log's NaN lane is dead for the where, but argmax reads its value."""

    def f(x):
        lg = jnp.log(x)
        return jnp.sum(jnp.where(x > 0, lg, 0.0)) + jnp.argmax(lg).astype(x.dtype)

    x = jnp.array([-1.0, 0.5, 2.0])
    assert float(guard(f, mode="value")(x)) == float(f(x))
    assert float(guarded_jit(f, guard_mode="value")(x)) == float(jax.jit(f)(x))


def test_taken_singular_lane_still_nan_or_inf():
    def f(x):
        return jnp.where(x > -2, jnp.sqrt(x), 0.0) + jnp.where(x > -2, 1 / x, 0.0)

    x = jnp.array([-1.0, 0.0, 4.0])
    got = np.asarray(guard(f, mode="value")(x))
    assert np.isnan(got[0]) and np.isinf(got[1]) and got[2] == 2.25


def test_inside_nested_jit_and_cond(debug_nans):
    inner = jax.jit(where_sqrt)

    def f(x):
        return jax.lax.cond(x[0] < 0, jax.jit(lambda y: inner(y) * 2.0), inner, x)

    def dw(x):
        return where_sqrt_dw(x) * 2.0

    np.testing.assert_array_equal(jax.grad(guarded_jit(f, guard_mode="value"))(X), jax.grad(dw)(X))
    np.testing.assert_array_equal(jax.hessian(guard(f, mode="value"))(X), jax.hessian(dw)(X))


def test_scan_body_keeps_gradient_guards():
    """Carries feed back into the body, so value mode does not substitute there
    (conservative); the gradient is still the double-where's."""

    def f(x):
        def step(c, xi):
            return c + where_sqrt(xi), None

        return jax.lax.scan(step, 0.0, x.reshape(2, 3))[0]

    np.testing.assert_array_equal(
        jax.grad(guarded_jit(f, guard_mode="value"))(X), jax.grad(where_sqrt_dw)(X)
    )


def test_invalid_mode_is_a_clear_error():
    with pytest.raises(GuardUsageError, match="mode='values'.*'gradient', 'value'"):
        guard(where_sqrt, mode="values")
    with pytest.raises(GuardUsageError, match="guard_mode=3"):
        guarded_jit(where_sqrt, guard_mode=3)
    with pytest.raises(GuardUsageError, match="guard_mode"):
        guarded_jit(guard_mode="nan")
    assert "mode='value'" in repr(guard(where_sqrt, mode="value"))
