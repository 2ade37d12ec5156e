"""TF reports a zero a mask makes by *value* times a singular factor
(:mod:`hlo_guard.tf.where_made_zeros`), as the JAX front end does.

``tf.cast(mask, f32) * tf.norm(x, -1)`` -- Keras's way of applying a mask --
is NaN under XLA on a padded row (``0 * sqrt'(0)``), guarded or not: the
padded lanes are not dead (the cotangent is the zero's value), and the
contract keeps a numeric zero's NaN.  Until 2026-11-28 the report was clean
(a user-style hunt: Keras ``Masking`` + a norm loss trained to NaN weights
under ``fit(jit_compile=True)``)."""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import jvp_of_ones, xla_grads

import hlo_guard.tf as hg

X = tf.constant([[0.0, 0.0], [1.0, 4.0], [3.0, 0.0]])
M = tf.constant([False, True, True])


def _where_made(report):
    return [s for s in report.unguarded if "zero made by a mask's value" in s.reason]


LEAKING = {
    "cast(mask) * norm": lambda x: tf.cast(M, tf.float32) * tf.norm(x, axis=-1),
    "where(mask, 1, 0) * norm": lambda x: tf.where(M, 1.0, 0.0) * tf.norm(x, axis=-1),
    "cast(any(x > 0)) * norm": lambda x: (
        tf.cast(tf.reduce_any(x > 0, -1), tf.float32) * tf.norm(x, axis=-1)
    ),
    "norm * cast(mask) * 2": lambda x: tf.norm(x, axis=-1) * (tf.cast(M, tf.float32) * 2.0),
    "cast(mask) * log": lambda x: tf.cast(M, tf.float32) * tf.reduce_sum(tf.math.log(x), -1),
}


@pytest.mark.parametrize("name", sorted(LEAKING))
def test_a_mask_multiplying_a_singular_factor_is_reported(name):
    f = LEAKING[name]
    guarded = hg.guard(f)
    (grad,) = xla_grads(guarded, X)
    assert np.isnan(grad[0]).all()  # the padded row: 0 * sqrt'(0), plain XLA's NaN kept
    np.testing.assert_array_equal(guarded(X), f(X))
    (site,) = _where_made(hg.report(guarded, X))
    assert site.op.startswith("Mul")
    assert "tf.where(mask, loss, 0)" in site.reason


CLEAN = {
    # selecting instead of multiplying: a dead lane, guarded
    "where(mask, norm, 0)": lambda x: tf.where(M, tf.norm(x, axis=-1), 0.0),
    # nothing singular behind the other factor
    "cast(mask) * sum of squares": lambda x: tf.cast(M, tf.float32) * tf.reduce_sum(x * x, -1),
    # the mask is data, not made by a select or a cast: a numeric zero, as any other
    "weights * norm": lambda x: tf.constant([0.0, 1.0, 1.0]) * tf.reduce_sum(x * x, -1),
    # singular ops kept away from their singularity, as TF's and Keras's losses write them
    "cast(mask) * logistic loss": lambda x: (
        tf.cast(M, tf.float32)
        * tf.reduce_sum(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.ones_like(x), logits=x), -1
        )
    ),
    "cast(mask) * log(clip)": lambda x: (
        tf.cast(M, tf.float32) * tf.reduce_sum(tf.math.log(tf.clip_by_value(x, 1e-7, 1.0)), -1)
    ),
    "cast(mask) * log(maximum)": lambda x: (
        tf.cast(M, tf.float32) * tf.reduce_sum(tf.math.log(tf.maximum(x, 1e-7)), -1)
    ),
}


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_anything_else_is_not(name):
    f = CLEAN[name]
    guarded = hg.guard(f)
    assert not _where_made(hg.report(guarded, X))
    (grad,) = xla_grads(guarded, X)
    assert np.isfinite(grad).all()


def _masked_square(x):
    """A 0/1 mask times a where: the mask's own factor is finite and has no
    tangent, so the product cannot turn a zero tangent into NaN."""
    return tf.cast(M, tf.float32) * tf.where(x > 0, x * x, 0.0)[:, 0]


def test_a_bool_mask_factor_needs_no_forward_mode_guard():
    """``loss * cast(mask)`` (Keras's ``SparseCategoricalCrossentropy(
    ignore_class=...)``) was given a forward-mode output guard and also
    reported as an unguarded forward-mode site; a cast boolean is a finite
    scale, as a finite constant is.  The tangent still equals the double
    plain program's."""
    guarded = hg.guard(_masked_square)
    report = hg.report(guarded, X)
    assert not report.unguarded
    assert all(s.operand is not None for s in report.guards)  # no output guard
    np.testing.assert_array_equal(jvp_of_ones(guarded, X), jvp_of_ones(_masked_square, X))


def test_keras_ignore_class_cross_entropy_report_is_clean():
    keras = pytest.importorskip("keras")
    logits = tf.constant(np.random.default_rng(0).normal(size=(3, 4, 5)), tf.float32)
    labels = tf.constant([[0, 1, 2, 3], [4, 0, -1, -1], [-1, -1, -1, -1]], tf.int32)
    loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, ignore_class=-1, reduction=None
    )
    guarded = hg.guard(lambda z: loss(labels, z))
    report = hg.report(guarded, logits)
    assert not report.unguarded
    np.testing.assert_allclose(
        jvp_of_ones(guarded, logits), jvp_of_ones(lambda z: loss(labels, z), logits), rtol=1e-6
    )
