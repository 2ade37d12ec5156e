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
from collections.abc import Iterable

from hlo_guard.errors import GuardUsageError

_GRADIENT_SCOPE = re.compile(r"^(gradient_tape|gradients(_\d+)?)$")
_OWN_PROBE = "hlo_guard_probe"


def is_gradient_op_name(name: str) -> bool:
    """Whether an op named ``name`` was built by a tape or ``tf.gradients``."""
    parts = name.split("/")[:-1]  # the scopes; the last part is the op itself
    if any(p.startswith(_OWN_PROBE) for p in parts):
        return False
    return any(_GRADIENT_SCOPE.match(p) for p in parts)


def _node_name(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _called_functions(node) -> Iterable[str]:
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        for f in value.list.func:
            yield f.name


def _used_gradient_node(graph_def, fetch: Iterable[str]) -> str | None:
    """Name of a gradient op the fetched outputs depend on, or None.

    Only what the outputs (and control outputs, e.g. an optimizer's variable
    updates) depend on counts: a ``ForwardAccumulator`` active while the
    function is traced records tangents of captured variables inside it, and
    those are dead code (the accumulator takes its tangents from the guarded
    call instead)."""
    nodes = {n.name: n for n in graph_def.node}
    functions = {f.signature.name: f for f in graph_def.library.function}
    stack = [_node_name(r) for r in fetch]
    seen: set[str] = set()
    called: list[str] = []
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        if is_gradient_op_name(name):
            return name
        node = nodes[name]
        called.extend(_called_functions(node))
        stack.extend(_node_name(r) for r in node.input)
    done = set()
    while called:  # bodies of control flow and calls the outputs depend on
        fname = called.pop()
        if fname in done or fname not in functions:
            continue
        done.add(fname)
        for n in functions[fname].node_def:
            if is_gradient_op_name(n.name):
                return n.name
            called.extend(_called_functions(n))
    return None


def _find_op(graph, name: str):
    """The FuncGraph op of an inlined node name (``PartitionedCall/...`` prefixes
    stripped until something matches), for its user location."""
    parts = name.split("/")
    for k in range(len(parts)):
        try:
            return graph.get_operation_by_name("/".join(parts[k:]))
        except (KeyError, ValueError):
            continue
    return None


def check_no_inner_gradient(concrete, graph_def, fetch: Iterable[str], function_name: str) -> None:
    """Raise :class:`GuardUsageError` if the traced function's outputs depend on
    a gradient it computes itself."""
    from hlo_guard.tf.locations import user_location

    found = _used_gradient_node(graph_def, fetch)
    if found is None:
        return
    op = _find_op(concrete.graph, found)
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
        "        optimizer.apply_gradients(zip(grads, model.trainable_variables))"
    )
    # AutoGraph (the caller's tf.function) would re-raise an unknown exception
    # type as a StagingError; this attribute, which it checks, keeps ours
    error.ag_pass_through = True  # type: ignore[attr-defined]  # AutoGraph reads it
    raise error
