"""The places where hlo_guard reaches into TensorFlow internals, kept together.

TF 2.21 has no public API for the few things below; each function says what
it is for and why the public API does not do.  Every other module uses only
``tf.*`` (``tests/test_module_structure.py`` checks that no module but this
one and ``hlo_guard.jax_frontend.compat`` imports a private framework module).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf


def variable_accessed(var) -> None:
    """Tell the active ``GradientTape``\\ s that ``var`` is read.

    The guarded wrapper reads variables through handles captured by an
    imported graph, so no ``ReadVariableOp`` is recorded on the tape in eager
    mode and ``tape.gradient(loss, var)`` would be None.  ``ReadVariableOp``
    notifies the tapes with this very call; there is no public equivalent
    (``tape.watch`` only reaches the tapes the caller holds).

    The graph being traced is told too, as ``ReadVariableOp`` tells it
    (``FuncGraph.watch_variable``): a function's variables are the ones read
    while it was traced, and an eager tape watches them when it is called.
    Without it, a wrapper traced after the user's function was already
    traced (for another calling context) listed no variable, and an eager
    ``tape.gradient(loss, var)`` through it was None."""
    from tensorflow.python.eager import tape as tape_lib

    graph = tf.compat.v1.get_default_graph()
    if hasattr(graph, "watch_variable"):
        graph.watch_variable(var)
    tape_lib.variable_accessed(var)


def function_def_to_graph(fdef, input_shapes=None):
    """A ``FuncGraph`` for a ``FunctionDef`` (the body of a ``While``/``If``),
    so that the analysis can look inside control flow; TF exposes no public
    way to rebuild a graph from a function definition."""
    from tensorflow.python.framework import function_def_to_graph as fdtg

    return fdtg.function_def_to_graph(fdef, input_shapes=input_shapes)


def reduced_shape(input_shape, axes):
    """The shape of a reduction with ``keepdims=True`` as a tensor (TF's own
    reduction gradients use it; computing it by hand would need the same
    handling of negative and dynamic axes)."""
    from tensorflow.python.ops import math_ops

    return math_ops.reduced_shape(input_shape, axes)


def disable_lower_using_switch_merge(graph_def):
    """Mark the functional ``If``/``While`` ops of ``graph_def`` so that
    grappler keeps them functional instead of lowering them to
    ``Switch``/``Merge`` (which the rewrite does not follow)."""
    from tensorflow.python.framework import convert_to_constants

    return convert_to_constants.disable_lower_using_switch_merge(graph_def)


def inline_functions(graph_def, fetch: Sequence[str]):
    """``graph_def`` with every nested function call inlined, by grappler's
    function optimizer (the only inliner TF has; ``tf.function`` inlines
    only when it runs the graph, not in the ``GraphDef`` we analyse)."""
    from tensorflow.core.protobuf import rewriter_config_pb2
    from tensorflow.python.grappler import tf_optimizer

    meta = tf.compat.v1.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    meta.collection_def["train_op"].node_list.value.extend(fetch)
    config = tf.compat.v1.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.min_graph_nodes = -1
    rewrite.optimizers.append("function")
    rewrite.function_optimization = rewriter_config_pb2.RewriterConfig.AGGRESSIVE
    return tf_optimizer.OptimizeGraph(config, meta)


# -- editing a graph in place ------------------------------------------------------
# The rewrite edits the imported graph before it is run: it re-points input
# edges at guards and creates ops from a NodeDef's attributes.  ``tf.Graph``
# has no public editing API (graphs are meant to be built once); these are the
# methods TF's own ``import_graph_def`` and control-flow code use.


def create_op(graph, op_type: str, inputs, dtypes, name: str, attrs):
    """Create an op of ``op_type`` from raw ``AttrValue``\\ s (the public
    ``raw_ops`` need Python values and an op-specific signature)."""
    return graph._create_op_internal(  # pylint: disable=protected-access
        op_type, list(inputs), dtypes=dtypes, name=name, attrs=attrs
    )


def int_list_attr(values) -> object:
    """A raw ``AttrValue`` holding a list of ints (a copied op's
    ``dilations``), for :func:`create_op`."""
    return tf.compat.v1.AttrValue(list=tf.compat.v1.AttrValue.ListValue(i=list(values)))


def update_input(op, index: int, tensor) -> None:
    """Re-point input ``index`` of ``op`` at ``tensor`` (a guard)."""
    op._update_input(index, tensor)  # pylint: disable=protected-access


def move_control_outputs(old_op, new_op) -> None:
    """Give ``new_op`` every control dependant of ``old_op``."""
    for consumer in old_op._control_outputs:  # pylint: disable=protected-access
        consumer._add_control_input(new_op)  # pylint: disable=protected-access


def graph_function(graph, name: str):
    """The function ``name`` registered in ``graph`` (a loop body), to read its
    ``FunctionDef``; a ``tf.Graph`` lists its functions only privately."""
    return graph._get_function(name)  # pylint: disable=protected-access


def function_def(graph, name: str):
    """The ``FunctionDef`` of the function ``name`` registered in ``graph``
    (a loop body, a branch); LookupError when there is none."""
    fn = graph_function(graph, name)
    if fn is None:
        raise LookupError(f"function {name!r} not found")
    return fn.cached_definition if hasattr(fn, "cached_definition") else fn.definition


# -- Keras 3 internals (hlo_guard.tf.keras) ----------------------------------------


def unscale_loss_for_distribution(loss):
    """Keras's own un-scaling of a loss before its loss tracker sees it; the
    guarded ``train_step`` repeats Keras's TF ``train_step`` step by step, and
    Keras 3 does not export this helper."""
    from keras.src.losses.loss import unscale_loss_for_distribution as unscale

    return unscale(loss)


def keras_tensorflow_trainer():
    """Keras's TF trainer class, to tell whether a model still has Keras's own
    ``train_step`` (no public name for it in Keras 3)."""
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    return TensorFlowTrainer


def in_xla_context() -> bool:
    """Whether the graph being built is compiled by XLA: traced inside
    ``tf.function(jit_compile=True)`` (or nested in one).  TF marks that with
    an XLA control-flow context, which it reads itself through this private
    helper (``tf.while_loop`` uses it to pick its XLA form)."""
    from tensorflow.python.ops import control_flow_util

    return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))


def tape_may_record() -> bool:
    """Whether a ``GradientTape`` or ``ForwardAccumulator`` is active that may
    record the next operation (TF's own check before recording one)."""
    from tensorflow.python.eager import record

    return bool(record.could_possibly_record())


def op_type_is_stateful(op_type: str) -> bool:
    """Whether TF registers ``op_type`` as stateful (unknown types count as
    stateful).  The op registry is how TF itself answers this for a node of a
    GraphDef, which has no ``tf.Operation`` to ask."""
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(op_type)
    return True if op_def is None else bool(op_def.is_stateful)


def registered_gradient(op_type: str):
    """TF's registered gradient function for ``op_type`` (``fn(op, *grads)``),
    the one ``tf.gradients`` calls.  Calling it directly on a probe copy skips
    ``tf.gradients``' walk of the graph (milliseconds per call at trace time)."""
    from tensorflow.python.framework import ops

    return ops.gradient_registry.lookup(op_type)


def custom_gradient_function(override_name: str):
    """The gradient function a ``tf.custom_gradient`` gave TF under
    ``override_name`` (a graph's ``IdentityN`` ``_gradient_op_type``), or
    None when the registered function is not ``custom_gradient``'s wrapper.
    In graph mode TF registers ``internal_grad_fn``, which closes over
    ``tape_grad_fn``, which closes over the user's ``grad_fn``."""
    try:
        fn = registered_gradient(override_name)
    except LookupError:
        return None
    for wrapper in ("tape_grad_fn", "grad_fn"):
        cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
        cell = cells.get(wrapper)
        if cell is None:
            return None
        fn = cell.cell_contents
        if not callable(fn):
            return None
    return fn


def copy_handle_data(source, target) -> None:
    """Copy a resource tensor's handle data (the shape and dtype of the
    variable behind it) onto another resource tensor, as TF's control-flow
    code does for the arguments of the bodies it builds."""
    from tensorflow.python.ops import handle_data_util

    handle_data_util.copy_handle_data(source, target)


def register_function_defs(fdefs) -> None:
    """Make functions resolvable by name wherever the program runs: added to
    the eager context's function library, where the functions of every traced
    ``tf.function`` are (a function imported with a GraphDef's library is
    known to the importing graph only, and the wrapper that runs it looks
    names up in the context)."""
    from tensorflow.python.eager import context

    ctx = context.context()
    for fdef in fdefs:
        if not ctx.has_function(fdef.signature.name):
            ctx.add_function_def(fdef)
