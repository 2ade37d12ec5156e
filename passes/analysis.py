"""Static gradient-liveness analysis, backwards from the outputs.

One pass over the nodes in reverse order.  For each node the rule maps the
liveness of its outputs to a liveness per input *use*; a value's liveness is
the join (OR over lanes) of its uses.  The result says, for every use, whether
it is fully live (no mask needed), partly live (a mask will be built on demand)
or dead, and records every place where dead lanes reach an operation the engine
cannot see through (no rule, opaque call, control-flow boundary).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from passes.graph import Graph
from passes.lattice import LIVE, NO_DERIVATIVE, Level, Liveness, join_all, partial_by
from passes.rules import ForwardRule, RuleTable, conservative_transfer, implements

Use = tuple[int, int]  # (node, input index)


@dataclass
class Unreached:
    """Dead lanes arrive at ``node`` but the engine does not follow them further."""

    node: int
    reason: str
    liveness: Liveness


@dataclass
class Analysis:
    graph: Graph
    rules: RuleTable
    out_liveness: list[Liveness]
    values: dict[Hashable, Liveness] = field(default_factory=dict)
    uses: dict[Hashable, list[Use]] = field(default_factory=dict)
    use_liveness: dict[Use, Liveness] = field(default_factory=dict)
    unreached: list[Unreached] = field(default_factory=list)
    #: nested analyses keyed by (node, sub-graph index), filled by call rules
    subs: dict[tuple[int, int], Analysis] = field(default_factory=dict)
    #: what the front end derives from this analysis and keeps with it (the
    #: JAX front end's ``GuardPlan``); None until the front end asks
    plan: Any = field(default=None, repr=False, compare=False)
    #: the boundary placement of this graph (:mod:`passes.planning`), made on
    #: first use -- or by the enclosing graph's placement when it sees through
    #: this body as one lane-local operation (:meth:`Rule.transparent_body`)
    placement: Any = field(default=None, repr=False, compare=False)
    #: :meth:`selects_anywhere`, once asked
    _selects_anywhere: bool | None = field(default=None, repr=False, compare=False)
    #: :meth:`dead_region`, once asked
    _dead_region: DeadRegion | None = field(default=None, repr=False, compare=False)
    #: ``(caller analysis, node, sub-graph index)`` of a nested analysis made
    #: by :meth:`analyze_sub`: a front end may evaluate a body in its caller's
    #: context (the JAX front end's forward-mode context of a call body)
    caller: tuple[Analysis, int, int] | None = field(default=None, repr=False, compare=False)

    def value_liveness(self, value: Hashable) -> Liveness:
        if value is None:
            return NO_DERIVATIVE
        return self.values.get(value, NO_DERIVATIVE)

    def output_liveness(self, node: int) -> list[Liveness]:
        return [self.value_liveness(v) for v in self.graph.node_outputs(node)]

    def use(self, node: int, index: int) -> Liveness:
        return self.use_liveness.get((node, index), NO_DERIVATIVE)

    def has_partial(self) -> bool:
        """Whether any lane anywhere (including nested graphs) is dead."""
        if any(lv.level is not Level.LIVE for lv in self.use_liveness.values()):
            return True
        return any(sub.has_partial() for sub in self.subs.values())

    def selects_anywhere(self) -> bool:
        """Whether some use here or in a nested graph has lanes whose
        derivative is structurally zero (partly or wholly dead by a
        selection), or an output has (a caller's dead region that runs
        through this graph): without one there is no dead region, so nothing
        in this graph or below it is guarded in reverse mode.  The outputs
        count on their own for a body that hands an input straight back:
        ``x.real`` of a real array is ``jit(lambda a: a)``, with no use at
        all, and its input is exactly as dead as its output."""
        found = self._selects_anywhere
        if found is None:
            found = (
                any(
                    lv.level is not Level.LIVE and lv.reaches_output
                    for lv in self.use_liveness.values()
                )
                or any(lv.level is not Level.LIVE and lv.reaches_output for lv in self.out_liveness)
                or any(sub.selects_anywhere() for sub in self.subs.values())
            )
            self._selects_anywhere = found
        return found

    def dead_region(self) -> DeadRegion:
        """Where the dead region touches this graph (made once, on first ask).

        The placement's sweeps visit every node, but decide something only
        where a partly dead use is: most of a program's equations are fully
        live (everything outside the few chains behind a selection), and on a
        100k-equation program the per-node rule calls of those equations were
        most of the placement's time."""
        found = self._dead_region
        if found is None:
            found = self._dead_region = DeadRegion.of(self)
        return found

    # -- helpers for rules ---------------------------------------------------
    def note_unreached(self, node: int, reason: str, liveness: Liveness) -> None:
        self.unreached.append(Unreached(node, reason, liveness))

    def analyze_sub(
        self, node: int, index: int, graph: Graph, out_liveness: Sequence[Liveness]
    ) -> Analysis:
        sub = analyze(graph, self.rules, out_liveness)
        sub.caller = (self, node, index)
        self.subs[(node, index)] = sub
        return sub


