"""Keras ``model.fit`` on a masked loss that takes sqrt of the model's outputs.

Lanes where the output is not positive are masked out of the loss by a where
(the all-zero input row gives outputs that are exactly 0: biases start at 0),
but sqrt'(0) = inf meets their zero cotangent: under XLA (``jit_compile=True``)
the weight gradients turn NaN and the first optimizer step destroys the model.
One line, ``hg.keras.guard_train_step(model)``, makes ``fit`` train exactly like
the hand-written double-where loss.  Run:
python examples/tf_keras_masked_loss.py
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import sys  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import hlo_guard.tf as hg  # noqa: E402

x = np.array([[1.0, -2.0, 0.5], [-1.0, 0.3, 2.0], [0.0, 0.0, 0.0], [0.2, 0.1, -0.3]], "float32")
y = np.ones((4, 4), "float32")


def masked_loss(y_true, y_pred):
    return tf.reduce_mean(tf.where(y_pred > 0, tf.sqrt(y_pred), 0.0) * y_true)


def double_where_loss(y_true, y_pred):
    safe = tf.where(y_pred > 0, y_pred, 1.0)
    return tf.reduce_mean(tf.where(y_pred > 0, tf.sqrt(safe), 0.0) * y_true)


def make_model(loss, guarded):
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss, jit_compile=True)
    if guarded:
        hg.keras.guard_train_step(model)  # <- the one line
    return model


def train(loss, guarded):
    model = make_model(loss, guarded)
    model.fit(x, y, epochs=5, batch_size=2, verbose=0, shuffle=False)
    return [w.numpy() for w in model.weights]


def main():
    rows = [
        ("plain", train(masked_loss, False)),
        ("guarded", train(masked_loss, True)),
        ("double where", train(double_where_loss, False)),
    ]
    for name, weights in rows:
        nan = sum(int(np.isnan(w).sum()) for w in weights)
        print(f"{name:>13}: {nan:3d} NaN weights after 5 epochs")
    same = all(np.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(rows[1][1], rows[2][1]))
    print(f"guarded weights == double-where weights: {same}")
    print()
    model = make_model(masked_loss, True)
    print(hg.keras.guarded_forward(model).report(tf.constant(x), tf.constant(y), None).to_text())
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
