"""Calls and control flow.

* ``jit`` (every ``jnp.where`` is one), ``closed_call`` (``eval_jaxpr`` from jax 0.11), ``remat2``
  (``jax.checkpoint``): the body is analysed with the liveness of the call's outputs and
  its inputs get the liveness of the body's inputs.  The interpreter keeps the
  boundary and re-binds the call with a guarded body (passing the output masks
  in as extra arguments when some outputs are partly dead).
* ``custom_jvp_call`` / ``custom_vjp_call``: the *primal* body tells which input
  lanes feed which output lanes; the inputs are guarded with those masks, which
  absorbs whatever the custom rule computes in dead lanes.  The body itself is
  never rewritten (its derivative is the user's rule, not JAX's).
* ``cond``, ``while``, ``scan``: bodies are guarded internally; dead lanes
  arriving at the boundary from outside are reported, not followed
  (conservative) -- except a ``cond`` operand some branch does not read (dead
  with the index) and a lane-wise ``scan``'s masked final carry (one mask for
  every iteration).
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from hlo_guard.jax_frontend.bodies import (
    CALL_BODY_PARAM,
    REWRITTEN_CALLS,
    body_is_risky,
    body_of,
    control_bodies,
    first_body_operand,
    holds_throughout,
    scope_name,
)
from hlo_guard.jax_frontend.compat import scan_layout
from hlo_guard.jax_frontend.graph import (
    JaxprGraph,
    body_graph,
    constant_body_inputs,
    is_inexact_aval,
    is_literal,
)
from hlo_guard.jax_frontend.mask_ops import (
    and_,
    is_static,
    lax_broadcast_in_dim,
    select_mask_by_index,
    to_guard_mask,
)
from hlo_guard.jax_frontend.plan import mark_mask_only, plan_of
from hlo_guard.jax_frontend.rule_table import RULES
from hlo_guard.jax_frontend.rules.base import JaxRule, LazyMasks, joined, or_all
from hlo_guard.jax_frontend.rules.custom_structure import analyze_body, body_structure_known
from hlo_guard.jax_frontend.rules.forward_context import (
    body_tangents,
    carried_zero_meets_hazard,
    carry_fixpoint,
    in_every_case,
    misses_in_context,
    needs_guards_in,
    nested_needs_context,
    note_tainted_outputs,
    operand_tangents_live,
    partly_zero_operand_tangent,
    taint_gaps,
)
from hlo_guard.jax_frontend.rules.hazards import hazard_before
from passes.lattice import (
    LIVE,
    NO_DERIVATIVE,
    Level,
    Liveness,
    dropped_by,
    join_all,
    merge_origins,
)
from passes.masks import ALL, NONE
from passes.rules import ForwardRule, implements
from passes.tangent_gaps import (
    is_partly_zero,
    note_unfollowed,
)

#: calls the boundary placement may see through (:meth:`Call.transparent_body`)
_TRANSPARENT_CALLS = frozenset({"jit", "closed_call", "eval_jaxpr"})


def _keeps_lanes_apart_throughout(sub) -> bool:
    """Whether every op of a body that carries a derivative keeps lanes
    apart (nested transparent calls included); ops no derivative passes
    through (the broadcast of ``jnp.where``'s constant) do not count."""
    graph = sub.graph
    for node in range(graph.node_count()):
        n_in = len(graph.node_inputs(node))
        if not any(sub.use(node, i).reaches_output for i in range(n_in)):
            continue
        rule = sub.rules.get(graph.op_name(node))
        if rule is None:
            return False
        if rule.transparent_body(sub, node) is None and not rule.keeps_lanes_apart(sub, node):
            return False
    return True


class Call(JaxRule):
    kind = "call"

    def __init__(self, guards: bool):
        self.guards = guards

    def transfer(self, analysis, node, outs):
        eqn = analysis.graph.eqns[node]
        body, _ = body_of(eqn)
        sub = analysis.analyze_sub(node, 0, body_graph(analysis.graph, eqn, body), outs)
        return [sub.value_liveness(v) for v in body.invars]

    def transparent_body(self, analysis, node):
        """The body of a plain call (``jit``, ``closed_call``) made only of ops
        that keep lanes apart -- every ``jnp`` ufunc's inline ``jit`` wrapper
        -- so that a chain of ``jnp`` calls is one dead region with one guard
        where it meets live computation, as if the calls were inlined.  Not
        for ``remat`` (its body is re-run in the backward pass) nor for a
        custom call's structure analysis (``guards`` set)."""
        sub = self.called_body(analysis, node)
        if sub is None or not _keeps_lanes_apart_throughout(sub):
            return None
        return sub

    def called_body(self, analysis, node):
        if self.guards or analysis.graph.eqns[node].primitive.name not in _TRANSPARENT_CALLS:
            return None
        return analysis.subs.get((node, 0))

    def input_masks(self, mctx, node, eqn, out_masks):
        body, _ = body_of(eqn)
        child = mctx.child_masks(node, 0, out_masks)
        return LazyMasks(lambda i: child.resolver.value_mask(body.invars[i]), len(body.invars))

    # forward: the body's tangent liveness given the inputs'; the call's outputs
    # are guarded (outside the body) when the body holds a risky operation.
    def forward(self, fa, node, ins):
        eqn = fa.graph.eqns[node]
        body, _ = body_of(eqn)
        graph = body_graph(fa.graph, eqn, body)
        sub = fa.analyze_sub(node, 0, graph, list(ins) + [LIVE] * len(body.constvars))
        note_tainted_outputs(fa, node, sub, body)
        return [sub.value_liveness(v) if not is_literal(v) else NO_DERIVATIVE for v in body.outvars]

    def forward_masks(self, mctx, node, eqn, in_masks):
        body, _ = body_of(eqn)
        child = mctx.child_forward(node, 0, in_masks)
        return LazyMasks(lambda j: child.tangent_mask(body.outvars[j]), len(body.outvars))

    def guards_output(self, analysis, node, index):
        return self.guards or body_is_risky(body_of(analysis.graph.eqns[node])[0])

    def body_guards_own_outputs(self, backward, forward, node):
        """A rewritten call whose outputs leave its body clean in this context:

        * every differentiable operand carries a fully live tangent here: the
          body's own forward analysis (inputs live) is then exactly this
          context, so the body's output guards sit on every risky operation
          whose tangent is partly zero;
        * or, in this context, no operation inside needs an output guard at
          all (the body's zero tangent lanes are made after its risky ops,
          as in ``where(x > 0, log(x), 0)``, or only scaled by a known finite
          constant, as in ``8.0 * s``), nor does a call or ``cond`` nested
          in it;
        * or the body is evaluated in this forward context
          (:meth:`guards_in_forward_context`), its output guards planned
          from it.

        Not when the body holds an operation the forward half knows nothing
        about or a loop (those are only covered by the guard on the call).
        Otherwise the caller guards: the body, analysed with live inputs,
        would not guard what a partly zero operand tangent makes zero
        inside it."""
        needs = self._needs_in_context(backward, forward, node)
        if needs is None:
            return False
        return not needs or self.guards_in_forward_context(backward, forward, node)

    def forward_unfollowed(self, backward, forward, node):
        """A rewritten call entered by a partly zero tangent, whose body --
        evaluated with its own plan, inputs live -- misses a guard that
        tangent needs: inside, it passes through an operation whose output
        tangents are taken as live (a ``sort``, a loop) on its way to a
        singular one; or the body holds an operation the forward half cannot
        plan (a ``shard_map``) and mixes lanes, so that the guard on the
        call's outputs cannot clean them."""
        eqn = backward.graph.eqns[node]
        if self.guards or eqn.primitive.name not in REWRITTEN_CALLS:
            return None
        body = body_of(eqn)[0]
        if not body_is_risky(body):
            return None
        sub, sub_forward = backward.subs.get((node, 0)), forward.subs.get((node, 0))
        if sub is None or sub_forward is None:
            return None
        tangent = partly_zero_operand_tangent(backward, forward, node)
        if tangent is None or plan_of(sub).forward_context is sub_forward:
            return None  # (a body evaluated in this context reports its own gaps)
        gaps = taint_gaps(sub, sub_forward)
        if gaps:
            return (
                "forward mode: a partly structurally zero tangent enters this call; inside, "
                + gaps[0].reason.removeprefix("forward mode: "),
                tangent,
                None,
            )
        if _output_guards_cover(body) or _keeps_lanes_apart_throughout(sub):
            return None
        if not misses_in_context(sub, sub_forward):
            return None
        return (
            "forward mode: a partly structurally zero tangent enters this call, whose body "
            "holds an operation without a forward rule and mixes lanes: it meets an operation "
            "inside with a possibly infinite derivative, unguarded",
            tangent,
            None,  # the tangent's origins are in the caller's forward analysis
        )

    def guards_in_forward_context(self, backward, forward, node):
        """A rewritten call entered by partly zero operand tangents whose body
        *mixes lanes* after an operation those zeros make non-finite:
        ``jit(lambda v: sqrt(v) + mean(v))`` on ``where(x > 0, x, 0)``.  In
        forward mode ``sqrt'(0)`` times the zero tangent is NaN in that lane,
        and ``mean`` spreads it to every lane of the output, whose tangent is
        then live everywhere: a guard on the call's outputs selects nothing.
        The body is therefore evaluated in this context -- its plan reads
        this forward analysis of it, the operands' tangent masks are passed
        in -- and its output guards sit on the singular operations inside,
        before the mixing.  So is a body with a call or ``cond`` inside that
        needs this context itself (the masks are passed on a level).  A
        lane-local body keeps the one guard on the call's outputs (the
        cheaper select, and the same lanes)."""
        needs = self._needs_in_context(backward, forward, node)
        if not needs:
            return False
        sub = backward.subs[(node, 0)]
        return not _keeps_lanes_apart_throughout(sub) or nested_needs_context(
            sub, forward.subs[(node, 0)]
        )

    def _needs_in_context(self, backward, forward, node) -> bool | None:
        """Whether the body of rewritten call ``node`` needs a forward guard in
        this context that its own evaluation (inputs live) would not make:
        an output guard inside, or a nested call or ``cond`` that needs the
        context (False when every differentiable operand's tangent is fully
        live: the body's own context).  None when the body is not one whose
        output guards the forward half plans (a custom call, a loop or an
        unknown operation inside)."""
        if self.guards:
            return None
        eqn = backward.graph.eqns[node]
        if eqn.primitive.name not in REWRITTEN_CALLS:
            return None
        if not _output_guards_cover(body_of(eqn)[0]):
            return None
        if operand_tangents_live(forward, eqn):
            return False
        inner_backward = backward.subs.get((node, 0))
        inner_forward = forward.subs.get((node, 0))
        if inner_backward is None or inner_forward is None:
            return None
        return needs_guards_in(inner_backward, inner_forward)


#: jaxpr -> :func:`_output_guards_cover`
_COVER_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _output_guards_cover(jaxpr) -> bool:
    """Whether every operation of a body (plain calls and the bodies of
    ``cond``, ``scan`` and ``while`` inside it included) has a rule with a
    forward half, so that the body's own output guards are planned for all
    of them; ``shard_map`` and unknown operations are not."""
    return holds_throughout(jaxpr, _COVER_CACHE, _has_forward_rule)


def _has_forward_rule(eqn):
    name = eqn.primitive.name
    rule = RULES.get(name)
    if rule is None or name == "shard_map":
        return False
    if name in REWRITTEN_CALLS:
        return [body_of(eqn)[0]]
    if name in ("cond", "scan", "while"):  # their bodies are guarded in the body's context
        return [body for body, _ in control_bodies(eqn)]
    return implements(rule, ForwardRule)


class ControlFlow(JaxRule):
    """Bodies analysed and guarded inside; what crosses the boundary is kept
    simple.

    * ``cond``: each branch is analysed with the liveness of the cond's
      outputs, and the outputs' masks are passed into the branches, so a
      ``where`` *after* the cond guards the operations *inside* it.
    * ``scan``: carries are fully live, unless the body keeps lanes apart
      and the final carry is partly dead (:func:`scan_carry_liveness`: one
      mask, closed over, for every iteration); the stacked outputs ``ys`` keep
      their liveness, and their masks are passed in as extra ``xs``, one
      slice per iteration.
    * ``while`` and ``shard_map``: fully live boundary.

    Operands come out fully live -- dead lanes found inside a body are not
    followed back out to operations before the loop or branch (reported) --
    but for a ``cond`` operand some branch does not read: it is dead whenever
    the index picks such a branch (:meth:`_cond_operand_liveness`).
    """

    kind = "control-flow"

    def transfer(self, analysis, node, outs):
        eqn = analysis.graph.eqns[node]
        out = joined(outs)
        name = eqn.primitive.name
        noted = False
        for k, (body, _) in enumerate(control_bodies(eqn)):
            graph = JaxprGraph(
                body,
                f"{scope_name(analysis.graph.scope, eqn)}[{k}]",
                constant_body_inputs(analysis.graph, eqn.invars[1:], body)
                if name == "cond"
                else body.constvars,
            )
            if name == "cond":
                # (a branch runs once on the operands: a report walking back
                # from its inputs continues at them, :func:`hazard_before`)
                graph.operand_source = (analysis.graph, dict(zip(body.invars, eqn.invars[1:])))
                body_outs = list(outs)
            elif name == "scan":
                ncarry = scan_layout(eqn.params, len(eqn.invars))[1]
                carried = scan_carry_liveness(body, outs, ncarry)
                body_outs = [
                    carried if is_inexact_aval(v.aval) else LIVE for v in body.outvars[:ncarry]
                ] + list(outs[ncarry:])
            else:
                body_outs = [LIVE] * len(body.outvars)
            sub = analysis.analyze_sub(node, k, graph, body_outs)
            operands = eqn.invars[first_body_operand(eqn) :]
            dead_inside = [
                sub.value_liveness(v)
                for v, operand in zip(body.invars, operands)
                if not sub.value_liveness(v).is_live
                and sub.value_liveness(v).reaches_output
                and hazard_before(analysis, operand)
            ]
            if dead_inside and not noted:
                noted = True
                analysis.note_unreached(
                    node,
                    f"{name} operands: lanes dead inside the body are guarded there, "
                    "but not followed back to operations before the "
                    f"{name}",
                    dead_inside[0],
                )
            lost = _scan_dead_lanes_lost(sub, body, outs, eqn) if name == "scan" else None
            if lost is not None and not noted:
                noted = True
                analysis.note_unreached(
                    node,
                    f"scan: dead lanes of its {lost[0]} are not followed through the loop "
                    "(its carries are kept fully live): a singular operation in the body, "
                    "or before the scan, can still turn their zero cotangent into NaN",
                    lost[1],
                )
        if name in ("while", "shard_map") and out.reaches_output and not out.is_live:
            analysis.note_unreached(
                node,
                f"{name} boundary: dead lanes of its outputs are not followed into "
                "its body (inputs kept fully live)",
                out,
            )
        if name == "cond" and out.reaches_output:
            return self._cond_operand_liveness(analysis, node, eqn, out)
        return [LIVE if out.reaches_output else NO_DERIVATIVE] * len(eqn.invars)

    @staticmethod
    def _branches_reading(analysis, node, eqn) -> list[list[bool]]:
        """Per ``cond`` operand (after the index), per branch: whether the
        branch carries a derivative from it (a use neither unread nor dead
        in every lane inside the branch)."""
        reads = []
        for k in range(len(eqn.invars) - 1):
            per_branch = []
            for b, (body, _) in enumerate(control_bodies(eqn)):
                lv = analysis.subs[(node, b)].value_liveness(body.invars[k])
                per_branch.append(lv.reaches_output and not lv.is_dead)
            reads.append(per_branch)
        return reads

    def _cond_operand_liveness(self, analysis, node, eqn, out) -> list[Liveness]:
        """A ``cond`` operand that some branch does not read is dead whenever
        the index picks such a branch: the untaken branch's transpose sends
        it an instantiated zero, which ``1 / n`` or ``sqrt`` computed before
        the ``cond`` turns into NaN (jaxopt's ``projection_l2_ball``:
        ``cond(n <= 1, lambda: x, lambda: x / n)`` at ``x = 0``).  Its lanes
        live or die together, with the index (:meth:`input_masks`).  An
        operand every branch reads stays live; lanes dead inside a branch are
        guarded there and not followed out (noted above)."""
        result: list[Liveness] = [NO_DERIVATIVE]  # the index
        origin = analysis.graph.origin(node)
        for v, per_branch in zip(eqn.invars[1:], self._branches_reading(analysis, node, eqn)):
            if not is_inexact_aval(v.aval) or all(per_branch):
                result.append(LIVE)
            elif any(per_branch):
                result.append(dropped_by(origin, out))
            else:
                result.append(Liveness(Level.DEAD, merge_origins((origin,), out.origins)))
        return result

    def input_masks(self, mctx, node, eqn, out_masks):
        """A ``cond`` operand's mask is "the index picks a branch that reads
        it" (:meth:`_cond_operand_liveness`), one bit broadcast over its
        lanes; everything else is fully live."""
        if eqn.primitive.name != "cond" or (node, 0) not in mctx.analysis.subs:
            return [ALL] * len(eqn.invars)
        reads = self._branches_reading(mctx.analysis, node, eqn)

        def mask(i):
            if i == 0 or all(reads[i - 1]):
                return ALL
            if not any(reads[i - 1]):
                return NONE
            index = mctx.value(eqn.invars[0])
            taken = select_mask_by_index(index, [np.asarray(r) for r in reads[i - 1]])
            if is_static(taken):  # the branch is known while tracing
                return ALL if bool(taken) else NONE
            return lax_broadcast_in_dim(taken, tuple(eqn.invars[i].aval.shape), ())

        return LazyMasks(mask, len(eqn.invars))

    def guards_output(self, analysis, node, index):
        return False

    def forward(self, fa, node, ins):
        """A ``cond``'s branches are analysed with the operands' tangents (so
        that a branch a partly zero tangent enters can be evaluated in this
        context, :meth:`guards_in_forward_context`), and each output's
        tangent is live only where it is in every branch: its mask is the
        taken branch's (:meth:`forward_masks`).  A loop's or ``shard_map``'s
        outputs count as live -- which lanes a loop leaves zero is not
        followed out -- and are noted where that is not known to be so."""
        eqn = fa.graph.eqns[node]
        name = eqn.primitive.name
        if name == "cond":
            outs: list[Liveness] | None = None
            for k, (body, _) in enumerate(control_bodies(eqn)):
                graph = body_graph(fa.graph, eqn, body, eqn.invars[1:])
                sub = fa.analyze_sub(node, k, graph, list(ins[1:]) + [LIVE] * len(body.constvars))
                branch = [
                    NO_DERIVATIVE if is_literal(v) else sub.value_liveness(v) for v in body.outvars
                ]
                outs = (
                    branch if outs is None else [in_every_case(a, b) for a, b in zip(outs, branch)]
                )
                note_tainted_outputs(fa, node, sub, body)
            return outs if outs is not None else [LIVE] * len(eqn.outvars)
        if name in ("scan", "while"):
            # the body's tangents at the carries' fixed point (a carry some
            # iteration zeroes is partly zero in every iteration's analysis)
            ((body, _),) = control_bodies(eqn)
            graph = JaxprGraph(body, f"{scope_name(fa.graph.scope, eqn)}[0]", body.constvars)
            entry, carries = body_tangents(eqn, list(ins))
            fa.subs[(node, 0)] = carry_fixpoint(graph, body, entry, carries)[-1]
            self._note_partly_zero_outputs(fa, node, eqn)
        elif any(is_partly_zero(lv) for lv in ins):  # shard_map: not followed at all
            note_unfollowed(fa, node, f"the `{name}` boundary (its output tangents taken as live)")
        return [LIVE] * len(eqn.outvars)

    def forward_masks(self, mctx, node, eqn, in_masks):
        """A ``cond`` output's tangent mask is the taken branch's: each
        branch's, from the operands' masks, selected by the index."""
        if eqn.primitive.name != "cond":
            return [ALL] * len(eqn.outvars)
        branches = [body for body, _ in control_bodies(eqn)]
        children = [mctx.child_forward(node, k, list(in_masks[1:])) for k in range(len(branches))]

        def mask(j):
            masks = [child.tangent_mask(body.outvars[j]) for child, body in zip(children, branches)]
            if all(m is ALL for m in masks):
                return ALL
            if all(m is NONE for m in masks):
                return NONE
            shape = tuple(eqn.outvars[j].aval.shape)
            return select_mask_by_index(
                mctx.value(eqn.invars[0]), [to_guard_mask(m, shape) for m in masks]
            )

        return LazyMasks(mask, len(eqn.outvars))

    @staticmethod
    def _note_partly_zero_outputs(fa, node, eqn) -> None:
        """A loop's outputs are taken as live; where the body's output tangent
        is in fact partly zero (a zero entering the loop, or made by it), or
        was taken as live inside it, the output is noted, so that a singular
        operation after the loop is reported (:mod:`passes.tangent_gaps`).
        (A body's outputs are the equation's, in order: a scan's carries
        then its ys, a while's carries.)"""
        sub = fa.subs.get((node, 0))
        if sub is None:
            return
        ((body, _),) = control_bodies(eqn)
        reason = f"`{eqn.primitive.name}` (its output tangents taken as live)"
        partly_zero = [
            j
            for j, v in enumerate(body.outvars)
            if not is_literal(v) and is_partly_zero(sub.value_liveness(v))
        ]
        if partly_zero:
            note_unfollowed(fa, node, reason, partly_zero)
        note_tainted_outputs(fa, node, sub, body, reason)

    def guards_in_forward_context(self, backward, forward, node):
        """A ``cond`` whose operands' tangents are partly zero and a branch of
        which then needs a forward guard: its branches are evaluated in this
        context, the operands' tangent masks passed in (as a call's are), so
        that ``cond(p, sqrt, ..., where(x > 0, x, 0))`` is guarded on the
        ``sqrt`` inside.  So is a ``scan`` or ``while`` whose body, at its
        carries' fixed point (:func:`carry_fixpoint`), has a partly zero
        input tangent that needs a guard: the carries' tangent masks are
        carried along, each iteration's computed from the last.
        ``shard_map`` is not; it is reported (:meth:`forward_unfollowed`)."""
        eqn = backward.graph.eqns[node]
        name = eqn.primitive.name
        if name in ("scan", "while"):
            sub, sub_forward = backward.subs.get((node, 0)), forward.subs.get((node, 0))
            if sub is None or sub_forward is None:
                return False
            if all(lv.is_live or not lv.reaches_output for lv in sub_forward.in_liveness):
                return False  # the body's own context: every tangent live
            return needs_guards_in(sub, sub_forward)
        if name != "cond":
            return False
        if partly_zero_operand_tangent(backward, forward, node) is None:
            return False
        for k in range(len(eqn.params["branches"])):
            sub, sub_forward = backward.subs.get((node, k)), forward.subs.get((node, k))
            if sub is not None and sub_forward is not None and needs_guards_in(sub, sub_forward):
                return True
        return False

    def forward_unfollowed(self, backward, forward, node):
        """Forward mode does not follow tangents into a loop or branch: each
        body is evaluated with its input tangents taken as live, and its
        outputs' tangents count as live.  A partly zero tangent entering a
        body (``cond(p, sqrt, ..., where(x > 0, x, 0))``), or a carry some
        iteration zeroes, that meets an operation with a possibly infinite
        derivative there is therefore not guarded.  Found by analysing each
        body's tangents in this context (carries to a fixed point) and
        comparing the output guards it would need with the body's own."""
        graph = backward.graph
        eqn = graph.eqns[node]
        if not any(backward.value_liveness(v).reaches_output for v in graph.node_outputs(node)):
            return None
        own = plan_of(backward)
        if forward is own.forward and node in own.forward_context_calls:
            return None  # a cond whose branches are guarded in this context
        ins = [NO_DERIVATIVE if is_literal(v) else forward.value_liveness(v) for v in eqn.invars]
        for k, (body, _) in enumerate(control_bodies(eqn)):
            sub = backward.subs.get((node, k))
            if sub is None or not body_is_risky(body):
                continue
            entry, carries = body_tangents(eqn, ins)
            found = carried_zero_meets_hazard(sub, body, entry, carries)
            if found is not None:
                tangent, context = found
                return (
                    f"forward mode: a partly structurally zero tangent enters the "
                    f"{eqn.primitive.name} body (tangents are not followed into it lane by "
                    "lane) and meets an operation with a possibly infinite derivative there, "
                    "unguarded",
                    tangent,
                    (context, sub),
                )
        return None


def scan_lane_shape(body) -> tuple | None:
    """The one shape S of a scan body's floating-point carries and stacked
    outputs, when the body keeps lanes apart over it (:func:`_body_lanewise`:
    every value S-shaped or a scalar, no operation moving or reducing lanes);
    None otherwise.  Then lane ``l`` of a carry after an iteration depends on
    lane ``l`` of the carries and stacked inputs before it, and on nothing
    else that varies from lane to lane."""
    shapes = {
        tuple(v.aval.shape) for v in body.outvars if not is_literal(v) and is_inexact_aval(v.aval)
    }
    if len(shapes) != 1:
        return None
    (shape,) = shapes
    return shape if _body_lanewise(body, shape) else None


def scan_carry_liveness(body, outs, ncarry: int) -> Liveness:
    """The liveness a scan body's floating-point carries get as outputs.

    Fully live, as a body analysed once for every iteration must assume --
    except where a partly dead final carry can be followed through the loop:
    the body keeps lanes apart over one shape (:func:`scan_lane_shape`), so
    a lane dead after the last iteration was dead after every iteration,
    unless a stacked output reads it on the way.  One mask then serves every
    iteration: the OR of the final carries' masks and of each stacked
    output's mask over its iterations (``Scope.output_masks_for``).  It may
    hold live lanes that an iteration does not need (conservative); it never
    misses one, because a live lane of any iteration's carry reaches a live
    lane of the final carries or of a stacked output along the same lane.
    Any stacked output fully live, or a body that mixes lanes, keeps the
    carries live (and ``_scan_dead_lanes_lost`` reports the lost lanes)."""
    if not any(lv.is_partial for lv in outs[:ncarry]):
        return LIVE
    together = joined(outs)
    if together.is_live or scan_lane_shape(body) is None:
        return LIVE
    return Liveness(together.level, together.origins)


def _scan_dead_lanes_lost(sub, body, outs, eqn):
    """``(what, liveness)`` when dead lanes of a scan's outputs vanish into
    its conservatively live carries, else None.

    The body is analysed once for every iteration, with its carries fully
    live unless :func:`scan_carry_liveness` can follow them.  A partly dead
    final carry (``where(valid, fori_loop(...), 0)``) of a body that mixes
    lanes is therefore never followed into the body; nor is a partly dead stacked
    output ``ys`` whose body value also feeds the carry (an RNN's ``h``,
    emitted and carried): there it joins the live carry and comes out live.
    Which *iterations* are dead (the padded steps) is not expressible in one
    body analysis, so those lanes reach the body's operations, and whatever
    fed the scan, unguarded -- and the report must say so."""
    ncarry = scan_layout(eqn.params, len(eqn.invars))[1]
    followed = any(not lv.is_live for lv in sub.out_liveness[:ncarry])
    for lv in outs[:ncarry]:
        if lv.reaches_output and not lv.is_live and not followed:
            return "final carry", lv
    for j, lv in enumerate(outs[ncarry:]):
        if not lv.reaches_output or lv.is_live:
            continue
        v = body.outvars[ncarry + j]
        if is_literal(v):
            continue
        if sub.value_liveness(v).is_live:
            return "stacked outputs", lv
    return None


class CustomCall(JaxRule):
    """``custom_jvp_call`` / ``custom_vjp_call``: the derivative is the user's
    (or the library's) rule, not the primal body's.

    The rule may be non-zero where the primal body selects a lane away
    (``xlogy`` at 0 is ``log y``; a straight-through estimator passes the
    tangent through a ``where``) or where the body computes with bit tricks
    (``frexp`` in ``ldexp``).  So the body's *selections* never mark an input
    dead.  Only the call's own output masks are mapped back, and only when the
    call is lane-wise (every value in its body has the output's shape or is a
    scalar, with no reductions or lane moves): input lane ``i`` is live iff an
    output lane ``i`` is.  Anything else is fully live (conservative).  Guarding
    the inputs with those masks absorbs whatever the rule computes in dead
    lanes -- the dead ``xlogy`` under a ``where``.

    A call that is not lane-wise but whose body only moves, broadcasts,
    reduces and computes elementwise (a custom-jvp norm ``sqrt(sum(v*v, -1))``)
    has no selection a rule could disagree with: its reduce/broadcast structure
    is exactly which input lanes feed which output lanes, so its masks come
    from the body's liveness, as for a plain call (the body is still never
    rewritten; only the call's inputs are guarded).
    """

    kind = "custom-call"
    guards = True

    _structure = Call(guards=True)

    def guards_input(self, analysis, node, index):
        """A hazard unless the call is a lane-wise ``custom_jvp`` whose rule
        passes tangents on only by selecting, adding and moving them
        (:func:`rule_preserves_zero`: ``relu``'s ``select(x > 0, t, 0)``).
        Its transpose then maps an exact zero cotangent to an exact zero,
        whatever the primals hold, and there is nothing for a guard on its
        operand to select: relu after a Dropout select was guarded (a cost
        survey of Flax/Equinox networks, 2026-11-27)."""
        if not super().guards_input(analysis, node, index):
            return False
        eqn = analysis.graph.eqns[node]
        return not (is_lanewise_call(eqn) and rule_preserves_zero(eqn))

    def transfer(self, analysis, node, outs):
        eqn = analysis.graph.eqns[node]
        out = joined(outs)
        if not out.reaches_output:
            return [NO_DERIVATIVE] * len(eqn.invars)
        if eqn.primitive.name == "custom_vjp_call" or _body_iterates(body_of(eqn)[0]):
            note_dead_hazards_in_body(analysis, node, eqn, out)
        if out.is_live:
            return [LIVE] * len(eqn.invars)
        lanewise = is_lanewise_call(eqn)
        if not (lanewise and eqn.primitive.name == "custom_jvp_call"):
            _note_broadcast_inside(analysis, node, eqn, out)
        if lanewise:
            return [out.without_partition()] * len(eqn.invars)
        if is_selection_free_call(eqn):
            lvs = self._structure.transfer(analysis, node, outs)
            mark_mask_only(analysis.subs[(node, 0)])
            return lvs
        body, _ = body_of(eqn)
        if not body_structure_known(body):
            # the dead lanes stop here: which inputs they come from, only a
            # body we cannot follow tells -- say so instead of staying silent
            analysis.note_unreached(
                node,
                f"{eqn.primitive.name}: dead lanes of its outputs are not followed into "
                "its body (an operation there moves lanes in a way the engine does not "
                "follow); its inputs are kept fully live",
                out.with_origin(analysis.graph.origin(node)),
            )
            return [LIVE] * len(eqn.invars)
        # a body that also selects (optax's weighted_logsoftmax): its
        # reduce/broadcast structure, with the selections read as joins
        sub = analyze_body(body, scope_name(analysis.graph.scope, eqn), outs)
        plan_of(analysis).structure[node] = sub
        return [sub.value_liveness(v).without_partition() for v in body.invars]

    def input_masks(self, mctx, node, eqn, out_masks):
        from hlo_guard.jax_frontend.mask_ops import broadcast_to, reduce_to_shape
        from passes.masks import ALL

        if not is_lanewise_call(eqn):
            if is_selection_free_call(eqn) and (node, 0) in mctx.analysis.subs:
                return self._structure.input_masks(mctx, node, eqn, out_masks)
            sub = plan_of(mctx.analysis).structure.get(node)
            if sub is None:
                return [ALL] * len(eqn.invars)
            body, _ = body_of(eqn)
            child = mctx.child_masks(node, 0, list(out_masks), analysis=sub)
            return LazyMasks(lambda i: child.resolver.value_mask(body.invars[i]), len(body.invars))
        shape = tuple(eqn.outvars[0].aval.shape)
        out = or_all(broadcast_to(m, shape) for m in out_masks)
        return LazyMasks(
            lambda i: reduce_to_shape(out, shape, tuple(eqn.invars[i].aval.shape)), len(eqn.invars)
        )

    def broadcast_operand_mask(self, mctx, node, eqn, index, out_masks):
        """The output-shaped mask of an operand a lane-wise ``custom_jvp``
        call broadcasts inside its body (a scalar parameter): guarded at the
        output's shape in the call's derivative
        (:func:`guarded_binding.bind_custom_call_with_broadcast_guards`).
        Any other call: ALL (its operand is guarded as it is)."""
        from hlo_guard.jax_frontend.mask_ops import broadcast_to
        from passes.masks import ALL

        if eqn.primitive.name != "custom_jvp_call" or not is_lanewise_call(eqn):
            return ALL
        shape = tuple(eqn.outvars[0].aval.shape)
        return or_all(broadcast_to(m, shape) for m in out_masks)

    def forward(self, fa, node, ins):
        eqn = fa.graph.eqns[node]
        if not is_lanewise_call(eqn):
            if is_selection_free_call(eqn):
                return self._structure.forward(fa, node, ins)
            if any(is_partly_zero(lv) for lv in ins):
                note_unfollowed(
                    fa,
                    node,
                    f"`{scope_name('', eqn)}` (a custom rule mixing lanes; its output "
                    "tangents taken as live)",
                )
            return [LIVE] * len(eqn.outvars)
        joined_in = join_all(ins)
        if joined_in.reaches_output and _rule_may_zero_lanes(eqn):
            # relu: the rule's tangent is an exact zero where the body selects
            # the constant; which lanes those are, only the rule can tell
            joined_in = Liveness(Level.PARTIAL, merge_origins(joined_in.origins, ())).with_origin(
                fa.graph.origin(node)
            )
        return [joined_in] * len(eqn.outvars)

    def body_guards_own_outputs(self, backward, forward, node):
        """A lane-wise ``custom_jvp`` call whose differentiable operands all
        carry fully live tangents needs no output guard of its own.

        Its outputs' zero tangent lanes are then the rule's own selections
        (``relu``'s ``select(x > 0, t, 0)``): the probe calls a lane dead
        only where no operand's tangent reaches it, so the rule computes it
        without the tangents -- an exact zero, for a rule linear in its
        tangents as JAX requires.  An output guard exists for an operation
        that multiplies a structurally zero *input* tangent by inf, and here
        there is none.  It would select 0 where the rule already gives 0, at
        the price of the probe and a select per call: one per activation of
        every ``relu`` network (found 2026-11-27 with Equinox's MLP, whose
        probes grew its trace cost with depth).  Where an operand's tangent
        is partly zero the rule may multiply those zeros by inf (``entr``'s
        ``t * (log(x) + 1)`` at 0), and the guard stays."""
        eqn = backward.graph.eqns[node]
        if eqn.primitive.name != "custom_jvp_call" or not is_lanewise_call(eqn):
            return False
        # a rule that only selects, adds and moves tangents keeps a zero
        # entering tangent an exact zero too (relu after a where)
        return operand_tangents_live(forward, eqn) or rule_preserves_zero(eqn)

    def forward_masks(self, mctx, node, eqn, in_masks):
        from hlo_guard.jax_frontend.mask_ops import broadcast_to
        from passes.masks import ALL

        if not is_lanewise_call(eqn):
            if is_selection_free_call(eqn):
                return self._structure.forward_masks(mctx, node, eqn, in_masks)
            return [ALL] * len(eqn.outvars)
        shape = tuple(eqn.outvars[0].aval.shape)
        m = or_all(broadcast_to(x, shape) for x in in_masks)
        if m is NONE or not _rule_may_zero_lanes(eqn):
            return [m] * len(eqn.outvars)
        # lane-wise: an output lane no live input lane feeds is dead, whatever
        # the rule computes there from zeros (``xlogy``'s ``0 * log(0)``)
        return [and_(p, m, shape) for p in probe_rule_tangents(mctx, eqn, in_masks)]


def _note_broadcast_inside(analysis, node, eqn, out) -> None:
    """A custom call with a partly dead output and a differentiable operand
    it broadcasts inside (a scalar parameter of a ``custom_vjp``; a row of
    per-class parameters read by every batch row of ``xlogy``): the
    operand's cotangent is the rule's own sum over the output lanes it
    feeds, dead ones included, computed in a derivative no select on the
    operand reaches.  Only a lane-wise ``custom_jvp`` call has that sum
    written out (:func:`guarded_binding.bind_custom_call_with_broadcast_guards`);
    every other case is reported, never silent."""
    if not eqn.outvars:
        return
    shape = tuple(eqn.outvars[0].aval.shape)
    graph = analysis.graph
    for i, v in enumerate(eqn.invars):
        if is_literal(v) or not is_inexact_aval(v.aval) or graph.is_constant(v):
            continue
        if _stretched_to(tuple(v.aval.shape), shape):
            analysis.note_unreached(
                node,
                f"{eqn.primitive.name}: operand {i} is broadcast inside the call, so its "
                "cotangent sums every output lane, dead ones included, in the rule's own "
                "backward pass where no guard reaches (a dead lane's 0 * inf there is NaN); "
                "broadcast it to the output's shape before the call, or write the double "
                "where",
                out.with_origin(graph.origin(node)),
            )
            return


def _stretched_to(in_shape: tuple, out_shape: tuple) -> bool:
    """Whether ``in_shape`` broadcasts to ``out_shape`` as numpy does
    (aligned at the right, each axis 1 or equal) and is stretched along
    some axis: then each of its lanes feeds several output lanes."""
    if in_shape == out_shape or len(in_shape) > len(out_shape):
        return False
    tail = out_shape[len(out_shape) - len(in_shape) :]
    if any(i not in (1, o) for i, o in zip(in_shape, tail)):
        return False
    return math.prod(in_shape) < math.prod(out_shape)


#: body jaxpr -> the hazards its own selections leave dead lanes at, as
#: "prim at file:line" (weakly keyed, like the other per-jaxpr caches)
_BODY_HAZARDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def note_dead_hazards_in_body(analysis, node, eqn, out) -> None:
    """Report the dead lanes *inside* a custom call's primal body that reach
    an operation with a possibly non-finite derivative.

    The body is never rewritten: the call's derivative is its own rule.  When
    that rule differentiates the body again -- Equinox's checkpointed
    ``while_loop`` (every diffrax solve) recomputes the VJP of the original
    step function in its backward pass -- a dead branch inside it leaks NaN and
    no guard of the primal program can reach it.  When the rule is an
    analytic formula, nothing leaks.  hlo_guard cannot tell which, so it says
    so instead of staying silent -- for ``custom_vjp`` calls, whose backward
    pass is Python code that may re-differentiate the body (the checkpointed
    loop above).  ``custom_jvp`` rules are formulas in practice (``relu``,
    ``logaddexp``, ``xlogy`` all select inside): reporting each would bury the
    report in false alarms."""
    body, _ = body_of(eqn)
    found = _BODY_HAZARDS.get(body)
    if found is None:
        found = _BODY_HAZARDS[body] = tuple(_dead_hazards(body, scope_name("", eqn)))
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        analysis.note_unreached(
            node,
            f"{eqn.primitive.name} body: dead lanes of a selection inside it reach {shown}; "
            "the call's own derivative rule is used and no guard reaches its backward "
            "pass (a rule that re-differentiates the body, such as a checkpointed loop, "
            "can give NaN there; guard the function it calls, e.g. "
            "diffrax.ODETerm(hlo_guard.guard(field)), or write the double where there)",
            out.with_origin(analysis.graph.origin(node)) if not out.is_live else out,
        )


def _dead_hazards(body, scope: str) -> list[str]:
    """``prim at file:line`` for every guard the body would get if it were
    rewritten, nested bodies included (analysed with every output live); the
    user's own lines first, library internals (the usual noise) after."""
    from hlo_guard.source import eqn_location, in_installed_package
    from passes.planning import plan_guards

    own: list[str] = []
    library: list[str] = []
    stack = [analysis_of_body(body, scope)]
    while stack:
        sub = stack.pop()
        for site in plan_guards(sub)[0]:
            e = sub.graph.eqns[site.node]
            loc = eqn_location(e)
            text = f"{e.primitive.name} at {loc}" if loc else e.primitive.name
            (library if in_installed_package(e) else own).append(text)
        for u in sub.unreached:  # custom calls nested in this body: what they found
            e = sub.graph.eqns[u.node]
            if e.primitive.name == "custom_vjp_call":
                own.extend(_BODY_HAZARDS.get(body_of(e)[0], ()))
        stack.extend(sub.subs.values())
    return list(dict.fromkeys(own + library))


def analysis_of_body(body, scope: str):
    from passes.analysis import analyze

    return analyze(JaxprGraph(body, scope), RULES, [LIVE] * len(body.outvars))


#: jaxpr -> no loop in it or in the calls inside it (:func:`_body_iterates`)
_LOOP_FREE_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: jaxpr -> no selection in it or in the calls inside it (:func:`_body_selects`)
_SELECT_FREE_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _none_of(names):
    """A :func:`holds_throughout` judge: no equation named in ``names``,
    looking into plain calls' bodies."""

    def judge(eqn):
        name = eqn.primitive.name
        if name in names:
            return False
        if name in CALL_BODY_PARAM:
            return [body_of(eqn)[0]]
        return True

    return judge


_NO_LOOP = _none_of(("while", "scan"))
_NO_SELECTION = _none_of(("select_n", "max", "min", "clamp"))


def _body_iterates(jaxpr) -> bool:
    """Whether a custom call's primal body holds a loop (``while``/``scan``,
    in nested calls too): an iterative solve (optimistix's root find, whose
    implicit-function rule is a ``custom_jvp``).  Such a rule differentiates
    the body's residual again, where dead lanes of a selection can leak, so
    it is reported as a ``custom_vjp`` is; formula rules (``relu``,
    ``logaddexp``) hold no loop and are not."""
    return not holds_throughout(jaxpr, _LOOP_FREE_CACHE, _NO_LOOP)


def _rule_may_zero_lanes(eqn) -> bool:
    """A lane-wise ``custom_jvp`` call whose primal body selects (``relu`` is
    ``max(x, 0)``): its rule may give an exact zero tangent in some lanes."""
    if eqn.primitive.name != "custom_jvp_call":
        return False
    return _body_selects(body_of(eqn)[0])


def _body_selects(jaxpr) -> bool:
    return not holds_throughout(jaxpr, _SELECT_FREE_CACHE, _NO_SELECTION)


def probe_rule_tangents(mctx, eqn, in_masks):
    """Tangent masks of a lane-wise ``custom_jvp`` call's outputs, from its own
    rule: JVP the call at its (gradient-stopped) operands with a tangent that
    is NaN in operand ``k``'s live lanes and 1 in its dead lanes, one operand
    at a time -- by evaluating the rule's jaxpr as JAX's JVP of the call does
    (:func:`_rule_tangents`), or by that JVP where the rule's jaxpr is not
    to be had.  An output lane is live iff the NaN arrives there: the rule's
    tangent depends on a live input tangent.  It does not where the rule
    *selects* a constant (``relu``: ``select(x > 0, t, 0)``) or where only
    dead lanes feed the lane (the caller also ANDs the result with the
    union of the input masks: the call is lane-wise, so a lane no live input
    lane feeds is dead whatever the probe of *another* operand computed
    there).  A coefficient that is merely numerically 0
    (``logaddexp``'s ``t * exp(x - out)`` underflowing at ``x = -inf``)
    still multiplies the NaN through: that lane is live, and a non-finite
    tangent arriving there from upstream (``softplus(log(x))`` at 0) stays
    visible, as in JAX without the guard.  (A live probe of 1.0 took such
    lanes for structural zeros and their output guard hid that NaN.)

    Dead lanes probe with 1, not 0, because the probe must see the rule's
    *dependence*, not the value it computes from a zero: ``entr``'s
    ``_xlogx`` rule is ``t * (log(x) + 1)``, and at a dead ``x = 0`` the
    zero tangent times ``-inf`` is NaN -- exactly the leak the output guard
    is for.  A 0 there made the lane look live, so it was neither guarded
    nor reported (found 2026-11-26: ``jacfwd(entr(where(x > 0, x, 0)))``
    NaN in the clipped lanes).  1 times an infinite coefficient is inf, not
    NaN.  Neither value reaches the result where no live lane feeds the
    lane (the caller's AND); the 1 matters where one operand is live and
    the rule selects its tangent away while another operand, dead there,
    has an infinite coefficient: ``0 * inf`` would make the lane look live."""
    import jax

    from hlo_guard.jax_frontend.binding import bind_eqn, jvp_in, stop_if_inexact
    from hlo_guard.jax_frontend.mask_ops import materialize, normalize

    vals = [stop_if_inexact(mctx.value(v)) for v in eqn.invars]
    diff = [
        k
        for k, v in enumerate(eqn.invars)
        if not is_literal(v) and is_inexact_aval(v.aval) and in_masks[k] is not NONE
    ]
    found: list = [None] * len(eqn.outvars)
    for k in diff:
        aval = eqn.invars[k].aval
        lanes = materialize(in_masks[k], tuple(aval.shape))
        tangent = jax.numpy.where(lanes, jax.numpy.nan, 1).astype(aval.dtype)
        tangent = tangent + jax.numpy.zeros_like(vals[k])  # its varying axes (shard_map)
        outs = _rule_tangents(eqn, vals, k, tangent)
        if outs is None:
            _, outs = jvp_in(lambda *args: bind_eqn(eqn, list(args)), vals, [k], [tangent])
        for j, o in enumerate(outs):
            if o is None or o.dtype == jax.dtypes.float0:
                continue  # a symbolically zero tangent: no live lane
            if not is_inexact_aval(eqn.outvars[j].aval):
                continue
            live = jax.numpy.isnan(o)
            found[j] = live if found[j] is None else (found[j] | live)
    return [NONE if m is None else normalize(m) for m in found]


def _rule_tangents(eqn, vals, k, tangent):
    """The output tangents of ``eqn``'s own rule at ``vals`` with ``tangent``
    in operand ``k`` and zero in the others -- None for an output tangent the
    rule leaves symbolically zero -- computed as JAX's JVP of the equation
    computes them (``custom_derivatives.lift_jvp``): the rule's jaxpr,
    evaluated here.  JAX's JVP hands a rule without ``symbolic_zeros`` zeros
    instantiated, so those are passed too.  None where this does not apply
    (a constant operand, an integer operand whose zero tangent is
    ``float0``, a rule that needs concrete values or has effects): the
    caller then takes JAX's JVP itself."""
    import jax

    from hlo_guard.jax_frontend.binding import bind_eqn
    from hlo_guard.jax_frontend.compat import custom_jvp_rule_jaxpr

    n = eqn.params.get("num_consts", 0)
    if eqn.primitive.name != "custom_jvp_call" or k < n:
        return None
    symbolic = bool(eqn.params.get("symbolic_zeros"))
    operands = range(n, len(eqn.invars))
    if not symbolic and not all(is_inexact_aval(eqn.invars[i].aval) for i in operands):
        return None
    zero_flags = [symbolic and i != k for i in operands]
    try:
        found = custom_jvp_rule_jaxpr(eqn, zero_flags)
    except Exception:  # noqa: BLE001 - JAX's own JVP says what went wrong
        return None
    if found is None or found[0].effects:
        return None
    jaxpr, consts, out_zeros = found
    tangents = [
        tangent if i == k else jax.numpy.zeros_like(vals[i])
        for i, flag in zip(operands, zero_flags)
        if not flag
    ]
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, [*vals[n:], *tangents]))
    for e in jaxpr.eqns:
        env.update(
            zip(e.outvars, bind_eqn(e, [v.val if is_literal(v) else env[v] for v in e.invars]))
        )
    outs = [v.val if is_literal(v) else env[v] for v in jaxpr.outvars]
    nonzero = iter(outs[len(out_zeros) :])
    return [None if zero else next(nonzero) for zero in out_zeros]


