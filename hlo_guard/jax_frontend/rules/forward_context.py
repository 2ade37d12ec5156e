"""Forward mode across body boundaries.

A call or control-flow body is guarded with its own plan, whose forward
analysis takes every input tangent as live.  When its operands' tangents are
partly zero at the call -- a ``where`` upstream took a constant branch -- the
body may need guards its own plan does not make: the body is then evaluated
in the caller's forward context (``GuardPlan.forward_context``), or, where
that is not done, the gap is reported.  These are the questions both the
``Call`` and the ``ControlFlow`` rules ask:

* which operand tangent enters partly zero (:func:`partly_zero_operand_tangent`);
* a loop body's input tangents at its carries' fixed point
  (:func:`carry_fixpoint`, :func:`every_iteration`);
* whether a body evaluated with its own plan misses a guard a context needs
  (:func:`misses_in_context`), or a call or branch nested in it needs the
  context (:func:`nested_needs_context`);
* tangents taken as live without knowing it (a ``sort``'s, a loop's outputs),
  followed as a taint to the singular operations they reach
  (:func:`taint_gaps`, :func:`note_tainted_outputs`; :mod:`passes.tangent_gaps`).
"""

from __future__ import annotations

from typing import Any

from hlo_guard.jax_frontend.bodies import first_body_operand, loop_carries
from hlo_guard.jax_frontend.graph import is_inexact_aval, is_literal
from hlo_guard.jax_frontend.plan import note_unknown_operations, output_may_blow_up, plan_of
from hlo_guard.jax_frontend.rule_table import RULES
from passes.analysis import analyze_forward
from passes.lattice import LIVE, NO_DERIVATIVE, Level, Liveness, merge_origins
from passes.planning import plan_output_guards
from passes.tangent_gaps import UNFOLLOWED, note_unfollowed, tainted_values, unguarded_sites


def needs_guards_in(sub, fa) -> bool:
    """Whether body ``sub`` needs a forward guard in the tangent context
    ``fa``: an output guard of its own, or a call, ``cond`` or loop inside
    it that would be evaluated in that context (:func:`nested_needs_context`)."""
    return bool(plan_output_guards(sub, fa)) or nested_needs_context(sub, fa)


def nested_needs_context(sub, fa) -> bool:
    """Whether a call or ``cond`` in body ``sub`` would be evaluated in the
    forward context ``fa`` gives it (so the body must pass its masks on)."""
    for node, k in sub.subs:
        if k != 0:
            continue
        rule = sub.rules.get(sub.graph.op_name(node))
        if rule is not None and rule.guards_in_forward_context(sub, fa, node):
            return True
    return False


def operand_tangents_live(forward, eqn) -> bool:
    """Whether every differentiable operand of ``eqn`` (not a constant, of an
    inexact type) carries a fully live tangent in ``forward``: the context a
    call's body is analysed in on its own, and one in which no operand's
    tangent is structurally zero in any lane."""
    graph = forward.graph
    return all(
        graph.is_constant(v) or not is_inexact_aval(v.aval) or forward.value_liveness(v).is_live
        for v in eqn.invars
    )


def partly_zero_operand_tangent(backward, forward, node) -> Liveness | None:
    """The tangent liveness of the first differentiable operand of ``node``
    that is structurally zero in some or all lanes while a derivative flows
    (None if there is none, or the node's outputs' derivatives are unused)."""
    graph = backward.graph
    eqn = graph.eqns[node]
    if not any(backward.value_liveness(v).reaches_output for v in graph.node_outputs(node)):
        return None
    for v in eqn.invars:
        if is_literal(v) or not is_inexact_aval(v.aval):
            continue
        lv = forward.value_liveness(v)
        if lv.reaches_output and not lv.is_live:
            return lv
    return None


def body_tangents(eqn, ins: list[Liveness]) -> tuple[list[Liveness], list[tuple[int, int]]]:
    """The tangent liveness of a control-flow body's inputs as the equation's
    operands give it, and its loop carries as (body input, body output)
    index pairs."""
    if eqn.primitive.name == "scan" and eqn.params.get("length") == 1:
        return ins, []  # no iteration receives another's carry
    return ins[first_body_operand(eqn) :], loop_carries(eqn)


def carried_zero_meets_hazard(sub, body, entry, carries) -> tuple[Liveness, Any] | None:
    """``(the entering or carried tangent liveness, the forward analyses of
    the body, one per round)`` under which body ``sub`` needs a forward
    guard its own evaluation (inputs live) does not make; None if there is
    none (:func:`carry_fixpoint`)."""
    rounds = carry_fixpoint(sub.graph, body, entry, carries)
    for fa in rounds:
        if misses_in_context(sub, fa):
            zero = (lv for lv in fa.in_liveness if lv.reaches_output and not lv.is_live)
            return next(zero, PARTLY_ZERO), rounds  # (origins may be in any round's bodies)
    return None


