"""A zero a selection makes by *value*, times a factor with an unbounded
derivative: reported, as the JAX front end reports it.

``tf.cast(mask, tf.float32) * tf.norm(x, axis=-1)`` -- how Keras applies a
propagated mask or a ``where``-made sample weight -- multiplies the padded
rows' norms by an exact 0.  Those lanes are not dead: the cotangent reaching
the norm is the zero's *value*, so nothing is guarded there, and under XLA
``0 * sqrt'(0)`` is NaN (TF eager special-cases a zero upstream gradient and
gives 0).  The contract keeps the NaN (a numeric zero is not a structural
one), and the report must say where it comes from: each ``Mul`` whose factor
is such a zero (:func:`_where_made_zero`: a ``Cast`` of a boolean, a select
with a constant-zero case, seen through copies and products) and whose other
factor has an operation with an unbounded derivative behind it
(:func:`_singular_before`) is an unguarded site.  The fix the reason names is
the one that works: select instead of multiplying (``tf.where(mask, loss,
0)``), or make the singular operation's input safe where the mask is 0.

Asked by the reports only (:mod:`hlo_guard.tf.report`), found by a
user-style hunt (2026-11-28: Keras ``Masking`` + a norm loss trained to NaN
weights under ``fit(jit_compile=True)`` with a clean report).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from passes.planning import UnguardedSite

WHERE_MADE_ZERO = (
    "a zero made by a mask's value (a cast boolean, a where's constant 0: not a dead "
    "lane) multiplies a factor whose derivative may be infinite: 0 * inf is NaN under "
    "XLA in the lanes it zeroes, unguarded -- select instead of multiplying "
    "(tf.where(mask, loss, 0)), or make the input of the singular operation safe where "
    "the mask is 0"
)

#: operations with an unbounded derivative somewhere (TF's names)
SINGULAR = frozenset(
    {
        "Sqrt",
        "Rsqrt",
        "Log",
        "Log1p",
        "RealDiv",
        "Div",
        "Reciprocal",
        "Inv",
        "Pow",
        "Exp",
        "Expm1",
        "Acos",
        "Asin",
        "Atanh",
        "Acosh",
        "Atan2",
        "Tan",
        "Lgamma",
        "Digamma",
        "EuclideanNorm",
    }
)
#: calls: what they hold is not looked into here, so they count as singular
_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
#: operations that hand a value's lanes on (a zero stays a zero)
_COPIES = frozenset(
    {"Identity", "BroadcastTo", "Reshape", "ExpandDims", "Squeeze", "Neg", "Tile", "Transpose"}
)
_MAX_STEPS = 4096


def where_made_zero_factors(graph, analysis) -> list[UnguardedSite]:
    """The ``Mul`` ops of ``graph`` whose derivative is used, one of whose
    factors is a where-made zero and the other has a singular op behind it.
    Inputs are read as the graph recorded them (a guarded build rewires the
    ops' inputs to its guards)."""
    found = []
    for node, op in enumerate(graph.ops):
        if op.type != "Mul":
            continue
        (out,) = graph.node_outputs(node)
        liveness = analysis.value_liveness(out)
        if not liveness.reaches_output:
            continue
        a, b = graph.node_inputs(node)
        for zero, other in ((a, b), (b, a)):
            if other == zero or not graph.carries_derivative(other):
                continue
            if _where_made_zero(graph, zero) and _singular_before(graph, other):
                found.append(UnguardedSite(node, WHERE_MADE_ZERO, liveness))
                break
    return found


def _producer_op(graph, name):
    """(the op computing tensor ``name``, its recorded input names), or None."""
    found = graph.producer(name)
    if found is None:
        return None
    return graph.ops[found[0]], graph.node_inputs(found[0])


def _where_made_zero(graph, name, depth: int = 16) -> bool:
    """Whether tensor ``name`` is zero by value in some lanes a mask picks:
    a ``Cast`` of a boolean, a ``Select``/``SelectV2`` one of whose cases is
    a constant zero and not every case, seen through copies, float casts and
    products (a zero times anything finite is a zero)."""
    for _ in range(depth):
        found = _producer_op(graph, name)
        if found is None:
            return False
        op, inputs = found
        kind = op.type
        if kind == "Cast":
            if graph.tensors[inputs[0]].dtype == tf.bool:
                return True
            name = inputs[0]
        elif kind in _COPIES:
            name = inputs[0]
        elif kind == "Mul":
            return any(_where_made_zero(graph, t, depth - 1) for t in inputs)
        elif kind in ("Select", "SelectV2"):
            zeros = [_constant_zero(graph, t) for t in inputs[1:]]
            return any(zeros) and not all(zeros)
        else:
            return False
    return False


def _constant_zero(graph, name, depth: int = 8) -> bool:
    """Whether tensor ``name`` is a constant zero in every lane (a
    ``Const``, a ``ZerosLike``, a ``Fill`` of 0, through copies and casts)."""
    for _ in range(depth):
        found = _producer_op(graph, name)
        if found is None:
            return False
        op, inputs = found
        if op.type == "Const":
            return _all(op, lambda v: v == 0)
        if op.type == "ZerosLike":
            return True
        if op.type == "Fill":
            name = inputs[1]
        elif op.type in _COPIES or op.type == "Cast":
            name = inputs[0]
        else:
            return False
    return False


def _singular_before(graph, name) -> bool:
    """Whether an operation with an unbounded derivative, or a call, lies
    behind tensor ``name`` on the values that carry a derivative to it."""
    stack, seen = [name], set[str]()
    while stack and len(seen) < _MAX_STEPS:
        name = stack.pop()
        if name in seen or not graph.carries_derivative(name):
            continue
        seen.add(name)
        found = _producer_op(graph, name)
        if found is None:
            continue
        op, inputs = found
        if (op.type in SINGULAR and not _bounded(graph, op, inputs)) or op.type in _CALLS:
            return True
        stack.extend(inputs)
    return bool(stack)  # too far to tell: say so


def _bounded(graph, op, inputs) -> bool:
    """A singular op whose input keeps it away from its singularity, as the
    losses TF and Keras write use them: ``exp(-|x|)`` is at most 1 and
    ``log1p(exp(y))`` has a derivative below 1 (the logistic loss of a
    binary cross-entropy); ``log``/``sqrt``/``rsqrt`` of, or a division by,
    a value clipped or maxed to a positive constant (``log(clip(p, eps,
    1 - eps))``) is finite with a finite derivative."""
    source = _beneath_identity(graph, inputs[0] if op.type != "RealDiv" else inputs[1])
    if source is None:
        return False
    inner, inner_inputs = source
    if op.type == "Exp":
        return _non_positive(graph, inner, inner_inputs)
    if op.type == "Log1p":
        return inner.type == "Exp"
    if op.type in ("Log", "Sqrt", "Rsqrt", "RealDiv"):
        if inner.type == "ClipByValue":
            return _positive_constant(graph, inner_inputs[1])
        if inner.type == "Maximum":
            return any(_positive_constant(graph, t) for t in inner_inputs)
    return False


def _non_positive(graph, op, inputs) -> bool:
    """``-|x|``, written as ``Neg(Abs(x))`` or as TF's logistic loss writes
    it, ``where(x >= 0, -x, x)``."""
    if op.type == "Neg":
        below = _beneath_identity(graph, inputs[0])
        return below is not None and below[0].type == "Abs"
    if op.type not in ("Select", "SelectV2"):
        return False
    cond, taken, other = inputs
    negated = _beneath_identity(graph, taken)
    compared = _beneath_identity(graph, cond)
    return (
        negated is not None
        and negated[0].type == "Neg"
        and negated[1][0] == other
        and compared is not None
        and compared[0].type in ("GreaterEqual", "Greater")
        and compared[1][0] == other
        and _constant_zero(graph, compared[1][1])
    )


def _beneath_identity(graph, name, depth: int = 8):
    """(op, its recorded inputs) computing ``name``, seen through ``Identity``."""
    for _ in range(depth):
        found = _producer_op(graph, name)
        if found is None or found[0].type != "Identity":
            return found
        name = found[1][0]
    return None


def _positive_constant(graph, name) -> bool:
    found = _beneath_identity(graph, name)
    return found is not None and found[0].type == "Const" and _all(found[0], lambda v: v > 0)


def _all(const_op, test) -> bool:
    """Whether every element of ``Const`` op ``const_op`` passes ``test``."""
    value = tf.get_static_value(const_op.outputs[0])
    return value is not None and bool(np.all(test(np.asarray(value))))


__all__ = ["WHERE_MADE_ZERO", "where_made_zero_factors"]
