"""Forward mode (``tf.autodiff.ForwardAccumulator``) through selections.

Forward mode leaks downstream of a selection: ``sqrt(maximum(x, 0))`` at
``x = -1`` has a structurally zero tangent (the constant won) that ``sqrt'(0)``
turns into NaN.  The guard selects the singular op's output tangent, as the
JAX front end does.  Oracles are hand-written double-where programs under the
same XLA compilation; ties follow TF's derivative (``maximum``/``minimum``:
``x`` wins; ``clip_by_value``: ``t`` wins at the bounds), so a genuine
``sqrt'(0) = inf`` on a taken lane stays inf.
"""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import assert_same, bitwise_equal

import hlo_guard.tf as hg

X = tf.constant([-1.0, 0.0, 1.0, 4.0])


def jvp(fn, x, jit=True):
    """(value, tangent of fn at x along ones), inside tf.function(jit_compile=jit)."""

    @tf.function(jit_compile=jit)
    def run(x):
        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as acc:
            y = fn(x)
        return y, acc.jvp(y, unconnected_gradients=tf.UnconnectedGradients.ZERO)

    y, t = run(x)
    return y.numpy(), t.numpy()


def safe(x, keep, fill=1.0):
    return tf.where(keep, x, tf.fill(tf.shape(x), fill))


CASES = [
    (
        "maximum",
        lambda x: tf.sqrt(tf.maximum(x, 0.0)),
        lambda x: tf.where(x >= 0, tf.sqrt(safe(x, x >= 0)), 0.0),
        X,
    ),
    (
        "minimum",
        lambda x: tf.sqrt(1.0 - tf.minimum(x, 1.0)),
        lambda x: tf.where(x <= 1, tf.sqrt(1.0 - safe(x, x <= 1, 0.0)), 0.0),
        tf.constant([1.0, 2.0, 0.0, -3.0]),
    ),
    (
        "clip_by_value",
        lambda x: tf.sqrt(tf.clip_by_value(x, 0.0, 2.0)),
        lambda x: tf.where(
            x < 0, 0.0, tf.where(x > 2, tf.sqrt(2.0), tf.sqrt(safe(x, (x >= 0) & (x <= 2))))
        ),
        X,
    ),
    (
        "where_constant_branch",
        lambda x: tf.sqrt(tf.where(x > 0, x, 0.0)),
        lambda x: tf.where(x > 0, tf.sqrt(safe(x, x > 0)), 0.0),
        X,
    ),
    (
        "acos_of_maximum",
        lambda x: tf.acos(tf.maximum(x, 1.0)),
        lambda x: tf.where(x >= 1, tf.acos(safe(x, x >= 1, 0.0)), 0.0),
        X,
    ),
    (
        "log_of_relu",
        lambda x: tf.math.log(tf.nn.relu(x)),
        lambda x: tf.where(x > 0, tf.math.log(safe(x, x > 0)), -np.inf),
        X,
    ),
]


@pytest.mark.parametrize("jit", [True, False], ids=["xla", "graph"])
@pytest.mark.parametrize("name,fn,oracle,x", CASES, ids=[c[0] for c in CASES])
def test_forward_accumulator_gives_the_double_where_tangent(name, fn, oracle, x, jit):
    y, t = jvp(hg.guard(fn), x, jit)
    y_plain, t_plain = jvp(fn, x, jit)
    _, t_expected = jvp(oracle, x, jit)
    assert bitwise_equal(y, y_plain)  # guards never change a value
    assert_same(t, t_expected)
    assert np.isnan(t_plain).any() or not np.isnan(t_expected).any()


def where_sqrt_oracle(x):
    return tf.where(x > 0, tf.sqrt(safe(x, x > 0)), 0.0)


def row_sums_oracle(x):
    s = tf.reduce_sum(tf.reshape(tf.where(x > 0, x, 0.0), [2, 2]), axis=1)
    live = tf.reduce_any(tf.reshape(x > 0, [2, 2]), axis=1)
    return tf.where(live, tf.sqrt(safe(s, live)), 0.0)


SEGMENT_LIVE = tf.constant([True, False, True])

