"""custom_jvp / custom_vjp calls that are not lane-wise (issue 9, item 1).

A norm ``sqrt(sum(v*v, -1))`` with a custom derivative, used as
``where(n > 0, x / n, 0)``: the call's input lanes that feed only dead output
lanes must be guarded, with masks from the primal body's reduce/broadcast
structure.  Oracles: the hand-written double-where (the dead rows replaced by
a safe value before the call) and a per-row Python ``if``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from custom_norms import norm_jvp, norm_vjp

from hlo_guard import explain, guard

NORMS = {"custom_jvp": norm_jvp, "custom_vjp": norm_vjp}

X = jnp.array([[0.0, 0.0], [3.0, 4.0], [0.0, 0.0], [1.0, -2.0]])


def _user(norm, use):
    def f(x):
        n = norm(x)
        return jnp.sum(jnp.where(n > 0, use(n), 0.0))

    return f


def _double_where(norm, use):
    def f(x):
        live = jnp.sum(x * x, -1) > 0
        n = norm(jnp.where(live[:, None], x, 1.0))
        return jnp.sum(jnp.where(live, use(n), 0.0))

    return f


def _per_row_if(norm, use, x):
    """Gradient row by row: a dead row contributes nothing, a live row is
    differentiated on its own."""
    rows = []
    for r in np.asarray(x):
        if np.sum(r * r) > 0:
            rows.append(np.asarray(jax.grad(lambda v: use(norm(v)))(jnp.asarray(r))))
        else:
            rows.append(np.zeros_like(r))
    return np.stack(rows)


USES = {"reciprocal": lambda n: 1.0 / n, "log": jnp.log}


@pytest.mark.parametrize("kind", sorted(NORMS))
@pytest.mark.parametrize("use", ["reciprocal", "log"])
def test_norm_with_custom_derivative_under_where(kind, use):
    norm, u = NORMS[kind], USES[use]
    f = _user(norm, u)
    np.testing.assert_array_equal(guard(f)(X), f(X))
    want = jax.grad(_double_where(norm, u))(X)
    np.testing.assert_array_equal(jax.grad(guard(f))(X), want)
    np.testing.assert_array_equal(jax.jit(jax.grad(guard(f)))(X), want)
    np.testing.assert_allclose(jax.grad(guard(f))(X), _per_row_if(norm, u, X), rtol=1e-6)


@pytest.mark.parametrize("kind", sorted(NORMS))
def test_normalize_x_over_norm(kind):
    norm = NORMS[kind]

    def f(x):
        n = norm(x)
        return jnp.sum(jnp.where((n > 0)[:, None], x / n[:, None], 0.0) ** 2 * jnp.arange(2.0))

    def oracle(x):
        live = jnp.sum(x * x, -1) > 0
        safe = jnp.where(live[:, None], x, 1.0)
        n = norm(safe)
        return jnp.sum(jnp.where(live[:, None], safe / n[:, None], 0.0) ** 2 * jnp.arange(2.0))

    np.testing.assert_array_equal(guard(f)(X), f(X))
    got = jax.grad(guard(f))(X)
    assert np.all(np.isfinite(got))
    # the oracle divides `safe` rather than `x`: XLA may fuse it differently (1 ulp)
    np.testing.assert_allclose(got, jax.grad(oracle)(X), rtol=1e-6, atol=0)


def test_forward_mode_through_custom_jvp_norm():
    f = _user(norm_jvp, lambda n: 1.0 / n)
    want = jax.jacfwd(_double_where(norm_jvp, lambda n: 1.0 / n))(X)
    np.testing.assert_array_equal(jax.jacfwd(guard(f))(X), want)
    h = jax.hessian(guard(f))(X)
    assert np.all(np.isfinite(h))


def test_genuine_singularity_on_a_live_row_stays_visible():
    """Every row live: n == 0 is never selected away, so nothing is guarded and
    the NaN of the custom rule at a zero row is JAX's own."""
    f = _user(norm_jvp, lambda n: n)
    g = lambda x: jnp.sum(jnp.where(n_all(x) >= 0, norm_jvp(x), 0.0))  # noqa: E731
    n_all = lambda x: jnp.sum(x * x, -1)  # noqa: E731
    np.testing.assert_array_equal(jax.grad(guard(g))(X), jax.grad(g)(X))
    assert np.isnan(np.asarray(jax.grad(guard(g))(X))[0]).all()
    del f


def test_explain_lists_the_call_operand_not_sites_inside_the_custom_body():
    f = _user(norm_jvp, lambda n: 1.0 / n)
    r = explain(f, X)
    ops = sorted(s.op for s in r.sites if s.kind == "guard")
    assert any(op.startswith("custom_jvp_call") for op in ops)
    assert "sqrt" not in ops and "mul" not in ops
    assert not r.unguarded
