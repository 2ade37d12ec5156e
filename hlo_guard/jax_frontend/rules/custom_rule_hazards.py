"""Dead lanes inside a custom derivative rule: reported, never rewritten.

A ``custom_jvp``/``custom_vjp`` call's derivative is its own rule, which the
guard never sees in the program's jaxpr.  A rule that selects
(``where(x > 0, 0.5 / sqrt(x), 0) * t``) is fine to first order; a derivative
of the derivative *in reverse* (``jacrev(grad)``, ``grad(grad)``) then
differentiates the rule's own computation, and the zero cotangent its dead
branch gets meets ``sqrt``'s infinite derivative there: NaN in exactly the
lanes the rule meant to drop (found by a user-style hunt, 2026-11-27: both JAX
versions, eager and under ``jit``; forward over reverse, ``jax.hessian``, is
exact).  :func:`custom_rule_hazards` names such calls as unguarded sites.
A rule whose *tangent* passes through the dead branch (``where(n > 0,
dot(x, t) / n, 0)``) is NaN already in a first reverse derivative, which
transposes that division; its sites are marked (:data:`IN_ITS_TANGENT`) and
the reason says so (a hunt, 2026-11-28: it said second order only).

The rule is analysed as a program of its own, with the rule table, every
derivative output live: a guard site it would get is a dead lane of its own
selection reaching an operation with a possibly infinite derivative.  The
``custom_jvp`` rule is its jaxpr (:func:`compat.custom_jvp_rule_jaxpr`, the
one JAX's JVP of the call evaluates; only its tangent outputs count); a
``custom_vjp``'s backward function is traced as ``jax.vjp`` of the call
(forward and backward rule inline, cotangents out), abstractly -- one trace
per call, asked by the reports only.  A rule that only selects, adds and
moves its tangents (``relu``: :func:`calls.rule_preserves_zero`) has a
derivative of zero in the primals and is not traced at all.

Guard sites on a *nested* custom call inside the rule are not counted: that
call's derivative is again its own rule (``softplus``'s rule reads
``where(out == inf, 0, out)`` of the ``logaddexp`` it calls, a dead lane
only where the value is already infinite).  Where the call's primal body
hazards are reported on it already (:func:`calls.note_dead_hazards_in_body`:
a ``custom_vjp``, a ``custom_jvp`` around a loop -- optimistix's
implicit-function rule differentiates the residual again), the lines that
report names are not repeated.
"""

from __future__ import annotations

import weakref
from typing import cast

import numpy as np

from hlo_guard.jax_frontend.bodies import body_of, scope_name
from hlo_guard.jax_frontend.graph import JaxprGraph, is_inexact_aval, is_literal
from hlo_guard.jax_frontend.plan import plan_of
from hlo_guard.jax_frontend.rule_table import RULES
from hlo_guard.jax_frontend.rules.hazards import same_predicate
from hlo_guard.source import traced_function
from passes.lattice import LIVE, NO_DERIVATIVE, join_all
from passes.planning import UnguardedSite

_CUSTOM = ("custom_jvp_call", "custom_vjp_call")

#: call body jaxpr -> {perturbed operands: the hazards of its rule, as
#: "prim at file:line"} (weakly keyed, as :data:`calls._ZERO_PRESERVING`:
#: one rule per body)
_RULE_HAZARDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def custom_rule_hazards(analysis) -> list[UnguardedSite]:
    """An unguarded site on every custom call of ``analysis``'s graph whose
    derivative is used and whose own rule selects with dead lanes reaching
    an operation with a possibly infinite derivative."""
    graph = analysis.graph
    found = []
    for node, eqn in enumerate(graph.eqns):
        if eqn.primitive.name not in _CUSTOM or not eqn.outvars:
            continue
        out = join_all([analysis.value_liveness(v) for v in eqn.outvars])
        if not out.reaches_output:
            continue
        hazards = rule_hazards(eqn, _perturbed(analysis, eqn))
        if hazards:
            found.append(UnguardedSite(node, _message(eqn, hazards), out))
    return found


