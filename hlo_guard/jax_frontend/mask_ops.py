"""Mask arithmetic for the JAX front end.

A mask is :data:`passes.ALL`, :data:`passes.NONE`, a numpy bool array (known
while tracing: it came from literals, constants or static indices and is never
traced) or a jax bool array, always of the masked value's exact shape.
Operations stay in numpy while every operand is numpy, so static masks are
folded at trace time and never appear in the traced program.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from passes.masks import ALL, NONE, MaskAlgebra


def is_static(x) -> bool:
    """Known at trace time: anything that is not a tracer (numpy values,
    Python scalars, literals, and concrete arrays in eager mode)."""
    if x is ALL or x is NONE:
        return True
    return not isinstance(x, jax.core.Tracer)


def xp(*arrays):
    """numpy if every operand is static, else :data:`lax_ops`."""
    return np if all(is_static(a) for a in arrays) else lax_ops


class _LaxOps:
    """The few numpy-style operations masks need, bound straight to lax
    primitives.  ``jax.numpy`` would do, but each of its functions is a jitted
    wrapper whose dispatch costs more than the mask itself at trace time."""

    @staticmethod
    def _pair(a, b):
        a = a if isinstance(a, jax.core.Tracer) else np.asarray(a)
        b = b if isinstance(b, jax.core.Tracer) else np.asarray(b)
        if a.dtype != b.dtype:
            if isinstance(b, np.ndarray):
                b = b.astype(a.dtype)
            elif isinstance(a, np.ndarray):
                a = a.astype(b.dtype)
            else:
                b = lax.convert_element_type(b, a.dtype)
        sa, sb = np.shape(a), np.shape(b)
        if sa != sb and len(sa) and len(sb):
            shape = np.broadcast_shapes(sa, sb)
            a, b = _LaxOps.broadcast_to(a, shape), _LaxOps.broadcast_to(b, shape)
        return a, b

    @staticmethod
    def logical_and(a, b):
        return lax.bitwise_and(*_LaxOps._pair(a, b))

    @staticmethod
    def logical_or(a, b):
        return lax.bitwise_or(*_LaxOps._pair(a, b))

    @staticmethod
    def logical_not(a):
        return lax.bitwise_not(a)

    @staticmethod
    def equal(a, b):
        return lax.eq(*_LaxOps._pair(a, b))

    @staticmethod
    def greater(a, b):
        return lax.gt(*_LaxOps._pair(a, b))

    @staticmethod
    def less(a, b):
        return lax.lt(*_LaxOps._pair(a, b))

    @staticmethod
    def any(a, axis=None, keepdims=False):
        shape = np.shape(a)
        axes = (
            tuple(range(len(shape)))
            if axis is None
            else tuple(axis)
            if isinstance(axis, (tuple, list))
            else (axis,)
        )
        out = lax.reduce_or(a, axes) if axes else a
        if keepdims:
            out = lax.reshape(out, tuple(1 if d in axes else n for d, n in enumerate(shape)))
        return out

    @staticmethod
    def reshape(a, shape):
        shape = tuple(shape)
        return a if np.shape(a) == shape else lax.reshape(a, shape)

    @staticmethod
    def broadcast_to(a, shape):
        shape = tuple(shape)
        sa = np.shape(a)
        if sa == shape:
            return a
        offset = len(shape) - len(sa)
        keep = [d for d, n in enumerate(sa) if n == shape[offset + d]]
        if len(keep) != len(sa):  # size-1 dims broadcast: drop them first
            a = lax.reshape(a, tuple(sa[d] for d in keep))
        return lax.broadcast_in_dim(a, shape, tuple(offset + d for d in keep))


lax_ops = _LaxOps()


def materialize(mask, shape) -> Any:
    if mask is ALL:
        return np.ones(shape, dtype=bool)
    if mask is NONE:
        return np.zeros(shape, dtype=bool)
    return mask


def normalize(mask):
    if mask is ALL or mask is NONE:
        return mask
    if isinstance(mask, jax.Array) and not isinstance(mask, jax.core.Tracer):
        mask = np.asarray(mask)
    if isinstance(mask, (np.ndarray, np.generic)):
        mask = np.asarray(mask, dtype=bool)
        if mask.size == 0 or mask.all():
            return ALL
        if not mask.any():
            return NONE
    return mask


def and_(a, b, shape):
    if a is NONE or b is NONE:
        return NONE
    if a is ALL:
        return normalize(broadcast_to(b, shape))
    if b is ALL:
        return normalize(broadcast_to(a, shape))
    m = xp(a, b)
    return normalize(m.logical_and(a, b))


def not_(a):
    if a is ALL:
        return NONE
    if a is NONE:
        return ALL
    return normalize(xp(a).logical_not(a))


def broadcast_to(a, shape):
    shape = tuple(shape)
    if a is ALL or a is NONE:
        return a
    if tuple(np.shape(a)) == shape:
        return a
    return xp(a).broadcast_to(a, shape)


def reduce_to_shape(mask, out_shape: Sequence[int], in_shape: Sequence[int]):
    """Mask of an implicitly broadcast operand: a lane is live if any output
    lane it feeds is live (rank-0 operands and size-1 dimensions)."""
    if mask is ALL or mask is NONE:
        return mask
    out_shape, in_shape = tuple(out_shape), tuple(in_shape)
    if out_shape == in_shape:
        return mask
    m = xp(mask)
    if len(in_shape) == 0:
        return normalize(m.any(mask))
    axes = tuple(d for d, (i, o) in enumerate(zip(in_shape, out_shape)) if i == 1 and o != 1)
    reduced = m.any(mask, axis=axes, keepdims=True) if axes else mask
    return normalize(m.reshape(reduced, in_shape))


class JaxMaskAlgebra(MaskAlgebra):
    def or_(self, a, b):
        return xp(a, b).logical_or(a, b)

    def normalize(self, mask):
        return normalize(mask)


ALGEBRA = JaxMaskAlgebra()


def to_guard_mask(mask, shape):
    """A bool array of ``shape`` for ``lax.select`` (masks are exact-shape)."""
    m = materialize(mask, shape)
    if tuple(np.shape(m)) != tuple(shape):
        m = xp(m).broadcast_to(m, shape)
    return m
