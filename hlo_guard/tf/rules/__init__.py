"""The TF rule table, keyed by op type (``tf.Operation.type``)."""
from passes.rules import RuleTable

from hlo_guard.tf.rules import elementwise, selection, structural

RULES = RuleTable("tensorflow")
elementwise.register(RULES)
selection.register(RULES)
structural.register(RULES)

__all__ = ["RULES"]
