"""Per-rule checks of the TF table: each op, placed between a dead-lane source
and a singular derivative, against a hand-written double-where (or per-lane)
oracle under XLA, with the plain program shown to leak first."""
import numpy as np
import pytest
import tensorflow as tf

import hlo_guard.tf as hg
from test_tf_support import assert_same, bitwise_equal, xla_forward, xla_grads


def check(fn, oracle, *xs):
    xs = [tf.constant(x, tf.float32) for x in xs]
    plain = xla_grads(fn, *xs)
    assert not all(np.isfinite(p).all() for p in plain), "plain program should leak"
    expected = xla_grads(oracle, *xs)
    assert all(np.isfinite(e).all() for e in expected)
    got = xla_grads(hg.guard(fn), *xs)
    for g, e in zip(got, expected):
        assert_same(g, e)
    assert bitwise_equal(xla_forward(hg.guard(fn), *xs), xla_forward(fn, *xs))


def safe(x, keep, fill=1.0):
    return tf.where(keep, x, fill)


def test_relu_of_log():
    fn = lambda x: tf.nn.relu(tf.math.log(x))  # noqa: E731
    oracle = lambda x: tf.nn.relu(tf.math.log(safe(x, x > 1.0, 2.0)))  # noqa: E731
    check(fn, oracle, [0.0, 0.5, 2.0])


def test_select_v1_rank1_condition_picks_rows():
    def fn(x):
        rows = tf.constant([True, False])
        return tf.raw_ops.Select(condition=rows, x=tf.sqrt(x), y=tf.zeros_like(x))

    def oracle(x):
        keep = tf.constant([[True, True], [False, False]])
        return tf.where(keep, tf.sqrt(safe(x, keep)), 0.0)

    check(fn, oracle, [[1.0, 4.0], [0.0, 0.0]])


def test_reduce_min_of_neg_sqrt():
    fn = lambda x: tf.reduce_min(-tf.sqrt(x), axis=1)  # noqa: E731

    def oracle(x):
        keep = tf.equal(x, tf.reduce_max(x, axis=1, keepdims=True))
        return tf.reduce_min(-tf.sqrt(safe(x, keep)) * tf.cast(keep, x.dtype), axis=1)

    check(fn, oracle, [[0.0, 4.0], [9.0, 0.0]])


def test_concat_then_slice():
    def fn(x, y):
        z = tf.concat([tf.sqrt(x), tf.math.log(y)], axis=0)
        return z[1:3]

    def oracle(x, y):
        keep_x = tf.constant([False, True])
        keep_y = tf.constant([True, False])
        z = tf.concat([tf.sqrt(safe(x, keep_x)), tf.math.log(safe(y, keep_y))], axis=0)
        return z[1:3]

    check(fn, oracle, [0.0, 4.0], [2.0, 0.0])


def test_stack_and_gather_nd():
    def fn(x):
        s = tf.stack([tf.sqrt(x), tf.sqrt(x) * 2.0])
        return tf.gather_nd(s, [[0, 1], [1, 2]])

    def oracle(x):
        k0 = tf.constant([False, True, False])
        k1 = tf.constant([False, False, True])
        s = tf.stack([tf.sqrt(safe(x, k0)), tf.sqrt(safe(x, k1)) * 2.0])
        return tf.gather_nd(s, [[0, 1], [1, 2]])

    check(fn, oracle, [0.0, 4.0, 9.0])


def test_reshape_transpose_tile_broadcast():
    def fn(x):
        a = tf.transpose(tf.reshape(tf.sqrt(x), [2, 2]))
        b = tf.tile(a[:, :1], [1, 3]) + tf.broadcast_to(a[:1, :1], [2, 3])
        return b

    def oracle(x):
        keep = tf.constant([True, True, False, False])  # a[:, 0] reads x[0], x[1]
        a = tf.transpose(tf.reshape(tf.sqrt(safe(x, keep)), [2, 2]))
        return tf.tile(a[:, :1], [1, 3]) + tf.broadcast_to(a[:1, :1], [2, 3])

    check(fn, oracle, [1.0, 4.0, 0.0, 0.0])


def test_prod_reduction_is_guarded():
    def fn(x):
        return tf.where(x[:, 0] > 0, tf.reduce_prod(tf.sqrt(x), axis=1), 0.0)

    def oracle(x):
        keep = tf.broadcast_to(x[:, :1] > 0, tf.shape(x))
        return tf.where(x[:, 0] > 0, tf.reduce_prod(tf.sqrt(safe(x, keep)), axis=1), 0.0)

    check(fn, oracle, [[0.0, 1.0], [4.0, 9.0]])


def test_matmul_operand_guard():
    """Rows of log(x) @ w that a where drops: the gradient w.r.t. x is exact.
    (The gradient w.r.t. w contracts the dead row's -inf with a zero
    cotangent inside the matmul itself: see the README's limits.)"""
    w = tf.constant([[1.0, 2.0], [3.0, 4.0]])

    def fn(x):
        out = tf.matmul(tf.math.log(x), w)
        return tf.where(tf.constant([[True], [False]]), out, 0.0)

    def oracle(x):
        keep = tf.constant([[True, True], [False, False]])
        out = tf.matmul(tf.math.log(safe(x, keep)), w)
        return tf.where(tf.constant([[True], [False]]), out, 0.0)

    check(fn, oracle, [[1.0, 2.0], [0.0, 1.0]])


@pytest.mark.parametrize("op", ["Floor", "Sign", "StopGradient"])
def test_zero_derivative_ops_cut_liveness(op):
    """A value used only through a zero-derivative op gets no guard at all."""
    raw = getattr(tf.raw_ops, op)
    key = "input" if op == "StopGradient" else "x"
    g = hg.guard(lambda x: tf.where(raw(**{key: x}) > 0, tf.sqrt(x), 0.0))
    rep = hg.report(g, tf.constant([0.0, 1.0]))
    assert [s.op.split()[0] for s in rep.guards] == ["Sqrt"]
