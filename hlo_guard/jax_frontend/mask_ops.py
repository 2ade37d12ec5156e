"""Mask arithmetic for the JAX front end.

A mask is :data:`passes.ALL`, :data:`passes.NONE`, a numpy bool array (known
while tracing: it came from literals, constants or static indices and is never
traced) or a jax bool array, always of the masked value's exact shape.
Operations stay in numpy while every operand is numpy, so static masks are
folded at trace time and never appear in the traced program.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from passes.masks import ALL, NONE, MaskAlgebra


def is_static(x) -> bool:
    """Known at trace time: anything that is not a tracer (numpy values,
    Python scalars, literals, and concrete arrays in eager mode)."""
    if x is ALL or x is NONE:
        return True
    return not isinstance(x, jax.core.Tracer)


def xp(*arrays):
    """numpy if every operand is static, else jax.numpy."""
    return np if all(is_static(a) for a in arrays) else jnp


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
