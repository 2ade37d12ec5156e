"""``guard``/``guarded_function`` with ``input_signature`` as a method
decorator on a ``tf.Module``: ``self`` is bound (the signature describes the
arguments after it), and the module saves with ``tf.saved_model.save``; the
reloaded method gives the same values and the same guarded gradients, under
XLA, as the hand-written double-where program."""

import numpy as np
import pytest
import tensorflow as tf

import hlo_guard.tf as hg

SIGNATURE = [tf.TensorSpec([None], tf.float32)]
DECORATORS = {
    "guard": hg.guard(input_signature=SIGNATURE),
    "guarded_function": hg.guarded_function(input_signature=SIGNATURE),
}


def make_module(kind, w):
    decorator = DECORATORS[kind]

    class Scaled(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(w)

        @decorator
        def f(self, x):
            y = self.w * x
            return tf.where(y > 0, tf.sqrt(y), 0.0)

    return Scaled()


def oracle(w, x):
    y = w * x
    return tf.where(y > 0, tf.sqrt(tf.where(y > 0, y, 1.0)), 0.0)


def xla_value_and_grad(fn, w, x):
    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            y = fn(x)
            total = tf.reduce_sum(y)
        return y, tape.gradient(total, w)

    y, g = step(x)
    return y.numpy(), g.numpy()


W = [1.0, 0.0, -2.0, 4.0]
X = tf.constant([1.0, 1.0, 1.0, 1.0])


def _check(fn, w, x):
    got_y, got_g = xla_value_and_grad(fn, w, x)
    exp_y, exp_g = xla_value_and_grad(lambda x: oracle(w, x), w, x)
    np.testing.assert_array_equal(got_y, exp_y)
    assert np.isfinite(got_g).all()
    np.testing.assert_allclose(got_g, exp_g, rtol=1e-6)


@pytest.mark.parametrize("kind", sorted(DECORATORS))
def test_method_with_input_signature_binds_self(kind):
    m = make_module(kind, W)
    plain = lambda x: tf.where(m.w * x > 0, tf.sqrt(m.w * x), 0.0)
    assert np.isnan(xla_value_and_grad(plain, m.w, X)[1]).any()  # the bug
    _check(m.f, m.w, X)
    _check(m.f, m.w, tf.constant([2.0, 0.5, -1.0, 0.0]))
    # one guard per instance: another module has its own variable
    other = make_module(kind, [4.0, 4.0, 0.0, 1.0])
    np.testing.assert_array_equal(other.f(X).numpy(), [2.0, 2.0, 0.0, 1.0])
    np.testing.assert_array_equal(m.f(X).numpy(), oracle(m.w, X).numpy())
    assert hg.report(m.f, X).guards


@pytest.mark.parametrize("kind", sorted(DECORATORS))
def test_module_saves_and_reloads_guarded(kind, tmp_path):
    m = make_module(kind, W)
    expected = m.f(X).numpy()
    tf.saved_model.save(m, str(tmp_path))
    loaded = tf.saved_model.load(str(tmp_path))
    np.testing.assert_array_equal(loaded.f(X).numpy(), expected)
    _check(loaded.f, loaded.w, X)
    _check(loaded.f, loaded.w, tf.constant([3.0, -1.0, 0.0, 0.0]))
    # eager tape on the reloaded function too
    with tf.GradientTape() as tape:
        total = tf.reduce_sum(loaded.f(X))
    np.testing.assert_allclose(
        tape.gradient(total, loaded.w).numpy(),
        xla_value_and_grad(lambda x: oracle(m.w, x), m.w, X)[1],
        rtol=1e-6,
    )
