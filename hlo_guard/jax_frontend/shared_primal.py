"""One forward computation for values a mask needed early.

A guard's mask can depend on a value computed after the guarded operation (the
second RMS norm's ``mean(y * y) > 0`` in a transformer block decides which
lanes of the first projection are live).  The interpreter then computes that
value once on the side, before the guarded evaluation reaches it.  The guarded
evaluation computes the same values again, and in a *derivative* program XLA
does not merge the two copies: its algebraic simplifier rewrites each copy
according to its users (the guarded copy also feeds the JVP), so they differ
by the time CSE runs, and every matmul on the way is done twice.

So when the guarded evaluation reaches an equation whose outputs were computed
on the side, it takes the side values as its primal outputs and computes only
the *tangents* from the guarded inputs: :func:`share_side_primal` is a
``custom_jvp`` whose primal is the side values and whose JVP is the
equation's own JVP at the guarded inputs.  The program holds one copy of the
forward; the derivative is exactly the guarded one.  The JVP's primal is the
shared call itself, so an outer transformation (``jacrev(grad)``, a gradient
penalty) differentiates the primal through this JVP again: the side
evaluation's own derivative, unguarded (a padded row's ``sqrt'(0)``), is
never taken (found 2026-11-27 by a user-style hunt; it was NaN with a clean
report).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax import lax
from jax.extend import core as jax_extend_core

from hlo_guard.jax_frontend.binding import jvp_in, live_tangent_indices
from hlo_guard.jax_frontend.graph import is_inexact_aval

#: primitives whose second copy costs real work: contractions.  Cheaper
#: equations are left to XLA (and to its CSE, which usually merges them): a
#: shared equation's gradient is assembled differently, so XLA may round its
#: last bit differently, and that is only worth it where a matmul is saved.
CONTRACTIONS = frozenset({"dot_general", "conv_general_dilated", "ragged_dot_general"})


def can_share(eqn, side: Sequence[Any] | None) -> bool:
    """Floating outputs of an effect-free equation that contracts (directly
    or inside a call), all of them known."""
    if side is None or eqn.effects:
        return False
    if not all(is_inexact_aval(ov.aval) for ov in eqn.outvars):
        return False
    return contracts(eqn)


def contracts(eqn) -> bool:
    """Whether ``eqn`` is, or calls a body containing, a contraction."""
    if eqn.primitive.name in CONTRACTIONS:
        return True
    return any(_body_contracts(j) for j in jax_extend_core.jaxprs_in_params(eqn.params))


_CONTRACTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _body_contracts(jaxpr) -> bool:
    found = _CONTRACTS.get(jaxpr)
    if found is None:
        found = any(contracts(e) for e in jaxpr.eqns)
        _CONTRACTS[jaxpr] = found
    return found


def share_side_primal(
    side: Sequence[Any],
    compute: Callable[[list[Any], list[Any]], list[Any]],
    invals: Sequence[Any],
    extra: Sequence[Any] = (),
) -> list[Any]:
    """Outputs whose values are ``side`` and whose tangents are those of
    ``compute(invals, extra)``.

    ``extra`` (masks) reaches ``compute`` as arguments, never through its
    closure: under ``jax.jit`` the JVP rule runs later, when the jit is
    differentiated, and a closed-over tracer of the first trace would have
    escaped by then.  ``compute`` itself may close over static data only."""
    n, n_extra = len(invals), len(extra)

    @jax.custom_jvp
    def shared(*args):
        return list(args[n + n_extra :])

    def shared_jvp(primals, tangents):
        ins = list(primals[:n])
        masks = list(primals[n : n + n_extra])
        values = list(primals[n + n_extra :])
        # the primal through ``shared`` itself, not the side values: a
        # derivative of this derivative (``jacrev(grad)``, a gradient
        # penalty) differentiates the primal again and must meet this JVP
        # again, not the side evaluation's own unguarded derivative (a
        # padded row's ``sqrt'(0)`` in front of a shared ``dot_general``)
        again = list(shared(*primals))
        live = live_tangent_indices(tangents[:n])
        if not live:
            return again, [lax.full_like(v, 0) for v in values]
        _, t_out = jvp_in(
            lambda *args: list(compute(list(args), masks)),
            ins,
            live,
            [tangents[i] for i in live],
        )
        return again, list(t_out)

    shared.defjvp(shared_jvp, symbolic_zeros=True)
    return list(shared(*invals, *extra, *side))
