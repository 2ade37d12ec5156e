"""The max-shifted ``exp`` of a softmax, and the ``log`` of its sum: bounded.

``exp`` and ``log`` count as singular for the reports (an ``exp`` may
overflow, a ``log`` meet 0), so a where-made zero times ``log_softmax(z)``
-- a one-hot cross-entropy, the most common loss there is -- looked like
``0 * inf``.  But ``log_softmax`` and ``logsumexp`` shift by the maximum
first: ``exp(z - max(z))`` is at most 1, so its derivative is too, and the
sum of it over the axes of that maximum is at least 1 (the maximal lane
contributes ``exp(0)``), so the ``log`` of it has a derivative of at most 1.
A row with a NaN or an infinity is NaN in the forward value already.

:func:`bounded_by_max_shift` recognises exactly those two equations, as
``jax.nn.log_softmax``/``logsumexp`` write them (the maximum behind
``stop_gradient``, broadcasts, ``max(-inf, .)`` and ``logsumexp``'s
``is_finite`` fallback to 0), and nothing looser.
"""

from __future__ import annotations

import numpy as np

#: what lies between ``reduce_max`` and the ``sub`` that shifts by it
_SHIFT_COPIES = frozenset({"broadcast_in_dim", "reshape", "stop_gradient", "squeeze"})
#: what lies between ``reduce_sum`` and the ``log`` of it
_SUM_COPIES = frozenset({"broadcast_in_dim", "reshape", "squeeze", "abs"})
_DEPTH = 8


def bounded_by_max_shift(graph, eqn) -> bool:
    """Whether ``eqn`` is the ``exp`` of a value shifted by its own maximum,
    or the ``log`` of a sum of such an ``exp`` over the maximum's axes."""
    name = eqn.primitive.name
    if name == "exp":
        return _max_shift_axes(graph, eqn) is not None
    if name != "log":
        return False
    found = graph.beneath(eqn.invars[0], _SUM_COPIES)
    if found is None:
        return False
    g, total = found
    if total.primitive.name != "reduce_sum":
        return False
    inner = g.beneath(total.invars[0])
    if inner is None or inner[1].primitive.name != "exp":
        return False
    axes = _max_shift_axes(*inner)
    return axes is not None and axes == tuple(total.params.get("axes", ()))


def _max_shift_axes(graph, exp_eqn):
    """The axes of the maximum ``exp_eqn``'s operand is shifted by
    (``exp(a - max(a, axes))``), or None."""
    found = graph.beneath(exp_eqn.invars[0])
    if found is None or found[1].primitive.name != "sub":
        return None
    g, sub = found
    shifted, shift = sub.invars
    reduced = _maximum_behind(g, shift)
    if reduced is None:
        return None
    mg, reduce_max = reduced
    if not g.same_value(shifted, mg, reduce_max.invars[0]):
        return None
    return tuple(reduce_max.params.get("axes", ()))


def _maximum_behind(graph, atom):
    """(graph, the ``reduce_max`` equation) behind ``atom``, seen through
    copies, ``max(-inf, m)`` and ``select_n(is_finite(m), 0, m)``."""
    for _ in range(_DEPTH):
        found = graph.beneath(atom)
        if found is None:
            return None
        graph, eqn = found
        name = eqn.primitive.name
        if name == "reduce_max":
            return graph, eqn
        if name in _SHIFT_COPIES:
            atom = eqn.invars[0]
        elif name == "max" and _is_minus_inf(graph, eqn.invars[0]):
            atom = eqn.invars[1]
        elif name == "select_n" and len(eqn.invars) == 3 and _is_zero(graph, eqn.invars[1]):
            atom = eqn.invars[2]  # logsumexp: where(isfinite(m), m, 0)
        else:
            return None
    return None


def _is_minus_inf(graph, atom) -> bool:
    val = _constant(graph, atom)
    return val is not None and bool(np.all(np.asarray(val) == -np.inf))


def _is_zero(graph, atom) -> bool:
    val = _constant(graph, atom)
    return val is not None and bool(np.all(np.asarray(val) == 0))


def _constant(graph, atom):
    """The known value of ``atom``, or of the constant it broadcasts or
    converts (``jnp.where``'s ``broadcast_in_dim 0.0``)."""
    for _ in range(_DEPTH):
        val = graph.known_constant(atom)
        if val is not None:
            return val
        found = graph.beneath(atom)
        if found is None:
            return None
        graph, eqn = found
        if eqn.primitive.name not in ("broadcast_in_dim", "convert_element_type", "reshape"):
            return None
        atom = eqn.invars[0]
    return None
