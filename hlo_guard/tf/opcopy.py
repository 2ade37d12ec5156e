"""Re-creating a graph operation with other inputs.

Masks need two kinds of copies of an operation: a *shadow* copy computing an
original value from gradient-stopped inputs (when the imported value sits
downstream of a guard and reading it would close a cycle), and a *probe* copy
whose differentiable inputs are replaced by zeros so that TF's own registered
gradient, applied to a 0/1 cotangent, tells which input lanes the operation
reads.  Both keep the node's attributes (``T``, ``axis``, ``keep_dims`` ...) and
drop the private ones (``_class`` colocation, ``_output_shapes``), which name
the original node and would be wrong for a copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from hlo_guard.tf import compat


def copy_op(
    op: tf.Operation,
    inputs: Sequence[tf.Tensor],
    *,
    op_type: str | None = None,
    name: str | None = None,
    attrs: Mapping[str, object] | None = None,
) -> tf.Operation:
    """A copy of ``op`` reading ``inputs``; ``attrs`` (raw ``AttrValue``\\ s)
    replace some of its attributes, as an undilated copy of a dilated
    convolution needs."""
    graph = tf.compat.v1.get_default_graph()
    own = {k: v for k, v in op.node_def.attr.items() if not k.startswith("_")}
    merged = {**own, **(attrs or {})}
    base = name or ("hlo_guard_copy/" + op.name.split("/")[-1])
    return compat.create_op(
        graph,
        op_type or op.type,
        list(inputs),
        dtypes=[t.dtype for t in op.outputs],
        name=graph.unique_name(base, mark_as_used=False),
        attrs=merged,
    )


def is_stateful(op: tf.Operation) -> bool:
    """Whether running ``op`` a second time could differ or have an effect."""
    try:
        return bool(op.op_def.is_stateful)
    except (
        AttributeError,
        ValueError,
    ):  # pragma: no cover - unknown op kinds are assumed effectful
        return True


def move_consumers(op: tf.Operation, new_outputs: Sequence[tf.Tensor]) -> None:
    """Point every reader of ``op``'s outputs at ``new_outputs`` (a guarded
    or otherwise re-created copy of ``op``)."""
    for old, new in zip(op.outputs, new_outputs):
        for consumer in old.consumers():
            for k, t in enumerate(consumer.inputs):
                if t.name == old.name:
                    compat.update_input(consumer, k, new)
