"""TF masks that are broadcasts of a smaller mask, remembered.

The TF counterpart of the JAX front end's ``mask_ops._BROADCASTS``.  A row
mask ``m: [B]`` reaches a ``[B, H]`` activation as ``broadcast_to(reshape(m,
[B, 1]), [B, H])``.  Built naively, every rule that reads it works on full
``[B, H]`` booleans: the OR with another row mask, the ``any`` over ``H`` a
``MatMul`` operand's mask takes, the reduction back to a ``[B, 1]`` divisor.
XLA fuses a lone broadcast into its consumer, but an OR of two broadcasts read
by several guards is materialized (two ``pred[1024, 1024]`` buffers in the
MLP gradient of ``make bench``).  Remembering that a mask *is*
``broadcast_in_dim(source, shape, dims)`` lets those operations work on the
``[B]`` source and broadcast once, at the end -- and lets a ``MatMul``
recognise a weight whose lanes live or die together (a *one-bit* mask), whose
zeroing and guard the contraction makes redundant (docs/PLACEMENT.md).

A recorded source has no size-1 axes; ``dims`` (increasing) names the axes of
the full mask it spans, so two masks are the same broadcast exactly when their
sources are the same tensor and their dims are equal.  Only masks whose shape
is known at trace time take part; everything else keeps the plain path.  A
second table records masks known to lie *within* a broadcast (a gather's
scatter inside the rows its output mask marks), so that the OR of the two is
the broadcast itself.

Facts live per ``tf.Graph`` in a weak table: they die with the graph whose
tensors they name.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from passes.masks import ALL, NONE

Facts = tuple[Any, tuple[int, ...]]


@dataclass
class _GraphFacts:
    #: mask (by reference) -> (source, dims) it broadcasts
    broadcasts: dict[Any, Facts] = field(default_factory=dict)
    #: mask -> (source, dims) of a broadcast it lies within
    within: dict[Any, Facts] = field(default_factory=dict)
    #: an unrecorded mask -> its canonical (size-1 axes squeezed) source
    squeezed: dict[Any, Facts] = field(default_factory=dict)
    #: (source, shape, dims) -> the one tensor broadcasting it
    emitted: dict[Any, Any] = field(default_factory=dict)


_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _facts(t) -> _GraphFacts:
    found = _TABLES.get(t.graph)
    if found is None:
        found = _TABLES[t.graph] = _GraphFacts()
    return found


def static_shape(t) -> tuple[int, ...] | None:
    """``t``'s shape when known at trace time (a tensor or a stand-in with a
    ``shape``), else None."""
    shape = getattr(t, "shape", None)
    if shape is None or not shape.is_fully_defined():
        return None
    return tuple(int(d) for d in shape.as_list())


def _is_tensor(m) -> bool:
    return m is not ALL and m is not NONE and isinstance(m, tf.Tensor) and hasattr(m, "graph")


def source_of(m) -> Facts | None:
    """``(source, dims)`` with ``m == broadcast_in_dim(source, m.shape, dims)``
    and no size-1 axis in ``source``; None for a sentinel or a mask whose shape
    is not known at trace time.  A mask not recorded as a broadcast is its own
    source, squeezed of its size-1 axes (once: the squeeze is reused, so two
    reads of one mask name one source)."""
    if not _is_tensor(m) or tf.executing_eagerly():
        return None
    shape = static_shape(m)
    if shape is None:
        return None
    facts = _facts(m)
    key = m.ref()
    found = facts.broadcasts.get(key) or facts.squeezed.get(key)
    if found is not None:
        return found
    dims = tuple(k for k, n in enumerate(shape) if n != 1)
    if len(dims) == len(shape):
        found = (m, dims)
    else:
        with tf.name_scope("hlo_guard_mask"):
            found = (tf.reshape(m, [shape[k] for k in dims]), dims)
    facts.squeezed[key] = found
    return found


def is_recorded(m) -> bool:
    return _is_tensor(m) and m.ref() in _facts(m).broadcasts


def emit(source, shape: Sequence[int], dims: Sequence[int]):
    """The mask ``broadcast_in_dim(source, shape, dims)``, recorded; one tensor
    per (source, shape, dims), so equal broadcasts are one tensor."""
    shape, dims = tuple(shape), tuple(dims)
    src_shape = static_shape(source)
    assert src_shape is not None and len(src_shape) == len(dims)
    # a size-1 source axis spans nothing: drop it (canonical form)
    if any(n == 1 for n in src_shape):
        keep = [k for k, n in enumerate(src_shape) if n != 1]
        with tf.name_scope("hlo_guard_mask"):
            source = tf.reshape(source, [src_shape[k] for k in keep])
        dims = tuple(dims[k] for k in keep)
    if dims == tuple(range(len(shape))):
        return source  # spans every axis: it is the mask itself
    facts = _facts(source)
    key = (source.ref(), shape, dims)
    found = facts.emitted.get(key)
    if found is not None:
        return found
    kept = [shape[k] if k in dims else 1 for k in range(len(shape))]
    with tf.name_scope("hlo_guard_mask"):
        out = tf.reshape(source, kept)
        if list(kept) != list(shape):
            out = tf.broadcast_to(out, shape)
    if out is not source:
        facts.broadcasts[out.ref()] = (source, dims)
    facts.emitted[key] = out
    return out


def is_one_bit(m) -> bool:
    """Whether every lane of ``m`` has one value: a sentinel, or a recorded
    broadcast of a scalar (``any`` of a row mask, spread over a weight)."""
    if m is ALL or m is NONE:
        return True
    found = source_of(m)
    return found is not None and len(found[1]) == 0


def record_within(m, source, dims) -> None:
    """Note that ``m`` lies within ``broadcast_in_dim(source, m.shape, dims)``."""
    if _is_tensor(m):
        _facts(m).within[m.ref()] = (source, tuple(dims))


def within(a, b) -> bool:
    """Whether ``a`` is known to lie within ``b`` (``a | b == b``)."""
    if not (_is_tensor(a) and _is_tensor(b)) or a.graph is not b.graph:
        return False
    found = _facts(a).within.get(a.ref())
    if found is None or static_shape(a) != static_shape(b):
        return False
    fb = source_of(b)
    return fb is not None and fb[0] is found[0] and fb[1] == found[1]


def _lift(source, dims: Sequence[int], union: Sequence[int]):
    """``source`` reshaped to ``len(union)`` axes, size 1 where it does not span."""
    shape = static_shape(source)
    assert shape is not None
    target = [shape[list(dims).index(k)] if k in dims else 1 for k in union]
    if list(target) == list(shape):
        return source
    return tf.reshape(source, target)


def combine(fn: Callable, a, b):
    """``fn(a, b)`` (a lane-wise boolean op) on the two masks' sources, broadcast
    once; None when neither is a recorded broadcast or their union spans every
    axis (the plain op on the full masks is then no larger)."""
    shape = static_shape(a)
    if shape is None or shape != static_shape(b):
        return None
    if not (is_recorded(a) or is_recorded(b)):
        return None
    fa, fb = source_of(a), source_of(b)
    if fa is None or fb is None:
        return None
    union = tuple(sorted(set(fa[1]) | set(fb[1])))
    if union == tuple(k for k, n in enumerate(shape) if n != 1):
        return None
    with tf.name_scope("hlo_guard_mask"):
        out = fn(_lift(fa[0], fa[1], union), _lift(fb[0], fb[1], union))
    return emit(out, shape, union)


def same_broadcast(a, b) -> bool:
    fa, fb = source_of(a), source_of(b)
    return (
        fa is not None
        and fb is not None
        and static_shape(a) == static_shape(b)
        and fa[0] is fb[0]
        and fa[1] == fb[1]
    )


def broadcast(m, shape: Sequence[int]):
    """``m`` broadcast to ``shape`` by TF's (right-aligned) rules, recorded;
    None when ``m``'s shape is not known."""
    mshape = static_shape(m)
    found = source_of(m)
    if mshape is None or found is None:
        return None
    offset = len(shape) - len(mshape)
    return emit(found[0], shape, [k + offset for k in found[1]])


