"""A guarded gradient inside ``tf.function(jit_compile=True)`` is compiled once.

TF's own gradient of a nested function call passes the integer constants its
backward function needs (a gather's axis, a concat's axis, a transpose's
permutation) as outputs of the forward function; inside one XLA program TF
can then only get them by folding the step's *arguments* into constants, and
it compiles again for every new input value.  The guard's call avoids that
(:mod:`hlo_guard.tf.xla_gradient`).  The HLO of such a step takes its
arguments as parameters; before the fix its entry computation had none.
"""

import numpy as np
import pytest
import tensorflow as tf

import hlo_guard.tf as hg
from hlo_guard.tf import xla_gradient
from tests.test_tf_support import xla_grads


def _safe_sqrt(v):
    return tf.where(v > 0, tf.sqrt(v), 0.0)


def _safe_sqrt_dw(v):
    pos = v > 0
    return tf.where(pos, tf.sqrt(tf.where(pos, v, 1.0)), 0.0)


def _programs(sqrt):
    idx = tf.constant([2, 0, 1, 2, 0, 1, 1, 0], tf.int32)
    return {
        "gather_batch_dims": lambda x: sqrt(tf.gather(x, idx[: x.shape[0]], axis=1, batch_dims=1)),
        "gather": lambda x: sqrt(tf.gather(x, [0, 2], axis=1)),
        "concat": lambda x: sqrt(tf.concat([x, 2.0 * x], axis=1)),
        "transpose": lambda x: sqrt(tf.transpose(x) * 1.5),
        "pad": lambda x: sqrt(tf.pad(x, [[1, 1], [0, 0]])),
        "tile": lambda x: sqrt(tf.tile(x, [2, 1])),
        "reduce_max": lambda x: sqrt(tf.reduce_max(x, axis=1)),
    }


GUARDED = _programs(_safe_sqrt)
ORACLE = _programs(_safe_sqrt_dw)


def _step(fn):
    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(fn(x))
        return tape.gradient(y, x)

    return step


def _entry_takes_x(hlo: str) -> bool:
    """Whether the entry computation reads the [8, 3] argument as a parameter
    (folded into a constant, it is compiled in: once per value)."""
    entry = hlo[hlo.index("\nENTRY") :]
    body = entry[: entry.index("\n}")]
    return any(" parameter(" in line and "f32[8,3]" in line for line in body.splitlines())


def _inputs(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(8, 3)).astype(np.float32)
    x[0, 0] = 0.0  # sqrt'(0) behind the where
    return tf.constant(x)


@pytest.mark.parametrize("name", sorted(GUARDED))
def test_step_takes_its_arguments_as_parameters(name):
    step = _step(hg.guard(GUARDED[name]))
    hlo = step.experimental_get_compiler_ir(_inputs(0))(stage="hlo")
    assert _entry_takes_x(hlo), hlo[hlo.index("\nENTRY") :][:400]


@pytest.mark.parametrize("name", sorted(GUARDED))
def test_new_input_values_give_the_double_where_gradient(name):
    step = _step(hg.guard(GUARDED[name]))
    oracle = _step(ORACLE[name])
    for seed in range(3):
        x = _inputs(seed)
        got, want = step(x).numpy(), oracle(x).numpy()
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_second_derivative_and_variables_through_the_recomputed_gradient():
    """Nested tapes differentiate the recomputing backward function; a
    variable read by the program gets its gradient (IndexedSlices densified)."""
    table = tf.Variable(np.linspace(-1.0, 2.0, 12, dtype=np.float32).reshape(4, 3))
    guarded = hg.guard(lambda i: _safe_sqrt(tf.gather(table, i)) ** 3)

    @tf.function(jit_compile=True)
    def hvp(i):
        with tf.GradientTape() as outer:
            with tf.GradientTape() as inner:
                y = tf.reduce_sum(guarded(i))
            g = tf.convert_to_tensor(inner.gradient(y, table))
            z = tf.reduce_sum(g)
        return g, tf.convert_to_tensor(outer.gradient(z, table))

    i = tf.constant([0, 2, 2, 3], tf.int32)
    g, h = hvp(i)
    v = table.numpy()
    counts = np.bincount(i.numpy(), minlength=4)[:, None]
    pos = v > 0
    # d/dv sqrt(v)^3 = 1.5 sqrt(v); d2 = 0.75 / sqrt(v); 0 where v <= 0
    want_g = np.where(pos, 1.5 * np.sqrt(np.where(pos, v, 1.0)), 0.0) * counts
    want_h = np.where(pos, 0.75 / np.sqrt(np.where(pos, v, 1.0)), 0.0) * counts
    np.testing.assert_allclose(g.numpy(), want_g, rtol=1e-5)
    np.testing.assert_allclose(h.numpy(), want_h, rtol=1e-5)