def _perturbed(analysis, eqn) -> tuple[int, ...]:
    """The operands of ``eqn`` whose tangent may be non-zero (the forward
    analysis of its graph): the ones JAX's AD hands the rule as perturbed.
    Equinox's ``filter_custom_vjp`` asserts that its other array arguments
    are not (every diffrax solve), so the rule is traced with those only."""
    forward = plan_of(analysis).forward
    n = eqn.params.get("num_consts", 0)
    return tuple(
        i
        for i, v in enumerate(eqn.invars)
        if i >= n
        and not is_literal(v)
        and is_inexact_aval(v.aval)
        and forward.value_liveness(v).reaches_output
    )


def rule_hazards(eqn, perturbed: tuple[int, ...]) -> tuple[str, ...]:
    """``prim at file:line`` of every hazard of ``eqn``'s own rule (see the
    module docstring) when the operands ``perturbed`` carry tangents;
    ``("<why>",)`` where the rule could not be read."""
    from hlo_guard.jax_frontend.rules.calls import rule_preserves_zero

    if not perturbed:
        return ()
    if eqn.primitive.name == "custom_jvp_call" and rule_preserves_zero(eqn):
        return ()  # relu: no primal dependence left to differentiate
    per_body = _RULE_HAZARDS.setdefault(body_of(eqn)[0], {})
    found = per_body.get(perturbed)
    if found is None:
        found = per_body[perturbed] = _read_hazards(eqn, perturbed)
    return found


def _read_hazards(eqn, perturbed) -> tuple[str, ...]:
    try:
        read = _jvp_rule(eqn) if eqn.primitive.name == "custom_jvp_call" else None
        if read is None:
            read = _vjp_program(eqn, perturbed)
    except Exception as err:  # noqa: BLE001 - not readable: say so, never stay silent
        return (f"<its rule could not be traced for this check: {type(err).__name__}>",)
    jaxpr, outs, tangents = read
    hazards = _hazards(jaxpr, outs, tangents)
    if hazards and _body_reported(eqn):
        # its body's hazards are named already (note_dead_hazards_in_body):
        # only lines that report does not name (the rule's own where)
        from hlo_guard.jax_frontend.rules.calls import _BODY_HAZARDS, _dead_hazards

        body = body_of(eqn)[0]
        reported = _BODY_HAZARDS.get(body)
        if reported is None:
            reported = _BODY_HAZARDS[body] = tuple(_dead_hazards(body, scope_name("", eqn)))
        lines = {h.partition(" at ")[2] for h in reported} - {""}
        hazards = [
            h
            for h in hazards
            if h.removesuffix(IN_ITS_TANGENT) not in reported
            and h.removesuffix(IN_ITS_TANGENT).partition(" at ")[2] not in lines
        ]
    return tuple(hazards)


def _body_reported(eqn) -> bool:
    """Whether the call's body hazards are reported on the call itself (the
    condition of :meth:`calls.CustomCall.transfer`)."""
    from hlo_guard.jax_frontend.rules.calls import _body_iterates

    return eqn.primitive.name == "custom_vjp_call" or _body_iterates(body_of(eqn)[0])


def _jvp_rule(eqn):
    """The ``custom_jvp`` rule's jaxpr, every tangent instantiated, with its
    tangent outputs live and its primal outputs without derivative; None
    where it is not to be had (an integer operand: ``jax.vjp`` then)."""
    from hlo_guard.jax_frontend.compat import custom_jvp_rule_jaxpr

    n = eqn.params.get("num_consts", 0)
    operands = eqn.invars[n:]
    if not all(is_inexact_aval(v.aval) for v in operands):
        return None
    found = custom_jvp_rule_jaxpr(eqn, [False] * len(operands))
    if found is None:  # pragma: no cover - a future JAX
        return None
    jaxpr, _, out_zeros = found
    n_tangents = len(jaxpr.outvars) - len(out_zeros)
    tangents = frozenset(jaxpr.invars[len(operands) :])
    return jaxpr, [NO_DERIVATIVE] * len(out_zeros) + [LIVE] * n_tangents, tangents


def _vjp_program(eqn, diff):
    """``jax.vjp`` of the call in its operands ``diff``, traced at
    abstract values: the forward rule's residuals and the backward rule,
    inline, cotangents out -- what a derivative of its derivative
    differentiates."""
    import jax

    from hlo_guard.jax_frontend.binding import bind_eqn

    avals = [v.aval for v in eqn.invars]

    def vjp(primals, cts):
        def call(*xs):
            full = list(primals)
            for i, x in zip(diff, xs):
                full[i] = x
            return bind_eqn(eqn, full)

        _, pull = jax.vjp(call, *[primals[i] for i in diff])
        return pull(cts)

    def spec(aval):
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype)

    closed = jax.make_jaxpr(vjp)([spec(a) for a in avals], [spec(v.aval) for v in eqn.outvars])
    return closed.jaxpr, [LIVE] * len(closed.jaxpr.outvars), frozenset()


