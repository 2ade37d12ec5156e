"""The JAX rule table itself, keyed by primitive name (as JAX's own
``ad.primitive_jvps``).

It lives in a leaf module and is filled by the ``rules`` package on import:
the call rules look a body's primitives up in it, and importing the package
from inside one of its own modules would be a cycle."""

from passes.rules import RuleTable

RULES = RuleTable("jax")
