"""``custom_jvp``/``custom_vjp`` calls that are not lane-wise (issue 9, item 1).

A norm ``n = sqrt(sum(v * v, -1))`` with a custom derivative, used as
``where(n > 0, g(v, n), 0)``: a row of ``v`` whose norm is 0 is dead, but the
custom rule (``v / n``) is NaN there.  The call's primal body says row ``b`` of
``v`` feeds only ``n[b]``, so ``v`` is guarded with the row mask, which absorbs
whatever the rule computes in dead rows.  Before, only lane-wise calls were
followed and the dead row's NaN reached the gradient.

Forward mode: ``relu`` is a lane-wise ``custom_jvp`` whose rule gives an exact
zero tangent where ``x <= 0``; ``jacfwd(sqrt(relu(x)))`` must then be 0 there,
as for ``sqrt(maximum(x, 0))`` (which the pass follows natively).

Oracles: the hand-written double-where (dead rows replaced by a safe value
before the call) and a per-row / per-lane Python ``if``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from custom_norms import norm_jvp, norm_vjp

from hlo_guard import explain, guard

NORMS = {"custom_jvp": norm_jvp, "custom_vjp": norm_vjp}

#: rows 0 and 3 have norm 0 (dead), rows 1 and 2 are live
V = jnp.array([[0.0, 0.0, 0.0], [1.0, 2.0, 2.0], [3.0, 0.0, 4.0], [0.0, 0.0, 0.0]])

#: what the selected branch computes from ``v`` and its norm
USES = {
    "reciprocal": lambda v, n: 1.0 / n,
    "log": lambda v, n: jnp.log(n),
    "x_over_n": lambda v, n: v[..., 0] / n,
}


def _user(norm, use):
    def f(v):
        n = norm(v)
        return jnp.sum(jnp.where(n > 0, use(v, n), 0.0))

    return f


def _double_where(norm, use):
    """The same with the dead rows of ``v`` replaced by ones before the call."""

    def oracle(v):
        live = jnp.sum(v * v, -1) > 0
        safe = jnp.where(live[:, None], v, 1.0)
        return jnp.sum(jnp.where(live, use(safe, norm(safe)), 0.0))

    return oracle


def _per_row_if(norm, use, v):
    """Gradient row by row: a dead row contributes nothing, a live row is
    differentiated on its own."""
    rows = []
    for r in np.asarray(v):
        if np.sum(r * r) > 0:
            rows.append(np.asarray(jax.grad(lambda w: use(w, norm(w)))(jnp.asarray(r))))
        else:
            rows.append(np.zeros_like(r))
    return np.stack(rows)


@pytest.mark.parametrize("kind", sorted(NORMS))
@pytest.mark.parametrize("use", sorted(USES))
def test_norm_with_custom_rule_under_where(kind, use):
    norm, u = NORMS[kind], USES[use]
    f = _user(norm, u)
    assert np.isnan(jax.grad(f)(V)).any()  # the custom rule's NaN is real
    np.testing.assert_array_equal(guard(f)(V), f(V))
    want = jax.grad(_double_where(norm, u))(V)
    np.testing.assert_array_equal(jax.grad(guard(f))(V), want)
    np.testing.assert_array_equal(jax.jit(jax.grad(guard(f)))(V), want)
    np.testing.assert_allclose(jax.grad(guard(f))(V), _per_row_if(norm, u, V), rtol=1e-6)


@pytest.mark.parametrize("kind", sorted(NORMS))
def test_normalize_x_over_norm(kind):
    norm = NORMS[kind]
    weights = jnp.arange(3.0)

    def f(x):
        n = norm(x)
        return jnp.sum(jnp.where((n > 0)[:, None], x / n[:, None], 0.0) ** 2 * weights)

    def oracle(x):
        live = jnp.sum(x * x, -1) > 0
        safe = jnp.where(live[:, None], x, 1.0)
        n = norm(safe)
        return jnp.sum(jnp.where(live[:, None], safe / n[:, None], 0.0) ** 2 * weights)

    np.testing.assert_array_equal(guard(f)(V), f(V))
    got = jax.grad(guard(f))(V)
    assert np.all(np.isfinite(got))
    # the oracle divides `safe` rather than `x`: XLA may fuse it differently (1 ulp)
    np.testing.assert_allclose(got, jax.grad(oracle)(V), rtol=1e-6, atol=0)


def test_forward_mode_through_custom_jvp_norm():
    use = USES["reciprocal"]
    f = _user(norm_jvp, use)
    want = jax.jacfwd(_double_where(norm_jvp, use))(V)
    np.testing.assert_array_equal(jax.jacfwd(guard(f))(V), want)
    h = jax.hessian(guard(f))(V)
    assert np.all(np.isfinite(h))


def test_genuine_singularity_on_a_live_row_stays_visible():
    """Every row live: n == 0 is never selected away, so nothing is guarded and
    the NaN of the custom rule at a zero row is JAX's own."""

    def g(x):
        return jnp.sum(jnp.where(jnp.sum(x * x, -1) >= 0, norm_jvp(x), 0.0))

    np.testing.assert_array_equal(jax.grad(guard(g))(V), jax.grad(g)(V))
    assert np.isnan(np.asarray(jax.grad(guard(g))(V))[0]).all()


