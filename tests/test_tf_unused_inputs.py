"""Inputs the traced graph does not read, and outputs that read no input.

Before the fix every such function died inside ``import_graph_def`` ("Attempted
to map inputs that were not found in graph_def"): a Keras loss ignoring
``y_true``, ``tf.cond`` with a constant branch, autograph loops whose counter
folds away, TensorArray loops, Ragged/Sparse arguments.  Forward values and
gradients are compared with hand-written double-where programs run under the
same XLA compilation.
"""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import assert_same

import hlo_guard.tf as hg

X = tf.constant([-1.0, 0.0, 1.0, 4.0])


def safe_sqrt(x):
    """The double-where oracle of ``where(x > 0, sqrt(x), 0)``."""
    return tf.where(x > 0, tf.sqrt(tf.where(x > 0, x, tf.ones_like(x))), tf.zeros_like(x))


def where_sqrt(x):
    return tf.where(x > 0, tf.sqrt(x), tf.zeros_like(x))


def jit_value_and_grads(fn, *xs):
    """(outputs, d sum(outputs) / d each x, zeros for an x no output reads),
    inside tf.function(jit_compile=True)."""
    xs = [tf.convert_to_tensor(x) for x in xs]

    @tf.function(jit_compile=True)
    def run(*xs):
        with tf.GradientTape() as tape:
            for x in xs:
                tape.watch(x)
            out = fn(*xs)
            total = tf.add_n(
                [tf.reduce_sum(t) for t in tf.nest.flatten(out) if t.dtype.is_floating]
            )
        grads = tape.gradient(total, list(xs), unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return out, grads

    out, grads = run(*xs)
    return tf.nest.map_structure(lambda t: t.numpy(), out), [g.numpy() for g in grads]


def check_against(fn, oracle, *xs):
    out, grads = jit_value_and_grads(hg.guard(fn), *xs)
    e_out, e_grads = jit_value_and_grads(oracle, *xs)
    for a, e in zip(tf.nest.flatten(out), tf.nest.flatten(e_out)):
        assert_same(a, e)
    for g, e in zip(grads, e_grads):
        assert np.isfinite(g).all()
        assert_same(g, e)


def test_keras_loss_ignoring_y_true():
    def loss(y_true, y_pred):
        return tf.reduce_mean(where_sqrt(y_pred))

    def oracle(y_true, y_pred):
        return tf.reduce_mean(safe_sqrt(y_pred))

    check_against(loss, oracle, tf.ones([4]), X)
    # the guarded_function form (jit_compile=True) called eagerly, as Keras would
    f = hg.guarded_function(loss)
    np.testing.assert_allclose(f(tf.ones([4]), X).numpy(), oracle(tf.ones([4]), X).numpy())


def test_keras_loss_object_ignoring_y_true_in_fit():
    keras = pytest.importorskip("keras")

    def masked_sqrt_loss(y_true, y_pred):  # y_true deliberately unused
        return tf.reduce_mean(where_sqrt(y_pred[:, 0]))

    loss = hg.guard(masked_sqrt_loss)
    model = keras.Sequential(
        [keras.Input((1,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="ones")]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss, jit_compile=True)
    x = np.array([[-1.0], [0.0], [1.0], [4.0]], np.float32)
    model.fit(x, np.zeros((4, 1), np.float32), epochs=1, batch_size=4, verbose=0)
    w = model.layers[0].kernel.numpy()
    assert np.isfinite(w).all()
    # oracle: d/dw mean(safe_sqrt(w x)) at w = 1 is mean(x / (2 sqrt(x)) for x > 0)
    expected = 1.0 - 0.1 * np.mean([0, 0, 0.5, 1.0])
    np.testing.assert_allclose(w, [[expected]], rtol=1e-6)


def test_cond_with_constant_branch():
    def fn(x, flag):
        return tf.cond(flag > 0, lambda: where_sqrt(x), lambda: tf.zeros_like(x))

    def oracle(x, flag):
        return tf.cond(flag > 0, lambda: safe_sqrt(x), lambda: tf.zeros_like(x))

    check_against(fn, oracle, X, tf.constant(1.0))
    check_against(fn, oracle, X, tf.constant(-1.0))


def test_cond_branch_ignoring_every_input():
    def fn(x):
        return tf.cond(tf.reduce_sum(x) > 100.0, lambda: tf.constant(1.0), lambda: tf.constant(2.0))

    out, grads = jit_value_and_grads(hg.guard(fn), X)
    assert out == 2.0
    np.testing.assert_array_equal(grads[0], np.zeros(4))


def test_autograph_for_range():
    def fn(x, n):
        s = tf.zeros_like(x)
        for _ in tf.range(n):
            s += where_sqrt(x)
        return s

    def oracle(x, n):
        s = tf.zeros_like(x)
        for _ in tf.range(n):
            s += safe_sqrt(x)
        return s

    check_against(fn, oracle, X, tf.constant(3))


def test_tensor_array_loop():
    def fn(x):
        arr = tf.TensorArray(tf.float32, size=3)
        for i in tf.range(3):
            arr = arr.write(i, where_sqrt(x) * tf.cast(i + 1, tf.float32))
        return arr.stack()

    def oracle(x):
        return tf.stack([safe_sqrt(x) * float(i + 1) for i in range(3)])

    check_against(fn, oracle, X)


def test_constant_outputs():
    def fn(x):
        return where_sqrt(x), tf.constant(3.0), tf.ones([2])

    def oracle(x):
        return safe_sqrt(x), tf.constant(3.0), tf.ones([2])

    check_against(fn, oracle, X)


def test_only_constant_output():
    out, grads = jit_value_and_grads(hg.guard(lambda x: tf.constant([1.0, 2.0])), X)
    np.testing.assert_array_equal(out, [1.0, 2.0])
    np.testing.assert_array_equal(grads[0], np.zeros(4))


def test_ragged_argument():
    rt = tf.ragged.constant([[-1.0, 0.0], [1.0, 4.0, 9.0]])

    def fn(r):
        return tf.reduce_sum(tf.ragged.map_flat_values(where_sqrt, r), axis=1)

    def grad(f):
        @tf.function(jit_compile=False)
        def run(values):
            with tf.GradientTape() as tape:
                tape.watch(values)
                r = tf.RaggedTensor.from_row_splits(values, rt.row_splits)
                y = tf.reduce_sum(f(r))
            return y, tape.gradient(y, values)

        return [t.numpy() for t in run(rt.flat_values)]

    got = grad(hg.guard(fn))
    expected = grad(lambda r: tf.reduce_sum(tf.ragged.map_flat_values(safe_sqrt, r), axis=1))
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    assert np.isfinite(got[1]).all()


def test_sparse_argument():
    st = tf.sparse.SparseTensor([[0, 0], [0, 1], [1, 0], [1, 1]], X, [2, 2])

    def fn(s):
        return tf.sparse.reduce_sum(
            tf.SparseTensor(s.indices, where_sqrt(s.values), s.dense_shape), axis=1
        )

    def grad(f):
        @tf.function
        def run(values):
            with tf.GradientTape() as tape:
                tape.watch(values)
                y = tf.reduce_sum(f(tf.SparseTensor(st.indices, values, st.dense_shape)))
            return y, tape.gradient(y, values)

        return [t.numpy() for t in run(st.values)]

    got = grad(hg.guard(fn))
    expected = grad(
        lambda s: tf.sparse.reduce_sum(
            tf.SparseTensor(s.indices, safe_sqrt(s.values), s.dense_shape), axis=1
        )
    )
    assert_same(got[0], expected[0])
    assert_same(got[1], expected[1])
    assert np.isfinite(got[1]).all()


def test_ragged_argument_whose_row_splits_are_unused():
    """Only the values are read: the row-splits component is an unused input."""
    rt = tf.ragged.constant([[-1.0, 0.0], [1.0, 4.0, 9.0]])
    guarded = hg.guard(lambda r: where_sqrt(r.flat_values))
    np.testing.assert_array_equal(guarded(rt).numpy(), where_sqrt(rt.flat_values).numpy())

    @tf.function(jit_compile=True)
    def grad(values, splits):
        with tf.GradientTape() as tape:
            tape.watch(values)
            y = tf.reduce_sum(guarded(tf.RaggedTensor.from_row_splits(values, splits)))
        return tape.gradient(y, values)

    got = grad(rt.flat_values, rt.row_splits).numpy()
    _, expected = jit_value_and_grads(safe_sqrt, rt.flat_values)
    assert_same(got, expected[0])


def test_sparse_argument_whose_indices_are_unused():
    st = tf.sparse.SparseTensor([[0, 0], [0, 1], [1, 0], [1, 1]], X, [2, 2])
    guarded = hg.guard(lambda s: where_sqrt(s.values))
    np.testing.assert_array_equal(guarded(st).numpy(), where_sqrt(X).numpy())
    out, grads = jit_value_and_grads(
        lambda v: guarded(tf.SparseTensor(st.indices, v, st.dense_shape)), X
    )
    e_out, e_grads = jit_value_and_grads(safe_sqrt, X)
    assert_same(out, e_out)
    assert_same(grads[0], e_grads[0])


def _reads_v_and_u_and_drops_them(v, w):
    def f(x, u):
        _dropped = tf.sqrt(u) * v  # computed, never returned (an unused attention output)
        return tf.where(x > 0, tf.sqrt(x), 0.0) * w

    return f


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_a_variable_no_output_reads_gets_no_gradient(jit):
    """``tape.gradient`` gives None for a variable (or an input) that the
    function reads but no output depends on, as plain TF does: an optimizer
    skips it, ``g is None`` tests hold.  Under XLA the guarded call's
    recomputed gradient returned zeros (a hunt, 2026-11-28), so momentum and
    weight decay moved such a variable."""
    v, w = tf.Variable([1.0, 2.0, 3.0, 4.0]), tf.Variable([3.0, 4.0, 5.0, 6.0])
    u = tf.constant([1.0, 2.0, 3.0, 4.0])
    f = _reads_v_and_u_and_drops_them(v, w)

    def run(fn):
        @tf.function(jit_compile=jit)
        def step(x, u):
            with tf.GradientTape() as tape:
                tape.watch(u)
                y = tf.reduce_sum(fn(x, u))
            return tape.gradient(y, [v, w, u])

        return step(X, u)

    plain, guarded = run(f), run(hg.guard(f))
    assert plain[0] is None and guarded[0] is None
    assert plain[2] is None and guarded[2] is None
    oracle = run(lambda x, u: safe_sqrt(x) * w)[1]
    np.testing.assert_array_equal(guarded[1].numpy(), oracle.numpy())
