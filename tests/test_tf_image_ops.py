"""TF image and sequence ops a Keras model is made of: max and average
pooling, resizing, the space/batch shuffles of a dilated convolution and the
transposed convolution.  Each is placed between a singular derivative and a
`where` that keeps some of its outputs; the plain program leaks NaN under XLA,
and the guarded one equals a hand-written double where whose live lanes are
worked out without TF's gradient (by hand, or from the forward op applied to
one-hot inputs)."""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import assert_guard_mends_leak, xla_grads

import hlo_guard.tf as hg


def check(fn, oracle, x):
    report = assert_guard_mends_leak(fn, oracle, tf.constant(x, tf.float32))
    assert not [s for s in report.unguarded], str(report)


def reaching(op, shape, keep) -> np.ndarray:
    """Input lanes whose one-hot input makes a kept output lane non-zero
    under the forward ``op`` (its weights all positive)."""
    live = np.zeros(shape, bool)
    for idx in np.ndindex(*shape):
        one = np.zeros(shape, np.float32)
        one[idx] = 1.0
        live[idx] = bool(np.any(np.asarray(op(tf.constant(one))) * keep != 0))
    return live


def test_max_pool_sends_the_cotangent_to_each_kept_windows_maximum_only():
    """Non-maximal lanes of a window and every lane of a dropped window are
    dead; a zero there meets ``sqrt'(0)``."""
    x = np.array(
        [[4.0, 0.0, 0.0, 1.0], [0.0, 1.0, 9.0, 0.0], [2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.5]],
        np.float32,
    ).reshape(1, 4, 4, 1)
    keep = np.array([[True, True], [True, False]]).reshape(1, 2, 2, 1)
    live = np.zeros_like(x, bool)
    for (i, j), (a, b) in {(0, 0): (0, 0), (0, 1): (1, 2), (1, 0): (2, 0)}.items():
        assert keep[0, i, j, 0]
        live[0, a, b, 0] = True  # the window's maximum, worked out by hand

    def fn(x):
        return tf.where(keep, tf.nn.max_pool2d(tf.sqrt(x), 2, 2, "VALID"), 0.0)

    def oracle(x):  # dead lanes get a value below every kept maximum
        return tf.where(
            keep, tf.nn.max_pool2d(tf.sqrt(tf.where(live, x, 1e-4)), 2, 2, "VALID"), 0.0
        )

    check(fn, oracle, x)