# lanes moved, created (padding, empty segments) or combined before the singular op
STRUCTURAL_CASES = [
    ("pad", lambda x: tf.sqrt(tf.pad(x * x, [[1, 1]])), lambda x: tf.pad(tf.sqrt(x * x), [[1, 1]])),
    (
        "concat_with_constant",
        lambda x: tf.sqrt(tf.concat([x * x, tf.zeros([2])], 0)),
        lambda x: tf.concat([tf.sqrt(x * x), tf.zeros([2])], 0),
    ),
    (
        "gather_of_where",
        lambda x: tf.sqrt(tf.gather(tf.where(x > 0, x, 0.0), [0, 2, 3])),
        lambda x: tf.gather(where_sqrt_oracle(x), [0, 2, 3]),
    ),
    (
        "transpose_of_where",
        lambda x: tf.sqrt(tf.transpose(tf.reshape(tf.where(x > 0, x, 0.0), [2, 2]))),
        lambda x: tf.transpose(tf.reshape(where_sqrt_oracle(x), [2, 2])),
    ),
    (
        "matmul_of_where",
        lambda x: tf.sqrt(tf.matmul(tf.reshape(tf.where(x > 0, x, 0.0), [2, 2]), tf.eye(2))),
        lambda x: tf.reshape(where_sqrt_oracle(x), [2, 2]),
    ),
    (
        "row_sums_of_where",
        lambda x: tf.sqrt(tf.reduce_sum(tf.reshape(tf.where(x > 0, x, 0.0), [2, 2]), axis=1)),
        row_sums_oracle,
    ),
    (
        "empty_segment",
        lambda x: tf.sqrt(tf.math.unsorted_segment_sum(x * x + 1.0, [0, 0, 2, 2], 3)),
        lambda x: tf.where(
            SEGMENT_LIVE,
            tf.sqrt(safe(tf.math.unsorted_segment_sum(x * x + 1.0, [0, 0, 2, 2], 3), SEGMENT_LIVE)),
            0.0,
        ),
    ),
    (
        "cond_branch",
        lambda x: tf.cond(
            tf.reduce_sum(x) > 0, lambda: tf.sqrt(tf.where(x > 0, x, 0.0)), lambda: x
        ),
        lambda x: tf.cond(tf.reduce_sum(x) > 0, lambda: where_sqrt_oracle(x), lambda: x),
    ),
]


@pytest.mark.parametrize("name,fn,oracle", STRUCTURAL_CASES, ids=[c[0] for c in STRUCTURAL_CASES])
def test_forward_accumulator_through_structural_ops(name, fn, oracle):
    y, t = jvp(hg.guard(fn), X)
    y_plain, t_plain = jvp(fn, X)
    _, t_expected = jvp(oracle, X)
    assert bitwise_equal(y, y_plain)
    assert_same(t, t_expected)


def test_forward_mode_guard_keeps_genuine_singularities():
    """The taken lane of ``sqrt(maximum(x, 0))`` at ``x = 0`` (x wins the tie)
    is a real ``sqrt'(0)``: still inf."""
    _, t = jvp(hg.guard(lambda x: tf.sqrt(tf.maximum(x, 0.0))), tf.constant([0.0, -1.0]))
    assert np.isposinf(t[0]) and t[1] == 0.0


def test_forward_mode_variable_primal():
    """A variable as the accumulator's primal: what is read from it has a live
    tangent, so its dead lanes are guarded too.  (The accumulator runs eagerly
    around the compiled guarded function: inside a tf.function TF 2.21 loses a
    variable primal read by a nested function, guarded or not.)"""
    v = tf.Variable([-1.0, 0.0, 4.0])
    f = hg.guarded_function(lambda x: tf.sqrt(tf.maximum(v, 0.0)) * x)
    with tf.autodiff.ForwardAccumulator(v, tf.ones_like(v)) as acc:
        y = f(tf.ones([3]))
    np.testing.assert_array_equal(acc.jvp(y).numpy(), [0.0, np.inf, 0.25])


def test_forward_mode_through_keras_relu():
    keras = pytest.importorskip("keras")
    layer = keras.layers.ReLU()
    _, t = jvp(hg.guard(lambda x: tf.sqrt(layer(x))), tf.constant([-2.0, 1.0, 4.0]))
    np.testing.assert_array_equal(t, [0.0, 0.5, 0.25])


def test_reverse_mode_unchanged_by_output_guards():
    """The same functions' reverse-mode gradients still equal the oracle's."""
    from test_tf_support import xla_grads

    for _, fn, oracle, x in CASES:
        assert_same(xla_grads(hg.guard(fn), x)[0], xla_grads(oracle, x)[0])


def test_report_lists_output_guards():
    guarded = hg.guard(lambda x: tf.sqrt(tf.maximum(x, 0.0)))
    report = hg.report(guarded, X)
    out = [s for s in report.guards if s.operand is None]
    assert out and out[0].op.startswith("Sqrt") and "forward mode" in out[0].reason
    assert not report.unguarded
