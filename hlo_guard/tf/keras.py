"""Keras 3 (TensorFlow backend) integration: guarded ``model.fit``.

Keras's ``train_step`` runs the model and the loss *inside* a
``tf.GradientTape`` and differentiates right there.  A guard must see the
forward program before the tape records it (guards inside a tape-using
function change nothing), so the guard goes on "forward + loss" and the tape
stays outside -- which is exactly what :func:`guarded_train_step` does.  It is
Keras 3's own TF ``train_step`` line for line, with ``y_pred`` and the loss
computed by one guarded function per model.  Two ways to switch it on:

    model.compile(optimizer, loss=masked_loss, jit_compile=True)
    hlo_guard.tf.keras.guard_train_step(model)      # one line, any model
    model.fit(x, y)

    class MyModel(hlo_guard.tf.keras.GuardedTrainStep, keras.Model):  # subclass
        ...

Evaluation and prediction are unchanged (they take no gradients).  A model
whose class writes its own ``train_step`` is refused by ``guard_train_step``:
put ``hlo_guard.tf.guard`` on that step's forward+loss function instead (the
recipe in README.md).
"""

from __future__ import annotations

import types

import tensorflow as tf

from hlo_guard.errors import GuardUsageError
from hlo_guard.tf import compat
from hlo_guard.tf.api import GuardedTFFunction, guard

__all__ = ["GuardedTrainStep", "guard_train_step", "guarded_forward", "guarded_train_step"]

_FORWARD_ATTR = "_hlo_guard_forward"


def _keras():
    import keras

    if keras.backend.backend() != "tensorflow":
        raise GuardUsageError(
            f"hlo_guard.tf.keras needs the TensorFlow Keras backend, but "
            f"keras.backend.backend() is {keras.backend.backend()!r}; set "
            f"KERAS_BACKEND=tensorflow (or guard a JAX-backend model with hlo_guard.guard)"
        )
    return keras


def guarded_forward(model) -> GuardedTFFunction:
    """The guarded ``(x, y, sample_weight) -> (y_pred, loss)`` of ``model``'s
    training step (made once per model; its ``report(x, y, sample_weight)``
    shows the guards ``fit`` uses)."""
    forward = model.__dict__.get(_FORWARD_ATTR)
    if forward is None:

        def forward_and_loss(x, y, sample_weight):
            if model._call_has_training_arg:
                y_pred = model(x, training=True)
            else:
                y_pred = model(x)
            loss = model._compute_loss(
                x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
            )
            # y_pred leaves for the metrics only: the step differentiates the
            # loss alone.  Returned as it is, it would be a fully live output,
            # and every lane the loss masks would count as live through it --
            # no guard inside the model (a padded sample's 0 / 0) would be placed
            return tf.nest.map_structure(tf.stop_gradient, y_pred), loss

        forward_and_loss.__qualname__ = f"{type(model).__name__}.forward_and_loss"
        forward = guard(forward_and_loss)
        # plain attribute: Keras's layer tracking must not treat it as state
        object.__setattr__(model, _FORWARD_ATTR, forward)
    return forward


def guarded_train_step(model, data):
    """Keras 3's TensorFlow ``train_step`` with forward+loss guarded."""
    keras = _keras()

    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    forward = guarded_forward(model)
    with tf.GradientTape() as tape:
        y_pred, loss = forward(x, y, sample_weight)
        first_input = next(i for i in tf.nest.flatten(x) if i is not None)
        model._loss_tracker.update_state(
            compat.unscale_loss_for_distribution(loss), sample_weight=tf.shape(first_input)[0]
        )
        if model.optimizer is not None:
            loss = model.optimizer.scale_loss(loss)
    if model.trainable_weights:
        weights = model.trainable_weights
        gradients = tape.gradient(loss, weights)
        model.optimizer.apply_gradients(zip(gradients, weights))
    else:
        import warnings

        warnings.warn("The model does not have any trainable weights.", stacklevel=2)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


class GuardedTrainStep:
    """Mixin for subclassed models: ``class M(GuardedTrainStep, keras.Model)``
    trains with forward+loss guarded (see :func:`guarded_train_step`)."""

    def train_step(self, data):
        return guarded_train_step(self, data)


def guard_train_step(model):
    """Make ``model.fit`` train with forward+loss guarded; returns ``model``.

    Works before or after ``compile``; call it before ``fit`` (an existing
    compiled train function is dropped so the next ``fit`` rebuilds it).
    """
    keras = _keras()
    if not isinstance(model, keras.Model):
        raise GuardUsageError(
            f"hlo_guard.tf.keras.guard_train_step expects a keras.Model, got "
            f"{type(model).__name__}; for a layer or function use hlo_guard.tf.guard"
        )
    TensorFlowTrainer = compat.keras_tensorflow_trainer()
    own = type(model).train_step
    if own is not TensorFlowTrainer.train_step and own is not GuardedTrainStep.train_step:
        raise GuardUsageError(
            f"{type(model).__name__} defines its own train_step, which guard_train_step "
            f"would replace; instead guard its forward+loss inside it: "
            f"`y_pred, loss = hlo_guard.tf.guard(forward_and_loss)(x, y)` under the "
            f"GradientTape (the tape stays outside the guarded function)"
        )
    # an instance attribute, so other models of the class are untouched
    object.__setattr__(model, "train_step", types.MethodType(guarded_train_step, model))
    model.train_function = None
    return model
