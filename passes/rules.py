"""Rules: what an operation does to gradient liveness.

Following the idiom of JAX's own interpreters (``ad.primitive_jvps``,
``batching.primitive_batchers``), rules live in a table keyed by the
operation's name.  The engine only needs the *static* half of a rule:

* :meth:`Rule.transfer` -- given the liveness of the node's outputs, the
  liveness of each input use;
* :meth:`Rule.guards_input` -- whether a partly dead use of input ``i`` needs a
  gradient guard.  Only operations whose local derivative may be non-finite
  (or which multiply a cotangent by a 0/1 coefficient instead of selecting it)
  need one; linear structural operations pass an exact zero through on their
  own.

A front end's rules add a method that computes per-lane masks in its own array
operations; the engine reaches it through :class:`passes.masks.MaskResolver`.
An operation with no rule is treated as fully live and reported.

Optionally, for forward mode (:func:`passes.analysis.analyze_forward`):

* ``forward(analysis, node, ins)`` -- tangent liveness of the outputs from that
  of the inputs (default when absent: fully live);
* ``guards_output(analysis, node, index)`` -- whether an output whose input
  tangents are partly structurally zero needs a guard (planned by
  :func:`passes.planning.plan_output_guards`).
"""
from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Sequence

from passes.lattice import LIVE, NO_DERIVATIVE, Liveness, join_all


class Rule:
    """Base rule.  Subclasses override :meth:`transfer` and :meth:`guards_input`."""

    #: a short word used in reports ("elementwise", "selection", "structural", ...)
    kind: str = "generic"

    def transfer(self, ctx, node: int, outs: Sequence[Liveness]) -> List[Liveness]:
        raise NotImplementedError

    def guards_input(self, ctx, node: int, index: int) -> bool:
        return False


class RuleTable:
    """A mapping from operation name to :class:`Rule`, with aliasing helpers."""

    def __init__(self, name: str):
        self.name = name
        self._rules: Dict[str, Rule] = {}

    def register(self, names: Iterable[str] | str, rule: Rule) -> Rule:
        if isinstance(names, str):
            names = [names]
        for n in names:
            self._rules[n] = rule
        return rule

    def get(self, name: str) -> Optional[Rule]:
        return self._rules.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._rules

    def names(self) -> List[str]:
        return sorted(self._rules)


def all_inputs(n_inputs: int, liveness: Liveness) -> List[Liveness]:
    return [liveness] * n_inputs


def conservative_transfer(n_inputs: int, outs: Sequence[Liveness]) -> List[Liveness]:
    """Every input fully live as soon as any output carries a derivative."""
    joined = join_all(outs)
    return all_inputs(n_inputs, LIVE if joined.reaches_output else NO_DERIVATIVE)
