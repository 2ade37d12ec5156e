"""A custom derivative rule that itself selects with a singular dead branch
(``where(x > 0, 0.5 / sqrt(x), 0) * t``): exact to first order and under
``jax.hessian`` (forward over reverse), but a reverse derivative of the
derivative (``jacrev(grad)``) differentiates the rule's dead branch, which
the guard never sees -- NaN in the lanes the rule drops.  ``explain`` must
name the call (found by a user-style hunt: both JAX versions, eager and under
``jit``, with a clean report).  Report only: values are unchanged."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard as hg


@jax.custom_jvp
def sqrt_jvp(x):
    return jnp.sqrt(jnp.maximum(x, 0.0))


@sqrt_jvp.defjvp
def _sqrt_jvp_rule(primals, tangents):
    (x,), (t,) = primals, tangents
    return sqrt_jvp(x), jnp.where(x > 0, 0.5 / jnp.sqrt(x), 0.0) * t


@jax.custom_vjp
def sqrt_vjp(x):
    return jnp.sqrt(jnp.abs(x)) * (x > 0)


sqrt_vjp.defvjp(
    lambda x: (sqrt_vjp(x), x),
    lambda x, g: (jnp.where(x > 0, 0.5 / jnp.sqrt(x), 0.0) * g,),
)


@jax.custom_jvp
def sqrt_jvp_double_where(x):
    return jnp.sqrt(jnp.maximum(x, 0.0))


@sqrt_jvp_double_where.defjvp
def _sqrt_jvp_double_where_rule(primals, tangents):
    (x,), (t,) = primals, tangents
    safe = jnp.where(x > 0, x, 1.0)
    return sqrt_jvp_double_where(x), jnp.where(x > 0, 0.5 / jnp.sqrt(safe), 0.0) * t


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def scaled_sqrt(x, k):
    return jnp.sqrt(jnp.maximum(x, 0.0)) * k


@scaled_sqrt.defjvp
def _scaled_sqrt_rule(k, primals, tangents):
    (x,), (t,) = primals, tangents
    return scaled_sqrt(x, k), jnp.where(x > 0, 0.5 * k / jnp.sqrt(x), 0.0) * t


X = jnp.array([-1.0, -2.0, 0.5, 2.0], jnp.float32)

LEAKY = {
    "custom_jvp": lambda x: jnp.sum(sqrt_jvp(x)),
    "custom_vjp": lambda x: jnp.sum(sqrt_vjp(x)),
    "custom_jvp under where": lambda x: jnp.sum(jnp.where(x > -5, sqrt_jvp(x), 0.0)),
    "custom_jvp in jit": lambda x: jnp.sum(jax.jit(sqrt_jvp)(x)),
    "custom_jvp in scan": lambda x: jax.lax.scan(
        lambda c, r: (c + jnp.sum(sqrt_jvp(r)), None), 0.0, x.reshape(2, 2)
    )[0],
    "custom_jvp nondiff_argnums": lambda x: jnp.sum(scaled_sqrt(x, 2.0)),
}


def _oracle(x):
    return jnp.sum(jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0))


def _rule_sites(report):
    return [s for s in report.unguarded if "custom derivative rule" in s.reason]


def test_the_leak_is_real():
    """The premise: reverse over reverse is NaN in the rule's dead lanes, guarded
    or not; forward over reverse is exact."""
    for name in ("custom_jvp", "custom_vjp"):
        f = LEAKY[name]
        got = jnp.diag(jax.jacrev(jax.grad(hg.guard(f)))(X))
        want = jnp.diag(jax.jacrev(jax.grad(_oracle))(X))
        assert np.isnan(np.asarray(got[:2])).all(), name
        np.testing.assert_allclose(np.asarray(got[2:]), np.asarray(want[2:]), rtol=1e-5)
    # forward over reverse (a custom_vjp has no forward mode)
    hess = jnp.diag(jax.hessian(hg.guard(LEAKY["custom_jvp"]))(X))
    np.testing.assert_allclose(np.asarray(hess), np.asarray(want), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(LEAKY))
def test_a_selecting_rule_is_reported(name):
    f = LEAKY[name]
    for fn in (hg.guard(f), hg.guarded_jit(f)):
        report = hg.explain(fn, X)
        sites = _rule_sites(report)
        assert sites, report
        reason = sites[0].reason
        assert sites[0].primitive in ("custom_jvp_call", "custom_vjp_call")
        assert "sqrt" in reason and "jacrev(grad)" in reason, reason
        assert "selects with where" in reason


def test_the_report_names_the_rule_and_its_line():
    reason = _rule_sites(hg.explain(hg.guard(LEAKY["custom_jvp"]), X))[0].reason
    assert "sqrt_jvp" in reason and "_sqrt_jvp_rule" in reason
    assert "test_custom_rule_second_order_report.py" in reason
    reason = _rule_sites(hg.explain(hg.guard(LEAKY["custom_vjp"]), X))[0].reason
    assert "sqrt_vjp" in reason


def test_a_double_where_rule_is_clean():
    f = lambda x: jnp.sum(sqrt_jvp_double_where(x))  # noqa: E731
    assert not _rule_sites(hg.explain(hg.guard(f), X))
    got = jnp.diag(jax.jacrev(jax.grad(f))(X))
    want = jnp.diag(jax.jacrev(jax.grad(_oracle))(X))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6)


def test_a_rule_on_a_constant_is_not_reported():
    """No derivative flows into the call: its rule is never differentiated."""
    c = jnp.array([-1.0, 1.0])
    f = lambda x: jnp.sum(x) + jnp.sum(sqrt_jvp(c))  # noqa: E731
    assert not hg.explain(hg.guard(f), X).unguarded


def _library():
    fs = {
        "relu": jax.nn.relu,
        "softplus": jax.nn.softplus,
        "silu": jax.nn.silu,
        "gelu": jax.nn.gelu,
        "gelu_exact": lambda v: jax.nn.gelu(v, approximate=False),
        "logsumexp": jax.nn.logsumexp,
        "softmax": jax.nn.softmax,
        "log_softmax": jax.nn.log_softmax,
        "norm": jnp.linalg.norm,
        "xlogy": lambda v: jax.scipy.special.xlogy(v, v),
        "entr": jax.scipy.special.entr,
        "logaddexp": lambda v: jnp.logaddexp(v, 2.0 * v),
    }
    try:
        import optax
    except ImportError:  # pragma: no cover - optax is a dev extra
        return fs
    fs["optax.safe_norm"] = lambda v: optax.safe_norm(v, 1e-6)
    return fs


LIBRARY = _library()


@pytest.mark.parametrize("name", sorted(LIBRARY))
@pytest.mark.parametrize("inside_where", [False, True])
def test_library_custom_rules_stay_clean(name, inside_where):
    fn = LIBRARY[name]
    if inside_where:

        def f(x):
            safe = jnp.where(x > 0, x, 1.0)
            return jnp.sum(jnp.where(x > 0, fn(safe), 0.0)) + jnp.sum(jnp.where(x > 0, fn(x), 0.0))

    else:

        def f(x):
            return jnp.sum(fn(x))

    report = hg.explain(hg.guard(f), X)
    assert not _rule_sites(report), report


@pytest.mark.parametrize("name", ["custom_jvp", "custom_vjp", "custom_jvp under where"])
def test_values_are_unchanged(name):
    """Report only: explain changes nothing the guarded function computes."""
    f = LEAKY[name]
    g = hg.guard(f)
    before = [
        np.asarray(g(X)),
        np.asarray(jax.grad(g)(X)),
        np.asarray(jax.jacrev(jax.grad(g))(X)),
    ]
    hg.explain(g, X)
    after = [
        np.asarray(g(X)),
        np.asarray(jax.grad(g)(X)),
        np.asarray(jax.jacrev(jax.grad(g))(X)),
    ]
    for b, a in zip(before, after):
        np.testing.assert_array_equal(b, a)
    np.testing.assert_array_equal(before[0], np.asarray(f(X)))
    np.testing.assert_array_equal(before[1], np.asarray(jax.grad(f)(X)))
    np.testing.assert_array_equal(before[2], np.asarray(jax.jacrev(jax.grad(f))(X)))


def _with_rule(rule):
    f = jax.custom_jvp(lambda x: jnp.sqrt(jnp.maximum(x, 0.0)))
    f.defjvp(lambda p, t: (f(p[0]), rule(p[0]) * t[0]))
    return lambda x: jnp.sum(f(x))


@pytest.mark.parametrize(
    "rule, reported",
    [
        (lambda x: jnp.where(x > 0, 0.5 / jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0), False),
        (
            lambda x: (lambda c: jnp.where(c, 0.5 / jnp.sqrt(jnp.where(c, x, 1.0)), 0.0))(x > 0),
            False,
        ),
        (lambda x: jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), 0.0), False),
        # an inner where on another predicate, or with its cases swapped, leaks
        (lambda x: jnp.where(x > 0, 0.5 / jnp.sqrt(jnp.where(x > -1.5, x, 1.0)), 0.0), True),
        (lambda x: jnp.where(x > 0, 0.5 / jnp.sqrt(jnp.where(x > 0, 1.0, x)), 0.0), True),
    ],
)
def test_the_double_where_is_recognised_only_when_it_matches(rule, reported):
    f = _with_rule(rule)
    assert bool(_rule_sites(hg.explain(hg.guard(f), X))) is reported
    leaks = bool(np.isnan(np.asarray(jax.jacrev(jax.grad(f))(X))).any())
    assert leaks is reported


def _norm_rule(double_where: bool):
    """A norm whose rule divides the *tangent* inside the where (found by a
    user-style hunt, 2026-11-28: geometry code)."""

    @jax.custom_jvp
    def norm(x):
        return jnp.sqrt(jnp.sum(x * x))

    @norm.defjvp
    def _rule(primals, tangents):
        (x,), (t,) = primals, tangents
        n = norm(x)
        divisor = jnp.where(n > 0, n, 1.0) if double_where else n
        return n, jnp.where(n > 0, jnp.dot(x, t) / divisor, 0.0)

    return lambda x: norm(x) ** 2


def test_a_rule_dividing_its_tangent_in_the_dead_branch_is_reported_at_first_order():
    """Reverse mode transposes the rule's tangent computation: ``0 / 0``
    already in ``jax.grad``, while forward mode selects it away.  The report
    said only a derivative of the derivative was affected."""
    f, oracle = _norm_rule(False), _norm_rule(True)
    x = jnp.zeros(3)
    assert np.isnan(np.asarray(jax.grad(hg.guard(f))(x))).all()
    np.testing.assert_array_equal(jax.grad(oracle)(x), np.zeros(3))
    np.testing.assert_array_equal(jax.jacfwd(hg.guard(f))(x), jax.jacfwd(oracle)(x))
    (site,) = hg.explain(f, x).unguarded
    assert "already the first derivative" in site.reason
    assert "(on its tangent)" in site.reason


def test_a_rule_selecting_a_coefficient_keeps_the_second_order_wording():
    (site,) = hg.explain(lambda x: jnp.sum(sqrt_jvp(x)), jnp.array([0.0, 1.0])).unguarded
    assert "reverse over reverse" in site.reason
    assert "first derivative" not in site.reason
