"""The TF seed table (tensorflow #118674 and friends) under XLA.

Each guarded gradient is compared with an independent oracle: the hand-written
double-where a careful user would write (run under the same XLA compilation),
or a per-lane Python ``if``.  Each case also asserts that the plain program
really gives a non-finite gradient under XLA, so the test shows the bug is
real, and that the forward values are bitwise those of the plain program.
"""

import math

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import assert_same, bitwise_equal, eager_grads, xla_forward, xla_grads

import hlo_guard.tf as hg

F32 = tf.float32


def c(values, dtype=F32):
    return tf.constant(values, dtype)


# -- the seed: where(x > 0, sqrt(x), 0) -----------------------------------------------


def where_sqrt(x):
    return tf.where(x > 0, tf.sqrt(x), 0.0)


def test_seed_where_sqrt_under_xla():
    x = c([-1.0, 0.0, 1.0, 4.0])
    (plain,) = xla_grads(where_sqrt, x)
    assert np.isnan(plain[:2]).all()  # the bug, under XLA
    (eager,) = eager_grads(where_sqrt, x)
    np.testing.assert_array_equal(eager, [0, 0, 0.5, 0.25])  # eager special-cases Sqrt
    (guarded,) = xla_grads(hg.guard(where_sqrt), x)
    np.testing.assert_array_equal(guarded, [0, 0, 0.5, 0.25])


def test_seed_guarded_function_is_a_jit_tf_function():
    f = hg.guarded_function(where_sqrt)
    x = c([-1.0, 0.0, 1.0, 4.0])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = f(x)
    np.testing.assert_array_equal(tape.gradient(y, x), [0, 0, 0.5, 0.25])
    assert bitwise_equal(y, xla_forward(where_sqrt, x))
    # jit_compile=True really compiles: the compiler IR is available
    assert "sqrt" in f.experimental_get_compiler_ir(x)(stage="hlo").lower()


# -- other patterns: (program, double-where oracle, input) ------------------------------


def div(x):
    return tf.where(x > 0, 1.0 / x, 1.0)


def div_oracle(x):
    safe = tf.where(x > 0, x, 1.0)
    return tf.where(x > 0, 1.0 / safe, 1.0)


def log(x):
    return tf.where(x > 0, tf.math.log(x), 0.0)


def log_oracle(x):
    return tf.where(x > 0, tf.math.log(tf.where(x > 0, x, 1.0)), 0.0)


def pow_(x):
    return tf.where(x > 0, tf.pow(x, 1.5), 0.0)


def pow_oracle(x):
    return tf.where(x > 0, tf.pow(tf.where(x > 0, x, 1.0), 1.5), 0.0)


def xlogx(x):  # pow with a tensor exponent: d/dy x**y = log(x) x**y
    return tf.where(x > 0, tf.pow(x, x), 1.0)


def xlogx_oracle(x):
    s = tf.where(x > 0, x, 1.0)
    return tf.where(x > 0, tf.pow(s, s), 1.0)


def acos_clipped(x):
    return tf.acos(tf.clip_by_value(x, -1.0, 1.0))


def acos_raw_clip(x):
    return tf.acos(tf.raw_ops.ClipByValue(t=x, clip_value_min=c(-1.0), clip_value_max=c(1.0)))


def acos_where(x):
    return tf.where(tf.abs(x) < 1.0, tf.acos(x), 0.0)


def acos_where_oracle(x):
    inside = tf.abs(x) < 1.0
    return tf.where(inside, tf.acos(tf.where(inside, x, 0.0)), 0.0)


def acos_lane_oracle(xs):
    """Per-lane ``if``: clipped lanes have derivative 0, others -1/sqrt(1 - x^2)."""
    out = []
    for v in xs:
        if not -1.0 <= v <= 1.0:
            out.append(0.0)
        elif abs(v) == 1.0:
            out.append(-math.inf)  # acos'(+-1): genuine, on the taken path
        else:
            out.append(-1.0 / math.sqrt(1.0 - v * v))
    return out


def atan2(x):
    r = x * x
    return tf.where(r > 0, tf.atan2(x, x * 2.0), 0.0)


def atan2_oracle(x):
    r = x * x
    s = tf.where(r > 0, x, 1.0)
    return tf.where(r > 0, tf.atan2(s, s * 2.0), 0.0)


def softplus(x):  # naive: exp overflows in the lanes the where drops
    return tf.where(x > 30.0, x, tf.math.log(1.0 + tf.exp(x)))


