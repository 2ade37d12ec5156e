"""The boundary placement through the JAX front end, against the hand-written
double where (DESIGN.md step 3's hand-checked cases), in every AD mode.

The front end plans with :func:`passes.planning.plan_boundary_guards`; these
tests check that placement end to end on the cases it was argued on.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlo_guard import guard
from passes.planning import plan_boundary_guards

X = jnp.array([-1.0, 0.0, 0.5, 2.0])


def chain(x):
    return jnp.where(x > 0, jnp.log(jnp.sqrt(x)) * x**1.5 + 1 / x, 0.0)


def chain_oracle(x):
    m = x > 0
    s = jnp.where(m, x, 1.0)
    return jnp.where(m, jnp.log(jnp.sqrt(s)) * s**1.5 + 1 / s, 0.0)


def join(x):
    return jnp.sum(x**2) + jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))


def join_oracle(x):
    return jnp.sum(x**2) + jnp.sum(jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0))


def dot_sqrt(x):
    a = jnp.outer(x, x) @ jnp.ones(4) - 1.0
    return jnp.sum(jnp.where(a > 0, jnp.sqrt(a), 0.0))


def dot_sqrt_oracle(x):
    a = jnp.outer(x, x) @ jnp.ones(4) - 1.0
    return jnp.sum(jnp.where(a > 0, jnp.sqrt(jnp.where(a > 0, a, 1.0)), 0.0))


def broadcast_scalar(x):
    w = jnp.sum(x)
    return jnp.sum(jnp.where(x > 0, jnp.log(w * x), 0.0))


def broadcast_scalar_oracle(x):
    w = jnp.sum(x)
    m = x > 0
    return jnp.sum(jnp.where(m, jnp.log(jnp.where(m, w * x, 1.0)), 0.0))


def taken_sqrt(x):
    # sqrt'(0) on a taken lane is a genuine singularity: stays inf
    return jnp.sum(jnp.where(x >= 0, jnp.sqrt(x), 0.0))


def taken_sqrt_oracle(x):
    return jnp.sum(jnp.where(x >= 0, jnp.sqrt(jnp.where(x >= 0, x, 1.0)), 0.0))


def nested(x):
    return jnp.sum(jax.jit(chain)(x))


def nested_oracle(x):
    return jnp.sum(chain_oracle(x))


CASES = [
    (lambda x: jnp.sum(chain(x)), lambda x: jnp.sum(chain_oracle(x))),
    (join, join_oracle),
    (dot_sqrt, dot_sqrt_oracle),
    (broadcast_scalar, broadcast_scalar_oracle),
    (taken_sqrt, taken_sqrt_oracle),
    (nested, nested_oracle),
]

MODES = {
    "grad": jax.grad,
    "hessian": jax.hessian,
    "jacfwd_grad": lambda f: jax.jacfwd(jax.grad(f)),
    "jacrev_grad": lambda f: jax.jacrev(jax.grad(f)),
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_boundary_guards_match_the_double_where(case, mode):
    f, oracle = CASES[case]
    d = MODES[mode]
    got = np.asarray(d(guard(f))(X))
    want = np.asarray(d(oracle)(X))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0, equal_nan=True)


def test_forward_value_is_unchanged_and_taken_sqrt_stays_inf():
    np.testing.assert_array_equal(guard(chain)(X), chain(X))
    g = jax.grad(guard(taken_sqrt))(X)
    assert np.isinf(g[1])


def test_chain_guards_only_where_x_enters():
    """The chain's input guards sit on ``x``'s three uses (sqrt, pow, div),
    none inside the chain (the hazard placement guards sqrt, log, pow, div)."""
    from hlo_guard.jax_frontend.graph import JaxprGraph
    from hlo_guard.jax_frontend.rules import RULES
    from passes import analyze

    jaxpr = jax.make_jaxpr(chain)(X).jaxpr
    an = analyze(JaxprGraph(jaxpr), RULES)
    sites = plan_boundary_guards(an)[0]
    assert {jaxpr.eqns[s.node].invars[s.index] for s in sites} == {jaxpr.invars[0]}
    assert {jaxpr.eqns[s.node].primitive.name for s in sites} == {"sqrt", "pow", "div"}
