"""Softmax-like TF ops: ``Softmax``, ``LogSoftmax`` and the fused
cross-entropies mix lanes within a row (the last axis) and nowhere else.  A
row dropped by a later ``where`` (a padded token, a masked batch row) is dead
in every lane, so a singular op before it is guarded; a row with one live lane
is live in all of them, as the derivative mixes it.  Oracles: the double where
on the dropped rows, and the plain program where nothing is structurally
zero."""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import (
    assert_guard_mends_leak,
    assert_same,
    jvp_of_ones,
    xla_grads,
    xla_second_derivative,
)

import hlo_guard.tf as hg

# row 1 is padding: log(0) = -inf in every lane, and the row's softmax is NaN
X = np.array([[1.0, 2.0, 0.5, 4.0], [0.0, 0.0, 0.0, 0.0], [3.0, 1.0, 2.0, 0.25]], np.float32)
VALID = np.array([True, False, True])
LABELS = np.array([0, 2, 3], np.int32)
TARGET = np.array([[0.1, 0.2, 0.3, 0.4]] * 3, np.float32)

HEADS = {
    "softmax": lambda z: tf.reduce_sum(tf.nn.softmax(z) * TARGET, -1),
    "log_softmax": lambda z: tf.reduce_sum(tf.nn.log_softmax(z) * TARGET, -1),
    "sparse_xent": lambda z: tf.nn.sparse_softmax_cross_entropy_with_logits(LABELS, z),
    "dense_xent": lambda z: tf.nn.softmax_cross_entropy_with_logits(TARGET, z),
}


def masked(head, safe=False):
    def fn(x):
        inner = tf.where(VALID[:, None], x, 1.0) if safe else x
        return tf.where(VALID, HEADS[head](tf.math.log(inner)), 0.0)

    return fn


@pytest.mark.parametrize("head", sorted(HEADS))
def test_a_dropped_row_is_dead_in_every_lane(head):
    report = assert_guard_mends_leak(masked(head), masked(head, safe=True), X)
    assert not report.unguarded, str(report)
    assert "Log" in [s.op.split()[0] for s in report.guards]


@pytest.mark.parametrize("head", ["softmax", "log_softmax"])
def test_dropped_rows_in_higher_orders_and_forward_mode(head):
    x = tf.constant(X)
    fn, oracle = masked(head), masked(head, safe=True)
    guarded = hg.guard(fn)
    assert_same(xla_second_derivative(guarded, x), xla_second_derivative(oracle, x), rtol=1e-5)
    assert_same(jvp_of_ones(guarded, x), jvp_of_ones(oracle, x))


@pytest.mark.parametrize("head", sorted(HEADS))
def test_a_row_with_one_live_lane_is_live_in_all_of_them(head):
    """Only lanes are dropped here (every row keeps some): the derivative
    mixes each row, so nothing is structurally zero, and the guarded
    gradient is the plain one -- NaN included, where ``log(0)`` in a live row
    meets a softmax weight of exactly 0 (a value, not a selection)."""
    x = X.copy()
    x[1] = [0.5, 0.0, 2.0, 1.0]
    keep = np.array([[True, False, True, True], [False, True, True, True], [True] * 4])

    def fn(x):
        z = tf.math.log(x)
        if head in ("softmax", "log_softmax"):
            y = (tf.nn.softmax if head == "softmax" else tf.nn.log_softmax)(z)
            return tf.reduce_sum(tf.where(keep, y * TARGET, 0.0), -1)
        return HEADS[head](z) * 2.0

    x = tf.constant(x)
    (plain,) = xla_grads(fn, x)
    (got,) = xla_grads(hg.guard(fn), x)
    assert_same(got, plain)
