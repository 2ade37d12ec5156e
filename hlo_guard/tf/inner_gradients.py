"""Refusing functions that differentiate themselves.

``@guarded_function`` on a whole train step -- ``with tf.GradientTape() as t:
loss = ...; grads = t.gradient(loss, vars)`` inside -- cannot be guarded: the
tape records the forward and builds the gradient ops *while the function is
traced*, before hlo_guard sees the graph.  Guards inserted afterwards change
the forward's inputs but not the gradient ops already built from it, so the
returned gradient would be exactly the unguarded one while the report said
nothing.  That silent miss is refused with an error that says where the guard
belongs (around the forward/loss, with the tape outside).

Gradient ops are recognised by the name scopes TF gives them: ``gradient_tape``
(``GradientTape.gradient`` / ``jacobian``) and ``gradients``/``gradients_N``
(``tf.gradients``), at any depth (``train/gradient_tape/...``, or the inlined
``PartitionedCall/gradients/...`` of a nested ``tf.function``).  hlo_guard's own
mask probes (scope ``hlo_guard_probe``, from a guard nested in the function)
are not the user's gradients and are ignored.
"""
from __future__ import annotations

import re
from typing import Iterable, Optional

from hlo_guard.errors import GuardUsageError

_GRADIENT_SCOPE = re.compile(r"^(gradient_tape|gradients(_\d+)?)$")
_OWN_PROBE = "hlo_guard_probe"


def is_gradient_op_name(name: str) -> bool:
    """Whether an op named ``name`` was built by a tape or ``tf.gradients``."""
    parts = name.split("/")[:-1]  # the scopes; the last part is the op itself
    if any(p.startswith(_OWN_PROBE) for p in parts):
        return False
    return any(_GRADIENT_SCOPE.match(p) for p in parts)


def _first_gradient_op(graph) -> Optional[object]:
    for op in graph.get_operations():
        if is_gradient_op_name(op.name):
            return op
    return None


def _gradient_node_names(graph_def) -> Iterable[str]:
    for n in graph_def.node:
        yield n.name
    for f in graph_def.library.function:
        for n in f.node_def:
            yield n.name


def check_no_inner_gradient(concrete, graph_def, function_name: str) -> None:
    """Raise :class:`GuardUsageError` if the traced function computes a gradient."""
    from hlo_guard.tf.tracing import user_location  # tracing imports this module

    op = _first_gradient_op(concrete.graph)
    if op is None and not any(is_gradient_op_name(n) for n in _gradient_node_names(graph_def)):
        return
    where = user_location(op) if op is not None else ""
    at = f" at {where}" if where else ""
    error = GuardUsageError(
        f"hlo_guard.tf.guard({function_name}): the function computes a gradient itself "
        f"(tf.GradientTape / tf.gradients{at}). The tape records the forward while the "
        "function is traced, before any guard can be inserted, so the gradient it returns "
        "would not be guarded. Guard the forward/loss function and keep the tape outside "
        "it:\n"
        "    loss_fn = hlo_guard.tf.guard(compute_loss)     # forward + loss only\n"
        "    @tf.function(jit_compile=True)\n"
        "    def train_step(x, y):\n"
        "        with tf.GradientTape() as tape:\n"
        "            loss = loss_fn(x, y)\n"
        "        grads = tape.gradient(loss, model.trainable_variables)\n"
        "        optimizer.apply_gradients(zip(grads, model.trainable_variables))")
    # AutoGraph (the caller's tf.function) would re-raise an unknown exception
    # type as a StagingError; this attribute, which it checks, keeps ours
    error.ag_pass_through = True
    raise error
