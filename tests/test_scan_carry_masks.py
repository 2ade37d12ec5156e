"""A scan whose final carry is masked per lane: ``where(valid, fori_loop(...), 0)``.

When the loop body keeps lanes apart (every value of the carries' one shape or
a scalar, nothing moving or reducing lanes), a lane dead after the last
iteration was dead after every one, so the body is guarded with that one mask
(``rules.calls.scan_carry_liveness``).  Oracles: the hand double where (the
dead lanes' inputs replaced by a safe point before the loop) and, lane by
lane, a Python ``if`` over the scalar loop.  A body that moves lanes keeps its
carries live and is reported (tests/test_explain.py).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import hlo_guard
from hlo_guard.inspect.explain import explain

VALID = jnp.array([True, True, False, True])
D = jnp.array([1.0, 2.0, 0.0, 0.5])  # log(0) and sqrt'(0) in the dead lane
W = jnp.float32(0.5)


def _tanh_loop(w, d):
    return lax.fori_loop(0, 3, lambda i, h: jnp.tanh(w * jnp.log(d) + h), jnp.zeros_like(d))


def masked_loop(w, d):
    return jnp.sum(jnp.where(VALID, _tanh_loop(w, d), 0.0))


def masked_loop_double_where(w, d):
    return jnp.sum(jnp.where(VALID, _tanh_loop(w, jnp.where(VALID, d, 1.0)), 0.0))


def _assert_same(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_forward_is_unchanged_and_nothing_is_reported():
    np.testing.assert_array_equal(hlo_guard.guard(masked_loop)(W, D), masked_loop(W, D))
    report = explain(masked_loop, W, D)
    assert not report.unguarded
    assert any(s.op == "log" for s in report.sites)


@pytest.mark.parametrize(
    "transform",
    [
        lambda f: jax.grad(f, argnums=(0, 1)),
        lambda f: jax.jacfwd(f, argnums=(0, 1)),
        lambda f: jax.hessian(f, argnums=1),
        lambda f: jax.jacfwd(jax.grad(f, argnums=0), argnums=1),
    ],
    ids=["grad", "jacfwd", "hessian", "jacfwd_of_grad"],
)
def test_derivatives_equal_the_double_where(transform):
    assert np.isnan(np.asarray(jax.grad(masked_loop, argnums=1)(W, D))).any()  # the bug
    got = transform(hlo_guard.guard(masked_loop))(W, D)
    _assert_same(got, transform(masked_loop_double_where)(W, D))
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(got))


def test_gradient_equals_a_per_lane_python_if():
    """Each lane's loop is a scalar loop of its own: its gradient is that
    scalar loop's where the lane is kept, and 0 where it is not."""

    def lane(w, dl):
        return lax.fori_loop(0, 3, lambda i, h: jnp.tanh(w * jnp.log(dl) + h), 0.0)

    gw, gd = jax.grad(hlo_guard.guard(masked_loop), argnums=(0, 1))(W, D)
    want_w, want_d = 0.0, []
    for keep, dl in zip(np.asarray(VALID), np.asarray(D)):
        if keep:
            a, b = jax.grad(lane, argnums=(0, 1))(W, jnp.float32(dl))
            want_w += float(a)
            want_d.append(float(b))
        else:
            want_d.append(0.0)
    np.testing.assert_allclose(float(gw), want_w, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(gd), want_d, rtol=1e-5)


def test_compiled_and_under_vmap():
    batch = jnp.stack([D, D[::-1]])
    got = jax.vmap(jax.grad(hlo_guard.guarded_jit(masked_loop), argnums=1), (None, 0))(W, batch)
    want = jax.vmap(jax.grad(masked_loop_double_where, argnums=1), (None, 0))(W, batch)
    _assert_same(got, want)


def test_a_live_lane_keeps_its_genuine_singularity():
    """d = 0 in a kept lane: log'(0) is infinite there, as in the double where."""
    d = D.at[0].set(0.0)
    got = jax.grad(hlo_guard.guard(masked_loop), argnums=1)(W, d)
    want = jax.grad(masked_loop_double_where, argnums=1)(W, d)
    assert not np.isfinite(np.asarray(got)[0]) and not np.isfinite(np.asarray(want)[0])
    np.testing.assert_array_equal(np.asarray(got)[1:], np.asarray(want)[1:])


def _two_carries(d, x):
    """Carries that read each other lane by lane; only ``a`` is kept."""

    def step(carry, xt):
        a, b = carry
        return (0.5 * a + jnp.sqrt(b), b + xt), None

    (a, _), _ = lax.scan(step, (jnp.zeros_like(d), d), x)
    return a


def test_carries_reading_each_other_share_the_mask():
    x = jnp.zeros((2, 4))

    def f(d):
        return jnp.sum(jnp.where(VALID, _two_carries(d, x), 0.0))

    def oracle(d):
        return jnp.sum(jnp.where(VALID, _two_carries(jnp.where(VALID, d, 1.0), x), 0.0))

    assert np.isnan(np.asarray(jax.grad(f)(D))).any()
    _assert_same(jax.grad(hlo_guard.guard(f))(D), jax.grad(oracle)(D))
    _assert_same(jax.jacfwd(hlo_guard.guard(f))(D), jax.jacfwd(oracle)(D))
    assert not explain(f, D).unguarded


def test_stacked_outputs_keep_their_lanes_alive():
    """``ys`` masked by another mask: a lane is dead in the body only where
    it is dead both in the final carry and in every iteration's output."""
    ys_valid = jnp.array([True, False, False, True])

    def run(d):
        def step(h, _):
            h = h + jnp.sqrt(d)
            return h, h

        return lax.scan(step, jnp.zeros_like(d), None, length=2)

    def f(d):
        h, ys = run(d)
        return jnp.sum(jnp.where(VALID, h, 0.0)) + jnp.sum(jnp.where(ys_valid, ys, 0.0))

    def oracle(d):
        h, ys = run(jnp.where(VALID | ys_valid, d, 1.0))
        return jnp.sum(jnp.where(VALID, h, 0.0)) + jnp.sum(jnp.where(ys_valid, ys, 0.0))

    d = jnp.array([1.0, 2.0, 0.0, 4.0])  # lane 2 is dead in both
    assert np.isnan(np.asarray(jax.grad(f)(d))).any()
    _assert_same(jax.grad(hlo_guard.guard(f))(d), jax.grad(oracle)(d))
    assert np.isfinite(np.asarray(jax.grad(hlo_guard.guard(f))(d))).all()


def test_reverse_scan_with_a_where_inside_the_body():
    def run(d):
        def step(h, _):
            h = jnp.where(h > 1.0, jnp.log(h), h) + jnp.sqrt(d)
            return h, None

        return lax.scan(step, d, None, length=3, reverse=True)[0]

    def f(d):
        return jnp.sum(jnp.where(VALID, run(d), 0.0))

    def oracle(d):
        return jnp.sum(jnp.where(VALID, run(jnp.where(VALID, d, 1.0)), 0.0))

    assert np.isnan(np.asarray(jax.grad(f)(D))).any()
    _assert_same(jax.grad(hlo_guard.guard(f))(D), jax.grad(oracle)(D))
    _assert_same(jax.hessian(hlo_guard.guard(f))(D), jax.hessian(oracle)(D))
