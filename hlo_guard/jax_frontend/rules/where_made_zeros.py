"""The reports' where-made zeros: a factor or numerator a ``where`` makes
zero by *value* (not a dead lane, so nothing is guarded there) meeting an
infinite derivative or a zero divisor -- ``0 * inf`` and ``0 / 0`` in the
lanes it zeroes.  Asked by ``explain`` only: walks per ``mul`` and ``div``
the trace need not pay for.  What lies behind a value is asked of
:mod:`hazards`; what a predicate says about a value, of
:mod:`predicate_facts`.
"""

from __future__ import annotations

import math

import numpy as np

from hlo_guard.jax_frontend.bodies import REWRITTEN_CALLS
from hlo_guard.jax_frontend.graph import is_inexact_aval, is_literal
from hlo_guard.jax_frontend.rules.hazards import (
    no_derivative,
    operand_source,
    same_predicate,
    selected_zero,
    singular_before,
    singular_here,
    zero_selects,
)
from hlo_guard.jax_frontend.rules.predicate_facts import (
    case_facts,
    implicit_broadcast,
    implied_bounded_above,
    implied_nonzero,
)
from hlo_guard.jax_frontend.value_bounds import lower_bound
from passes.fact_walk import walk_with_facts
from passes.planning import UnguardedSite


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
            if singular_before(graph, other) and not _finite_where_zeroed(analysis, graph, eqn, i):
                found.append(UnguardedSite(node, WHERE_MADE_ZERO, out))
                break
    return found


#: singular operations whose derivative is finite wherever one operand is
#: nonzero -- or positive: ``(operand index, positive needed)``.  ``sqrt``
#: and ``log`` of a negative value are NaN already in the forward pass.
#: Also ``integer_pow`` by a negative exponent and ``pow`` by a constant one
#: (:func:`_finite_by_facts`).
_SINGULAR_ONLY_AT_ZERO = {
    "div": (1, False),
    "cbrt": (0, False),
    "sqrt": (0, True),
    "rsqrt": (0, True),
    "log": (0, True),
}


#: the walk behind a product gives up on reaching this many values
#: (:func:`_finite_where_zeroed`, :mod:`passes.fact_walk`)
_MAX_WALK = 4096


def _finite_where_zeroed(analysis, graph, mul, zero_index: int) -> bool:
    """Whether the other factor of ``mul`` has a finite derivative in every
    lane its where-made zero factor zeroes, by what the ``where``s' predicates
    say (:mod:`predicate_facts`).  jax_md's ``multiplicative_isotropic_cutoff``
    multiplies ``where(dr < r_c, poly(dr), 0)`` by ``sigma / dr``: zero only
    where ``dr >= r_c > 0``, where the quotient is finite; a masked
    ``m * where(x > 0, sqrt(x), 0)`` takes the ``sqrt`` only where ``x > 0``
    (found by a user-style hunt, 2026-11-28: both were reported).

    Walks the values behind the other factor that carry a derivative, as
    :func:`singular_before` does, collecting what the ``where``s on the way
    say about their lanes; each singular operation met must be one that is
    finite where an operand is nonzero (:data:`_SINGULAR_ONLY_AT_ZERO`), that
    operand known nonzero there.  Lanes must line up: the zeroing selection
    and every operation walked have the product's shape and are lane-wise
    (no transposes, reductions or broadcasts between).  Behind an operation
    that moves lanes, nothing singular may lie at all.  A ``where`` that
    reads the product (its sole reader) adds what its predicate says about
    the lanes it takes it in; where that makes the zero factor itself nonzero
    (``where(a > 0, a * log(a), 0)``), the zeroed lanes are never taken."""
    shape = tuple(mul.outvars[0].aval.shape)
    # the product's own reader may take it only where its predicate says
    # something (``where(a > 0, a * log(a), 0)``): the other lanes are dead
    reader = _sole_select_reader(graph, mul.outvars[0])
    taken = case_facts(reader[0], reader[1], reader[2] - 1) if reader is not None else ()
    zero = mul.invars[zero_index]
    implicit = implicit_broadcast(zero, mul.outvars[0])
    if implicit is not None and implied_nonzero(graph, zero, implicit, taken):
        # ``where(a > 0, a * log(a), 0)``: the lanes where ``a`` is zero are
        # never taken
        return True
    zero_facts = [
        taken
        + (
            case_facts(sg, select, next(iter(cases)), bounds=True)
            if len(cases) == 1 and tuple(select.outvars[0].aval.shape) == shape
            else ()
        )
        for sg, select, cases in zero_selects(graph, zero)
    ]
    settled: dict = {}

    def admit(item) -> bool:
        g, v = item
        return not (is_literal(v) or not g.carries_derivative(v) or no_derivative(g, v, settled))

    def step(item, facts):
        g, v = item
        producer = g.producer(v)
        if producer is None:
            outer = g.caller_argument(v) or operand_source(g, v)
            if outer is not None:
                return [((outer[0], outer[1]), facts)]
            # a loop body's carry (from the last iteration) ends the walk
            return None if g.scope else []
        eqn = g.eqns[producer[0]]
        if eqn.primitive.name in REWRITTEN_CALLS:
            body = g.call_body_graph(producer[0])
            return [((body, body.jaxpr.outvars[producer[1]]), facts)]
        if not _lane_wise(analysis, eqn, shape):
            return None if singular_before(g, v) else []
        if singular_here(g, eqn) and not all(
            _finite_by_facts(g, eqn, (*known, *facts)) for known in zero_facts
        ):
            return None
        operands = list(enumerate(eqn.invars))
        if eqn.primitive.name == "select_n":
            operands = operands[1:]
        found = []
        for k, a in operands:
            if is_literal(a) or not g.carries_derivative(a):
                continue
            if tuple(a.aval.shape) != shape:
                # broadcast by the operation (``sigma / dr`` of a scalar
                # ``sigma``): its cotangent sums every lane's
                if singular_before(g, a):
                    return None
                continue
            if eqn.primitive.name == "select_n":
                found.append(((g, a), facts | set(case_facts(g, eqn, k - 1))))
            else:
                found.append(((g, a), facts))
        return found

    start = (graph, mul.invars[1 - zero_index])
    key = lambda item: (id(item[0]), item[1])  # noqa: E731
    # (gives up on reaching _MAX_WALK values)
    return walk_with_facts(start, admit, key, step, _MAX_WALK - 1)


