"""'The report is clean' must imply 'the gradient equals the oracle'.

A silent miss -- a dead lane reaching a singular operation unguarded while the
report lists nothing unguarded -- is the worst bug the TF front end can have.
This sweep runs TF constructs (loops, ``map_fn``, TensorArrays, segment
reductions, gathers, slices, Keras layers, ops without a rule) on inputs whose
dead lanes hit a singularity, and checks for each: either the report names an
unguarded site, or the guarded gradient equals the hand-written double-where
oracle (no NaN/inf from dead lanes).  A few constructs must moreover *be* clean
(guarded, not merely reported), so that the sweep cannot pass vacuously.
"""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import assert_same, xla_grads

import hlo_guard.tf as hg

X = tf.constant([-1.0, 0.0, 1.0, 4.0, 0.0, 9.0])
POS = tf.constant([1.0, 0.0, 1.0, 4.0, 0.0, 9.0])
IDS = tf.constant([0, -1, 1, 1, -1, 2])


def safe(x, keep):
    """``x`` where ``keep``, 1 elsewhere: the inner where of the double-where."""
    return tf.where(keep, x, tf.ones_like(x))


MAX_WINNERS = tf.constant([True, False, False, True, False, True])


def where_sqrt(x):
    return tf.where(x > 0, tf.sqrt(x), tf.zeros_like(x))


def where_sqrt_oracle(x):
    return tf.where(x > 0, tf.sqrt(safe(x, x > 0)), tf.zeros_like(x))


def loop_sum(body):
    def fn(x):
        s = tf.zeros_like(x)
        for _ in tf.range(3):
            s += body(x)
        return s

    return fn


def tensor_array(body):
    def fn(x):
        arr = tf.TensorArray(tf.float32, size=2)
        for i in tf.range(2):
            arr = arr.write(i, body(x) * tf.cast(i + 1, tf.float32))
        return arr.stack()

    return fn


def map_fn(body):
    return lambda x: tf.map_fn(body, x)


def dropped_by_ids(x):
    return tf.not_equal(IDS, -1)


def reduce_max_oracle(x):
    m = tf.reduce_max(tf.sqrt(x))
    return tf.reduce_max(tf.sqrt(safe(x, tf.equal(tf.sqrt(x), m))))


def keras_relu_sqrt(x):
    keras = pytest.importorskip("keras")
    return tf.sqrt(keras.layers.ReLU()(x))


