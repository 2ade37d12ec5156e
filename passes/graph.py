"""The interface a front end implements so the engine can read its graph.

A graph is a topologically ordered list of nodes numbered ``0 .. node_count-1``.
Values are any hashable keys chosen by the front end; an input that is a
literal or otherwise untracked is ``None``.  Keeping this a protocol of small
methods (rather than a wrapper object per node) lets a front end expose a
100k-equation jaxpr without allocating anything per node.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

Value = Hashable | None


class Graph(Protocol):
    def node_count(self) -> int:
        """Number of nodes, in topological order."""

    def op_name(self, node: int) -> str:
        """The key under which the rule table is searched (e.g. a primitive name)."""

    def node_inputs(self, node: int) -> Sequence[Value]:
        """Input values of ``node``; ``None`` for literals."""

    def node_outputs(self, node: int) -> Sequence[Value]:
        """Output values of ``node``; ``None`` for dropped outputs."""

    def graph_outputs(self) -> Sequence[Value]:
        """The values the graph returns."""

    def graph_inputs(self) -> Sequence[Value]:
        """The values the graph receives (arguments, then constants); needed
        only by the forward (tangent) analysis."""

    def carries_derivative(self, value: Hashable) -> bool:
        """Whether ``value`` has a floating or complex dtype (integers and
        booleans never carry a derivative and are never guarded)."""

    def origin(self, node: int) -> Hashable:
        """A token naming ``node`` in reports (stable within one analysis)."""
