"""One guard called from different kinds of context: eagerly, in a plain
``tf.function`` and under ``tf.function(jit_compile=True)``, in any order.

A user debugs a step eagerly and then compiles it (or evaluates a model
eagerly between compiled training steps).  The user's own function is
traced inline by every caller and works in each; so must the guard.  TF's
gradient of a ``tf.cond``/``tf.switch_case`` edits the differentiated op for
the context it is differentiated in (``Optional`` intermediates outside XLA,
which XLA cannot compile) and re-registers its branches under derived names;
a guarded program shared between contexts, or one whose branches kept the
traced names, failed to compile or to register the second time.

Oracle: the hand-written double where, run in the same context.
"""

import warnings

import numpy as np
import pytest
import tensorflow as tf

import hlo_guard.tf as hg

X = tf.constant([-1.0, 0.0, 1.0, 4.0])


def where_sqrt(x):
    return tf.where(x > 0, tf.sqrt(x), 0.0)


def where_sqrt_oracle(x):
    return tf.where(x > 0, tf.sqrt(tf.where(x > 0, x, 1.0)), 0.0)


def positive(x):
    return tf.reduce_sum(x) > 0


def cond_of(inner):
    return lambda x: tf.cond(positive(x), lambda: inner(x), lambda: x)


def case_of(inner):
    return lambda x: tf.switch_case(
        tf.cast(positive(x), tf.int32), [lambda: x * 2.0, lambda: inner(x)]
    )


def loop_of(inner):
    # XLA differentiates a tf.while_loop only with maximum_iterations (TF's own rule)
    return lambda x: tf.while_loop(
        lambda i, a: i < 3,
        lambda i, a: (i + 1, a + inner(x)),
        (0, tf.zeros_like(x)),
        maximum_iterations=3,
    )[1]


CASES = {
    "cond": (cond_of(where_sqrt), cond_of(where_sqrt_oracle)),
    # nothing to guard in the branches: copied as they are
    "cond_unguarded_branches": (
        cond_of(lambda x: tf.sqrt(x * x + 1.0)),
        cond_of(lambda x: tf.sqrt(x * x + 1.0)),
    ),
    # a genuine singularity: the live sqrt at 0 (inf) and at -1 (NaN) stays as
    # the plain program has it, in every context
    "cond_genuine_singularity": (cond_of(tf.sqrt), cond_of(tf.sqrt)),
    "switch_case": (case_of(where_sqrt), case_of(where_sqrt_oracle)),
    "while_loop": (loop_of(where_sqrt), loop_of(where_sqrt_oracle)),
}

ORDERS = [
    ("eager", "xla"),
    ("function", "xla"),
    ("xla", "eager"),
    ("xla", "function", "xla"),
]


def gradient_in(context: str, fn):
    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(fn(x))
        return tape.gradient(y, x)

    if context == "eager":
        return step(X).numpy()
    return tf.function(step, jit_compile=context == "xla")(X).numpy()


@pytest.mark.parametrize("order", ORDERS, ids=["-then-".join(o) for o in ORDERS])
@pytest.mark.parametrize("name", list(CASES))
def test_one_guard_in_every_context_in_any_order(name, order):
    fn, oracle = CASES[name]
    guarded = hg.guard(fn)
    with warnings.catch_warnings():
        # under XLA a program with control flow keeps TF's nested-function
        # gradient and says so; that warning is not what is tested here
        warnings.simplefilter("ignore", UserWarning)
        for context in order:
            got = gradient_in(context, guarded)
            np.testing.assert_array_equal(got, gradient_in(context, oracle), err_msg=context)
            if name == "cond_genuine_singularity":
                assert np.isnan(got[0]) and np.isinf(got[1]), (context, got)


def test_the_unguarded_program_fails_in_that_order_without_its_own_copy():
    """Not vacuous: a ``tf.function`` shared between an eager gradient and an
    XLA one -- what the guard's program was -- fails to compile under XLA."""
    shared = tf.function(cond_of(where_sqrt_oracle))
    gradient_in("eager", shared)
    with pytest.raises(tf.errors.InvalidArgumentError, match="OptionalFromValue"):
        gradient_in("xla", shared)


@pytest.mark.parametrize("order", [("xla", "function", "eager"), ("function", "xla", "eager")])
def test_a_captured_variable_keeps_its_gradient_in_every_context(order):
    """The second context's program is built from the user's trace made for
    the first, so no variable read is traced inside it again: it must still
    list the variable it reads, or an eager tape's gradient is None."""
    w = tf.Variable([0.5, -0.3, 2.0, 1.0])

    def fn(x):
        return tf.cond(positive(x), lambda: where_sqrt(x * w), lambda: x)

    def oracle(x):
        return tf.cond(positive(x), lambda: where_sqrt_oracle(x * w), lambda: x)

    def gradient_wrt_w(context, f):
        def step(x):
            with tf.GradientTape() as tape:
                y = tf.reduce_sum(f(x))
            return tape.gradient(y, w)

        if context == "eager":
            return step(X).numpy()
        return tf.function(step, jit_compile=context == "xla")(X).numpy()

    guarded = hg.guard(fn)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for context in order:
            np.testing.assert_array_equal(
                gradient_wrt_w(context, guarded), gradient_wrt_w(context, oracle), err_msg=context
            )


def test_each_build_renames_every_function_it_imports_consistently():
    """Every function name a build imports is its own: in the nodes, the
    functions' signatures and bodies, and the tables keyed by name."""
    from hlo_guard.tf.function_names import with_fresh_function_names
    from hlo_guard.tf.tracing import trace

    def fn(x):
        inner = tf.cond(positive(x), lambda: where_sqrt(x), lambda: x)
        return loop_of(lambda y: tf.cond(positive(y), lambda: y, lambda: -y))(inner)

    traced = trace(tf.function(fn), (X,), {})
    original = {f.signature.name for f in traced.graph_def.library.function}
    assert len(original) >= 4  # two conds, a loop's body and condition, a nested cond
    first, second = with_fresh_function_names(traced), with_fresh_function_names(traced)
    for build in (first, second):
        defined = {f.signature.name for f in build.graph_def.library.function}
        assert not defined & original
        named = set()
        nodes = list(build.graph_def.node)
        nodes += [n for f in build.graph_def.library.function for n in f.node_def]
        for node in nodes:
            for value in node.attr.values():
                if value.WhichOneof("value") == "func":
                    named.add(value.func.name)
                elif value.WhichOneof("value") == "list":
                    named.update(f.name for f in value.list.func)
        assert named and named <= defined
        assert set(build.shaped_functions) <= defined
        assert {f.signature.name for f in build.shaped_functions.values()} <= defined
        assert set(build.body_locations) & defined
    assert not {f.signature.name for f in first.graph_def.library.function} & {
        f.signature.name for f in second.graph_def.library.function
    }
    # the traced program itself is left as it was (it is shared by every build)
    assert {f.signature.name for f in traced.graph_def.library.function} == original
