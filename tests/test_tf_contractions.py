"""TF contractions with a partly dead operand (hlo_guard/tf/contractions.py).

A select guard fixes a cotangent, not the value a contraction's gradient
multiplies by: ``dW = h^T dz`` reads the padded row of ``h = 1 / d`` (inf)
against its exact-zero cotangent.  Oracles: the hand double where under the
same compilation, and the plain program where it is finite.
"""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import assert_same, bitwise_equal, xla_grads
from test_tf_support import jvp_of_ones as jvp
from test_tf_support import xla_second_derivative as second_derivative

import hlo_guard.tf as hg

D = tf.constant([0.0, 1.0, 2.0])
W = tf.constant(np.arange(6.0).reshape(3, 2) / 4.0 + 0.25, tf.float32)


def padded_rows(w, d):
    h = (1.0 / d)[:, None] * tf.ones([1, 3])
    return tf.where((d > 0)[:, None], tf.matmul(h, w), 0.0) ** 2


def padded_rows_oracle(w, d):
    h = (1.0 / tf.where(d > 0, d, 1.0))[:, None] * tf.ones([1, 3])
    return tf.where((d > 0)[:, None], tf.matmul(h, w), 0.0) ** 2


@pytest.mark.parametrize("jit", [True, False])
def test_a_padded_rows_inf_does_not_poison_the_other_operands_gradient(jit):
    """Found 2026-11-25 (the JAX twin the same day): every guard in place, a
    clean report, and ``d/dW`` NaN in every lane."""
    plain = xla_grads(padded_rows, W, D, jit=jit)
    assert np.isnan(plain[0]).all()
    g = hg.guard(padded_rows)
    got = xla_grads(g, W, D, jit=jit)
    want = xla_grads(padded_rows_oracle, W, D, jit=jit)
    for a, b in zip(got, want):
        assert_same(a, b)
        assert np.isfinite(a).all()


def test_second_derivative_and_forward_mode_through_the_guarded_contraction():
    def in_w(w):
        return hg.guard(padded_rows)(w, D)

    def in_w_oracle(w):
        return padded_rows_oracle(w, D)

    assert np.isnan(second_derivative(lambda w: padded_rows(w, D), W)).all()
    assert_same(second_derivative(in_w, W), second_derivative(in_w_oracle, W))
    assert_same(jvp(in_w, W), jvp(in_w_oracle, W))


def test_the_forward_program_is_bitwise_the_plain_one():
    g = hg.guard(padded_rows)
    run = tf.function(jit_compile=True)
    assert bitwise_equal(run(g)(W, D).numpy(), run(padded_rows)(W, D).numpy())


