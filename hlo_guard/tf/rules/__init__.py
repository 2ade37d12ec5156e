"""The TF rule table, keyed by op type (``tf.Operation.type``)."""

from hlo_guard.tf.rules import control_flow, elementwise, mixing, products, selection, structural
from passes.rules import Rule, RuleTable


class TFRuleTable(RuleTable):
    """Op types without a rule get :class:`structural.Unknown`: fully live, as
    the engine's own fallback, but also reported when lanes die through an
    output nobody uses (``dynamic_partition(x, p, 2)[1]``) -- the engine's
    fallback only sees outputs that are partly live."""

    _unknown = structural.Unknown()

    def get(self, name: str) -> Rule | None:
        rule = super().get(name)
        return rule if rule is not None else self._unknown


RULES = TFRuleTable("tensorflow")
elementwise.register(RULES)
selection.register(RULES)
structural.register(RULES)
products.register(RULES)
mixing.register(RULES)
control_flow.register(RULES)

__all__ = ["RULES"]
