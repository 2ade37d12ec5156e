"""Guarded ``jit`` bodies shared across traces and call sites.

Plain JAX traces a jitted library function (``jax.nn.softplus``,
``logsumexp``, an optax or numpyro helper) once per argument types and then
re-uses its jaxpr: every later call, in this trace or the next, costs one
equation.  The rewrite re-binds a call whose body needs guards with a guarded
body of its own (``interpreter._bind_call``), a fresh ``jax.jit`` per call
site and per trace -- so each call of such a function was traced again,
through the interpreter and ``jax.jit``'s own machinery (issue 17 item 5: a
third of numpyro's guarded trace).

This module keeps the equation that binding the guarded body staged -- its
primitive and parameters, the guarded body jaxpr among them -- and stages it
again wherever the same body is guarded the same way.  "The same way" is a
*fingerprint* of everything the guarded evaluation of the body reads
(:func:`fingerprint`): the body jaxpr itself (by identity, as JAX's caches
key it) and its constants, the liveness the analysis found for every use
and output, the nested analyses, the guard plan (sites, output guards,
contractions, rewritten calls, which guards share a select), and what the
body's graph knows about its caller (constant inputs, known constant values,
lower bounds, and the caller's forward analysis of a body evaluated in that
context).  Anything the fingerprint cannot name -- a tracer, an object
it does not know -- makes the call unshareable: it is then guarded as
before.  Origin tokens and mask keys are renamed canonically, so that the
same context in another trace gives the same fingerprint.

Only a ``jit`` bound in a plain jaxpr trace (``compat.staged_call_equation``)
with no effects is shared, in gradient mode, and only when the evaluation
that made the entry skipped no guard (a skip is recorded per trace, and a
hit must leave the same record).  ``tests/test_staged_bodies.py`` compares
every shared program with the one a fresh evaluation gives.
"""

from __future__ import annotations

import dataclasses
import enum
from collections import OrderedDict
from typing import Any, cast

import numpy as np

from hlo_guard.jax_frontend.compat import bind_staged_call, staged_call_equation
from hlo_guard.jax_frontend.graph import JaxprGraph, Literal, OriginToken, Var
from hlo_guard.jax_frontend.plan import plan_of
from hlo_guard.jax_frontend.trace_cache import WeakCacheByJaxpr
from hlo_guard.jax_frontend.value_bounds import lower_bound
from passes.analysis import Analysis
from passes.lattice import Liveness

#: contexts kept per body jaxpr (a library function guarded in a handful of
#: ways); the least recently used goes first
CONTEXTS_PER_BODY = 8

#: set to False to guard every call afresh (the tests' oracle)
enabled = True


class _Unnameable(Exception):
    """The fingerprint met something it cannot name: do not share."""


