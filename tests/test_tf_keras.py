"""``model.fit`` with ``hlo_guard.tf.keras``: guarded training equals the
hand-written double-where training, weight for weight, under XLA
(``jit_compile=True``), while the unguarded model's weights turn NaN.

The oracle is the same model trained by Keras's own ``train_step`` on the
double-where version of the loss.
"""

import numpy as np
import pytest
import tensorflow as tf

keras = pytest.importorskip("keras")

import hlo_guard.tf as hg  # noqa: E402
from hlo_guard.errors import GuardUsageError  # noqa: E402

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="needs the TensorFlow Keras backend"
)

X = np.array(
    [
        [1.0, -2.0, 0.5],
        [-1.0, 0.3, 2.0],
        [0.0, 0.0, 0.0],
        [0.2, 0.1, -0.3],
        [0.5, 0.5, 0.5],
        [-0.7, 1.1, 0.0],
    ],
    "float32",
)


def masked_sqrt_loss(y_true, y_pred):
    # the all-zero input row gives outputs exactly 0 at the start (biases are 0):
    # masked lanes where sqrt'(0) = inf (and sqrt of negatives is NaN)
    return tf.reduce_mean(tf.where(y_pred > 0, tf.sqrt(y_pred), 0.0) * y_true)


def masked_sqrt_loss_oracle(y_true, y_pred):
    safe = tf.where(y_pred > 0, y_pred, 1.0)
    return tf.reduce_mean(tf.where(y_pred > 0, tf.sqrt(safe), 0.0) * y_true)


def _sequential(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)]
    )


def _fit(model, loss, hook, x=X, y=None, epochs=3, **fit_kwargs):
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss, jit_compile=True)
    if hook:
        hg.keras.guard_train_step(model)
    y = np.ones((len(x), 4), "float32") if y is None else y
    history = model.fit(x, y, epochs=epochs, batch_size=2, verbose=0, shuffle=False, **fit_kwargs)
    return [w.numpy() for w in model.weights], history.history["loss"]


def _assert_same_weights(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-7)


def test_fit_masked_sqrt_loss_equals_double_where():
    plain, _ = _fit(_sequential(), masked_sqrt_loss, hook=False)
    assert any(np.isnan(w).any() for w in plain)  # the bug, under XLA
    expected, expected_loss = _fit(_sequential(), masked_sqrt_loss_oracle, hook=False)
    got, got_loss = _fit(_sequential(), masked_sqrt_loss, hook=True)
    _assert_same_weights(got, expected)
    np.testing.assert_allclose(got_loss, expected_loss, rtol=1e-6)


def _convnet(seed=0):
    """Conv2D, max and average pooling, a transposed convolution: the image
    ops of ``tests/test_tf_image_ops.py`` as Keras builds them."""
    keras.utils.set_random_seed(seed)
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            layers.Conv2D(3, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(2),
            layers.Conv2DTranspose(2, 3, strides=2, padding="same"),
            layers.AveragePooling2D(4),
            layers.Flatten(),
            layers.Dense(4),
        ]
    )


def test_fit_convnet_masked_sqrt_loss_equals_double_where():
    """A convolutional model trained with ``fit(jit_compile=True)``: the
    guarded training equals the double where's, weight for weight; the
    report of the guarded loss lists nothing unguarded (MaxPool, AvgPool and
    Conv2DBackpropInput have rules)."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(6, 8, 8, 1)).astype("float32")
    x[2] = 0.0  # outputs exactly 0 at the start (biases are 0)
    plain, _ = _fit(_convnet(), masked_sqrt_loss, hook=False, x=x)
    assert any(np.isnan(w).any() for w in plain)
    expected, expected_loss = _fit(_convnet(), masked_sqrt_loss_oracle, hook=False, x=x)
    got, got_loss = _fit(_convnet(), masked_sqrt_loss, hook=True, x=x)
    _assert_same_weights(got, expected)
    np.testing.assert_allclose(got_loss, expected_loss, rtol=1e-6)
    model = _convnet()
    y = tf.ones((6, 4))
    report = hg.report(hg.guard(lambda x: masked_sqrt_loss(y, model(x))), tf.constant(x))
    assert not report.unguarded, str(report)


class LogRegressor(hg.keras.GuardedTrainStep, keras.Model):
    """Subclassed model (mixin) predicting positive values."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(4, activation="softplus")

    def call(self, x):
        return self.out(self.hidden(x))


