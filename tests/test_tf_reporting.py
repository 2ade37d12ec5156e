"""Reports of the TF front end as users reach them: a guarded Keras model, the
report's dumps, a plain TF function given to the JAX-side tools (explain,
dump, CLI), and no autograph noise for lambdas."""

import io
import logging

import numpy as np
import pytest
import tensorflow as tf

import hlo_guard
import hlo_guard.tf as hg
from hlo_guard.errors import GuardUsageError

keras = pytest.importorskip("keras")


def _norm_model():
    """A Keras model whose last layer takes a where-guarded sqrt (safe norm)."""
    keras.utils.set_random_seed(0)

    class SafeNorm(keras.layers.Layer):
        def call(self, v):
            sq = tf.reduce_sum(v * v, axis=-1)
            return tf.where(sq > 0, tf.sqrt(sq), 0.0)

    inputs = keras.Input((3,))
    h = keras.layers.Dense(4, activation="relu")(inputs)
    return keras.Model(inputs, SafeNorm()(h), name="norm_model")


def _norm_oracle(model, x):
    h = model.layers[1](x)
    sq = tf.reduce_sum(h * h, axis=-1)
    return tf.where(sq > 0, tf.sqrt(tf.where(sq > 0, sq, 1.0)), 0.0)


X = tf.constant([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [-1.0, 0.3, 2.0]])


def _xla_weight_grads(fn, model):
    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(fn(x))
        return tape.gradient(y, model.trainable_variables)

    return [g.numpy() for g in step(X)]


def test_report_of_guarded_keras_model():
    model = _norm_model()
    guarded = hg.guard(model)
    rep = hg.report(guarded, X)
    assert rep.function == "norm_model"
    assert "Sqrt" in [s.op.split()[0] for s in rep.guards], rep.to_text()
    assert "norm_model" in hlo_guard.explain(guarded, X).to_text()
    # and the guarded model's gradients are the double-where ones
    got = _xla_weight_grads(guarded, model)
    expected = _xla_weight_grads(lambda x: _norm_oracle(model, x), model)
    for g, e in zip(got, expected):
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, e, rtol=1e-6)


def test_report_of_guarded_keras_layer():
    keras.utils.set_random_seed(0)
    layer = keras.layers.Dense(2, activation="relu", name="dense_relu")
    rep = hg.report(hg.guard(layer), X)
    assert rep.function == "dense_relu"


def _where_sqrt(x):
    return tf.where(x > 0, tf.sqrt(x), 0.0)


def test_report_dumps_original_and_guarded():
    g = hg.guard(_where_sqrt)
    x = tf.constant([-1.0, 0.0, 1.0, 4.0])
    rep = hg.report(g, x)
    diff = rep.dumps()  # stablehlo forward diff
    assert "--- original" in diff and "+++ guarded" in diff
    assert any(line.startswith("+") and "stablehlo.select" in line for line in diff.splitlines())
    original = rep.dumps(show="original")
    guarded = rep.dumps(show="guarded")
    assert original.count("stablehlo.select") == 1  # the user's where
    assert guarded.count("stablehlo.select") == 2  # and the guard
    both = rep.dumps("hlo", "grad", show="both")
    assert "==== original grad hlo ====" in both and "==== guarded grad hlo ====" in both
    # the same through hlo_guard.explain, whose default level is a jaxpr for JAX
    assert "stablehlo.select" in hlo_guard.explain(g, x).dumps(show="original")
    with pytest.raises(GuardUsageError, match="no jaxpr"):
        rep.dumps("jaxpr")


def loss(x):
    return tf.reduce_sum(tf.where(x > 0, tf.sqrt(x), 0.0))


@pytest.mark.parametrize(
    "fn,arg,kind",
    [
        (loss, np.ones(3, np.float32), "a plain TensorFlow function"),
        (tf.function(loss), np.ones(3, np.float32), "a plain tf.function"),
        (loss, tf.ones(3), "called with TensorFlow tensors"),
    ],
)
def test_explain_plain_tf_function_says_to_wrap_it(fn, arg, kind):
    with pytest.raises(GuardUsageError) as info:
        hlo_guard.explain(fn, arg)
    msg = str(info.value)
    assert kind in msg
    assert "hlo_guard.explain(hlo_guard.tf.guard(loss), *args)" in msg
    with pytest.raises(GuardUsageError, match=r"hlo_guard\.dump\(hlo_guard\.tf\.guard\(loss\)"):
        hlo_guard.dump(fn, arg)


def test_explain_keras_layer_says_to_wrap_it():
    layer = keras.layers.Dense(2, name="head")
    with pytest.raises(GuardUsageError, match=r"Keras Dense.*hlo_guard\.tf\.guard\(head\)"):
        hlo_guard.explain(layer, np.ones((1, 3), np.float32))


def test_jax_errors_are_not_blamed_on_tensorflow():
    def broken(x):
        raise ValueError("the user's own bug")

    with pytest.raises(ValueError, match="own bug"):
        hlo_guard.explain(broken, np.ones(3, np.float32))


def test_cli_plain_tf_function_says_to_wrap_it(tmp_path, capsys):
    from hlo_guard.cli import EXIT_OK, EXIT_USAGE, main

    module = tmp_path / "tfmodel.py"
    module.write_text(
        "import tensorflow as tf\nimport hlo_guard.tf\n\n"
        "def loss(x):\n    return tf.where(x > 0, tf.sqrt(x), 0.0)\n\n"
        "loss_guarded = hlo_guard.tf.guard(loss)\n"
    )
    for command in ("explain", "dump"):
        assert main([command, f"{module}:loss", "f32[4]"]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert "is a plain TensorFlow function" in err
        assert "`loss_guarded = hlo_guard.tf.guard(loss)`" in err
        assert f"`hlo-guard {command} {module}:loss_guarded ...`" in err
    # and the suggested command works
    assert main(["explain", f"{module}:loss_guarded", "f32[4]"]) == EXIT_OK
    assert "GUARD #1: Sqrt" in capsys.readouterr().out


@pytest.fixture
def tf_log():
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    tf.get_logger().addHandler(handler)
    yield buf
    tf.get_logger().removeHandler(handler)


def test_no_autograph_warning_for_lambdas(tf_log):
    for n in (2, 3, 4):
        x = tf.ones([n])
        for g in (
            hg.guard(lambda x: tf.where(x > 0, tf.sqrt(x), 0.0)),
            hg.guarded_function(lambda x: tf.where(x > 0, tf.sqrt(x), 0.0)),
        ):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = g(x)
            assert np.isfinite(tape.gradient(y, x).numpy()).all()
    assert "AutoGraph could not transform" not in tf_log.getvalue()
