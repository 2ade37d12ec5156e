"""Selecting operations: where lanes die.

Each rule restates the convention of TF's own registered gradient (TF 2.21
``math_grad.py``, ``clip_ops.py``, ``nn_grad.py``), because a lane TF
differentiates must never be marked dead:

* ``SelectV2(c, t, e)``: ``t`` gets the cotangent where ``c``, ``e`` where not
  (``where_v2``, then reduced over broadcast dimensions).  ``Select`` (v1) also
  accepts a rank-1 condition that picks rows.  TF's gradient selects, so no
  guard is needed *at* the select; the guards go on the ops that computed the
  cases.
* ``Maximum(x, y)``: ``x`` where ``x >= y`` (x wins ties), ``y`` where
  ``x < y``; ``Minimum``: ``x`` where ``x <= y``, ``y`` where ``x > y``
  (``_MaximumMinimumGrad``).  Guarded, as in the JAX front end.
* ``ClipByValue(t, lo, hi)``: ``t`` where ``lo <= t <= hi``, ``lo`` where
  ``t < lo``, ``hi`` where ``t > hi`` (``_clip_by_value_grad``, which selects).
* ``Max``/``Min`` reductions: lanes equal to the result, ties share
  (``_MinOrMaxGrad`` multiplies by the indicator -- guarded).
* ``Relu``/``Relu6``: lanes whose output is in ``(0, 6)`` / ``> 0``
  (``ReluGrad``/``Relu6Grad`` read the output).  The CPU kernels multiply by
  the 0/1 indicator, so the input is guarded.

A NaN operand of ``Maximum``/``Minimum`` is what the result holds (both TF's
kernels and XLA propagate it), so its lane is a taken path whose NaN gradient
the guards must not hide (contract 3); TF's ``x >= y`` is false there, so
``x``'s mask also holds where ``x`` is NaN.  A ``Max``/``Min`` reduction
whose result is NaN (TF's CPU kernel propagates; its XLA lowering skips
NaNs) keeps its NaN elements live.  On lanes without a NaN every
mask is TF's condition exactly.  (``ClipByValue``'s ``t`` and the ``y`` of
``Maximum`` get the cotangent on a NaN lane by TF's own rule: negations,
which :func:`hlo_guard.tf.mask_ops.not_` keeps NaN-true.)
"""

from __future__ import annotations

import tensorflow as tf

from hlo_guard.tf import compat
from hlo_guard.tf.mask_ops import and_, broadcast_like, normalize, not_, reduce_to
from hlo_guard.tf.rules.base import TFRule, dropping, forward_join, forward_placed, joined, or_all
from passes.lattice import NO_DERIVATIVE, partial_by
from passes.masks import ALL, NONE


def _pick(cases, chosen_list, out):
    """Tangent mask of a selection: OR over cases of (case chosen AND its
    tangent live), everything at the output's shape."""
    return or_all([and_(c, broadcast_like(m, out)) for c, m in zip(chosen_list, cases)])


def _condition(op, cond: tf.Tensor, out: tf.Tensor) -> tf.Tensor:
    """The condition broadcast to the output (v1 ``Select`` picks rows with a vector)."""
    if op.type == "Select" and cond.shape.rank == 1 and (out.shape.rank or 0) > 1:
        cond = tf.reshape(cond, tf.concat([[-1], tf.ones([out.shape.rank - 1], tf.int32)], 0))
    return broadcast_like(normalize(cond), out)


class Select(TFRule):
    kind = "selection"
    lane_local = "same-shape"

    def transfer(self, analysis, node, outs):
        out = joined(outs)
        if not out.reaches_output:
            return [NO_DERIVATIVE] * 3
        origin = analysis.graph.origin(node)
        case = out.with_origin(origin) if out.is_dead else partial_by(origin, out)
        return [NO_DERIVATIVE, case, case]

    def input_masks(self, mctx, node, op, out_masks):
        out_mask = out_masks[0]
        out = mctx.shaped(op.outputs[0])
        chosen = _condition(op, mctx.value(op.inputs[0]), out)
        t_mask = and_(out_mask, chosen)
        e_mask = and_(out_mask, not_(chosen))
        return [
            NONE,
            reduce_to(t_mask, out, mctx.shaped(op.inputs[1])),
            reduce_to(e_mask, out, mctx.shaped(op.inputs[2])),
        ]

    def forward(self, fa, node, ins):
        return forward_placed(fa, node, ins, indices=[1, 2])

    def forward_masks(self, mctx, node, op, in_masks):
        out = mctx.shaped(op.outputs[0])
        chosen = _condition(op, mctx.value(op.inputs[0]), out)
        return [_pick(in_masks[1:], [chosen, not_(chosen)], out)]


class MaximumMinimum(TFRule):
    kind = "selection"
    lane_local = "same-shape"
    guards = True

    def __init__(self, x_wins):
        self.x_wins = x_wins  # tf.greater_equal for Maximum, tf.less_equal for Minimum

    def transfer(self, analysis, node, outs):
        lv = dropping(analysis, node, joined(outs))
        return [lv, lv]

    def _chosen(self, mctx, op):
        """Per operand, the output lanes where it is live: TF's choice, and
        for ``x`` also where ``x`` is NaN (module docstring)."""
        out = mctx.shaped(op.outputs[0])
        x, y = (mctx.value(t) for t in op.inputs)
        x_wins = normalize(self.x_wins(x, y))
        x_live = or_all([x_wins, normalize(tf.math.is_nan(x))])
        return out, [broadcast_like(x_live, out), broadcast_like(not_(x_wins), out)]

    def input_masks(self, mctx, node, op, out_masks):
        out, chosen = self._chosen(mctx, op)
        return [
            reduce_to(and_(out_masks[0], c), out, mctx.value(t)) for c, t in zip(chosen, op.inputs)
        ]

    def broadcast_operand_mask(self, mctx, node, op, index, out_masks):
        """The mask at the *output* shape, for guarding a broadcast operand."""
        return and_(out_masks[0], self._chosen(mctx, op)[1][index])

    def forward(self, fa, node, ins):
        # TF's derivative selects (x where it wins, ties included): the
        # tangent of a lane is the chosen operand's, and a constant operand
        # has none -- ``sqrt(maximum(x, 0))`` downstream multiplies it by inf
        return forward_placed(fa, node, ins)

    def forward_masks(self, mctx, node, op, in_masks):
        out, chosen = self._chosen(mctx, op)
        return [_pick(in_masks, chosen, out)]


