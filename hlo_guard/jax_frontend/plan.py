"""What the JAX front end keeps per analysed jaxpr: the guard plan and the
record of what rewriting it did.

A :class:`GuardPlan` is computed lazily from an
:class:`~passes.analysis.Analysis` and cached on it (``analysis.plan``), one
per jaxpr and per nested body, so that a trace cache hit re-uses it.  It
replaces string keys in a free-form dict: each field says what it holds, and
the interpreter, the call rules, value mode and ``explain`` read the same
typed object.

The :class:`RewriteRecord` is the part only a guarded evaluation can fill
in: guards that had to be skipped (their mask needed an effectful value, see
:class:`passes.masks.ShadowUnavailable`) and which modes have been evaluated
to the end.  ``explain`` reads it and traces the guarded program only when
no evaluation in that mode has finished yet (TF's counterpart is
:class:`hlo_guard.tf.records.BuildRecord`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

from hlo_guard.jax_frontend.bodies import (
    CONTROL_FLOW,
    REWRITTEN_CALLS,
    body_is_risky,
    body_of,
    control_bodies,
    first_body_operand,
    loop_carries,
)
from hlo_guard.jax_frontend.graph import JaxprGraph, Literal
from hlo_guard.jax_frontend.rule_table import RULES
from passes.analysis import Analysis, ForwardAnalysis, analyze_forward
from passes.lattice import LIVE
from passes.planning import (
    GuardSite,
    OutputGuardSite,
    UnguardedSite,
    placement_of,
    plan_boundary_guards,
    plan_guards,
    plan_output_guards,
)
from passes.tangent_gaps import (
    UNFOLLOWED,
    is_partly_zero,
    note_unfollowed,
    tainted_values,
    unguarded_sites,
)

if TYPE_CHECKING:  # (the rules package imports this module)
    from hlo_guard.jax_frontend.rules.base import JaxRule

#: primitives whose bodies the interpreter evaluates with guards
_GUARDED_BODIES = REWRITTEN_CALLS | CONTROL_FLOW

#: a skipped guard: (node, input index, reason); index None for the masks of a
#: call's outputs passed into its body, ("output", j) for a forward-mode guard
SkippedGuard = tuple[int, Any, str]

#: bilinear primitives whose gradient multiplies each operand's *value* into
#: the other's cotangent (see :attr:`GuardPlan.guarded_contractions`)
GUARDED_CONTRACTIONS = frozenset({"dot_general", "conv_general_dilated"})


@dataclass
class RewriteRecord:
    """What guarded evaluations of one jaxpr found out."""

    skipped: set[SkippedGuard] = field(default_factory=set)
    #: planned guards a rewrite left out because the contraction they belong
    #: to covers them (``Scope._contraction_covers``, a boundary guard: ``(node,
    #: index)``; a contraction operand whose mask is one bit: ``(node,
    #: ("contraction", index))``); ``explain`` does not list them as guards
    covered: set[tuple[int, Any]] = field(default_factory=set)
    #: modes (``"gradient"``, ``"value"``) some evaluation ran to the end in;
    #: ``skipped`` is complete for those
    finished: set[str] = field(default_factory=set)

    def skip(self, node: int, index: Any, reason: str) -> None:
        self.skipped.add((node, index, reason))


@dataclass
class GuardPlan:
    """The guards of one analysed jaxpr, grouped the way evaluation uses them."""

    analysis: Analysis
    record: RewriteRecord = field(default_factory=RewriteRecord)
    #: a custom call's primal body, analysed only for its masks and never
    #: rewritten: its planned sites are not applied, so reports skip them
    mask_only: bool = False
    #: node -> the structure-only analysis of a custom call's body (selections
    #: read as joins), made by the call rule and read back for its masks
    structure: dict[int, Analysis] = field(default_factory=dict)
    #: guarded callables of call bodies, keyed by (node, which output masks
    #: are passed, mode, nested): re-binding the same callable lets JAX's own
    #: caches (jit, checkpoint) hit
    callables: dict[tuple, Callable] = field(default_factory=dict)
    #: value mode: whether a node's dead lanes are dead by value, per (node, nested)
    value_dead: dict[tuple[int, int], bool] = field(default_factory=dict)
    #: node of :attr:`forward_unfollowed` -> (forward analyses, backward
    #: analysis) of the body in whose forward analyses its tangent's origins live
    forward_gap_contexts: dict[int, tuple] = field(default_factory=dict)
    #: the patterns of arguments without a forward tangent already checked
    #: for missing forward guards (:mod:`hlo_guard.jax_frontend.argument_tangents`)
    untracked_checked: set[tuple[int, ...]] = field(default_factory=set)
    #: mode -> :meth:`rewritten_bodies`
    _rewritten: dict[str, frozenset[int]] = field(default_factory=dict, repr=False)

    @property
    def graph(self) -> JaxprGraph:
        """The analysed jaxpr's graph (the JAX front end only analyses these)."""
        return cast(JaxprGraph, self.analysis.graph)

    @cached_property
    def sites_by_node(self) -> dict[int, list[GuardSite]]:
        """Gradient mode: the boundary placement (a guard where a dead region
        meets live computation, docs/PLACEMENT.md)."""
        return _by_node(plan_boundary_guards(self.analysis)[0])

    @cached_property
    def hazard_sites_by_node(self) -> dict[int, list[GuardSite]]:
        """Value mode: a guard on every hazard itself.  Value mode promises
        finite *forward* values in dead lanes, so each singular operation
        needs its own safe point; a guard at the region's boundary would only
        clean the cotangent."""
        return _by_node(plan_guards(self.analysis)[0])

    def sites_for(self, mode: str) -> dict[int, list[GuardSite]]:
        return self.hazard_sites_by_node if mode == "value" else self.sites_by_node

    @cached_property
    def forward(self) -> ForwardAnalysis:
        """Tangent liveness of the graph evaluated with guards: its inputs (and
        constants, which may be tracers closed over from an outer
        transformation) count as fully live -- unless it is a call body its
        caller evaluates in the caller's forward context
        (:attr:`forward_context`)."""
        context = self.forward_context
        if context is not None:
            return context
        graph = self.graph
        n_in = len(graph.jaxpr.invars) + len(graph.jaxpr.constvars)
        return analyze_forward(graph, RULES, [LIVE] * n_in)

    @cached_property
    def forward_context(self) -> ForwardAnalysis | None:
        """The caller's forward analysis of this body, when the caller
        evaluates it in that context and passes its operands' tangent masks
        in (:meth:`Call.guards_in_forward_context`); None otherwise.  Found
        through the analysis's link to its caller, so that it does not
        matter which plan of the tree is asked first."""
        caller = self.analysis.caller
        if caller is None:
            return None
        parent, node, k = caller
        parent_plan = plan_of(parent)
        if node not in parent_plan.forward_context_calls:
            return None
        return parent_plan.forward.subs.get((node, k))

    @cached_property
    def forward_unfollowed(self) -> list[UnguardedSite]:
        """Forward mode's unguarded sites in this graph: ops with bodies that
        a partly zero tangent enters but whose tangents the forward half
        does not follow (:meth:`JaxRule.forward_unfollowed`).  ``explain``
        lists them; nothing is guarded for them."""
        if not body_is_risky(self.graph.jaxpr):
            return []
        found = []
        for node, sub_index in sorted(self.analysis.subs):
            if sub_index != 0:
                continue
            rule = cast("JaxRule | None", self.analysis.rules.get(self.graph.op_name(node)))
            unfollowed = (
                rule.forward_unfollowed(self.analysis, self.forward, node) if rule else None
            )
            if unfollowed is not None:
                reason, tangent, context = unfollowed
                found.append(UnguardedSite(node, reason, tangent))
                if context is not None:
                    self.forward_gap_contexts[node] = context
        # tangents taken as live without knowing it (a sort's or a loop's
        # outputs, an unknown operation's), followed to the singular
        # operations they reach -- from inside this graph, from the caller
        # (a value entering a loop or branch body) or around a loop
        if self.forward_tainted:
            seen = {site.node for site in found}
            found.extend(
                site
                for site in unguarded_sites(
                    self.graph,
                    self.forward,
                    self.analysis,
                    self.forward_taint_seeds,
                    output_may_blow_up,
                )[1]
                if site.node not in seen
            )
        return found

    @cached_property
    def forward_taint_seeds(self) -> dict:
        """This graph's inputs whose tangent lanes are not known although
        its forward analysis may think so: a control-flow body's operands
        tainted in the caller (:meth:`_entering_taint`), and a loop body's
        carries the taint reaches around the loop (:meth:`_carried_taint`)."""
        forward = self.forward
        note_unknown_operations(self.graph, forward)
        seeds = self._entering_taint()
        if UNFOLLOWED not in forward.notes and not seeds:
            return {}
        return self._carried_taint(forward, seeds)

    @cached_property
    def forward_tainted(self) -> dict:
        """Every value of this graph whose tangent comes through one taken as
        live without knowing it: value -> the reason (:mod:`passes.tangent_gaps`)."""
        seeds = self.forward_taint_seeds
        if UNFOLLOWED not in self.forward.notes and not seeds:
            return {}
        return tainted_values(self.graph, self.forward, seeds)[0]

    def _entering_taint(self) -> dict:
        """A ``cond`` branch's, a loop body's or a ``shard_map`` body's inputs
        whose operand is tainted in the caller (a ``sort``'s output passed
        in): the body's own analysis takes their tangents as live, so a
        singular operation inside that reads them is reported here.  (A
        call's body is not seeded: the call itself is reported where a
        tainted value enters it and its body may blow up,
        :func:`output_may_blow_up`.)"""
        caller = self.analysis.caller
        if caller is None:
            return {}
        parent, node, _ = caller
        eqn = cast(JaxprGraph, parent.graph).eqns[node]
        name = eqn.primitive.name
        if name not in CONTROL_FLOW:
            return {}
        operands = eqn.invars[first_body_operand(eqn) :]
        tainted = plan_of(parent).forward_tainted
        if not tainted:
            return {}
        where = f"`{name}`'s operand"
        return {
            inner: f"{tainted[outer]}, entering {where}"
            for inner, outer in zip(self.graph.jaxpr.invars, operands)
            if not isinstance(outer, Literal) and outer in tainted
        }

    def _carried_taint(self, forward: ForwardAnalysis, seeds: dict) -> dict:
        """``seeds`` and a loop body's carry inputs whose tangent comes back
        around the loop through a value taken as live (a ``sort`` or an inner
        loop in the body, or a tainted value entering it): tainted in the
        next iteration, as the carry output is in this one."""
        caller = self.analysis.caller
        if caller is None:
            return seeds
        parent, node, _ = caller
        eqn = cast(JaxprGraph, parent.graph).eqns[node]
        jaxpr = self.graph.jaxpr
        pairs = loop_carries(eqn)
        if not pairs:
            return seeds
        seeds = dict(seeds)
        for _ in range(len(pairs) + 1):
            tainted = tainted_values(self.graph, forward, seeds)[0]
            changed = False
            for i, j in pairs:
                out, inp = jaxpr.outvars[j], jaxpr.invars[i]
                if not isinstance(out, Literal) and out in tainted and inp not in seeds:
                    seeds[inp] = tainted[out] + " around the loop"
                    changed = True
            if not changed:
                break
        return seeds

    @cached_property
    def forward_context_calls(self) -> frozenset[int]:
        """Call, ``cond``, ``scan`` and ``while`` nodes whose bodies are
        evaluated in this graph's forward context (their operands' tangent
        masks passed in)."""
        found = set()
        eqns = self.graph.eqns
        for node, k in self.analysis.subs:
            eqn = eqns[node]
            if k != 0:
                continue
            if eqn.primitive.name in ("cond", "scan", "while"):
                if not any(body_is_risky(body) for body, _ in control_bodies(eqn)):
                    continue
            elif eqn.primitive.name not in REWRITTEN_CALLS or not body_is_risky(body_of(eqn)[0]):
                continue
            rule = cast("JaxRule | None", self.analysis.rules.get(eqn.primitive.name))
            if rule is not None and rule.guards_in_forward_context(
                self.analysis, self.forward, node
            ):
                found.add(node)
        return frozenset(found)

    @cached_property
    def output_sites_by_node(self) -> dict[int, list[OutputGuardSite]]:
        if not body_is_risky(self.graph.jaxpr):
            # no operation here or below whose derivative may be non-finite:
            # no output guard, and no forward analysis to find out
            return {}
        grouped: dict[int, list[OutputGuardSite]] = {}
        for site in plan_output_guards(self.analysis, self.forward):
            grouped.setdefault(site.node, []).append(site)
        return grouped

    def rewritten_bodies(self, mode: str) -> frozenset[int]:
        """The call and control-flow nodes re-bound with a guarded body in
        ``mode``: some body of theirs needs a rewrite itself."""
        found = self._rewritten.get(mode)
        if found is None:
            # this graph's placement first: it places the bodies it sees
            # through with its own view of their boundary (no guard inside a
            # jnp.sqrt wrapper whose operand it guards), which a body's plan
            # asked first would not know (value mode guards every hazard
            # where it is, with no placement)
            if mode != "value":
                placement_of(self.analysis)
            eqns = self.graph.eqns
            found = self._rewritten[mode] = frozenset(
                node
                for (node, _), sub in self.analysis.subs.items()
                if eqns[node].primitive.name in _GUARDED_BODIES and plan_of(sub).needs_rewrite(mode)
            )
        return found

    def needs_rewrite(self, mode: str) -> bool:
        """Whether evaluating this graph in ``mode`` differs from binding it
        as it is (a ``jnp.sqrt`` wrapper inside a guarded chain has guards in
        value mode but none in gradient mode)."""
        return bool(
            self.sites_for(mode)
            or self.output_sites_by_node
            or self.guarded_contractions
            or self.rewritten_bodies(mode)
        )

    @cached_property
    def guarded_contractions(self) -> frozenset[int]:
        """Contraction nodes through which a derivative flows and whose output
        (or an operand) is partly dead: bound with each operand's dead lanes
        zeroed in the other operand's derivative term
        (:func:`guarded_binding.bind_with_contraction_guards`), because a
        select on the operand's use cannot stop ``0 * inf`` in the other
        operand's cotangent.  The zeroed operand may carry no derivative at
        all (a closed-over array normalised to ``0 / 0`` in a padded row)."""
        found = set()
        for node, eqn in enumerate(self.graph.eqns):
            if eqn.primitive.name not in GUARDED_CONTRACTIONS:
                continue
            uses = [self.analysis.use(node, i) for i in range(len(eqn.invars))]
            if not any(lv.reaches_output for lv in uses):
                continue
            out = self.analysis.value_liveness(eqn.outvars[0])
            partly_dead_use = any(lv.reaches_output and not lv.is_live for lv in uses)
            if partly_dead_use or (out.reaches_output and not out.is_live):
                found.add(node)
        return frozenset(found)

    @cached_property
    def all_uses(self) -> dict[Any, list[tuple[int, int]]]:
        """Every use of every variable, including those the liveness analysis
        skips because they carry no derivative (comparisons, ``argmax``):
        those are exactly the uses whose *values* matter (value mode)."""
        uses: dict[Any, list[tuple[int, int]]] = {}
        for node, eqn in enumerate(self.graph.eqns):
            for i, v in enumerate(eqn.invars):
                if not isinstance(v, Literal):
                    uses.setdefault(v, []).append((node, i))
        return uses

    @cached_property
    def value_unobserved(self) -> frozenset[int]:
        """Nodes whose outputs no graph output and no effect ever reads
        (``distrax.Tanh().inverse`` computes a log-det it then drops): value
        mode need not keep their inputs' dead lanes' values.  An equation
        with effects (``jax.debug.print``) observes its inputs."""
        graph = self.graph
        observed = {id(v) for v in graph.jaxpr.outvars}
        found = set()
        for node in reversed(range(len(graph.eqns))):
            eqn = graph.eqns[node]
            if eqn.effects or any(id(o) in observed for o in eqn.outvars):
                observed.update(id(v) for v in eqn.invars if not isinstance(v, Literal))
            else:
                found.add(node)
        return frozenset(found)