class _Names:
    """Canonical names for what a fingerprint mentions: graphs of the body's
    own tree by their path, anything outside it by order of first mention
    (the same context in another trace is mentioned in the same order)."""

    def __init__(self, tree: dict[int, tuple]):
        self.tree = tree  # id(graph) -> path
        self.outside: dict[int, int] = {}
        self.keep: list[Any] = []  # what is named by id stays alive meanwhile
        self.var_ids: dict[int, dict[int, int]] = {}

    def outsider(self, obj) -> tuple:
        k = self.outside.get(id(obj))
        if k is None:
            k = self.outside[id(obj)] = len(self.outside)
            self.keep.append(obj)
        return ("outside", k)

    def var(self, graph: JaxprGraph, v) -> tuple | None:
        """A variable of ``graph`` (of the body's tree) by its position."""
        path = self.tree.get(id(graph))
        if path is None:
            return None
        ids = self.var_ids.get(id(graph))
        if ids is None:
            jaxpr = graph.jaxpr
            order = [*jaxpr.constvars, *jaxpr.invars]
            for eqn in jaxpr.eqns:
                order.extend(eqn.outvars)
            ids = self.var_ids[id(graph)] = {id(x): i for i, x in enumerate(order)}
        i = ids.get(id(v))
        return None if i is None else ("var", path, i)

    def __call__(self, x, graph: JaxprGraph | None = None):
        """``x`` as a hashable value equal for equal contexts; ``graph``: the
        graph whose variables ``x`` may hold."""
        if x is None or isinstance(x, (bool, int, str)):
            return x
        if isinstance(x, enum.Enum):
            return (type(x).__name__, x.value)
        if isinstance(x, float):
            return ("float", x.hex())
        if isinstance(x, Liveness):
            return (
                "liveness",
                int(x.level),
                self(x.origins, graph),
                self(x.partition, graph),
            )
        if isinstance(x, OriginToken):
            path = self.tree.get(id(x.graph))
            return ("origin", path, x.node) if path is not None else self.outsider(x)
        if isinstance(x, (tuple, list)):
            return tuple(self(y, graph) for y in x)
        if isinstance(x, (set, frozenset)):
            return frozenset(self(y, graph) for y in x)
        if isinstance(x, dict):
            return frozenset((self(k, graph), self(v, graph)) for k, v in x.items())
        if isinstance(x, Literal):
            return ("literal", self(np.asarray(x.val)), str(x.aval))
        if isinstance(x, (np.ndarray, np.generic)):
            a = np.asarray(x)
            if a.dtype == object:
                raise _Unnameable("an object array")
            return ("array", str(a.dtype), a.shape, a.tobytes())
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return (
                type(x).__name__,
                tuple(self(getattr(x, f.name), graph) for f in dataclasses.fields(x)),
            )
        if isinstance(x, Var) and graph is not None:
            named = self.var(graph, x)
            if named is not None:
                return named
        raise _Unnameable(type(x).__name__)


def _tree(root: Analysis) -> list[tuple[tuple, Analysis]]:
    """The analyses a guarded evaluation of ``root`` reads: ``root``, the
    bodies nested in it and the structure analyses of its custom calls, each
    with its path from ``root``."""
    found: list[tuple[tuple, Analysis]] = []
    stack: list[tuple[tuple, Analysis]] = [((), root)]
    while stack:
        path, a = stack.pop()
        found.append((path, a))
        for key in sorted(a.subs):
            stack.append(((*path, "sub", key), a.subs[key]))
        structure = plan_of(a).structure
        for node in sorted(structure):
            stack.append(((*path, "structure", node), structure[node]))
    return found


def _mask_sharing(mask_keys: dict) -> tuple:
    """Which guarded uses share a mask key -- all the interpreter reads from
    the keys (``Scope.shared_guard``) -- as a numbering of the keys in the
    order of the uses."""
    numbering: dict = {}
    out = []
    for use in sorted(mask_keys):
        key = mask_keys[use]
        out.append((use, numbering.setdefault(_hashable_key(key), len(numbering))))
    return tuple(out)


def _hashable_key(key):
    try:
        hash(key)
    except TypeError:
        return ("unhashable", id(key))
    return key


def _caller_facts(graph: JaxprGraph, names: _Names) -> tuple:
    """What the body's graph knows about its inputs from its caller: constant
    or not, a known constant value, a lower bound."""
    facts = []
    for v in graph.jaxpr.invars:
        facts.append(
            (
                graph.is_constant(v),
                names(graph.known_constant(v)),
                names(lower_bound(graph, v)),
            )
        )
    return tuple(facts)


