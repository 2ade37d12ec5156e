"""Shared helpers of the TF front-end tests (not a test module)."""

import numpy as np
import tensorflow as tf


def xla_grads(fn, *xs, jit=True):
    """Gradients of sum(fn(*xs)) w.r.t. every x, inside tf.function(jit_compile=jit)."""
    xs = [tf.convert_to_tensor(x) for x in xs]

    @tf.function(jit_compile=jit)
    def run(*xs):
        with tf.GradientTape() as tape:
            for x in xs:
                tape.watch(x)
            y = tf.reduce_sum(fn(*xs))
        return tape.gradient(y, list(xs))

    return [g.numpy() for g in run(*xs)]


def xla_second_derivative(fn, x):
    """The diagonal-summed second derivative d/dx (d sum(fn(x)) / dx), nested
    tapes inside tf.function(jit_compile=True)."""

    @tf.function(jit_compile=True)
    def run(x):
        with tf.GradientTape() as outer:
            outer.watch(x)
            with tf.GradientTape() as inner:
                inner.watch(x)
                y = tf.reduce_sum(fn(x))
            g = inner.gradient(y, x)
        return outer.gradient(g, x)

    return run(x).numpy()


def jvp_of_ones(fn, x, jit=True):
    """Forward mode: ``ForwardAccumulator`` of ``fn`` at ``x`` with a tangent
    of ones, inside tf.function(jit_compile=jit)."""

    @tf.function(jit_compile=jit)
    def run(x):
        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as acc:
            y = fn(x)
        return acc.jvp(y)

    return run(x).numpy()


def eager_grads(fn, *xs):
    xs = [tf.convert_to_tensor(x) for x in xs]
    with tf.GradientTape() as tape:
        for x in xs:
            tape.watch(x)
        y = tf.reduce_sum(fn(*xs))
    return [g.numpy() for g in tape.gradient(y, xs)]


def xla_forward(fn, *xs):
    return tf.function(fn, jit_compile=True)(*[tf.convert_to_tensor(x) for x in xs])


def assert_same(actual, expected, rtol=1e-6):
    """Equal values, with NaN/inf in exactly the same places."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(expected))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=0, equal_nan=True)


def bitwise_equal(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def assert_guard_mends_leak(fn, oracle, *xs, rtol=1e-6):
    """The check every rule test makes: under XLA the plain program's
    gradient leaks NaN/inf, the oracle's (a double where) is finite, the
    guarded gradient equals the oracle's and the guarded forward is bitwise
    the plain one.  Returns the guarded function's report."""
    import hlo_guard.tf as hg

    xs = [tf.convert_to_tensor(x) for x in xs]
    plain = xla_grads(fn, *xs)
    assert not all(np.isfinite(p).all() for p in plain), "plain program should leak"
    expected = xla_grads(oracle, *xs)
    assert all(np.isfinite(e).all() for e in expected)
    guarded = hg.guard(fn)
    for g, e in zip(xla_grads(guarded, *xs), expected):
        assert_same(g, e, rtol=rtol)
    assert bitwise_equal(xla_forward(guarded, *xs), xla_forward(fn, *xs))
    return hg.report(guarded, *xs)
