"""``tf.custom_gradient`` overrides the guard sets aside: TF's ``tf.nn.silu``
/ ``tf.nn.swish`` (every Keras ``swish``/``silu`` activation), whose custom
gradient is the true derivative computed to save memory.  The function is
guarded instead of run unguarded, its forward bits unchanged and its
gradient equal to the hand-written double where's up to rounding; any other
custom gradient keeps the function unguarded (``test_tf_integration``)."""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import (
    assert_same,
    bitwise_equal,
    jvp_of_ones,
    xla_forward,
    xla_grads,
    xla_second_derivative,
)

import hlo_guard.tf as hg
from hlo_guard.tf import compat
from hlo_guard.tf.custom_gradients import set_aside_true_derivatives

X = tf.constant([-2.0, -0.5, 0.0, 0.0, 0.7, 3.0])


def masked(act, safe=False):
    """``where(x > 0, sqrt(act(x)), 0)``: ``sqrt'(0)`` at ``x <= 0`` lanes
    (silu(0) = 0), and ``sqrt`` of a negative for negative ``x``."""

    def fn(x):
        inner = act(tf.where(x > 0, x, 1.0)) if safe else act(x)
        return tf.where(x > 0, tf.sqrt(inner), 0.0)

    return fn


@pytest.mark.parametrize("act", [tf.nn.silu, tf.nn.swish], ids=["silu", "swish"])
def test_silu_is_guarded_and_equals_the_double_where(act):
    fn, oracle = masked(act), masked(act, safe=True)
    (plain,) = xla_grads(fn, X)
    assert not np.isfinite(plain).all()
    guarded = hg.guard(fn)
    (want,) = xla_grads(oracle, X)
    (got,) = xla_grads(guarded, X)
    assert_same(got, want, rtol=1e-6)
    assert_same(xla_second_derivative(guarded, X), xla_second_derivative(oracle, X), rtol=1e-5)
    assert_same(jvp_of_ones(guarded, X), jvp_of_ones(oracle, X), rtol=1e-6)
    assert bitwise_equal(xla_forward(guarded, X), xla_forward(fn, X))
    report = hg.report(guarded, X)
    assert not report.unguarded, str(report)
    assert report.guards
    assert len(report.notes) == 1 and "tf.nn.silu" in report.notes[0]
    assert "NOTE  tf.nn.silu / tf.nn.swish at " in str(report)


def test_silu_gradient_on_live_lanes_is_the_custom_gradients_up_to_rounding():
    """Set aside, the custom gradient's value is still what the guarded
    program computes on live lanes: TF's own derivative of ``x sigmoid(x)``."""
    x = tf.constant(np.linspace(0.1, 4.0, 17), tf.float32)

    def fn(x):
        return tf.nn.silu(x) * 3.0

    (plain,) = xla_grads(fn, x)
    (got,) = xla_grads(hg.guard(fn), x)
    np.testing.assert_allclose(got, plain, rtol=1e-6)


def test_only_the_known_override_is_set_aside():
    """A graph with silu and a user's own custom gradient: silu's override
    is dropped, the user's is kept (and so the function stays unguarded)."""

    @tf.custom_gradient
    def straight_through(x):
        return tf.round(x), lambda dy: dy

    @tf.function
    def f(x):
        return tf.nn.silu(x) + straight_through(x)

    graph_def = f.get_concrete_function(tf.TensorSpec([3])).graph.as_graph_def()
    overrides = [n for n in graph_def.node if "_gradient_op_type" in n.attr]
    assert len(overrides) == 2
    user = [
        n
        for n in overrides
        if compat.custom_gradient_function(n.attr["_gradient_op_type"].s.decode()).__qualname__
        != "swish.<locals>.swish_impl.<locals>.grad"
    ]
    assert len(user) == 1
    notes = set_aside_true_derivatives(graph_def, {})
    assert len(notes) == 1
    left = [n.name for n in graph_def.node if "_gradient_op_type" in n.attr]
    assert left == [user[0].name]

    def fn(x):
        return tf.where(x > 0, tf.sqrt(f(x)), 0.0)

    report = hg.report(hg.guard(fn), tf.constant([0.0, 1.0, 2.0]))
    assert any("custom_gradient" in s.reason for s in report.unguarded)


def test_custom_gradient_function_of_an_unknown_override_is_none():
    assert compat.custom_gradient_function("NoSuchGradient-hlo_guard") is None
    assert compat.custom_gradient_function("Relu") is None  # registered, not custom_gradient's


def test_keras_swish_model_trains_guarded_under_xla():
    """A Keras model with ``swish`` activations trained by
    ``fit(jit_compile=True)`` through ``guard_train_step``: weights equal the
    double-where training's (up to rounding), the plain training's are NaN."""
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "tensorflow":
        pytest.skip("needs the TensorFlow Keras backend")

    x = np.array([[1.0, -2.0, 0.5], [-1.0, 0.3, 2.0], [0.0, 0.0, 0.0], [0.2, 0.1, -0.3]], "float32")
    y = np.ones((4, 4), "float32")

    def loss(y_true, y_pred):
        return tf.reduce_mean(tf.where(y_pred > 0, tf.sqrt(y_pred), 0.0) * y_true)

    def loss_oracle(y_true, y_pred):
        safe = tf.where(y_pred > 0, y_pred, 1.0)
        return tf.reduce_mean(tf.where(y_pred > 0, tf.sqrt(safe), 0.0) * y_true)

    def train(loss_fn, hook):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(8, activation="swish"),
                keras.layers.Dense(4, activation="silu"),
            ]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss_fn, jit_compile=True)
        if hook:
            hg.keras.guard_train_step(model)
        model.fit(x, y, epochs=3, batch_size=2, verbose=0, shuffle=False)
        return [w.numpy() for w in model.weights]

    plain = train(loss, hook=False)
    assert any(np.isnan(w).any() for w in plain)
    expected = train(loss_oracle, hook=False)
    got = train(loss, hook=True)
    for g, e in zip(got, expected):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)
