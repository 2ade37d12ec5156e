"""``hlo_guard.tf.guard(f, has_aux=True)``: ``f`` returns ``(loss, aux)`` and
``aux`` (predictions for metrics) is returned gradient-stopped, so it does not
keep the lanes the loss masks live.  Oracle: the hand double where under XLA."""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import assert_same

import hlo_guard.tf as hg
from hlo_guard.errors import GuardUsageError

X = tf.constant([0.0, 1.0, 4.0])


def loss_and_predictions(w, x):
    pred = tf.sqrt(x * w)  # sqrt'(0) = inf at the padded lane
    return tf.reduce_sum(tf.where(x > 0, pred, 0.0)), {"pred": pred}


def oracle(w, x):
    pred = tf.sqrt(tf.where(x > 0, x, 1.0) * w)
    return tf.reduce_sum(tf.where(x > 0, pred, 0.0))


def grad_of_loss(fn, w, x):
    @tf.function(jit_compile=True)
    def run(w, x):
        with tf.GradientTape() as tape:
            tape.watch(w)
            result = fn(w, x)
            loss = result[0] if isinstance(result, tuple) else result
        return tape.gradient(loss, w)

    return run(w, x).numpy()


@pytest.mark.parametrize("make", [hg.guard, hg.guarded_function])
def test_aux_does_not_keep_masked_lanes_live(make):
    w = tf.constant(2.0)
    assert np.isnan(grad_of_loss(loss_and_predictions, w, X))
    assert np.isnan(grad_of_loss(hg.guard(loss_and_predictions), w, X))
    guarded = make(loss_and_predictions, has_aux=True)
    assert_same(grad_of_loss(guarded, w, X), grad_of_loss(oracle, w, X))
    loss, aux = guarded(w, X)
    want_loss, want_aux = loss_and_predictions(w, X)
    np.testing.assert_array_equal(loss.numpy(), want_loss.numpy())
    np.testing.assert_array_equal(aux["pred"].numpy(), want_aux["pred"].numpy())


def test_bad_has_aux_and_non_pair_results_are_refused():
    with pytest.raises(GuardUsageError, match="has_aux"):
        hg.guard(loss_and_predictions, has_aux="yes")
    with pytest.raises(GuardUsageError, match="pair"):
        hg.guard(lambda w, x: tf.sqrt(x * w), has_aux=True)(tf.constant(2.0), X)
