"""Render jaxpr values as short expressions in the user's terms.

A report says "lanes where `x > 0.0` is false", not "lanes where `b` is
false": the predicate's producing equations are rendered back into an
expression, a few levels deep, with the function's own argument names for its
inputs and the caller's expression for the inputs of a nested ``jit`` body
(``jnp.where``'s ``select_n`` sees its predicate as a body input).
Shape-only steps (dtype conversion, broadcasting, reshape) are transparent.
"""

from __future__ import annotations

import numpy as np

from hlo_guard.jax_frontend.compat import jit_inlines, scan_layout
from hlo_guard.jax_frontend.graph import Literal

INFIX = {
    "gt": ">",
    "ge": ">=",
    "lt": "<",
    "le": "<=",
    "eq": "==",
    "ne": "!=",
    "add": "+",
    "sub": "-",
    "mul": "*",
    "div": "/",
    "and": "&",
    "or": "|",
    "add_any": "+",
    "rem": "%",
    "pow": "**",
}
TRANSPARENT = {
    "convert_element_type",
    "broadcast_in_dim",
    "reshape",
    "squeeze",
    "copy",
    "reduce_precision",
    "pvary",
    "sharding_constraint",
    "reshard",
}
#: default depth of an expression: deeper sub-expressions become ``…``
DEPTH = 3
ELLIPSIS = "…"
MAX_CHARS = 80


def format_literal(val) -> str:
    arr = np.asarray(val)
    if arr.ndim == 0:
        item = arr.item()
        if isinstance(item, float):
            return repr(float(item))
        return repr(item)
    if arr.size <= 4:
        return np.array2string(arr, separator=", ")
    return f"<{arr.dtype}{list(arr.shape)} constant>"