#: call body jaxpr -> whether the rule of the calls with that body preserves
#: zero tangents (:func:`rule_preserves_zero`); weakly keyed
_ZERO_PRESERVING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: tangent ops that map exact zeros to exact zeros, their transposes too
_MOVES_TANGENTS = frozenset(
    {
        "neg",
        "convert_element_type",
        "reshape",
        "broadcast_in_dim",
        "transpose",
        "squeeze",
        "expand_dims",
        "reduce_sum",
        "copy",
    }
)
_SUMS_TANGENTS = frozenset({"add", "sub", "add_any"})


def rule_preserves_zero(eqn) -> bool:
    """Whether a ``custom_jvp_call``'s rule computes its output tangents
    from the input tangents only by selecting them against zeros with
    primal predicates, adding them, moving them and scaling them by finite
    literals: then zero tangents in give exact zeros out, and the transpose
    maps zero cotangents to exact zeros, whatever the primals hold (inf,
    NaN).  Read off the rule's own jaxpr (:func:`compat.custom_jvp_rule_jaxpr`,
    every tangent instantiated); False wherever that is not available."""
    if eqn.primitive.name != "custom_jvp_call":
        return False
    body = body_of(eqn)[0]
    found = _ZERO_PRESERVING.get(body)
    if found is None:
        found = _ZERO_PRESERVING[body] = _read_rule(eqn)
    return found


