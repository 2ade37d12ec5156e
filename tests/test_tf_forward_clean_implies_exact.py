"""Forward mode: 'the report is clean' must imply 'the tangent equals the oracle'.

The forward-mode twin of ``test_tf_clean_implies_exact.py``: under
``tf.autodiff.ForwardAccumulator`` inside ``tf.function(jit_compile=True)``,
a structurally zero tangent lane that meets an infinite derivative
(``sqrt'(0)``) gives NaN unless an output guard selects it.  Across control
flow (``tf.cond``, ``tf.switch_case``, ``tf.while_loop``) and through ops that
mix lanes (``Softmax``) or have no rule, the front end either guards (a branch
that returns a constant) or reports the site.  For every case: either the
report names an unguarded site, or the guarded tangent equals the
hand-written oracle (the taken branch only, the double where).  Some cases
must be clean, so the sweep cannot pass vacuously; the reported ones are
checked to be real leaks, so the reports are not noise.
"""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import assert_same

import hlo_guard.tf as hg

X = tf.constant([-1.0, 0.0, 1.0, 4.0])  # sum > 0
POS = tf.constant([1.0, 0.0, 1.0, 4.0])


def jvp(fn, x):
    """Tangent of fn at x along ones, ForwardAccumulator under XLA."""

    @tf.function(jit_compile=True)
    def run(x):
        with tf.autodiff.ForwardAccumulator(x, tf.ones_like(x)) as acc:
            y = fn(x)
        return acc.jvp(y, unconnected_gradients=tf.UnconnectedGradients.ZERO)

    return run(x).numpy()


def safe(x, keep, fill=1.0):
    return tf.where(keep, x, tf.fill(tf.shape(x), fill))


def positive(x):
    return tf.reduce_sum(x) > 0


def where_sqrt_oracle(x):
    return tf.where(x > 0, tf.sqrt(safe(x, x > 0)), 0.0)


def relu_sqrt_oracle(x):
    """sqrt(maximum(x, 0)) with TF's tie convention (x wins at 0)."""
    return tf.where(x >= 0, tf.sqrt(safe(x, x >= 0)), 0.0)


def loop(body, init):
    return lambda x: tf.while_loop(
        lambda i, s: i < 2, lambda i, s: (i + 1, body(x, s)), (0, init(x)), maximum_iterations=2
    )[1]


def branch_index(x, scale=1):
    return tf.cast(positive(x), tf.int32) * scale


def softmax_masked_oracle(x):
    s = tf.nn.softmax(tf.where(x > 0, x, -np.inf))
    return tf.where(x > 0, tf.sqrt(safe(s, x > 0)), 0.0)


LOWER = tf.constant([[True, False], [True, True]])


def two_outputs(x):
    a, b = tf.cond(
        positive(x), lambda: (tf.zeros_like(x), x * x + 1.0), lambda: (x, tf.zeros_like(x))
    )
    return tf.sqrt(a) + tf.sqrt(b)


