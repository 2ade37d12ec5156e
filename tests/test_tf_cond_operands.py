"""TF: a value computed before ``tf.cond``/``tf.switch_case`` and read only by
branches the predicate may not take.

TF's gradient of the untaken branch is an instantiated zero for that operand,
which ``1 / n`` or ``sqrt`` before the ``cond`` turns into NaN, with and
without XLA.  The operand is dead whenever a branch that does not read it is
taken, and is guarded before the ``cond`` with the predicate (or index)
broadcast over its lanes (``rules.control_flow.ControlFlow.transfer``).
Oracle: the hand double where.  (Found 2026-11-28 on the JAX side by a
user-style hunt; TF had the same silent miss.)
"""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import xla_grads

import hlo_guard.tf as hg

WEIGHTS = tf.constant([1.0, 2.0, 3.0])


def project(x):
    n = tf.sqrt(tf.reduce_sum(x * x))
    factor = 1.0 / n
    return tf.reduce_sum(tf.cond(n <= 1.0, lambda: x, lambda: factor * x) * WEIGHTS)


def project_double_where(x):
    n2 = tf.reduce_sum(x * x)
    factor = 1.0 / tf.sqrt(tf.where(n2 <= 1.0, 1.0, n2))
    return tf.reduce_sum(tf.cond(n2 <= 1.0, lambda: x, lambda: factor * x) * WEIGHTS)


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
@pytest.mark.parametrize("x", [[0.0, 0.0, 0.0], [0.3, 0.0, -0.4], [3.0, 4.0, 0.0]])
def test_projection_gradient_equals_the_double_where(jit, x):
    x = tf.constant(x)
    got = xla_grads(hg.guard(project), x, jit=jit)[0]
    np.testing.assert_allclose(got, xla_grads(project_double_where, x, jit=jit)[0], rtol=1e-6)
    assert np.isfinite(got).all()


def test_the_origin_was_nan_and_the_report_names_the_cond():
    x = tf.zeros(3)
    assert np.isnan(xla_grads(project, x, jit=False)[0]).all()
    guarded = hg.guard(project)
    np.testing.assert_array_equal(guarded(x).numpy(), project(x).numpy())
    report = hg.report(guarded, x)
    assert not report.unguarded
    assert report.sites and all("cond" in str(s.origins) for s in report.sites)


def test_switch_case_operand_read_by_one_branch():
    def f(x):
        s = tf.sqrt(x)
        i = tf.cast(x > 0.0, tf.int32)
        return tf.switch_case(i, [lambda: -x, lambda: s])

    def moved(x):
        i = tf.cast(x > 0.0, tf.int32)
        return tf.switch_case(i, [lambda: -x, lambda: tf.sqrt(x)])

    for v in (0.0, 4.0):
        x = tf.constant(v)
        for jit in (False, True):
            got = xla_grads(hg.guard(f), x, jit=jit)[0]
            np.testing.assert_allclose(got, xla_grads(moved, x, jit=jit)[0], rtol=1e-6)


def test_taken_branch_keeps_its_genuine_singularity():
    """``x = 0`` with the branch reading ``1 / x`` taken: infinite, as in the
    computation moved into the branch; the other branch's gradient stays."""

    def f(x):
        r = 1.0 / x
        return tf.cond(x >= 0.0, lambda: r, lambda: x)

    def moved(x):
        return tf.cond(x >= 0.0, lambda: 1.0 / x, lambda: x)

    for jit in (False, True):
        got = xla_grads(hg.guard(f), tf.constant(0.0), jit=jit)[0]
        assert not np.isfinite(got) and not np.isfinite(xla_grads(moved, 0.0, jit=jit)[0])
        assert xla_grads(hg.guard(f), tf.constant(-2.0), jit=jit)[0] == 1.0
