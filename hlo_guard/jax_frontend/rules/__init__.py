"""The JAX rule table, keyed by primitive name (as JAX's own ``ad.primitive_jvps``)."""

from hlo_guard.jax_frontend.rules import (
    calls,
    elementwise,
    passthrough,
    pvary,
    selection,
    structural,
)
from passes.rules import RuleTable

RULES = RuleTable("jax")
elementwise.register(RULES)
selection.register(RULES)
structural.register(RULES)
calls.register(RULES)
passthrough.register(RULES)
pvary.register(RULES)  # after passthrough: pvary masks are OR-ed over its axes

__all__ = ["RULES"]
