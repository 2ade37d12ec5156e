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

from collections.abc import Sequence
from typing import Any

from hlo_guard.tf.graph import is_inexact
from hlo_guard.tf.mask_ops import ALGEBRA
from passes.lattice import LIVE, NO_DERIVATIVE, Level, Liveness, join_all, merge_origins
from passes.masks import ALL
from passes.masks import or_all as passes_or_all
from passes.rules import Rule, dropping, joined  # noqa: F401  (shared helpers, re-exported)


class TFRule(Rule):
    #: True when a partly dead input needs ``SelectV2(mask, x, StopGradient(x))``
    guards = False

    def guards_input(self, analysis, node, index) -> bool:
        if not self.guards:
            return False
        t = analysis.graph.op(node).inputs[index]
        return is_inexact(t.dtype) and t.op.type != "Const"

    def input_masks(self, mctx, node: int, op, out_masks: list[Any]) -> list[Any]:
        raise NotImplementedError(type(self).__name__)

    def item_inputs(self, op):
        return op.inputs

    def item_outputs(self, op):
        return op.outputs

    # -- forward (tangent) half: see passes.rules --------------------------------
    def guards_output(self, analysis, node, index) -> bool:
        """Guard the output when its input tangents are partly structurally
        zero?  Only operations that may multiply such a zero by inf (the
        nonlinear elementwise ones) say yes."""
        return False

    def forward(self, fa, node, ins: Sequence[Liveness]) -> list[Liveness]:
        """Tangent liveness of the outputs; fully live unless a rule knows better."""
        return [LIVE] * len(fa.graph.node_outputs(node))

    def forward_masks(self, mctx, node: int, op, in_masks: list[Any]) -> list[Any]:
        return [ALL] * len(op.outputs)


def or_all(masks):
    """:func:`passes.masks.or_all` in TF's mask algebra."""
    return passes_or_all(ALGEBRA, masks)


def forward_join(fa, node, ins) -> list[Liveness]:
    """A lane's tangent may be non-zero if any input's may (elementwise)."""
    out = join_all(ins).without_partition()
    return [out] * len(fa.graph.node_outputs(node))


def forward_placed(fa, node, ins, indices=None) -> list[Liveness]:
    """Inputs placed side by side (select cases, concat, pad, clip): fully
    live only if every floating input is; a constant among them (a ``Const``
    op has no tangent at all) makes the output partly structurally zero."""
    graph = fa.graph
    inputs = graph.node_inputs(node)
    chosen = range(len(inputs)) if indices is None else indices
    floats = [ins[i] for i in chosen if graph.carries_derivative(inputs[i])]
    n_out = len(graph.node_outputs(node))
    if floats and all(lv.is_live for lv in floats):
        return [LIVE] * n_out
    if not any(lv.reaches_output for lv in floats):
        return [NO_DERIVATIVE] * n_out
    origins: tuple = ()
    for lv in floats:
        if not lv.is_live:
            origins = merge_origins(origins, lv.origins)
    if any(not lv.reaches_output for lv in floats) or not origins:
        origins = merge_origins((graph.origin(node),), origins)
    return [Liveness(Level.PARTIAL, origins)] * n_out


def n_inputs(analysis, node) -> int:
    return len(analysis.graph.node_inputs(node))