@pytest.mark.parametrize("use", ["reciprocal", "x_over_n"])
def test_explain_lists_the_call_operand_not_sites_inside_the_custom_body(use):
    r = explain(_user(norm_jvp, USES[use]), V)
    ops = sorted(s.op for s in r.sites if s.kind == "guard")
    assert any(op.startswith("custom_jvp_call") for op in ops)
    assert "sqrt" not in ops and "mul" not in ops
    assert not r.unguarded


# -- lane-wise custom_jvp in forward mode ------------------------------------------

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
    """relu(0) = 0 with rule derivative 0 at 0: dead.  x > 0 tiny is live and
    finite; x = 0 exactly is dead by the rule itself: no NaN hidden that the
    rule did not zero first."""
    f = lambda x: jnp.sqrt(jax.nn.relu(x))
    x = jnp.array([0.0, 1e-30, 1.0])
    _, t = jax.jvp(guard(f), (x,), (jnp.ones_like(x),))
    want = [0.0, 0.5 / np.sqrt(np.float32(1e-30)), 0.5]
    np.testing.assert_allclose(t, np.asarray(want, np.float32), rtol=1e-6)


# -- real library code ---------------------------------------------------------------


def test_optax_weighted_logsoftmax_with_padding_rows():
    """optax's ``weighted_logsoftmax`` is a ``custom_jvp`` over a softmax (a
    reduction per row).  A padding row of ``-inf`` logits masked out by
    ``where`` must not put its NaN into the gradient."""
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


# -- a lane-wise body with a pass-through op; an iterative body -------------------


def _log_with_barrier(barrier):
    """A ``custom_jvp`` log whose body selects and holds a pass-through op
    (``optimization_barrier`` or ``copy``), as ``jax.scipy.special.ndtri``'s
    body does on jax 0.12."""

    @jax.custom_jvp
    def vlog(p):
        inner = barrier(jnp.log(jnp.where(p == 0, 0.5, p)))
        return jnp.where(p == 0, -jnp.inf, inner)

    @vlog.defjvp
    def _jvp(primals, tangents):
        (p,), (t,) = primals, tangents
        return vlog(p), t / p

    return vlog


BARRIERS = {"optimization_barrier": jax.lax.optimization_barrier, "copy": jnp.copy}


@pytest.mark.parametrize("barrier", sorted(BARRIERS))
def test_a_pass_through_op_keeps_a_custom_call_lane_wise(barrier):
    """``optimization_barrier``/``copy`` hand each lane on: the call is still
    lane-wise and its inputs get the outer ``where``'s dead lanes.  Taken as
    non-lane-wise, the call's structure was 'not known' and the dead lanes
    were dropped with a clean report."""
    vlog = _log_with_barrier(BARRIERS[barrier])
    x = jnp.array([0.0, 0.05, 0.3, 0.7])

    def f(x):
        return jnp.sum(jnp.where(x > 0.1, vlog(x), 0.0))

    def oracle(x):
        return jnp.sum(jnp.where(x > 0.1, vlog(jnp.where(x > 0.1, x, 1.0)), 0.0))

    assert np.isnan(np.asarray(jax.grad(f)(x))).any()
    for d in (jax.grad, jax.hessian):
        np.testing.assert_array_equal(d(guard(f))(x), d(oracle)(x))


def test_ndtri_under_a_where_gets_exact_zeros():
    """The user's view of the case above (jax 0.12's ``ndtri``)."""
    from jax.scipy.special import ndtri

    x = jnp.array([0.0, 1.0, 0.3, 0.7])

    def f(x):
        return jnp.sum(jnp.where((x > 0) & (x < 1), ndtri(x), 0.0))

    def oracle(x):
        ok = (x > 0) & (x < 1)
        return jnp.sum(jnp.where(ok, ndtri(jnp.where(ok, x, 0.5)), 0.0))

    np.testing.assert_allclose(jax.grad(guard(f))(x), jax.grad(oracle)(x), rtol=1e-6)


