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

The reports' ``0 * inf`` and ``0 / 0`` of such a zero are in
:mod:`where_made_zeros`.
"""

from __future__ import annotations

import numpy as np

from hlo_guard.jax_frontend.bodies import REWRITTEN_CALLS, body_is_risky
from hlo_guard.jax_frontend.graph import is_bool, is_inexact_aval, is_literal
from hlo_guard.jax_frontend.rules.shifted_exp import bounded_by_max_shift
from passes.comparisons import COMPARISONS

#: operations that hand a value's lanes on unchanged (for :func:`selected_zero`)
_PASS_THROUGH = frozenset({"convert_element_type", "broadcast_in_dim", "reshape", "squeeze"})


def hazard_before(analysis, operand) -> bool:
    """Whether a zero cotangent handed back through ``operand`` could meet
    a possibly infinite derivative before it: an operation behind it whose
    rule guards an input, a risky body, an op without a rule
    (:func:`_lies_behind`).  The guarded function's own arguments, and
    values behind only linear operations on them, have nothing to protect."""

    def hazardous(_graph, eqn) -> bool:
        rule = analysis.rules.get(eqn.primitive.name)
        if rule is None or any(body_is_risky(b) for b in sub_jaxprs(eqn)):
            return True
        return bool(rule.guards) and any(
            not is_literal(a) and is_inexact_aval(a.aval) for a in eqn.invars
        )

    return _lies_behind(analysis.graph, operand, hazardous)


def _lies_behind(graph, operand, found_in, precise: bool = False) -> bool:
    """Whether ``found_in(eqn)`` holds for an equation behind ``operand``,
    walking the values it is computed from that carry a derivative: in this
    graph, and -- through a call body's link to its caller -- in the graphs
    around it.  An input of a body without that link (a loop body: its
    carries come from the last iteration) counts as found.  ``precise`` (the
    reports' question): a ``jnp`` wrapper call's output is followed into its
    body from that output, not taken as computed from every input by every
    equation of the body (an eager trace's ``jnp.maximum`` also returns its
    JVP's ``div``, which is not behind the maximum itself); and a value
    whose derivative is structurally zero (:func:`no_derivative`: that
    ``div`` of two selections between constants) is not walked."""
    stack, seen = [(graph, operand)], set()
    settled: dict = {}
    while stack:
        g, v = stack.pop()
        if is_literal(v) or (id(g), v) in seen or not g.carries_derivative(v):
            continue
        if precise and no_derivative(g, v, settled):
            continue
        seen.add((id(g), v))
        producer = g.producer(v)
        if producer is None:
            outer = g.caller_argument(v) or operand_source(g, v)
            if outer is not None:
                stack.append(outer)
            elif g.scope:  # a body's input from a caller not linked
                return True
            continue
        eqn = g.eqns[producer[0]]
        if precise and eqn.primitive.name in REWRITTEN_CALLS:
            body = g.call_body_graph(producer[0])
            stack.append((body, body.jaxpr.outvars[producer[1]]))
            continue
        if found_in(g, eqn):
            return True
        stack.extend((g, a) for a in eqn.invars)
    return False


#: lane-wise operations whose output has a derivative only through their
#: floating inputs' (for :func:`no_derivative`)
_LANE_WISE = frozenset(
    {
        "neg",
        "add",
        "sub",
        "mul",
        "div",
        "convert_element_type",
        "broadcast_in_dim",
        "reshape",
        "squeeze",
    }
)


def no_derivative(graph, v, memo: dict, depth: int = 16) -> bool:
    """Whether ``v``'s derivative is structurally zero: computed from
    constants by selections (whose predicate carries no derivative) and
    lane-wise arithmetic -- JAX's JVP coefficients, ``select_n(c, 0, 1) /
    select_n(t, 1, 2)`` for ``maximum`` before JAX 0.11 -- seen into calls
    and out to a body's caller.  Unsure (too deep, an input) is False."""
    if is_literal(v) or not graph.carries_derivative(v):
        return True
    key = (id(graph), v)
    if depth <= 0 or memo.get(key) is False:
        return False
    if key not in memo:
        memo[key] = False  # no re-entry (a jaxpr has no cycle)
        memo[key] = _settled_by(graph, v, memo, depth)
    return memo[key]


def _settled_by(graph, v, memo: dict, depth: int) -> bool:
    found = graph.producer(v)
    if found is None:
        outer = graph.caller_argument(v)
        return outer is not None and no_derivative(outer[0], outer[1], memo, depth - 1)
    eqn = graph.eqns[found[0]]
    name = eqn.primitive.name
    if name in REWRITTEN_CALLS:
        body = graph.call_body_graph(found[0])
        return no_derivative(body, body.jaxpr.outvars[found[1]], memo, depth - 1)
    operands = eqn.invars[1:] if name == "select_n" else eqn.invars
    if name != "select_n" and name not in _LANE_WISE:
        return False
    return all(no_derivative(graph, a, memo, depth - 1) for a in operands)


def operand_source(graph, v):
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
    the body of a call behind it (:func:`_lies_behind`; a ``jnp`` wrapper's
    body only behind the output read)."""
    return _lies_behind(graph, operand, singular_here, precise=True)


def singular_here(graph, eqn) -> bool:
    """:func:`_singular`, except a softmax's max-shifted ``exp`` and the
    ``log`` of its sum, whose derivatives are at most 1
    (:mod:`shifted_exp`): a one-hot cross-entropy is not ``0 * inf``."""
    return not bounded_by_max_shift(graph, eqn) and _singular(eqn)


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


def selected_zero(graph, atom, depth: int = 16, memo: dict | None = None) -> bool:
    """Whether ``atom`` is zero by value in some lanes a ``where`` picks
    (:func:`zero_selects`)."""
    return bool(zero_selects(graph, atom, depth, {} if memo is None else memo))


#: operations whose output is zero wherever the listed inputs are a
#: where-made zero, for :func:`zero_selects`: a negation, a product with such
#: a factor, a quotient with such a numerator.  Where the other operand is
#: infinite (the divisor zero) the operation makes ``0 * inf`` (``0 / 0``)
#: itself, which :func:`where_made_zero_factors`
#: (:func:`where_made_zero_quotients`) reports there; JAX's backward passes
#: scale the zero this way (``neg(select_n(c, 0, ct))`` in ``entr``'s,
#: ``ct * 0.5`` of ``maximum``'s tie rule)
_KEEPS_ZERO = {"neg": (0,), "mul": (0, 1), "div": (0,)}


def zero_selects(graph, atom, depth: int = 16, memo: dict | None = None) -> list[tuple]:
    """The selections that make ``atom`` zero by value in some lanes, each
    as ``(graph, select_n equation, indices of its cases that are zero)``:
    a ``select_n`` one of whose cases is the constant zero -- or, nested,
    such a selection between constants (:func:`_zero_coefficient`) -- and
    not every case the constant zero; seen through
    conversions, broadcasts, ``jnp``'s wrapper calls (``jnp.where`` is
    one), :data:`_KEEPS_ZERO`'s operations, into the body of a call that
    returns it and out to the caller of a body that receives it.  ``memo``
    keeps the walk linear in a chain of products."""
    memo = {} if memo is None else memo
    key = (id(graph), atom, depth)
    if depth <= 0 or is_literal(atom):
        return []
    if key not in memo:
        memo[key] = []  # no re-entry (a jaxpr has no cycle)
        memo[key] = _zero_selects(graph, atom, depth, memo)
    return memo[key]


def _zero_selects(graph, atom, depth: int, memo: dict) -> list[tuple]:
    found = graph.producer(atom)
    if found is None:  # a call body's input: asked where the caller computes it
        outer = graph.caller_argument(atom)
        return [] if outer is None else zero_selects(outer[0], outer[1], depth - 1, memo)
    node, j = found
    eqn = graph.eqns[node]
    name = eqn.primitive.name
    if name == "convert_element_type" and is_bool(eqn.invars[0]):
        # ``m.astype(float)``: a 0/1 mask (Keras's ``cast(mask) * loss``), the
        # where ``select_n(m, 0, 1)`` written as a conversion
        return [(graph, eqn, frozenset({0}))]
    if name in _PASS_THROUGH:
        return zero_selects(graph, eqn.invars[0], depth - 1, memo)
    if name in _KEEPS_ZERO:
        return [
            s
            for i in _KEEPS_ZERO[name]
            for s in zero_selects(graph, eqn.invars[i], depth - 1, memo)
        ]
    if name in REWRITTEN_CALLS:
        body = graph.call_body_graph(node)
        return zero_selects(body, body.jaxpr.outvars[j], depth - 1, memo)
    if name != "select_n":
        return []
    cases = eqn.invars[1:]
    known = [_known_zero(graph, case, depth) for case in cases]
    zero = frozenset(
        k for k, case in enumerate(cases) if known[k] or _zero_coefficient(graph, case, depth, memo)
    )
    return [(graph, eqn, zero)] if zero and not all(known) else []


def _zero_coefficient(graph, case, depth: int, memo: dict) -> bool:
    """Whether a selection's ``case`` is itself a where-made zero between
    constants (no derivative): ``maximum``'s JVP coefficient ``select_n(c,
    select_n(t, 0, .5), 1)``.  Not a where-made zero with a derivative
    (``where(r < r_on, 1, where(r < r_c, poly(r), 0))``, a smooth cutoff):
    lanes where that is zero are a user's function, not an AD coefficient,
    and a ``mul`` of it is asked as the ``where`` itself would be."""
    return no_derivative(graph, case, {}) and bool(zero_selects(graph, case, depth - 1, memo))


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


def same_predicate(ga, a, gb, b) -> bool:
    """Whether predicates ``a`` and ``b`` hold one value: the same value
    (:meth:`JaxprGraph.same_value`), or one comparison of the same values
    and constants written twice (``where(x > 0, log(where(x > 0, x, 1)),
    0)`` compares twice)."""
    if ga.same_value(a, gb, b):
        return True
    ga, a = ga.value_source(a)
    gb, b = gb.value_source(b)
    ea, eb = (None if is_literal(v) else g.producer(v) for g, v in ((ga, a), (gb, b)))
    if ea is None or eb is None:
        return False
    ea, eb = ga.eqns[ea[0]], gb.eqns[eb[0]]
    return (
        ea.primitive.name == eb.primitive.name
        and ea.primitive.name in COMPARISONS
        and ea.params == eb.params
        and all(_same_operand(ga, u, gb, v) for u, v in zip(ea.invars, eb.invars))
    )


def _same_operand(ga, u, gb, v) -> bool:
    """One value, or equal constants (the literal ``0.0`` of ``x > 0``)."""
    if ga.same_value(u, gb, v):
        return True
    cu, cv = ga.known_constant(u), gb.known_constant(v)
    if cu is None or cv is None:
        return False
    cu, cv = np.asarray(cu), np.asarray(cv)
    return cu.shape == cv.shape and cu.dtype == cv.dtype and bool(np.all(cu == cv))
