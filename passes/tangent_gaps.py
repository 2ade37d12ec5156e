"""Forward mode's unguarded sites: where tangents were not followed lane by lane.

The forward (tangent) analysis is precise only where a rule knows how an
operation moves structurally zero tangent lanes.  Elsewhere -- an op that
mixes lanes nonlinearly (``Softmax``) receiving a partly zero tangent, an op
without a rule, a loop whose carried tangent may be zero in some lanes, a
branch whose output is partly zero in a way no predicate can describe -- the
rule takes the outputs as *fully live*.  That never hides a NaN, but a
structurally zero lane may then meet an infinite derivative downstream
(``sqrt(...)``) with no output guard: the ``ForwardAccumulator`` tangent is
NaN where the double where gives 0.  The contract forbids calling that clean.

So such a rule *notes* its node (:func:`note_unfollowed`), and this module
follows the notes forward ("taint"): every value computed from a noted output
is suspect, and every operation that would get an output guard
(``guards_output``) and reads a suspect value is reported as an unguarded
site, with the note's reason.  Values entering a control-flow body partly
zero are suspect inside the body too (:func:`body_seeds`).
"""

from __future__ import annotations

from collections.abc import Iterable

from passes.lattice import Level, Liveness
from passes.planning import UnguardedSite

#: key of ``ForwardAnalysis.notes``: {node: (reason, output indices or None for all)}
UNFOLLOWED = "unfollowed"


def note_unfollowed(fa, node: int, reason: str, outputs: Iterable[int] | None = None) -> None:
    """Record that ``node``'s outputs (all, or these indices) were taken as
    fully live without knowing it."""
    notes = fa.notes.setdefault(UNFOLLOWED, {})
    prev = notes.get(node)
    idx = None if outputs is None else set(outputs)
    if prev is not None:
        old = prev[1]
        idx = None if old is None or idx is None else old | idx
        reason = prev[0]
    notes[node] = (reason, idx)


def is_partly_zero(lv: Liveness) -> bool:
    """A tangent some (or all) of whose lanes are structurally zero, while a
    derivative does flow (so a guard or a report may be needed)."""
    return lv.reaches_output and not lv.is_live


def tainted_values(
    graph, fa, seeds: dict[str, str]
) -> tuple[dict[str, str], list[tuple[int, str]]]:
    """(suspect value -> reason, [(node reading a suspect value, reason)]).

    ``seeds`` are suspect graph inputs; noted nodes add their outputs.  A
    value is suspect only while a tangent flows (``reaches_output`` in the
    forward analysis): a comparison or ``Floor`` ends the taint.
    """
    tainted: dict[str, str] = dict(seeds)
    notes = fa.notes.get(UNFOLLOWED, {})
    readers: list[tuple[int, str]] = []
    for node in range(graph.node_count()):
        inherited = next(
            (tainted[v] for v in graph.node_inputs(node) if v is not None and v in tainted), None
        )
        noted = notes.get(node)
        if inherited is None and noted is None:
            continue
        for j, v in _outputs_reaching(graph, fa, node):
            if inherited is not None:
                tainted.setdefault(v, inherited)
            elif noted[1] is None or j in noted[1]:
                tainted.setdefault(v, noted[0])
        if inherited is not None:
            readers.append((node, inherited))
    return tainted, readers


def _outputs_reaching(graph, analysis, node: int):
    """(index, value) of ``node``'s outputs that carry a derivative which
    ``analysis`` (a forward or a backward one) says reaches an output."""
    for j, v in enumerate(graph.node_outputs(node)):
        if v is not None and graph.carries_derivative(v):
            if analysis.value_liveness(v).reaches_output:
                yield j, v


def unguarded_sites(
    graph, fa, backward, seeds: dict[str, str], needs_guard=None
) -> tuple[dict[str, str], list[UnguardedSite]]:
    """(suspect values, unguarded sites): the operations that would need an
    output guard for a suspect input tangent, whose output's derivative is
    used (backward liveness reaches an output).  ``needs_guard(backward,
    node, output)`` refines the rule's ``guards_output`` where a front end
    knows more (a JAX wrapper call scaling by a known finite constant)."""
    tainted, readers = tainted_values(graph, fa, seeds)
    rules = fa.rules
    sites: list[UnguardedSite] = []
    seen: set[int] = set()
    for node, reason in readers:
        if node in seen:
            continue
        rule = rules.get(graph.op_name(node))
        guards_output = needs_guard or getattr(rule, "guards_output", None)
        if guards_output is None:
            continue
        for j, _ in _outputs_reaching(graph, backward, node):
            if guards_output(backward, node, j):
                seen.add(node)
                sites.append(
                    UnguardedSite(
                        node,
                        "forward mode: its input tangent comes through "
                        + reason
                        + "; a structurally zero tangent lane meeting an infinite derivative "
                        "here is not guarded",
                        Liveness(Level.PARTIAL),
                    )
                )
                break
    return tainted, sites


def body_seeds(
    input_names: list[str], tangents: list[Liveness], suspect: list[bool], where: str
) -> dict[str, str]:
    """Suspect inputs of a control-flow body: partly zero or already suspect
    tangents crossing the boundary (their masks live outside the body)."""
    seeds = {}
    for name, lv, bad in zip(input_names, tangents, suspect):
        # (an input zero in *every* lane is precise: the body's own analysis
        # sees it dead and guards what it reaches)
        if (bad and lv.reaches_output) or lv.is_partial:
            seeds[name] = (
                f"the boundary of {where} (a partly structurally zero tangent "
                "enters the body, where its lanes are not known)"
            )
    return seeds
