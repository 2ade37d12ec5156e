"""Forward-mode output guards mask tangents and leave reverse passes alone
(:mod:`hlo_guard.jax_frontend.tangent_guard`).

An output guard after ``sqrt(maximum(x, 0))`` zeroes the tangent of the lanes
``maximum`` took its constant in; written as a select on the value it also
zeroed those lanes' cotangent in every gradient, which no reverse pass needs
(the boundary guard on ``maximum``'s operand does that job).  These tests
hold the guarded function to its hand double where in every composition of
forward and reverse passes, under ``vmap`` with the batch axis anywhere, and
check that a gradient program carries no trace of the output guard.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from double_where import DERIVATIVES as PLACEMENT_DERIVATIVES
from double_where import assert_like_double_where
from jax import lax

from hlo_guard import explain, guard, guarded_jit

X = jnp.array([-1.0, 0.5, 2.0, -3.0], jnp.float32)

#: every composition the placement tests use, and reverse over forward
DERIVATIVES = {
    **PLACEMENT_DERIVATIVES,
    "jacrev_jacfwd": lambda f: jax.jacrev(jax.jacfwd(f)),
    "jacrev_jacrev_grad": lambda f: jax.jacrev(jax.jacrev(jax.grad(f))),
}


def sqrt_of_positive_part(x):
    """Forward mode needs the output guard: ``maximum``'s JVP multiplies the
    losing lanes' tangent by 0, and ``sqrt'(0) = inf`` makes that NaN."""
    return jnp.sum(jnp.sqrt(jnp.maximum(x, 0.0)) * x)


def sqrt_of_positive_part_oracle(x):
    pos = x > 0
    return jnp.sum(jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0) * x)


def log_of_clipped(x):
    return jnp.sum(jnp.log(jnp.clip(x, 0.0, 1.0)) * x)


def log_of_clipped_oracle(x):
    low = x <= 0
    clipped = jnp.clip(jnp.where(low, 1.0, x), 0.0, 1.0)
    return jnp.sum(jnp.where(low, -jnp.inf, jnp.log(clipped)) * jnp.where(low, 0.0, 1.0) * x)


CASES = {
    "sqrt_of_maximum": (sqrt_of_positive_part, sqrt_of_positive_part_oracle, X),
    # a lane at 0 keeps log's genuine -inf in value; the derivative is the oracle's
    "log_of_clip": (
        log_of_clipped,
        log_of_clipped_oracle,
        jnp.array([0.25, 0.5, 2.0, 0.75], jnp.float32),
    ),
}


@pytest.mark.parametrize("mode", sorted(DERIVATIVES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_composition_is_the_double_where(case, mode):
    f, oracle, x = CASES[case]
    assert_like_double_where(DERIVATIVES[mode], f, oracle, x)


def test_linearize_masks_the_forward_tangent():
    """``jax.linearize`` evaluates the linear program forward: the mask is
    applied there, even though its transpose is the identity."""
    t = jnp.ones_like(X)
    _, f_jvp = jax.linearize(guard(sqrt_of_positive_part), X)
    _, want = jax.jvp(sqrt_of_positive_part_oracle, (X,), (t,))
    np.testing.assert_allclose(f_jvp(t), want, rtol=1e-6)


@pytest.mark.parametrize("in_axes", [0, 1])
def test_batched_forward_and_reverse_passes(in_axes):
    """``vmap`` with the batch axis in front or behind, of a JVP (the tangent
    mask batched) and of a gradient (the value guard batched)."""
    xs = jnp.stack([X, X[::-1] * 2.0], axis=in_axes)
    ts = jnp.ones_like(xs)

    def jvp_of(f):
        return lambda x, t: jax.jvp(f, (x,), (t,))[1]

    got = jax.vmap(jvp_of(guard(sqrt_of_positive_part)), in_axes=(in_axes, in_axes))(xs, ts)
    want = jax.vmap(jvp_of(sqrt_of_positive_part_oracle), in_axes=(in_axes, in_axes))(xs, ts)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    got = jax.vmap(jax.grad(guard(sqrt_of_positive_part)), in_axes=in_axes)(xs)
    want = jax.vmap(jax.grad(sqrt_of_positive_part_oracle), in_axes=in_axes)(xs)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_mask_that_is_not_batched_meets_a_batched_tangent():
    """``jvp`` under ``vmap`` over the tangent only: the mask (from the
    primal) has no batch axis, the tangent has one."""
    ts = jnp.eye(4, dtype=jnp.float32)
    got = jax.vmap(lambda t: jax.jvp(guard(sqrt_of_positive_part), (X,), (t,))[1])(ts)
    want = jax.grad(sqrt_of_positive_part_oracle)(X)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def _sub_jaxprs(params):
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            inner = getattr(item, "jaxpr", item)
            if hasattr(inner, "eqns"):
                yield inner


def _primitive_names(jaxpr) -> list[str]:
    """Every equation's primitive, bodies included."""
    names = []
    for eqn in jaxpr.eqns:
        names.append(eqn.primitive.name)
        for sub in _sub_jaxprs(eqn.params):
            names.extend(_primitive_names(sub))
    return names


