"""The guarded call's gradient inside an XLA-compiled function.

The guarded program runs in a wrapper ``tf.function`` (:mod:`hlo_guard.tf.api`).
Differentiated by a tape, a nested function call gets TF's function gradient:
a forward function that also *outputs* every forward tensor the backward
function reads, the integer ones included -- the axis of a ``GatherV2`` or
``ConcatV2``, the permutation of a ``Transpose``, the paddings of a ``Pad``.
The backward function needs those as compile-time constants, and inside one
``tf.function(jit_compile=True)`` TF's XLA bridge can only get them by
treating the *arguments of the whole function* as compile-time constants: it
compiles again for every new input value (measured on the MLP step of
``make bench``: 0.43 s per call instead of 2 ms; ``tf.concat``, ``tf.gather``,
``tf.transpose``, ``tf.pad``, ``tf.tile`` and ``reduce_max`` each trigger it,
also in plain TF code with a nested ``tf.function``).

So inside an XLA context, while a tape may record, the call gets a
``tf.custom_gradient`` whose gradient is a second function: it imports the
guarded program again and differentiates it there (``tf.gradients``), from the
call's own inputs and the output cotangents alone.  Nothing but those crosses
from the forward function to the backward one; XLA compiles both into one
program and merges the recomputed forward with the original (common
subexpressions).  Higher orders differentiate the backward function as any
``tf.function``; forward mode goes through TF's double-backward of a custom
gradient.  Outside XLA nothing changes.

Only programs that can run twice take this path (:func:`recomputable`): no
stateful operation but variable reads (a dropout draw or a batch-norm update
must happen once) and no functional control flow (importing an ``If``/``While``
twice gives TF's gradient rewriting of both bodies one derived name).  The
rest keep the wrapper's own gradient; without control flow, its ops build the
integer constants their gradients read themselves
(:mod:`hlo_guard.tf.local_constants`), so they too are compiled once.  With
control flow the bodies are left to TF and the call warns.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from hlo_guard.tf import compat
from hlo_guard.tf.graph import is_inexact
from hlo_guard.tf.tracing import pack_tensor_leaves

#: stateful by their op definition, yet harmless to run again: they only read
_READS = frozenset({"ReadVariableOp", "ResourceGather", "VarHandleOp", "VariableShape"})


def why_not_recomputable(graph_def) -> str | None:
    """Why the traced program (nested calls inlined) may not be imported and
    run a second time, or None when it may: no functional control flow,
    nothing stateful but reads."""
    if graph_def.library.function:
        return "has functional control flow (tf.cond / tf.while_loop)"
    for node in graph_def.node:
        if compat.op_type_is_stateful(node.op) and node.op not in _READS:
            return f"has a stateful operation ('{node.op}' '{node.name}') that must run once"
    return None


def recomputable(graph_def) -> bool:
    return why_not_recomputable(graph_def) is None


def warn_compiled_per_value(name: str, reason: str) -> None:
    """Say that this call keeps TF's nested-function gradient under XLA with
    control-flow bodies whose constants are not localized, and what that may
    cost: a silent recompilation per step is the kind of cost a user otherwise
    finds only by profiling."""
    warnings.warn(
        f"hlo_guard.tf.guard({name}): inside tf.function(jit_compile=True) this call's "
        f"gradient is TF's own nested-function gradient, because the program {reason}. "
        "If a tf.cond/tf.while_loop body has a gather, concat, transpose, pad, tile, split, "
        "cumsum or max/min reduction (a Keras RNN's loop does), XLA compiles the step again "
        "for every new value of an input or a variable it reads -- every training step; "
        "keep the control flow outside the guarded function to avoid it.",
        stacklevel=4,
    )


def wanted() -> bool:
    """Whether the call should take this path: traced in an XLA context with a
    tape (or forward accumulator) that may record it."""
    if tf.executing_eagerly() or not compat.in_xla_context():
        return False
    return compat.tape_may_record()


def why_not_recomputed(args: tuple, kwargs: dict, graph_def) -> str | None:
    """Why this call keeps the wrapper's own gradient, or None when its
    gradient can be recomputed: a ``tf.Variable`` argument (the wrapper reads
    it through its handle; this path passes tensors), or a program that
    cannot run twice (:func:`why_not_recomputable`)."""
    leaves = tf.nest.flatten((args, kwargs), expand_composites=True)
    if any(isinstance(t, tf.Variable) for t in leaves):
        return "takes a tf.Variable argument"
    return why_not_recomputable(graph_def)


def call_with_recomputed_gradient(
    call: Callable, build: Callable, variables: Sequence[Any], args: tuple, kwargs: dict
) -> Any:
    """``call(*args, **kwargs)`` (the wrapper) with the gradient described in
    the module docstring; ``build(args, kwargs)`` builds the guarded program
    in the current graph and returns its structured outputs; ``variables``
    are the variables the traced program reads."""
    structure = (args, kwargs)
    leaves = tf.nest.flatten(structure, expand_composites=True)
    tensor_at = [i for i, t in enumerate(leaves) if isinstance(t, tf.Tensor)]
    held: dict[str, Any] = {}

    def rebuild(tensors):
        new = list(leaves)
        for i, t in zip(tensor_at, tensors):
            new[i] = t
        return tf.nest.pack_sequence_as(structure, new, expand_composites=True)

    def tensor_leaves(result) -> list:
        return [
            y for y in tf.nest.flatten(result, expand_composites=True) if isinstance(y, tf.Tensor)
        ]

    @tf.custom_gradient
    def guarded_call(*tensors):
        a, k = rebuild(tensors)
        for v in variables:
            # the wrapper's call does not tell the tapes (nor custom_gradient's
            # watcher) which variables it reads; its first trace did, once
            compat.variable_accessed(v)
        result = held["result"] = call(*a, **k)
        flat_out = tensor_leaves(result)

        def gradient(*dys, variables=None):
            variables = list(variables or [])
            # only inexact outputs carry a cotangent into the program
            wanted_out = [
                i
                for i, (y, dy) in enumerate(zip(flat_out, dys))
                if is_inexact(y.dtype) and dy is not None
            ]
            differentiable = [is_inexact(t.dtype) for t in tensors]
            #: per differentiated tensor: whether a cotangent reaches it (set
            #: while ``backward`` is traced); one that none reaches gets None,
            #: as plain TF gives a variable or input the outputs do not read
            connected: list[bool] = []

            def backward(inputs, cotangents):
                a2, k2 = rebuild(inputs)
                outs = tensor_leaves(build(a2, k2))
                graph = tf.compat.v1.get_default_graph()
                xs = [t for t, d in zip(inputs, differentiable) if d]
                xs += [graph.capture(v.handle) for v in variables]
                grads = tf.gradients(
                    [outs[i] for i in wanted_out],
                    xs,
                    grad_ys=list(cotangents),
                    unconnected_gradients=tf.UnconnectedGradients.NONE,
                )
                connected[:] = [g is not None for g in grads]
                return [tf.convert_to_tensor(g) for g in grads if g is not None]

            cotangents = [tf.convert_to_tensor(dys[i]) for i in wanted_out]
            n_xs = sum(differentiable) + len(variables)
            if wanted_out:
                found = tf.function(backward, autograph=False)(list(tensors), cotangents)
                found_it = iter(found)
                grads = [next(found_it) if c else None for c in connected]
            else:
                grads = [None] * n_xs
            it = iter(grads)
            input_grads = [next(it) if d else None for d in differentiable]
            variable_grads = [next(it) for _ in variables]
            return input_grads, variable_grads

        return flat_out, gradient

    flat = guarded_call(*[leaves[i] for i in tensor_at])
    return pack_tensor_leaves(held["result"], flat if isinstance(flat, (list, tuple)) else [flat])