class ClipByValue(TFRule):
    kind = "selection"
    lane_local = "same-shape"

    def transfer(self, analysis, node, outs):
        lv = dropping(analysis, node, joined(outs))
        return [lv, lv, lv]

    def input_masks(self, mctx, node, op, out_masks):
        out = mctx.shaped(op.outputs[0])
        t, lo, hi = (mctx.value(x) for x in op.inputs)
        below = broadcast_like(normalize(tf.less(t, lo)), out)
        above = broadcast_like(normalize(tf.greater(t, hi)), out)
        inside = and_(not_(below), not_(above))
        m = out_masks[0]
        return [
            reduce_to(and_(m, inside), out, t),
            reduce_to(and_(m, below), out, lo),
            reduce_to(and_(m, above), out, hi),
        ]

    def forward(self, fa, node, ins):
        return forward_placed(fa, node, ins)

    def forward_masks(self, mctx, node, op, in_masks):
        out = mctx.shaped(op.outputs[0])
        t, lo, hi = (mctx.value(x) for x in op.inputs)
        below = broadcast_like(normalize(tf.less(t, lo)), out)
        above = broadcast_like(normalize(tf.greater(t, hi)), out)
        inside = and_(not_(below), not_(above))
        return [_pick(in_masks, [inside, below, above], out)]


class ReduceChooser(TFRule):
    """``Max``/``Min``: live where the element equals the reduced result, or
    is a NaN the result holds (module docstring)."""

    kind = "selection"
    guards = True

    @staticmethod
    def _chosen(x, y, kept):
        # a NaN element is the result only where the result is NaN: TF's CPU
        # kernel propagates it, its XLA lowering skips it
        y = tf.reshape(y, kept)
        nan_taken = tf.logical_and(tf.math.is_nan(x), tf.math.is_nan(y))
        return tf.logical_or(tf.equal(x, y), nan_taken)

    def transfer(self, analysis, node, outs):
        return [dropping(analysis, node, joined(outs)), NO_DERIVATIVE]

    def forward_exit(self, analysis, node, index):
        # TF's gradient is ``grad * indicators / count``; forward mode
        # (transposing it) multiplies the tangent of an unchosen lane by 0
        return index == 0

    def input_masks(self, mctx, node, op, out_masks):
        x = mctx.value(op.inputs[0])
        axes = mctx.value(op.inputs[1])
        y = mctx.value(op.outputs[0])
        kept = compat.reduced_shape(tf.shape(x), axes)
        chosen = normalize(self._chosen(x, y, kept))
        out = out_masks[0]
        if out is not ALL and out is not NONE:
            out = tf.broadcast_to(tf.reshape(out, kept), tf.shape(x))
        return [and_(out, chosen), NONE]

    def forward(self, fa, node, ins):
        return forward_join(fa, node, ins[:1])

    def forward_masks(self, mctx, node, op, in_masks):
        """The result's tangent averages the chosen lanes' tangents."""
        m = in_masks[0]
        if m is ALL or m is NONE:
            return [m]
        x = mctx.value(op.inputs[0])
        y = mctx.value(op.outputs[0])
        axes = mctx.value(op.inputs[1])
        kept = compat.reduced_shape(tf.shape(x), axes)
        chosen = self._chosen(x, y, kept)
        live = tf.reduce_any(
            tf.logical_and(m, chosen), axis=axes, keepdims=op.get_attr("keep_dims")
        )
        return [normalize(live)]


class Relu(TFRule):
    kind = "selection"
    lane_local = True
    guards = True

    def __init__(self, upper=None):
        self.upper = upper

    def transfer(self, analysis, node, outs):
        return [dropping(analysis, node, joined(outs))]

    def input_masks(self, mctx, node, op, out_masks):
        y = mctx.value(op.outputs[0])
        chosen = tf.greater(y, tf.zeros([], y.dtype))
        if self.upper is not None:
            chosen = tf.logical_and(chosen, tf.less(y, tf.cast(self.upper, y.dtype)))
        return [and_(out_masks[0], normalize(chosen))]

    def forward(self, fa, node, ins):
        if not ins[0].reaches_output:
            return [NO_DERIVATIVE]
        return [partial_by(fa.graph.origin(node), ins[0])]

    def forward_masks(self, mctx, node, op, in_masks):
        y = mctx.value(op.outputs[0])
        chosen = tf.greater(y, tf.zeros([], y.dtype))
        if self.upper is not None:
            chosen = tf.logical_and(chosen, tf.less(y, tf.cast(self.upper, y.dtype)))
        return [and_(in_masks[0], normalize(chosen))]


def register(table):
    table.register(["SelectV2", "Select"], Select())
    table.register("Maximum", MaximumMinimum(tf.greater_equal))
    table.register("Minimum", MaximumMinimum(tf.less_equal))
    table.register("ClipByValue", ClipByValue())
    table.register(["Max", "Min"], ReduceChooser())
    table.register("Relu", Relu())
    table.register("Relu6", Relu(6))
