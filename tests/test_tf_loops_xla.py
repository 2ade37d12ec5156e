"""Loops inside a guarded TF function, differentiated under XLA.

Every Keras RNN layer is a ``tf.while_loop``.  Imported into the guarded
wrapper, a loop lost what TF's own ``while_v2`` keeps on the op: the Python
graphs of its body and condition (with every static shape) and the handle
data of its resource and variant loop variables.  Its gradient then rebuilt
the body from the bare ``FunctionDef``: a variable read had no shape, the
gradient of a broadcasting add computed its axes at run time, and XLA refused
it ("BroadcastGradientArgs must be a compile-time constant"); and a guarded
body's custom gradients closed over masks of a graph the rebuilt body was not
("out of scope", in every mode: a masked Keras LSTM could not train).  Found
by a helper trying Keras RNNs, 2026-11-26 (``hlo_guard/tf/loop_bodies.py``,
``control.guard_function``).  Oracle: the plain function, which has no guard
to need here (no dead lane reaches a singular op), in the same mode.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import hlo_guard.tf as hg

X = tf.constant(
    [[[1.0, 1.0], [2.0, 1.0], [0.0, 0.0]], [[0.5, 1.0], [0.0, 0.0], [0.0, 0.0]]]
)  # [batch, time, features], zero-padded steps


def _rnn(w, b, masked: bool):
    def fn(x):
        def body(t, h):
            xt = x[:, t]
            hn = tf.tanh(tf.matmul(h, w) + b + xt)
            if masked:  # what Keras does for a masked RNN: keep h on padded steps
                hn = tf.where(tf.reduce_any(xt != 0, -1)[:, None], hn, h)
            return t + 1, hn

        _, h = tf.while_loop(lambda t, h: t < 3, body, (0, tf.ones([2, 2])), maximum_iterations=3)
        return tf.reduce_sum(h)

    return fn


def _grads(fn, variables, mode):
    def step(x):
        with tf.GradientTape() as tape:
            y = fn(x)
        return tape.gradient(y, variables)

    run = step if mode == "eager" else tf.function(step, jit_compile=mode == "xla")
    return [g.numpy() for g in run(X)]


@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
@pytest.mark.parametrize("mode", ["xla", "graph", "eager"])
def test_an_rnn_loop_differentiates_like_the_plain_function(mode, masked):
    w = tf.Variable([[0.5, -0.3], [0.2, 0.8]])
    b = tf.Variable([0.1, 0.2])
    fn = _rnn(w, b, masked)
    want = _grads(fn, [w, b], mode)
    got = _grads(hg.guard(fn), [w, b], mode)
    for g, o in zip(got, want):
        np.testing.assert_allclose(g, o, rtol=1e-6, atol=1e-7)


def test_one_guard_used_eagerly_then_under_xla():
    """The order a user tries things in: the same guarded function called
    eagerly, then in a graph, then compiled.  The wrapper (and the gradient
    TF built for it) is reused, and the XLA gradient failed to compile."""
    w = tf.Variable([[0.5, -0.3], [0.2, 0.8]])
    b = tf.Variable([0.1, 0.2])
    fn = _rnn(w, b, masked=False)
    g = hg.guard(fn)
    for mode in ("eager", "graph", "xla"):
        for got, want in zip(_grads(g, [w, b], mode), _grads(fn, [w, b], mode)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_a_variable_read_through_a_loop_keeps_its_handle_data():
    """A ``map_fn`` reading a variable, one guard used under XLA, then in
    graph mode, then eagerly: the loop's resource output had no handle data,
    and the eager gradient failed ("a variable without handle data")."""
    w = tf.Variable([0.5, -0.3])
    rows = tf.constant([[1.0, 1.0], [0.0, 0.0], [4.0, 0.0]])

    def fn(x):
        return tf.reduce_sum(tf.map_fn(lambda r: tf.where(r > 0, r * w, 0.0), x))

    g = hg.guard(fn)
    for mode in ("xla", "graph", "eager"):

        def step(x, f):
            with tf.GradientTape() as tape:
                y = f(x)
            return tape.gradient(y, w)

        run = step if mode == "eager" else tf.function(step, jit_compile=mode == "xla")
        np.testing.assert_allclose(run(rows, g).numpy(), [5.0, 1.0])