class Renderer:
    """Renders atoms of any graph in a :class:`hlo_guard.inspect.scopes.ScopeTree`."""

    def __init__(self, tree, input_names: dict[object, str]):
        self.tree = tree
        self.input_names = input_names  # top-level invar -> argument name
        self._local: dict[int, dict[object, str]] = {}
        # bodies of inline calls read for rendering only (not in the tree)
        self._bodies: dict[tuple, object] = {}
        self._callers: dict[int, tuple] = {}

    def name(self, graph, var) -> str:
        """Words for a value with no better rendering (never a jaxpr name):
        the argument's name, a control-flow body's carry or slice, ``…`` for a
        sub-expression too deep to show."""
        if var in self.input_names and graph is self.tree.root.graph:
            return self.input_names[var]
        if graph.producer(var) is not None:
            return ELLIPSIS
        jaxpr = graph.jaxpr
        if var in jaxpr.constvars:
            return "const"
        if var in jaxpr.invars:
            return self._body_input(graph, jaxpr.invars.index(var))
        return ELLIPSIS

    def _body_input(self, graph, i: int) -> str:
        """Input ``i`` of a control-flow body, in the loop's terms."""
        p = self.tree.parent(graph)
        if p is None:
            return f"argument {i}"
        pgraph = p.analysis.graph
        eqn = pgraph.eqns[p.node]
        prim = eqn.primitive.name
        if prim == "cond" and i + 1 < len(eqn.invars):
            return self._atom(pgraph, eqn.invars[i + 1], 1)
        if prim == "scan":
            nc, nk = scan_layout(eqn.params, len(eqn.invars))
            if i < nc:
                return self._atom(pgraph, eqn.invars[i], 1)
            if i < nc + nk:
                return f"carry {i - nc}"
            return f"{self._wrapped(pgraph, eqn.invars[i], 1)}[i]"
        if prim == "while":
            nb = eqn.params["body_nconsts"]
            cc = eqn.params["cond_nconsts"]
            if i < nb:
                return self._atom(pgraph, eqn.invars[cc + i], 1)
            return f"carry {i - nb}"
        return f"input {i} of {prim}"

    def resolve(self, graph, atom):
        """(graph, atom) with call-body inputs replaced by the caller's atom, as
        far up as they go (a body input fed by a literal resolves to the literal)."""
        while not isinstance(atom, Literal) and graph.producer(atom) is None:
            mapping = self.tree.call_body_invars(graph)
            if mapping is None or atom not in mapping[1]:
                break
            parent, args = mapping
            graph, atom = parent.graph, args[atom]
        return graph, atom

    def atom(self, graph, atom, depth: int = DEPTH) -> str:
        text = self._atom(graph, atom, depth)
        if len(text) > MAX_CHARS and depth > 0:
            return self.atom(graph, atom, depth - 1)
        return text

    def _atom(self, graph, atom, depth: int) -> str:
        if isinstance(atom, Literal):
            return format_literal(atom.val)
        prod = graph.producer(atom)
        if prod is not None:
            eqn = graph.eqns[prod[0]]
            if eqn.primitive.name in TRANSPARENT and eqn.invars:  # costs no depth
                return self._atom(graph, eqn.invars[0], depth)
            if depth <= 0:
                return self.name(graph, atom)
            return self.equation(graph, prod[0], depth, prod[1])
        # an input of this graph: the top level's argument, or the caller's atom
        if graph is self.tree.root.graph:
            if atom in self.input_names:
                return self.input_names[atom]
            return "const" if atom in graph.jaxpr.constvars else self.name(graph, atom)
        mapping = self.tree.call_body_invars(graph)
        if mapping is not None:
            parent, args = mapping
            if atom in args:
                return self._atom(parent.graph, args[atom], depth)
        caller = self._callers.get(id(graph))
        if caller is not None and atom in caller[1]:
            return self._atom(caller[0], caller[1][atom], depth)
        return self.name(graph, atom)

    def equation(self, graph, node: int, depth: int = DEPTH, out_index: int = 0) -> str:
        eqn = graph.eqns[node]
        prim = eqn.primitive.name
        args = eqn.invars
        sub = depth - 1
        if prim in TRANSPARENT and args:
            return self._atom(graph, args[0], depth)
        if prim in INFIX and len(args) == 2:
            return (
                f"{self._wrapped(graph, args[0], sub)} {INFIX[prim]} "
                f"{self._wrapped(graph, args[1], sub)}"
            )
        if prim == "not" and len(args) == 1:
            return f"~{self._wrapped(graph, args[0], sub)}"
        if prim == "neg" and len(args) == 1:
            return f"-{self._wrapped(graph, args[0], sub)}"
        if prim == "integer_pow":
            return f"{self._wrapped(graph, args[0], sub)} ** {eqn.params.get('y')}"
        if prim == "slice":
            return f"{self._wrapped(graph, args[0], sub)}{slice_text(eqn)}"
        through = self._through_call(graph, node, depth, out_index)
        if through is not None:
            return through
        label = prim
        if "name" in eqn.params and isinstance(eqn.params["name"], str):
            label = eqn.params["name"].lstrip("_") or prim
        inner = ", ".join(self._atom(graph, a, sub) for a in args)
        suffix = f"[{out_index}]" if len(eqn.outvars) > 1 else ""
        return f"{label}({inner}){suffix}"

    def _through_call(self, graph, node: int, depth: int, out_index: int):
        """A call's output rendered by its body (``jnp.greater``'s inline jit is
        ``x > 0.0``), when the body was analysed; None otherwise."""
        eqn = graph.eqns[node]
        if eqn.primitive.name not in ("jit", "pjit") or not jit_inlines(eqn.params):
            return None
        a = self.tree.analysis_of(graph)
        sub = a.subs.get((node, 0)) if a is not None else None
        if sub is not None:
            body_graph = sub.graph
        else:  # not analysed (a comparison carries no derivative): a graph to read
            key = (id(graph), node)
            body_graph = self._bodies.get(key)
            if body_graph is None:
                from hlo_guard.jax_frontend.graph import JaxprGraph

                body = eqn.params["jaxpr"]
                body_graph = JaxprGraph(getattr(body, "jaxpr", body), graph.scope)
                self._bodies[key] = body_graph
                self._callers[id(body_graph)] = (
                    graph,
                    dict(zip(body_graph.jaxpr.invars, eqn.invars)),
                )
        outs = body_graph.jaxpr.outvars
        if out_index >= len(outs):
            return None
        return self._atom(body_graph, outs[out_index], depth)

    def _wrapped(self, graph, atom, depth) -> str:
        text = self._atom(graph, atom, depth)
        if any(f" {op} " in text for op in INFIX.values()):
            return f"({text})"
        return text


def slice_text(eqn) -> str:
    start = eqn.params["start_indices"]
    limit = eqn.params["limit_indices"]
    strides = eqn.params.get("strides") or (1,) * len(start)
    parts = []
    for s, l, st in zip(start, limit, strides):
        parts.append(f"{s}:{l}" + (f":{st}" if st != 1 else ""))
    return "[" + ", ".join(parts) + "]"
