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