class PlainLogRegressor(LogRegressor):
    train_step = keras.Model.train_step


def masked_log_mse(y_true, y_pred):
    # padded targets are 0: log(0) = -inf on lanes the mask drops
    mask = y_true > 0
    return tf.reduce_sum(
        tf.where(mask, tf.square(tf.math.log(y_true) - tf.math.log(y_pred)), 0.0)
    ) / tf.reduce_sum(tf.cast(mask, tf.float32))


def masked_log_mse_oracle(y_true, y_pred):
    mask = y_true > 0
    safe_true = tf.where(mask, y_true, 1.0)
    return tf.reduce_sum(
        tf.where(mask, tf.square(tf.math.log(safe_true) - tf.math.log(y_pred)), 0.0)
    ) / tf.reduce_sum(tf.cast(mask, tf.float32))


def _padded_targets():
    rng = np.random.default_rng(0)
    y = rng.uniform(0.5, 2.0, (len(X), 4)).astype("float32")
    y[:, 3] = 0.0
    y[2, 1:] = 0.0
    return y


def _build(cls):
    keras.utils.set_random_seed(1)
    model = cls()
    model(X[:1])
    return model


def test_mixin_masked_log_regression_equals_double_where():
    y = _padded_targets()
    plain, _ = _fit(_build(PlainLogRegressor), masked_log_mse, hook=False, y=y)
    assert any(np.isnan(w).any() for w in plain)
    expected, expected_loss = _fit(
        _build(PlainLogRegressor), masked_log_mse_oracle, hook=False, y=y
    )
    got, got_loss = _fit(_build(LogRegressor), masked_log_mse, hook=False, y=y)
    _assert_same_weights(got, expected)
    np.testing.assert_allclose(got_loss, expected_loss, rtol=1e-6)


def test_sample_weights_metrics_dropout_and_batchnorm_match_keras():
    """Stateful layers (Dropout's seed state, BatchNorm's moving statistics),
    sample weights and compiled metrics run exactly as in Keras's own step."""

    def model():
        keras.utils.set_random_seed(3)
        return keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(8),
                keras.layers.BatchNormalization(),
                keras.layers.Dropout(0.3),
                keras.layers.Dense(4),
            ]
        )

    sw = np.linspace(0.5, 1.5, len(X)).astype("float32")
    runs = []
    for hook in (False, True):
        m = model()
        # SGD: Adam would blow the ~1e-9 rounding noise of the pre-BatchNorm bias
        # gradient (truly 0) up to a full step, in either program
        m.compile(
            optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"], jit_compile=True
        )
        if hook:
            hg.keras.guard_train_step(m)
        h = m.fit(
            X,
            np.ones((len(X), 4), "float32"),
            sample_weight=sw,
            epochs=2,
            batch_size=3,
            verbose=0,
            shuffle=False,
        )
        runs.append(([w.numpy() for w in m.weights], h.history))
    (expected, eh), (got, gh) = runs
    for g, e in zip(got, expected):  # XLA may fuse the two programs differently
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    for key in ("loss", "mae"):
        np.testing.assert_allclose(gh[key], eh[key], rtol=1e-6)


def test_guarded_forward_reports_the_guard():
    model = _sequential()
    model.compile(optimizer="sgd", loss=masked_sqrt_loss)
    hg.keras.guard_train_step(model)
    y = tf.ones((len(X), 4))
    report = hg.keras.guarded_forward(model).report(tf.constant(X), y, None)
    assert report.guards, report.to_text()


def test_custom_train_step_is_refused_with_the_recipe():
    class Custom(keras.Model):
        def train_step(self, data):  # pragma: no cover - never run
            raise AssertionError

    with pytest.raises(GuardUsageError, match="forward_and_loss"):
        hg.keras.guard_train_step(Custom())
    with pytest.raises(GuardUsageError, match="keras.Model"):
        hg.keras.guard_train_step(keras.layers.Dense(3))


def _padded_conv_model(normalize, seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((4, 4, 1)),
            keras.layers.Lambda(normalize),
            keras.layers.Conv2D(2, 2),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )


def _per_sample_normalize(t):
    return t / tf.reduce_sum(t, axis=[1, 2, 3], keepdims=True)  # 0 / 0 for a padded sample


