"""A gradient computed *inside* the guarded function is refused, loudly.

The tape (or ``tf.gradients``) builds its gradient ops while the function is
traced, before hlo_guard sees the graph, so guards inserted afterwards cannot
reach them: before this check ``@guarded_function`` on a train step returned
the unguarded (NaN) gradient and a clean report.  The error says where the
guard belongs; the pattern it recommends gives the double-where gradient.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import assert_same

import hlo_guard.tf as hg
from hlo_guard.errors import GuardUsageError

X = tf.constant([-1.0, 0.0, 1.0, 4.0])


def where_sqrt(x):
    return tf.where(x > 0, tf.sqrt(x), tf.zeros_like(x))


def oracle_grad(x):
    """d/dx sum(where(x > 0, sqrt(x), 0)) by the double-where, under XLA."""

    @tf.function(jit_compile=True)
    def run(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            safe = tf.where(x > 0, x, tf.ones_like(x))
            y = tf.reduce_sum(tf.where(x > 0, tf.sqrt(safe), 0.0))
        return tape.gradient(y, x)

    return run(x).numpy()


def test_tape_inside_guarded_function_raises_and_says_where_to_guard():
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(where_sqrt(x))
        return tape.gradient(y, x)

    tape_line = inspect.getsourcelines(step)[1] + 4

    f = hg.guarded_function(step)
    with pytest.raises(GuardUsageError) as info:
        f(X)
    msg = str(info.value)
    assert "computes a gradient itself" in msg
    assert "keep the tape outside" in msg
    assert "hlo_guard.tf.guard(compute_loss)" in msg
    assert f"{__file__}:{tape_line}" in msg  # the user's tape.gradient line
    # the report cannot call it clean either
    with pytest.raises(GuardUsageError):
        hg.report(f, X)


def test_tf_gradients_inside_guard_raises():
    @tf.function
    def step(x):
        return tf.gradients(tf.reduce_sum(where_sqrt(x)), x)[0]

    with pytest.raises(GuardUsageError, match="computes a gradient itself"):
        hg.guard(step)(X)


def test_tape_in_nested_tf_function_raises():
    @tf.function
    def grad_of(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(where_sqrt(x))
        return tape.gradient(y, x)

    with pytest.raises(GuardUsageError, match="computes a gradient itself"):
        hg.guarded_function(lambda x: grad_of(x) * 2.0)(X)


def test_keras_train_step_inside_guarded_function_raises():
    keras = pytest.importorskip("keras")
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    opt = keras.optimizers.SGD(0.1)
    opt.build(model.trainable_variables)

    @hg.guarded_function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            pred = model(x)
            loss = tf.reduce_mean(tf.where(pred > 0, tf.sqrt(pred), 0.0) - y)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    with pytest.raises(GuardUsageError, match="keep the tape outside"):
        train_step(tf.ones([4, 1]), tf.zeros([4, 1]))


def test_recommended_pattern_gives_the_double_where_gradient():
    loss_fn = hg.guard(lambda x: tf.reduce_sum(where_sqrt(x)))

    @tf.function(jit_compile=True)
    def train_step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = loss_fn(x)
        return tape.gradient(loss, x)

    got = train_step(X).numpy()
    assert np.isfinite(got).all()
    assert_same(got, oracle_grad(X))


def test_nested_guard_without_tape_is_accepted():
    """A guard inside a guarded function builds its masks with tf.gradients
    (scope ``hlo_guard_probe``): those are not the user's gradients."""
    inner = hg.guard(lambda y: tf.gather(tf.sqrt(y), [2, 3]))
    outer = hg.guard(lambda x: inner(x) * 2.0)

    @tf.function(jit_compile=True)
    def grad(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(outer(x))
        return tape.gradient(y, x)

    np.testing.assert_allclose(
        grad(tf.constant([0.0, 0.0, 1.0, 4.0])).numpy(), [0.0, 0.0, 1.0, 0.5]
    )