@dataclass(frozen=True)
class DeadRegion:
    """The uses of one graph whose derivative is structurally zero in some
    lanes but flows to an output (partly dead, or dead by a selection), and
    what they touch: a node outside :attr:`nodes` whose outputs are outside
    :attr:`values` reads and produces only fully live values."""

    #: the partly dead uses ``(node, index)``
    uses: frozenset
    #: the nodes that have a partly dead use
    nodes: frozenset
    #: the values that have a partly dead use
    values: frozenset
    #: the nodes with a nested graph (a body a placement may have to place)
    bodies: frozenset

    @property
    def visited(self) -> frozenset:
        """The nodes a sweep asks about for their own sake: a partly dead
        use, or a body."""
        return self.nodes | self.bodies

    @staticmethod
    def of(analysis: Analysis) -> DeadRegion:
        uses = frozenset(
            u
            for u, lv in analysis.use_liveness.items()
            if lv.level is not Level.LIVE and lv.reaches_output
        )
        values = frozenset(v for v, us in analysis.uses.items() if any(u in uses for u in us))
        bodies = frozenset(n for n, _ in analysis.subs)
        return DeadRegion(uses, frozenset(n for n, _ in uses), values, bodies)


def analyze(
    graph: Graph, rules: RuleTable, out_liveness: Sequence[Liveness] | None = None
) -> Analysis:
    """Run the static analysis over ``graph``.

    ``out_liveness`` defaults to every output fully live (the top level of a
    user's function); nested graphs get the liveness of their call's outputs.
    """
    outputs = list(graph.graph_outputs())
    if out_liveness is None:
        out_liveness = [LIVE] * len(outputs)
    result = Analysis(graph, rules, list(out_liveness))
    values = result.values
    for v, lv in zip(outputs, out_liveness):
        if v is not None and graph.carries_derivative(v) and lv.reaches_output:
            values[v] = values.get(v, NO_DERIVATIVE).join(lv)

    uses = result.uses
    use_liveness = result.use_liveness
    for node in range(graph.node_count() - 1, -1, -1):
        outs = [
            values.get(v, NO_DERIVATIVE) if v is not None else NO_DERIVATIVE
            for v in graph.node_outputs(node)
        ]
        if not any(o.reaches_output for o in outs):
            continue
        inputs = graph.node_inputs(node)
        name = graph.op_name(node)
        rule = rules.get(name)
        if rule is None:
            in_lv = conservative_transfer(len(inputs), outs)
            joined = join_all(outs)
            if not joined.is_live:
                result.note_unreached(node, f"no rule for primitive '{name}'", joined)
            elif any(v is not None and graph.carries_derivative(v) for v in inputs):
                # fully live is conservative only for the lanes that arrive:
                # the op may drop lanes itself (``scatter-max`` is a segment
                # max), and its dead lanes would then go unguarded -- so it
                # is reported whenever a derivative flows through it
                result.note_unreached(
                    node,
                    f"no rule for primitive '{name}': treated as fully live; lanes it "
                    "drops itself are not guarded",
                    partial_by(graph.origin(node)),
                )
        else:
            in_lv = rule.transfer(result, node, outs)
        for i, v in enumerate(inputs):
            if v is None:
                continue
            lv = in_lv[i]
            if not lv.reaches_output or not graph.carries_derivative(v):
                continue
            use_liveness[(node, i)] = lv
            uses.setdefault(v, []).append((node, i))
            prev = values.get(v)
            values[v] = lv if prev is None else prev.join(lv)
    return result


# -- forward (tangent) liveness ------------------------------------------------


@dataclass
class ForwardAnalysis:
    """Which lanes' *tangents* can be non-zero: the forward-mode mirror.

    Reverse mode leaks where a singular operation sits *upstream* of a
    selection (a zero cotangent times an infinite derivative).  Forward mode
    leaks where it sits *downstream*: ``sqrt(where(d > 0, d, 0))`` at ``d = 0``
    has a structurally zero tangent in that lane (the constant branch was
    taken), which ``sqrt'`` multiplies by inf.  A value's tangent lane is live
    when it may depend differentiably on an input; constants and literals are
    dead, selections pass on the lanes of the case they take.
    """

    graph: Graph
    rules: RuleTable
    in_liveness: list[Liveness]
    values: dict[Hashable, Liveness] = field(default_factory=dict)
    subs: dict[tuple[int, int], ForwardAnalysis] = field(default_factory=dict)
    notes: dict[Any, Any] = field(default_factory=dict)

    def value_liveness(self, value) -> Liveness:
        if value is None:
            return NO_DERIVATIVE
        return self.values.get(value, NO_DERIVATIVE)

    def input_liveness(self, node: int) -> list[Liveness]:
        return [self.value_liveness(v) for v in self.graph.node_inputs(node)]

    def analyze_sub(
        self, node: int, index: int, graph: Graph, in_liveness: Sequence[Liveness]
    ) -> ForwardAnalysis:
        sub = analyze_forward(graph, self.rules, in_liveness)
        self.subs[(node, index)] = sub
        return sub


def analyze_forward(graph, rules: RuleTable, in_liveness: Sequence[Liveness]) -> ForwardAnalysis:
    """Forward pass over ``graph``; ``in_liveness`` is given for
    ``graph.graph_inputs()`` (a front end decides how constants count)."""
    result = ForwardAnalysis(graph, rules, list(in_liveness))
    values = result.values
    for v, lv in zip(graph.graph_inputs(), in_liveness):
        if v is not None and graph.carries_derivative(v) and lv.reaches_output:
            values[v] = lv
    for node in range(graph.node_count()):
        ins = [
            values.get(v, NO_DERIVATIVE) if v is not None else NO_DERIVATIVE
            for v in graph.node_inputs(node)
        ]
        if not any(i.reaches_output for i in ins):
            continue
        rule = rules.get(graph.op_name(node))
        outputs = graph.node_outputs(node)
        if implements(rule, ForwardRule):
            outs = rule.forward(result, node, ins)
        else:
            outs = [LIVE] * len(outputs)
        for v, lv in zip(outputs, outs):
            if v is not None and lv.reaches_output and graph.carries_derivative(v):
                values[v] = lv
    return result
