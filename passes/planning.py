"""Guard planning: which uses get ``select(mask, x, stop_gradient(x))``.

A use is guarded when it is not fully live (some lane's derivative is
structurally zero) *and* its rule says a zero cotangent could be turned into
NaN there (local derivative possibly non-finite, or a 0/1 coefficient that is
multiplied rather than selected).  Uses that are dead with no selection behind
them are never differentiated and need nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from passes.analysis import Analysis
from passes.lattice import Level, Liveness
from passes.masks import ALL, NONE, ShadowUnavailable
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
    """Boundary placement: the guards the front ends apply in gradient mode.

    Guards go on the *boundary* of a dead region, not on every hazard inside
    it (DESIGN.md step 3, docs/PLACEMENT.md): a partly dead use ``(n, i)`` of
    value ``x`` is guarded when the region behind it holds an unguarded hazard
    (:func:`hazard_behind`) and its dead lanes' cotangent could otherwise be
    summed into a live lane -- ``x`` is a graph input or graph output, has
    another differentiable read, or is produced by an op that may mix lanes.
    Everywhere else a dead lane's cotangent only meets other dead lanes and
    ends at one of those guards' selects.  Forward-mode exits (``max``/``min``
    uses) keep guards of their own.
    """
    guarded = placement_of(analysis).guarded
    sites = [GuardSite(n, i, analysis.use(n, i)) for n, i in sorted(guarded)]
    unguarded = [UnguardedSite(u.node, u.reason, u.liveness) for u in analysis.unreached]
    return sites, unguarded


def guard_sharing_key(analysis: Analysis, node: int, index: int):
    """Guards on two uses of one value with equal keys have equal masks: the
    front end may apply one select for both (``d * d``)."""
    return placement_of(analysis).mask_keys.get((node, index), ("use", node, index))


def hazard_behind(analysis: Analysis) -> dict[tuple[int, int], bool]:
    """For every partly dead use ``(n, i)`` (and the other uses of its node):
    may a zero cotangent arriving there be turned non-finite in the dead
    region behind it (forward from ``n`` through partly dead uses, stopping
    at boundary guards)?"""
    return placement_of(analysis).hazard


@dataclass
class Placement:
    """The boundary placement of one graph."""

    #: per use of a node with a partly dead use or a body to place: an
    #: unguarded hazard lies behind it (see :func:`hazard_behind`); the sweep
    #: passes over nodes that read and produce only fully live values
    hazard: dict[tuple[int, int], bool]
    #: the guarded uses
    guarded: set[tuple[int, int]]
    #: per graph input: an unguarded hazard lies behind it -- what a caller
    #: that sees through this body reads as its call's hazard at that input
    input_hazards: list[bool]
    #: per use: the symbolic name of its mask; guards on uses of one value
    #: with one key may share one select (:func:`_mask_keys`)
    mask_keys: dict = field(default_factory=dict)
    #: the guarded-or-not uses whose only reverse hazard is their own op's
    #: rule: no unguarded hazard lies beyond the op's outputs (their dead
    #: lanes' cotangents arrive as exact zeros) and the use is no forward
    #: exit.  A front end may drop such a guard where the op itself makes it
    #: redundant (a contraction operand whose lanes live or die together, its
    #: partner zeroed: JAX's ``Scope._contraction_covers``).
    own_hazard_only: set = field(default_factory=set)


@dataclass(frozen=True)
class _Context:
    """How a body's placement meets its caller's.  A body placed on its own
    (the default) treats its inputs and partly dead outputs as boundaries and
    assumes a hazard beyond its outputs; a *transparent* body (its caller sees
    through it, :meth:`Rule.transparent_body`) leaves those to the caller."""

    transparent: bool = False
    #: the caller holds an unguarded hazard beyond this body's outputs (a
    #: plain call's caller says; control-flow bodies keep the default)
    output_hazard: bool = True
    #: per body input: the caller's tangent there may be non-finite
    input_tangent_hazards: tuple[bool, ...] | None = None
    #: the mask keys of this body, computed with the caller's (:func:`_mask_keys`)
    keys: dict | None = None


def placement_of(analysis: Analysis) -> Placement:
    """The placement of ``analysis``: the one its caller's placement made
    (a transparent body), else one made on its own and kept."""
    if analysis.placement is None:
        analysis.placement = _place(analysis, _Context())
    return analysis.placement


def _place(analysis: Analysis, ctx: _Context) -> Placement:
    """One reverse-topological sweep deciding hazards and guards together:
    ``H(n, i) = reverse_hazard(n, i) or Hout(n)``; ``Hout(n)`` = any ``H`` of a
    partly dead use of ``n``'s outputs that is not itself guarded (a guard's
    select turns every dead lane into an exact zero); conservatively true for
    an op without a rule and where a partly dead value leaves the graph.

    Forward-mode exits (:meth:`Rule.forward_exit`: ``max``/``min`` multiply
    the unchosen operand's tangent by 0) are guarded where they are, whenever
    the tangent arriving there may be non-finite (:func:`_tangent_hazards`);
    they are not reverse hazards.  A plain call's body is placed in the same
    sweep, with the caller's view of its boundary (:meth:`Rule.called_body`,
    :meth:`Rule.transparent_body`)."""
    graph = analysis.graph
    rules = analysis.rules
    input_list = list(graph.graph_inputs())
    if not analysis.selects_anywhere():
        # no dead region here or below: no guard, no hazard behind any input
        # (the caller's reads of this body are live, so it asks none), and a
        # nested body is placed on its own if ever asked -- it has none either
        return Placement({}, set(), [False] * len(input_list))
    inputs = {v for v in input_list if _hashable(v)}
    output_reads: dict = {}
    for v in graph.graph_outputs():
        if v is not None and _hashable(v) and graph.carries_derivative(v):
            output_reads[v] = output_reads.get(v, 0) + 1
    # the uses the analysis recorded: those that carry a derivative to an
    # output; ``decide`` guards only the partly dead ones (``region_uses``)
    uses = analysis.uses
    region = analysis.dead_region()
    region_uses = region.uses
    # the values ``decide`` may act on: read by a partly dead use, or leaving
    # the graph partly dead; and the nodes with something to decide about
    # their inputs (a partly dead use, a body to place).  Every other node
    # reads and produces only fully live values and is passed over: its
    # uses' hazards are never asked (``decide`` reads partly dead ones).
    region_values = set(region.values)
    region_values.update(
        v for v in output_reads if analysis.value_liveness(v).level is not Level.LIVE
    )
    visited = region.visited
    tangent_hazard = _tangent_hazards(analysis, input_list, ctx.input_tangent_hazards)
    nested_keys: dict = {}
    keys = ctx.keys if ctx.keys is not None else _mask_keys(analysis, None, nested_keys)
    reads = keys["reads"]
    h_use: dict[tuple[int, int], bool] = {}
    guarded: set[tuple[int, int]] = set()
    own_hazard_only: set[tuple[int, int]] = set()
    # uses whose op broadcasts them implicitly and is a hazard for them: a
    # boundary wherever the value comes from (:meth:`Rule.broadcasts_operand`)
    broadcast_hazards: set[tuple[int, int]] = set()

    def decide(v, mixing: bool) -> bool:
        """Guard the hazardous uses of ``v`` at the boundary; True when an
        unguarded hazard stays behind ``v`` (its producer's ``Hout``)."""
        leaves_partly_dead = (
            v in output_reads and analysis.value_liveness(v).level is not Level.LIVE
        )
        # a value read twice is a join where a live read's cotangent would be
        # summed with a dead read's -- unless every read has the same mask
        # (``s * s - s``: all reads dead in the same lanes; an output read
        # counts with the caller's mask)
        boundary = mixing or len(set(reads.get(v, ()))) > 1
        behind = leaves_partly_dead and ctx.output_hazard
        if not ctx.transparent:
            boundary = boundary or leaves_partly_dead or v in inputs
        for u in uses.get(v, ()):
            if u in guarded or u not in region_uses or not h_use.get(u, True):
                continue
            if boundary or u in broadcast_hazards:
                guarded.add(u)
            else:
                behind = True
        return behind

    for node in reversed(range(graph.node_count())):
        outputs = graph.node_outputs(node)
        decided = [v for v in outputs if v is not None and v in region_values]
        if not decided and node not in visited:
            continue
        rule = rules.get(graph.op_name(node))
        body = (
            rule.called_body(analysis, node) if rule is not None and node in region.bodies else None
        )
        transparent = body is not None and node in keys["transparent"]
        h_out = rule is None
        if decided:
            mixing = rule is None or (
                not transparent and not rule.keeps_lanes_apart(analysis, node)
            )
            for v in decided:
                if decide(v, mixing):
                    h_out = True
        node_inputs = graph.node_inputs(node)
        body_hazards: list[bool] = []
        if body is not None:
            sub_ctx = _Context(
                transparent=transparent,
                output_hazard=h_out,
                input_tangent_hazards=tuple(_may_blow_up(tangent_hazard, v) for v in node_inputs),
                keys=keys["nested"].get(id(body)),
            )
            body.placement = _place(body, sub_ctx)
            body_hazards = body.placement.input_hazards
        for i, v in enumerate(node_inputs):
            exit_ = rule is not None and rule.forward_exit(analysis, node, i)
            if exit_ and (node, i) in region_uses and _may_blow_up(tangent_hazard, v):
                guarded.add((node, i))
            if transparent:
                h_use[(node, i)] = i >= len(body_hazards) or body_hazards[i]
            else:
                hazard = rule is None or (rule.guards_input(analysis, node, i) and not exit_)
                h_use[(node, i)] = h_out or hazard
                if hazard and rule is not None and rule.broadcasts_operand(analysis, node, i):
                    broadcast_hazards.add((node, i))
                if hazard and not h_out and not exit_:
                    own_hazard_only.add((node, i))
    input_hazards = [
        decide(v, not ctx.transparent) if v is not None and _hashable(v) else False
        for v in input_list
    ]
    return Placement(h_use, guarded, input_hazards, keys["uses"], own_hazard_only)


def contraction_covers_operand(
    analysis: Analysis,
    resolver,
    node: int,
    index: int,
    is_one_bit: Callable[[Any], bool],
    partner_zeroed: Callable[[int], bool],
) -> bool:
    """Whether a guarded contraction makes the boundary guard of its operand
    ``index`` redundant: the operand's mask is one bit (its lanes live or die
    together: the weights under a row mask), its only hazard is the
    contraction's own rule (:attr:`Placement.own_hazard_only`), and its
    partner is live in every lane or zeroed by the contraction in its dead
    lanes (``partner_zeroed``).  Both front ends decide which operations are
    such contractions; docs/PLACEMENT.md and JAX's
    ``Scope._contraction_covers`` give the argument.  A mask that cannot be
    built (``ShadowUnavailable``) keeps the guard, which reports it."""
    if (node, index) not in placement_of(analysis).own_hazard_only:
        return False
    try:
        mask = resolver.use_mask(node, index)
    except ShadowUnavailable:
        return False
    if mask is ALL or mask is NONE or not is_one_bit(mask):
        return False
    partner = 1 - index
    return analysis.use(node, partner).is_live or partner_zeroed(partner)


_LIVE_KEY = "live"


def _mask_keys(analysis: Analysis, out_keys, nested: dict) -> dict:
    """Symbolic names of the masks, so that equal masks are known equal
    without building them: a use whose rule passes its output's mask through
    unchanged (:meth:`Rule.mask_passes_through`: same-shape elementwise ops)
    has its output's key, a value whose reads all have one key has that key,
    every other use and value a fresh one.  A transparent call's body is
    keyed with its caller's keys of the call's outputs, so its inputs' keys
    are the caller's where the body passes them through.

    Returns ``{"reads": value -> [key of each read], "uses": use -> key,
    "inputs": [key per graph input], "nested": id(body) -> the body's keys,
    "transparent": the nodes whose body is seen through}``: the placement
    reads transparency from here instead of deciding it a second time."""
    graph = analysis.graph
    reads: dict = {}
    for k, v in enumerate(graph.graph_outputs()):
        if v is not None and _hashable(v) and graph.carries_derivative(v):
            key = out_keys[k] if out_keys is not None else ("out", id(analysis), k)
            reads.setdefault(v, []).append(key)

    def value_key(v):
        if v is None or not _hashable(v):
            return ("unknown", id(analysis), id(v))
        if analysis.value_liveness(v).level is Level.LIVE:
            return _LIVE_KEY
        ks = reads.get(v, [])
        if ks and all(k == ks[0] for k in ks):
            return ks[0]
        return ("value", id(analysis), v)

    rules = analysis.rules
    use_keys: dict = {}
    transparent: set[int] = set()  # nodes whose call body is seen through
    region = analysis.dead_region()
    use_liveness = analysis.use_liveness
    visited = region.visited
    for node in reversed(range(graph.node_count())):
        if node not in visited:
            # every use here that carries a derivative is fully live: its key
            # is the live key, which only a join asks about (a value with a
            # partly dead read too); such a use guards nothing and shares no
            # mask, so it is not recorded in ``uses``
            for i, v in enumerate(graph.node_inputs(node)):
                if v is not None and v in region.values and (node, i) in use_liveness:
                    reads.setdefault(v, []).append(_LIVE_KEY)
            continue
        rule = rules.get(graph.op_name(node))
        outs = graph.node_outputs(node)
        node_out_keys = [value_key(v) for v in outs]
        body = rule.transparent_body(analysis, node) if rule is not None else None
        body_inputs: list = []
        if body is not None:
            transparent.add(node)
            body_keys = _mask_keys(body, node_out_keys, nested)
            nested[id(body)] = body_keys
            body_inputs = body_keys["inputs"]
        for i, v in enumerate(graph.node_inputs(node)):
            lv = analysis.use(node, i)
            if not lv.reaches_output or v is None or not _hashable(v):
                continue
            if lv.level is Level.LIVE:
                key = _LIVE_KEY
            elif body is not None and i < len(body_inputs):
                key = body_inputs[i]
            elif (
                len(outs) == 1 and rule is not None and rule.mask_passes_through(analysis, node, i)
            ):
                key = node_out_keys[0]
            else:
                key = ("use", id(analysis), node, i)
            reads.setdefault(v, []).append(key)
            use_keys[(node, i)] = key
    inputs = [value_key(v) for v in graph.graph_inputs()]
    return {
        "reads": reads,
        "uses": use_keys,
        "inputs": inputs,
        "nested": nested,
        "transparent": transparent,
    }


def protected_hazards(analysis: Analysis, node: int, index: int) -> list[tuple[Analysis, int]]:
    """The hazards whose dead-lane NaN the guard on use ``(node, index)``
    discards: the ops of the dead region behind it (forward from the use
    through partly dead, unguarded uses, into transparent call bodies) whose
    own use is a hazard.  For reports; the placement does not need it."""
    found: list[tuple[Analysis, int]] = []
    seen: set = set()
    stack = [(analysis, node, index)]
    while stack:
        a, n, i = stack.pop()
        if (id(a), n, i) in seen:
            continue
        seen.add((id(a), n, i))
        rule = a.rules.get(a.graph.op_name(n))
        if rule is None:
            found.append((a, n))
            continue
        body = rule.transparent_body(a, n)
        if body is not None:
            inputs = list(body.graph.graph_inputs())
            if i < len(inputs):
                stack.extend((body, *u) for u in _region_uses(body, inputs[i]))
        elif rule.guards_input(a, n, i) or rule.forward_exit(a, n, i):
            found.append((a, n))
        for v in a.graph.node_outputs(n):
            if v is not None and _hashable(v):
                stack.extend((a, *u) for u in _region_uses(a, v))
    unique = {(id(a), n): (a, n) for a, n in found}
    return sorted(unique.values(), key=lambda t: (id(t[0]) != id(analysis), t[1]))


def _region_uses(analysis: Analysis, v):
    """The uses of ``v`` that continue its dead region: partly dead and not
    guarded themselves."""
    guarded = placement_of(analysis).guarded
    for u in analysis.uses.get(v, ()):
        lv = analysis.use(*u)
        if lv.level is not Level.LIVE and lv.reaches_output and u not in guarded:
            yield u


def _tangent_hazards(analysis: Analysis, input_list: list, given) -> dict:
    """For every value: may its tangent be non-finite although the program's
    inputs carry finite tangents?  True downstream of any op whose local
    derivative may be non-finite (:meth:`Rule.tangent_may_be_nonfinite`) or
    that has no rule, and of the graph's inputs unless the caller says
    otherwise (``given``, one flag per input): a nested body's input may
    bring a non-finite tangent from outside, and so may a top-level input
    when ``guard(f)`` is called on another computation's output."""
    graph = analysis.graph
    rules = analysis.rules
    hazard: dict = {}
    for k, v in enumerate(input_list):
        if v is not None and _hashable(v):
            hazard[v] = True if given is None or k >= len(given) else given[k]
    for node in range(graph.node_count()):
        # the inputs first: a dict lookup each, and downstream of the first
        # hazard they answer for most nodes without asking the rule
        blows_up = any(_may_blow_up(hazard, v) for v in graph.node_inputs(node))
        if not blows_up:
            rule = rules.get(graph.op_name(node))
            blows_up = rule is None or rule.tangent_may_be_nonfinite(analysis, node)
        for v in graph.node_outputs(node):
            if v is not None and _hashable(v):
                hazard[v] = blows_up
    return hazard


def _may_blow_up(hazard: dict, v) -> bool:
    """A value the forward sweep did not see (a constant, a literal) carries
    no tangent, hence no non-finite one; an unhashable one is unknown."""
    if v is None:
        return False
    if not _hashable(v):
        return True
    return hazard.get(v, False)


def _hashable(v) -> bool:
    try:
        hash(v)
    except TypeError:
        return False
    return True


@dataclass(frozen=True)
class OutputGuardSite(GuardSite):
    """Guard output ``index`` of ``node``: some lanes of its input tangents are
    structurally zero and its derivative may multiply them by inf (forward
    mode).  ``liveness`` is the output's *tangent* liveness."""


def plan_output_guards(backward: Analysis, forward) -> list[OutputGuardSite]:
    """Output guards of one graph, from its backward and forward analyses.

    Only outputs whose derivative is used at all (backward liveness reaches an
    output) and whose tangent is not fully live are guarded, and only for
    operations whose rule says their derivative may be non-finite -- except
    a call whose body guards those operations itself
    (:meth:`Rule.body_guards_own_outputs`).
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
            if rule.guards_output(backward, node, j) and not rule.body_guards_own_outputs(
                backward, forward, node
            ):
                sites.append(OutputGuardSite(node, j, t))
    return sites