def test_a_gradient_carries_no_output_guard_select():
    """The JVP program masks the tangent (a ``tangent_mask`` equation); the
    gradient program has no mask on the cotangent: its selects are the
    boundary guard's and ``maximum``'s own derivative's, the same count as
    without any output guard at all."""
    g = guard(sqrt_of_positive_part)
    jvp_names = _primitive_names(
        jax.make_jaxpr(lambda x: jax.jvp(g, (x,), (jnp.ones_like(x),)))(X).jaxpr
    )
    assert "tangent_mask" in jvp_names
    grad_names = _primitive_names(jax.make_jaxpr(jax.grad(g))(X).jaxpr)
    assert "tangent_mask" not in grad_names

    from hlo_guard.jax_frontend import plan

    saved = plan.plan_output_guards
    plan.plan_output_guards = lambda *args: []
    try:
        without = _primitive_names(jax.make_jaxpr(jax.grad(guard(sqrt_of_positive_part)))(X).jaxpr)
    finally:
        plan.plan_output_guards = saved
    assert grad_names.count("select_n") == without.count("select_n")


def test_the_compiled_gradient_is_the_one_without_output_guards():
    """What XLA compiles for the gradient is the same size as the program
    without any output guard (the mask arithmetic goes too)."""
    from hlo_guard.jax_frontend import plan

    def size(f):
        text = jax.jit(jax.grad(f)).lower(X).compile().as_text()
        return sum(1 for line in text.splitlines() if " = " in line)

    with_guards = size(guarded_jit(sqrt_of_positive_part))
    saved = plan.plan_output_guards
    plan.plan_output_guards = lambda *args: []
    try:
        without = size(guarded_jit(sqrt_of_positive_part))
    finally:
        plan.plan_output_guards = saved
    assert with_guards == without


def test_a_guarded_program_analysed_again_passes_the_guard_through():
    """A JVP inside a guarded function puts ``tangent_mask`` in the jaxpr
    the outer guard analyses; a guarded call puts ``tangent_guard`` there.
    Both are known operations (no unknown-operation report), and the outer
    derivatives are the oracle's."""

    def outer(f):
        return lambda x: jax.jvp(f, (x,), (jnp.ones_like(x),))[1] * jnp.sum(x)

    report = explain(outer(guard(sqrt_of_positive_part)), X)
    assert "unknown" not in str(report).lower()
    want = jax.grad(outer(sqrt_of_positive_part_oracle))(X)
    np.testing.assert_allclose(jax.grad(guard(outer(guard(sqrt_of_positive_part))))(X), want)
    twice = guard(guard(sqrt_of_positive_part))
    np.testing.assert_allclose(
        jax.jacfwd(twice)(X), jax.jacfwd(sqrt_of_positive_part_oracle)(X), rtol=1e-6
    )


def test_the_guard_is_the_identity_on_values_and_in_linear_transpose():
    """Eagerly and compiled, the value is the operand's, bit for bit; and a
    function linear in ``x`` can be transposed through the guard."""
    g = guard(lambda x: jnp.sqrt(jnp.maximum(x, 0.0)) * 3.0)
    np.testing.assert_array_equal(g(X), jnp.sqrt(jnp.maximum(X, 0.0)) * 3.0)
    np.testing.assert_array_equal(
        jax.jit(g)(X), jax.jit(lambda x: jnp.sqrt(jnp.maximum(x, 0.0)) * 3.0)(X)
    )
    linear = guard(lambda x: lax.mul(jnp.sqrt(jnp.maximum(X, 0.0)), x))
    (ct,) = jax.linear_transpose(linear, X)(jnp.ones_like(X))
    np.testing.assert_allclose(ct, jnp.sqrt(jnp.maximum(X, 0.0)))


def _scanned(f):
    """``f`` per lane inside a ``lax.scan`` body."""

    def run(x):
        return lax.scan(lambda c, xi: (c + f(xi[None]), None), 0.0, x)[0]

    return run


