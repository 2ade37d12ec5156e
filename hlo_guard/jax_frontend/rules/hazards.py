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
  into ``0 * inf`` when its other factor's derivative is infinite;
* :func:`where_made_zero_factors`, :func:`where_made_zero_quotients`: the
  reports' ``0 * inf`` and ``0 / 0`` of such a zero (JAX's own backward pass
  inside ``guard(jax.grad(f))`` makes both).
"""

from __future__ import annotations

import numpy as np

from hlo_guard.jax_frontend.bodies import REWRITTEN_CALLS, body_is_risky
from hlo_guard.jax_frontend.graph import is_bool, is_inexact_aval, is_literal
from hlo_guard.jax_frontend.rules.shifted_exp import bounded_by_max_shift
from hlo_guard.jax_frontend.value_bounds import lower_bound
from passes.planning import UnguardedSite

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
    whose derivative is structurally zero (:func:`_no_derivative`: that
    ``div`` of two selections between constants) is not walked."""
    stack, seen = [(graph, operand)], set()
    settled: dict = {}
    while stack:
        g, v = stack.pop()
        if is_literal(v) or (id(g), v) in seen or not g.carries_derivative(v):
            continue
        if precise and _no_derivative(g, v, settled):
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
        if precise and eqn.primitive.name in REWRITTEN_CALLS:
            body = g.call_body_graph(producer[0])
            stack.append((body, body.jaxpr.outvars[producer[1]]))
            continue
        if found_in(g, eqn):
            return True
        stack.extend((g, a) for a in eqn.invars)
    return False


#: lane-wise operations whose output has a derivative only through their
#: floating inputs' (for :func:`_no_derivative`)
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


