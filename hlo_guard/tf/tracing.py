"""Tracing the user's function to one flat GraphDef.

``tf.function(fn).get_concrete_function(*args)`` gives a ``FuncGraph``.  Nested
``tf.function`` calls in it are ``PartitionedCall``/``StatefulPartitionedCall``
nodes; left as calls, their gradient under XLA goes through
``SymbolicGradient`` and fails, and the analysis could not see inside them.
So they are inlined first, by Grappler's function optimizer alone (the same
configuration ``convert_variables_to_constants_v2`` uses), with control flow
*not* lowered: ``If``/``While`` stay functional and their bodies stay in the
library.  Fetch nodes are the inputs, the outputs and the control outputs
(stateful operations such as variable updates must survive).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hlo_guard.tf import compat
from hlo_guard.tf.custom_gradients import set_aside_true_derivatives
from hlo_guard.tf.inner_gradients import check_no_inner_gradient
from hlo_guard.tf.locations import user_location

CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


@dataclass
class TracedFunction:
    """The user's function for one input signature, ready to import."""

    concrete: Any  # the ConcreteFunction
    graph_def: Any  # GraphDef with nested calls inlined
    arg_names: list[str]  # placeholder tensors of the flat arguments
    captures: list[tuple[Any, str]]  # (external tensor, internal placeholder name)
    output_names: list[str]
    control_output_names: list[str]
    locations: dict[str, str] = field(default_factory=dict)
    #: locations of the ops of control-flow bodies, by body function name
    body_locations: dict[str, dict[str, str]] = field(default_factory=dict)
    #: the library's functions with their shapes recorded (``_output_shapes``
    #: of every node, handle data of resource arguments), by name: what a
    #: ``While`` gradient needs to rebuild its body with static shapes
    #: (:func:`hlo_guard.tf.loop_bodies.attach_shaped_bodies`)
    shaped_functions: dict[str, Any] = field(default_factory=dict)
    #: report notes: custom gradients set aside (:mod:`hlo_guard.tf.custom_gradients`)
    notes: list[str] = field(default_factory=list)


def inline_calls(concrete, fetch: Sequence[str]):
    """The concrete function's GraphDef with every nested function call inlined."""
    graph_def = concrete.graph.as_graph_def()
    if not any(n.op in CALL_OPS for n in graph_def.node) and not any(
        n.op in CALL_OPS for f in graph_def.library.function for n in f.node_def
    ):
        return graph_def
    graph_def = compat.disable_lower_using_switch_merge(graph_def)
    for function in graph_def.library.function:
        # a secondary implementation (e.g. for GPU) would block inlining
        if "api_implements" in function.attr:
            del function.attr["api_implements"]
    return compat.inline_functions(graph_def, fetch)


def trace(tf_fn, args, kwargs) -> TracedFunction:
    """Trace ``tf_fn`` (a ``tf.function``) for these (symbolic) arguments."""
    concrete = tf_fn.get_concrete_function(*args, **kwargs)
    graph = concrete.graph
    capture_internal = {id(internal) for _, internal in graph.captures}
    arg_tensors = [t for t in graph.inputs if id(t) not in capture_internal]
    captures = [(external, internal.name) for external, internal in graph.captures]
    outputs = [t.name for t in _structured_outputs(concrete)]
    control = [op.name for op in graph.control_outputs]
    fetch = [t.name for t in graph.inputs] + outputs + control
    graph_def = inline_calls(concrete, fetch)
    python_fn = getattr(tf_fn, "python_function", tf_fn)
    check_no_inner_gradient(
        concrete, graph_def, outputs + control, getattr(python_fn, "__qualname__", repr(python_fn))
    )
    body_locations: dict[str, dict[str, str]] = {}
    locations = _locations(graph, body_locations)
    notes = set_aside_true_derivatives(graph_def, locations)
    shaped = {}
    if any(n.op in WHILE_OPS for n in graph_def.node) or any(
        n.op in WHILE_OPS for f in graph_def.library.function for n in f.node_def
    ):
        library = graph.as_graph_def(add_shapes=True).library.function
        shaped = {f.signature.name: f for f in library}
    return TracedFunction(
        concrete,
        graph_def,
        [t.name for t in arg_tensors],
        captures,
        outputs,
        control,
        locations,
        body_locations,
        shaped,
        notes,
    )


WHILE_OPS = ("While", "StatelessWhile")


def _structured_outputs(concrete) -> list:
    """The graph's outputs that are the function's own results.

    Once a concrete function has been differentiated inside another graph
    (``g.original`` under a tape in an XLA-compiled step, say), TF appends
    the intermediates its backward function needs to ``graph.outputs``.
    Taken as outputs, they would be live uses of every dead branch (a
    ``sqrt`` feeding a ``where`` would be "used" in all lanes) and the guard
    would silently place nothing.  The function's own results are the
    leading ``graph.outputs``, one per tensor leaf of ``structured_outputs``.
    """
    import tensorflow as tf

    leaves = tf.nest.flatten(concrete.structured_outputs, expand_composites=True)
    n_results = sum(1 for leaf in leaves if isinstance(leaf, tf.Tensor))
    return list(concrete.graph.outputs[:n_results])


_BODY_GRAPH_ATTRS = ("_true_graph", "_false_graph", "_body_graph", "_cond_graph", "_branch_graphs")


def _locations(graph, bodies: dict[str, dict[str, str]]) -> dict[str, str]:
    """{op name: user location} of ``graph``; control-flow body graphs (which
    cond_v2/while_v2 cache on their ops) are filed under their function name."""
    found = {}
    for op in graph.get_operations():
        loc = user_location(op)
        if loc:
            found[op.name] = loc
        for attr in _BODY_GRAPH_ATTRS:
            sub = getattr(op, attr, None)
            for g in sub if isinstance(sub, (list, tuple)) else [sub]:
                if g is not None and hasattr(g, "get_operations") and g.name not in bodies:
                    bodies[g.name] = {}
                    bodies[g.name] = _locations(g, bodies)
    return found


def unsupported_reason(traced: TracedFunction) -> str:
    """Why the traced graph cannot be re-imported faithfully ("" if it can).

    ``tf.custom_gradient`` registers a Python gradient function that closes
    over tensors of the *original* FuncGraph; an imported copy of the graph
    would call it with tensors from out of scope.  Such functions run
    unguarded (the user's own program) and the report says so.
    """
    gd = traced.graph_def
    nodes = list(gd.node) + [n for f in gd.library.function for n in f.node_def]
    for n in nodes:
        if "_gradient_op_type" in n.attr:
            return (
                "tf.custom_gradient in the function: its Python gradient refers to the "
                "original graph, so the function runs unguarded"
            )
    return ""


def pack_tensor_leaves(structure, flat_tensors):
    """``structure`` with its tensor leaves replaced, in order, by
    ``flat_tensors`` (its other leaves -- ``None``, Python values -- kept)."""
    import tensorflow as tf

    it = iter(flat_tensors)
    leaves = tf.nest.flatten(structure, expand_composites=True)
    new = [next(it) if isinstance(x, tf.Tensor) else x for x in leaves]
    return tf.nest.pack_sequence_as(structure, new, expand_composites=True)