# (name, fn, oracle, input, must be clean, XLA-compilable)
CASES = [
    ("where_sqrt", where_sqrt, where_sqrt_oracle, X, True, True),
    (
        "where_log",
        lambda x: tf.where(x > 0, tf.math.log(x), 0.0),
        lambda x: tf.where(x > 0, tf.math.log(safe(x, x > 0)), 0.0),
        X,
        True,
        True,
    ),
    ("for_range_loop", loop_sum(where_sqrt), loop_sum(where_sqrt_oracle), X, True, True),
    ("tensor_array_loop", tensor_array(where_sqrt), tensor_array(where_sqrt_oracle), X, True, True),
    ("map_fn", map_fn(where_sqrt), map_fn(where_sqrt_oracle), X, False, True),
    (
        "map_fn_rows",
        lambda x: tf.map_fn(lambda r: tf.reduce_sum(where_sqrt(r)), tf.reshape(x, [2, 3])),
        lambda x: tf.map_fn(lambda r: tf.reduce_sum(where_sqrt_oracle(r)), tf.reshape(x, [2, 3])),
        X,
        False,
        True,
    ),
    (
        "map_fn_of_singular",
        lambda x: tf.map_fn(lambda v: tf.where(v > 0, v, 0.0), tf.sqrt(x)),
        lambda x: tf.map_fn(lambda v: tf.where(v > 0, v, 0.0), tf.sqrt(safe(x, x > 0))),
        POS,
        False,
        True,
    ),
    (
        "cond_branch",
        lambda x: tf.cond(tf.reduce_sum(x) > 0, lambda: where_sqrt(x), lambda: x),
        lambda x: tf.cond(tf.reduce_sum(x) > 0, lambda: where_sqrt_oracle(x), lambda: x),
        X,
        True,
        True,
    ),
    (
        "unsorted_segment_sum_negative_ids",
        lambda x: tf.math.unsorted_segment_sum(tf.sqrt(x), IDS, 3),
        lambda x: tf.math.unsorted_segment_sum(tf.sqrt(safe(x, dropped_by_ids(x))), IDS, 3),
        POS,
        True,
        True,
    ),
    (
        "unsorted_segment_mean_negative_ids",
        lambda x: tf.math.unsorted_segment_mean(tf.sqrt(x), IDS, 3),
        lambda x: tf.math.unsorted_segment_mean(tf.sqrt(safe(x, dropped_by_ids(x))), IDS, 3),
        POS,
        True,
        True,
    ),
    (
        "unsorted_segment_prod_negative_ids",
        lambda x: tf.math.unsorted_segment_prod(tf.sqrt(x), IDS, 3),
        lambda x: tf.math.unsorted_segment_prod(tf.sqrt(safe(x, dropped_by_ids(x))), IDS, 3),
        POS,
        True,
        True,
    ),
    (
        "unsorted_segment_max_losers",
        lambda x: tf.math.unsorted_segment_max(tf.sqrt(x), tf.constant([0, 0, 1, 1, 1, 2]), 3),
        lambda x: tf.math.unsorted_segment_max(
            tf.where(MAX_WINNERS, tf.sqrt(safe(x, MAX_WINNERS)), -np.inf),
            tf.constant([0, 0, 1, 1, 1, 2]),
            3,
        ),
        POS,
        True,
        True,
    ),
    # not XLA-compilable, so run as graphs; log, because TF's graph kernels
    # special-case a zero cotangent for Sqrt (never for Log)
    (
        "sparse_segment_sum_unread",
        lambda x: tf.sparse.segment_sum(tf.math.log(x), [0, 2, 3], [0, 0, 1]),
        lambda x: tf.sparse.segment_sum(
            tf.math.log(safe(x, tf.constant([True, False, True, True, False, False]))),
            [0, 2, 3],
            [0, 0, 1],
        ),
        POS,
        True,
        False,
    ),
    (
        "gather",
        lambda x: tf.gather(tf.sqrt(x), [2, 3]),
        lambda x: tf.gather(
            tf.sqrt(safe(x, tf.constant([False, False, True, True, False, False]))), [2, 3]
        ),
        POS,
        True,
        True,
    ),
    (
        "strided_slice",
        lambda x: tf.sqrt(x)[2:4],
        lambda x: tf.sqrt(safe(x, tf.constant([False, False, True, True, False, False])))[2:4],
        POS,
        True,
        True,
    ),
    (
        "boolean_mask",
        lambda x: tf.boolean_mask(tf.math.log(x), x > 0),
        lambda x: tf.boolean_mask(tf.math.log(safe(x, x > 0)), x > 0),
        POS,
        True,
        False,
    ),
    (
        "top_k",
        lambda x: tf.math.top_k(tf.sqrt(x), 2).values,
        lambda x: (
            tf.math.top_k(
                tf.sqrt(safe(x, tf.constant([False, False, False, True, False, True]))), 2
            ).values
        ),
        POS,
        True,
        True,
    ),
    (
        "einsum_diagonal",
        lambda x: tf.einsum("ii->i", tf.sqrt(tf.reshape(x[:4], [2, 2]))),
        lambda x: tf.einsum(
            "ii->i", tf.sqrt(safe(tf.reshape(x[:4], [2, 2]), tf.eye(2, dtype=tf.bool)))
        ),
        POS,
        True,
        True,
    ),
    (
        "einsum_product_under_where",
        lambda x: tf.where(x > 0, tf.einsum("i,i->i", tf.sqrt(x), x), 0.0),
        lambda x: tf.where(x > 0, tf.einsum("i,i->i", tf.sqrt(safe(x, x > 0)), x), 0.0),
        X,
        True,
        True,
    ),
    ("reduce_max", lambda x: tf.reduce_max(tf.sqrt(x)), reduce_max_oracle, POS, True, True),
    (
        "keras_relu_then_sqrt",
        keras_relu_sqrt,
        lambda x: tf.where(x > 0, tf.sqrt(safe(x, x > 0)), 0.0),
        X,
        True,
        True,
    ),
    (
        "cond_unused_output",
        lambda x: tf.cond(tf.reduce_sum(x) > 0, lambda: (tf.sqrt(x), x * 2.0), lambda: (x, x))[1],
        lambda x: x * 2.0,
        X,
        True,
        True,
    ),
    (
        "while_unused_output",
        lambda x: tf.while_loop(
            lambda i, s, y: i < 2,
            lambda i, s, y: (i + 1, s + x, tf.sqrt(x)),
            (0, tf.zeros_like(x), tf.zeros_like(x)),
            maximum_iterations=2,
        )[1],
        lambda x: 2.0 * x,
        X,
        False,
        True,
    ),
    (
        "dynamic_partition_no_rule",
        lambda x: tf.dynamic_partition(tf.math.log(x), tf.constant([0, 0, 1, 1, 0, 1]), 2)[1],
        lambda x: tf.dynamic_partition(
            tf.math.log(safe(x, tf.constant([False, False, True, True, False, True]))),
            tf.constant([0, 0, 1, 1, 0, 1]),
            2,
        )[1],
        POS,
        False,
        False,
    ),
]


