"""TF reports a zero a mask makes by *value* times a singular factor
(:mod:`hlo_guard.tf.where_made_zeros`), as the JAX front end does.

``tf.cast(mask, f32) * tf.norm(x, -1)`` -- Keras's way of applying a mask --
is NaN under XLA on a padded row (``0 * sqrt'(0)``), guarded or not: the
padded lanes are not dead (the cotangent is the zero's value), and the
contract keeps a numeric zero's NaN.  Until 2026-11-28 the report was clean
(a user-style hunt: Keras ``Masking`` + a norm loss trained to NaN weights
under ``fit(jit_compile=True)``)."""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import jvp_of_ones, xla_grads

import hlo_guard.tf as hg

X = tf.constant([[0.0, 0.0], [1.0, 4.0], [3.0, 0.0]])
M = tf.constant([False, True, True])


def _where_made(report):
    return [s for s in report.unguarded if "zero made by a mask's value" in s.reason]


LEAKING = {
    "cast(mask) * norm": lambda x: tf.cast(M, tf.float32) * tf.norm(x, axis=-1),
    "where(mask, 1, 0) * norm": lambda x: tf.where(M, 1.0, 0.0) * tf.norm(x, axis=-1),
    "cast(any(x > 0)) * norm": lambda x: (
        tf.cast(tf.reduce_any(x > 0, -1), tf.float32) * tf.norm(x, axis=-1)
    ),
    "norm * cast(mask) * 2": lambda x: tf.norm(x, axis=-1) * (tf.cast(M, tf.float32) * 2.0),
    "cast(mask) * log": lambda x: tf.cast(M, tf.float32) * tf.reduce_sum(tf.math.log(x), -1),
}


@pytest.mark.parametrize("name", sorted(LEAKING))
def test_a_mask_multiplying_a_singular_factor_is_reported(name):
    f = LEAKING[name]
    guarded = hg.guard(f)
    (grad,) = xla_grads(guarded, X)
    assert np.isnan(grad[0]).all()  # the padded row: 0 * sqrt'(0), plain XLA's NaN kept
    np.testing.assert_array_equal(guarded(X), f(X))
    (site,) = _where_made(hg.report(guarded, X))
    assert site.op.startswith("Mul")
    assert "tf.where(mask, loss, 0)" in site.reason


CLEAN = {
    # selecting instead of multiplying: a dead lane, guarded
    "where(mask, norm, 0)": lambda x: tf.where(M, tf.norm(x, axis=-1), 0.0),
    # nothing singular behind the other factor
    "cast(mask) * sum of squares": lambda x: tf.cast(M, tf.float32) * tf.reduce_sum(x * x, -1),
    # the mask is data, not made by a select or a cast: a numeric zero, as any other
    "weights * norm": lambda x: tf.constant([0.0, 1.0, 1.0]) * tf.reduce_sum(x * x, -1),
    # singular ops kept away from their singularity, as TF's and Keras's losses write them
    "cast(mask) * logistic loss": lambda x: (
        tf.cast(M, tf.float32)
        * tf.reduce_sum(
            tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.ones_like(x), logits=x), -1
        )
    ),
    "cast(mask) * log(clip)": lambda x: (
        tf.cast(M, tf.float32) * tf.reduce_sum(tf.math.log(tf.clip_by_value(x, 1e-7, 1.0)), -1)
    ),
    "cast(mask) * log(maximum)": lambda x: (
        tf.cast(M, tf.float32) * tf.reduce_sum(tf.math.log(tf.maximum(x, 1e-7)), -1)
    ),
}


@pytest.mark.parametrize("name", sorted(CLEAN))
def test_anything_else_is_not(name):
    f = CLEAN[name]
    guarded = hg.guard(f)
    assert not _where_made(hg.report(guarded, X))
    (grad,) = xla_grads(guarded, X)
    assert np.isfinite(grad).all()


