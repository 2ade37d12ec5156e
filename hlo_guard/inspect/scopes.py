"""The tree of analysed jaxprs (top level, ``jit`` bodies, control-flow bodies).

:class:`passes.analysis.Analysis` keeps nested analyses in ``subs[(node, k)]``
but a nested graph does not know its parent.  Reports need the way back up --
to name an equation inside ``jnp.where``'s ``jit`` by the user's ``jnp.where``
line, to render a body's input by the caller's argument, and to follow a value
from a guarded operation down to the selection that made its lanes dead, across
call boundaries.  :class:`ScopeTree` indexes that once per report.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

from hlo_guard.jax_frontend.bodies import CALL_BODY_PARAM, body_of
from hlo_guard.jax_frontend.graph import DropVar, JaxprGraph, Literal
from hlo_guard.source import eqn_location, traced_function
from passes.analysis import Analysis

#: how many (graph, value) pairs a forward search may visit before giving up
MAX_FLOW_STEPS = 50_000


@dataclass(frozen=True)
class Parent:
    analysis: Analysis  # the parent analysis
    node: int  # the call / control-flow equation in the parent
    k: int  # which body of that equation


class ScopeTree:
    def __init__(self, root):
        self.root = root
        self._parents: dict[int, Parent] = {}
        self._analyses: list[Analysis] = []
        self._by_graph: dict[int, Analysis] = {}
        # forward (tangent) analyses build their own graph objects for call
        # bodies; they are mapped to the backward tree's graph of the same body
        self._equiv: dict[int, object] = {}
        self._forward_by_graph: dict[int, object] = {}
        stack = [root]
        while stack:
            a = stack.pop()
            self._analyses.append(a)
            self._by_graph[id(a.graph)] = a
            for (node, k), sub in sorted(a.subs.items(), reverse=True):
                self._parents[id(sub.graph)] = Parent(a, node, k)
                stack.append(sub)

    def add_forward(self, forward, backward) -> None:
        """Index a forward analysis of ``backward``'s graph and its sub-analyses."""
        stack = [(forward, backward)]
        while stack:
            fa, ba = stack.pop()
            self._forward_by_graph[id(fa.graph)] = fa
            if ba is not None and fa.graph is not ba.graph:
                self._equiv[id(fa.graph)] = ba.graph
            for key, fsub in fa.subs.items():
                bsub = ba.subs.get(key) if ba is not None else None
                stack.append((fsub, bsub))

    def canonical(self, graph):
        """The backward tree's graph for a forward analysis's graph of the same body."""
        return self._equiv.get(id(graph), graph)

    def forward_of_graph(self, graph):
        return self._forward_by_graph.get(id(graph))

    # -- navigation ---------------------------------------------------------------
    def analyses(self) -> Iterator[Analysis]:
        """Every analysis, parents before children, in program order."""
        return iter(self._analyses)

    def parent(self, graph) -> Parent | None:
        return self._parents.get(id(graph))

    def analysis_of(self, graph):
        return self._by_graph.get(id(graph))

    def call_body_invars(self, graph) -> tuple[object, dict[object, object]] | None:
        """For the body of a call (``jit``, ``custom_jvp_call`` ...): (parent
        analysis, {body invar -> caller's atom}); None for control flow and the top."""
        p = self.parent(graph)
        if p is None:
            return None
        eqn = _call_eqn(p)
        if eqn.primitive.name not in CALL_BODY_PARAM:
            return None
        body, _ = body_of(eqn)
        return p.analysis, dict(zip(body.invars, eqn.invars))

    # -- locations ----------------------------------------------------------------
    def location(self, graph, node: int) -> tuple[str, bool]:
        """(location, inherited): the equation's own user location, or that of
        the nearest enclosing call that has one (``inherited`` is then True).

        An equation of a JAX library wrapper's body (``jnp.where``'s ``_where``)
        has no frame of its own but the caller's, and JAX reuses the body it
        traced first for every later call of that shape: the user frame in
        its traceback is the *first* call site's, which may be another
        function's line.  Such an equation takes its call's location."""
        loc = eqn_location(graph.eqns[node])
        p = self.parent(graph)
        if loc and p is not None and _library_wrapper(_call_eqn(p)):
            call_loc = eqn_location(_call_eqn(p))
            if call_loc and call_loc != loc:
                return call_loc, True
        if loc:
            return loc, False
        while p is not None:
            loc = eqn_location(_call_eqn(p))
            if loc:
                return loc, True
            p = self.parent(p.analysis.graph)
        return "", True

    def wrapper_name(self, graph) -> str:
        """The name of the library call (``_where``, ``clip``) an equation sits
        in when it has no user location of its own; ``""`` otherwise."""
        p = self.parent(graph)
        if p is None:
            return ""
        eqn = _call_eqn(p)
        return str(eqn.params.get("name", "") or "")

    # -- following values forward -----------------------------------------------------
    def operands_reached(self, graph, node: int, target_graph, target_node: int) -> set[int]:
        """Which inputs of equation ``target_node`` (in ``target_graph``) the
        outputs of ``node`` (in ``graph``) flow into.

        Calls are followed precisely (argument j is body input j, body output j is
        call output j); through any other equation every output depends on every
        input.  Empty when no path was found within :data:`MAX_FLOW_STEPS`.
        """
        start = [(graph, v) for v in graph.eqns[node].outvars if not isinstance(v, DropVar)]
        seen = set()
        queue = deque(start)
        reached: set[int] = set()
        steps = 0
        uses_cache: dict[int, dict[object, list[tuple[int, int]]]] = {}
        while queue and steps < MAX_FLOW_STEPS:
            g, var = queue.popleft()
            key = (id(g), var)
            if key in seen:
                continue
            seen.add(key)
            steps += 1
            for n, i in self._uses(g, uses_cache).get(var, ()):
                if g is target_graph and n == target_node:
                    reached.add(i)
                    continue
                eqn = g.eqns[n]
                a = self.analysis_of(g)
                sub = a.subs.get((n, 0)) if a is not None else None
                if sub is not None and eqn.primitive.name in CALL_BODY_PARAM:
                    body, _ = body_of(eqn)
                    if i < len(body.invars):
                        queue.append((sub.graph, body.invars[i]))
                        continue
                if eqn.primitive.name == "cond" and i >= 1 and a is not None:
                    entered = False
                    for k, branch in enumerate(eqn.params["branches"]):
                        bsub = a.subs.get((n, k))
                        if bsub is not None and i - 1 < len(branch.jaxpr.invars):
                            queue.append((bsub.graph, bsub.graph.jaxpr.invars[i - 1]))
                            entered = True
                    if entered:
                        continue
                queue.extend((g, ov) for ov in eqn.outvars if not isinstance(ov, DropVar))
            # leaving a call body through its outputs
            for j, ov in enumerate(g.jaxpr.outvars):
                if ov is var:
                    p = self.parent(g)
                    if p is not None:
                        peqn = _call_eqn(p)
                        if (
                            peqn.primitive.name in CALL_BODY_PARAM or peqn.primitive.name == "cond"
                        ) and j < len(peqn.outvars):
                            out = peqn.outvars[j]
                            if not isinstance(out, DropVar):
                                queue.append((p.analysis.graph, out))
        return reached

    @staticmethod
    def _uses(graph, cache):
        uses = cache.get(id(graph))
        if uses is None:
            uses = {}
            for n, eqn in enumerate(graph.eqns):
                for i, v in enumerate(eqn.invars):
                    if not isinstance(v, Literal):
                        uses.setdefault(v, []).append((n, i))
            cache[id(graph)] = uses
        return uses


def _library_wrapper(call) -> bool:
    """Whether ``call`` is a ``jit`` of a function defined inside JAX (the
    ``jnp`` wrappers), from its body's debug info."""
    return traced_function(call.params.get("jaxpr"))[2]


def _call_eqn(p: Parent):
    """The call or control-flow equation in the parent that a body belongs to
    (the JAX front end analyses jaxpr graphs only)."""
    return cast(JaxprGraph, p.analysis.graph).eqns[p.node]