def output_may_blow_up(backward, node: int, index: int) -> bool:
    """Whether a partly zero tangent reaching op ``node`` could turn
    non-finite in output ``index``: its rule's ``guards_output``, and for a
    plain call (every ``jnp`` wrapper) the same question of some operation
    in its body, which sees the call's known constants -- ``c * 2.0`` is
    ``jit(multiply)`` around a ``mul`` by a known finite scale."""
    name = backward.graph.op_name(node)
    rule = backward.rules.get(name)
    if rule is None:
        return True
    if not rule.guards_output(backward, node, index):
        return False
    sub = backward.subs.get((node, 0))
    if name not in REWRITTEN_CALLS or sub is None:
        return True
    return _body_may_blow_up(sub)


def _body_may_blow_up(sub: Analysis) -> bool:
    """Whether some operation in body ``sub`` could turn a partly zero
    tangent non-finite (:func:`output_may_blow_up`), looking into the
    branches and loop bodies it holds: a ``cond`` or loop never guards its
    own outputs, but a ``sqrt`` inside it does."""
    graph = sub.graph
    for n in range(graph.node_count()):
        if graph.op_name(n) in CONTROL_FLOW:
            if any(_body_may_blow_up(b) for (m, _), b in sub.subs.items() if m == n):
                return True
            continue
        if any(
            output_may_blow_up(sub, n, j)
            for j, v in enumerate(graph.node_outputs(n))
            if v is not None and graph.carries_derivative(v)
        ):
            return True
    return False