def _lane_wise(analysis, eqn, shape: tuple) -> bool:
    """Whether ``eqn`` maps each lane of its operands of ``shape`` to the same
    lane of its outputs, all of ``shape`` (an operand of another shape is
    broadcast by the operation: the walk treats it as lanes mixing)."""
    rule = analysis.rules.get(eqn.primitive.name)
    if rule is None or not (rule.lane_local == "same-shape" or rule.kind == "pass-through"):
        return False
    return all(tuple(o.aval.shape) == shape for o in eqn.outvars)


def _finite_by_facts(graph, eqn, facts) -> bool:
    """Whether ``facts`` make the singular ``eqn``'s derivative finite: the
    operand it is singular at zero in nonzero (positive) in their lanes; for
    ``exp`` (singular where it overflows), its operand or its result bounded
    above (distrax's ``mul_exp``: ``where(exp(logp) == 0, 0, x) * exp(logp)``)."""
    name = eqn.primitive.name
    need: tuple[int, bool] | None
    if name == "exp":
        return any(
            (implicit := implicit_broadcast(v, eqn.outvars[0])) is not None
            and implied_bounded_above(graph, v, implicit, facts)
            for v in (eqn.invars[0], eqn.outvars[0])
        )
    if name == "integer_pow" and eqn.params.get("y", 1) < 0:
        need = (0, False)
    elif name == "pow":
        # ``d ** -0.5`` (a GCN's normalisation): singular at a zero base only
        # when the exponent is a known constant, without a derivative of its own
        y = graph.known_constant(eqn.invars[1])
        if y is None:
            return False
        with np.errstate(all="ignore"):
            y = np.asarray(y, np.float64)
            if np.all(y >= 1):  # ``d ** 1.5``: finite derivative at 0
                return True
            need = (0, not bool(np.all(y == np.round(y))))
    else:
        need = _SINGULAR_ONLY_AT_ZERO.get(name)
    if need is None:
        return False
    index, positive = need
    operand = eqn.invars[index]
    implicit = implicit_broadcast(operand, eqn.outvars[0])
    return implicit is not None and implied_nonzero(graph, operand, implicit, facts, positive)


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
        if _one_divisor_for_every_lane(graph, den, eqn):
            continue
        sources = zero_selects(graph, num, memo=memo)
        if sources and not all(_divisor_nonzero(graph, den, s, eqn) for s in sources):
            if not _quotient_selected_where_divisor_nonzero(analysis, eqn):
                found.append(UnguardedSite(node, WHERE_MADE_ZERO_QUOTIENT, out))
    return found


def _one_divisor_for_every_lane(graph, den, div) -> bool:
    """Whether ``den`` is one number shared by every lane of a quotient of
    several (a scalar, broadcast: a GP kernel's ``r / lengthscale``).  If it
    is zero, every lane's quotient is singular, not only the ones a ``where``
    zeroed: a singularity of the user's own division, visible in its forward
    value, not a where-made one (found by a user-style hunt, 2026-11-28:
    every Matern kernel differentiated in its lengthscale was reported)."""
    if math.prod(div.outvars[0].aval.shape) <= 1:
        return False
    passed: list = []
    graph.beneath(den, _SHARED_COPIES, passed=passed)
    copied = [den, *(eqn.invars[0] for eqn in passed)]
    return any(math.prod(getattr(v.aval, "shape", ())) == 1 for v in copied)


#: operations that copy one value to more lanes (:func:`_one_divisor_for_every_lane`)
_SHARED_COPIES = frozenset({"broadcast_in_dim", "reshape", "squeeze", "convert_element_type"})


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
    den = div.invars[1]
    implicit = implicit_broadcast(den, div.outvars[0])
    if implicit is None:
        return False
    facts = case_facts(sgraph, select, case - 1)
    return implied_nonzero(analysis.graph, den, implicit, facts)


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


WHERE_MADE_ZERO_QUOTIENT = (
    "a where-made zero (a value, not a dead lane) is divided by a value not known to be "
    "nonzero in the lanes it zeroes: 0 / 0 is NaN there, unguarded -- divide inside the "
    "where (where(c, a / b, 0)) or make the divisor nonzero there (where(c, b, 1)); if "
    "this is JAX's own backward pass of a guarded guard(jax.grad(f)), the NaN is a "
    "forward value the guard keeps: write jax.grad(guard(f))"
)
