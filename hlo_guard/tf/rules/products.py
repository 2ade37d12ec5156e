"""Products whose operand masks need no product: ``Einsum`` and convolutions.

With every other operand replaced by ones, a bilinear operation's gradient
tells which operand lanes an output mask reaches (the probe of
:func:`structural.probe_masks`), but it costs an operation as large as the
program's own, at run time, for every partly dead operand.  ``Einsum``'s masks
are a reduce-transpose-broadcast of the output mask; a convolution's are
TF's registered gradient of a one-channel copy of the op.  Equations and
layouts outside those (ellipses, diagonals, grouped convolutions) keep the
probe.  (``MatMul`` has its reduce-and-broadcast in :mod:`structural`.)
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from hlo_guard.tf import compat
from hlo_guard.tf import mask_broadcasts as mb
from hlo_guard.tf.graph import is_inexact
from hlo_guard.tf.mask_ops import materialize, normalize, shape_of
from hlo_guard.tf.opcopy import copy_op
from hlo_guard.tf.rules.structural import Structural, _always, _shape_of
from passes.masks import ALL, NONE


def _einsum_labels(op) -> tuple[list[str], str] | None:
    """The operands' and the output's labels of an ``Einsum``, or None when
    the equation has an ellipsis, no explicit output or a label repeated
    within one term (a diagonal: ``ii->i``), which the probe serves."""
    eq = op.get_attr("equation")
    eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    lhs, out = eq.split("->")
    terms = lhs.split(",")
    if len(terms) != len(op.inputs) or any(len(set(t)) != len(t) for t in [*terms, out]):
        return None
    return terms, out


def _relabel(mask, source: str, target: str):
    """``mask``, whose axes carry the labels ``source``, as a mask over the
    labels ``target``, up to broadcasting: ``any`` over the labels ``target``
    lacks, the shared labels transposed into ``target``'s order, a size-1
    axis for each label ``source`` lacks."""
    dropped = [k for k, c in enumerate(source) if c not in target]
    out = tf.reduce_any(mask, axis=dropped) if dropped else mask
    shared = [c for c in source if c in target]  # out's axes
    order = [shared.index(c) for c in target if c in source]
    if order != list(range(len(order))):
        out = tf.transpose(out, order)
    for k, c in enumerate(target):
        if c not in source:
            out = tf.expand_dims(out, k)
    return out


def einsum_masks(mctx, op, out_masks) -> list | None:
    """Operand masks of an ``Einsum`` without contracting anything, as
    :func:`matmul_masks` for a matmul.  With every other operand replaced by
    ones, output lane ``o`` reads every lane of operand ``i`` that agrees with
    ``o`` on their shared labels: lane ``l`` of the operand is live iff
    ``any`` of the output mask over the output's labels the operand lacks, at
    ``l``'s shared labels -- whatever its own contracted labels are.  So:
    reduce, transpose to the operand's label order, broadcast over its
    contracted labels.  A recorded broadcast (a row mask through the
    projections ``btd,dhk->bthk`` of an attention) stays one
    (:func:`mask_broadcasts.any_over`), so a weight's mask is one bit.  The
    probe (TF's gradient against ones) costs an einsum as large as the
    program's own at run time; None for the equations it still serves
    (:func:`_einsum_labels`)."""
    labels = _einsum_labels(op)
    if labels is None:
        return None
    terms, out_labels = labels
    n = len(op.inputs)
    out = out_masks[0]
    diff = [is_inexact(t.dtype) for t in op.inputs]
    if out is NONE or not any(diff):
        return [NONE] * n
    if out is ALL:
        return [ALL if d else NONE for d in diff]
    result = [NONE] * n
    with tf.name_scope("hlo_guard_einsum_mask"):
        for i, term in enumerate(terms):
            if not diff[i]:
                continue
            t = op.inputs[i]
            lacked = [k for k, c in enumerate(out_labels) if c not in term]
            shape = mb.static_shape(t)
            placed = [term.index(c) for c in out_labels if c in term]
            if shape is not None and placed == sorted(placed):
                axis_of = dict(zip((k for k, c in enumerate(out_labels) if c in term), placed))
                found = mb.any_over(out, lacked, shape, axis_of.__getitem__)
                if found is not None:
                    result[i] = normalize(found)
                    continue
            keep = _relabel(out, out_labels, term)
            if not (shape is not None and keep.shape == shape):
                keep = tf.broadcast_to(keep, _shape_of(mctx, t))
            result[i] = normalize(keep)
    return result


def einsum_forward_masks(mctx, op, in_masks) -> list | None:
    """The output tangent mask of an ``Einsum``, the forward counterpart of
    :func:`einsum_masks`: with the other operands replaced by ones, output
    lane ``o`` sums the tangent lanes of operand ``i`` that agree with it on
    their shared labels, so it is live iff ``any`` of operand ``i``'s mask over
    its contracted labels, at ``o``'s shared labels -- ORed over operands.
    None where :func:`_einsum_labels` is."""
    labels = _einsum_labels(op)
    if labels is None:
        return None
    terms, out_labels = labels
    masks = [m for m, t in zip(in_masks, op.inputs) if is_inexact(t.dtype)]
    if all(m is NONE for m in masks):
        return [NONE]
    if any(m is ALL for m in masks):
        return [ALL]  # every output lane reads some lane of that operand
    found = None
    with tf.name_scope("hlo_guard_einsum_mask"):
        for term, m, t in zip(terms, in_masks, op.inputs):
            if not is_inexact(t.dtype) or m is NONE:
                continue
            keep = _relabel(m, term, out_labels)
            found = keep if found is None else tf.logical_or(found, keep)
        assert found is not None  # some operand's mask is a tensor
        out = op.outputs[0]
        if not (out.shape.is_fully_defined() and found.shape == out.shape):
            found = tf.broadcast_to(found, shape_of(mctx.shaped(out)))
    return [normalize(found)]


def _conv_layout(op) -> tuple[int, int] | None:
    """``(rank, channel axis)`` of a ``Conv2D``/``Conv3D`` whose input channels
    equal its filter's (no groups), when both are known at trace time; None
    otherwise.  The filter is ``[spatial..., in, out]`` in every data format."""
    x, w = op.inputs[:2]
    rank = {"Conv2D": 4, "Conv3D": 5}.get(op.type)
    if rank is None or x.shape.rank != rank or w.shape.rank != rank:
        return None
    fmt = op.get_attr("data_format")
    channel = 1 if (fmt.decode() if isinstance(fmt, bytes) else fmt).startswith("NC") else rank - 1
    if x.shape[channel] is None or x.shape[channel] != w.shape[-2]:
        return None
    return rank, channel


def _one_channel(shape: tf.Tensor, axes) -> tf.Tensor:
    """``shape`` (1-D int32) with the given axes set to 1."""
    return tf.stack([1 if k in axes else shape[k] for k in range(int(shape.shape[0]))])


def _spatial_dilations(op, rank: int, channel: int) -> list[int]:
    """The dilation of each spatial axis of a convolution, in the filter's
    order (the attribute lists every axis of the data format)."""
    rates = list(op.get_attr("dilations"))
    return [rates[k] for k in range(1, rank) if k != channel]


def _dilated_taps(taps: list[int], dilations: list[int]) -> np.ndarray:
    """A spatial filter of ones at the taps a dilated filter of ``taps``
    reads and zeros between them: ``(k - 1) * d + 1`` wide on each axis.  An
    undilated convolution with it reads exactly the dilated one's input
    lanes, with the same padding (TF pads by the dilated filter's extent)."""
    pattern = np.zeros([(k - 1) * d + 1 for k, d in zip(taps, dilations)])
    pattern[tuple(slice(None, None, d) for d in dilations)] = 1
    return pattern


def conv_masks(mctx, op, out_masks) -> list | None:
    """Operand masks of a convolution on one channel instead of all of them.

    With the filter replaced by ones, input lane ``(b, p, ci)`` receives from
    every output lane whose window covers ``p``, for every output channel, and
    no ``ci`` differs from another: its mask is TF's input gradient of a
    one-channel copy (input ``[.., 1]``, filter ``[.., 1, 1]``) seeded with the
    output mask's ``any`` over channels, broadcast over ``ci``.  With the input
    replaced by ones, filter lane ``(k, ci, co)`` receives from output channel
    ``co`` wherever tap ``k`` lands inside the input, again whatever ``ci``:
    the filter gradient of a copy with one input channel, seeded with the whole
    output mask.  Strides and padding are the op's own (the copy keeps its
    attributes) and the gradient is TF's registered one, so edge and stride
    conventions are TF's; the cost is the convolution's divided by its
    channel counts, where the probe of :func:`probe_masks` costs a full
    backward convolution at run time.

    A dilated convolution is copied undilated with a zero-stuffed filter
    (:func:`_dilated_taps`) and its filter mask read at the dilated taps:
    TF's CPU kernels without oneDNN have no gradient for dilation rates above
    1 (plain TF raises there too), and a mask probe must not make a forward
    pass fail that runs unguarded.  None for a grouped convolution, an
    unknown channel count or a dilated filter of unknown size (the probe
    serves those)."""
    layout = _conv_layout(op)
    if layout is None:
        return None
    rank, channel = layout
    n = len(op.inputs)
    out = out_masks[0]
    diff = [is_inexact(t.dtype) for t in op.inputs[:2]]
    if out is NONE or not any(diff):
        return [NONE] * n
    x, w = op.inputs[:2]
    dilations = _spatial_dilations(op, rank, channel)
    taps = w.shape.as_list()[: rank - 2]
    dilated = any(d != 1 for d in dilations)
    if dilated and None in taps:
        return None
    undilated = {"dilations": compat.int_list_attr([1] * rank)} if dilated else None
    grad = compat.registered_gradient(op.type)
    result = [NONE] * n
    with tf.name_scope("hlo_guard_conv_mask"):
        x_shape, w_shape = _shape_of(mctx, x), _shape_of(mctx, w)
        seed = materialize(out, mctx.shaped(op.outputs[0]))
        if diff[0]:
            if dilated:
                pattern = _dilated_taps(taps, dilations)[..., None, None]
                taps_of_ones = tf.constant(pattern, w.dtype)
            else:
                taps_of_ones = tf.ones(_one_channel(w_shape, [rank - 2, rank - 1]), w.dtype)
            small = copy_op(
                op,
                [tf.zeros(_one_channel(x_shape, [channel]), x.dtype), taps_of_ones],
                attrs=undilated,
            )
            seen = tf.cast(tf.reduce_any(seed, axis=channel, keepdims=True), x.dtype)
            dx = grad(small, seen)[0]
            result[0] = normalize(tf.broadcast_to(tf.not_equal(dx, 0), x_shape))
        if diff[1]:
            if dilated:
                wide = [(k - 1) * d + 1 for k, d in zip(taps, dilations)]
                zero_taps = tf.zeros(tf.stack([*wide, 1, w_shape[rank - 1]]), w.dtype)
            else:
                zero_taps = tf.zeros(_one_channel(w_shape, [rank - 2]), w.dtype)
            small = copy_op(
                op,
                [tf.ones(_one_channel(x_shape, [channel]), x.dtype), zero_taps],
                attrs=undilated,
            )
            dw = grad(small, tf.cast(seed, w.dtype))[1]
            if dilated:  # the taps the dilated filter has
                dw = dw[tuple(slice(None, None, d) for d in dilations)]
            result[1] = normalize(tf.broadcast_to(tf.not_equal(dw, 0), w_shape))
    return result


def conv_forward_masks(mctx, op, in_masks) -> list | None:
    """The output tangent mask of a convolution, on one channel (the forward
    counterpart of :func:`conv_masks`): an output lane ``(b, q, co)`` sums the
    input's tangent lanes of every channel in its window, and the filter's
    tangent lanes of output channel ``co`` at every tap landing inside the
    input.  So: the op's own convolution of the input mask's ``any`` over
    channels with a one-channel filter of ones, and of a one-channel input of
    ones with the filter mask's ``any`` over input channels; ORed."""
    layout = _conv_layout(op)
    if layout is None:
        return None
    rank, channel = layout
    x, w = op.inputs[:2]
    masks = [m if is_inexact(t.dtype) else NONE for m, t in zip(in_masks[:2], (x, w))]
    if all(m is NONE for m in masks):
        return [NONE]
    found = None
    with tf.name_scope("hlo_guard_conv_mask"):
        x_shape, w_shape = _shape_of(mctx, x), _shape_of(mctx, w)
        if masks[0] is not NONE:
            lanes = materialize(masks[0], mctx.shaped(x))
            lanes = tf.cast(tf.reduce_any(lanes, axis=channel, keepdims=True), x.dtype)
            ones = tf.ones(_one_channel(w_shape, [rank - 2, rank - 1]), w.dtype)
            found = tf.not_equal(copy_op(op, [lanes, ones]).outputs[0], 0)
        if masks[1] is not NONE:
            taps = materialize(masks[1], mctx.shaped(w))
            taps = tf.cast(tf.reduce_any(taps, axis=rank - 2, keepdims=True), w.dtype)
            ones = tf.ones(_one_channel(x_shape, [channel]), x.dtype)
            seen = tf.not_equal(copy_op(op, [ones, taps]).outputs[0], 0)
            found = seen if found is None else tf.logical_or(found, seen)
        assert found is not None
        found = tf.broadcast_to(found, shape_of(mctx.shaped(op.outputs[0])))
    return [normalize(found)]


class DirectMasks(Structural):
    """A bilinear op whose masks come from ``input_masks``/``forward_masks``
    functions, each returning None for the cases the probe still serves
    (an einsum with an ellipsis or a diagonal, a grouped convolution)."""

    def __init__(self, input_masks, forward_masks):
        super().__init__(_always, guards=True, bilinear=True)
        self._input_masks, self._forward_masks = input_masks, forward_masks

    def input_masks(self, mctx, node, op, out_masks):
        found = self._input_masks(mctx, op, out_masks)
        if found is None:
            return super().input_masks(mctx, node, op, out_masks)
        return found

    def forward_masks(self, mctx, node, op, in_masks):
        found = self._forward_masks(mctx, op, in_masks)
        if found is None:
            return super().forward_masks(mctx, node, op, in_masks)
        return found


def register(table):
    # einsum multiplies operands; one with a diagonal (``ii->i``, a trace)
    # reads only some lanes, and is probed like a convolution
    table.register("Einsum", DirectMasks(einsum_masks, einsum_forward_masks))
    # ``DepthwiseConv2dNative`` and the raw ``Conv1D`` op keep the probe
    # (:mod:`structural`)
    table.register(["Conv2D", "Conv3D"], DirectMasks(conv_masks, conv_forward_masks))