def _of_analysis(path: tuple, a: Analysis, mode: str, names: _Names) -> tuple:
    graph = cast(JaxprGraph, a.graph)  # the JAX front end analyses jaxpr graphs only
    plan = plan_of(a)
    sites = plan.sites_for(mode)  # makes the placement when it is not made yet
    placement = a.placement
    return (
        path,
        len(graph.jaxpr.eqns),
        names(a.out_liveness, graph),
        names(a.use_liveness, graph),
        tuple((u.node, u.reason, names(u.liveness, graph)) for u in a.unreached),
        plan.mask_only,
        names(sites, graph),
        names(plan.output_sites_by_node, graph),
        names(plan.guarded_contractions, graph),
        names(plan.rewritten_bodies(mode), graph),
        None
        if placement is None
        else (
            names(placement.guarded),
            names(placement.hazard),
            names(placement.input_hazards),
            names(placement.own_hazard_only),
            _mask_sharing(placement.mask_keys),
        ),
        _caller_facts(graph, names),
        _forward_context(plan.forward_context, names),
    )


def _forward_context(fa, names: _Names) -> tuple | None:
    """A body evaluated in its caller's forward context
    (``GuardPlan.forward_context``) reads that analysis -- the tangent
    liveness of its inputs and of every value, nested bodies included --
    where its own would take every input as live."""
    if fa is None:
        return None
    graph = fa.graph
    return (
        names(fa.in_liveness, graph),
        names(fa.values, graph),
        tuple((key, _forward_context(fa.subs[key], names)) for key in sorted(fa.subs)),
    )


def _forward_graphs(fa, path: tuple, tree: dict[int, tuple]) -> None:
    """Name the graphs of a forward context by their path, as the body's own."""
    tree[id(fa.graph)] = path
    for key in sorted(fa.subs):
        _forward_graphs(fa.subs[key], (*path, "sub", key), tree)


def fingerprint(sub: Analysis, mode: str) -> tuple | None:
    """Everything the guarded evaluation of ``sub``'s body reads, named so
    that equal contexts are equal; None when something cannot be named."""
    tree = _tree(sub)
    graphs = {id(a.graph): path for path, a in tree}
    for path, a in tree:
        context = plan_of(a).forward_context
        if context is not None:
            _forward_graphs(context, (*path, "forward"), graphs)
    names = _Names(graphs)
    try:
        return tuple(_of_analysis(path, a, mode, names) for path, a in tree)
    except _Unnameable:
        return None


class StagedBodies(WeakCacheByJaxpr):
    """body jaxpr (weakly) -> {context key: (constants, staged call)}."""

    def __init__(self):
        super().__init__("hlo_guard guarded jit bodies")

    def get(self, body, consts, key, args):
        """The outputs of the staged call for ``key`` bound to ``args``, or None."""
        per_body = self.entries.get(body)
        found = None if per_body is None else per_body.get(key)
        if (
            found is None
            or len(found[0]) != len(consts)
            or any(a is not b for a, b in zip(found[0], consts))
        ):
            self.misses += 1
            return None
        outs = bind_staged_call(found[1], args)
        if outs is None:
            self.misses += 1
            return None
        per_body.move_to_end(key)
        self.hits += 1
        return outs

    def put(self, body, consts, key, args, outs) -> None:
        """Keep the call that binding the guarded body to ``args`` staged
        (``outs`` its outputs), when it can be staged again as it is."""
        staged = staged_call_equation(outs, args)
        if staged is None:
            return
        try:
            per_body = self.entries.get(body)
        except TypeError:  # pragma: no cover - a body that cannot be weakly keyed
            return
        if per_body is None:
            per_body = self.entries[body] = OrderedDict()
        per_body[key] = (tuple(consts), staged)
        per_body.move_to_end(key)
        while len(per_body) > CONTEXTS_PER_BODY:
            per_body.popitem(last=False)


STAGED_BODIES = StagedBodies()


def finish_like_a_run(sub: Analysis, mode: str) -> None:
    """On a hit, the records of ``sub``'s tree say what an evaluation would
    have: finished in ``mode``, nothing skipped (entries are made only from
    evaluations that skipped nothing)."""
    for _, a in _tree(sub):
        plan_of(a).record.finished.add(mode)


def skipped_nothing(sub: Analysis) -> bool:
    return not any(plan_of(a).record.skipped for _, a in _tree(sub))
