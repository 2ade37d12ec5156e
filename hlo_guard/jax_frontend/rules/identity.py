"""Identity-like primitives: output ``k`` *is* input ``k``, lane for lane.

Placement and annotation primitives change where or how a value lives, never
its lanes: ``device_put`` (one output per operand), ``sharding_constraint``
(``with_sharding_constraint``), ``reshard``, ``layout_constraint``,
``shard_alike``, ``copy``, ``optimization_barrier``, ``name``
(``checkpoint_name``) and ``pvary`` (an invariant value typed as varying
inside ``shard_map``).  Their derivative is the identity, so the liveness and
the masks of output ``k`` are those of input ``k``, in both directions, and
they need no guard.

Without a rule they were treated as unknown -- fully live -- which cut the
liveness at the first ``jax.device_put`` and left every operation before it
unguarded.
"""
from __future__ import annotations

import jax
import numpy as np

from passes.lattice import NO_DERIVATIVE
from passes.masks import ALL

from hlo_guard.jax_frontend.graph import is_inexact_aval, is_literal
from hlo_guard.jax_frontend.rules.base import JaxRule

IDENTITY_PRIMITIVES = [
    "device_put", "sharding_constraint", "reshard", "layout_constraint", "shard_alike",
    "copy", "optimization_barrier", "name",
]


class Identity(JaxRule):
    kind = "identity"
    guards = False

    @staticmethod
    def _paired(eqn) -> bool:
        return len(eqn.invars) == len(eqn.outvars)

    def transfer(self, analysis, node, outs):
        eqn = analysis.graph.eqns[node]
        if not self._paired(eqn):  # not the shape we know: fully live (conservative)
            from passes.lattice import LIVE, join_all
            return [LIVE if join_all(outs).reaches_output else NO_DERIVATIVE] * len(eqn.invars)
        return [NO_DERIVATIVE if is_literal(v) or not is_inexact_aval(v.aval) else out
                for v, out in zip(eqn.invars, outs)]

    def input_masks(self, mctx, node, eqn, out_masks):
        if not self._paired(eqn):
            return [ALL] * len(eqn.invars)
        return list(out_masks)

    def forward(self, fa, node, ins):
        eqn = fa.graph.eqns[node]
        if not self._paired(eqn):
            from passes.lattice import LIVE
            return [LIVE] * len(eqn.outvars)
        return list(ins)

    def forward_masks(self, mctx, node, eqn, in_masks):
        if not self._paired(eqn):
            return [ALL] * len(eqn.outvars)
        return list(in_masks)


class PVary(Identity):
    """``pvary``: an invariant value (the same on every device of ``axes``)
    used as a varying one.  Its transpose is a ``psum`` over ``axes``, so a
    lane of the input is live iff it is live on *any* device: the input mask
    is the output mask OR-ed over ``axes``.  (Guarding the invariant input
    with one device's mask would not type-check, and would be wrong: the
    other devices' dead lanes are summed into its cotangent.)  That OR is a
    small collective in the forward program, built only when a guard before
    the ``pvary`` needs it."""

    def input_masks(self, mctx, node, eqn, out_masks):
        axes = tuple(eqn.params.get("axes", ()))
        if not self._paired(eqn) or not axes:
            return super().input_masks(mctx, node, eqn, out_masks)
        return [_or_over_axes(m, axes) for m in out_masks]


def _or_over_axes(mask, axes):
    from hlo_guard.jax_frontend.mask_ops import normalize
    if mask is ALL or not isinstance(mask, jax.core.Tracer):
        return mask  # ALL, NONE and trace-time masks are the same on every device
    varying = getattr(getattr(jax.typeof(mask), "manual_axis_type", None), "varying", ())
    over = tuple(a for a in axes if a in varying)
    if not over:
        return mask
    return normalize(jax.lax.psum(mask.astype(np.int32), over) > 0)


def register(table):
    table.register(IDENTITY_PRIMITIVES, Identity())
    table.register("pvary", PVary())