def _read_rule(eqn) -> bool:
    from hlo_guard.jax_frontend.compat import custom_jvp_rule_jaxpr

    n = eqn.params.get("num_consts", 0)
    operands = eqn.invars[n:]
    if not all(is_inexact_aval(v.aval) for v in operands):
        return False  # an integer operand's tangent is float0
    try:
        found = custom_jvp_rule_jaxpr(eqn, [False] * len(operands))
    except Exception:  # noqa: BLE001 - not readable: keep the hazard
        return False
    if found is None or found[0].effects:
        return False
    jaxpr, _, _ = found
    n_primals = len(jaxpr.invars) - len(operands)
    return _tangents_flow_exactly(jaxpr, set(jaxpr.invars[n_primals:]), set()) is not None


def _tangents_flow_exactly(jaxpr, tangent: set, zero: set):
    """``(tangent outputs, zero outputs)`` of ``jaxpr`` given which inputs
    carry tangents and which are zero, when every operation reading a
    tangent keeps an exact zero exact (see :func:`rule_preserves_zero`);
    None as soon as one may not.  Follows plain calls (``jnp.where``'s
    wrapper) into their bodies."""
    tangent, zero = set(tangent), set(zero)

    def is_zero(v):
        if is_literal(v):
            return not np.any(np.asarray(v.val) != 0)
        return v in zero

    for e in jaxpr.eqns:
        name = e.primitive.name
        reads = [v for v in e.invars if not is_literal(v) and v in tangent]
        if name in CALL_BODY_PARAM:
            body, _ = body_of(e)
            inner_t = {
                b for b, v in zip(body.invars, e.invars) if not is_literal(v) and v in tangent
            }
            inner_z = {b for b, v in zip(body.invars, e.invars) if is_zero(v)}
            found = _tangents_flow_exactly(body, inner_t, inner_z)
            if found is None:
                return None
            outs_t, outs_z = found
            tangent.update(o for o, b in zip(e.outvars, body.outvars) if b in outs_t)
            zero.update(o for o, b in zip(e.outvars, body.outvars) if b in outs_z)
            continue
        if not reads:
            if name in ("broadcast_in_dim", "convert_element_type") and is_zero(e.invars[0]):
                zero.update(e.outvars)
            continue
        if name == "select_n" and not (not is_literal(e.invars[0]) and e.invars[0] in tangent):
            ok = all(is_zero(v) or v in tangent for v in e.invars[1:])
        elif name in _SUMS_TANGENTS:
            ok = all(is_zero(v) or v in tangent for v in e.invars)
        elif name in _MOVES_TANGENTS:
            ok = True
        elif name in ("mul", "div") and len(reads) == 1 and len(e.invars) == 2:
            other = e.invars[1] if e.invars[0] in reads else e.invars[0]
            value = np.asarray(other.val) if is_literal(other) else None
            ok = value is not None and bool(np.all(np.isfinite(value)))
            if name == "div":  # only the numerator may be the tangent
                ok = ok and e.invars[0] in reads and bool(np.all(value != 0))
        else:
            ok = False
        if not ok:
            return None
        tangent.update(e.outvars)
    return (
        {v for v in jaxpr.outvars if not is_literal(v) and v in tangent},
        {v for v in jaxpr.outvars if is_zero(v)},
    )


