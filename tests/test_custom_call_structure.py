"""``custom_jvp``/``custom_vjp`` calls that are not lane-wise.

A norm ``n = sqrt(sum(v * v, -1))`` with a custom derivative, used as
``where(n > 0, x / n, 0)``: a row of ``v`` whose norm is 0 is dead, but the
custom rule (``v / n``) is NaN there.  The call's primal body says row ``b`` of
``v`` feeds only ``n[b]``, so ``v`` is guarded with the row mask.  Before, only
lane-wise calls were followed and the dead row's NaN reached the gradient.

Forward mode: ``relu`` is a lane-wise ``custom_jvp`` whose rule gives an exact
zero tangent where ``x <= 0``; ``jacfwd(sqrt(relu(x)))`` must then be 0 there,
as for ``sqrt(maximum(x, 0))`` (which the pass follows natively).

Oracles: the hand-written double-where, or a per-lane Python ``if``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from custom_norms import norm_jvp, norm_vjp

from hlo_guard import explain, guard

V = jnp.array([[0.0, 0.0, 0.0], [1.0, 2.0, 2.0], [3.0, 0.0, 4.0], [0.0, 0.0, 0.0]])


def _double_where(norm, body):
    """where(n > 0, body(v, n), 0) with dead rows of v replaced by ones first."""

    def oracle(v):
        live = jnp.sum(v * v, -1) > 0
        safe = jnp.where(live[:, None], v, 1.0)
        return jnp.sum(jnp.where(live, body(safe, norm(safe)), 0.0))

    return oracle


@pytest.mark.parametrize("norm", [norm_jvp, norm_vjp], ids=["custom_jvp", "custom_vjp"])
@pytest.mark.parametrize(
    "body", [lambda v, n: v[:, 0] / n, lambda v, n: jnp.log(n)], ids=["x_over_n", "f_of_n"]
)
def test_norm_with_custom_rule_under_where(norm, body):
    def f(v):
        n = norm(v)
        return jnp.sum(jnp.where(n > 0, body(v, n), 0.0))

    assert np.isnan(jax.grad(f)(V)).any()  # the custom rule's NaN is real
    np.testing.assert_array_equal(guard(f)(V), f(V))
    np.testing.assert_array_equal(jax.grad(guard(f))(V), jax.grad(_double_where(norm, body))(V))
    np.testing.assert_array_equal(
        jax.jit(jax.grad(guard(f)))(V), jax.grad(_double_where(norm, body))(V)
    )


def test_norm_guard_site_is_the_custom_call_operand():
    def f(v):
        n = norm_jvp(v)
        return jnp.sum(jnp.where(n > 0, v[:, 0] / n, 0.0))

    report = explain(f, V)
    assert any(s.op == "custom_jvp_call" for s in report.sites), report
    assert not report.unguarded


X = jnp.array([-1.0, 2.0, -3.0, 4.0, 0.5, -0.25])


def _per_lane_jacobian(x):
    """d sqrt(max(x, 0)) / dx with a per-lane ``if``: only taken branches."""
    x = np.asarray(x, dtype=np.float64)
    d = [0.5 / np.sqrt(xi) if xi > 0 else 0.0 for xi in x]
    return np.diag(d).astype(np.float32)


def test_jacfwd_through_relu_matches_maximum():
    f = lambda x: jnp.sqrt(jax.nn.relu(x))
    g = lambda x: jnp.sqrt(jnp.maximum(x, 0.0))
    assert np.isnan(jax.jacfwd(f)(X)).any()
    got = jax.jacfwd(guard(f))(X)
    np.testing.assert_array_equal(got, jax.jacfwd(guard(g))(X))
    np.testing.assert_allclose(got, _per_lane_jacobian(X), rtol=1e-6)
    np.testing.assert_array_equal(jax.jacrev(guard(f))(X), got)
    np.testing.assert_array_equal(guard(f)(X), f(X))


def test_jvp_through_relu_keeps_genuine_singularity():
    """relu(0) = 0 with rule derivative 0 at 0: dead.  But sqrt(relu(x) + 0) at
    a *live* zero... x > 0 tiny is live and finite; x = 0 exactly is dead by the
    rule itself: no NaN hidden that the rule did not zero first."""
    f = lambda x: jnp.sqrt(jax.nn.relu(x))
    x = jnp.array([0.0, 1e-30, 1.0])
    _, t = jax.jvp(guard(f), (x,), (jnp.ones_like(x),))
    want = [0.0, 0.5 / np.sqrt(np.float32(1e-30)), 0.5]
    np.testing.assert_allclose(t, np.asarray(want, np.float32), rtol=1e-6)


def test_optax_weighted_logsoftmax_with_padding_rows():
    """Real library: optax's ``weighted_logsoftmax`` is a ``custom_jvp`` over a
    softmax (a reduction per row).  A padding row of ``-inf`` logits masked out
    by ``where`` must not put its NaN into the gradient."""
    classification = pytest.importorskip("optax.losses._classification")
    wls = classification.weighted_logsoftmax
    x = jnp.array([[-jnp.inf, -jnp.inf, -jnp.inf], [1.0, 2.0, 0.5], [0.0, -1.0, 3.0]])
    w = jnp.array([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    valid = jnp.array([False, True, True])

    def f(x):
        return jnp.sum(jnp.where(valid, -wls(x, w).sum(-1), 0.0))

    def oracle(x):
        safe = jnp.where(valid[:, None], x, 0.0)
        return jnp.sum(jnp.where(valid, -wls(safe, w).sum(-1), 0.0))

    assert np.isnan(jax.grad(f)(x)).any()
    np.testing.assert_array_equal(guard(f)(x), f(x))
    np.testing.assert_array_equal(jax.grad(guard(f))(x), jax.grad(oracle)(x))
