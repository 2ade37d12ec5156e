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
    unguarded = [UnguardedSite(u.node, u.reason, u.liveness) for u in analysis.unreached]
    return sites, unguarded


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
