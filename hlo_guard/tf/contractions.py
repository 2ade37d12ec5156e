"""Contractions whose derivative must not read a dead lane's value.

A select guard fixes a *cotangent*; it cannot change the *value* a
contraction's gradient multiplies by.  In ``tf.where(rows, (1 / d) @ W, 0)``
the padded row of ``h = 1 / d`` is inf, and TF's ``MatMul`` gradient
``dW = h^T dz`` adds ``inf * 0`` into every lane of ``W``'s gradient even
with every boundary guard in place.  So a bilinear op (``MatMul``,
``BatchMatMul*``, ``Einsum``, convolutions) with a partly dead operand gets a
gradient that reads, for each operand's term, the *other* operands with their
dead lanes (their use masks) zeroed -- TF's own registered gradient, taken of
a twin of the op whose inputs are the masked operands.  The forward program is
a copy of the op on its own inputs, bitwise the original.

The JAX front end does the same inside a ``custom_jvp``
(``guarded_binding.bind_with_contraction_guards``).  Exact for rows (or
columns) dead in every output lane they feed, which is what padding and row
masks make; a lane live in some output lanes keeps its value, as the live
ones need it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from hlo_guard.tf.graph import TFGraph
from hlo_guard.tf.opcopy import copy_op
from hlo_guard.tf.rules import RULES
from passes.analysis import Analysis


def guarded_contractions(graph: TFGraph, analysis: Analysis) -> list[int]:
    """Bilinear nodes through which a derivative flows and whose output (or
    an operand's use) is partly dead.  The operand whose dead lanes must be
    zeroed may carry no derivative at all (a ``Const``)."""
    found = []
    for node in range(graph.node_count()):
        rule = RULES.get(graph.op_name(node))
        if not getattr(rule, "bilinear", False):
            continue
        uses = [analysis.use(node, i) for i in range(len(graph.op(node).inputs))]
        if not any(lv.reaches_output for lv in uses):
            continue
        outs = analysis.output_liveness(node)
        if any(lv.reaches_output and not lv.is_live for lv in uses + outs):
            found.append(node)
    return found


def with_masked_gradient(
    op: tf.Operation, inputs: Sequence[tf.Tensor], masks: Mapping[int, tf.Tensor]
) -> list[tf.Tensor]:
    """``op`` re-created on ``inputs``, its gradient TF's own for ``op`` taken
    at the inputs with ``masks``' false lanes zeroed.

    The masks are boolean tensors of their operand's shape.  The masked
    operands are built *inside* the gradient from the operands themselves, so
    a second derivative flows into their live lanes (a hand double where's
    inner ``where`` does the same); forward mode goes through the same
    function (TF derives JVPs from it)."""
    n = len(inputs)
    # the masks are inputs of the custom-gradient function, not tensors its
    # gradient closes over: inside a ``tf.while_loop`` body (a Keras RNN with
    # masking) the gradient is built in the loop's gradient graph, which can
    # read a forward value only through an input of a forward op (TF then
    # accumulates it per iteration); a closed-over mask was "out of scope"
    mask_index = sorted(masks)

    @tf.custom_gradient
    def contraction(*xs_and_masks):
        xs = xs_and_masks[:n]
        given = dict(zip(mask_index, xs_and_masks[n:]))
        out = copy_op(op, xs, name="hlo_guard_contraction").outputs

        def gradient(*dys):
            masked = [
                tf.where(given[i], x, tf.zeros_like(x)) if i in given else x
                for i, x in enumerate(xs)
            ]
            # never run forward: only its gradient (read off its inputs) is used
            twin = copy_op(op, masked, name="hlo_guard_contraction_twin")
            grads = tf.gradients(twin.outputs, masked, grad_ys=list(dys))
            return [tf.zeros_like(x) if g is None else g for x, g in zip(xs, grads)] + [None] * len(
                mask_index
            )

        return (out[0] if len(out) == 1 else out), gradient

    result = contraction(*inputs[:n], *(masks[i] for i in mask_index))
    return list(result) if isinstance(result, (list, tuple)) else [result]
