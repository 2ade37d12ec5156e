"""Arguments no transformation differentiates are constants.

``jax.jacfwd(guard(f))(x, k)`` differentiates ``x`` only, but the guard sees
two arguments alike: it took ``k``'s tangent as live, so
``sqrt(where(x > 1, x, k))`` got no forward guard on the lanes taken from
``k`` -- NaN where the double where is finite, and nothing reported (hunt11
F1c).  An argument that is a concrete array at the call (or a batching
tracer of one) cannot be differentiated by any enclosing transformation: it
is now traced as a constant, as a closed-over array is.  The oracle is the
hand double where, written with ``k`` as the constant it is.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlo_guard import explain, guard
from hlo_guard.jax_frontend.argument_tangents import UnguardedTangentWarning
from hlo_guard.jax_frontend.compat import never_differentiated

X = jnp.array([0.5, 2.0, 3.0, 0.2], jnp.float32)
K = jnp.array([0.0, 1.0, 0.0, 4.0], jnp.float32)


def f(x, k):
    return jnp.sqrt(jnp.where(x > 1, x, k)).sum()


def oracle(x, k):
    """The double where, ``k`` a constant: its lanes have no tangent."""
    c = x > 1
    v = jnp.where(c, x, jax.lax.stop_gradient(k))
    return jnp.where(c, jnp.sqrt(jnp.where(c, v, 1.0)), jnp.sqrt(jax.lax.stop_gradient(v))).sum()


MODES = {
    "jacfwd": lambda h: jax.jacfwd(h)(X, K),
    "grad": lambda h: jax.grad(h)(X, K),
    "hessian": lambda h: jax.hessian(h)(X, K),
    "jacfwd of jacfwd": lambda h: jax.jacfwd(jax.jacfwd(h))(X, K),
    "jacfwd under vmap": lambda h: jax.vmap(jax.jacfwd(h), (0, None))(jnp.stack([X, X]), K),
    "jacfwd of vmap over k": lambda h: jax.jacfwd(
        lambda x: jax.vmap(h, (None, 0))(x, jnp.stack([K, K])).sum()
    )(X),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_an_argument_not_differentiated_is_a_constant(mode):
    got = np.asarray(MODES[mode](guard(f)))
    want = np.asarray(MODES[mode](oracle))
    assert np.isfinite(want).all()
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_the_case_leaks_without_the_guard():
    assert np.isnan(np.asarray(jax.jacfwd(f)(X, K))).any()


def test_the_differentiated_argument_keeps_its_genuine_singularity():
    """``jacfwd`` over ``k`` (``x`` the constant now): ``k``'s lane 0 is
    selected at 0, so ``sqrt'(0)`` is genuinely infinite, and the other
    directions meet it as JAX's ``0 * inf``: the double where has the same."""

    def oracle_k(x, k):
        c = x > 1
        v = jnp.where(c, jax.lax.stop_gradient(x), k)
        return jnp.where(
            c, jnp.sqrt(jax.lax.stop_gradient(v)), jnp.sqrt(jnp.where(c, 1.0, v))
        ).sum()

    got = np.asarray(jax.jacfwd(guard(f), argnums=1)(X, K))
    want = np.asarray(jax.jacfwd(oracle_k, argnums=1)(X, K))
    assert np.isinf(want[0])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(
        jax.grad(guard(f), argnums=1)(X, K), jax.grad(oracle_k, argnums=1)(X, K)
    )


def test_values_stay_bitwise():
    g = guard(f)
    assert np.asarray(g(X, K)).tobytes() == np.asarray(f(X, K)).tobytes()
    out, tangent = jax.jvp(lambda x: g(x, K), (X,), (jnp.ones_like(X),))
    assert np.asarray(out).tobytes() == np.asarray(f(X, K)).tobytes()
    assert np.isfinite(np.asarray(tangent))


def test_which_leaves_can_be_differentiated():
    assert never_differentiated(K)
    assert never_differentiated(np.zeros(3))
    seen = []
    jax.jvp(lambda x: seen.append(never_differentiated(x)) or x, (X,), (X,))
    jax.vmap(lambda k: seen.append(never_differentiated(k)) or k)(K)
    jax.jit(lambda k: seen.append(never_differentiated(k)) or k)(K)
    assert seen == [False, True, False]


def test_a_mixed_call_has_its_own_trace_and_reports_describe_the_shared_one():
    """The constant-argument program is cached beside the one every leaf
    alike shares; ``explain`` describes the shared one (both arguments as
    arguments), whatever calls came before."""
    g = guard(f)
    before = str(explain(g, X, K))
    g(X, K)
    jax.grad(g)(X, K)
    jax.grad(g, argnums=(0, 1))(X, K)
    assert len(g._cache) == 2  # the eager / all-differentiated one, and the mixed one
    assert str(explain(g, X, K)) == before


def test_value_mode_keeps_every_argument_an_argument():
    """Value mode makes dead lanes' *values* safe, a constant's as well
    (``jax_debug_nans`` checks them): it does not take the shortcut."""
    g = guard(lambda x, k: jnp.where(k > 0, jnp.sqrt(k), 0.0).sum() * x.sum(), mode="value")
    with jax.debug_nans(True):
        jax.grad(g)(X, K - 1.0)


def test_a_jit_traced_argument_without_a_tangent_warns_where_guards_are_missing():
    """Under ``jax.jit`` the argument ``jacfwd`` leaves out is a ``jit``
    tracer, which a transformation around the ``jit`` may still
    differentiate: it stays live, and the NaN this gives is announced (a
    silent miss before), naming the argument and the ``sqrt``."""
    g = guard(f)
    with pytest.warns(UnguardedTangentWarning, match="argument 'k' of f.*sqrt at") as record:
        out = jax.jit(jax.jacfwd(g))(X, K)
    assert np.isnan(np.asarray(out)).any()
    assert record[0].filename == __file__  # points at the user's call


@pytest.mark.parametrize(
    "call",
    [
        lambda g: jax.jit(jax.grad(g))(X, K),  # reverse mode: k's lanes are not its concern
        lambda g: jax.jit(jax.jacfwd(g, argnums=(0, 1)))(X, K),  # both differentiated
        lambda g: jax.jacfwd(g)(X, K),  # k concrete: a constant, guarded
    ],
    ids=["jit grad", "jit jacfwd of both", "jacfwd eager"],
)
def test_no_warning_where_nothing_is_missing(call):
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnguardedTangentWarning)
        call(guard(f))


def test_no_warning_when_the_untracked_argument_needs_no_guard():
    g = guard(lambda x, k: jnp.sqrt(x * k + 1.0).sum())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnguardedTangentWarning)
        jax.jit(jax.jacfwd(g))(X, K)


def test_the_warning_is_given_once_per_trace():
    g = guard(f)
    with pytest.warns(UnguardedTangentWarning):
        jax.jit(jax.jacfwd(g))(X, K)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnguardedTangentWarning)
        jax.jit(jax.jacfwd(g))(X + 1.0, K)  # (a new jit trace, the same guard trace)
