"""The JAX rule table, keyed by primitive name (as JAX's own ``ad.primitive_jvps``)."""
from passes.rules import RuleTable

from hlo_guard.jax_frontend.rules import (calls, elementwise, identity, selection,
                                      structural)

RULES = RuleTable("jax")
elementwise.register(RULES)
selection.register(RULES)
structural.register(RULES)
calls.register(RULES)
identity.register(RULES)

__all__ = ["RULES"]