def test_forward_mode_through_the_recomputed_gradient():
    guarded = hg.guard(GUARDED["concat"])

    @tf.function(jit_compile=True)
    def jvp(x, t):
        with tf.autodiff.ForwardAccumulator(x, t) as acc:
            y = guarded(x)
        return acc.jvp(y)

    @tf.function(jit_compile=True)
    def jvp_oracle(x, t):
        with tf.autodiff.ForwardAccumulator(x, t) as acc:
            y = ORACLE["concat"](x)
        return acc.jvp(y)

    x = _inputs(1)
    t = tf.ones_like(x)
    got = jvp(x, t).numpy()
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, jvp_oracle(x, t).numpy(), rtol=1e-6)


def test_structured_outputs_keep_their_structure():
    guarded = hg.guard(lambda x: {"y": _safe_sqrt(tf.concat([x, x], 1)), "n": None})

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = guarded(x)
            y = tf.reduce_sum(out["y"])
        assert out["n"] is None
        return tape.gradient(y, x)

    x = _inputs(2)
    want = 2 * np.where(x.numpy() > 0, 0.5 / np.sqrt(np.abs(x.numpy()) + (x.numpy() <= 0)), 0.0)
    np.testing.assert_allclose(step(x).numpy(), want, rtol=1e-6)


def _graph_def(fn, *specs):
    return tf.function(fn).get_concrete_function(*specs).graph.as_graph_def()


def test_only_programs_that_can_run_twice_are_recomputed():
    spec = tf.TensorSpec([4], tf.float32)
    assert xla_gradient.recomputable(_graph_def(lambda x: tf.sqrt(tf.concat([x, x], 0)), spec))
    # a random draw must happen once: its program keeps the wrapper's gradient
    assert not xla_gradient.recomputable(_graph_def(lambda x: x * tf.random.uniform([4]), spec))
    v = tf.Variable(tf.zeros([4]))
    assert xla_gradient.recomputable(_graph_def(lambda x: x * v, spec))
    assert not xla_gradient.recomputable(_graph_def(lambda x: v.assign_add(x), spec))

    def loop(x):
        return tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, tf.sqrt(y)), (0, x))[1]

    assert not xla_gradient.recomputable(_graph_def(loop, spec))


def test_stateful_program_keeps_the_wrapper_gradient_and_is_right():
    """A random draw inside the guarded program: the gradient must use the
    draw the forward pass made, not a second one."""
    guarded = hg.guard(lambda x: _safe_sqrt(x) * tf.random.uniform(tf.shape(x), 1.0, 2.0))

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = guarded(x)
            total = tf.reduce_sum(y)
        return y, tape.gradient(total, x)

    x = tf.constant([4.0, 0.0, -1.0, 9.0])
    y, g = step(x)
    scale = y.numpy()[[0, 3]] / np.sqrt([4.0, 9.0])
    np.testing.assert_allclose(g.numpy()[[0, 3]], scale * 0.5 / np.sqrt([4.0, 9.0]), rtol=1e-6)
    np.testing.assert_array_equal(g.numpy()[[1, 2]], [0.0, 0.0])


