"""What a ``tf.where``'s predicate says about a tensor in the lanes it
picks -- TF's side of :mod:`hlo_guard.jax_frontend.rules.predicate_facts`,
for the report's ``0 * inf`` check (:mod:`hlo_guard.tf.where_made_zeros`):
a comparison against a constant (:data:`passes.comparisons.IMPLIED_WHEN`)
makes the compared tensor nonzero or positive, and so every tensor it is a
zero-preserving function of.  Tensors are named as the graph recorded them.
Lanes are matched by shape only: the compared tensor must have the
selection's shape (no broadcast between).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from passes.comparisons import IMPLIED_WHEN

#: TF's comparisons, by the names of :data:`passes.comparisons.IMPLIED_WHEN`
COMPARISON_NAMES = {
    "Greater": "gt",
    "GreaterEqual": "ge",
    "Less": "lt",
    "LessEqual": "le",
    "Equal": "eq",
    "NotEqual": "ne",
}
#: operations under which a value is nonzero exactly where its input is,
#: and whether they keep its sign
ZERO_PRESERVING = {"Identity": True, "Sqrt": True, "Abs": False, "Neg": False}


def static_shape(tensor):
    shape = tensor.shape
    return tuple(shape.as_list()) if shape.is_fully_defined() else None


def predicate_facts(graph, pred, holds: bool, shape) -> tuple:
    """``(tensor, positive)`` for each tensor the predicate ``pred`` makes
    nonzero (and positive) in the lanes where its value is ``holds``: a
    comparison against a constant, of a tensor of ``shape`` (or one it is a
    zero-preserving function of)."""
    found = beneath_identity(graph, pred)
    if found is None or static_shape(graph.tensors[pred]) != shape:
        return ()
    op, inputs = found
    cmp = COMPARISON_NAMES.get(op.type)
    facts: list = []
    for name, side, test, positive in IMPLIED_WHEN[holds]:
        if name != cmp or static_shape(graph.tensors[inputs[side]]) != shape:
            continue
        if not constant_passes(graph, inputs[1 - side], test):
            continue
        facts.extend(
            (t, positive and same) for t, same in zero_preserving_chain(graph, inputs[side])
        )
    return tuple(facts)


def zero_preserving_chain(graph, name, depth: int = 8) -> list:
    """``(tensor, same_sign)`` for ``name`` and each tensor it is computed
    from by zero-preserving ops: ``name`` is nonzero where any is, positive
    where one with ``same_sign`` is."""
    chain, same = [], True
    for _ in range(depth):
        chain.append((name, same))
        found = producer_op(graph, name)
        if found is None or found[0].type not in ZERO_PRESERVING:
            break
        same = same and ZERO_PRESERVING[found[0].type]
        name = found[1][0]
    return chain


def constant_value(graph, name):
    """The value of a ``Const`` (through ``Identity``), or None."""
    for _ in range(8):
        found = producer_op(graph, name)
        if found is None:
            return None
        op, inputs = found
        if op.type == "Const":
            value = tf.get_static_value(op.outputs[0])
            return None if value is None else np.asarray(value)
        if op.type != "Identity":
            return None
        name = inputs[0]
    return None


def constant_passes(graph, name, test) -> bool:
    value = constant_value(graph, name)
    return value is not None and value.dtype != object and bool(np.all(test(value)))


def producer_op(graph, name):
    """(the op computing tensor ``name``, its recorded input names), or None."""
    found = graph.producer(name)
    if found is None:
        return None
    return graph.ops[found[0]], graph.node_inputs(found[0])


def beneath_identity(graph, name, depth: int = 8):
    """(op, its recorded inputs) computing ``name``, seen through ``Identity``."""
    for _ in range(depth):
        found = producer_op(graph, name)
        if found is None or found[0].type != "Identity":
            return found
        name = found[1][0]
    return None