_STRUCTURE_KINDS = ("elementwise", "zero-derivative", "structural", "pass-through", "linear")
#: jaxpr -> answer; weakly keyed, as the other per-jaxpr caches, so that it
#: never keeps a body (and the constants of the jits inside it) alive
_SELECTION_FREE_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def is_selection_free_call(eqn) -> bool:
    """The custom call's primal body (and the plain calls inside it) holds only
    elementwise, structural and pass-through operations: no selection, no
    control flow, nothing unruled -- its liveness is pure data flow."""
    return _selection_free(body_of(eqn)[0])


def _selection_free(jaxpr) -> bool:
    return holds_throughout(jaxpr, _SELECTION_FREE_CACHE, _selection_free_op)


def _selection_free_op(eqn):
    name = eqn.primitive.name
    if name in REWRITTEN_CALLS:
        return [body_of(eqn)[0]]
    rule = RULES.get(name)
    return (
        rule is not None
        and rule.kind in _STRUCTURE_KINDS
        and not getattr(rule, "value_dependent", False)
    )


#: pass-through ops (``optimization_barrier``, ``copy``: ``ndtri``'s body on
#: jax 0.12) hand each lane on unchanged: lane-wise
_LANEWISE_KINDS = ("elementwise", "zero-derivative", "pass-through")
_LANEWISE_PRIMS = {"select_n", "max", "min", "clamp", "broadcast_in_dim"}
_LANEWISE_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # jaxpr -> {shape: bool}


