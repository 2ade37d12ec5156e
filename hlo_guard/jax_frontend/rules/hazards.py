"""Questions about what lies behind a value, asked by rules that report what
they do not guard.

* :func:`hazard_before`: whether a zero cotangent handed back through a value
  could meet a possibly infinite derivative before it (an operation whose
  rule guards an input lies behind it);
* :func:`singular_before`: whether an operation with an unbounded
  derivative lies behind a value;
* :func:`selected_zero`: whether a value is a ``where`` that picks a constant
  zero in some lanes (``jnp.where(c, 1.0, 0.0)``, JAX's own backward pass
  ``select_n(c, 0, ct)``) -- a zero by *value*, which a ``mul`` then turns
  into ``0 * inf`` when its other factor's derivative is infinite.
"""

from __future__ import annotations

import numpy as np

from hlo_guard.jax_frontend.bodies import REWRITTEN_CALLS, body_is_risky
from hlo_guard.jax_frontend.graph import is_inexact_aval, is_literal
from passes.planning import UnguardedSite

#: operations that hand a value's lanes on unchanged (for :func:`selected_zero`)
_PASS_THROUGH = frozenset({"convert_element_type", "broadcast_in_dim", "reshape", "squeeze"})


def hazard_before(analysis, operand) -> bool:
    """Whether a zero cotangent handed back through ``operand`` could meet
    a possibly infinite derivative before it: an operation behind it whose
    rule guards an input, a risky body, an op without a rule
    (:func:`_lies_behind`).  The guarded function's own arguments, and
    values behind only linear operations on them, have nothing to protect."""

    def hazardous(eqn) -> bool:
        rule = analysis.rules.get(eqn.primitive.name)
        if rule is None or any(body_is_risky(b) for b in sub_jaxprs(eqn)):
            return True
        return bool(rule.guards) and any(
            not is_literal(a) and is_inexact_aval(a.aval) for a in eqn.invars
        )

    return _lies_behind(analysis.graph, operand, hazardous)


def _lies_behind(graph, operand, found_in) -> bool:
    """Whether ``found_in(eqn)`` holds for an equation behind ``operand``,
    walking the values it is computed from that carry a derivative: in this
    graph, and -- through a call body's link to its caller -- in the graphs
    around it.  An input of a body without that link (a loop body: its
    carries come from the last iteration) counts as found."""
    stack, seen = [(graph, operand)], set()
    while stack:
        g, v = stack.pop()
        if is_literal(v) or (id(g), v) in seen or not g.carries_derivative(v):
            continue
        seen.add((id(g), v))
        producer = g.producer(v)
        if producer is None:
            outer = g.caller_argument(v) or _operand_source(g, v)
            if outer is not None:
                stack.append(outer)
            elif g.scope:  # a body's input from a caller not linked
                return True
            continue
        eqn = g.eqns[producer[0]]
        if found_in(eqn):
            return True
        stack.extend((g, a) for a in eqn.invars)
    return False


def _operand_source(graph, v):
    """(the caller's graph, the operand) a ``cond`` branch's input ``v`` is
    bound to, when the branch was made with that link; else None."""
    source = getattr(graph, "operand_source", None)
    if source is None:
        return None
    outer, args = source
    arg = args.get(v)
    return None if arg is None else (outer, arg)


#: operations whose derivative is unbounded at some finite input, or
#: overflows: a where-made zero factor times that is ``0 * inf``
#: (:func:`singular_before`).  Not here: those with a derivative bounded on
#: finite inputs (``mul``, ``tanh``, ``logistic``, ``sin``, ``erf``, ...).
SINGULAR = frozenset(
    {
        "sqrt",
        "rsqrt",
        "cbrt",
        "log",
        "log1p",
        "log2",
        "div",
        "rem",
        "pow",
        "exp",
        "exp2",
        "expm1",
        "sinh",
        "cosh",
        "tan",
        "asin",
        "acos",
        "atanh",
        "acosh",
        "atan2",
        "lgamma",
        "digamma",
        "polygamma",
        "zeta",
        "erf_inv",
        "igamma",
        "igammac",
        "igamma_grad_a",
        "regularized_incomplete_beta",
    }
)

#: calls whose derivative is their own rule, not their body's: not looked into
_OWN_RULE = frozenset({"custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr"})


def singular_before(graph, operand) -> bool:
    """Whether an operation with an unbounded derivative (:data:`SINGULAR`,
    ``integer_pow`` with a negative exponent) lies behind ``operand``, or in
    the body of a call behind it (:func:`_lies_behind`)."""
    return _lies_behind(graph, operand, _singular)


