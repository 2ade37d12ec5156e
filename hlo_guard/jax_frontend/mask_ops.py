"""Mask arithmetic for the JAX front end.

A mask is :data:`passes.ALL`, :data:`passes.NONE`, a numpy bool array (known
while tracing: it came from literals, constants or static indices and is never
traced) or a jax bool array, always of the masked value's exact shape.
Operations stay in numpy while every operand is numpy, so static masks are
folded at trace time and never appear in the traced program.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax import lax

from hlo_guard.jax_frontend.compat import current_trace
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


def _weak_refs(table: dict, key, *objects) -> tuple:
    """Weak references to ``objects``; when any of them dies, ``table[key]``
    goes with it (so nothing a table remembers outlives the trace that made
    it)."""

    def forget(_ref, key=key, table=table):
        table.pop(key, None)

    return tuple(weakref.ref(o, forget) for o in objects)


class _Broadcasts:
    """Which traced masks are broadcasts, and of what.

    Most masks are a predicate of a few axes (a padding mask ``[B, T]``) spread
    over the rest (``[B, T, D]``, ``[B, H, T, T]``).  Built naively, every
    rule that reads such a mask (``any`` over the broadcast axes for a
    ``dot_general`` operand, the mask of a size-1 operand, ``and`` with another
    broadcast predicate) reduces and re-broadcasts a full-size array, and each
    of those reductions becomes its own kernel in the gradient.  Remembering
    that a mask *is* ``broadcast_in_dim(source, shape, dims)`` lets the
    operations below work on the small source and broadcast once, late.

    Entries hold the source and die with the broadcast mask (a weak reference
    with a callback), so nothing outlives the trace that made it.  The source
    never has a stretched size-1 axis and ``dims`` is increasing.
    """

    def __init__(self):
        self._by_id: dict[int, tuple[Any, Any, tuple[int, ...]]] = {}

    def record(self, out, source, dims):
        if not isinstance(out, jax.core.Tracer):
            return out
        key = id(out)
        (ref,) = _weak_refs(self._by_id, key, out)
        self._by_id[key] = (ref, source, tuple(dims))
        return out

    def of(self, x):
        """``(source, dims)`` if ``x`` is a recorded broadcast, else None."""
        entry = self._by_id.get(id(x))
        if entry is None or entry[0]() is not x:
            return None
        return entry[1], entry[2]


_BROADCASTS = _Broadcasts()


class _Within(_Broadcasts):
    """:class:`_Broadcasts` with several entries per mask: one mask may be
    known to lie within more than one broadcast (a gather's row mask, and
    its own ``any`` spread back over the reduced axes)."""

    def record(self, out, source, dims):
        if not isinstance(out, jax.core.Tracer):
            return out
        key = id(out)
        entry = self._by_id.get(key)
        if entry is not None and entry[0]() is out:
            entry[1].append((source, tuple(dims)))
            return out
        (ref,) = _weak_refs(self._by_id, key, out)
        self._by_id[key] = (ref, [(source, tuple(dims))])
        return out

    def of(self, x):
        """Every ``(source, dims)`` recorded for ``x`` (maybe none)."""
        entry = self._by_id.get(id(x))
        if entry is None or entry[0]() is not x:
            return ()
        return entry[1]


#: Masks known to lie *within* a broadcast: ``mask <= broadcast_in_dim(source,
#: shape, dims)`` lane by lane (same table mechanics as :data:`_BROADCASTS`).
#: A gather's operand mask is a scatter of its output mask; when that output
#: mask is a broadcast along the gather's batching dimensions (a per-row mask
#: read by ``take_along_axis``), every lane the scatter marks lies in a row
#: the output mask marks.  The cross-entropy ``logsumexp(z) - take(z, label)``
#: then ORs the scatter with the row mask it lies within: knowing that, the
#: OR is the row mask, and the scatter (a full-size kernel in the gradient)
#: is never used.
#: Other facts of the same form, recorded as masks are made: a mask lies
#: within its ``any`` spread back over the reduced axes (a softmax's input
#: mask ORs its output mask with exactly that), each operand within an OR,
#: an AND within each operand (so ``a | (a & b)`` and ``(a | b) | b`` need no
#: second operation: a value read by several uses ORs their masks).
_WITHIN = _Within()

#: Masks that are a reshape of a recorded broadcast which the reshape could not
#: keep a broadcast: ``out = reshape(broadcast, shape of out)``, the entry's
#: source being that broadcast (its ``dims`` are unused).  A projection's output mask is the
#: typical one: a per-head mask ``[B, T, H]`` spread over the head's features
#: ``[B, T, H, Dh]`` and merged back into ``[B, T, H * Dh]``.  Its ``any``
#: over whole merged axes (a ``dot_general`` operand's row or column mask) is
#: then the ``any`` of the small source, where reducing the merged array
#: costs XLA a reduce-window kernel per reading.
_RESHAPED = _Broadcasts()


def record_within(mask, source, dims):
    """Note that ``mask`` lies within ``broadcast_in_dim(source, shape of
    mask, dims)`` (see :data:`_WITHIN`); returns ``mask``."""
    return _WITHIN.record(mask, source, dims)


def is_one_bit(mask) -> bool:
    """Whether every lane of ``mask`` has one value: ALL, NONE, or a traced
    broadcast of a scalar (``any`` of a row mask, spread over a weight)."""
    if mask is ALL or mask is NONE:
        return True
    if not isinstance(mask, jax.core.Tracer):
        return False
    return np.ndim(broadcast_source(mask)[0]) == 0


def _broadcasts(b, shape, found) -> bool:
    """Whether ``b`` of ``shape`` is the broadcast ``found`` = ``(source,
    dims)`` (sources compared by identity: a traced ``==`` is an array)."""
    if found is None or np.shape(b) != shape:
        return False
    source, dims = broadcast_source(b)
    return source is found[0] and tuple(dims) == tuple(found[1])


def _same_broadcast(a, b) -> bool:
    """Whether ``a`` and ``b`` are broadcasts of one source along the same axes."""
    return _broadcasts(b, np.shape(a), _BROADCASTS.of(a))


def _within(a, b) -> bool:
    """Whether ``a`` is known to lie within ``b`` (``a | b == b``): recorded
    for ``a`` itself, or for its broadcast source when ``b`` broadcasts a
    source along the same axes."""
    if not isinstance(a, jax.core.Tracer) or not isinstance(b, jax.core.Tracer):
        return False
    if any(_broadcasts(b, np.shape(a), found) for found in _WITHIN.of(a)):
        return True
    if np.shape(a) != np.shape(b):
        return False
    (sa, da), (sb, db) = broadcast_source(a), broadcast_source(b)
    if (sa is a and sb is b) or tuple(da) != tuple(db):
        return False
    return sa is sb or _within(sa, sb)


def _record_within_mask(inner, outer) -> None:
    """Note that traced mask ``inner`` lies within ``outer`` of the same
    shape, by ``outer``'s broadcast source (so that ``outer`` and every other
    broadcast of that source along the same axes are recognised)."""
    if (
        isinstance(inner, jax.core.Tracer)
        and isinstance(outer, jax.core.Tracer)
        and inner is not outer
        and np.shape(inner) == np.shape(outer)
    ):
        record_within(inner, *broadcast_source(outer))


def broadcast_source(x):
    """``(source, dims)`` with ``x == broadcast_in_dim(source, shape, dims)``
    for any mask (one not known as a broadcast is its own source, over no
    new axes)."""
    found = _BROADCASTS.of(x)
    if found is not None:
        return found
    return x, tuple(range(len(np.shape(x))))


def lax_broadcast_in_dim(source, shape, dims):
    """``lax.broadcast_in_dim`` of a mask, remembered (see :class:`_Broadcasts`).
    A broadcast of a broadcast is one broadcast of the first one's source --
    composed before anything else, so that reordering the axes (``dims`` not
    increasing) moves the small source, never a remembered broadcast that a
    raw transpose would forget.  Stretched size-1 axes of the source are
    squeezed out."""
    shape, dims = tuple(shape), [int(d) for d in dims]
    inner = _BROADCASTS.of(source)
    if inner is not None:
        source, inner_dims = inner
        dims = [dims[k] for k in inner_dims]
    src_shape = np.shape(source)
    stretched = [k for k, d in enumerate(dims) if src_shape[k] == 1 and shape[d] != 1]
    if stretched:
        source = _LaxOps._raw_reshape(
            source, tuple(n for k, n in enumerate(src_shape) if k not in stretched)
        )
        dims = [d for k, d in enumerate(dims) if k not in stretched]
    if dims != sorted(dims):
        order = sorted(range(len(dims)), key=lambda k: dims[k])
        source = lax.transpose(source, tuple(order))
        dims = sorted(dims)
    if tuple(np.shape(source)) == shape:
        return source
    dims = tuple(dims)
    out = _MADE.made(
        "broadcast", source, (shape, dims), lambda: lax.broadcast_in_dim(source, shape, dims)
    )
    return _BROADCASTS.record(out, source, dims)


class _MadeMasks:
    """The layout operations (``broadcast_in_dim``, ``reshape``) the mask
    operations have made, by operation, source and parameters: a row mask is
    spread to the same shape by many rules (every guard of a ``[B, T, D]``
    value under a row mask), and each fresh equation is one more to trace,
    lower and compile.  An entry is reused only in the trace that made it (a
    tracer of another trace would leak), and dies with its source or result."""

    def __init__(self):
        self._by_key: dict[tuple, tuple[Any, Any]] = {}

    def made(self, kind: str, source, params: tuple, make):
        """The result ``make()`` gave for ``(kind, source, params)`` earlier
        in the current trace, else ``make()`` now, remembered."""
        if not isinstance(source, jax.core.Tracer):
            return make()
        key = (kind, id(source), *params)
        entry = self._by_key.get(key)
        if entry is not None and entry[0]() is source:
            out = entry[1]()
            if out is not None and getattr(out, "_trace", None) is current_trace():
                return out
        out = make()
        if isinstance(out, jax.core.Tracer):
            self._by_key[key] = _weak_refs(self._by_key, key, source, out)
        return out


_MADE = _MadeMasks()


def _lift(source, dims, union, shape):
    """``source`` (placed on ``dims``) broadcast to the axes ``union``."""
    target = tuple(shape[u] for u in union)
    if tuple(dims) == tuple(union):
        return source
    return lax_broadcast_in_dim(source, target, tuple(union.index(d) for d in dims))


class _LaxOps:
    """The few numpy-style operations masks need, bound straight to lax
    primitives.  ``jax.numpy`` would do, but each of its functions is a jitted
    wrapper whose dispatch costs more than the mask itself at trace time.
    Broadcast masks are kept as broadcasts where the operation allows it."""

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
    def _bitwise(op, a, b):
        if a is b:  # and/or of a mask with itself
            return a
        if _same_broadcast(a, b):  # two broadcasts of one source, same axes
            return a
        # absorption (``a | (a & b)`` is ``a``): a value read by several uses
        # ORs their masks, and one is often another's ``and`` with more
        if _within(a, b):
            return b if op is lax.bitwise_or else a
        if _within(b, a):
            return a if op is lax.bitwise_or else b
        a, b = _LaxOps._pair(a, b)
        shape = tuple(np.shape(a))
        if (
            isinstance(a, jax.core.Tracer)
            and isinstance(b, jax.core.Tracer)
            and shape == tuple(np.shape(b))
            and (_BROADCASTS.of(a) is not None or _BROADCASTS.of(b) is not None)
        ):
            (sa, da), (sb, db) = broadcast_source(a), broadcast_source(b)
            union = tuple(sorted(set(da) | set(db)))
            if len(union) < len(shape):
                la, lb = _lift(sa, da, union, shape), _lift(sb, db, union, shape)
                small = _LaxOps._bitwise(op, la, lb)
                return lax_broadcast_in_dim(small, shape, union)
        out = op(a, b)
        for part in (a, b):
            if op is lax.bitwise_or:
                _record_within_mask(part, out)
            else:
                _record_within_mask(out, part)
        return out

    @staticmethod
    def logical_and(a, b):
        return _LaxOps._bitwise(lax.bitwise_and, a, b)

    @staticmethod
    def logical_or(a, b):
        return _LaxOps._bitwise(lax.bitwise_or, a, b)

    @staticmethod
    def logical_not(a):
        found = _BROADCASTS.of(a)
        if found is not None:
            source, dims = found
            return lax_broadcast_in_dim(lax.bitwise_not(source), np.shape(a), dims)
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
    def not_equal(a, b):
        return lax.ne(*_LaxOps._pair(a, b))

    @staticmethod
    def any(a, axis=None, keepdims=False):
        shape = tuple(np.shape(a))
        axes = (
            tuple(range(len(shape)))
            if axis is None
            else tuple(axis)
            if isinstance(axis, (tuple, list))
            else (axis,)
        )
        axes = tuple(sorted(int(d) % max(len(shape), 1) for d in axes))
        kept = [d for d in range(len(shape)) if d not in axes]
        out = _LaxOps._any_over(a, shape, axes, kept, keepdims)
        if any(shape[d] != 1 for d in axes) and isinstance(a, jax.core.Tracer):
            # ``a`` lies within its ``any`` spread back over the reduced axes
            # (a softmax's input mask ORs its output mask with exactly that)
            source, dims = broadcast_source(out)
            record_within(a, source, dims if keepdims else [kept[d] for d in dims])
        return out

    @staticmethod
    def _any_over(a, shape, axes, kept, keepdims):
        """``any`` of ``a`` over ``axes`` (see :meth:`any`)."""
        out_shape = (
            tuple(1 if d in axes else n for d, n in enumerate(shape))
            if keepdims
            else tuple(shape[d] for d in kept)
        )
        if all(shape[d] == 1 for d in axes):  # nothing to reduce
            return _LaxOps.reshape(a, out_shape)
        reshaped = _RESHAPED.of(a)
        if reshaped is not None:
            pre_axes = _axes_before_reshape(np.shape(reshaped[0]), shape, axes)
            if pre_axes is not None:
                small = _LaxOps.any(reshaped[0], pre_axes)
                return _LaxOps.reshape(small, out_shape)
        found = _BROADCASTS.of(a)
        if found is not None:
            # any() over a broadcast axis is the source itself: reduce only the
            # source's own axes, then broadcast the (smaller) result
            source, dims = found
            own = tuple(k for k, d in enumerate(dims) if d in axes)
            reduced = lax.reduce_or(source, own) if own else source
            left = [d for d in dims if d not in axes]
            new_dims = left if keepdims else [kept.index(d) for d in left]
            return lax_broadcast_in_dim(reduced, out_shape, new_dims)
        out = lax.reduce_or(a, axes)
        if keepdims:
            # only size-1 axes inserted: remembered as a broadcast of ``out``
            out = _LaxOps.reshape(out, out_shape)
        return out

    @staticmethod
    def reshape(a, shape):
        shape = tuple(shape)
        if np.shape(a) == shape:
            return a
        reshaped = _RESHAPED.of(a)
        if reshaped is not None:  # a reshape of a reshape: one reshape of the broadcast
            return _LaxOps.reshape(reshaped[0], shape)
        found = _BROADCASTS.of(a)
        if found is not None:
            moved = _reshape_broadcast(found[0], found[1], tuple(np.shape(a)), shape)
            if moved is not None:
                return moved
            return _RESHAPED.record(_LaxOps._raw_reshape(a, shape), a, ())
        out = _LaxOps._raw_reshape(a, shape)
        old = tuple(np.shape(a))
        kept = [d for d, n in enumerate(shape) if n != 1]
        if 1 not in old and tuple(shape[d] for d in kept) == old:
            # only size-1 axes inserted (``[B] -> [B, 1]``): a broadcast of ``a``
            _BROADCASTS.record(out, a, kept)
        return out

    @staticmethod
    def _raw_reshape(a, shape):
        """``lax.reshape``, one equation per operand and shape in a trace."""
        return _MADE.made("reshape", a, (shape,), lambda: lax.reshape(a, shape))

    @staticmethod
    def transpose(a, perm):
        perm = tuple(int(p) for p in perm)
        if perm == tuple(range(len(perm))):
            return a
        found = _BROADCASTS.of(a)
        if found is not None:
            source, dims = found
            inverse = [perm.index(d) for d in range(len(perm))]
            return lax_broadcast_in_dim(
                source, tuple(np.shape(a)[p] for p in perm), [inverse[d] for d in dims]
            )
        return lax.transpose(a, perm)

    @staticmethod
    def broadcast_to(a, shape):
        shape = tuple(shape)
        sa = np.shape(a)
        if sa == shape:
            return a
        offset = len(shape) - len(sa)
        return lax_broadcast_in_dim(a, shape, tuple(offset + d for d in range(len(sa))))

    @staticmethod
    def broadcast_in_dim(a, shape, dims):
        return lax_broadcast_in_dim(a, shape, dims)


def _reshape_groups(old, new):
    """Pair runs of axes of ``old`` and ``new`` with equal products (the
    row-major correspondence of a reshape); None if size-0 axes make it
    ambiguous."""
    if 0 in old or 0 in new:
        return None
    groups, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        gi, gj = [i] if i < len(old) else [], [j] if j < len(new) else []
        pi = old[i] if i < len(old) else 1
        pj = new[j] if j < len(new) else 1
        i, j = i + len(gi), j + len(gj)
        while pi != pj:
            if pi < pj:
                if i >= len(old):
                    return None
                gi.append(i)
                pi *= old[i]
                i += 1
            else:
                if j >= len(new):
                    return None
                gj.append(j)
                pj *= new[j]
                j += 1
        groups.append((gi, gj))
    return groups


def _axes_before_reshape(old, new, axes):
    """The axes of ``old`` that a reduction over ``axes`` of ``new`` (a
    reshape of ``old``) reduces, when ``axes`` cover whole groups of merged or
    split axes; None when they cut through one."""
    groups = _reshape_groups(old, new)
    if groups is None:
        return None
    reduced = set(axes)
    before: list[int] = []
    for gi, gj in groups:
        real = {d for d in gj if new[d] != 1}
        if real and real <= reduced:
            before.extend(gi)
        elif real & reduced:
            return None
    return tuple(before)


def _reshape_broadcast(source, dims, old, new):
    """A reshape of ``broadcast(source, old, dims)`` as a broadcast into
    ``new``, when every group of axes the reshape merges or splits is either
    entirely broadcast or a single source axis kept as it is; else None."""
    groups = _reshape_groups(old, new)
    if groups is None:
        return None
    new_dims = []
    for gi, gj in groups:
        own = [d for d in gi if d in dims]
        if not own:
            continue  # broadcast-only (or size-1) axes: still broadcast
        real_i = [d for d in gi if old[d] != 1]
        real_j = [d for d in gj if new[d] != 1]
        if own != real_i or len(real_i) != 1 or len(real_j) != 1:
            return None
        if any(old[d] == 1 for d in own if d not in real_i):
            return None
        new_dims.append(real_j[0])
    if len(new_dims) != len(dims):
        return None
    return lax_broadcast_in_dim(source, new, new_dims)


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


def holds_result(m, x, ans):
    """Lanes where ``x`` is what a ``max``/``min`` (or a reduction of one)
    returned: ``x == ans`` (ties share), or ``x`` is NaN, which XLA's
    ``max``/``min`` propagate into the result (``rules/selection.py``'s
    docstring).  A finite ``x`` beside a NaN result lost to the NaN."""
    return m.logical_or(m.equal(x, ans), m.not_equal(x, x))


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


def stretched_axes(in_shape: Sequence[int], out_shape: Sequence[int]) -> tuple[int, ...]:
    """The output axes an implicitly broadcast operand of ``in_shape`` is
    copied along: every axis for a rank-0 operand, else its size-1 axes the
    output stretches (the operand has the output's rank)."""
    if len(in_shape) == 0:
        return tuple(range(len(out_shape)))
    return tuple(d for d, (i, o) in enumerate(zip(in_shape, out_shape)) if i == 1 and o != 1)


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
    axes = stretched_axes(in_shape, out_shape)
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


def select_mask_by_index(index, masks: Sequence[Any]):
    """The mask of the case ``index`` chose (a ``cond``'s taken branch):
    ``masks`` are bool arrays of one shape; a known index picks directly."""
    if len(masks) == 1:
        return masks[0]
    if is_static(index):
        return masks[int(np.clip(np.asarray(index), 0, len(masks) - 1))]
    return lax.select_n(index, *[jax.numpy.asarray(m) for m in masks])
