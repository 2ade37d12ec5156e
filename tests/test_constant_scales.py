"""A use scaled by a finite constant known while tracing.

``where(c, 2.0 * x, 0)``: the cotangent reaching ``x`` in a dead lane is
``0 * 2.0``, an exact zero whatever ``x`` holds -- so there is nothing for a
guard to select, and the product is no hazard.  The constant may reach the
operation through ``jnp``'s wrapper calls, as an argument or as a call's
result (``jnp.sqrt(8)`` is one), and a small computation of constants is
evaluated.  A *division* by a known constant (Dropout's ``x / keep_prob``,
``jnp.mean``'s count) is the same in principle but still guarded: dropping
``jnp.mean``'s guard in a layer norm made the 2-layer transformer's other
guards take their masks from side computations, which XLA recomputes in every
fusion reading them (+28% gradient HLO in ``make bench``; RESULTS.md,
nineteenth session).  Its gradient is exact either way.  A closed-over array
is a known constant too: its value is read while tracing.

Guarded as before: a scale that is not known (``x * y``), a known divisor of
zero, an infinite known factor, and a divisor only bounded below (``x /
maximum(n, 1)``: a NaN ``n`` in a dead lane would make ``0 / NaN``).  Each is compared
with the hand-written double where in the lanes where plain JAX is NaN.

Oracles: plain JAX where it is already clean (bitwise), the double where
where it is not, in forward and reverse modes and second order.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard
from tests.double_where import assert_like_double_where, modes

C = jnp.asarray([True, False, True, False])
#: dead lanes hold an inf and a NaN
X = jnp.asarray([1.5, jnp.inf, -2.0, jnp.nan])

#: a closed-over array of finite values (class weights, a fixed basis)
FINITE_FACTOR = jnp.asarray([2.0, 0.5, 3.0, 1.0])

#: products by a finite known constant: no reverse guard
SCALED = {
    "times_a_literal": lambda x: jnp.sum(jnp.where(C, 2.0 * x, 0.0) * x),
    "times_a_folded_constant": lambda x: jnp.sum(
        jnp.where(C, x * (1.0 / jnp.sqrt(8).astype(jnp.float32)), 0.0) * x
    ),
    "dropout_by_product": lambda x: jnp.sum(jnp.tanh(jnp.where(C, x * (1 / 0.9), 0.0)) * 3.0),
    "times_a_closed_over_array": lambda x: jnp.sum(jnp.where(C, x * FINITE_FACTOR, 0.0)),
}
#: divisions by one: still guarded (see ``Elementwise.guards_input``), and
#: exact -- the guard selects nothing plain JAX does not already zero
DIVIDED = {
    "divided_by_a_literal": lambda x: jnp.sum(jnp.where(C, x / 2.0, 0.0) * x),
    "dropout": lambda x: jnp.sum(jnp.tanh(jnp.where(C, x / 0.9, 0.0)) * 3.0),
    "mean": lambda x: jnp.sum(jnp.where(C[:2], jnp.mean(x.reshape(2, 2), axis=1), 0.0)),
    "divided_by_a_folded_constant": lambda x: jnp.sum(
        jnp.where(C, x / jnp.sqrt(8).astype(jnp.float32), 0.0) * x
    ),
}


@pytest.mark.parametrize("case", sorted(SCALED) + sorted(DIVIDED))
def test_a_constant_scale_gives_plain_jax_gradient(case):
    f = {**SCALED, **DIVIDED}[case]
    report = hlo_guard.explain(f, X)
    operand_guards = [g for g in report.guards if g.output is None]
    assert (operand_guards == []) == (case in SCALED), report
    plain = np.asarray(jax.grad(f)(X))
    assert np.isfinite(plain).all()  # the scale kept the dead lanes clean
    np.testing.assert_array_equal(np.asarray(jax.grad(hlo_guard.guard(f))(X)), plain)
    # under jit a forward-mode output guard (tanh's) may let XLA fuse differently
    got = np.asarray(jax.jit(jax.grad(hlo_guard.guard(f)))(X))
    np.testing.assert_allclose(got, plain, rtol=1e-6, atol=0)


#: an inf in a dead lane: ``0 * inf`` there
FACTOR = jnp.asarray([2.0, jnp.inf, 3.0, 1.0])


def _safe(x):
    return jnp.where(C, x, 1.0)


#: (f, its double where): the scale is not a known finite constant
NOT_A_KNOWN_SCALE = {
    "times_a_closed_over_array_with_an_inf": (  # read while tracing: not finite
        lambda x: jnp.sum(jnp.where(C, x * FACTOR, 0.0)),
        lambda x: jnp.sum(jnp.where(C, x * jnp.where(C, FACTOR, 0.0), 0.0)),
    ),
    "divided_by_zero": (
        lambda x: jnp.sum(jnp.where(C, x / 0.0, 0.0)),
        lambda x: jnp.sum(jnp.where(C, _safe(x) / 0.0, 0.0)),
    ),
    "times_inf": (
        lambda x: jnp.sum(jnp.where(C, x * jnp.inf, 0.0)),
        lambda x: jnp.sum(jnp.where(C, _safe(x) * jnp.inf, 0.0)),
    ),
    "divisor_bounded_below": (
        lambda x: jnp.sum(jnp.where(C, 1.0 / jnp.maximum(x, 1.0), 0.0)),
        lambda x: jnp.sum(jnp.where(C, 1.0 / jnp.maximum(_safe(x), 1.0), 0.0)),
    ),
}


@pytest.mark.parametrize("mode", ["grad", "jacfwd", "hessian"])
@pytest.mark.parametrize("case", sorted(NOT_A_KNOWN_SCALE))
def test_anything_else_keeps_its_guard(case, mode):
    f, double_where = NOT_A_KNOWN_SCALE[case]
    assert hlo_guard.explain(f, X).guards
    if mode == "grad":
        assert np.isnan(np.asarray(jax.grad(f)(X))).any()  # the bug is there
    d = modes(mode)[mode]
    assert_like_double_where(d, f, double_where, X)


@pytest.mark.parametrize("mode", ["grad", "jacfwd", "hessian", "jacfwd_grad"])
@pytest.mark.parametrize("case", ["divided_by_a_literal", "divided_by_a_folded_constant"])
def test_every_mode_matches_the_double_where(case, mode):
    f = DIVIDED[case]
    if case == "divided_by_a_literal":
        dw = lambda x: jnp.sum(jnp.where(C, _safe(x) / 2.0, 0.0) * _safe(x))
    else:
        scale = jnp.sqrt(8).astype(jnp.float32)
        dw = lambda x: jnp.sum(jnp.where(C, _safe(x) / scale, 0.0) * _safe(x))
    x = jnp.where(C, X, 0.5)  # finite: hessian's second factor reads x itself
    assert_like_double_where(modes(mode)[mode], f, dw, x)


@pytest.mark.parametrize(
    "make, folded",
    [
        (lambda: jnp.sqrt(8).astype(jnp.float32), True),
        (lambda: (jnp.float32(3.0) - 1.0) / 7.0, True),
        (lambda: jnp.maximum(jnp.sqrt(2.0), 1.5) * -2.0, True),
        (lambda: jnp.exp(jnp.float32(1.0)), False),  # not correctly rounded: left alone
    ],
)
def test_known_constant_folds_exactly_rounded_arithmetic(make, folded):
    """The value ``known_constant`` computes is JAX's own, bit for bit (numpy's
    correctly rounded operations in the output's dtype); operations whose
    rounding may differ are not folded."""
    from hlo_guard.jax_frontend.graph import JaxprGraph

    closed = jax.make_jaxpr(lambda: make())()
    graph = JaxprGraph(closed.jaxpr)
    got = graph.known_constant(closed.jaxpr.outvars[0])
    if not folded:
        assert got is None
        return
    want = np.asarray(jax.jit(make)())
    assert got is not None and np.asarray(got).dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(got), want)


def test_a_genuine_singularity_behind_a_constant_product_stays():
    """A taken lane at ``x = 0``: ``sqrt'(0)`` scaled by 2 is still infinite.
    The product is no hazard, so nothing is guarded, and nothing hides it."""
    x = jnp.asarray([0.0, 1.0, 4.0, -1.0])
    keep = x >= 0
    f = lambda x: jnp.sum(jnp.where(keep, 2.0 * jnp.sqrt(jnp.where(keep, x, 1.0)), 0.0))
    plain = np.asarray(jax.grad(f)(x))
    assert np.isposinf(plain[0])
    for g in (jax.grad(hlo_guard.guard(f)), jax.jit(jax.grad(hlo_guard.guard(f)))):
        np.testing.assert_array_equal(np.asarray(g(x)), plain)


_M = jnp.asarray([[0.5, -1.5, 2.0], [1.0, 0.25, -3.0]], jnp.float32)


@pytest.mark.parametrize(
    "copy",
    [
        lambda m: jnp.broadcast_to(m, (4, 2, 3)),
        lambda m: jnp.broadcast_to(m[:, None, :], (2, 5, 3)),
        lambda m: jnp.reshape(m, (3, 2)),
        lambda m: jnp.squeeze(m[None]),
    ],
    ids=["broadcast", "broadcast middle axis", "reshape", "squeeze"],
)
def test_known_constant_sees_through_copies_of_a_closed_over_array(copy):
    """A broadcast or reshape of a closed-over array is the array's values,
    as XLA computes them."""
    from hlo_guard.jax_frontend.graph import JaxprGraph

    closed = jax.make_jaxpr(lambda x: copy(_M) * x)(jnp.float32(1.0))
    values = dict(zip(closed.jaxpr.constvars, map(np.asarray, closed.consts)))
    graph = JaxprGraph(closed.jaxpr, constant_values=values)
    (mul,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "mul"]
    got = graph.known_constant(mul.invars[0])
    assert got is not None
    np.testing.assert_array_equal(np.asarray(got), np.asarray(jax.jit(lambda: copy(_M))()))


def _hat(w):
    return jnp.array([[0.0, -w[2], w[1]], [w[2], 0.0, -w[0]], [-w[1], w[0], 0.0]])


def _exp_so3(w, double_where):
    t2 = jnp.sum(w * w)
    if double_where:
        small = t2 < 1e-12
        th = jnp.sqrt(jnp.where(small, 1.0, t2))
        a = jnp.where(small, 1 - t2 / 6, jnp.sin(th) / th)
        b = jnp.where(small, 0.5 - t2 / 24, (1 - jnp.cos(th)) / jnp.where(small, 1.0, t2))
    else:
        a, b = jax.lax.cond(
            t2 < 1e-12,
            lambda t: (1 - t / 6, 0.5 - t / 24),
            lambda t: (jnp.sin(jnp.sqrt(t)) / jnp.sqrt(t), (1 - jnp.cos(jnp.sqrt(t))) / t),
            t2,
        )
    k = _hat(w)
    return jnp.eye(3) + a * k + b * (k @ k)


def test_a_scan_output_times_a_broadcast_constant_array_is_not_a_forward_gap():
    """A rotation rollout (a ``scan`` whose small-angle switch is a ``cond``,
    batched by ``vmap``), its final rotation times a closed-over ``[3, 3]``
    array that ``jnp`` broadcasts: a finite scale, no forward-mode gap.  It
    was reported (a geometry hunt, 2026-11-28).  jacfwd equals the double
    where's."""
    m = jnp.asarray(np.random.default_rng(3).normal(size=(3, 3)), jnp.float32)
    steps = jnp.array([1.0, 0.0, 0.5, 0.0], jnp.float32)

    def rollout(o, double_where=False):
        def step(r, s):
            r2 = r @ _exp_so3(o * s * 0.1, double_where)
            return r2, jnp.trace(r2)

        rt, traces = jax.lax.scan(step, jnp.eye(3), steps)
        return jnp.sum(rt * m) + 0.1 * jnp.sum(traces)

    def f(o):
        return jnp.sum(jax.vmap(rollout)(o))

    def oracle(o):
        return jnp.sum(jax.vmap(lambda v: rollout(v, True))(o))

    o = jnp.array([[0.0, 0.0, 0.0], [0.4, -0.1, 0.9], [0.0, 0.0, 1e-9]], jnp.float32)
    assert not hlo_guard.explain(f, o).unguarded
    np.testing.assert_allclose(jax.jacfwd(hlo_guard.guard(f))(o), jax.jacfwd(oracle)(o), atol=1e-6)