def test_a_custom_rule_around_a_loop_is_reported():
    """An iterative solve behind a ``custom_jvp`` (optimistix's root find):
    its rule differentiates the body again, where a selection's dead lanes
    may leak -- reported, as for a ``custom_vjp``.  Formula rules are not."""

    @jax.custom_jvp
    def solve(a):
        def step(i, y):
            return jnp.where(a > 0, y - 0.5 * (y - jnp.sqrt(a)), y)

        return jax.lax.fori_loop(0, 3, step, jnp.zeros_like(a))

    @solve.defjvp
    def _jvp(primals, tangents):
        (a,), (t,) = primals, tangents
        return solve(a), t

    a = jnp.array([0.0, 1.0, 4.0])
    hits = [
        s for s in explain(lambda a: jnp.sum(solve(a)), a).unguarded if s.op == "custom_jvp_call"
    ]
    assert hits and "sqrt" in hits[0].reason
    relu_hits = explain(lambda a: jnp.sum(jnp.sqrt(jax.nn.relu(a) + 1.0)), a).unguarded
    assert not [s for s in relu_hits if s.op == "custom_jvp_call"]


def test_an_operation_without_a_rule_is_reported_when_a_derivative_flows():
    """``x.at[i].multiply(u)`` is a ``scatter-mul``, which has no rule and
    may drop lanes by itself (an overwritten or multiplied-away region):
    fully live is conservative only for the lanes that arrive, so it is
    listed whenever a derivative flows through it.  (``segment_max``, a
    ``scatter-max``, was the example here until it got its rule:
    tests/test_cumulative_choosers.py.)"""
    d = jnp.array([0.0, 4.0, 1.0, 9.0])
    ids = jnp.array([0, 0, 1, 1])

    def f(d):
        return jnp.sum(jnp.ones(2).at[ids].multiply(jnp.sqrt(d)))

    (u,) = explain(f, d).unguarded
    assert u.op == "scatter-mul" and u.category == "no-rule"


def test_approx_max_k_selects_like_top_k():
    x = jnp.array([0.0, 4.0, 1.0, 9.0])

    def f(x):
        return jnp.sum(jax.lax.approx_max_k(jnp.sqrt(x), 2)[0])

    def oracle(x):
        keep = x >= 4.0
        return jnp.sum(jnp.where(keep, jnp.sqrt(jnp.where(keep, x, 1.0)), 0.0))

    assert np.isnan(np.asarray(jax.grad(f)(x))).any()
    np.testing.assert_allclose(jax.grad(guard(f))(x), jax.grad(oracle)(x))


@jax.custom_jvp
def _log_poly(x):
    """Lane-wise, but its coefficients are a table built and sliced inside
    the body (as TFP's ``lbeta``): values of shape (2,) and (1,) that hold no
    lane of ``x``.  The ``minimum`` is a selection, so the body is not one
    the call's structure alone describes (as ``lbeta``'s ``min``/``max``)."""
    coeffs = jnp.concatenate([jnp.full((1,), 0.5), jnp.full((1,), 2.0)])
    return coeffs[0] * jnp.log(jnp.minimum(x, 1e30)) + coeffs[1] * x


@_log_poly.defjvp
def _log_poly_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return _log_poly(x), (0.5 / x + 2.0) * t


def test_constant_tables_inside_a_lanewise_custom_call_hold_no_lane():
    """Before, the table's shapes made the call "not lane-wise": its dead
    lane (``x = 0``, where the rule's ``0.5 / x`` is infinite) was reported
    and its gradient NaN (TFP's ``lbeta``, ``StudentT(df).log_prob`` with
    ``df`` masked, found by a hunt, 2026-11-28)."""
    x = jnp.array([0.0, 0.5, 2.0])

    def f(x):
        return jnp.sum(jnp.where(x > 0, _log_poly(x), 0.0))

    def double_where(x):
        return jnp.sum(jnp.where(x > 0, _log_poly(jnp.where(x > 0, x, 1.0)), 0.0))

    assert np.isnan(np.asarray(jax.grad(f)(x))).any()
    assert not explain(f, x).unguarded
    for transform in (jax.grad, jax.jacfwd, jax.hessian):
        np.testing.assert_allclose(
            transform(guard(f))(x), transform(double_where)(x), rtol=1e-6, atol=1e-7
        )


def test_constant_tables_keep_a_live_lanes_genuine_singularity():
    """``x = 0`` kept by the ``where``: the rule's ``0.5 / x`` is infinite
    there, with or without the guard."""
    x = jnp.array([0.0, 0.5, 2.0])

    def f(x):
        return jnp.sum(jnp.where(x >= 0, _log_poly(x), 0.0))

    got = np.asarray(jax.grad(guard(f))(x))
    assert not np.isfinite(got[0])
    np.testing.assert_allclose(got[1:], np.asarray(jax.grad(f)(x))[1:], rtol=1e-6)
