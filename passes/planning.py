"""Guard planning: which uses get ``select(mask, x, stop_gradient(x))``.

A use is guarded when it is not fully live (some lane's derivative is
structurally zero) *and* its rule says a zero cotangent could be turned into
NaN there (local derivative possibly non-finite, or a 0/1 coefficient that is
multiplied rather than selected).  Uses that are dead with no selection behind
them are never differentiated and need nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from passes.analysis import Analysis
from passes.lattice import Level, Liveness
from passes.rules import ForwardRule, implements


@dataclass(frozen=True)
class GuardSite:
    node: int
    index: int
    liveness: Liveness

    @property
    def statically_dead(self) -> bool:
        """Dead in every lane: the guard is a plain ``stop_gradient``."""
        return self.liveness.level is Level.DEAD


@dataclass(frozen=True)
class UnguardedSite:
    node: int
    reason: str
    liveness: Liveness


def plan_guards(analysis: Analysis) -> tuple[list[GuardSite], list[UnguardedSite]]:
    """Guard sites and unguarded sites of one graph (not of nested graphs)."""
    sites = plan_hazard_guards(analysis)
    unguarded = [UnguardedSite(u.node, u.reason, u.liveness) for u in analysis.unreached]
    return sites, unguarded


def plan_hazard_guards(analysis: Analysis) -> list[GuardSite]:
    """Every partly dead use whose rule says ``guards_input``: the hazards
    themselves, each guarded where it is."""
    graph = analysis.graph
    rules = analysis.rules
    sites: list[GuardSite] = []
    for (node, index), lv in analysis.use_liveness.items():
        if lv.level is Level.LIVE or not lv.reaches_output:
            continue
        rule = rules.get(graph.op_name(node))
        if rule is not None and rule.guards_input(analysis, node, index):
            sites.append(GuardSite(node, index, lv))
    sites.sort(key=lambda s: (s.node, s.index))
    return sites


def plan_boundary_guards(analysis: Analysis) -> tuple[list[GuardSite], list[UnguardedSite]]:
    """Boundary placement (issue 17; not yet what the front ends use: they call
    :func:`plan_guards`, the hazard placement).

    Guards go on the *boundary* of a dead region, not on every hazard inside
    it (DESIGN.md step 3, docs/PLACEMENT.md): a partly dead use ``(n, i)`` of
    value ``x`` is guarded when the region behind it holds an unguarded hazard
    (:func:`hazard_behind`) and its dead lanes' cotangent could otherwise be
    summed into a live lane -- ``x`` is a graph input or graph output, has
    another differentiable use, or is produced by an op that may mix lanes.
    Everywhere else a dead lane's cotangent only meets other dead lanes and
    ends at one of those guards' selects.
    """
    _, guarded = _sweep(analysis)
    sites = [GuardSite(n, i, analysis.use(n, i)) for n, i in sorted(guarded)]
    unguarded = [UnguardedSite(u.node, u.reason, u.liveness) for u in analysis.unreached]
    return sites, unguarded


def hazard_behind(analysis: Analysis) -> dict[tuple[int, int], bool]:
    """For every use ``(n, i)``: may a zero cotangent arriving there be turned
    non-finite in the dead region behind it (forward from ``n`` through
    partly dead uses, stopping at boundary guards)?"""
    return _sweep(analysis)[0]


def _sweep(analysis: Analysis) -> tuple[dict[tuple[int, int], bool], set[tuple[int, int]]]:
    """One reverse-topological sweep deciding hazards and guards together:
    ``H(n, i) = guards_input(n, i) or Hout(n)``; ``Hout(n)`` = any ``H`` of a
    partly dead use of ``n``'s outputs that is not itself guarded (a guard's
    select turns every dead lane into an exact zero); conservatively true for
    an op without a rule and where a partly dead value leaves the graph."""
    graph = analysis.graph
    rules = analysis.rules
    inputs = {v for v in graph.graph_inputs() if _hashable(v)}
    outputs = {v for v in graph.graph_outputs() if _hashable(v)}
    uses = _uses_by_value(analysis)
    h_use: dict[tuple[int, int], bool] = {}
    guarded: set[tuple[int, int]] = set()

    def candidates(v):
        for u in uses.get(v, ()):
            lv = analysis.use(*u)
            if lv.level is not Level.LIVE and lv.reaches_output and h_use.get(u, True):
                yield u

    def decide(v, mixing: bool) -> bool:
        """Guard the hazardous uses of ``v`` at the boundary; True when an
        unguarded hazard stays behind ``v`` (its producer's ``Hout``)."""
        leaves = v in outputs and analysis.value_liveness(v).level is not Level.LIVE
        differentiable = [u for u in uses.get(v, ()) if analysis.use(*u).reaches_output]
        boundary = mixing or leaves or v in inputs or len(differentiable) > 1
        behind = leaves
        for u in candidates(v):
            if boundary:
                guarded.add(u)
            else:
                behind = True
        return behind

    for node in reversed(range(graph.node_count())):
        rule = rules.get(graph.op_name(node))
        mixing = rule is None or not rule.keeps_lanes_apart(analysis, node)
        h_out = rule is None
        for v in graph.node_outputs(node):
            if v is not None and _hashable(v) and decide(v, mixing):
                h_out = True
        for i in range(len(graph.node_inputs(node))):
            h_use[(node, i)] = h_out or rule is None or rule.guards_input(analysis, node, i)
    for v in inputs:
        decide(v, True)
    return h_use, guarded


def _hashable(v) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


def _uses_by_value(analysis: Analysis) -> dict:
    graph = analysis.graph
    uses: dict = {}
    for node in range(graph.node_count()):
        for i, v in enumerate(graph.node_inputs(node)):
            if v is not None and _hashable(v):
                uses.setdefault(v, []).append((node, i))
    return uses


def _producers(graph) -> dict:
    producer: dict = {}
    for node in range(graph.node_count()):
        for v in graph.node_outputs(node):
            if v is not None and _hashable(v):
                producer[v] = node
    return producer


@dataclass(frozen=True)
class OutputGuardSite(GuardSite):
    """Guard output ``index`` of ``node``: some lanes of its input tangents are
    structurally zero and its derivative may multiply them by inf (forward
    mode).  ``liveness`` is the output's *tangent* liveness."""


def plan_output_guards(backward: Analysis, forward) -> list[OutputGuardSite]:
    """Output guards of one graph, from its backward and forward analyses.

    Only outputs whose derivative is used at all (backward liveness reaches an
    output) and whose tangent is not fully live are guarded, and only for
    operations whose rule says their derivative may be non-finite.
    """
    graph = backward.graph
    rules = backward.rules
    sites: list[OutputGuardSite] = []
    for node in range(graph.node_count()):
        rule = rules.get(graph.op_name(node))
        if not implements(rule, ForwardRule):
            continue
        for j, v in enumerate(graph.node_outputs(node)):
            if v is None or not graph.carries_derivative(v):
                continue
            t = forward.value_liveness(v)
            if t.level is Level.LIVE or not t.reaches_output:
                continue
            if not backward.value_liveness(v).reaches_output:
                continue
            if rule.guards_output(backward, node, j):
                sites.append(OutputGuardSite(node, j, t))
    return sites
