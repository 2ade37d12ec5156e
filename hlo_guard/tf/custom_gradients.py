"""``tf.custom_gradient`` overrides the guard may set aside.

A ``tf.custom_gradient`` function leaves an ``IdentityN`` in the graph whose
gradient is a Python function closing over tensors of the graph it was traced
in.  The guard imports a copy of that graph, where those tensors do not
exist, so a function holding one runs unguarded (``tracing.unsupported_reason``).

Some overrides compute the true derivative of their forward ops, only
cheaper: TF's ``tf.nn.silu``/``tf.nn.swish`` (every Keras ``swish``/``silu``
activation) recomputes ``sigmoid`` in its gradient instead of keeping it,
to save memory.  For those, the override can be dropped and TF left to
differentiate the forward ops themselves: the same derivative, up to
rounding (``s + x s (1 - s)`` against ``s (1 + x (1 - s))``), and the same
forward bits -- instead of the whole function unguarded.  The report says so
for each one (``BuildRecord.notes``).  Only overrides named here are set
aside; any other custom gradient (a straight-through estimator, a clipped
gradient) is a different derivative, and its function stays unguarded.
"""

from __future__ import annotations

from hlo_guard.tf import compat

#: (module, qualified name) of gradient functions that are the true
#: derivative of their forward function, and what users call them
TRUE_DERIVATIVES = {
    ("tensorflow.python.ops.nn_impl", "swish.<locals>.swish_impl.<locals>.grad"): (
        "tf.nn.silu / tf.nn.swish"
    ),
}

GRADIENT_OVERRIDE = "_gradient_op_type"


def set_aside_true_derivatives(graph_def, locations) -> list[str]:
    """Drop, in place, the gradient override of every ``IdentityN`` of
    ``graph_def`` (its library included) whose gradient function is in
    :data:`TRUE_DERIVATIVES`; one report note per override dropped."""
    notes = []
    nodes = [(n, "") for n in graph_def.node]
    nodes += [(n, f.signature.name) for f in graph_def.library.function for n in f.node_def]
    for node, body in nodes:
        if GRADIENT_OVERRIDE not in node.attr:
            continue
        override = node.attr[GRADIENT_OVERRIDE].s.decode()
        fn = compat.custom_gradient_function(override)
        known = None if fn is None else TRUE_DERIVATIVES.get((fn.__module__, fn.__qualname__))
        if known is None:
            continue
        del node.attr[GRADIENT_OVERRIDE]
        where = locations.get(node.name) or (f"{body}/{node.name}" if body else node.name)
        notes.append(
            f"{known} at {where}: its custom gradient (the same derivative, computed "
            "to save memory) was set aside; TF differentiates its forward ops, equal "
            "up to rounding"
        )
    return notes