# (name, fn, oracle, input, must be clean)
CASES = [
    ("where_then_sqrt", lambda x: tf.sqrt(tf.where(x > 0, x, 0.0)), where_sqrt_oracle, X, True),
    (
        "cond_constant_branch_taken",
        lambda x: tf.sqrt(tf.cond(positive(x), lambda: tf.zeros_like(x), lambda: x)),
        lambda x: tf.cond(positive(x), lambda: tf.zeros_like(x), lambda: tf.sqrt(x)),
        X,
        True,
    ),
    (
        "cond_constant_else_branch_taken",
        lambda x: tf.sqrt(tf.cond(tf.reduce_sum(x) < 0, lambda: x, lambda: tf.zeros_like(x))),
        lambda x: tf.cond(tf.reduce_sum(x) < 0, lambda: tf.sqrt(x), lambda: tf.zeros_like(x)),
        X,
        True,
    ),
    # the live branch runs: sqrt'(0) at x = 0 is a genuine inf and stays
    (
        "cond_live_branch_taken_keeps_genuine_inf",
        lambda x: tf.sqrt(tf.cond(positive(x), lambda: x, lambda: tf.zeros_like(x))),
        lambda x: tf.cond(positive(x), lambda: tf.sqrt(x), lambda: tf.zeros_like(x)),
        POS,
        True,
    ),
    (
        "cond_two_outputs",
        two_outputs,
        lambda x: tf.cond(positive(x), lambda: tf.sqrt(x * x + 1.0), lambda: tf.sqrt(x)),
        X,
        True,
    ),
    (
        "switch_case_constant_branch",
        lambda x: tf.sqrt(
            tf.switch_case(branch_index(x), [lambda: x, lambda: tf.zeros_like(x), lambda: 2.0 * x])
        ),
        lambda x: tf.cond(positive(x), lambda: tf.zeros_like(x), lambda: tf.sqrt(x)),
        X,
        True,
    ),
    # an index out of range runs the last branch
    (
        "switch_case_out_of_range_index",
        lambda x: tf.sqrt(
            tf.switch_case(
                branch_index(x, 5), [lambda: x, lambda: 2.0 * x, lambda: tf.zeros_like(x)]
            )
        ),
        lambda x: tf.cond(positive(x), lambda: tf.zeros_like(x), lambda: tf.sqrt(x)),
        X,
        True,
    ),
    (
        "cond_guarded_inside_branch",
        lambda x: tf.cond(positive(x), lambda: tf.sqrt(tf.where(x > 0, x, 0.0)), lambda: x),
        lambda x: tf.cond(positive(x), lambda: where_sqrt_oracle(x), lambda: x),
        X,
        True,
    ),
    (
        "while_live_carry",
        lambda x: tf.sqrt(loop(lambda x, s: s + tf.sqrt(x * x + 1.0), lambda x: x)(x) + 3.0),
        lambda x: tf.sqrt(x + 2.0 * tf.sqrt(x * x + 1.0) + 3.0),
        X,
        True,
    ),
    # an accumulator from a constant: live once the loop ran (the counter moved) ...
    (
        "while_accumulator_from_zero",
        lambda x: tf.sqrt(loop(lambda x, s: s + x * x + 1.0, tf.zeros_like)(x)),
        lambda x: tf.sqrt(2.0 * (x * x + 1.0)),
        X,
        True,
    ),
    # ... and structurally zero if it ran zero times (sum > 0: no iteration)
    (
        "while_accumulator_zero_iterations",
        lambda x: tf.sqrt(
            tf.while_loop(
                lambda i, s: i < tf.cast(tf.reduce_sum(x) < 0, tf.int32),
                lambda i, s: (i + 1, s + x),
                (0, tf.zeros_like(x)),
            )[1]
        ),
        tf.zeros_like,
        X,
        True,
    ),
    (
        "softmax_of_live_logits",
        lambda x: tf.sqrt(tf.nn.softmax(x)),
        lambda x: tf.sqrt(tf.nn.softmax(x)),
        X,
        True,
    ),
    # -- not followed lane by lane: reported (each is a real leak, see below)
    (
        "cond_partly_zero_branch",
        lambda x: tf.sqrt(tf.cond(positive(x), lambda: tf.where(x > 0, x, 0.0), lambda: x)),
        lambda x: tf.cond(positive(x), lambda: where_sqrt_oracle(x), lambda: tf.sqrt(x)),
        X,
        False,
    ),
    (
        "partly_zero_tangent_into_branch",
        lambda x: (lambda m: tf.cond(positive(x), lambda: tf.sqrt(m), lambda: m))(
            tf.maximum(x, 0.0)
        ),
        lambda x: tf.cond(positive(x), lambda: relu_sqrt_oracle(x), lambda: tf.maximum(x, 0.0)),
        X,
        False,
    ),
    (
        "switch_case_partly_zero_branch",
        lambda x: tf.sqrt(tf.switch_case(branch_index(x), [lambda: x, lambda: tf.maximum(x, 0.0)])),
        lambda x: tf.cond(positive(x), lambda: relu_sqrt_oracle(x), lambda: tf.sqrt(x)),
        X,
        False,
    ),
    (
        "while_maximum_carry",
        lambda x: tf.sqrt(loop(lambda x, s: tf.maximum(s, 0.0), lambda x: x)(x)),
        relu_sqrt_oracle,
        X,
        False,
    ),
    (
        "softmax_of_masked_logits",
        lambda x: tf.sqrt(tf.nn.softmax(tf.where(x > 0, x, -np.inf))),
        softmax_masked_oracle,
        X,
        False,
    ),
    (
        "band_part_no_rule",
        lambda x: tf.sqrt(tf.linalg.band_part(tf.reshape(x, [2, 2]), -1, 0)),
        lambda x: tf.where(LOWER, tf.sqrt(safe(tf.reshape(x, [2, 2]), LOWER)), 0.0),
        POS,
        False,
    ),
]


