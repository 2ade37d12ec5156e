"""TF: a NaN operand of ``Maximum``/``Minimum``/``Max``/``Min`` is a taken path.

The TF counterpart of ``test_nan_operand_lanes.py``.  TF's gradients select
with ``x >= y`` (``Maximum``) and multiply by ``x == max`` over its count
(``Max``), both false for NaN, so a NaN lane's operands were all dead and the
guards zeroed a gradient that plain TF computes as NaN (``sqrt`` of a NaN row
maximum, ``acos(clip_by_value(0 / 0))``).  Oracle: the hand double where that
moves each losing lane to a value that still loses and leaves NaN lanes
alone, in graph mode and under XLA.
"""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import xla_grads

import hlo_guard.tf as hg

NAN = np.float32(np.nan)
#: lane 0 NaN (taken), lanes 1 and 3 lose (sqrt'(0) = inf at lane 1), lane 2 wins
X = tf.constant([NAN, 0.0, 4.0, 1e-4])
LOSING = tf.constant([False, True, False, True])


def _still_losing(x):
    return tf.where(LOSING, 1e-4, x)  # sqrt(1e-4) = 0.01 loses to every bound here


def log_of_maximum(x):
    return tf.math.log(tf.maximum(tf.sqrt(x), 0.1))


def log_of_minimum(x):
    return tf.math.log(-tf.minimum(-tf.sqrt(x), -0.1))


def log_of_clip(x):
    return tf.math.log(tf.clip_by_value(tf.sqrt(x), 0.1, 1.5))


def log_of_raw_clip(x):
    """The ``ClipByValue`` op itself (``tf.clip_by_value`` is ``Minimum`` of
    ``Maximum``): its ``t`` mask is a negation of two comparisons, which
    Grappler rewrote NaN-false in graph mode."""
    return tf.math.log(tf.raw_ops.ClipByValue(t=tf.sqrt(x), clip_value_min=0.1, clip_value_max=1.5))


CASES = {
    "maximum": log_of_maximum,
    "minimum": log_of_minimum,
    "clip_by_value": log_of_clip,
    "ClipByValue": log_of_raw_clip,
}


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("f", CASES.values(), ids=CASES.keys())
def test_nan_lane_keeps_plain_tfs_gradient_and_losing_lanes_are_guarded(f, jit):
    got = xla_grads(hg.guard(f), X, jit=jit)[0]
    want = xla_grads(lambda x: f(_still_losing(x)), X, jit=jit)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    # the NaN lane is plain TF's (NaN under XLA; in graph mode TF's own
    # selects give the NaN ``x`` of ``Maximum`` a zero), no other lane is NaN
    assert np.isnan(got[0]) == np.isnan(xla_grads(f, X, jit=jit)[0][0])
    assert np.isfinite(got[1:]).all()


ROWS = tf.constant([[NAN, 1.0], [0.0, 4.0], [0.0, 0.25]])
ROWS_LOSING = tf.constant([[False, True], [True, False], [True, False]])


@pytest.mark.parametrize("reduce", ["max", "min"])
def test_a_nan_row_of_a_reduction_keeps_its_nan(reduce):
    """Graph mode: TF's CPU kernel propagates the NaN, and ``_MinOrMaxGrad``
    divides by the count of lanes equal to the result, 0 on a NaN row, so
    plain TF's whole row is NaN.  The NaN element keeps its NaN; the finite
    one lost to it and gets an exact zero.  Rows 1 and 2 are compared with
    the hand double where."""

    def f(x):
        if reduce == "max":
            return tf.math.log(tf.reduce_max(tf.sqrt(x), axis=1))
        return tf.math.log(-tf.reduce_min(-tf.sqrt(x), axis=1))

    got = xla_grads(hg.guard(f), ROWS, jit=False)[0]
    want = xla_grads(lambda x: f(tf.where(ROWS_LOSING, 1e-4, x)), ROWS, jit=False)[0]
    assert np.isnan(xla_grads(f, ROWS, jit=False)[0][0]).all()
    assert np.isnan(got[0, 0]) and got[0, 1] == 0.0
    np.testing.assert_allclose(got[1:], want[1:], rtol=1e-6)


def test_under_xla_a_nan_the_reduction_skips_is_dead():
    """TF's XLA lowering of ``Max`` skips NaNs (``max([nan, 1]) = 1``): the
    NaN lane is not the maximum, its derivative is a structural zero, and the
    guard makes it exactly zero where plain TF under XLA gives NaN."""

    def f(x):
        return tf.math.log(tf.reduce_max(tf.sqrt(x), axis=1))

    skipped = tf.constant([[False, False], [True, False], [True, False]]) | tf.math.is_nan(ROWS)
    want = xla_grads(lambda x: f(tf.where(skipped, 1e-4, x)), ROWS)[0]
    assert np.isnan(xla_grads(f, ROWS)[0]).any()
    got = xla_grads(hg.guard(f), ROWS)[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert got[0, 0] == 0.0 and np.isfinite(got).all()


def test_graph_mode_negation_of_a_comparison_is_true_on_nan():
    """Grappler rewrites ``LogicalNot(Less(x, y))`` to ``GreaterEqual(x, y)``,
    false on NaN; the masks' negation must survive it (the else-branch of a
    ``where(x < 1, ...)`` at a NaN ``x`` is the taken one)."""
    from hlo_guard.tf.mask_ops import not_

    @tf.function
    def negated(x):
        return not_(tf.less(x, 1.0))

    np.testing.assert_array_equal(negated(tf.constant([NAN, 0.0, 2.0])), [True, False, True])


def test_a_nan_the_where_drops_stays_dead():
    """The NaN-inclusive mask is ANDed with the output's: ``log(-1) = NaN``
    behind a ``where`` that drops it is still guarded to an exact zero."""

    def f(x):
        return tf.where(x > 0, tf.maximum(tf.math.log(x), -5.0), 0.0)

    x = tf.constant([-1.0, 0.0, 2.0, np.exp(-10.0)])
    assert np.isnan(xla_grads(f, x)[0]).any()
    got = xla_grads(hg.guard(f), x)[0]
    np.testing.assert_allclose(got, [0.0, 0.0, 0.5, 0.0], rtol=1e-6)
