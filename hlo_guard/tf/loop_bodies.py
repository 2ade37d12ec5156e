"""Static shapes for the gradient of an imported ``While``.

TF differentiates a ``While`` op by rebuilding its body and condition as
Python graphs.  For a loop it built itself, ``while_v2`` keeps those graphs on
the op (``_body_graph``, ``_cond_graph``), with every static shape known.  For
an op that came out of ``import_graph_def`` -- every loop in a guarded
function -- it rebuilds them from the registered ``FunctionDef``, which
records neither the shapes of the body's operations nor the variable shapes
behind resource arguments: a variable read inside the body has an unknown
shape, the gradient of a broadcasting add then computes its reduction axes at
run time (``BroadcastGradientArgs``), and XLA refuses to compile it ("must be
a compile-time constant").  Every Keras RNN layer is such a loop.

So the imported op is given the graphs TF would rebuild, built instead from
the same functions serialised with their shapes (``as_graph_def(add_shapes=
True)`` of the traced graph: ``_output_shapes`` on every node, handle data on
resource arguments).  Only while the op still runs those very functions: a
body the guard rewrote is a different function, and keeps TF's own path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from hlo_guard.tf import compat
from hlo_guard.tf.tracing import WHILE_OPS

_GRAPH_ATTRS = (("cond", "_cond_graph"), ("body", "_body_graph"))


def copy_loop_handle_data(ops: Iterable[Any]) -> None:
    """A ``While`` op's resource and variant outputs are its inputs passed
    through: ``while_v2`` copies their handle data (a variable's shape and
    dtype, a TensorList's element shape) onto them when it builds the op,
    ``import_graph_def`` does not.  Without it, a variable read through the
    loop's output has no handle data, and its gradient fails ("a variable
    without handle data")."""
    for op in ops:
        if op.type not in WHILE_OPS:
            continue
        for source, target in zip(op.inputs, op.outputs):
            if target.dtype in (tf.resource, tf.variant):
                compat.copy_handle_data(source, target)


def attach_shaped_bodies(ops: Iterable[Any], shaped_functions: dict[str, Any]) -> int:
    """Give every ``While``/``StatelessWhile`` among ``ops`` whose condition
    and body are still the traced functions the shaped graphs of both.
    Returns how many loops got them."""
    if not shaped_functions:
        return 0
    done = 0
    for op in ops:
        if op.type not in WHILE_OPS:
            continue
        names = {attr: op.get_attr(attr).name for attr, _ in _GRAPH_ATTRS}
        if not all(n in shaped_functions for n in names.values()):
            continue
        if any(getattr(op, cached, None) is not None for _, cached in _GRAPH_ATTRS):
            continue
        shapes = [tf.TensorShape(s) for s in op.get_attr("output_shapes")]
        with op.graph.as_default():
            graphs = {
                attr: compat.function_def_to_graph(shaped_functions[n], input_shapes=shapes)
                for attr, n in names.items()
            }
        for attr, cached in _GRAPH_ATTRS:
            setattr(op, cached, graphs[attr])
        done += 1
    return done