def reduce_to(m, out_shape: Sequence[int], operand_shape: Sequence[int]):
    """OR-reduce ``m`` (of ``out_shape``) over the axes an operand of
    ``operand_shape`` was implicitly broadcast along, on its source; None when
    ``m`` is not a recorded broadcast (the plain path is then as good)."""
    lead = len(out_shape) - len(operand_shape)
    broadcast_along = [
        ax
        for ax in range(len(out_shape))
        if ax < lead or (operand_shape[ax - lead] == 1 and out_shape[ax] != 1)
    ]
    return any_over(m, broadcast_along, operand_shape, lambda ax: ax - lead)


def any_over(m, axes: Sequence[int], out_shape: Sequence[int], out_dims_of: Callable):
    """``any(m, axes)`` placed in a mask of ``out_shape``: the kept axes of
    ``m`` land on ``out_dims_of(axis)``.  Works on the source; None when ``m``
    is not a recorded broadcast."""
    if not is_recorded(m):
        return None
    shape = static_shape(m)
    found = source_of(m)
    assert found is not None and shape is not None
    source, dims = found
    if any(ax not in dims and shape[ax] == 0 for ax in axes):
        return NONE  # any over an empty axis
    reduced = [k for k, ax in enumerate(dims) if ax in axes]
    kept = [out_dims_of(ax) for ax in dims if ax not in axes]
    with tf.name_scope("hlo_guard_mask"):
        if reduced:
            source = tf.reduce_any(source, axis=reduced)
    return emit(source, out_shape, kept)


def reshape(m, shape: Sequence[int]):
    """``m`` reshaped to ``shape`` when that only adds or drops size-1 axes
    (``[B] -> [B, 1]``): the same source, on the matching axes; None for any
    other reshape or an unknown shape."""
    mshape = static_shape(m)
    found = source_of(m)
    if mshape is None or found is None:
        return None
    old = [k for k, n in enumerate(mshape) if n != 1]
    new = [k for k, n in enumerate(shape) if n != 1]
    if [mshape[k] for k in old] != [shape[k] for k in new]:
        return None
    placed = dict(zip(old, new))
    return emit(found[0], shape, [placed[ax] for ax in found[1]])