@pytest.mark.parametrize("name,fn,oracle,x,must_be_clean,xla", CASES, ids=[c[0] for c in CASES])
def test_report_clean_implies_oracle_gradient(name, fn, oracle, x, must_be_clean, xla):
    guarded = hg.guard(fn)
    got = xla_grads(guarded, x, jit=xla)[0]
    report = hg.report(guarded, x)
    if must_be_clean:
        assert not report.unguarded, report.to_text()
    if report.unguarded:
        return  # honest: the report names where dead lanes were not followed
    expected = xla_grads(oracle, x, jit=xla)[0]
    assert np.isfinite(expected).all(), "the oracle itself must be finite"
    assert_same(got, expected)


def test_map_fn_body_is_guarded_and_the_list_boundary_reported():
    """``map_fn`` guards inside its body (the gradient is the oracle's); the
    element read from the TensorList is where dead lanes stop being followed,
    and the report says so instead of calling the function clean."""
    guarded = hg.guard(map_fn(where_sqrt))
    got = xla_grads(guarded, X)[0]
    assert_same(got, xla_grads(map_fn(where_sqrt_oracle), X)[0])
    report = hg.report(guarded, X)
    assert any(s.op.startswith("Sqrt") and "while" in s.scope for s in report.guards)
    assert any(
        s.op.startswith("TensorListGetItem") and "TensorList" in s.reason for s in report.unguarded
    )


def test_op_without_rule_is_reported_even_with_live_outputs():
    """``MatrixBandPart`` has no rule and kills a triangle itself: the dead
    lanes do not *arrive* at it, they start there.  Fully live is then not
    conservative, so the op is reported and the report is not clean."""
    a = tf.constant([[1.0, 0.0], [4.0, 9.0]])
    guarded = hg.guard(lambda a: tf.linalg.band_part(tf.sqrt(a), -1, 0))
    report = hg.report(guarded, a)
    assert any(
        s.op.startswith("MatrixBandPart") and "no rule" in s.reason for s in report.unguarded
    )
    assert np.isnan(xla_grads(guarded, a)[0]).any()  # indeed not guarded


def test_cond_output_nobody_uses_is_cut_inside_the_branch():
    """TF's ``If`` gradient feeds zeros to an unused output; the branch's
    ``sqrt`` computed only for it must not turn that into NaN."""

    def fn(x):
        used, _unused = tf.cond(
            tf.reduce_sum(x) > 0, lambda: (x * 2.0, tf.math.log(x)), lambda: (x, x)
        )
        return used

    guarded = hg.guard(fn)
    assert np.isnan(xla_grads(fn, X)[0]).any()  # the leak being fixed
    np.testing.assert_array_equal(xla_grads(guarded, X)[0], np.full(6, 2.0))
    assert not hg.report(guarded, X).unguarded