def _masked_square(x):
    """A 0/1 mask times a where: the mask's own factor is finite and has no
    tangent, so the product cannot turn a zero tangent into NaN."""
    return tf.cast(M, tf.float32) * tf.where(x > 0, x * x, 0.0)[:, 0]


def test_a_bool_mask_factor_needs_no_forward_mode_guard():
    """``loss * cast(mask)`` (Keras's ``SparseCategoricalCrossentropy(
    ignore_class=...)``) was given a forward-mode output guard and also
    reported as an unguarded forward-mode site; a cast boolean is a finite
    scale, as a finite constant is.  The tangent still equals the double
    plain program's."""
    guarded = hg.guard(_masked_square)
    report = hg.report(guarded, X)
    assert not report.unguarded
    assert all(s.operand is not None for s in report.guards)  # no output guard
    np.testing.assert_array_equal(jvp_of_ones(guarded, X), jvp_of_ones(_masked_square, X))


def test_keras_ignore_class_cross_entropy_report_is_clean():
    keras = pytest.importorskip("keras")
    logits = tf.constant(np.random.default_rng(0).normal(size=(3, 4, 5)), tf.float32)
    labels = tf.constant([[0, 1, 2, 3], [4, 0, -1, -1], [-1, -1, -1, -1]], tf.int32)
    loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, ignore_class=-1, reduction=None
    )
    guarded = hg.guard(lambda z: loss(labels, z))
    report = hg.report(guarded, logits)
    assert not report.unguarded
    np.testing.assert_allclose(
        jvp_of_ones(guarded, logits), jvp_of_ones(lambda z: loss(labels, z), logits), rtol=1e-6
    )


_R = tf.constant([0.5, 1.0, 1.8, 2.5, 3.0])
_XR = tf.constant([4.0, 0.0, -1.0, 0.0, 0.25])
_MR = tf.constant([True, False, True, False, True])


def _cutoff_energy(sigma):
    """jax_md's smooth cutoff, written in TF: zero only where ``r >= 2 > 0``,
    times ``(sigma / r) ** 6`` terms."""
    switch = tf.where(_R < 2.0, (4.0 - _R**2) ** 2, 0.0)
    idr6 = (sigma / _R) ** 6
    return switch * 4.0 * (idr6 * idr6 - idr6)


def _masked_sqrt(x):
    return tf.cast(_MR, tf.float32) * tf.where(x > 0, tf.sqrt(x), 0.0)


def test_a_cutoff_times_a_quotient_by_the_cut_distance_is_not_reported():
    """Reported as ``0 * inf`` until the predicates were read (2026-11-28);
    the XLA gradient equals the per-lane derivative."""
    guarded = hg.guard(_cutoff_energy)
    assert not _where_made(hg.report(guarded, tf.constant(1.0)))
    (grad,) = xla_grads(guarded, tf.constant(1.0))
    r = _R.numpy().astype(np.float64)
    switch = np.where(r < 2.0, (4.0 - r**2) ** 2, 0.0)
    np.testing.assert_allclose(grad, np.sum(switch * 4.0 * (12 / r**12 - 6 / r**6)), rtol=1e-5)


def test_a_mask_times_a_where_taken_sqrt_is_not_reported():
    guarded = hg.guard(_masked_sqrt)
    assert not _where_made(hg.report(guarded, _XR))
    (grad,) = xla_grads(guarded, _XR)
    per_lane = [
        0.5 / np.sqrt(x) if (m and x > 0) else 0.0 for m, x in zip(_MR.numpy(), _XR.numpy())
    ]
    np.testing.assert_array_equal(grad, np.float32(per_lane))


_ZR = tf.constant([0.0, 1.0, 2.5])
_SQ = tf.constant([[1.0, 0.0], [3.0, 1.0]])