@pytest.mark.parametrize("name,fn,oracle,x,must_be_clean", CASES, ids=[c[0] for c in CASES])
def test_forward_report_clean_implies_oracle_tangent(name, fn, oracle, x, must_be_clean):
    guarded = hg.guard(fn)
    got = jvp(guarded, x)
    report = hg.report(guarded, x)
    if must_be_clean:
        assert not report.unguarded, report.to_text()
    if report.unguarded:
        return  # honest: the report names where tangents were not followed
    assert_same(got, jvp(oracle, x))


# ``tf.switch_case`` under a ForwardAccumulator inside tf.function fails in TF
# 2.21 itself (its Case jvp cannot trace the branch list), so the plain
# program cannot be run there; the guarded one imports the graph and can
LEAKS = [c for c in CASES if not c[4] and not c[0].startswith("switch_case")]


@pytest.mark.parametrize("name,fn,oracle,x,must_be_clean", LEAKS, ids=[c[0] for c in LEAKS])
def test_reported_forward_cases_are_real_leaks(name, fn, oracle, x, must_be_clean):
    """Each reported case does leak (NaN where the oracle has none), and the
    report names a forward-mode site for it."""
    plain, expected = jvp(fn, x), jvp(oracle, x)
    assert not np.isnan(expected).any()
    assert np.isnan(plain).any()
    report = hg.report(hg.guard(fn), x)
    assert any("forward mode" in s.reason for s in report.unguarded), report.to_text()


def test_forward_gap_report_names_the_op_that_lost_track():
    cases = {
        "cond_partly_zero_branch": "If",
        "partly_zero_tangent_into_branch": "boundary",
        "while_maximum_carry": "While",
        "softmax_of_masked_logits": "Softmax",
        "band_part_no_rule": "MatrixBandPart",
    }
    for name, fn, _, x, _ in CASES:
        if name in cases:
            report = hg.report(hg.guard(fn), x)
            sites = [s for s in report.unguarded if "forward mode" in s.reason]
            assert any(s.op.startswith("Sqrt") and cases[name] in s.reason for s in sites), (
                name,
                report.to_text(),
            )


def test_constant_branch_guard_is_listed_as_an_output_guard():
    guarded = hg.guard(lambda x: tf.sqrt(tf.cond(positive(x), lambda: tf.zeros_like(x), lambda: x)))
    report = hg.report(guarded, X)
    out = [s for s in report.guards if s.operand is None]
    assert out and out[0].op.startswith("Sqrt") and "forward mode" in out[0].reason
    assert not report.unguarded


def test_constant_branch_not_taken_keeps_the_live_tangent():
    """The predicate decides at run time: the same guarded function gives the
    live branch's tangent when that branch runs (sum < 0 here)."""
    fn = lambda x: tf.sqrt(tf.cond(positive(x), lambda: tf.zeros_like(x), lambda: -x))
    x = tf.constant([-4.0, -1.0, 0.0])
    got = jvp(hg.guard(fn), x)
    np.testing.assert_array_equal(got[:2], [-0.25, -0.5])
    assert np.isinf(got[2])  # sqrt'(0) on the taken branch: genuine
