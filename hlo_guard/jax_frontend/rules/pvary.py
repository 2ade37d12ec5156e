"""``pvary`` inside ``shard_map``: an invariant value (the same on every
device of ``axes``) used as a varying one.

Its transpose is a ``psum`` over ``axes``, so a lane of the input is live iff
it is live on *any* device: the input mask is the output mask OR-ed over
``axes``.  Passing the output mask straight through (as for the other
pass-through primitives) would guard the invariant input with one device's
varying mask: the guarded value becomes varying and re-binding ``pvary`` on it
fails ("pvary is a invariant->variant collective"); it would also be wrong,
as the other devices' dead lanes are summed into the cotangent.  The OR is a
small collective in the forward program, built only when a guard before the
``pvary`` needs it.
"""

from __future__ import annotations

import jax
import numpy as np

from hlo_guard.jax_frontend.rules.passthrough import PassThrough
from passes.masks import ALL


class PVary(PassThrough):
    def input_masks(self, mctx, node, eqn, out_masks):
        axes = tuple(eqn.params.get("axes", ()))
        return [or_over_axes(m, axes) for m in out_masks]


def or_over_axes(mask, axes):
    from hlo_guard.jax_frontend.mask_ops import normalize

    if mask is ALL or not isinstance(mask, jax.core.Tracer):
        return mask  # ALL, NONE and trace-time masks are the same on every device
    varying = getattr(getattr(jax.typeof(mask), "manual_axis_type", None), "varying", ())
    over = tuple(a for a in axes if a in varying)
    if not over:
        return mask
    return normalize(jax.lax.psum(mask.astype(np.int32), over) > 0)


def register(table):
    table.register("pvary", PVary())