def note_unknown_operations(graph: JaxprGraph, forward: ForwardAnalysis) -> None:
    """An operation without a rule takes its outputs' tangents as live: note
    it where a partly zero tangent enters it (:mod:`passes.tangent_gaps`)."""
    for node, eqn in enumerate(graph.eqns):
        if RULES.get(eqn.primitive.name) is not None:
            continue
        if any(
            is_partly_zero(forward.value_liveness(v))
            for v in eqn.invars
            if not isinstance(v, Literal)
        ):
            note_unfollowed(
                forward,
                node,
                f"`{eqn.primitive.name}` (no rule; its output tangents taken as live)",
            )


def _by_node(sites: list[GuardSite]) -> dict[int, list[GuardSite]]:
    grouped: dict[int, list[GuardSite]] = {}
    for site in sites:
        grouped.setdefault(site.node, []).append(site)
    return grouped


def plan_of(analysis: Analysis) -> GuardPlan:
    """The plan of ``analysis``, made on first use."""
    plan = analysis.plan
    if plan is None:
        plan = analysis.plan = GuardPlan(analysis)
    return plan


def mark_mask_only(analysis: Analysis) -> None:
    """Mark ``analysis`` and every body nested in it as analysed for masks only."""
    stack = [analysis]
    while stack:
        a = stack.pop()
        plan_of(a).mask_only = True
        stack.extend(a.subs.values())
