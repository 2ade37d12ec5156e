"""Common shape of a TF rule: static transfer plus a per-lane mask function.

``transfer`` and ``guards_input`` are what :mod:`passes` needs.
``input_masks(mctx, node, op, out_masks)`` turns the masks of an operation's
outputs into one mask per input, in TF ops inside the guarded wrapper.  It
reads original values through ``mctx.value(tensor)``, which returns a
gradient-stopped tensor holding the value the user's program computes (the
imported tensor itself, or a shadow copy when reading the imported one would
make the graph cyclic).
"""
from __future__ import annotations

from typing import Any, List, Sequence

from passes.lattice import NO_DERIVATIVE, Liveness, dropped_by, join_all, partial_by
from passes.masks import NONE, or_masks
from passes.masks import or_all as passes_or_all
from passes.rules import Rule

from hlo_guard.tf.graph import is_inexact
from hlo_guard.tf.mask_ops import ALGEBRA


class TFRule(Rule):
    #: True when a partly dead input needs ``SelectV2(mask, x, StopGradient(x))``
    guards = False

    def guards_input(self, analysis, node, index) -> bool:
        if not self.guards:
            return False
        t = analysis.graph.op(node).inputs[index]
        return is_inexact(t.dtype) and t.op.type != "Const"

    def input_masks(self, mctx, node: int, op, out_masks: List[Any]) -> List[Any]:
        raise NotImplementedError(type(self).__name__)


def joined(outs: Sequence[Liveness]) -> Liveness:
    return join_all(outs)


def or_all(masks):
    return passes_or_all(ALGEBRA, masks)


def dropping(analysis, node, out: Liveness) -> Liveness:
    """The liveness of an input some of whose lanes ``node`` drops."""
    return dropped_by(analysis.graph.origin(node), out)


def n_inputs(analysis, node) -> int:
    return len(analysis.graph.node_inputs(node))
