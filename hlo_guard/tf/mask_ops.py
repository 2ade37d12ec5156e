"""Mask arithmetic in TF ops, tolerant of dynamic shapes.

A mask is :data:`passes.masks.ALL`, :data:`passes.masks.NONE` or a boolean
tensor of exactly the shape of the value it describes.  Shapes may be unknown
until run time (``TensorSpec([None])``), so every reshaping goes through
``tf.shape`` and ``BroadcastGradientArgs`` -- the same op TF's own gradients
use to undo implicit broadcasting, which makes the reduction follow TF's
broadcasting rules exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from hlo_guard.tf import mask_broadcasts as mb
from passes.masks import ALL, NONE, MaskAlgebra


def is_sentinel(m) -> bool:
    return m is ALL or m is NONE


def static_value(m):
    try:
        return tf.get_static_value(m)
    except (TypeError, ValueError):
        return None


def normalize(m):
    """ALL/NONE for a mask whose value is known at trace time."""
    if is_sentinel(m):
        return m
    v = static_value(m)
    if v is not None:
        v = np.asarray(v)
        if v.all():
            return ALL
        if not v.any():
            return NONE
    return m


def _lane_op(fn, a, b):
    """``fn`` (``tf.logical_or``/``tf.logical_and``) of two masks, on their
    sources when either is a recorded broadcast (:mod:`mask_broadcasts`)."""
    if mb.same_broadcast(a, b):
        return a
    found = mb.combine(fn, a, b)
    return fn(a, b) if found is None else found


class TFMaskAlgebra(MaskAlgebra):
    def or_(self, a, b):
        if mb.within(a, b):
            return b
        if mb.within(b, a):
            return a
        return _lane_op(tf.logical_or, a, b)

    def normalize(self, mask):
        return normalize(mask)


ALGEBRA = TFMaskAlgebra()


@dataclass(frozen=True)
class StaticShape:
    """Stands in for a tensor whose *shape* a mask needs, not its value.

    Most masks need only the shape of the value they describe (the output of
    a select, to broadcast its condition to).  Reading the value itself adds a
    data edge from the program into the mask; downstream of a guard that edge
    would close a cycle, so the builder would recompute the whole chain up to
    it on the side.  When the shape is known at trace time this stand-in
    carries it with no edge at all (see ``Builder.shaped``); it has no value,
    so a helper that wrongly reads one fails loudly."""

    shape: tf.TensorShape
    dtype: Any


def shape_of(like) -> tf.Tensor:
    """``like``'s shape as a 1-D int32 tensor: a constant when known at trace
    time (no data edge from ``like``), else ``tf.shape``."""
    if like.shape.is_fully_defined():
        return tf.constant(like.shape.as_list(), tf.int32)
    return tf.shape(like, out_type=tf.int32)


def materialize(m, like) -> tf.Tensor:
    """A boolean tensor of ``like``'s shape for a sentinel or a mask."""
    if m is ALL:
        return tf.ones(shape_of(like), dtype=tf.bool)
    if m is NONE:
        return tf.zeros(shape_of(like), dtype=tf.bool)
    return m


def same_static_shape(a, b) -> bool:
    sa, sb = a.shape, b.shape
    return sa.is_fully_defined() and sb.is_fully_defined() and sa == sb


def broadcast_like(m, like):
    """``m`` broadcast to ``like``'s shape (sentinels stay sentinels)."""
    if is_sentinel(m):
        return m
    if same_static_shape(m, like):
        return m
    shape = mb.static_shape(like)
    found = None if shape is None else mb.broadcast(m, shape)
    return tf.broadcast_to(m, shape_of(like)) if found is None else found


def and_(a, b):
    if a is NONE or b is NONE:
        return NONE
    if a is ALL:
        return b
    if b is ALL:
        return a
    if mb.within(a, b):
        return a
    if mb.within(b, a):
        return b
    return normalize(_lane_op(tf.logical_and, a, b))


def _negated(m):
    """``not m`` as ``m == False``: Grappler's arithmetic optimizer rewrites
    ``LogicalNot(Less(x, y))`` to ``GreaterEqual(x, y)`` when the comparison
    has no other reader, which is false on a NaN lane where the negation is
    true (seen in TF 2.21 graph mode, not under XLA): the else-branch of a
    select on ``x > 0`` would lose its NaN lanes.  ``Equal`` on booleans is
    left alone."""
    return tf.equal(m, False)


def not_(m):
    if m is ALL:
        return NONE
    if m is NONE:
        return ALL
    if mb.is_recorded(m):
        source, dims = mb.source_of(m)
        return mb.emit(_negated(source), mb.static_shape(m), dims)
    return _negated(m)


def reduce_to(m, out, operand):
    """OR-reduce an output-shaped mask over the dimensions ``operand`` was
    implicitly broadcast along, back to ``operand``'s shape."""
    if is_sentinel(m):
        return m
    if same_static_shape(out, operand):
        return m
    out_shape, op_shape = mb.static_shape(out), mb.static_shape(operand)
    if out_shape is not None and op_shape is not None:
        found = mb.reduce_to(m, out_shape, op_shape)
        if found is not None:
            return normalize(found)
    s_op = shape_of(operand)
    s_out = shape_of(out)
    r_op, _ = tf.raw_ops.BroadcastGradientArgs(s0=s_op, s1=s_out)
    return normalize(tf.reshape(tf.reduce_any(m, axis=r_op), s_op))


def to_float(m, like) -> tf.Tensor:
    """The mask as 0/1 in ``like``'s dtype (a cotangent seed)."""
    return tf.cast(materialize(m, like), like.dtype)


def reduce_to_shape(m: tf.Tensor, shape: tf.Tensor, static: tf.TensorShape) -> tf.Tensor:
    """OR-reduce a boolean tensor back to ``shape`` (a 1-D int32 tensor, whose
    trace-time value ``static`` may be partly unknown; ``shape`` may be None
    when ``static`` and ``m.shape`` are fully known), over the dimensions a
    tensor of that shape would be implicitly broadcast along to reach ``m``'s
    shape: leading extra dimensions and size-1 dimensions.

    With both shapes known at trace time the axes are computed here; otherwise
    ``BroadcastGradientArgs`` finds them at run time, following TF's
    broadcasting rules exactly.
    """
    have = m.shape
    if static.is_fully_defined() and have.is_fully_defined():
        target, got = static.as_list(), have.as_list()
        lead = len(got) - len(target)
        axes = list(range(lead)) + [
            lead + i for i, d in enumerate(target) if d == 1 and got[lead + i] != 1
        ]
        if not axes:
            return m
        return tf.reshape(tf.reduce_any(m, axis=axes), target)
    axes, _ = tf.raw_ops.BroadcastGradientArgs(s0=shape, s1=tf.shape(m, out_type=tf.int32))
    return tf.reshape(tf.reduce_any(m, axis=axes), shape)
