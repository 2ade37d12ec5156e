"""Reports and IR dumps for the TF front end, in the shared report model.

A report lists every guard (the guarded op, which operand, the
selecting ops that made its lanes dead and what that means) and every place
dead lanes reach without a guard, with the reason -- the same
:class:`passes.report.Report` the JAX front end produces, with
``framework="tensorflow"``.

This module turns a :class:`~hlo_guard.tf.records.BuildRecord` into that
report; finding the guard of a function and attaching XLA dumps
(:mod:`hlo_guard.tf.dumps`) is the API's job (``hlo_guard.tf.api.report``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hlo_guard.errors import GuardUsageError
from hlo_guard.tf.records import BuildRecord
from hlo_guard.tf.rules import RULES
from hlo_guard.tf.where_made_zeros import where_made_zero_factors
from passes.planning import protected_hazards
from passes.report import OriginRecord, Report, SiteRecord

MEANINGS = {
    "SelectV2": "lanes the condition does not pick",
    "Select": "lanes the condition does not pick",
    "Maximum": "the losing side (x wins ties, as in TF's gradient)",
    "Minimum": "the losing side (x wins ties, as in TF's gradient)",
    "ClipByValue": "clipped lanes",
    "Max": "lanes that are not a maximum",
    "Min": "lanes that are not a minimum",
    "Relu": "lanes with a non-positive input",
    "Relu6": "lanes outside (0, 6)",
    "GatherV2": "elements the gather does not read",
    "GatherNd": "elements the gather does not read",
    "StridedSlice": "elements the slice does not read",
    "Slice": "elements the slice does not read",
}


def rule_names():
    """Every TF op type with a rule (anything else is treated as fully live)."""
    return RULES.names()


def _describe(graph, op_name: str) -> tuple:
    node = graph.index.get(op_name)
    op_type = graph.ops[node].type if node is not None else "?"
    user = graph.user_name(op_name)
    return f"{op_type} '{user}'", graph.location(op_name) or user, op_type


def _origins(graph, liveness):
    records = []
    for origin in liveness.origins:
        op, loc, op_type = _describe(graph, origin)
        records.append(OriginRecord(op, loc, MEANINGS.get(op_type, "")))
    return records


def build_report(record: BuildRecord, function: str) -> TFReport:
    if record.fallback:
        return TFReport(
            "tensorflow",
            function,
            [SiteRecord("unguarded", function, function, reason=record.fallback)],
            extra={"rule_table": RULES.name},
        )
    sites: list = []
    _collect(record, "", sites)
    graph = record.graph
    return TFReport(
        "tensorflow",
        function,
        sites,
        extra={"ops": graph.node_count() if graph is not None else 0, "rule_table": RULES.name},
        notes=list(record.notes),
    )


def _protects(analysis, site) -> list[str]:
    """The singular ops of the dead chain behind a boundary guard, in graph
    order (:func:`passes.planning.protected_hazards`); ops of nested bodies
    are not followed here."""
    found = []
    for a, node in protected_hazards(analysis, site.node, site.index):
        if a is not analysis:
            continue
        op, loc, _ = _describe(a.graph, a.graph.ops[node].name)
        found.append(f"{op} at {loc}")
    return list(dict.fromkeys(found))


def _guard_record(
    graph, applied, scope: str, operand, reason: str = "", analysis=None
) -> SiteRecord:
    """The report line of one applied guard: an input guard (``operand`` is the
    guarded input, ``analysis`` given: it lists what it protects) or a
    forward-mode output guard (``operand`` None)."""
    site = applied.site
    op, loc, _ = _describe(graph, graph.ops[site.node].name)
    protects = _protects(analysis, site) if analysis is not None and operand is not None else []
    return SiteRecord(
        "guard",
        op,
        loc,
        scope=scope,
        operand=operand,
        statically_dead=applied.form == "stop_gradient",
        origins=_origins(graph, site.liveness),
        reason=reason,
        protects=protects,
    )


def _contraction_records(graph, analysis, contractions, scope: str) -> list[SiteRecord]:
    """One line per operand a guarded contraction zeroes in the other
    operand's gradient (:mod:`hlo_guard.tf.contractions`); a ``Const``
    operand's dead lanes are its output's."""
    found = []
    for op_name, indices in contractions:
        node = graph.index[op_name]
        op, loc, _ = _describe(graph, op_name)
        for i in indices:
            lv = analysis.use(node, i)
            if not lv.reaches_output:
                lv = analysis.output_liveness(node)[0]
            found.append(
                SiteRecord(
                    "guard",
                    op,
                    loc,
                    scope=scope,
                    operand=i,
                    origins=_origins(graph, lv),
                    reason="contraction: the other operand's gradient reads this "
                    "operand's dead lanes as zero",
                )
            )
    return found


def _collect(record: BuildRecord, scope: str, sites: list) -> None:
    """Sites of one graph, then of its guarded control-flow bodies (with a scope)."""
    graph = record.graph
    if graph is None:  # a fallback record: the function was left as it was
        return
    for applied in record.applied:
        sites.append(
            _guard_record(
                graph,
                applied,
                scope,
                operand=applied.site.index,
                analysis=record.analysis,
            )
        )
    for applied in record.output_guards:
        index = applied.site.index
        reason = (
            f"output {index} guarded for forward mode: its tangent is selected where "
            "the inputs' is structurally zero"
        )
        sites.append(_guard_record(graph, applied, scope, operand=None, reason=reason))
    if record.analysis is not None:
        sites.extend(_contraction_records(graph, record.analysis, record.contractions, scope))
    for site, reason in record.skipped:
        op, loc, _ = _describe(graph, graph.ops[site.node].name)
        sites.append(
            SiteRecord(
                "unguarded",
                op,
                loc,
                scope=scope,
                operand=site.index,
                origins=_origins(graph, site.liveness),
                reason=reason,
            )
        )
    unguarded = list(record.unguarded)
    if record.analysis is not None:
        # (asked here, not while guarding: :mod:`hlo_guard.tf.where_made_zeros`)
        unguarded += where_made_zero_factors(graph, record.analysis)
    for u in unguarded:
        op, loc, _ = _describe(graph, graph.ops[u.node].name)
        sites.append(
            SiteRecord(
                "unguarded",
                op,
                loc,
                scope=scope,
                origins=_origins(graph, u.liveness),
                reason=u.reason,
            )
        )
    for op_name, attr, sub in record.nested:
        inner = f"{graph.user_name(op_name)}.{attr}"
        _collect(sub, f"{scope}/{inner}" if scope else inner, sites)


@dataclass
class TFReport(Report):
    """The TF guard report, with the dumps of the program it describes."""

    _dumps: Callable[..., str] | None = field(default=None, repr=False, compare=False)

    def dumps(self, level: str = "stablehlo", program: str = "forward", show: str = "diff") -> str:
        """XLA's view at ``level`` (``stablehlo`` as lowered, ``hlo`` optimized) of
        ``program`` (``forward``, or ``grad``: the gradient of the sum of the
        outputs); ``show`` one of ``diff``, ``original``, ``guarded``, ``both``."""
        if self._dumps is None:
            raise GuardUsageError(
                "dumps need the report of positional arguments: hlo_guard.tf.report(f, *args)"
            )
        return self._dumps(level=level, program=program, show=show)
