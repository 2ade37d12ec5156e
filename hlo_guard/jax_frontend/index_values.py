"""What an integer index array is known to hold while tracing: an ``arange``.

``logp[jnp.arange(B), labels]`` -- the hand-written cross-entropy -- gathers
with index vectors ``(i, labels[i])``.  Whether every row of ``logp`` has a
read lane depends on the first component only, and that is an ``iota``
(``jnp.arange`` traces to one) behind the steps ``jnp``'s indexing adds:
negative-index normalisation ``select_n(i < 0, i, i + n)``, a dtype
conversion, ``broadcast_in_dim`` to a column and ``concatenate`` of the
columns.  This module follows those steps back to the ``iota`` and says
along which axis the value counts ``0, 1, ..., n - 1`` (the same along every
other axis).  Anything else -- a reversed or shifted arange, a value computed
at run time, a constant array -- answers None, and the caller stays
conservative: an arange is a promise only when the jaxpr itself spells it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hlo_guard.jax_frontend.graph import Literal

#: how deep a chain of index steps is followed; jnp's indexing adds about five
_MAX_STEPS = 12


def iota_axis(graph, atom, steps: int = _MAX_STEPS) -> int | None:
    """The axis along which integer ``atom`` holds ``0, 1, ..., n - 1``
    (``n`` its size there), equal along every other axis; None when the
    jaxpr does not say so."""
    if steps <= 0 or atom is None or isinstance(atom, Literal):
        return None
    if not np.issubdtype(atom.aval.dtype, np.integer):
        return None
    graph, atom = graph.value_source(atom)
    where = None if isinstance(atom, Literal) else graph.producer(atom)
    if where is None:
        return None
    eqn = graph.eqns[where[0]]
    step = _STEPS.get(eqn.primitive.name)
    return None if step is None else step(graph, eqn, steps - 1)


def _producing_eqn(graph, atom):
    """``(graph, equation)`` computing ``atom``'s value, or None."""
    graph, atom = graph.value_source(atom)
    where = None if isinstance(atom, Literal) else graph.producer(atom)
    return None if where is None else (graph, graph.eqns[where[0]])


def _is_zero(graph, atom) -> bool:
    graph, atom = graph.value_source(atom)
    value = atom.val if isinstance(atom, Literal) else graph.known_constant(atom)
    return value is not None and np.size(value) >= 1 and not np.any(np.asarray(value) != 0)


def _iota(graph, eqn, steps):
    return eqn.params["dimension"]


def _convert(graph, eqn, steps):
    """An integer-to-integer conversion keeps ``0 .. n - 1`` if ``n - 1`` fits."""
    source = eqn.invars[0]
    axis = iota_axis(graph, source, steps)
    if axis is None:
        return None
    dtype = np.dtype(eqn.params["new_dtype"])
    if not np.issubdtype(dtype, np.integer):
        return None
    return axis if source.aval.shape[axis] - 1 <= np.iinfo(dtype).max else None


def _broadcast(graph, eqn, steps):
    source = eqn.invars[0]
    axis = iota_axis(graph, source, steps)
    if axis is None:
        return None
    out_axis = eqn.params["broadcast_dimensions"][axis]
    size = source.aval.shape[axis]
    return out_axis if eqn.outvars[0].aval.shape[out_axis] == size else None


def _reshape(graph, eqn, steps):
    """Only a reshape that adds or drops size-1 axes: the counting axis is
    the same sequence of lanes before and after."""
    source = eqn.invars[0]
    axis = iota_axis(graph, source, steps)
    if axis is None:
        return None
    before = [d for d, n in enumerate(source.aval.shape) if n != 1]
    after = [d for d, n in enumerate(eqn.outvars[0].aval.shape) if n != 1]
    sizes = [source.aval.shape[d] for d in before]
    if sizes != [eqn.outvars[0].aval.shape[d] for d in after] or axis not in before:
        return None
    return after[before.index(axis)]


def _squeeze(graph, eqn, steps):
    source = eqn.invars[0]
    axis = iota_axis(graph, source, steps)
    dropped = set(eqn.params["dimensions"])
    if axis is None or axis in dropped:
        return None
    return axis - sum(1 for d in dropped if d < axis)


def _normalised(graph, eqn, steps):
    """``select_n(i < 0, i, i + n)``: jnp's negative-index wrap.  An iota is
    never negative, so the predicate is false everywhere and the value is
    ``i`` itself."""
    if len(eqn.invars) != 3:
        return None
    pred, kept = eqn.invars[0], eqn.invars[1]
    found = None if isinstance(pred, Literal) else _producing_eqn(graph, pred)
    if found is None:
        return None
    test_graph, test = found
    if test.primitive.name != "lt" or not _is_zero(test_graph, test.invars[1]):
        return None
    if not test_graph.same_value(test.invars[0], graph, kept):
        return None
    return iota_axis(graph, kept, steps)


#: the index steps followed, keyed by primitive as JAX's own rule tables are
_STEPS = {
    "iota": _iota,
    "convert_element_type": _convert,
    "broadcast_in_dim": _broadcast,
    "reshape": _reshape,
    "squeeze": _squeeze,
    "select_n": _normalised,
}


def index_components(graph, indices) -> list[tuple[Any, int, Any]]:
    """``(graph, first component, column)`` pieces of a gather's index
    array, whose last axis holds the index vector: the operands of a
    ``concatenate`` along that axis, or the whole array."""
    last = len(indices.aval.shape) - 1
    found = None if isinstance(indices, Literal) else _producing_eqn(graph, indices)
    if found is not None:
        body, eqn = found
        if eqn.primitive.name == "concatenate" and eqn.params["dimension"] == last:
            pieces, start = [], 0
            for piece in eqn.invars:
                pieces.append((body, start, piece))
                start += piece.aval.shape[last]
            return pieces
    return [(graph, 0, indices)]
