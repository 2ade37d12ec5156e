"""TF decompositions, inverses and solves (``MatrixMixing``): a batch element
none of whose outputs is used is dead in every lane, so its NaN (a matrix that
is not positive definite, a singular one, a NaN in padding) stays out of
the gradient under XLA; lanes within a matrix are not followed, so the site
is always reported.  Oracle: the double where, dead batch elements replaced
by a harmless matrix before the op; and the plain program where a matrix
stays live."""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import assert_guard_mends_leak, assert_same, xla_grads

import hlo_guard.tf as hg

VALID = np.array([True, False, True])
SPD = [[[4.0, 1.0], [1.0, 3.0]], [[2.0, 0.5], [0.5, 5.0]]]


def _batch(bad):
    return np.array([SPD[0], bad, SPD[1]], np.float32)


ZEROS = [[0.0, 0.0], [0.0, 0.0]]

CASES = {
    # not positive definite
    "cholesky": (
        lambda a: tf.reduce_sum(tf.math.log(tf.linalg.diag_part(tf.linalg.cholesky(a))), -1),
        _batch([[1.0, 2.0], [2.0, 1.0]]),
    ),
    # singular (a padded batch element of zeros)
    "inverse": (lambda a: tf.reduce_sum(tf.linalg.inv(a), [-2, -1]), _batch(ZEROS)),
    "solve": (
        lambda a: tf.reduce_sum(tf.linalg.solve(a, tf.ones([3, 2, 1])), [-2, -1]),
        _batch(ZEROS),
    ),
    "qr": (
        lambda a: tf.reduce_sum(tf.linalg.diag_part(tf.linalg.qr(a)[1]) ** 3, -1),
        _batch(ZEROS),
    ),
    # a NaN in a padded element (missing data)
    "svd": (
        lambda a: tf.reduce_sum(tf.linalg.svd(a, compute_uv=True)[1][..., 0], -1),
        _batch([[np.nan, 0.0], [0.0, 1.0]]),
    ),
}


def masked(case, safe=False):
    body, _ = CASES[case]

    def fn(a):
        if safe:
            a = tf.where(VALID[:, None, None], a, tf.constant([[1.0, 0.0], [0.0, 2.0]]))
        return tf.where(VALID, body(a), 0.0)

    return fn


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_dead_batch_element_is_dead_in_every_lane(case):
    _, a = CASES[case]
    report = assert_guard_mends_leak(masked(case), masked(case, safe=True), a, rtol=1e-5)
    assert any("within one matrix" in s.reason for s in report.unguarded), str(report)


def test_a_live_matrix_keeps_the_plain_gradient():
    """One lane of each factor read: the matrices stay live, the gradient is
    the plain program's, and the site is reported."""
    a = tf.constant(_batch([[3.0, 1.0], [1.0, 2.0]]))

    def fn(a):
        return tf.sqrt(tf.linalg.cholesky(a)[:, 0, 0])

    (plain,) = xla_grads(fn, a)
    (got,) = xla_grads(hg.guard(fn), a)
    assert_same(got, plain)
    report = hg.report(hg.guard(fn), a)
    assert any("Cholesky" in s.op for s in report.unguarded), str(report)
