"""Structural operations: lanes move, merge or are dropped.

For every operation here TF's derivative is a linear map with 0/1 (or
positive) coefficients -- gather, slices, concat, stack, reshape, transpose,
broadcast, tile, pad, sums and means -- or becomes one when the other operand
of a bilinear operation (``Conv2D``; ``MatMul``/``BatchMatMul*`` and ``Einsum`` have their
own rule, below) is replaced by ones.  So one generic rule serves them all:
build a *probe* copy of the operation whose differentiable inputs are zeros, and ask TF's own registered
gradient (``tf.gradients``) what it sends back for the 0/1 output mask; an
input lane is live iff that is non-zero.  Because it *is* TF's gradient, the
mask follows TF's conventions (negative strides, out-of-range gather indices,
duplicate indices) without restating them, and it works for dynamic shapes.

Reshape-like operations keep a cheaper boolean reshape/transpose, and
matrix products a boolean reduce-and-broadcast (:class:`MatMul`): probing them
would cost a matmul as large as the program's own (``Einsum`` and the
convolutions likewise: :mod:`hlo_guard.tf.rules.products`).  A gather along its first
axis after the batch dimensions (a table lookup, a cross-entropy's label pick)
sends its mask by a segment max with its gradient's own flattening
(:func:`gathered_lane_masks`): the batched gradient is some hundred ops,
built again for every guarded program.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

import passes.rules as passes_rules
from hlo_guard.tf import compat
from hlo_guard.tf import mask_broadcasts as mb
from hlo_guard.tf.graph import is_inexact
from hlo_guard.tf.mask_ops import (
    is_sentinel,
    materialize,
    normalize,
    reduce_to_shape,
    shape_of,
    to_float,
)
from hlo_guard.tf.opcopy import copy_op
from hlo_guard.tf.rules.base import TFRule, forward_placed, joined
from passes.lattice import LIVE, partial_by
from passes.masks import ALL, NONE
from passes.tangent_gaps import is_partly_zero, note_unfollowed


def _never(op, i):
    return False


def _always(op, i):
    return True


class Structural(passes_rules.StructuralTransfer, TFRule):
    """A lane of an input is live if any live output lane reads it.

    ``drops(op, i)`` says whether input ``i`` can have lanes no output reads
    (a slice, a gather, the padding constant); only then does a fully live
    output make the input partly dead.

    ``probe_type`` names a linear stand-in whose gradient has the same lane
    structure (``Prod`` probed as ``Sum``); a dict maps op type to stand-in.
    ``real_values`` probes with the operation's actual inputs instead of
    zeros: for a choosing reduction (``SegmentMax``) the lanes that reach the
    output depend on the values, and TF's gradient reads them.
    """

    kind = "structural"

    def __init__(
        self,
        drops: Callable = _never,
        *,
        guards: bool = False,
        bilinear: bool = False,
        probe_type=None,
        real_values: bool = False,
        creates: bool = False,
    ):
        self.drops = drops
        #: output lanes no input reaches (padding, unscattered lanes, empty
        #: segments) hold a constant: their tangent is structurally zero
        self.creates = creates
        self.guards = guards
        self.bilinear = bilinear
        self.probe_type = probe_type  # e.g. Prod probed as Sum
        self.real_values = real_values

    def node_item(self, analysis, node):
        return analysis.graph.op(node)

    def differentiable_input(self, analysis, node, index):
        return is_inexact(analysis.graph.op(node).inputs[index].dtype)

    def input_masks(self, mctx, node, op, out_masks):
        probe_type = self.probe_type
        if isinstance(probe_type, dict):
            probe_type = probe_type[op.type]
        return probe_masks(
            mctx,
            op,
            out_masks,
            bilinear=self.bilinear,
            probe_type=probe_type,
            real_values=self.real_values,
        )

    def forward(self, fa, node, ins):
        op = fa.graph.op(node)
        if any(t.dtype == tf.resource for t in op.inputs):
            return [LIVE] * len(op.outputs)  # reads a variable: its tangent is unknown here
        placed = forward_placed(fa, node, ins)
        if self.creates and placed[0].reaches_output:
            return [partial_by(fa.graph.origin(node), placed[0])] * len(op.outputs)
        return placed

    def forward_masks(self, mctx, node, op, in_masks):
        probe_type = self.probe_type
        if isinstance(probe_type, dict):
            probe_type = probe_type[op.type]
        return probe_forward_masks(
            mctx,
            op,
            in_masks,
            bilinear=self.bilinear,
            probe_type=probe_type,
            real_values=self.real_values,
            creates=self.creates,
        )


def _probe_inputs(mctx, op, real_values: bool) -> list:
    """What a probe copy is built from: the values of the inputs it keeps
    (indices, axes; every input with ``real_values``), the mere shapes of the
    float inputs it replaces by zeros or ones (no edge into the program, see
    ``Builder.shaped``)."""
    return [
        mctx.value(t) if real_values or not is_inexact(t.dtype) else mctx.shaped(t)
        for t in op.inputs
    ]


def _filled(like, value) -> tf.Tensor:
    return tf.fill(shape_of(like), tf.constant(value, like.dtype))


def probe_masks(mctx, op, out_masks, *, bilinear=False, probe_type=None, real_values=False) -> list:
    diff = [i for i, t in enumerate(op.inputs) if is_inexact(t.dtype)]
    n = len(op.inputs)
    if not diff or all(m is NONE for m in out_masks):
        return [NONE] * n
    vals = _probe_inputs(mctx, op, real_values)
    outs_v = [mctx.shaped(t) for t in op.outputs]
    found = {}
    groups = [[i] for i in diff] if bilinear else [diff]
    with tf.name_scope("hlo_guard_probe"):
        for group in groups:
            args = list(vals)
            zeros = {}
            for i in diff:
                if i in group:
                    zeros[i] = args[i] = (
                        tf.identity(vals[i]) if real_values else _filled(vals[i], 0)
                    )
                elif bilinear:
                    args[i] = _filled(vals[i], 1)
                else:
                    zeros[i] = args[i] = _filled(vals[i], 0)
            probe = copy_op(op, args, op_type=probe_type)
            ys, seeds = [], []
            for t, v, m in zip(probe.outputs, outs_v, out_masks):
                if is_inexact(t.dtype) and m is not NONE:
                    ys.append(t)
                    seeds.append(to_float(m, v))
            if not ys:
                continue
            grads = tf.gradients(ys, [zeros[i] for i in group], grad_ys=seeds)
            for i, g in zip(group, grads):
                if g is None:
                    found[i] = NONE
                else:
                    g = tf.convert_to_tensor(g)
                    found[i] = normalize(tf.not_equal(g, tf.zeros([], g.dtype)))
    return [found.get(i, NONE) for i in range(n)]


def probe_forward_masks(
    mctx, op, in_masks, *, bilinear=False, probe_type=None, real_values=False, creates=False
) -> list:
    """Output tangent masks by TF's own derivative: the JVP of the probe copy
    (built, as ForwardAccumulator does, by differentiating its VJP with
    respect to the cotangent) applied to the 0/1 input masks; an output lane
    is live iff that is non-zero.  Bilinear operations are probed one operand
    at a time with the other replaced by ones (so sums of 0/1 terms cannot
    cancel)."""
    diff = [i for i, t in enumerate(op.inputs) if is_inexact(t.dtype)]
    n_out = len(op.outputs)
    if all(in_masks[i] is NONE for i in diff):
        return [NONE] * n_out
    if all(in_masks[i] is ALL for i in diff) and not creates:
        return [ALL] * n_out
    vals = _probe_inputs(mctx, op, real_values)
    found: list = [NONE] * n_out
    groups = [[i] for i in diff] if bilinear else [diff]
    with tf.name_scope("hlo_guard_probe"):
        for group in groups:
            if all(in_masks[i] is NONE for i in group):
                continue
            args = list(vals)
            for i in diff:
                if i in group:
                    args[i] = tf.identity(vals[i]) if real_values else _filled(vals[i], 0)
                elif bilinear:
                    args[i] = _filled(vals[i], 1)
                else:
                    args[i] = _filled(vals[i], 0)
            probe = copy_op(op, args, op_type=probe_type)
            outs = [k for k, t in enumerate(probe.outputs) if is_inexact(t.dtype)]
            cots = [tf.zeros_like(probe.outputs[k]) for k in outs]
            vjps = tf.gradients(
                [probe.outputs[k] for k in outs], [args[i] for i in group], grad_ys=cots
            )
            pairs = [
                (g, to_float(in_masks[i], vals[i])) for i, g in zip(group, vjps) if g is not None
            ]
            if not pairs:
                continue
            jvps = tf.gradients(
                [tf.convert_to_tensor(g) for g, _ in pairs], cots, grad_ys=[t for _, t in pairs]
            )
            for k, jv in zip(outs, jvps):
                if jv is None:
                    continue
                live = normalize(tf.not_equal(jv, tf.zeros([], jv.dtype)))
                found[k] = live if found[k] is NONE else tf.logical_or(found[k], live)
    return found


def _probe_matmul_masks(mctx, op, out_masks) -> list:
    """The matmul masks by TF's own gradient with the other operand replaced
    by ones (exact, but a matmul as large as the program's own).  Kept as the
    reference :class:`MatMul` is tested against."""
    return probe_masks(mctx, op, out_masks, bilinear=True)


def _shape_of(mctx, t: tf.Tensor) -> tf.Tensor:
    """The shape of input ``t`` as a 1-D int32 tensor (a constant when known)."""
    return shape_of(mctx.shaped(t))


def matmul_masks(mctx, op, out_masks) -> list:
    """Operand masks of ``MatMul``/``BatchMatMul``/``BatchMatMulV2``/``V3``
    without contracting anything.

    With the other operand replaced by ones, ``out[..., i, j]`` reads
    ``a[..., i, k]`` for every ``k``: lane ``(..., i, k)`` of ``a`` is live
    iff ``any(out_mask[..., i, :])``, whatever ``k``; symmetrically lane
    ``(..., k, j)`` of ``b`` iff ``any(out_mask[..., :, j])``.  A transposed
    (``transpose_a``/``transpose_b``) or adjoint (``adj_x``/``adj_y``;
    conjugation is irrelevant to a mask) operand holds the same lanes with its
    last two dimensions swapped; a batch dimension an operand broadcasts
    (size 1, or missing, in ``BatchMatMulV2``/``V3``) is OR-reduced.  The
    result equals :func:`_probe_matmul_masks`.
    """
    n = len(op.inputs)
    out = out_masks[0]
    diff = [is_inexact(t.dtype) for t in op.inputs[:2]]
    if out is NONE or not any(diff):
        return [NONE] * n
    if out is ALL:
        return [ALL if d else NONE for d in diff] + [NONE] * (n - 2)
    if op.type == "MatMul":
        swap_a, swap_b = op.get_attr("transpose_a"), op.get_attr("transpose_b")
        structured = _matmul_masks_of_broadcast(op, out, diff, swap_a, swap_b)
        if structured is not None:
            return structured + [NONE] * (n - 2)
        batched = False
    else:
        swap_a, swap_b = op.get_attr("adj_x"), op.get_attr("adj_y")
        batched = True
    result = [NONE] * n
    with tf.name_scope("hlo_guard_matmul_mask"):
        # a: [..., M, K] (or [..., K, M]) is read by out row i; b: [..., K, N]
        # (or [..., N, K]) by out column j
        keeps = [
            tf.expand_dims(tf.reduce_any(out, axis=-1), -2 if swap_a else -1),
            tf.expand_dims(tf.reduce_any(out, axis=-2), -1 if swap_b else -2),
        ]
        for i, keep in enumerate(keeps):
            if not diff[i]:
                continue
            t = op.inputs[i]
            static = t.shape
            known = static.is_fully_defined()
            if batched:  # back to the operand's batch shape, the contracting dim 1
                if static.rank is not None and keep.shape.rank is not None:
                    target_static = static[:-2].concatenate(keep.shape[-2:])
                else:
                    target_static = tf.TensorShape(None)
                if target_static.is_fully_defined() and keep.shape.is_fully_defined():
                    target = None  # reduce_to_shape works from the static shapes
                else:
                    target = tf.concat(
                        [_shape_of(mctx, t)[:-2], tf.shape(keep, out_type=tf.int32)[-2:]], 0
                    )
                keep = reduce_to_shape(keep, target, target_static)
            if not (known and keep.shape == static):
                keep = tf.broadcast_to(keep, static.as_list() if known else _shape_of(mctx, t))
            result[i] = normalize(keep)
    return result


def _matmul_masks_of_broadcast(op, out, diff, swap_a, swap_b) -> list | None:
    """:func:`matmul_masks` of a rank-2 ``MatMul`` whose output mask is a
    recorded broadcast, on its source: ``a``'s rows are ``any`` of the output
    rows, ``b``'s columns ``any`` of its columns.  Under a row mask, ``b``'s
    mask is a broadcast of one bit (:func:`mask_broadcasts.is_one_bit`).
    None when a shape is unknown or the output mask is no broadcast."""
    a_shape, b_shape = (mb.static_shape(t) for t in op.inputs[:2])
    if a_shape is None or b_shape is None or not mb.is_recorded(out):
        return None
    # out axis 0 (rows) lands on a's axis 0 (1 when transposed); out axis 1
    # (columns) on b's axis 1 (0 when transposed)
    masks = [
        mb.any_over(out, [1], a_shape, lambda ax: 1 if swap_a else 0),
        mb.any_over(out, [0], b_shape, lambda ax: 0 if swap_b else 1),
    ]
    return [normalize(m) if d else NONE for m, d in zip(masks, diff)]


class MatMul(Structural):
    """``MatMul``/``BatchMatMul*``: a reduce-and-broadcast, no contraction
    (:func:`matmul_masks`)."""

    def __init__(self):
        super().__init__(guards=True, bilinear=True)

    def input_masks(self, mctx, node, op, out_masks):
        return matmul_masks(mctx, op, out_masks)

    def forward(self, fa, node, ins):
        # a product's tangent is t_a b + a t_b: live wherever either operand's is
        out = ins[0].join(ins[1]).without_partition()
        return [out] * len(fa.graph.node_outputs(node))


class ReshapeLike(Structural):
    """Reshape/ExpandDims/Squeeze/Identity-shaped: the mask is reshaped back."""

    lane_local = True

    def input_masks(self, mctx, node, op, out_masks):
        m = out_masks[0]
        masks = [NONE] * len(op.inputs)
        if is_sentinel(m):
            masks[0] = m
            return masks
        shape = mb.static_shape(op.inputs[0])
        found = None if shape is None else mb.reshape(m, shape)
        masks[0] = tf.reshape(m, _shape_of(mctx, op.inputs[0])) if found is None else found
        return masks

    def forward(self, fa, node, ins):
        return [ins[0].without_partition()] * len(fa.graph.node_outputs(node))

    def forward_masks(self, mctx, node, op, in_masks):
        m = in_masks[0]
        return [m if is_sentinel(m) else tf.reshape(m, _shape_of(mctx, op.outputs[0]))]


def _static_axes(mctx, op, rank: int) -> list[int] | None:
    """A reduction's axes, non-negative, when known at trace time."""
    axes = tf.get_static_value(mctx.value(op.inputs[1]))
    if axes is None:
        return None
    return sorted({int(a) % rank for a in np.atleast_1d(axes)}) if rank else []


def _summed_lanes(mctx, op, m):
    """The summed operand's mask as a broadcast of the result's source
    (:mod:`mask_broadcasts`): a row mask stays ``[B]`` however wide the rows
    it sums; None when a shape or the axes are unknown."""
    x_shape = mb.static_shape(op.inputs[0])
    found = mb.source_of(m)
    if x_shape is None or found is None:
        return None
    axes = _static_axes(mctx, op, len(x_shape))
    if axes is None:
        return None
    source, dims = found
    if op.get_attr("keep_dims"):
        placed = list(dims)  # reduced axes are size 1 in the result: never in dims
    else:
        kept_axes = [a for a in range(len(x_shape)) if a not in axes]
        placed = [kept_axes[k] for k in dims]
    return mb.emit(source, x_shape, placed)


class Summing(Structural):
    """``Sum``/``Mean``: a summed lane is live iff its result lane is.  The
    output mask is reshaped to the kept shape and broadcast back -- the same
    answer as probing TF's gradient of the sum, without building a gradient
    graph per mask (which cost most of a first call's guard time).  Lane-local:
    a sum's transpose sends each result lane's cotangent only to the lanes it
    summed, which are dead whenever it is."""

    lane_local = True

    def input_masks(self, mctx, node, op, out_masks):
        m = out_masks[0]
        if is_sentinel(m):
            return [m, NONE]
        structured = _summed_lanes(mctx, op, m)
        if structured is not None:
            return [normalize(structured), NONE]
        x_shape = _shape_of(mctx, op.inputs[0])
        kept = compat.reduced_shape(x_shape, mctx.value(op.inputs[1]))
        return [normalize(tf.broadcast_to(tf.reshape(m, kept), x_shape)), NONE]

    def forward_masks(self, mctx, node, op, in_masks):
        m = in_masks[0]
        if is_sentinel(m):
            return [m]
        keep = op.get_attr("keep_dims")
        return [normalize(tf.reduce_any(m, axis=mctx.value(op.inputs[1]), keepdims=keep))]


class Transpose(Structural):
    lane_local = True

    def input_masks(self, mctx, node, op, out_masks):
        m = out_masks[0]
        if is_sentinel(m):
            return [m, NONE]
        perm = mctx.value(op.inputs[1])
        return [tf.transpose(m, tf.math.invert_permutation(perm)), NONE]

    def forward(self, fa, node, ins):
        return [ins[0].without_partition()]

    def forward_masks(self, mctx, node, op, in_masks):
        m = in_masks[0]
        return [m if is_sentinel(m) else tf.transpose(m, mctx.value(op.inputs[1]))]


def _static_gather_axes(op) -> tuple[int, int] | None:
    """``(axis, batch_dims)`` of a ``GatherV2``, non-negative, when both and
    the operands' ranks are known at trace time."""
    params, indices, axis_t = op.inputs[:3]
    axis = tf.get_static_value(axis_t)
    p_rank, i_rank = params.shape.rank, indices.shape.rank
    if axis is None or p_rank is None or i_rank is None:
        return None
    axis, batch_dims = int(axis), op.get_attr("batch_dims")
    axis = axis + p_rank if axis < 0 else axis
    batch_dims = batch_dims + i_rank if batch_dims < 0 else batch_dims
    return axis, batch_dims


def gathered_lane_masks(mctx, op, out_masks) -> list | None:
    """Operand masks of a ``GatherV2`` along its first axis after the batch
    dimensions (``tf.gather(table, ids)``; ``tf.gather(logits, labels,
    axis=1, batch_dims=1)`` of a cross-entropy) without building TF's
    gradient: the output mask, sent to the lanes TF's gradient sends the
    cotangent to, by the same flattening (``array_grad._BatchGatherGrad``:
    batch row ``r`` of index ``j`` is segment ``r * N + j`` of the flattened
    batch-and-gathered axes) and a segment *max* for its segment sum.  So an
    index outside ``[0, N)`` lands where the gradient puts it (under XLA the
    lane of a neighbouring row, or nowhere), without restating where.  The
    probe of :func:`probe_masks` builds that gradient from about a hundred
    ops for the batched case, per guarded build (a tenth of the MLP's first
    call); this is a dozen.  None for a gather along a later axis (TF's
    gradient transposes; the probe serves it)."""
    params, indices = op.inputs[:2]
    if op.type != "GatherV2" or not is_inexact(params.dtype):
        return None
    axes = _static_gather_axes(op)
    if axes is None or axes[0] != axes[1]:
        return None
    batch_dims = axes[1]
    out = out_masks[0]
    if out is NONE:
        return [NONE] * len(op.inputs)
    with tf.name_scope("hlo_guard_gather_mask"):
        idx = mctx.value(indices)
        shape = _shape_of(mctx, params)
        lanes = shape[batch_dims]
        rows = tf.reduce_prod(shape[:batch_dims])  # 1 without batch dims
        # the batch row's offset, broadcast over the index's own axes
        offsets = tf.reshape(
            tf.range(rows) * lanes,
            tf.concat([shape[:batch_dims], [1] * (indices.shape.rank - batch_dims)], 0),
        )
        ids = tf.reshape(idx + tf.cast(offsets, idx.dtype), [-1])
        seen = tf.cast(materialize(out, mctx.shaped(op.outputs[0])), tf.int32)
        seen = tf.reshape(seen, tf.concat([[-1], shape[batch_dims + 1 :]], 0))
        reached = tf.math.unsorted_segment_max(seen, ids, rows * lanes)
        mask = tf.reshape(tf.greater(reached, 0), shape)
    return [normalize(mask)] + [NONE] * (len(op.inputs) - 1)


class BatchedGather(Structural):
    """``GatherV2``, probed like every gather; with ``batch_dims`` (the
    ``tf.gather(logits, labels, axis=1, batch_dims=1)`` of a cross-entropy) it
    also records that the operand's mask lies within the rows its output mask
    marks: an output lane of batch row ``b`` reads only operand lanes of row
    ``b``.  The cross-entropy ORs that mask with the row mask ``logsumexp``
    gives the same logits; knowing it lies within, the OR is the row mask and
    the scatter is never used (:func:`mask_broadcasts.within`)."""

    def input_masks(self, mctx, node, op, out_masks):
        masks = gathered_lane_masks(mctx, op, out_masks)
        if masks is None:
            masks = super().input_masks(mctx, node, op, out_masks)
        batch_dims = op.get_attr("batch_dims")
        found = mb.source_of(out_masks[0])
        if batch_dims > 0 and found is not None and all(ax < batch_dims for ax in found[1]):
            mb.record_within(masks[0], *found)
        return masks


class Conservative(passes_rules.Conservative, TFRule):
    """Known but not followed: inputs fully live, and the report says why.

    Dead lanes arrive not only through a partly live output but also through
    an *unused* one: ``tf.dynamic_partition(x, p, 2)[1]`` drops the lanes of
    partition 0, and a ``tf.cond`` output nobody reads leaves whatever its
    branches computed for it dead.  Both are reported (a loop output that the
    body passes through unchanged -- a loop invariant -- drops nothing)."""

    def drops_through_unused_output(self, analysis, node, outs):
        if _drops_through_unused_output(analysis, node, outs):
            analysis.note_unreached(
                node,
                self.reason + "; some of its outputs are unused, so the lanes that "
                "reach only them are dead",
                partial_by(analysis.graph.origin(node)),
            )

    def forward(self, fa, node, ins):
        """Outputs fully live (never hides a NaN), but a partly structurally
        zero tangent arriving here is lost: noted, so that a singular op
        downstream is reported instead of called clean."""
        graph = fa.graph
        if any(
            is_partly_zero(lv)
            for v, lv in zip(graph.node_inputs(node), ins)
            if graph.carries_derivative(v)
        ):
            note_unfollowed(
                fa,
                node,
                f"'{graph.op_name(node)}' "
                f"'{graph.user_name(graph.op(node).name)}' (not followed in "
                "forward mode: a partly structurally zero tangent enters it and "
                "its outputs are taken as fully live)",
            )
        return [LIVE] * len(graph.node_outputs(node))


class Unknown(Conservative):
    """The fallback for op types without a rule (see :class:`TFRuleTable`).

    Fully live is conservative only for the lanes that arrive; the op may kill
    lanes itself (``MatrixBandPart`` zeroes a triangle, ``SparseReduceSum``
    reads only the stored values), and nothing here can tell.  So it is
    always reported when a derivative flows through it, as the contract asks
    ("the report says so") -- never called clean."""

    def __init__(self):
        super().__init__("")

    def transfer(self, analysis, node, outs):
        name = analysis.graph.op_name(node)
        out = joined(outs)
        op = analysis.graph.op(node)
        if out.is_live and any(is_inexact(t.dtype) for t in op.inputs):
            analysis.note_unreached(
                node,
                f"no rule for primitive '{name}': treated as fully live; lanes it "
                "drops itself are not guarded",
                partial_by(analysis.graph.origin(node)),
            )
            return [LIVE] * len(op.inputs)
        self.reason = f"no rule for primitive '{name}'"
        return super().transfer(analysis, node, outs)

    def forward(self, fa, node, ins):
        """No rule: the op may zero lanes itself (``MatrixBandPart``)."""
        graph = fa.graph
        note_unfollowed(
            fa,
            node,
            f"'{graph.op_name(node)}' "
            f"'{graph.user_name(graph.op(node).name)}' (no rule: forward mode "
            "takes its outputs as fully live; lanes it zeroes itself are not known)",
        )
        return [LIVE] * len(graph.node_outputs(node))


def _drops_through_unused_output(analysis, node, outs) -> bool:
    graph = analysis.graph
    op = graph.op(node)
    for k, (_v, lv) in enumerate(zip(graph.node_outputs(node), outs)):
        if lv.reaches_output or not is_inexact(op.outputs[k].dtype):
            continue
        if op.type in ("While", "StatelessWhile") and _loop_invariant(op, k):
            continue
        if op.type in ("If", "StatelessIf", "Case", "StatelessCase"):
            continue  # branches are analysed with their unused outputs dead
            # (hlo_guard.tf.control); what the branch computes for them is cut
        return True
    return False


def _loop_invariant(op, k: int) -> bool:
    """Whether the loop body returns its input ``k`` unchanged as output ``k``."""
    try:
        fdef = compat.function_def(op.graph, op.get_attr("body").name)
    except Exception:  # pragma: no cover - body not found: not provably invariant
        return False
    sig = fdef.signature
    if k >= len(sig.input_arg) or k >= len(sig.output_arg):
        return False
    ref = fdef.ret.get(sig.output_arg[k].name, "")
    nodes = {n.name: n for n in fdef.node_def}
    for _ in range(len(nodes) + 1):
        if ref == sig.input_arg[k].name:
            return True
        node = nodes.get(ref.split(":")[0])
        if node is None or node.op != "Identity" or not node.input:
            return False
        ref = node.input[0]
    return False


def _padv2_drops(op, i):
    return i == 2  # the constant value reaches only the padding lanes


def _first_input_drops(op, i):
    return i == 0


def _scatter_update_drops(op, i):
    return True  # overwritten operand lanes; updates may collide


def register(table):
    table.register(["Reshape", "ExpandDims", "Squeeze"], ReshapeLike())
    table.register("Transpose", Transpose())
    table.register(["Sum", "Mean"], Summing())
    same = Structural()
    table.register(
        [
            "ConcatV2",
            "Concat",
            "Pack",
            "BroadcastTo",
            "Tile",
            "MirrorPad",
            "Reverse",
            "ReverseV2",
            "Cumsum",
            "BiasAdd",
            "BiasAddV1",
            "Fill",
            "Roll",
            "TensorScatterAdd",
            "MatrixDiagV3",
            "MatrixDiagPart",
            "MatrixDiagPartV3",
            "SpaceToDepth",
            "DepthToSpace",
            "Unpack",
            "Split",
            "SplitV",
            "ReverseSequence",
        ],
        same,
    )
    table.register(
        ["Gather", "GatherNd", "StridedSlice", "Slice", "ResourceGather"], Structural(_always)
    )
    table.register("GatherV2", BatchedGather(_always))
    table.register(["Pad", "ScatterNd", "MatrixDiag"], Structural(creates=True))
    table.register("PadV2", Structural(_padv2_drops))
    # segment reductions drop the lanes whose id is negative or >= num_segments
    # (unsorted) or that no index selects (sparse); TF's gradient gathers them
    # back with ``_GatherDropNegatives``, so the probe sees exactly those lanes
    segment_sums = [
        "UnsortedSegmentSum",
        "SegmentSum",
        "SegmentSumV2",
        "SegmentMean",
        "SparseSegmentSum",
        "SparseSegmentMean",
        "SparseSegmentSqrtN",
        "SparseSegmentSumWithNumSegments",
        "SparseSegmentMeanWithNumSegments",
        "SparseSegmentSqrtNWithNumSegments",
    ]
    table.register(segment_sums, Structural(_first_input_drops, creates=True))
    table.register(
        ["UnsortedSegmentProd", "SegmentProd", "SegmentProdV2"],
        Structural(
            _first_input_drops,
            guards=True,
            creates=True,
            probe_type={
                "UnsortedSegmentProd": "UnsortedSegmentSum",
                "SegmentProd": "SegmentSum",
                "SegmentProdV2": "SegmentSumV2",
            },
        ),
    )
    # max/min also drop the lanes that are not the segment's extremum
    table.register(
        [
            "UnsortedSegmentMax",
            "UnsortedSegmentMin",
            "SegmentMax",
            "SegmentMin",
            "SegmentMaxV2",
            "SegmentMinV2",
        ],
        Structural(_first_input_drops, real_values=True, creates=True),
    )
    table.register(["TensorScatterUpdate"], Structural(_scatter_update_drops))
    # nonlinear reductions: the structure of a sum, but the derivative multiplies
    table.register("Prod", Structural(guards=True, probe_type="Sum"))
    table.register("Cumprod", Structural(guards=True, probe_type="Cumsum"))
    # bilinear: the other operand replaced by ones
    table.register(["MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"], MatMul())
    table.register(
        ["Conv1D", "DepthwiseConv2dNative"], Structural(_always, guards=True, bilinear=True)
    )
    # top-k keeps k lanes; which ones depends on the values, so the probe
    # runs on them (TF's gradient scatters into the chosen indices)
    table.register("TopKV2", Structural(_always, real_values=True))
    # max pooling keeps each window's maximum, as top-k does: probed on the
    # values (``MaxPoolGrad`` routes the cotangent to the window's argmax)
    table.register(["MaxPool", "MaxPoolV2", "MaxPool3D"], Structural(_always, real_values=True))
    # average pooling, resizing, and the space/batch shuffles of a dilated
    # convolution: linear with non-negative weights; a window, a stride, a
    # downscale or a crop can leave lanes unread, and the shuffles' padding
    # creates lanes.  Not ``ResizeBicubic``: its kernel has negative lobes, so
    # the probe's sum of weights could cancel to zero on a lane it reads
    # (no rule: conservative, and reported)
    table.register(
        [
            "AvgPool",
            "AvgPool3D",
            "ResizeBilinear",
            "ResizeNearestNeighbor",
            "BatchToSpaceND",
            "BatchToSpace",
        ],
        Structural(_always),
    )
    table.register(["SpaceToBatchND", "SpaceToBatch"], Structural(_always, creates=True))
    # a transposed convolution (Keras Conv2DTranspose): bilinear in the filter
    # and the image, probed like a convolution, each operand against ones
    table.register(
        ["Conv2DBackpropInput", "Conv3DBackpropInputV2"],
        Structural(_always, guards=True, bilinear=True),
    )
    # lanes mix nonlinearly along an axis: not followed (row and matrix
    # mixing that *is* followed: :mod:`hlo_guard.tf.rules.mixing`)
    for name in [
        "Sort",
        "FusedBatchNormV3",
        "FusedBatchNorm",
    ]:
        table.register(name, Conservative(f"{name}: lanes mix nonlinearly; inputs kept fully live"))
    # If/Case/While: hlo_guard.tf.rules.control_flow (forward mode reads their bodies)
    # TensorList (TensorArray, map_fn, autograph loops): its lanes live in a
    # variant handle; dead lanes arriving here are not followed into the list
    # (and so not across the loop boundary that carries it)
    tensor_list = (
        "'{}': dead lanes are not followed into a TensorList (TensorArray, "
        "map_fn, loop accumulators); what produced the list is kept fully live"
    )
    for name in [
        "TensorListGetItem",
        "TensorListSetItem",
        "TensorListStack",
        "TensorListFromTensor",
        "TensorListGather",
        "TensorListScatter",
        "TensorListScatterV2",
        "TensorListScatterIntoExistingList",
        "TensorListPushBack",
        "TensorListPopBack",
        "TensorListConcatV2",
        "TensorListSplit",
        "TensorListReserve",
    ]:
        table.register(name, Conservative(tensor_list.format(name)))
    opaque = (
        "call '{}' was not inlined; neither its body nor its boundary is "
        "rewritten; its inputs are kept fully live"
    )
    for name in ["PartitionedCall", "StatefulPartitionedCall"]:
        table.register(name, Conservative(opaque.format(name)))
