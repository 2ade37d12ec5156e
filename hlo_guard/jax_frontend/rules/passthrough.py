"""Identity-like primitives: the value is unchanged, only its placement,
sharding, varying-axes type or scheduling is.

``device_put``, ``sharding_constraint``, ``reshard``, ``pvary``,
``optimization_barrier``, ``shard_alike``, ``checkpoint_name`` (``name``) ...
take n operands and return n outputs, output ``i`` being operand ``i``.  Their
derivative is the identity on each pair, so a lane of operand ``i`` is live
exactly where the same lane of output ``i`` is, and a zero cotangent stays
zero: no guard is needed, the masks just flow through.  Without a rule they
would be opaque (fully live), and one ``jax.device_put`` between a ``sqrt`` and
its ``where`` would silently switch every guard off.
"""

from __future__ import annotations

from hlo_guard.jax_frontend.rules.base import JaxRule
from passes.lattice import NO_DERIVATIVE
from passes.masks import NONE


class PassThrough(JaxRule):
    lane_local = True
    kind = "pass-through"
    guards = False

    def transfer(self, analysis, node, outs):
        return list(outs)

    def input_masks(self, mctx, node, eqn, out_masks):
        return list(out_masks)

    def forward(self, fa, node, ins):
        return list(ins)

    def forward_masks(self, mctx, node, eqn, in_masks):
        return list(in_masks)


#: one operand per output, output i is operand i (values unchanged)
PASS_THROUGH = [
    "device_put",
    "sharding_constraint",
    "reshard",
    "pvary",
    "copy",
    "optimization_barrier",
    "shard_alike",
    "relayout",  # jax 0.11+: a layout change, value unchanged
    "name",
    "layout_constraint",
    # Equinox (every optimistix solve): the identity, whose transpose checks
    # that the cotangent is zero; lanes pass through it unchanged
    "nondifferentiable_backward",
]


class MaskedPassThrough(JaxRule):
    """hlo_guard's own forward-mode output guard (:mod:`tangent_guard`),
    met when a guarded program is analysed again (a guarded function called
    inside another one, a ``jvp`` inside a guarded function): ``(mask, x)``
    to ``x``'s value (``tangent_guard``, ``cotangent_guard``) or to ``x``
    with masked lanes zeroed (``tangent_mask``).  Each transposes to one of
    the others, which pass a cotangent's lanes through unchanged, so lanes
    pass through from operand 1 as through an identity (conservatively for
    ``tangent_mask``'s zeroed lanes); the mask operand carries no derivative."""

    lane_local = True
    kind = "pass-through"
    guards = False

    def transfer(self, analysis, node, outs):
        return [NO_DERIVATIVE, outs[0]]

    def input_masks(self, mctx, node, eqn, out_masks):
        return [NONE, out_masks[0]]

    def forward(self, fa, node, ins):
        return [ins[1]]

    def forward_masks(self, mctx, node, eqn, in_masks):
        return [in_masks[1]]


#: ``(mask, x)`` to ``x`` or its masked tangent (:mod:`tangent_guard`)
MASKED_PASS_THROUGH = ["tangent_guard", "tangent_mask", "cotangent_guard"]


def register(table):
    table.register(PASS_THROUGH, PassThrough())
    table.register(MASKED_PASS_THROUGH, MaskedPassThrough())
