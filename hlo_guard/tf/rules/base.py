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
from passes.rules import BroadcastOperandRule, Rule, dropping, implements, joined  # noqa: F401  (shared helpers, re-exported)


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

    #: False: lane-mixing (the default, always safe); True: never mixes;
    #: "same-shape": lane-local when every differentiable operand has the
    #: output's shape -- as in the JAX rules, for the boundary placement
    #: (docs/PLACEMENT.md)
    lane_local: bool | str = False

    def keeps_lanes_apart(self, analysis, node) -> bool:
        """Lane-local when the rule class says so and, for ops that broadcast
        implicitly, every operand that carries a derivative has the output's
        static shape.  A shape TF does not know at trace time (a ``None``
        batch dimension) proves nothing -- ``[None]`` may meet ``[1]`` -- so
        the op then counts as lane-mixing: more guards, never a wrong one."""
        if not self.lane_local:
            return False
        if self.lane_local is True:
            return True
        op = analysis.graph.op(node)
        out = op.outputs[0].shape
        if len(op.outputs) != 1 or not out.is_fully_defined():
            return False
        for i, t in enumerate(op.inputs):
            if not analysis.graph.carries_derivative(t.name):
                continue
            if t.op.type == "Const" or not analysis.use(node, i).reaches_output:
                continue  # a constant operand's cotangent is read by no one
            if not t.shape.is_fully_defined() or t.shape != out:
                return False
        return True

    def broadcasts_operand(self, analysis, node, index) -> bool:
        """A differentiable operand whose static shape is not the output's
        (or is not known: it may be broadcast), of an op that guards such
        operands at the output's shape (``Builder._guard_operand``)."""
        if not implements(self, BroadcastOperandRule):
            return False
        op = analysis.graph.op(node)
        t = op.inputs[index]
        if len(op.outputs) != 1 or t.op.type == "Const" or not is_inexact(t.dtype):
            return False
        x, out = t.shape, op.outputs[0].shape
        return not (x.is_fully_defined() and out.is_fully_defined() and x == out)

    def mask_passes_through(self, analysis, node, index) -> bool:
        """An elementwise op hands an operand of the output's (static, fully
        known) shape the output's own mask."""
        if self.kind != "elementwise":
            return False
        op = analysis.graph.op(node)
        if len(op.outputs) != 1:
            return False
        x, out = op.inputs[index].shape, op.outputs[0].shape
        return x.is_fully_defined() and out.is_fully_defined() and x == out

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