@pytest.mark.parametrize("mode", ["grad", "jacfwd", "hessian", "jacrev_grad"])
@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda f: jax.checkpoint(f), id="checkpoint"),
        pytest.param(
            lambda f: jax.checkpoint(f, policy=jax.checkpoint_policies.nothing_saveable),
            id="checkpoint-nothing-saveable",
        ),
        pytest.param(_scanned, id="scan-body"),
    ],
)
def test_remat_and_scan_bodies_keep_the_guard(wrap, mode):
    """Inside ``checkpoint`` (partial evaluation of the primitives) and a
    ``scan`` body (their batching-free transposition in a loop)."""
    d = DERIVATIVES[mode]
    want = d(wrap(sqrt_of_positive_part_oracle))(X)
    for guarded in (wrap(guard(sqrt_of_positive_part)), guard(wrap(sqrt_of_positive_part))):
        np.testing.assert_allclose(d(guarded)(X), want, rtol=1e-6)


IDX = jnp.array([1, 7, 2, -9])
#: which lanes of ``take(..., IDX, mode="fill")`` read the operand (in bounds)
READ = jnp.array([True, False, True, False])


@pytest.mark.parametrize("mode", ["jacfwd", "hessian", "jacfwd_jacfwd", "jacrev_jacfwd", "grad"])
@pytest.mark.parametrize(
    "op, fill",
    [(jnp.sqrt, 0.0), (jnp.cbrt, 0.0), (jnp.arcsin, 1.0), (lambda v: v**0.5, 0.0)],
    ids=["sqrt", "cbrt", "arcsin", "pow"],
)
def test_the_fill_of_a_gather_is_tangent_dead(op, fill, mode):
    """``jnp.take(..., mode="fill")`` places a constant where an index is out
    of bounds: a structurally zero tangent, which a singular op at the fill
    value turned into NaN in forward mode -- with a clean report -- because
    the gather's output counted as fully tangent-live.  The oracle selects
    the read lanes by hand (the double where; the same forward values)."""

    def f(x):
        return jnp.sum(op(jnp.take(x**2 / 16.0, IDX, mode="fill", fill_value=fill)) * x)

    def oracle(x):
        y = jnp.take(x**2 / 16.0, IDX, mode="fill", fill_value=fill)
        return jnp.sum(jnp.where(READ, op(jnp.where(READ, y, 0.25)), op(fill)) * x)

    assert_like_double_where(DERIVATIVES[mode], f, oracle, X)


def test_a_filled_lane_read_genuinely_at_zero_stays_singular():
    """An in-bounds lane whose value is 0 keeps ``sqrt'(0) = inf`` in forward
    mode: the fill's guard masks only the filled lanes."""
    x = X.at[1].set(0.0)

    def f(x):
        return jnp.sum(jnp.sqrt(jnp.take(x**2, IDX, mode="fill", fill_value=0.0)))

    got = jax.jvp(guard(f), (x,), (jnp.ones_like(x),))[1]
    assert not np.isfinite(np.asarray(got))
    want = jax.jacfwd(guard(f))(X.at[1].set(0.5))
    np.testing.assert_allclose(want, [0.0, 1.0, 1.0, 0.0], rtol=1e-6)


def test_a_genuine_singularity_behind_the_output_guard_stays_infinite():
    """At a tie (``x = 0`` in ``maximum(x, 0)``) both sides share the
    derivative, so ``sqrt'(0)`` is met on a live lane: the output guard masks
    only the lanes ``maximum`` lost (``x < 0``), and forward and reverse mode
    keep the infinity there, as plain JAX and the per-lane derivative do
    (``0.5 * 0.5 / sqrt(0)``).  (``jacfwd`` is not compared lane by lane:
    its basis tangents are 0, not symbolic zeros, in the other lanes, and
    ``0 * inf`` there is NaN in every column, in plain JAX alike.)"""

    def f(x):
        return jnp.sum(jnp.sqrt(jnp.maximum(x, 0.0)))

    x = jnp.array([0.0, 4.0, -1.0], jnp.float32)
    per_lane = np.array([np.inf, 0.25, 0.0], np.float32)
    np.testing.assert_array_equal(jax.grad(guard(f))(x), per_lane)
    np.testing.assert_array_equal(jax.grad(jax.jit(guard(f)))(x), per_lane)
    tangent = jax.jvp(guard(f), (x,), (jnp.array([1.0, 0.0, 1.0]),))[1]
    assert np.isposinf(np.asarray(tangent))