def carry_fixpoint(graph, body, entry, carries) -> list:
    """Forward analyses of a loop body, one per round, the last at the fixed
    point.  A carry's tangent must cover every iteration: it is live only
    where the entry's and every iteration's output tangent are, and carries
    a derivative once either does -- an accumulator that starts from a
    constant (no tangent in the first iteration, a live one after) is
    partly zero, not derivative-free, or the lanes it gains later would be
    masked as zero (:func:`in_every_case`).  Each round only lowers a
    carry's level, so the rounds end."""
    tangents = list(entry) + [LIVE] * len(body.constvars)
    rounds = []
    while True:
        fa = analyze_forward(graph, RULES, tangents)
        rounds.append(fa)
        changed = False
        for i, j in carries:
            out = body.outvars[j]
            lv = NO_DERIVATIVE if is_literal(out) else fa.value_liveness(out)
            merged = in_every_case(tangents[i], lv)
            if merged.level is not tangents[i].level or (
                merged.reaches_output != tangents[i].reaches_output
            ):
                tangents[i] = merged
                changed = True
        if not changed:
            return rounds


def in_every_case(a: Liveness, b: Liveness) -> Liveness:
    """The tangent liveness of a value that is ``a`` in some cases and ``b``
    in others -- a loop carry entering (``a``) and leaving an iteration
    (``b``), a ``cond`` output from two branches (its mask, the taken
    branch's, is chosen at run time): live only where both are; partly zero
    where one is zero somewhere, or has no derivative while the other has
    one; no derivative only if neither has.  Folded over a loop's
    iterations, each carry's level changes at most twice."""
    if not b.reaches_output and not a.reaches_output:
        return a
    if not a.reaches_output:  # none in one case, one in the other
        return b if b.is_dead else Liveness(Level.PARTIAL, b.origins)
    if not b.reaches_output:
        return a if a.is_dead else Liveness(Level.PARTIAL, a.origins)
    if a.is_live and b.is_live:
        return a
    if a.is_dead and b.is_dead or a.is_partial:
        return a
    return Liveness(Level.PARTIAL, merge_origins(a.origins, b.origins))


def note_tainted_outputs(fa, node, sub, body, reason: str | None = None) -> None:
    """A call's or a control-flow body's outputs whose tangents were taken
    as live somewhere in the body (a ``sort``, a loop's outputs): noted in
    the caller, so that the taint reaches the caller's singular operations
    after it, with the taint's own reason unless ``reason`` is given."""
    if UNFOLLOWED not in sub.notes:  # (nested bodies' taint reaches it as notes)
        return
    tainted = tainted_values(sub.graph, sub, {})[0]
    outs = [j for j, v in enumerate(body.outvars) if not is_literal(v) and v in tainted]
    if outs:
        note_unfollowed(fa, node, reason or tainted[body.outvars[outs[0]]], outs)


#: a tangent partly zero for reasons no origin names (a fallback for reports)
PARTLY_ZERO = Liveness(Level.PARTIAL)


def taint_gaps(sub, fa) -> list:
    """Unguarded sites in body ``sub`` under the forward context ``fa`` that
    its own plan does not report: singular operations reached by a tangent
    taken as live without knowing it (:mod:`passes.tangent_gaps`)."""
    note_unknown_operations(sub.graph, fa)
    if UNFOLLOWED not in fa.notes:
        return []
    own = {site.node for site in plan_of(sub).forward_unfollowed}
    gaps = unguarded_sites(sub.graph, fa, sub, {}, output_may_blow_up)[1]
    return [site for site in gaps if site.node not in own]


def misses_in_context(sub, fa) -> bool:
    """Whether body ``sub``, evaluated as its own plan does (input tangents
    live), lacks a forward guard that the tangent context ``fa`` needs: an
    output guard the context plans that the body's own plan does not make
    with the same liveness, a call the context would evaluate in its own
    forward context, or a nested body with the same gap."""
    own = plan_of(sub)
    have = {
        (site.node, site.index, site.liveness)
        for sites in own.output_sites_by_node.values()
        for site in sites
    }
    if any(
        (site.node, site.index, site.liveness) not in have for site in plan_output_guards(sub, fa)
    ):
        return True
    if taint_gaps(sub, fa):
        return True
    own_gaps = {u.node for u in own.forward_unfollowed}
    for node, k in sub.subs:
        if k != 0:
            continue
        rule = sub.rules.get(sub.graph.op_name(node))
        if rule is None:
            continue
        if rule.guards_in_forward_context(sub, fa, node) and node not in own.forward_context_calls:
            return True
        if node not in own_gaps and rule.forward_unfollowed(sub, fa, node) is not None:
            return True
    return False
