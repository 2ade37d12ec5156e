"""What one guarded trace did, for reports: the guards applied, the sites
left unguarded and why, and the records of guarded control-flow bodies.

A leaf module of plain records, so that the rewrite, the output guards, the
report and the API can all name them without importing one another."""

from __future__ import annotations

from dataclasses import dataclass, field

from hlo_guard.tf.graph import TFGraph
from passes.analysis import Analysis
from passes.planning import GuardSite, UnguardedSite


@dataclass
class AppliedGuard:
    site: GuardSite
    form: str  # "select" (per-lane mask) or "stop_gradient" (every lane dead)


@dataclass
class BuildRecord:
    """What one trace of the guarded wrapper did (for reports)."""

    graph: TFGraph | None
    analysis: Analysis | None
    applied: list[AppliedGuard] = field(default_factory=list)
    unguarded: list[UnguardedSite] = field(default_factory=list)
    skipped: list[tuple[GuardSite, str]] = field(default_factory=list)
    #: non-empty when the whole function was left unguarded, and why
    fallback: str = ""
    #: guarded control-flow bodies: (op name, attr, BuildRecord)
    nested: list[tuple[str, str, BuildRecord]] = field(default_factory=list)
    #: forward-mode guards on operation outputs (:mod:`hlo_guard.tf.output_guards`)
    output_guards: list[AppliedGuard] = field(default_factory=list)
    #: contractions given a masked gradient: (op name, masked operand indices)
    contractions: list[tuple[str, list[int]]] = field(default_factory=list)
    #: what the report should say besides its sites (a custom gradient set aside)
    notes: list[str] = field(default_factory=list)
