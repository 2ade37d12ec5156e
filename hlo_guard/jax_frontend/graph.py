"""A jaxpr seen through the engine's :class:`passes.graph.Graph` protocol.

Equations are nodes (numbered by position), ``Var`` objects are values.
``Literal`` is unhashable in JAX 0.10 and ``DropVar`` subclasses ``Var``, so both
are mapped to ``None`` here and nowhere else.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

from hlo_guard.jax_frontend.bodies import REWRITTEN_CALLS, body_of, scope_name

Literal = jex_core.Literal
DropVar = jex_core.DropVar
Var = jex_core.Var


#: lane-wise primitives :meth:`JaxprGraph.known_constant` evaluates on known
#: floating constants (the arithmetic a scale is computed with), with numpy's
#: correctly rounded operations that give XLA's result bit for bit; up to
#: this many lanes
_FOLDED = {
    "neg": np.negative,
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "sqrt": np.sqrt,
    "max": np.maximum,
    "min": np.minimum,
    "square": np.square,
}

_FOLDED_MAX_SIZE = 64
#: lane copies :meth:`JaxprGraph.known_constant` evaluates (numpy views of
#: the constant: any size)
_COPIES = frozenset({"broadcast_in_dim", "reshape", "squeeze"})
#: how many call boundaries :meth:`JaxprGraph.value_source` crosses
_MAX_SOURCE_STEPS = 48


def is_literal(atom) -> bool:
    return isinstance(atom, Literal)


#: dtype -> whether it is inexact: asked several times per equation by every
#: sweep of the pass, and ``jax.dtypes.issubdtype`` is slow for what it does
_INEXACT: dict[Any, bool] = {}


def is_bool(atom) -> bool:
    """Whether ``atom`` (a variable or literal) holds booleans."""
    return str(getattr(getattr(atom, "aval", None), "dtype", "")) == "bool"


def is_inexact_aval(aval) -> bool:
    dtype = getattr(aval, "dtype", None)
    if dtype is None:
        return False
    try:
        return _INEXACT[dtype]
    except KeyError:
        pass
    except TypeError:  # an unhashable dtype: ask every time
        return _inexact(dtype)
    found = _INEXACT[dtype] = _inexact(dtype)
    return found


def _inexact(dtype) -> bool:
    try:
        # jax.dtypes knows bfloat16 and the float8 types (numpy does not)
        return bool(jax.dtypes.issubdtype(dtype, np.inexact)) and dtype != jax.dtypes.float0
    except TypeError:  # extended dtypes (PRNG keys)
        return False


class OriginToken:
    """Names one equation of one jaxpr in reports; hashable by identity of both."""

    __slots__ = ("graph", "node")

    def __init__(self, graph: JaxprGraph, node: int):
        self.graph = graph
        self.node = node

    @property
    def eqn(self):
        return self.graph.eqns[self.node]

    def __hash__(self):
        return hash((id(self.graph), self.node))

    def __eq__(self, other):
        return (
            isinstance(other, OriginToken) and other.graph is self.graph and other.node == self.node
        )

    def __repr__(self):
        return f"{self.eqn.primitive.name}#{self.node}"


def _static_size_at_most(shape) -> bool:
    """Whether ``shape`` has integer sizes (not symbolic ones: ``jax.export``
    with a shape variable ``n``, whose comparison with a number raises) and
    at most :data:`_FOLDED_MAX_SIZE` elements."""
    if not all(isinstance(d, (int, np.integer)) for d in shape):
        return False
    return math.prod(shape) <= _FOLDED_MAX_SIZE


class JaxprGraph:
    """Adapter of one (open) jaxpr.  ``scope`` names the nesting for reports."""

    def __init__(
        self, jaxpr, scope: str = "", constant_inputs=(), caller=None, constant_values=None
    ):
        """``constant_inputs``: invars/constvars known to hold constants (concrete
        closed-over arrays, a caller's literals); with every value computed
        from constants only, they carry no derivative and are never guarded.
        ``caller``: (the calling graph, invar -> the caller's argument), so
        that facts about an argument are asked where it is computed: ``jnp``'s
        wrappers receive ``8.0 * x``'s scalar as an input, not as a literal
        (:meth:`known_constant`, :mod:`value_bounds`).  ``constant_values``:
        the concrete arrays some of those constants hold (closed-over
        ``jnp.asarray([...])``), read by :meth:`known_constant`."""
        self.jaxpr = jaxpr
        self._constant_values = dict(constant_values or {})
        self._caller = caller
        #: a ``cond`` branch's link to the operands its caller passes (the
        #: caller's graph, invar -> operand), for walks that follow a value
        #: back out of the branch; unlike ``caller``, no fact (a constant, a
        #: bound) is read through it
        self.operand_source: tuple | None = None
        #: (the caller's graph, the call equation) of a plain call's body, for
        #: walks that follow a value forward out of it (:meth:`result_target`)
        self.call_site: tuple | None = None
        self._result_targets: dict | None = None
        #: :func:`value_bounds.lower_bound`'s answers for this graph
        self.lower_bounds: dict = {}
        #: constants :meth:`known_constant` evaluated (None: not known)
        self._folded_values: dict = {}
        #: node -> the graph of that call's body, seen from here (:meth:`call_body_graph`)
        self._call_bodies: dict[int, JaxprGraph] = {}
        self.eqns = jaxpr.eqns
        self.scope = scope
        self._producers: dict[Hashable, tuple[int, int]] | None = None
        self._origins: dict[int, OriginToken] = {}
        self._constant_inputs = frozenset(constant_inputs)
        self._constants: frozenset | None = None
        #: per node, its inputs and outputs as the engine sees them (every sweep
        #: asks for them; the jaxpr never changes under a graph)
        self._inputs: list[list[Hashable | None] | None] = [None] * len(self.eqns)
        self._outputs: list[list[Hashable | None] | None] = [None] * len(self.eqns)

    # -- passes.graph.Graph --------------------------------------------------
    def node_count(self) -> int:
        return len(self.eqns)

    def op_name(self, node: int) -> str:
        return self.eqns[node].primitive.name

    def node_inputs(self, node: int) -> list[Hashable | None]:
        found = self._inputs[node]
        if found is None:
            found = self._inputs[node] = [
                None if isinstance(v, Literal) else v for v in self.eqns[node].invars
            ]
        return found

    def node_outputs(self, node: int) -> list[Hashable | None]:
        found = self._outputs[node]
        if found is None:
            found = self._outputs[node] = [
                None if isinstance(v, DropVar) else v for v in self.eqns[node].outvars
            ]
        return found

    def graph_outputs(self) -> list[Hashable | None]:
        return [None if isinstance(v, Literal) else v for v in self.jaxpr.outvars]

    def graph_inputs(self) -> list[Hashable | None]:
        return list(self.jaxpr.invars) + list(self.jaxpr.constvars)

    def carries_derivative(self, value) -> bool:
        return is_inexact_aval(value.aval) and value not in self.constants()

    # -- constants -------------------------------------------------------------
    def constants(self) -> frozenset:
        """Values computed from literals and constant inputs only.  Their
        derivative is zero whatever the program does, so a guard on them could
        only cost time (and an explain line); JAX's AD never differentiates them."""
        if self._constants is None:
            const = set(self._constant_inputs)
            if const or any(isinstance(v, Literal) for e in self.eqns for v in e.invars):
                for eqn in self.eqns:
                    if all(isinstance(v, Literal) or v in const for v in eqn.invars):
                        const.update(v for v in eqn.outvars if not isinstance(v, DropVar))
            self._constants = frozenset(const)
        return self._constants

    def is_constant(self, atom) -> bool:
        return isinstance(atom, Literal) or atom in self.constants()

    def known_constant(self, atom):
        """The value of ``atom`` known while tracing -- a literal, an input the
        caller binds to one, a call's result that is one (:meth:`value_source`),
        a dtype conversion of those (what ``jnp``'s wrappers do to a Python
        scalar) or small arithmetic on them (:meth:`_folded`) -- else None.  Rules read it to tell a
        finite scale (``8.0 * s``) from an unknown one."""
        graph, atom = self.value_source(atom)
        if isinstance(atom, Literal):
            return atom.val
        if graph is not self:
            return graph.known_constant(atom)
        where = self.producer(atom)
        if where is None:
            return self._constant_values.get(atom)
        eqn = self.eqns[where[0]]
        if eqn.primitive.name == "convert_element_type":
            val = self.known_constant(eqn.invars[0])
            if val is None:
                return None
            try:
                with np.errstate(all="ignore"):
                    return np.asarray(val).astype(eqn.params["new_dtype"])
            except (TypeError, ValueError):  # a dtype numpy cannot convert to
                return None
        if eqn.primitive.name in _FOLDED and eqn.params.get("accuracy") is None:
            return self._folded(atom, eqn)
        if eqn.primitive.name in _COPIES:
            return self._copied(atom, eqn)
        return None

    def _copied(self, atom, eqn):
        """A broadcast or reshape of a known constant, evaluated with numpy:
        ``jnp``'s implicit broadcast of a closed-over array (``y * M`` with
        ``M`` of shape ``[3]`` and ``y`` of ``[2, 3]``) is a finite scale
        as ``M`` is (a hunt, 2026-11-28).  A view of the constant, so of any
        size; remembered per value."""
        if atom in self._folded_values:
            return self._folded_values[atom]
        self._folded_values[atom] = None  # no re-entry while evaluating
        shape = eqn.outvars[0].aval.shape
        static = all(isinstance(d, (int, np.integer)) for d in shape)
        # (``reshape``'s ``dimensions``, older JAX: a transpose first)
        if not static or (eqn.primitive.name == "reshape" and eqn.params.get("dimensions")):
            return None
        val = self.known_constant(eqn.invars[0])
        if val is None:
            return None
        arr = np.asarray(val)
        try:
            if eqn.primitive.name == "broadcast_in_dim":
                dims = tuple(eqn.params["broadcast_dimensions"])
                ranked = [arr.shape[dims.index(d)] if d in dims else 1 for d in range(len(shape))]
                found = np.broadcast_to(np.reshape(arr, ranked), shape)
            else:  # reshape, squeeze
                found = np.reshape(arr, shape)
        except (TypeError, ValueError, IndexError):
            return None
        self._folded_values[atom] = found
        return found

    def value_source(self, atom):
        """``(graph, atom)`` where ``atom``'s value is computed: out of a call
        body to the caller's argument, into a call (``jnp``'s wrappers stay
        calls in a staged trace: ``jnp.sqrt(8)``) to the body's result.  Two
        atoms with the same source are the same value."""
        graph = self
        for _ in range(_MAX_SOURCE_STEPS):
            if isinstance(atom, Literal):
                return graph, atom
            caller = graph.caller_argument(atom)
            if caller is not None:
                graph, atom = caller
                continue
            where = graph.producer(atom)
            if where is None or graph.eqns[where[0]].primitive.name not in REWRITTEN_CALLS:
                return graph, atom
            body = graph.call_body_graph(where[0])
            graph, atom = body, body.jaxpr.outvars[where[1]]
        return graph, atom

    def same_value(self, atom, other_graph, other) -> bool:
        """Whether ``atom`` here and ``other`` in ``other_graph`` hold one
        value, seen through calls (:meth:`value_source`); literals never do."""
        ga, a = self.value_source(atom)
        gb, b = other_graph.value_source(other)
        return ga is gb and not isinstance(a, Literal) and a is b

    def _folded(self, atom, eqn):
        """A small lane-wise op of known floating constants, evaluated while
        tracing: ``jnp.sqrt(depth)``, the scale Flax's attention divides
        queries by.  Evaluated in the output's dtype with numpy (no device
        computation, no compilation); remembered per value."""
        if atom in self._folded_values:
            return self._folded_values[atom]
        self._folded_values[atom] = None  # no re-entry while evaluating
        out = eqn.outvars[0].aval
        dtype = np.dtype(out.dtype)
        if not np.issubdtype(dtype, np.floating) or not _static_size_at_most(out.shape):
            return None
        vals = [self.known_constant(v) for v in eqn.invars]
        if any(v is None for v in vals):
            return None
        try:
            with np.errstate(all="ignore"):
                args = [np.asarray(v).astype(dtype) for v in vals]
                found = np.broadcast_to(_FOLDED[eqn.primitive.name](*args), out.shape)
        except (TypeError, ValueError):
            return None
        self._folded_values[atom] = found
        return found

    def caller_argument(self, atom):
        """(calling graph, the argument it binds ``atom`` to) for an input of a
        call body made with its caller; else None."""
        if self._caller is None:
            return None
        graph, args = self._caller
        arg = args.get(atom)
        return None if arg is None else (graph, arg)

    def result_target(self, var):
        """(the caller's graph, the call's output) holding body result
        ``var`` of a plain call (``jnp.divide``'s ``jit``, followed forward
        into the ``where`` after it); None when ``var`` is not exactly one
        result or this is no plain call's body.  Built on first use: only
        the reports walk forward."""
        if self.call_site is None:
            return None
        if self._result_targets is None:
            graph, eqn = self.call_site
            outs = self.jaxpr.outvars
            counts = Counter(v for v in outs if not isinstance(v, Literal))
            self._result_targets = {
                inner: (graph, outer)
                for inner, outer in zip(outs, eqn.outvars)
                if not isinstance(inner, Literal)
                and counts[inner] == 1
                and not isinstance(outer, DropVar)
            }
        return self._result_targets.get(var)

    def beneath(self, atom, copies=(), depth: int = 8, passed: list | None = None):
        """(graph, equation) computing ``atom`` beneath the operations named
        in ``copies`` (each followed through its first operand; none: its
        producer), seen out of and into calls (:meth:`value_source`); None
        at an input or a literal.
        ``passed`` collects the copies walked through, outermost first."""
        graph = self
        for _ in range(depth):
            graph, atom = graph.value_source(atom)
            found = None if isinstance(atom, Literal) else graph.producer(atom)
            if found is None:
                return None
            eqn = graph.eqns[found[0]]
            if eqn.primitive.name not in copies:
                return graph, eqn
            if passed is not None:
                passed.append(eqn)
            atom = eqn.invars[0]
        return None

    def call_body_graph(self, node: int) -> JaxprGraph:
        """The body of call ``node`` as this graph sees it (:func:`body_graph`),
        made once."""
        found = self._call_bodies.get(node)
        if found is None:
            eqn = self.eqns[node]
            found = self._call_bodies[node] = body_graph(self, eqn, body_of(eqn)[0])
        return found

    def origin(self, node: int) -> OriginToken:
        tok = self._origins.get(node)
        if tok is None:
            tok = self._origins[node] = OriginToken(self, node)
        return tok

    # -- helpers for the interpreter ------------------------------------------
    def producer(self, var) -> tuple[int, int] | None:
        """(node, output index) that defines ``var``; None for invars/constvars."""
        if self._producers is None:
            self._producers = {}
            for n, eqn in enumerate(self.eqns):
                for j, v in enumerate(eqn.outvars):
                    if not isinstance(v, DropVar):
                        self._producers[v] = (n, j)
        return self._producers.get(var)


# -- a call's body as its caller sees it ------------------------------------------


def constant_body_inputs(graph: JaxprGraph, args, body) -> list:
    """The inputs of ``body`` that hold constants: its own closed-over consts and
    the parameters the caller passes a constant (literal ``0.1`` into ``clip``)."""
    return list(body.constvars) + [v for v, a in zip(body.invars, args) if graph.is_constant(a)]


def body_graph(graph: JaxprGraph, eqn, body, args=None) -> JaxprGraph:
    """The graph of a call's ``body`` as its caller ``graph`` sees it: scoped,
    with the inputs the caller binds to constants marked and a link back to
    the caller's arguments (their values and bounds, asked when needed)."""
    plain = args is None and eqn.primitive.name in _PLAIN_CALLS
    args = eqn.invars if args is None else args
    found = JaxprGraph(
        body,
        scope_name(graph.scope, eqn),
        constant_body_inputs(graph, args, body),
        caller=(graph, dict(zip(body.invars, args))),
    )
    if plain and len(body.outvars) == len(eqn.outvars):
        found.call_site = (graph, eqn)
    return found


#: calls whose body's results are the call's outputs, one to one
_PLAIN_CALLS = frozenset({"jit", "pjit", "closed_call", "core_call", "remat2"})