def _singular(eqn, depth: int = 64) -> bool:
    """The equation is singular, or a call whose body (at any depth) holds
    one -- not a custom rule's call, whose derivative is its rule's."""
    if depth <= 0:
        return True
    name = eqn.primitive.name
    if name in SINGULAR or (name == "integer_pow" and eqn.params.get("y", 1) < 0):
        return True
    return name not in _OWN_RULE and any(
        _singular(inner, depth - 1) for body in sub_jaxprs(eqn) for inner in body.eqns
    )


def sub_jaxprs(eqn) -> list:
    """The jaxprs an equation holds (a call's, a control-flow op's bodies)."""
    found = []
    for param in eqn.params.values():
        for p in param if isinstance(param, (tuple, list)) else (param,):
            inner = getattr(p, "jaxpr", p)
            if hasattr(inner, "eqns"):
                found.append(inner)
    return found


def selected_zero(graph, atom, depth: int = 8) -> bool:
    """Whether ``atom`` is a selection (``select_n``) one of whose cases is
    the constant zero and another is not, seen through conversions,
    broadcasts and ``jnp``'s wrapper calls (``jnp.where`` is one), into
    the body of a call that returns it and out to the caller of a body that
    receives it."""
    if depth <= 0 or is_literal(atom):
        return False
    found = graph.producer(atom)
    if found is None:  # a call body's input: asked where the caller computes it
        outer = graph.caller_argument(atom)
        return outer is not None and selected_zero(outer[0], outer[1], depth - 1)
    node, j = found
    eqn = graph.eqns[node]
    name = eqn.primitive.name
    if name in _PASS_THROUGH:
        return selected_zero(graph, eqn.invars[0], depth - 1)
    if name in REWRITTEN_CALLS:
        body = graph.call_body_graph(node)
        out = body.jaxpr.outvars[j]
        return selected_zero(body, out, depth - 1)
    if name != "select_n":
        return False
    zeros = [_known_zero(graph, case, depth) for case in eqn.invars[1:]]
    return any(zeros) and not all(zeros)


def _known_zero(graph, atom, depth: int) -> bool:
    """Whether ``atom`` is known while tracing to be zero in every lane."""
    for _ in range(depth):
        val = graph.known_constant(atom)
        if val is not None:
            with np.errstate(all="ignore"):
                return bool(np.all(np.asarray(val) == 0))
        if is_literal(atom):
            return False
        found = graph.producer(atom)
        if found is None:
            return False
        eqn = graph.eqns[found[0]]
        if eqn.primitive.name not in _PASS_THROUGH:
            return False
        atom = eqn.invars[0]
    return False


def where_made_zero_factors(analysis) -> list[UnguardedSite]:
    """``where(c, 1.0, 0.0) * sqrt(x)``, or JAX's own backward pass
    ``select_n(c, 0, ct) * 1.5 * x ** 0.5`` inside a loss that calls
    ``jax.grad``: a factor a ``where`` makes zero by *value* multiplies one
    whose derivative may be infinite, and ``0 * inf`` is NaN in the lanes the
    ``where`` zeroed.  Those lanes are not structurally dead (the cotangent
    reaching the other factor is the zero's value), so nothing is guarded
    there: each such ``mul`` whose derivative is used is an unguarded site
    (found by a user-style hunt: force matching with ``jax.grad`` inside the
    loss, where-made sample weights).  Asked by the reports only -- a walk
    per ``mul`` operand the trace need not pay for."""
    graph = analysis.graph
    found = []
    for node, eqn in enumerate(graph.eqns):
        if eqn.primitive.name != "mul":
            continue
        out = analysis.value_liveness(eqn.outvars[0])
        if not out.reaches_output:
            continue
        for i, v in enumerate(eqn.invars[:2]):
            other = eqn.invars[1 - i]
            if is_literal(other) or not selected_zero(graph, v):
                continue
            if graph.same_value(v, graph, other):
                # ``h * h`` of ``h = where(c, sqrt(x), 0)``: in the zeroed
                # lanes the other factor is that same zero, whose own
                # derivative there is structurally zero (the where's
                # constant case): ``2 * h * dh = 0``, no ``0 * inf``
                continue
            if singular_before(graph, other):
                found.append(UnguardedSite(node, WHERE_MADE_ZERO, out))
                break
    return found


WHERE_MADE_ZERO = (
    "a where-made zero (a value, not a dead lane) multiplies a factor whose derivative "
    "may be infinite: 0 * inf is NaN in the lanes it zeroes, unguarded -- put the where "
    "around the product (where(c, f(x), 0)), or guard the function a jax.grad inside the "
    "loss differentiates"
)
