"""The JAX rule table (:mod:`hlo_guard.jax_frontend.rule_table`), filled from the rule modules."""

from hlo_guard.jax_frontend.rule_table import RULES
from hlo_guard.jax_frontend.rules import (
    calls,
    elementwise,
    linalg,
    passthrough,
    pvary,
    selection,
    structural,
)

elementwise.register(RULES)
selection.register(RULES)
structural.register(RULES)
calls.register(RULES)
linalg.register(RULES)
passthrough.register(RULES)
pvary.register(RULES)  # after passthrough: pvary masks are OR-ed over its axes

__all__ = ["RULES"]
