"""Lower bounds a jaxpr guarantees for a value while it is traced.

Two questions are asked of them: is a divisor at least 1?  The masked mean
every padded batch computes, ``sum(where(m, x, 0)) / maximum(sum(m), 1)``,
divides by such a value; ``d(n / d) = dn / d - n dd / d**2`` is then finite
wherever ``n`` is, so the division needs no forward-mode output guard (a
structurally zero tangent stays an exact zero through it).  And is the
operand of ``rsqrt``/``sqrt``/``log`` at least some ``b > 0``?  Every layer
norm computes ``rsqrt(maximum(0, var) + eps)``, whose derivative is then
bounded (a sum's bound is the sum of its operands' bounds).

A bound holds for every element that is not NaN: a NaN divisor makes the
forward value NaN in every lane it reaches, which is a genuine singularity
the guard must not hide anyway.  Bounds follow the caller's arguments into
``jnp``'s inline ``jit`` wrappers (``jnp.maximum`` is one) and call outputs
out of them, lazily: nothing is computed unless a rule asks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hlo_guard.jax_frontend.graph import Literal

#: operations whose output elements are copies of input elements (so every
#: bound of the input holds for the output); not reductions, whose empty
#: case is an identity element
_COPIES = frozenset(
    {"stop_gradient", "broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "copy"}
)


def lower_bound(graph, atom) -> float | None:
    """A number every non-NaN element of ``atom`` is at least, or None when
    the jaxpr does not say."""
    if atom is None:
        return None
    if isinstance(atom, Literal):  # literals are not hashable: no cache
        return _min_of(atom.val)
    cache: dict = graph.lower_bounds
    if atom in cache:
        return cache[atom]
    cache[atom] = None  # a cycle cannot happen in a jaxpr; this only guards re-entry
    found = _lower_bound(graph, atom)
    cache[atom] = found
    return found


def _lower_bound(graph, atom) -> float | None:
    value = graph.known_constant(atom)
    if value is not None:
        return _min_of(value)
    source_graph, source = graph.value_source(atom)  # out of and into calls
    if source_graph is not graph or source is not atom:
        return lower_bound(source_graph, source)
    where = graph.producer(atom)
    if where is None:
        return None
    node, _ = where
    eqn = graph.eqns[node]
    name = eqn.primitive.name
    if name in _COPIES:
        return lower_bound(graph, eqn.invars[0])
    if name == "convert_element_type":
        bound = lower_bound(graph, eqn.invars[0])
        # rounding and truncation are monotonic: x >= b gives conv(x) >= conv(b)
        return None if bound is None else _min_of(_converted(bound, eqn.params["new_dtype"]))
    if name == "sqrt":  # increasing; a negative bound says nothing
        bound = lower_bound(graph, eqn.invars[0])
        return None if bound is None or bound < 0 else float(np.sqrt(bound))
    if name == "add":
        bounds = [lower_bound(graph, v) for v in eqn.invars]
        return None if any(b is None for b in bounds) else sum(bounds)  # type: ignore[arg-type]
    if name == "max":
        known = [b for b in (lower_bound(graph, v) for v in eqn.invars) if b is not None]
        return max(known) if known else None
    if name == "min":
        bounds = [lower_bound(graph, v) for v in eqn.invars]
        return None if any(b is None for b in bounds) else min(bounds)  # type: ignore[type-var]
    return None


def _converted(bound: float, dtype) -> Any:
    try:
        with np.errstate(all="ignore"):
            return np.asarray(bound).astype(dtype)
    except (TypeError, ValueError):
        return None


def _min_of(value) -> float | None:
    if value is None:
        return None
    try:
        arr = np.asarray(value)
        if arr.size == 0 or arr.dtype == np.bool_:
            return None
        low = float(np.min(arr.astype(np.float64)))
    except (TypeError, ValueError):
        return None
    return None if np.isnan(low) else low