#: marks a hazard whose dead operand is computed from the rule's tangents
IN_ITS_TANGENT = " (on its tangent)"


def _hazards(jaxpr, outs, tangents: frozenset = frozenset()) -> list[str]:
    """``prim at file:line`` of the guard sites ``jaxpr`` would get, nested
    plain calls and control flow included, nested custom calls (their own
    rules) and their bodies not; the user's own lines first.  A site of the
    rule itself whose dead operand is computed from ``tangents`` (the
    ``custom_jvp`` rule's tangent inputs: ``where(n > 0, dot(x, t) / n,
    0)``) is marked :data:`IN_ITS_TANGENT`: reverse mode transposes that
    computation, so already a first derivative divides its zero there."""
    from hlo_guard.source import eqn_location, in_installed_package
    from passes.analysis import analyze
    from passes.planning import plan_guards

    own: list[str] = []
    library: list[str] = []
    root = analyze(JaxprGraph(jaxpr, "rule"), RULES, outs)
    from_tangents = _computed_from(jaxpr, tangents)
    stack = [root]
    while stack:
        sub = stack.pop()
        if plan_of(sub).mask_only:  # a nested custom call's body
            continue
        graph = cast(JaxprGraph, sub.graph)  # rule jaxprs and their bodies
        for site in plan_guards(sub)[0]:
            e = graph.eqns[site.node]
            if e.primitive.name in _CUSTOM or _double_where(graph, site):
                continue
            loc = eqn_location(e)
            text = f"{e.primitive.name} at {loc}" if loc else e.primitive.name
            if sub is root and e.invars[site.index] in from_tangents:
                text += IN_ITS_TANGENT
            (library if in_installed_package(e) else own).append(text)
        stack.extend(sub.subs.values())
    return list(dict.fromkeys(own + library))


def _computed_from(jaxpr, inputs: frozenset) -> set:
    """The variables of ``jaxpr`` computed from any of ``inputs``."""
    found = set(inputs)
    if not found:
        return found
    for e in jaxpr.eqns:
        if any(not is_literal(v) and v in found for v in e.invars):
            found.update(e.outvars)
    return found


def _double_where(graph, site) -> bool:
    """Whether the hazard's dead operand is the hand-written double where:
    computed, through lane-wise ops of one varying operand, from a
    ``where(c, x, k)`` on the same predicate ``c`` as every selection that
    made its lanes dead, taking the finite constant ``k`` in the case where
    that selection takes its constant, and the chain (the hazard included)
    has a finite value and derivative at ``k``: the second derivative then
    meets no inf there.  Anything else stays a hazard."""
    eqn = graph.eqns[site.node]
    chain = [(graph, eqn, site.index)]
    g, atom = graph, eqn.invars[site.index]
    for _ in range(16):
        g, atom = g.value_source(atom)
        where = None if is_literal(atom) else g.producer(atom)
        if where is None:
            return False
        e = g.eqns[where[0]]
        if e.primitive.name == "select_n":
            return _matches_origins(g, e, site.liveness.origins) and _finite_chain(
                chain, _case_constant(g, e)
            )
        varying = [i for i, v in enumerate(e.invars) if _constant(g, v) is None]
        rule = RULES.get(e.primitive.name)
        if len(e.outvars) != 1 or len(varying) != 1 or rule is None:
            return False
        if getattr(rule, "kind", None) not in ("elementwise", "pass-through"):
            return False
        chain.append((g, e, varying[0]))
        atom = e.invars[varying[0]]
    return False


def _constant(graph, atom):
    """A known constant value (a literal, a broadcast of one), else None."""
    found = graph.known_constant(atom)
    if found is not None or is_literal(atom):
        return found
    g, atom = graph.value_source(atom)
    where = g.producer(atom)
    if where is not None and g.eqns[where[0]].primitive.name == "broadcast_in_dim":
        return g.known_constant(g.eqns[where[0]].invars[0])
    return None


