"""Operations whose lanes mix within a row or a matrix, and nowhere else.

``Softmax``/``LogSoftmax`` and the fused cross-entropies mix the lanes of
one row (the last axis); decompositions, inverses and solves those of one
matrix (the last two axes), batched over the rest.  A row or batch element
none of whose output lanes is live is dead in every lane, and guarded where
it meets live computation; one with a live output lane is live in every
lane.  Forward mode is not followed through them (:class:`_Mixing`).
"""

from __future__ import annotations

import tensorflow as tf

from hlo_guard.tf import mask_broadcasts as mb
from hlo_guard.tf.graph import is_inexact
from hlo_guard.tf.mask_ops import is_sentinel, normalize
from hlo_guard.tf.rules.base import joined
from hlo_guard.tf.rules.structural import Conservative, Structural, _shape_of
from passes.lattice import NO_DERIVATIVE, partial_by
from passes.masks import ALL, NONE


def _rows_of(mctx, m, like: tf.Tensor):
    """``m`` ORed along its last axis and spread back over it, at ``like``'s
    shape: a row is live in every lane iff it is live in one.  A recorded
    broadcast stays one (:func:`mask_broadcasts.any_over`)."""
    if is_sentinel(m):
        return m
    shape = mb.static_shape(like)
    if shape is not None:
        found = mb.any_over(m, [len(shape) - 1], shape, lambda ax: ax)
        if found is not None:
            return normalize(found)
    with tf.name_scope("hlo_guard_row_mask"):
        row = tf.reduce_any(m, axis=-1, keepdims=True)
        return normalize(tf.broadcast_to(row, _shape_of(mctx, like)))


class _Mixing(Structural):
    """What the row and matrix rules share: guarded (the derivative reads the
    values), and forward mode not followed lane by lane -- a lane whose
    softmax weight is 0 (a ``-inf`` logit, the masked attention's) has an
    exactly zero tangent that the input tangents' masks do not show, and a
    Cholesky factor's upper triangle has one whatever comes in.  Outputs
    fully live, and a partly zero tangent arriving is noted, as for an op
    without a rule (:meth:`Conservative.forward`, which reads only the
    graph)."""

    forward = Conservative.forward

    def __init__(self):
        super().__init__(guards=True)

    def forward_masks(self, mctx, node, op, in_masks):
        return [ALL] * len(op.outputs)

    @staticmethod
    def _from_reached_outputs(analysis, node, outs):
        """``(op, joined liveness of the outputs that reach the result)`` --
        an unused output drops no lane, as every input lane feeds every
        output -- and None for the liveness when no output is used."""
        op = analysis.graph.op(node)
        reached = [o for o in outs if o.reaches_output]
        return op, (joined(reached).without_partition() if reached else None)

    @staticmethod
    def _to_inputs(op, out) -> list:
        """``out`` for each differentiable input (nothing when it is None)."""
        return [
            out if out is not None and is_inexact(t.dtype) else NO_DERIVATIVE for t in op.inputs
        ]


class RowMixing(_Mixing):
    """``Softmax``/``LogSoftmax``: every lane of a row feeds every output lane
    of that row (``y (ct - sum(ct y))``), and no other row.  A row with one
    live output lane is live in every input lane; a dead row stays dead, and
    its NaN (the softmax of a row of ``-inf``) is discarded where the row
    meets live computation (:class:`_Mixing`)."""

    def input_masks(self, mctx, node, op, out_masks):
        return [_rows_of(mctx, out_masks[0], op.inputs[0])]


