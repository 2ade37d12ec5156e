"""Small calls made directly by a guarded function are inlined in its staged trace.

Under ``jax.jit`` the guard traces the user's function to a jaxpr of its own
(``tracing.trace``); there ``jnp``'s helpers that are ``jax.jit`` calls of a
few operations (``jnp.clip``, ``jnp.cumprod``, ``jnp.pad``'s helper) and every
late-inline call (jax 0.11+ ``Inline.JAX_LATE``) are inlined while tracing,
as JAX itself inlines them when lowering (issue 17 item 5: a guarded call is
re-bound with masks passed in and a fingerprint of its body, a cost per call
that numpyro's StickBreakingTransform paid five times).  Larger calls, calls
inside calls and the user's own plain traces keep their structure.  Oracles:
the hand-written double where in every derivative mode, and plain
``jax.jit(f)`` for the forward values (bitwise).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from double_where import DERIVATIVES, assert_like_double_where

import hlo_guard
from hlo_guard.jax_frontend.compat import SMALL_CALL_EQUATIONS
from hlo_guard.jax_frontend.surgery import spliced_program

X = jnp.asarray([-1.0, 0.0, 0.25, 0.5, 2.0], dtype=jnp.float32)


@jax.jit
def _safe_sqrt(x):
    """A small jitted helper with a selection inside: three equations."""
    return jnp.where(x > 0, jnp.sqrt(x), 0.0)


@jax.jit
def _sqrt_where_nonnegative(x):
    """A small helper whose *taken* branch is singular at 0: sqrt'(0) is a
    genuine infinity there, which the guard must leave."""
    return jnp.where(x >= 0, jnp.sqrt(x), 0.0)


def uses_genuine_singularity(x):
    return _sqrt_where_nonnegative(x) * 2.0


def uses_genuine_singularity_double_where(x):
    ok = x >= 0
    return jnp.where(ok, jnp.sqrt(jnp.where(ok, x, 1.0)), 0.0) * 2.0


def _long_helper_body(x):
    for _ in range(SMALL_CALL_EQUATIONS):
        x = jnp.sin(x)
    return jnp.where(x > 0, jnp.sqrt(x), 0.0)


_long_helper = jax.jit(_long_helper_body)


@jax.jit
def _outer_helper(x):
    """Small itself, with a small jitted call inside it."""
    return _safe_sqrt(x) + 1.0


def uses_small_helper(x):
    return jnp.log1p(_safe_sqrt(x)) * jnp.clip(x, 0.0, 1.0)


def uses_small_helper_double_where(x):
    pos = x > 0
    s = jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)
    return jnp.log1p(s) * jnp.clip(x, 0.0, 1.0)


def uses_long_helper(x):
    return _long_helper(x) * x


def uses_long_helper_double_where(x):
    y = x
    for _ in range(SMALL_CALL_EQUATIONS):
        y = jnp.sin(y)
    pos = y > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, y, 1.0)), 0.0) * x


def uses_nested_helper(x):
    return _outer_helper(x) * x


def uses_nested_helper_double_where(x):
    return (uses_small_helper_double_where_sqrt(x) + 1.0) * x


def uses_small_helper_double_where_sqrt(x):
    pos = x > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


def _call_names(jaxpr) -> list[str]:
    return [str(e.params.get("name")) for e in jaxpr.eqns if e.primitive.name == "jit"]


def _guarded_program(f):
    return spliced_program(jax.make_jaxpr(hlo_guard.guard(f))(X)).jaxpr


def test_small_calls_are_inlined_in_the_guarded_program():
    assert "_safe_sqrt" in _call_names(jax.make_jaxpr(uses_small_helper)(X).jaxpr)
    names = _call_names(_guarded_program(uses_small_helper))
    assert "_safe_sqrt" not in names and "clip" not in names


def test_a_call_longer_than_the_limit_stays_a_call():
    assert len(jax.make_jaxpr(_long_helper_body)(X).jaxpr.eqns) > SMALL_CALL_EQUATIONS
    assert "_long_helper_body" in _call_names(_guarded_program(uses_long_helper))


def test_a_call_inside_an_inlined_call_stays_a_call():
    """Only the guard's own trace level inlines: the helper's body is the one
    JAX traced and cached for every caller, its own call kept."""
    program = _guarded_program(uses_nested_helper)
    assert "_outer_helper" not in _call_names(program)
    assert "_safe_sqrt" in _call_names(program)
    inner = jax.make_jaxpr(_outer_helper)(X).jaxpr
    assert "_safe_sqrt" in _call_names(inner.eqns[0].params["jaxpr"].jaxpr)


def test_plain_traces_keep_their_calls_after_a_guarded_trace():
    jax.make_jaxpr(hlo_guard.guard(uses_small_helper))(X)
    assert "_safe_sqrt" in _call_names(jax.make_jaxpr(uses_small_helper)(X).jaxpr)


def test_eager_guarded_calls_keep_their_calls():
    """Eager ``guard(f)`` runs each call as one computation, as eager JAX
    does: the same bits."""
    got = hlo_guard.guard(uses_small_helper)(X)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(uses_small_helper(X)))


@pytest.mark.parametrize(
    "f",
    [uses_small_helper, uses_long_helper, uses_nested_helper],
    ids=["small", "long", "nested"],
)
def test_forward_values_are_bitwise_the_plain_programs(f):
    got = jax.jit(hlo_guard.guard(f))(X)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(f)(X)))


def _summed(f):
    return lambda x: jnp.sum(f(x))


@pytest.mark.parametrize("mode", sorted(DERIVATIVES))
@pytest.mark.parametrize(
    "f, dw",
    [
        (uses_small_helper, uses_small_helper_double_where),
        (uses_long_helper, uses_long_helper_double_where),
        (uses_nested_helper, uses_nested_helper_double_where),
        (uses_genuine_singularity, uses_genuine_singularity_double_where),
    ],
    ids=["small", "long", "nested", "genuine"],
)
def test_derivatives_match_the_double_where(f, dw, mode):
    assert_like_double_where(DERIVATIVES[mode], _summed(f), _summed(dw), X)


def test_a_genuine_singularity_in_an_inlined_call_stays_infinite():
    """At ``x = 0`` the helper takes ``sqrt``: its derivative is infinite
    there in plain JAX, in the double where and under the guard."""
    assert "_sqrt_where_nonnegative" not in _call_names(_guarded_program(uses_genuine_singularity))
    grad = np.asarray(jax.jit(jax.grad(_summed(hlo_guard.guard(uses_genuine_singularity))))(X))
    assert np.isposinf(grad[1])  # X[1] == 0
    assert np.all(np.isfinite(np.delete(grad, 1)))