def test_a_dead_columns_inf_does_not_poison_the_other_operands_gradient():
    """The mirror: an inf in a column of ``w`` no live output reads reaches
    ``dx = dz w^T``."""
    x = tf.constant([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    keep = tf.constant([True, False])

    def f(x, w):
        w = tf.concat([w[:, :1], tf.math.log(w[:, 1:] * 0.0)], axis=1)
        return tf.where(keep, tf.tanh(tf.matmul(x, w)), 0.0)

    def oracle(x, w):
        w = tf.concat([w[:, :1], tf.math.log(w[:, 1:] * 0.0)], axis=1)
        w = tf.where(keep, w, 0.0)
        return tf.where(keep, tf.tanh(tf.matmul(x, w)), 0.0)

    assert np.isnan(xla_grads(f, x, W)[0]).all()
    got_x, got_w = xla_grads(hg.guard(f), x, W)
    # 1 - tanh^2 near saturation, fused differently
    assert_same(got_x, xla_grads(oracle, x, W)[0], rtol=1e-4)
    # the oracle's own w gradient is NaN in the dead column (log's derivative
    # at 0 is outside its where); the guard's is exact there: zero
    assert np.isfinite(got_w).all() and (got_w[:, 1] == 0).all()


@pytest.mark.parametrize(
    "contract",
    [
        pytest.param(lambda h, w: tf.einsum("bij,jk->bik", h, w), id="einsum"),
        pytest.param(lambda h, w: tf.matmul(h, tf.broadcast_to(w, [2, 3, 2])), id="batch_matmul"),
    ],
)
def test_batched_and_einsum_contractions(contract):
    d = tf.constant([[0.0, 1.0, 2.0], [3.0, 0.0, 1.0]])

    def f(w, d):
        h = (1.0 / d)[..., None] * tf.ones([1, 1, 3])
        return tf.where((d > 0)[..., None], contract(h, w), 0.0) ** 2

    def oracle(w, d):
        h = (1.0 / tf.where(d > 0, d, 1.0))[..., None] * tf.ones([1, 1, 3])
        return tf.where((d > 0)[..., None], contract(h, w), 0.0) ** 2

    assert np.isnan(xla_grads(f, W, d)[0]).all()
    for a, b in zip(xla_grads(hg.guard(f), W, d), xla_grads(oracle, W, d)):
        assert_same(a, b)
        assert np.isfinite(a).all()


def test_a_convolution_over_a_padded_batch():
    """Conv2D's filter gradient sums input * output gradient over the batch:
    a padded batch item's inf input meets its zero gradient."""
    d = tf.constant([0.0, 1.0, 2.0])
    kernel = tf.constant(np.linspace(0.5, 1.5, 2 * 2 * 1 * 2).reshape(2, 2, 1, 2), tf.float32)

    def conv(x, k):
        return tf.nn.conv2d(x, k, strides=1, padding="VALID")

    def f(k, d):
        x = (1.0 / d)[:, None, None, None] * tf.ones([1, 4, 4, 1])
        return tf.where((d > 0)[:, None, None, None], conv(x, k), 0.0) ** 2

    def oracle(k, d):
        x = (1.0 / tf.where(d > 0, d, 1.0))[:, None, None, None] * tf.ones([1, 4, 4, 1])
        return tf.where((d > 0)[:, None, None, None], conv(x, k), 0.0) ** 2

    assert np.isnan(xla_grads(f, kernel, d)[0]).all()
    for a, b in zip(xla_grads(hg.guard(f), kernel, d), xla_grads(oracle, kernel, d)):
        assert_same(a, b, rtol=1e-5)
        assert np.isfinite(a).all()


def test_a_live_row_with_an_inf_stays_a_genuine_singularity():
    def f(w, d):
        h = (1.0 / d)[:, None] * tf.ones([1, 3])
        return tf.where((d >= 0)[:, None], tf.matmul(h, w), 0.0)

    assert not np.isfinite(xla_grads(hg.guard(f), W, D)[0]).all()


def test_the_build_record_names_the_guarded_contraction():
    g = hg.guard(padded_rows)
    record = g.record_for(W, D)
    [(name, masked)] = record.contractions
    assert name.endswith("MatMul") and 0 in masked


def test_a_constant_operand_with_an_inf_in_a_dead_row_is_zeroed_too():
    """A ``Const`` carries no derivative, but its value still meets the dead
    row's zero cotangent in ``d/dW``."""
    d = np.array([0.0, 1.0, 2.0], np.float32)
    with np.errstate(divide="ignore"):
        h = (1.0 / d)[:, None] * np.ones((1, 3), np.float32)
    h_safe = ((1.0 / np.where(d > 0, d, 1.0))[:, None] * np.ones((1, 3))).astype(np.float32)

    def f(w):
        return tf.where((d > 0)[:, None], tf.matmul(tf.constant(h), w), 0.0) ** 2

    def oracle(w):
        return tf.where((d > 0)[:, None], tf.matmul(tf.constant(h_safe), w), 0.0) ** 2

    assert np.isnan(xla_grads(f, W)[0]).all()
    got = xla_grads(hg.guard(f), W)[0]
    assert_same(got, xla_grads(oracle, W)[0])
    assert np.isfinite(got).all()


def test_the_report_lists_the_zeroed_operands():
    text = str(hg.report(hg.guard(padded_rows), W, D))
    assert "MatMul 'MatMul' operand 0" in text
    assert "contraction: the other operand's gradient reads this operand's dead lanes as zero" in (
        text
    )
