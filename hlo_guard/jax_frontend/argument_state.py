"""State a function writes into its arguments: Flax NNX variables.

``guard(f)`` traces ``f`` on copies of its arguments (the pytree unflattened
from tracers) and runs the traced program, so an assignment ``f`` makes into
an argument's mutable container is made on the copy and would be lost.  For
Flax NNX that is the module's state: ``nnx.Dropout`` advances its
``RngCount``, ``nnx.BatchNorm`` writes its running statistics, and eager
``f(model, x)`` (or ``nnx.value_and_grad(f)``) sees each call's update.
Losing it silently changes every later forward value.

So the trace finds the argument leaves ``f`` replaced (:func:`replaced_leaves`),
returns their new values as extra, gradient-stopped outputs (state, not
something differentiated), and each call writes them back into the caller's
NNX ``Variable`` objects (:func:`write_back`).  A replaced leaf that is not
held by such a variable (a Python list of the arguments assigned into) has no
object to write back to: the call refuses it with an error, never a silent
loss.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import jax

from hlo_guard.errors import GuardUsageError


def replaced_leaves(dyn, traced_leaves: Sequence[Any], layout) -> list[tuple[int, Any]]:
    """(traced leaf index, new value) for every traced leaf of the dynamic
    arguments ``dyn`` (as the trace unflattened them) that ``f`` replaced."""
    after = jax.tree_util.tree_leaves(dyn)
    static = {i for i, _ in layout.static}
    positions = [i for i in range(layout.n_leaves) if i not in static]
    if len(after) != layout.n_leaves:
        raise GuardUsageError(
            "the guarded function changed the structure of its arguments (added or "
            "removed an array in a container it was passed); guard cannot carry that "
            "back out: return the new value instead"
        )
    return [
        (k, after[pos])
        for k, (pos, before) in enumerate(zip(positions, traced_leaves))
        if after[pos] is not before
    ]


def _variable_type():
    nnx = sys.modules.get("flax.nnx")
    return getattr(nnx, "Variable", None) if nnx is not None else None


def write_back(dyn, leaves: Sequence[Any], indices: Sequence[int], values: Sequence[Any]):
    """Write ``values`` into the NNX variables of the caller's arguments
    ``dyn`` that hold traced leaves ``indices`` (``leaves``: the call's
    traced leaves, the variables' current values)."""
    holders = _holders(dyn)
    targets = []
    for k in indices:
        var = holders.get(id(leaves[k]))
        if var is None:
            raise GuardUsageError(
                "the guarded function assigns a new value into a container of its "
                "arguments that is not a Flax NNX Variable; guard traces the function on "
                "a copy of its arguments, so the assignment would be lost: return the new "
                "value instead"
            )
        targets.append(var)
    for var, value in zip(targets, values):
        var.value = value


def _holders(dyn) -> dict[int, Any]:
    """id(the array a variable holds) -> the variable, for every NNX
    variable in ``dyn``."""
    variable = _variable_type()
    if variable is None:
        return {}
    found = {}
    for node in jax.tree_util.tree_leaves(dyn, is_leaf=lambda x: isinstance(x, variable)):
        if isinstance(node, variable):
            for leaf in jax.tree_util.tree_leaves(node):
                found[id(leaf)] = node
    return found