def _no_derivative(graph, v, memo: dict, depth: int = 16) -> bool:
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
        return outer is not None and _no_derivative(outer[0], outer[1], memo, depth - 1)
    eqn = graph.eqns[found[0]]
    name = eqn.primitive.name
    if name in REWRITTEN_CALLS:
        body = graph.call_body_graph(found[0])
        return _no_derivative(body, body.jaxpr.outvars[found[1]], memo, depth - 1)
    operands = eqn.invars[1:] if name == "select_n" else eqn.invars
    if name != "select_n" and name not in _LANE_WISE:
        return False
    return all(_no_derivative(graph, a, memo, depth - 1) for a in operands)


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
    the body of a call behind it (:func:`_lies_behind`; a ``jnp`` wrapper's
    body only behind the output read)."""
    return _lies_behind(graph, operand, _singular_here, precise=True)


def _singular_here(graph, eqn) -> bool:
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
    return _no_derivative(graph, case, {}) and bool(zero_selects(graph, case, depth - 1, memo))


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
    found: list[UnguardedSite] = []
    memo: dict = {}
    for node, eqn in enumerate(graph.eqns):
        if eqn.primitive.name != "mul":
            continue
        out = analysis.value_liveness(eqn.outvars[0])
        if not out.reaches_output:
            continue
        for i, v in enumerate(eqn.invars[:2]):
            other = eqn.invars[1 - i]
            if is_literal(other) or not selected_zero(graph, v, memo=memo):
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
    "loss differentiates; if this is JAX's own backward pass of a guarded "
    "guard(jax.grad(f)), the NaN is a forward value the guard keeps: write "
    "jax.grad(guard(f))"
)


def where_made_zero_quotients(analysis) -> list[UnguardedSite]:
    """``select_n(c, 0, ct) / x``: JAX's own backward pass of
    ``where(x > 0, log(x), 0)`` (``xlogy``, ``entr``, ``log_sigmoid(log x)``
    likewise) in a guarded ``guard(jax.grad(f))`` divides a where-made zero
    by a value that is zero in the lanes the ``where`` did not take: ``0 /
    0`` is NaN there, a forward value of the guarded function, which the
    guard keeps (found by a user-style hunt: the report was clean).  Each
    ``div`` whose numerator is a where-made zero (:func:`zero_selects`) and
    whose divisor is not known to be nonzero in the lanes it zeroes
    (:func:`_divisor_nonzero`: a masked mean's ``maximum(count, 1)``, a
    constant, the double where's ``where(c, x, 1)``) is an unguarded site.
    Asked by the reports only."""
    graph = analysis.graph
    found: list[UnguardedSite] = []
    memo: dict = {}
    for node, eqn in enumerate(graph.eqns):
        if eqn.primitive.name != "div" or not is_inexact_aval(eqn.outvars[0].aval):
            continue
        out = analysis.value_liveness(eqn.outvars[0])
        if not out.reaches_output:
            continue
        num, den = eqn.invars
        sources = zero_selects(graph, num, memo=memo)
        if sources and not all(_divisor_nonzero(graph, den, s, eqn) for s in sources):
            if not _quotient_selected_where_divisor_nonzero(analysis, eqn):
                found.append(UnguardedSite(node, WHERE_MADE_ZERO_QUOTIENT, out))
    return found


def _quotient_selected_where_divisor_nonzero(analysis, div) -> bool:
    """The safe normalisation ``where(n2 > 0, p / sqrt(n2), 0)``: the
    quotient's only reader is a ``where`` that takes it only where its
    predicate makes the divisor nonzero (``n2 > 0``, ``norm != 0``, or the
    false case of ``n2 <= 0``).  Its ``0 / 0`` lanes are then never taken:
    the NaN is a dropped value, and the division's derivative in those lanes
    is dead, which the boundary guards handle (found by a user-style hunt,
    2026-11-28: the report told the user to write what they had written).
    The predicate and the divisor must be lane-aligned copies of one value
    (the same broadcasts and reshapes on both sides)."""
    found = _sole_select_reader(analysis.graph, div.outvars[0])
    if found is None:
        return False
    sgraph, select, case = found
    if len(select.invars) != 3 or not is_bool(select.invars[0]):
        return False
    cmp_graph, cmp, pred_copies = _through_copies(sgraph, select.invars[0])
    if cmp is None or cmp.primitive.name not in _COMPARISONS:
        return False
    den = div.invars[1]
    implicit: tuple = ()
    shape = tuple(div.outvars[0].aval.shape)
    den_shape = tuple(getattr(den.aval, "shape", ()))
    if den_shape != shape:
        if len(den_shape) != len(shape):
            return False
        # ``div`` broadcasts a size-1 axis itself: as ``broadcast_in_dim``
        implicit = (("broadcast_in_dim", shape, tuple(range(len(shape))), ()),)
    chain = _divisor_chain(analysis.graph, den, implicit)

    def is_divisor(x) -> bool:
        # the compared value may itself be a zero-preserving function of the
        # divisor's value (``sqrt(n2) != 0`` against ``p / sqrt(n2)``)
        compared = [(g, v) for g, v, copies in _divisor_chain(cmp_graph, x) if not copies]
        return any(
            copies == pred_copies and cg.same_value(cv, g, v)
            for g, v, copies in chain
            for cg, cv in compared
        )

    def constant(x, test) -> bool:
        val = cmp_graph.known_constant(x)
        return val is not None and bool(np.all(test(np.asarray(val))))

    return any(
        cmp.primitive.name == name
        and is_divisor(cmp.invars[side])
        and constant(cmp.invars[1 - side], test)
        for name, side, test in _DIVISOR_NONZERO_WHEN[case == 2]
    )


def _nonneg(c):
    return c >= 0


def _positive(c):
    return c > 0


def _zero(c):
    return c == 0


#: per "taken where the predicate holds" (else: where it does not), the
#: comparisons that then make operand ``side`` nonzero, given a test of the
#: constant on the other side: ``d > c >= 0``, ``d != 0``; ``not (d <= c)``
_DIVISOR_NONZERO_WHEN = {
    True: (
        ("gt", 0, _nonneg),
        ("lt", 1, _nonneg),
        ("ge", 0, _positive),
        ("le", 1, _positive),
        ("ne", 0, _zero),
        ("ne", 1, _zero),
    ),
    False: (
        ("le", 0, _nonneg),
        ("ge", 1, _nonneg),
        ("lt", 0, _positive),
        ("gt", 1, _positive),
        ("eq", 0, _zero),
        ("eq", 1, _zero),
    ),
}


#: lane-wise operations under which a value is nonzero exactly where its
#: operand is (``sqrt`` of a positive value is positive)
_ZERO_PRESERVING = frozenset({"sqrt", "abs", "neg"})
#: copies that move lanes; the predicate must have made the same ones
_LANE_COPIES = frozenset({"broadcast_in_dim", "reshape", "squeeze", "expand_dims"})


def _divisor_chain(graph, atom, copies: tuple = (), depth: int = 8) -> list:
    """``(graph, value, copies)`` for the divisor and each value it is
    computed from by zero-preserving operations and lane copies; ``copies``
    are the lane copies between that value and the division (``copies``
    given: the division's own implicit broadcast)."""
    chain = []
    for _ in range(depth):
        graph, atom = graph.value_source(atom)
        chain.append((graph, atom, copies))
        found = None if is_literal(atom) else graph.producer(atom)
        if found is None:
            break
        eqn = graph.eqns[found[0]]
        name = eqn.primitive.name
        if name in _LANE_COPIES:
            copies = (_copy_key(eqn), *copies)
        elif name not in _ZERO_PRESERVING:
            break
        atom = eqn.invars[0]
    return chain


def _through_copies(graph, atom):
    """(graph, the equation that computes ``atom`` beneath lane copies, the
    copies' keys innermost first) -- the comparison a ``where``'s broadcast
    predicate is; (graph, None, ()) when there is none."""
    passed: list = []
    found = graph.beneath(atom, _LANE_COPIES, passed=passed)
    if found is None:
        return graph, None, ()
    return found[0], found[1], tuple(_copy_key(e) for e in reversed(passed))


def _copy_key(eqn):
    return (
        eqn.primitive.name,
        tuple(eqn.outvars[0].aval.shape),
        tuple(eqn.params.get("broadcast_dimensions", ()) or ()),
        tuple(eqn.params.get("dimensions", ()) or ()),
    )


def _sole_select_reader(graph, var, depth: int = 8):
    """(graph, ``select_n`` equation, case index) when ``var``'s one reader
    is a ``select_n`` case, followed out of the call that computes it
    (``jnp.divide``'s ``jit``) and into the call that wraps the select
    (``jnp.where``'s); else None."""
    for _ in range(depth):
        readers = [
            (n, i) for n, e in enumerate(graph.eqns) for i, v in enumerate(e.invars) if v is var
        ]
        results = sum(1 for o in graph.jaxpr.outvars if o is var)
        if results:
            target = graph.result_target(var)
            if readers or results != 1 or target is None:
                return None
            graph, var = target
            continue
        if len(readers) != 1:
            return None
        node, index = readers[0]
        eqn = graph.eqns[node]
        if eqn.primitive.name == "select_n":
            return (graph, eqn, index) if index >= 1 else None
        if eqn.primitive.name not in REWRITTEN_CALLS | {"pjit"}:
            return None
        body = graph.call_body_graph(node)
        if len(body.jaxpr.invars) != len(eqn.invars):
            return None
        graph, var = body, body.jaxpr.invars[index]
    return None


def _divisor_nonzero(graph, den, source, div) -> bool:
    """Whether the divisor ``den`` is known nonzero in the lanes the
    selection ``source`` (:func:`zero_selects`) zeroes: in every lane
    (:func:`_nonzero`), or -- the double where -- it is a selection on the
    same predicate whose cases are nonzero where ``source`` takes a zero.
    The lanes correspond only when both selections have the division's
    shape (the walks between see lane-wise operations and copies only)."""
    if _nonzero(graph, den):
        return True
    sgraph, seqn, zero = source
    found = _selection(graph, den)
    if found is None:
        return False
    g, eqn = found
    shape = div.outvars[0].aval.shape
    if (
        len(eqn.invars) != len(seqn.invars)
        or eqn.outvars[0].aval.shape != shape
        or seqn.outvars[0].aval.shape != shape
        or not same_predicate(g, eqn.invars[0], sgraph, seqn.invars[0])
    ):
        return False
    return all(_nonzero(g, eqn.invars[1 + k]) for k in zero)


#: copies that keep a value's lanes nonzero (for :func:`_nonzero`); not a
#: narrowing conversion, which can flush a tiny value to zero
_NONZERO_COPIES = frozenset({"neg", "broadcast_in_dim", "reshape", "squeeze"})


def _nonzero(graph, atom, depth: int = 8) -> bool:
    """Whether every lane of ``atom`` is known nonzero while tracing: a
    constant without zeros, a positive lower bound
    (:func:`value_bounds.lower_bound`: ``maximum(count, 1)``), a copy or
    negation of one, a selection between them (``maximum``'s JVP in older
    JAX divides by ``select_n(t, 1, 2)``)."""
    if depth <= 0:
        return False
    val = graph.known_constant(atom)
    if val is not None:
        with np.errstate(all="ignore"):
            return bool(np.all(np.asarray(val) != 0))
    bound = lower_bound(graph, atom)
    if bound is not None and bound > 0:
        return True
    graph, atom = graph.value_source(atom)
    found = None if is_literal(atom) else graph.producer(atom)
    if found is None:
        return False
    eqn = graph.eqns[found[0]]
    name = eqn.primitive.name
    if name in _NONZERO_COPIES:
        return _nonzero(graph, eqn.invars[0], depth - 1)
    return name == "select_n" and all(_nonzero(graph, c, depth - 1) for c in eqn.invars[1:])


def _selection(graph, atom):
    """(graph, the ``select_n`` equation) ``atom`` is, seen through calls
    and the copies that keep a lane nonzero; else None."""
    found = graph.beneath(atom, _NONZERO_COPIES)
    return found if found is not None and found[1].primitive.name == "select_n" else None


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
        and ea.primitive.name in _COMPARISONS
        and ea.params == eb.params
        and all(_same_operand(ga, u, gb, v) for u, v in zip(ea.invars, eb.invars))
    )


_COMPARISONS = frozenset({"gt", "ge", "lt", "le", "eq", "ne"})


def _same_operand(ga, u, gb, v) -> bool:
    """One value, or equal constants (the literal ``0.0`` of ``x > 0``)."""
    if ga.same_value(u, gb, v):
        return True
    cu, cv = ga.known_constant(u), gb.known_constant(v)
    if cu is None or cv is None:
        return False
    cu, cv = np.asarray(cu), np.asarray(cv)
    return cu.shape == cv.shape and cu.dtype == cv.dtype and bool(np.all(cu == cv))


WHERE_MADE_ZERO_QUOTIENT = (
    "a where-made zero (a value, not a dead lane) is divided by a value not known to be "
    "nonzero in the lanes it zeroes: 0 / 0 is NaN there, unguarded -- divide inside the "
    "where (where(c, a / b, 0)) or make the divisor nonzero there (where(c, b, 1)); if "
    "this is JAX's own backward pass of a guarded guard(jax.grad(f)), the NaN is a "
    "forward value the guard keeps: write jax.grad(guard(f))"
)