def _case_constant(graph, select):
    """``(index, value)`` of a two-case ``select_n``'s constant case (a
    uniform finite value) when exactly one case is constant; else None."""
    if len(select.invars) != 3:
        return None
    consts = [_constant(graph, v) for v in select.invars[1:]]
    if sum(c is not None for c in consts) != 1:
        return None
    k = 0 if consts[0] is not None else 1
    val = np.asarray(consts[k])
    if val.size == 0 or not np.all(val == val.flat[0]) or not np.isfinite(val.flat[0]):
        return None
    return k, val.flat[0]


def _matches_origins(graph, inner, origins) -> bool:
    """Every selection that made the lanes dead (an origin) is a two-case
    ``select_n`` on the same predicate as ``inner`` with its constant case
    at the same index: it takes its constant exactly where ``inner`` does."""
    mine = _case_constant(graph, inner)
    if mine is None or not origins:
        return False
    for tok in origins:
        g, outer = getattr(tok, "graph", None), getattr(tok, "eqn", None)
        if outer is None or outer.primitive.name != "select_n":
            return False
        theirs = _case_constant(g, outer)
        if theirs is None or theirs[0] != mine[0]:
            return False
        if not same_predicate(graph, inner.invars[0], g, outer.invars[0]):
            return False
    return True


def _finite_chain(chain, case) -> bool:
    """The chain of lane-wise ops (hazard first) evaluated at the constant
    ``case`` -- operands that vary otherwise at 1 -- has a finite value and
    a finite derivative in the selected operand."""
    import jax

    from hlo_guard.jax_frontend.binding import bind_eqn

    if case is None:
        return False
    _, value = case
    steps = list(reversed(chain))
    dtype = steps[0][1].invars[steps[0][2]].aval.dtype

    def run(x):
        for g, e, k in steps:
            args = []
            for i, v in enumerate(e.invars):
                if i == k:
                    args.append(x.astype(v.aval.dtype))
                else:
                    c = _constant(g, v)
                    c = np.ones((), v.aval.dtype) if c is None else np.asarray(c, v.aval.dtype)
                    args.append(c.reshape(-1)[0] if c.size else c)
            x = bind_eqn(e, args)[0]
        return x

    try:
        with jax.ensure_compile_time_eval():
            out, pull = jax.vjp(run, jax.numpy.asarray(value, dtype))
            (grad,) = pull(jax.numpy.ones_like(out))
        return bool(np.isfinite(np.asarray(out)).all() and np.isfinite(np.asarray(grad)).all())
    except Exception:  # noqa: BLE001 - not evaluable: keep the hazard
        return False


def _message(eqn, hazards) -> str:
    name, _, _ = traced_function(eqn.params.get("call_jaxpr"))
    name = name or eqn.params.get("name") or scope_name("", eqn)
    which = "jvp_jaxpr_fun" if eqn.primitive.name == "custom_jvp_call" else "bwd"
    rule_name, rule_at, _ = traced_function(eqn.params.get(which))
    rule = f" ({rule_name} at {rule_at})" if rule_at else ""
    if hazards[0].startswith("<"):
        return (
            f"the custom derivative rule of {name}{rule} could not be read "
            f"({hazards[0][1:-1]}); a derivative of its derivative (reverse over reverse, "
            "jacrev(grad)) differentiates that rule, which hlo_guard does not rewrite"
        )
    shown = ", ".join(hazards[:3]) + (f" and {len(hazards) - 3} more" if len(hazards) > 3 else "")
    if any(h.endswith(IN_ITS_TANGENT) for h in hazards):
        return (
            f"the custom derivative rule of {name}{rule} selects with where, and its "
            "tangent passes through the dead branch: reverse mode (grad, jacrev) "
            "transposes that computation, so already the first derivative meets "
            f"{shown} in the dead lanes (0 / 0 is NaN there; hlo_guard does not rewrite "
            "the rule; write the double where inside it: where(n > 0, dot(x, t) / "
            "where(n > 0, n, 1), 0))"
        )
    return (
        f"the custom derivative rule of {name}{rule} selects with where; a derivative of "
        "its derivative (reverse over reverse: jacrev(grad), grad(grad)) differentiates "
        "the rule's dead branch, which hlo_guard does not rewrite: its dead lanes reach "
        f"{shown} (0 * inf is NaN there; write the double where inside the rule: "
        "where(x > 0, 0.5 / sqrt(where(x > 0, x, 1)), 0))"
    )
