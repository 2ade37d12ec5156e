"""Gradients that build their integer constants themselves.

The guarded wrapper is a nested ``tf.function``.  TF's gradient of a nested
call makes the forward function *output* every forward tensor the backward
function reads, and many registered gradients read an integer ``Const`` input
of their op: the axis of ``GatherV2``/``ConcatV2``/``Split``/``Cumsum``, the
permutation of ``Transpose``, the paddings of ``Pad``, the multiples of
``Tile``, the shift of ``Roll``, the axes of ``Max``/``Min``/``Prod``.  Inside
``tf.function(jit_compile=True)`` the backward function needs those as
compile-time constants, and XLA can only get a forward function's output as a
constant by folding the step's arguments into constants: it compiles again for
every new input value (:mod:`hlo_guard.tf.xla_gradient`).

A program that can run twice avoids that by differentiating a second import of
itself.  One that cannot (a dropout draw, a batch-norm update) gets this
instead: each such op is replaced by a copy under ``tf.custom_gradient`` whose
gradient is TF's own registered gradient of a *twin* built inside the backward
function from the captured non-constant inputs and fresh ``Const`` ops of the
same values.  The backward function then captures only the op's non-constant
inputs.  The forward program is a copy of the op on its own inputs, bitwise the
original; higher orders differentiate the twin's gradient like any TF graph.

Ops whose registered gradient was measured not to need a forward constant
(``Sum``, ``Mean``, ``Reshape``, ``StridedSlice``, ``Slice``, ``ExpandDims``,
``BroadcastTo`` ...) are left alone; any other stateless op with an integer
``Const`` input and a differentiable input is localized (conservative: the
twin gradient is TF's own either way).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from hlo_guard.tf import compat
from hlo_guard.tf.graph import is_inexact
from hlo_guard.tf.opcopy import copy_op, is_stateful, move_consumers

#: gradients that read their constant inputs through ``tensor_util.constant_value``
#: or only as shapes XLA infers (checked with a nested ``tf.function`` under XLA)
_NEEDS_NO_FORWARD_CONSTANT = frozenset(
    {
        "Sum",
        "Mean",
        "Reshape",
        "StridedSlice",
        "Slice",
        "ExpandDims",
        "BroadcastTo",
        "Fill",
        "Squeeze",
        "GatherNd",
        "ScatterNd",
        "UnsortedSegmentSum",
        "ResourceGather",
        "Pack",
        "Unpack",
    }
)


def needs_local_constants(op: tf.Operation) -> bool:
    """Whether ``op``'s gradient would read an integer constant of the
    forward function."""
    if op.type in _NEEDS_NO_FORWARD_CONSTANT or is_stateful(op):
        return False
    # plain numbers only: a TensorList or resource op's gradient is not a
    # function of a twin's inputs (a copied list is a different list)
    if not all(_numeric(t) for t in list(op.inputs) + list(op.outputs)):
        return False
    if not any(is_inexact(t.dtype) for t in op.inputs):
        return False
    return any(_constant_input(t) for t in op.inputs)


def _numeric(t: tf.Tensor) -> bool:
    return t.dtype.is_floating or t.dtype.is_integer or t.dtype.is_complex or t.dtype == tf.bool


def _constant_input(t: tf.Tensor) -> bool:
    return t.op.type == "Const" and t.dtype.is_integer


def localize(ops: Sequence[tf.Operation]) -> dict[str, tf.Tensor]:
    """Replace every op of ``ops`` that :func:`needs_local_constants` (and
    still has a consumer) by a copy whose gradient builds its constants
    itself, rewiring its readers.  Returns old output name -> new tensor (for
    the caller's own references to the outputs)."""
    replaced: dict[str, tf.Tensor] = {}
    for op in ops:
        if not needs_local_constants(op):
            continue
        with tf.name_scope("hlo_guard_local_constants"):
            outputs = _with_local_constants(op)
        move_consumers(op, outputs)
        compat.move_control_outputs(op, outputs[0].op)
        replaced.update((old.name, new) for old, new in zip(op.outputs, outputs))
    return replaced


def _with_local_constants(op: tf.Operation) -> list[tf.Tensor]:
    constant_at = {i: t for i, t in enumerate(op.inputs) if _constant_input(t)}
    values = {i: tf.get_static_value(t) for i, t in constant_at.items()}
    other = [t for i, t in enumerate(op.inputs) if i not in constant_at]

    def assemble(xs, constants):
        it = iter(xs)
        return [constants[i] if i in constants else next(it) for i in range(len(op.inputs))]

    @tf.custom_gradient
    def copy(*xs):
        out = copy_op(op, assemble(xs, constant_at)).outputs

        def gradient(*dys):
            local = [tf.identity(x) for x in xs]
            fresh = {i: tf.constant(v, dtype=constant_at[i].dtype) for i, v in values.items()}
            twin = copy_op(op, assemble(local, fresh), name="hlo_guard_twin")
            ys, seeds = [], []
            for y, dy in zip(twin.outputs, dys):
                if dy is not None and is_inexact(y.dtype):
                    ys.append(y)
                    seeds.append(dy)
            wrt = [i for i, x in enumerate(local) if is_inexact(x.dtype)]
            found = (
                tf.gradients(
                    ys,
                    [local[i] for i in wrt],
                    grad_ys=seeds,
                    unconnected_gradients=tf.UnconnectedGradients.ZERO,
                )
                if ys
                else [tf.zeros_like(local[i]) for i in wrt]
            )
            grads: list = [None] * len(local)
            for i, g in zip(wrt, found):
                grads[i] = g
            return grads

        return (out[0] if len(out) == 1 else list(out)), gradient

    result = copy(*other)
    return list(result) if isinstance(result, (list, tuple)) else [result]