def _per_sample_normalize_oracle(t):
    s = tf.reduce_sum(t, axis=[1, 2, 3], keepdims=True)
    return tf.where(s > 0, t / tf.where(s > 0, s, 1.0), 0.0)


def _padded_rows_loss(y_true, y_pred):
    return tf.reduce_mean(tf.where(y_true > 0, (y_pred - 1.0) ** 2, 0.0))


def test_fit_guards_inside_the_model_a_padded_sample_meeting_a_convolution():
    """A hazard inside the model, not the loss: a padded (all-zero) sample is
    normalised to 0 / 0, and the convolution's kernel gradient sums it against
    the sample's zero cotangent.  Needs the contraction guard on Conv2D and a
    step whose ``y_pred`` (returned for the metrics) does not count as a live
    output -- it made every lane of the model live, so nothing was guarded."""
    x = np.random.default_rng(0).uniform(0.5, 1.5, (6, 4, 4, 1)).astype("float32")
    x[1::2] = 0.0  # one padded sample in each batch of two
    y = np.ones((6, 1), "float32")
    y[1::2] = 0.0
    plain, _ = _fit(_padded_conv_model(_per_sample_normalize), _padded_rows_loss, False, x, y)
    assert not all(np.isfinite(w).all() for w in plain)
    got, got_loss = _fit(_padded_conv_model(_per_sample_normalize), _padded_rows_loss, True, x, y)
    want, want_loss = _fit(
        _padded_conv_model(_per_sample_normalize_oracle), _padded_rows_loss, False, x, y
    )
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)


def test_a_dropout_model_with_a_transpose_is_compiled_once():
    """Dropout makes the guarded program stateful (it cannot run twice), and
    ``Permute`` is a transpose, whose TF gradient reads its permutation: under
    XLA the step used to fold its arguments into constants and compile for
    every batch (837 ms per step against 42 ms measured by hand).  The ops
    build their constants in the backward function now
    (``hlo_guard.tf.local_constants``): the step's HLO takes the batch as a
    parameter."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((4, 3))
    h = keras.layers.Permute((2, 1))(inp)
    h = keras.layers.Dropout(0.25)(keras.layers.Dense(5, activation="relu")(h))
    model = keras.Model(inp, keras.layers.Dense(2)(keras.layers.Flatten()(h)))
    model.compile(optimizer="sgd", loss=masked_sqrt_loss)
    forward = hg.keras.guarded_forward(model)

    @tf.function(jit_compile=True)
    def step(x, y):
        with tf.GradientTape() as tape:
            _, loss = forward(x, y, None)
        return tape.gradient(loss, model.trainable_weights)

    x = tf.constant(np.linspace(-1.0, 1.0, 6 * 12, dtype="float32").reshape(6, 4, 3))
    y = tf.ones((6, 2))
    hlo = step.experimental_get_compiler_ir(x, y)(stage="hlo")
    entry = hlo[hlo.index("\nENTRY") :]
    entry = entry[: entry.index("\n}")]
    assert any(" parameter(" in ln and "f32[6,4,3]" in ln for ln in entry.splitlines()), entry[:300]
    grads = step(x, y)
    assert all(np.isfinite(g.numpy()).all() for g in grads)


def test_fit_a_masked_lstm_equals_the_double_where():
    """``Embedding(mask_zero=True) -> LSTM``: Keras runs the LSTM as a
    ``tf.while_loop`` whose body keeps the state on padded steps with a
    ``where``, so the guard rewrites the body (a masked ``MatMul``).  Its
    gradient crashed ("out of scope") until the rewritten body was kept on
    the loop op (``tests/test_tf_loops_xla.py``)."""
    tokens = np.array([[3, 5, 2, 0], [4, 1, 0, 0], [2, 2, 2, 2], [1, 0, 0, 0]], "int32")

    def lstm(seed=0):
        keras.utils.set_random_seed(seed)
        return keras.Sequential(
            [
                keras.Input((4,), dtype="int32"),
                keras.layers.Embedding(6, 3, mask_zero=True),
                keras.layers.LSTM(4),
            ]
        )

    kw = dict(x=tokens, y=np.ones((4, 4), "float32"), epochs=1)
    guarded, _ = _fit(lstm(), masked_sqrt_loss, hook=True, **kw)
    oracle, _ = _fit(lstm(), masked_sqrt_loss_oracle, hook=False, **kw)
    _assert_same_weights(guarded, oracle)