def softplus_oracle(x):
    s = tf.where(x > 30.0, 0.0, x)
    return tf.where(x > 30.0, x, tf.math.log(1.0 + tf.exp(s)))


def gather_sqrt(x):
    return tf.gather(tf.sqrt(x), [1, 2])


def slice_sqrt(x):
    return tf.sqrt(x)[1:]


def reduce_max_sqrt(x):
    return tf.reduce_max(tf.sqrt(x))


def max_log(x):
    return tf.maximum(tf.math.log(x), -5.0)


def min_neg_log(x):
    return tf.minimum(-tf.math.log(x), 5.0)


PATTERNS = {
    "div": (div, div_oracle, [-1.0, 0.0, 1.0, 2.0]),
    "log": (log, log_oracle, [-1.0, 0.0, 1.0, 2.0]),
    "pow": (pow_, pow_oracle, [-1.0, 0.0, 1.0, 4.0]),
    "pow_tensor_exponent": (xlogx, xlogx_oracle, [-1.0, 0.0, 1.0, 2.0]),
    "acos": (acos_where, acos_where_oracle, [-2.0, -1.0, 0.5, 1.0]),
    "atan2": (atan2, atan2_oracle, [0.0, 1.0, -2.0]),
    "softplus_overflow": (softplus, softplus_oracle, [-3.0, 0.0, 5.0, 100.0]),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_equals_double_where(name):
    fn, oracle, xs = PATTERNS[name]
    x = c(xs)
    (plain,) = xla_grads(fn, x)
    assert not np.isfinite(plain).all(), "the plain program should leak NaN/inf"
    (expected,) = xla_grads(oracle, x)
    assert np.isfinite(expected).all()
    (guarded,) = xla_grads(hg.guard(fn), x)
    assert_same(guarded, expected)
    assert bitwise_equal(xla_forward(hg.guard(fn), x), xla_forward(fn, x))


@pytest.mark.parametrize("fn", [acos_clipped, acos_raw_clip], ids=["min_max", "ClipByValue"])
def test_acos_of_clipped_value(fn):
    """TF's Maximum/Minimum/ClipByValue gradients *select* (unlike JAX's, which
    multiply), so here plain XLA is already right; the guards must keep it so,
    including the genuine -inf at the boundary x == 1."""
    xs = [-2.0, -0.5, 0.0, 0.5, 1.0, 2.0]
    (plain,) = xla_grads(fn, c(xs))
    assert_same(plain, acos_lane_oracle(xs), rtol=1e-5)
    (guarded,) = xla_grads(hg.guard(fn), c(xs))
    assert_same(guarded, acos_lane_oracle(xs), rtol=1e-5)
    assert np.isneginf(guarded[4])


@pytest.mark.parametrize("fn", [gather_sqrt, slice_sqrt], ids=["gather", "strided_slice"])
def test_dropped_lane(fn):
    x = c([0.0, 1.0, 4.0])
    (plain,) = xla_grads(fn, x)
    assert np.isnan(plain[0])
    (guarded,) = xla_grads(hg.guard(fn), x)
    np.testing.assert_array_equal(guarded, [0.0, 0.5, 0.25])


def test_maximum_of_log_keeps_forward_and_gradient():
    x = c([0.0, 1.0, math.e, 1e-30])
    (plain,) = xla_grads(max_log, x)
    assert np.isnan(plain[0])
    guarded_fn = hg.guard(max_log)
    y = xla_forward(guarded_fn, x).numpy()
    assert y[0] == -5.0 and y[3] == -5.0  # the losing side never changes the value
    assert bitwise_equal(y, xla_forward(max_log, x))
    (guarded,) = xla_grads(guarded_fn, x)
    np.testing.assert_allclose(guarded, [0.0, 1.0, 1.0 / math.e, 0.0], rtol=1e-6)


def test_maximum_tie_goes_to_x_like_tf():
    """On a tie TF gives the whole gradient to the first operand: the guard must
    not kill it (x = e^-5 makes log x == -5 exactly in the tie lane)."""
    tie = c([0.0, 2.0])
    fn = lambda x: tf.maximum(tf.math.log(x), tf.math.log(c([1.0, 2.0])))  # noqa: E731
    (guarded,) = xla_grads(hg.guard(fn), tie)
    np.testing.assert_allclose(guarded, [0.0, 0.5])  # lane 1 is a tie: x gets 1/x


def test_minimum_of_neg_log():
    x = c([0.0, 1.0, 2.0])
    (plain,) = xla_grads(min_neg_log, x)
    assert np.isnan(plain[0])
    (guarded,) = xla_grads(hg.guard(min_neg_log), x)
    np.testing.assert_allclose(guarded, [0.0, -1.0, -0.5])


def test_reduce_max_of_sqrt():
    x = c([0.0, 1.0, 4.0])
    (plain,) = xla_grads(reduce_max_sqrt, x)
    assert np.isnan(plain[0])
    (guarded,) = xla_grads(hg.guard(reduce_max_sqrt), x)
    np.testing.assert_array_equal(guarded, [0.0, 0.0, 0.25])


def test_mask_reading_downstream_value():
    """The mask of the guard before sqrt needs max(sqrt(x)): computed on the side."""

    def fn(x):
        a = tf.sqrt(x)
        return tf.where(tf.equal(a, tf.reduce_max(a)), a, 0.0)

    def oracle(x):
        a = tf.sqrt(x)
        keep = tf.equal(a, tf.reduce_max(a))
        return tf.where(keep, tf.sqrt(tf.where(keep, x, 1.0)), 0.0)

    x = c([0.0, 1.0, 4.0])
    assert np.isnan(xla_grads(fn, x)[0][0])
    assert_same(xla_grads(hg.guard(fn), x)[0], xla_grads(oracle, x)[0])
    assert bitwise_equal(xla_forward(hg.guard(fn), x), xla_forward(fn, x))


def test_broadcast_condition():
    """A [n, 1] condition selecting rows of an [n, m] operand."""

    def fn(x):
        rows = tf.reduce_sum(x, axis=1, keepdims=True) > 0
        return tf.where(rows, tf.sqrt(x), 0.0)

    def oracle(x):
        rows = tf.reduce_sum(x, axis=1, keepdims=True) > 0
        keep = tf.broadcast_to(rows, tf.shape(x))
        return tf.where(rows, tf.sqrt(tf.where(keep, x, 1.0)), 0.0)

    x = c([[-1.0, 0.0], [1.0, 4.0]])
    assert np.isnan(xla_grads(fn, x)[0]).any()
    assert_same(xla_grads(hg.guard(fn), x)[0], xla_grads(oracle, x)[0])


# -- genuine singularities stay visible ---------------------------------------------------


def test_sqrt_squared_at_zero_stays_nan():
    fn = lambda x: tf.sqrt(x) ** 2  # noqa: E731
    x = c([0.0, 4.0])
    (guarded,) = xla_grads(hg.guard(fn), x)
    assert np.isnan(guarded[0]) and guarded[1] == pytest.approx(1.0)


def test_taken_branch_at_zero_stays_inf():
    fn = lambda x: tf.where(x >= 0, tf.sqrt(x), 0.0)  # noqa: E731
    (guarded,) = xla_grads(hg.guard(fn), c([-1.0, 0.0, 4.0]))
    assert guarded[0] == 0.0 and np.isposinf(guarded[1]) and guarded[2] == 0.25


def test_selected_nan_input_stays_nan():
    """A NaN in a *taken* lane is the program's own: it must come through."""
    fn = lambda x: tf.where(x > -10.0, tf.sqrt(x), 0.0)  # noqa: E731
    (guarded,) = xla_grads(hg.guard(fn), c([-1.0, 4.0]))
    assert np.isnan(guarded[0]) and guarded[1] == 0.25


# -- forward values ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PATTERNS) + ["gather", "max_log", "reduce_max"])
def test_forward_values_bitwise(name):
    fns = {
        "gather": (gather_sqrt, [0.0, 1.0, 4.0]),
        "max_log": (max_log, [0.0, 0.5, 3.0]),
        "reduce_max": (reduce_max_sqrt, [0.0, 2.0, 3.0]),
    }
    fn, xs = fns[name] if name in fns else (PATTERNS[name][0], PATTERNS[name][2])
    x = c(xs)
    assert bitwise_equal(xla_forward(hg.guard(fn), x), xla_forward(fn, x))
    # Without XLA the guarded function runs as a graph, and Grappler rewrites
    # graphs by pattern (log(1 + exp(x)) may become log1p: eager differs by
    # ulps): the oracle is the user's function run the same way.
    assert bitwise_equal(hg.guard(fn)(x), tf.function(fn)(x))
