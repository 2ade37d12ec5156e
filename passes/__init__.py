"""Framework-neutral gradient-liveness engine.

The engine knows nothing about JAX or TensorFlow.  A front end hands it a graph
through the small protocol in :mod:`passes.graph`, plus a table of rules keyed
by operation name (:mod:`passes.rules`).  The engine answers three questions:

* which lanes of which values can carry a non-zero derivative to an output
  (:mod:`passes.analysis`, a static lattice, and :mod:`passes.masks`, per-lane
  masks built on demand);
* which uses need a gradient guard (:mod:`passes.planning`);
* what to tell the user about it (:mod:`passes.report`).

Masks and guards themselves are materialised by the front end in its own ops.
"""

from passes.analysis import Analysis, ForwardAnalysis, analyze, analyze_forward
from passes.graph import Graph
from passes.lattice import LIVE, NO_DERIVATIVE, Level, Liveness, case_of, dead_by, partial_by
from passes.masks import ALL, NONE, ForwardMaskResolver, MaskAlgebra, MaskResolver
from passes.planning import (
    GuardSite,
    OutputGuardSite,
    UnguardedSite,
    plan_boundary_guards,
    plan_guards,
    plan_hazard_guards,
    plan_output_guards,
)
from passes.report import OriginRecord, Report, SiteRecord
from passes.rules import Rule, RuleTable

__all__ = [
    "Level",
    "Liveness",
    "LIVE",
    "NO_DERIVATIVE",
    "case_of",
    "dead_by",
    "partial_by",
    "Graph",
    "Rule",
    "RuleTable",
    "Analysis",
    "ForwardAnalysis",
    "analyze",
    "analyze_forward",
    "GuardSite",
    "OutputGuardSite",
    "UnguardedSite",
    "plan_boundary_guards",
    "plan_guards",
    "plan_hazard_guards",
    "plan_output_guards",
    "ALL",
    "NONE",
    "MaskAlgebra",
    "MaskResolver",
    "ForwardMaskResolver",
    "Report",
    "SiteRecord",
    "OriginRecord",
]