def test_average_pool_leaves_unread_and_dropped_windows_dead():
    """A 2x2, stride-2 VALID pool of a 5x5 image never reads its last row and
    column; a dropped window's lanes are dead too."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 2.0, size=(1, 5, 5, 1)).astype(np.float32)
    x[0, 4, :, 0] = 0.0  # never read
    x[0, :, 4, 0] = 0.0
    x[0, 2:4, 2:4, 0] = 0.0  # the dropped window
    keep = np.array([[True, True], [True, False]]).reshape(1, 2, 2, 1)
    live = np.zeros_like(x, bool)
    for i in range(2):
        for j in range(2):
            if keep[0, i, j, 0]:
                live[0, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2, 0] = True

    def fn(x):
        return tf.where(keep, tf.nn.avg_pool2d(tf.sqrt(x), 2, 2, "VALID"), 0.0)

    def oracle(x):
        return tf.where(keep, tf.nn.avg_pool2d(tf.sqrt(tf.where(live, x, 1.0)), 2, 2, "VALID"), 0.0)

    check(fn, oracle, x)


@pytest.mark.parametrize("method", ["bilinear", "nearest"])
def test_resize_sends_the_mask_to_the_pixels_it_reads(method):
    rng = np.random.default_rng(1)
    x = rng.uniform(0.5, 2.0, size=(1, 6, 6, 1)).astype(np.float32)
    keep = np.array([[True, False], [False, False]]).reshape(1, 2, 2, 1)

    def resize(z):
        return tf.image.resize(z, [2, 2], method=method)

    live = reaching(resize, x.shape, keep)
    assert live.any() and not live.all()
    x[~live] = 0.0

    def fn(x):
        return tf.where(keep, resize(tf.sqrt(x)), 0.0)

    def oracle(x):
        return tf.where(keep, resize(tf.sqrt(tf.where(live, x, 1.0))), 0.0)

    check(fn, oracle, x)


def test_dilated_convolution_through_space_to_batch():
    """``tf.nn.convolution`` with a dilation goes through ``SpaceToBatchND``
    and ``BatchToSpaceND``: an output step reads the inputs two apart."""
    rng = np.random.default_rng(2)
    x = rng.uniform(0.5, 2.0, size=(1, 12, 1)).astype(np.float32)
    w = tf.constant(np.ones((3, 1, 1)), tf.float32)

    def conv(z):
        return tf.nn.convolution(z, w, padding="VALID", dilations=[2])

    keep = np.zeros((1, 8, 1), bool)
    keep[0, [1, 2], 0] = True
    live = np.zeros_like(x, bool)
    for t in (1, 2):
        live[0, [t, t + 2, t + 4], 0] = True  # the dilated window, by hand
    x[~live] = 0.0

    graph = tf.function(conv).get_concrete_function(tf.constant(x)).graph
    assert {"SpaceToBatchND", "BatchToSpaceND"} <= {op.type for op in graph.get_operations()}

    def fn(x):
        return tf.where(keep, conv(tf.sqrt(x)), 0.0)

    def oracle(x):
        return tf.where(keep, conv(tf.sqrt(tf.where(live, x, 1.0))), 0.0)

    check(fn, oracle, x)


def test_transposed_convolution_guards_the_lanes_no_kept_output_reads():
    rng = np.random.default_rng(3)
    x = rng.uniform(0.5, 2.0, size=(1, 4, 4, 2)).astype(np.float32)
    w = tf.constant(rng.uniform(0.5, 1.0, size=(3, 3, 1, 2)), tf.float32)

    def up(z):
        return tf.nn.conv2d_transpose(z, w, [1, 8, 8, 1], strides=2, padding="SAME")

    keep = np.zeros((1, 8, 8, 1), bool)
    keep[0, :3, :3, 0] = True
    live = reaching(up, x.shape, keep)
    assert live.any() and not live.all()
    x[~live] = 0.0

    def fn(x):
        return tf.where(keep, up(tf.sqrt(x)), 0.0)

    def oracle(x):
        return tf.where(keep, up(tf.sqrt(tf.where(live, x, 1.0))), 0.0)

    check(fn, oracle, x)


def test_a_kept_window_maximum_at_zero_keeps_its_infinite_derivative():
    """Genuine: the maximum of a kept window is ``sqrt(0)``, a live lane, so
    its derivative stays inf, as in the plain program; the window's other
    (tied, unchosen) lanes and the dropped window beside it are mended."""
    x = np.zeros((1, 2, 4, 1), np.float32)
    x[0, :, 2:, 0] = [[0.0, 1.0], [0.5, 0.25]]  # the dropped window
    keep = np.array([[True, False]]).reshape(1, 1, 2, 1)

    def fn(x):
        return tf.where(keep, tf.nn.max_pool2d(tf.sqrt(x), 2, 2, "VALID"), 0.0)

    x = tf.constant(x)
    (plain,) = xla_grads(fn, x)
    (got,) = xla_grads(hg.guard(fn), x)
    kept_got, kept_plain = got[0, :, :2, 0], plain[0, :, :2, 0]
    chosen = np.isinf(kept_got)
    assert chosen.sum() == 1  # the kept window's chosen zero: genuine
    np.testing.assert_array_equal(kept_got[chosen], kept_plain[chosen])
    assert np.all(kept_got[~chosen] == 0.0)  # its other lanes: structural zeros
    assert np.isnan(kept_plain[~chosen]).all()  # which the plain program NaNs
    assert np.all(got[0, :, 2:, 0] == 0.0)  # the dropped window
