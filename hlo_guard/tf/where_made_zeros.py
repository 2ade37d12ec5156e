"""A zero a selection makes by *value*, times a factor with an unbounded
derivative: reported, as the JAX front end reports it.

``tf.cast(mask, tf.float32) * tf.norm(x, axis=-1)`` -- how Keras applies a
propagated mask or a ``where``-made sample weight -- multiplies the padded
rows' norms by an exact 0.  Those lanes are not dead: the cotangent reaching
the norm is the zero's *value*, so nothing is guarded there, and under XLA
``0 * sqrt'(0)`` is NaN (TF eager special-cases a zero upstream gradient and
gives 0).  The contract keeps the NaN (a numeric zero is not a structural
one), and the report must say where it comes from: each ``Mul`` whose factor
is such a zero (:func:`_zero_sources`: a ``Cast`` of a boolean, a select
with a constant-zero case, seen through copies and products) and whose other
factor has an operation with an unbounded derivative behind it
(:func:`_singular_before`) is an unguarded site -- unless the predicates
keep that operation away from its singular point in every lane the zero
zeroes (:func:`_finite_where_zeroed`: a cutoff ``tf.where(r < r_c, poly, 0)``
times ``s / r``).  The fix the reason names is
the one that works: select instead of multiplying (``tf.where(mask, loss,
0)``), or make the singular operation's input safe where the mask is 0.

Asked by the reports only (:mod:`hlo_guard.tf.report`), found by a
user-style hunt (2026-11-28: Keras ``Masking`` + a norm loss trained to NaN
weights under ``fit(jit_compile=True)`` with a clean report).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hlo_guard.tf.predicate_facts import (
    beneath_identity,
    constant_value,
    predicate_facts,
    producer_op,
    static_shape,
    zero_preserving_chain,
)
from passes.fact_walk import walk_with_facts
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
            sources = _zero_sources(graph, zero)
            if (
                sources
                and _singular_before(graph, other)
                and not _finite_where_zeroed(graph, out, sources, zero, other)
            ):
                found.append(UnguardedSite(node, WHERE_MADE_ZERO, liveness))
                break
    return found


#: singular operations whose derivative is finite where one input is nonzero
#: -- or positive: ``(input index, positive needed)``
_SINGULAR_AT_ZERO = {
    "RealDiv": (1, False),
    "Div": (1, False),
    "DivNoNan": (1, False),
    "Reciprocal": (0, False),
    "Inv": (0, False),
    "Sqrt": (0, True),
    "Rsqrt": (0, True),
    "Log": (0, True),
}
#: operations that map each lane of their inputs of the output's shape to the
#: same lane of the output (an input of another shape is broadcast)
_LANE_WISE = frozenset(
    {
        "Identity",
        "Cast",
        "Neg",
        "Abs",
        "Square",
        "Mul",
        "Add",
        "AddV2",
        "Sub",
        "RealDiv",
        "Div",
        "DivNoNan",
        "Reciprocal",
        "Inv",
        "Sqrt",
        "Rsqrt",
        "Log",
        "Log1p",
        "Exp",
        "Expm1",
        "Pow",
        "Tanh",
        "Sigmoid",
        "Sin",
        "Cos",
        "Maximum",
        "Minimum",
        "Select",
        "SelectV2",
    }
)
_SELECTS = ("Select", "SelectV2")


def _finite_where_zeroed(graph, out, sources, zero, other) -> bool:
    """Whether factor ``other`` of the ``Mul`` computing ``out`` has a finite
    derivative in every lane its where-made zero zeroes, by what the
    predicates say: ``tf.where(r < r_c, poly(r), 0) * (s / r)`` is zero only
    where ``r >= r_c > 0``; ``cast(m) * tf.where(x > 0, tf.sqrt(x), 0)``
    takes the ``Sqrt`` only where ``x > 0`` (the JAX front end's
    ``where_made_zeros._finite_where_zeroed``; both were reported).

    Walks the tensors behind ``other`` that carry a derivative, collecting
    what the ``Select``s on the way say about their lanes; each singular op
    met must be finite where one input is nonzero (:data:`_SINGULAR_AT_ZERO`,
    a ``Pow`` by a constant) with that input known nonzero there.  Lanes
    must line up: every op walked, the zeroing selection and the compared
    values have the product's shape, fully known; behind an op that moves
    lanes (a reduction, a transpose, a broadcast input) nothing singular may
    lie at all."""
    shape = static_shape(graph.tensors[out])
    if shape is None:
        return False
    # the product's one reader may take it only where its predicate says
    # something (``tf.where(a > 0, a * tf.math.log(a), 0)``)
    taken = _taken_where(graph, out, shape)
    if _implied(graph, zero, taken, positive=False):
        return True  # the lanes where the zero factor is zero are never taken
    zero_facts = [
        taken
        + (
            predicate_facts(graph, inputs[0], holds, shape)
            if static_shape(op.outputs[0]) == shape
            else ()
        )
        for op, inputs, holds in sources
    ]

    def step(name, facts):
        found = producer_op(graph, name)
        if found is None:
            return []
        op, inputs = found
        if op.type not in _LANE_WISE or static_shape(graph.tensors[name]) != shape:
            return None if _singular_before(graph, name) else []
        if op.type in SINGULAR and not _bounded(graph, op, inputs):
            if not all(_input_nonzero(graph, op, inputs, (*known, *facts)) for known in zero_facts):
                return None
        walk = []
        for k, t in enumerate(inputs):
            if (op.type in _SELECTS and k == 0) or not graph.carries_derivative(t):
                continue
            if static_shape(graph.tensors[t]) != shape:
                if _singular_before(graph, t):  # broadcast: its gradient sums lanes
                    return None
                continue
            if op.type in _SELECTS:
                walk.append((t, facts | set(predicate_facts(graph, inputs[0], k == 1, shape))))
            else:
                walk.append((t, facts))
        return walk

    # fewest facts first, each tensor once per fact set it is not settled for
    # (:mod:`passes.fact_walk`, as the JAX front end's walk)
    return walk_with_facts(other, graph.carries_derivative, lambda name: name, step, _MAX_STEPS)


def _input_nonzero(graph, op, inputs, facts) -> bool:
    """Whether ``facts`` keep singular ``op`` away from its singular point."""
    need: tuple[int, bool] | None
    if op.type == "Pow":
        exponent = constant_value(graph, inputs[1])
        if exponent is None:
            return False
        if np.all(exponent >= 1):  # ``x ** 6``: a polynomial
            return True
        need = (0, not np.all(exponent == np.round(exponent)))
    else:
        need = _SINGULAR_AT_ZERO.get(op.type)
    if need is None:
        return False
    index, positive = need
    if static_shape(graph.tensors[inputs[index]]) is None:
        return False
    return _implied(graph, inputs[index], facts, positive)


def _implied(graph, name, facts, positive: bool) -> bool:
    """Whether ``facts`` make tensor ``name`` nonzero (``positive``: positive)."""
    for t, same in zero_preserving_chain(graph, name):
        if positive and not same:
            break
        if any(f == t and (p or not positive) for f, p in facts):
            return True
    return False


def _taken_where(graph, name, shape) -> tuple:
    """What the predicate of tensor ``name``'s one reader, a select of the
    same ``shape`` taking it as a case, says about the lanes it takes it in."""
    if name in graph.graph_outputs():
        return ()
    readers = [
        (node, k)
        for node in range(graph.node_count())
        for k, t in enumerate(graph.node_inputs(node))
        if t == name
    ]
    if len(readers) != 1:
        return ()
    node, k = readers[0]
    op = graph.ops[node]
    if op.type not in _SELECTS or k == 0 or static_shape(op.outputs[0]) != shape:
        return ()
    return predicate_facts(graph, graph.node_inputs(node)[0], k == 1, shape)


def _zero_sources(graph, name, depth: int = 16) -> list[tuple]:
    """The selections that make tensor ``name`` zero by value in some lanes
    a mask picks, each as ``(op, its recorded inputs, the predicate's value
    in the lanes it zeroes)``: a ``Cast`` of a boolean (zero where it is
    false), a ``Select``/``SelectV2`` one of whose cases is a constant zero
    and not every case, seen through copies, float casts and products (a
    zero times anything finite is a zero).  Empty: not a where-made zero."""
    for _ in range(depth):
        found = producer_op(graph, name)
        if found is None:
            return []
        op, inputs = found
        kind = op.type
        if kind == "Cast":
            if graph.tensors[inputs[0]].dtype == tf.bool:
                return [(op, inputs, False)]
            name = inputs[0]
        elif kind in _COPIES:
            name = inputs[0]
        elif kind == "Mul":
            return [s for t in inputs for s in _zero_sources(graph, t, depth - 1)]
        elif kind in ("Select", "SelectV2"):
            zeros = [_constant_zero(graph, t) for t in inputs[1:]]
            if not any(zeros) or all(zeros):
                return []
            return [(op, inputs, zeros[0])]  # the first case is taken where true
        else:
            return []
    return []


def _constant_zero(graph, name, depth: int = 8) -> bool:
    """Whether tensor ``name`` is a constant zero in every lane (a
    ``Const``, a ``ZerosLike``, a ``Fill`` of 0, through copies and casts)."""
    for _ in range(depth):
        found = producer_op(graph, name)
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
        found = producer_op(graph, name)
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
    source = beneath_identity(graph, inputs[0] if op.type != "RealDiv" else inputs[1])
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
        below = beneath_identity(graph, inputs[0])
        return below is not None and below[0].type == "Abs"
    if op.type not in ("Select", "SelectV2"):
        return False
    cond, taken, other = inputs
    negated = beneath_identity(graph, taken)
    compared = beneath_identity(graph, cond)
    return (
        negated is not None
        and negated[0].type == "Neg"
        and negated[1][0] == other
        and compared is not None
        and compared[0].type in ("GreaterEqual", "Greater")
        and compared[1][0] == other
        and _constant_zero(graph, compared[1][1])
    )


def _positive_constant(graph, name) -> bool:
    found = beneath_identity(graph, name)
    return found is not None and found[0].type == "Const" and _all(found[0], lambda v: v > 0)


def _all(const_op, test) -> bool:
    """Whether every element of ``Const`` op ``const_op`` passes ``test``."""
    value = tf.get_static_value(const_op.outputs[0])
    return value is not None and bool(np.all(test(np.asarray(value))))


__all__ = ["WHERE_MADE_ZERO", "where_made_zero_factors"]
