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

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2, rewriter_config_pb2
from tensorflow.python.framework import convert_to_constants
from tensorflow.python.grappler import tf_optimizer

from hlo_guard.tf.inner_gradients import check_no_inner_gradient

CALL_OPS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})

def _library_dirs():
    """Frames in these directories are library code, not the user's line."""
    modules = [tf, sys.modules.get("keras"), sys.modules.get("hlo_guard")]
    return tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                 for m in modules if m is not None and getattr(m, "__file__", None))


@dataclass
class TracedFunction:
    """The user's function for one input signature, ready to import."""
    concrete: Any                         # the ConcreteFunction
    graph_def: Any                        # GraphDef with nested calls inlined
    arg_names: List[str]                  # placeholder tensors of the flat arguments
    captures: List[Tuple[Any, str]]       # (external tensor, internal placeholder name)
    output_names: List[str]
    control_output_names: List[str]
    locations: Dict[str, str] = field(default_factory=dict)
    #: locations of the ops of control-flow bodies, by body function name
    body_locations: Dict[str, Dict[str, str]] = field(default_factory=dict)


def user_location(op) -> str:
    """``file:line (function)`` of the innermost user frame that created ``op``."""
    try:
        frames = list(op.traceback)
    except Exception:  # pragma: no cover - ops without a Python traceback
        return ""
    library = _library_dirs()
    for fr in reversed(frames):
        filename = os.path.abspath(fr.filename)
        if filename.startswith(library) or "site-packages" in filename \
                or filename.startswith("<"):
            continue
        return f"{fr.filename}:{fr.lineno} ({fr.name})"
    return ""


def inline_calls(concrete, fetch: Sequence[str]):
    """The concrete function's GraphDef with every nested function call inlined."""
    graph_def = concrete.graph.as_graph_def()
    if not any(n.op in CALL_OPS for n in graph_def.node) and not any(
            n.op in CALL_OPS for f in graph_def.library.function for n in f.node_def):
        return graph_def
    graph_def = convert_to_constants.disable_lower_using_switch_merge(graph_def)
    for function in graph_def.library.function:
        # a secondary implementation (e.g. for GPU) would block inlining
        if "api_implements" in function.attr:
            del function.attr["api_implements"]
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph_def)
    fetches = meta_graph_pb2.CollectionDef()
    fetches.node_list.value.extend(fetch)
    meta.collection_def["train_op"].CopyFrom(fetches)
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.min_graph_nodes = -1
    rewrite.optimizers.append("function")
    rewrite.function_optimization = rewriter_config_pb2.RewriterConfig.AGGRESSIVE
    return tf_optimizer.OptimizeGraph(config, meta)


def trace(tf_fn, args, kwargs) -> TracedFunction:
    """Trace ``tf_fn`` (a ``tf.function``) for these (symbolic) arguments."""
    concrete = tf_fn.get_concrete_function(*args, **kwargs)
    graph = concrete.graph
    capture_internal = {id(internal) for _, internal in graph.captures}
    arg_tensors = [t for t in graph.inputs if id(t) not in capture_internal]
    captures = [(external, internal.name) for external, internal in graph.captures]
    outputs = [t.name for t in graph.outputs]
    control = [op.name for op in graph.control_outputs]
    fetch = [t.name for t in graph.inputs] + outputs + control
    graph_def = inline_calls(concrete, fetch)
    python_fn = getattr(tf_fn, "python_function", tf_fn)
    check_no_inner_gradient(concrete, graph_def, outputs + control,
                            getattr(python_fn, "__qualname__", repr(python_fn)))
    body_locations: Dict[str, Dict[str, str]] = {}
    locations = _locations(graph, body_locations)
    return TracedFunction(concrete, graph_def, [t.name for t in arg_tensors], captures,
                          outputs, control, locations, body_locations)


_BODY_GRAPH_ATTRS = ("_true_graph", "_false_graph", "_body_graph", "_cond_graph",
                     "_branch_graphs")


def _locations(graph, bodies: Dict[str, Dict[str, str]]) -> Dict[str, str]:
    """{op name: user location} of ``graph``; control-flow body graphs (which
    cond_v2/while_v2 cache on their ops) are filed under their function name."""
    found = {}
    for op in graph.get_operations():
        loc = user_location(op)
        if loc:
            found[op.name] = loc
        for attr in _BODY_GRAPH_ATTRS:
            sub = getattr(op, attr, None)
            for g in (sub if isinstance(sub, (list, tuple)) else [sub]):
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
            return ("tf.custom_gradient in the function: its Python gradient refers to the "
                    "original graph, so the function runs unguarded")
    return ""
