"""A Keras training step whose masked loss takes sqrt of the model's outputs.

Lanes where the output is not positive are masked out of the loss by a where
(the all-zero input row gives outputs that are exactly 0: biases start at 0),
but sqrt'(0) = inf meets their zero cotangent: under XLA the weight gradients
turn NaN and one optimizer step destroys the model.  Guarded, the step is
exactly the hand-written double-where one.  Run:
python examples/tf_keras_masked_loss.py
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import sys  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hlo_guard.tf as hg  # noqa: E402

keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(8, activation="relu"),
                          keras.layers.Dense(4)])
x = tf.constant([[1.0, -2.0, 0.5], [-1.0, 0.3, 2.0], [0.0, 0.0, 0.0]])


def loss(x):
    h = model(x)
    return tf.reduce_sum(tf.where(h > 0, tf.sqrt(h), 0.0))


def double_where_loss(x):
    h = model(x)
    return tf.reduce_sum(tf.where(h > 0, tf.sqrt(tf.where(h > 0, h, 1.0)), 0.0))


def xla_gradients(fn):
    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            value = fn(x)
        return tape.gradient(value, model.trainable_variables)
    return [g.numpy() for g in step(x)]


def main():
    rows = [("plain", xla_gradients(loss)), ("guarded", xla_gradients(hg.guard(loss))),
            ("double where", xla_gradients(double_where_loss))]
    for name, grads in rows:
        nan = sum(int(np.isnan(g).sum()) for g in grads)
        print(f"{name:>13}: {nan:3d} NaN weight-gradient entries, "
              f"sum |finite entries| = {sum(float(np.abs(np.nan_to_num(g)).sum()) for g in grads):.6f}")
    same = all(np.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(rows[1][1], rows[2][1]))
    print(f"guarded == double where: {same}")
    print()
    print(hg.report(hg.guard(loss), x).to_text())
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