def test_control_flow_warns_and_stays_right():
    loop = hg.guard(
        lambda x: tf.while_loop(
            lambda i, y: i < 2,
            lambda i, y: (i + 1, _safe_sqrt(y) + 1.0),
            (0, x),
            maximum_iterations=2,
        )[1]
    )
    x = tf.constant([4.0, 0.0, -1.0])
    with pytest.warns(UserWarning, match="control flow"):
        (g,) = xla_grads(loop, x)
    s1 = np.sqrt(4.0)
    np.testing.assert_allclose(g, [0.5 / np.sqrt(s1 + 1.0) * 0.5 / s1, 0.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize("name", sorted(GUARDED))
def test_a_program_that_cannot_run_twice_builds_its_constants_locally(name):
    """A stateful op (a variable update) keeps the wrapper's own gradient; the
    ops whose gradients read an integer constant build it in the backward
    function (hlo_guard.tf.local_constants), so the step is compiled once."""
    import warnings

    calls = tf.Variable(0.0)

    def counted(x):
        with tf.control_dependencies([calls.assign_add(1.0)]):
            x = tf.identity(x)
        return GUARDED[name](x)

    assert not xla_gradient.recomputable(_graph_def(counted, tf.TensorSpec([8, 3], tf.float32)))
    step = _step(hg.guard(counted))
    oracle = _step(ORACLE[name])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hlo = step.experimental_get_compiler_ir(_inputs(0))(stage="hlo")
    assert _entry_takes_x(hlo), hlo[hlo.index("\nENTRY") :][:400]
    for seed in range(2):
        np.testing.assert_allclose(
            step(_inputs(seed)).numpy(), oracle(_inputs(seed)).numpy(), rtol=1e-6, atol=1e-7
        )
    assert calls.numpy() == 2.0  # the update ran once per call


def test_a_variable_argument_keeps_the_wrapper_and_is_right():
    import warnings

    v = tf.Variable([[4.0, 0.0, 9.0]])
    by_arg = hg.guard(lambda w: _safe_sqrt(tf.concat([w, w], axis=0)))

    @tf.function(jit_compile=True)
    def step():
        with tf.GradientTape() as tape:
            y = tf.reduce_sum(by_arg(v))
        return tape.gradient(y, v)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_allclose(step().numpy(), [[0.5, 0.0, 1.0 / 3.0]], rtol=1e-6)


def test_no_warning_outside_xla_or_without_a_tape():
    import warnings

    guarded = hg.guard(lambda x: _safe_sqrt(x) * tf.random.uniform(tf.shape(x)))
    x = tf.constant([4.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tf.function(guarded, jit_compile=True)(x)  # no tape: nothing to differentiate
        xla_grads(guarded, x, jit=False)  # no XLA: TF's gradient compiles nothing


def test_a_guarded_method_is_compiled_once_too():
    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.scale = tf.Variable(2.0)

        @hg.guard(input_signature=[tf.TensorSpec([8, 3], tf.float32)])
        def f(self, x):
            return GUARDED["concat"](x) * self.scale

    model = Model()

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(model.f(x))
        return tape.gradient(y, [x, model.scale])

    hlo = step.experimental_get_compiler_ir(_inputs(0))(stage="hlo")
    assert _entry_takes_x(hlo), hlo[hlo.index("\nENTRY") :][:400]
    oracle = _step(lambda x: ORACLE["concat"](x) * 2.0)
    for seed in range(2):
        gx, gs = step(_inputs(seed))
        np.testing.assert_allclose(gx.numpy(), oracle(_inputs(seed)).numpy(), rtol=1e-6)
        want_s = tf.reduce_sum(ORACLE["concat"](_inputs(seed))).numpy()
        np.testing.assert_allclose(gs.numpy(), want_s, rtol=1e-6)


def test_which_ops_build_their_constants_locally():
    from hlo_guard.tf.local_constants import needs_local_constants

    ops = {}

    @tf.function(autograph=False)
    def program(x, i):
        ops["concat"] = tf.concat([x, x], axis=0).op
        ops["transpose"] = tf.transpose(tf.reshape(x, [2, 2])).op
        ops["sum"] = tf.reduce_sum(x, axis=0).op  # its gradient reads the axis statically
        ops["int_only"] = tf.concat([i, i], axis=0).op  # nothing to differentiate
        ops["dynamic_axis"] = tf.concat([x, x], axis=i[0]).op  # not a Const
        ops["random"] = tf.random.uniform([4]).op  # stateful
        lst = tf.raw_ops.TensorListFromTensor(tensor=x, element_shape=tf.constant([], tf.int32))
        ops["list"] = lst.op  # a variant output
        return x

    program.get_concrete_function(tf.TensorSpec([4], tf.float32), tf.TensorSpec([2], tf.int32))
    wanted = {name: needs_local_constants(op) for name, op in ops.items()}
    assert wanted == {
        "concat": True,
        "transpose": True,
        "sum": False,
        "int_only": False,
        "dynamic_axis": False,
        "random": False,
        "list": False,
    }


@pytest.mark.parametrize("path", ["recomputed", "localized"])
def test_a_taken_singularity_stays_infinite(path):
    """d sqrt(|x|) at 0 (inf * sign(0)) on a lane the program really takes is
    non-finite in the plain gradient; neither gradient path may hide it, nor
    let the dead lane's NaN leak next to it."""
    calls = tf.Variable(0.0)

    def program(x):
        if path == "localized":
            with tf.control_dependencies([calls.assign_add(1.0)]):
                x = tf.identity(x)
        z = tf.concat([x, x], axis=1)
        return tf.sqrt(tf.abs(z)) + _safe_sqrt(z)

    x = np.array([[0.0, 4.0, -1.0]], np.float32)
    got = _step(hg.guard(program))(tf.constant(x)).numpy()
    assert not np.isfinite(got[0, 0])  # |0|: taken, genuinely singular
    want = 2 * (0.5 / np.sqrt([4.0, 1.0]) * [1.0, -1.0] + [0.5 / 2.0, 0.0])
    np.testing.assert_allclose(got[0, 1:], want, rtol=1e-6)