#: the zeroed lanes do meet an infinite derivative: NaN under XLA, reported
ZEROED_LANES_MEET_INF = {
    "zero where the divisor can be 0": (
        lambda x: tf.where(_ZR > 2.0, _ZR, 0.0) * (x / _ZR),
        tf.ones(3),
    ),
    "divisor is another value": (
        lambda x: tf.where(_R < 2.0, 1.0 - _R, 0.0) * (x / (_R - 3.0)),
        tf.ones(5),
    ),
    "lanes transposed between": (
        lambda x: tf.where(_SQ < 2.0, 1.0, 0.0) * (x / tf.transpose(_SQ)),
        tf.ones((2, 2)),
    ),
    "mask times where(x >= 0, sqrt)": (
        lambda x: (
            tf.cast(tf.constant([True, False]), tf.float32) * tf.where(x >= 0, tf.sqrt(x), 0.0)
        ),
        tf.constant([1.0, 0.0]),
    ),
}


@pytest.mark.parametrize("name", sorted(ZEROED_LANES_MEET_INF))
def test_a_zero_meeting_an_infinite_derivative_is_still_reported(name):
    f, x = ZEROED_LANES_MEET_INF[name]
    guarded = hg.guard(f)
    (grad,) = xla_grads(guarded, x)
    assert np.isnan(grad).any(), name
    assert _where_made(hg.report(guarded, x)), name


_DEGREES = tf.constant([1.0, 2.0, 0.5, 0.0])
_EDGE_MASK = tf.constant([True, True, True, False, False])


def _gcn_norm(d, safe=False):
    base = tf.where(d > 0, d, 1.0) if safe else d
    return tf.where(d > 0, base**-0.5, 0.0)


def _entropy(z, safe=False):
    a = tf.where(_EDGE_MASK, tf.nn.softmax(tf.where(_EDGE_MASK, z, -np.inf)), 0.0)
    log_a = tf.math.log(tf.where(a > 0, a, 1.0) if safe else a)
    return -tf.reduce_sum(tf.where(a > 0, a * log_a, 0.0))


#: name -> (f, its double where, x): reported, though exact (a hunt,
#: 2026-11-28: graph networks with padded nodes)
WHERE_KEEPS_FINITE = {
    "gcn norm * gcn norm": (
        lambda d: _gcn_norm(d) * _gcn_norm(d) * tf.constant([1.0, 1.0, 1.0, 0.0]),
        lambda d: _gcn_norm(d, True) * _gcn_norm(d, True) * tf.constant([1.0, 1.0, 1.0, 0.0]),
        _DEGREES,
    ),
    "entropy of padded attention": (
        _entropy,
        lambda z: _entropy(z, True),
        tf.constant([0.3, -200.0, 2.0, 0.5, 0.1]),
    ),
}


@pytest.mark.parametrize("name", sorted(WHERE_KEEPS_FINITE))
def test_a_where_keeping_the_singular_factor_finite_is_not_reported(name):
    f, double_where, x = WHERE_KEEPS_FINITE[name]
    guarded = hg.guard(f)
    assert not _where_made(hg.report(guarded, x)), name
    np.testing.assert_allclose(xla_grads(guarded, x)[0], xla_grads(double_where, x)[0], rtol=1e-6)


def test_a_chain_of_selects_is_walked_once(monkeypatch):
    """As in the JAX front end: 30 ``tf.where(x <= .5, x, sqrt(x))`` steps
    behind a mask are excused within a budget of 300 tensors (a walk per
    path would take 2**30)."""
    from hlo_guard.tf import where_made_zeros

    monkeypatch.setattr(where_made_zeros, "_MAX_STEPS", 300)
    mask = tf.constant([True, False, True, True])

    def f(x):
        for _ in range(30):
            x = tf.where(x <= 0.5, x, tf.sqrt(x)) + 0.25
        return tf.cast(mask, tf.float32) * x

    x = tf.constant([0.1, 1.0, 2.0, 0.0])
    guarded = hg.guard(f)
    assert not _where_made(hg.report(guarded, x))
    (grad,) = xla_grads(guarded, x)
    assert grad[1] == 0.0 and np.isfinite(grad).all()