class CrossEntropy(_Mixing):
    """``SoftmaxCrossEntropyWithLogits``/``SparseSoftmaxCrossEntropyWithLogits``
    (Keras's categorical cross-entropies from logits): ``loss[b]`` and
    ``backprop[b, :]`` read the logits (and dense labels) of row ``b`` only,
    every lane of it.  So a logits row is live iff its loss lane or any lane
    of its backprop row is: a padded token's row dead under
    ``where(valid, loss, 0)``.  Guarded: the derivative is ``softmax -
    labels``, a NaN where the logits hold ``-inf`` (:class:`_Mixing`)."""

    def transfer(self, analysis, node, outs):
        """As a structural rule, except that an unused ``backprop`` output
        (the usual case: TF's gradient reads it, the user does not) drops no
        lane -- every logit also feeds the loss."""
        op, out = self._from_reached_outputs(analysis, node, outs)
        return self._to_inputs(op, out)

    @staticmethod
    def _row_mask(mctx, op, loss_mask, backprop_mask):
        """The ``[B, C]`` mask of rows whose loss or backprop lanes are live."""
        logits = op.inputs[0]
        if loss_mask is ALL or backprop_mask is ALL:
            return ALL
        rows = _rows_of(mctx, backprop_mask, logits)
        if loss_mask is NONE:
            return rows
        with tf.name_scope("hlo_guard_row_mask"):
            spread = tf.broadcast_to(tf.expand_dims(loss_mask, -1), _shape_of(mctx, logits))
            return normalize(spread if rows is NONE else tf.logical_or(spread, rows))

    def input_masks(self, mctx, node, op, out_masks):
        row = self._row_mask(mctx, op, *out_masks[:2])
        return [row if is_inexact(t.dtype) else NONE for t in op.inputs]


class MatrixMixing(_Mixing):
    """Decompositions, inverses, determinants and solves over the last two
    axes, batched over the rest (``Cholesky``, ``MatrixInverse``, ``Svd``,
    ``SelfAdjointEigV2`` ...), as the JAX rule
    (``hlo_guard/jax_frontend/rules/linalg.py``): a batch element none of
    whose output lanes is live is dead in every lane, and its NaN (a matrix
    that is not positive definite, a singular one) is discarded where it meets
    live computation; a matrix with one live output lane is kept live in
    every lane.  Lanes within a matrix are not followed, so the site is
    reported whenever a derivative flows through it (:class:`_Mixing`)."""

    def transfer(self, analysis, node, outs):
        op, out = self._from_reached_outputs(analysis, node, outs)
        if out is not None:
            analysis.note_unreached(
                node,
                f"{op.type}: lanes within one matrix are not followed (kept live); only a "
                "wholly dead batch element is guarded",
                partial_by(analysis.graph.origin(node)) if out.is_live else out,
            )
        return self._to_inputs(op, out)

    def input_masks(self, mctx, node, op, out_masks):
        batch_rank = op.inputs[0].shape.rank
        shapes = [t.shape for t in op.inputs]
        if batch_rank is None or any(
            sh.rank is None or sh[:-2] != shapes[0][:-2] or not sh[:-2].is_fully_defined()
            for sh in shapes
        ):
            return [ALL if is_inexact(t.dtype) else NONE for t in op.inputs]  # broadcast batch
        batch_rank -= 2
        batch = NONE
        with tf.name_scope("hlo_guard_matrix_mask"):
            for t, m in zip(op.outputs, out_masks):
                if m is NONE or not is_inexact(t.dtype):
                    continue
                if m is ALL:
                    batch = ALL
                    break
                axes = list(range(batch_rank, t.shape.rank))
                reduced = tf.reduce_any(m, axis=axes) if axes else m
                batch = reduced if batch is NONE else tf.logical_or(batch, reduced)
            masks = []
            for t in op.inputs:
                if not is_inexact(t.dtype) or batch is NONE or batch is ALL:
                    masks.append(batch if is_inexact(t.dtype) else NONE)
                    continue
                spread = tf.reshape(batch, tf.concat([tf.shape(batch), [1, 1]], 0))
                masks.append(normalize(tf.broadcast_to(spread, _shape_of(mctx, t))))
        return masks


def register(table):
    # lanes mix within a row (the last axis) and nowhere else
    table.register(["Softmax", "LogSoftmax"], RowMixing())
    table.register(
        ["SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits"], CrossEntropy()
    )
    # ... and within a matrix (the last two axes), batched over the rest
    table.register(
        [
            "Cholesky",
            "MatrixInverse",
            "MatrixDeterminant",
            "LogMatrixDeterminant",
            "MatrixSolve",
            "Svd",
            "Qr",
            "SelfAdjointEigV2",
        ],
        MatrixMixing(),
    )