def is_lanewise_call(eqn) -> bool:
    """Every output has one shape S; every input and every value in the body
    is S-shaped or a scalar; no operation moves or reduces lanes."""
    outs = [v for v in eqn.outvars]
    if not outs:
        return False
    shape = tuple(outs[0].aval.shape)
    if any(tuple(getattr(v.aval, "shape", ())) != shape for v in outs):
        return False
    if any(tuple(getattr(v.aval, "shape", ())) not in (shape, ()) for v in eqn.invars):
        return False
    body, _ = body_of(eqn)
    return _body_lanewise(body, shape)


def _body_lanewise(jaxpr, shape) -> bool:
    """Whether every value of ``jaxpr`` that depends on its inputs is
    ``shape``-shaped or a scalar and made by an operation that keeps lanes
    apart.  Values built from constants alone (TFP's ``lbeta`` concatenates
    and slices a table of coefficients) hold no input lane: the same in
    every lane, as a scalar is."""
    per_shape = _LANEWISE_CACHE.setdefault(jaxpr, {})
    hit = per_shape.get(shape)
    if hit is not None:
        return hit
    ok = True
    dependent = {id(v) for v in jaxpr.invars}
    for e in jaxpr.eqns:
        if not any(id(v) in dependent for v in e.invars if not is_literal(v)):
            continue  # constants only
        dependent.update(id(v) for v in e.outvars)
        shapes = [tuple(getattr(v.aval, "shape", ())) for v in list(e.invars) + list(e.outvars)]
        if any(s not in (shape, ()) for s in shapes):
            ok = False
        else:
            name = e.primitive.name
            rule = RULES.get(name)
            if name in CALL_BODY_PARAM:
                ok = _body_lanewise(body_of(e)[0], shape)
            elif name == "broadcast_in_dim":
                ok = all(tuple(getattr(v.aval, "shape", ())) == () for v in e.invars)
            elif name in _LANEWISE_PRIMS:
                ok = True
            else:
                ok = rule is not None and rule.kind in _LANEWISE_KINDS
        if not ok:
            break
    per_shape[shape] = ok
    return ok


def register(table):
    table.register(["jit", "closed_call", "eval_jaxpr", "remat2"], Call(guards=False))
    table.register(["custom_jvp_call", "custom_vjp_call"], CustomCall())
    table.register(["cond", "while", "scan", "shard_map"], ControlFlow())
