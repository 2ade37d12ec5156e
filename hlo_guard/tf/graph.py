"""A slice of a TensorFlow graph seen through :class:`passes.graph.Graph`.

The nodes are the operations that ``import_graph_def`` created for the user's
traced function inside the guarded wrapper, in a topological order (data and
control edges).  Values are tensor *names* (``"hlo_guard/Sqrt:0"``): graph
tensors are unhashable in TF2, names are stable and cheap.  Tensors that come
from outside the slice (the wrapper's arguments, identities of captured
handles) are inputs without a producer, like a jaxpr's ``invars``.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence

import tensorflow as tf


def is_inexact(dtype) -> bool:
    dtype = tf.as_dtype(dtype)
    return bool(dtype.is_floating or dtype.is_complex)


def carries_derivative(dtype) -> bool:
    """Floating/complex tensors, and ``variant`` ones: a TensorList (what
    ``tf.TensorArray``, ``tf.map_fn`` and autograph loops accumulate into) holds
    floats whose gradient TF propagates through the handle.  Without this the
    loop body's ``TensorListSetItem`` output would look derivative-free and the
    whole body would be skipped -- a silent miss."""
    return is_inexact(dtype) or tf.as_dtype(dtype) == tf.variant


def _input_independent(ops: Sequence[tf.Operation], tensors: dict) -> set[str]:
    """Outputs of ``Const`` ops, and of stateless ops reading only such values
    (``tf.fill``, ``zeros * 2``): they depend on no graph input, so their
    cotangent goes nowhere.  Guarding one is not only pointless but harmful
    under XLA: a constant ``atan2(0, 0)`` is folded to 0 while compiling, but
    TF's XLA CPU kernel of ``atan2(select(p, 0, 0), ...)`` gives NaN (found
    by the TF fuzz oracle, 2026-11-28).  A stateful op (a variable read, a
    random draw) never counts."""
    found = {name for name, t in tensors.items() if t.op.type == "Const"}
    for op in ops:
        if not op.inputs or op.type == "Const":
            continue
        try:
            stateful = bool(op.op_def.is_stateful)
        except (AttributeError, ValueError):  # pragma: no cover - unknown kinds: not constant
            stateful = True
        if not stateful and all(t.name in found for t in op.inputs):
            found.update(t.name for t in op.outputs)
    return found


def topological_order(ops: Sequence[tf.Operation]) -> list[tf.Operation]:
    """Kahn's algorithm over data and control edges inside ``ops``.

    ``import_graph_def`` creates operations in dependency order already, but
    nothing documents that; sorting costs a linear pass and keeps the
    engine's "nodes are topologically ordered" contract explicit.  Ties keep
    creation order, so the order is deterministic.
    """
    index = {op.name: i for i, op in enumerate(ops)}
    indegree = [0] * len(ops)
    consumers: list[list[int]] = [[] for _ in ops]
    for i, op in enumerate(ops):
        preds = {t.op.name for t in op.inputs} | {c.name for c in op.control_inputs}
        for p in preds:
            j = index.get(p)
            if j is not None:
                indegree[i] += 1
                consumers[j].append(i)
    ready = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(ops[i])
        for k in consumers[i]:
            indegree[k] -= 1
            if indegree[k] == 0:
                heapq.heappush(ready, k)
    if len(order) != len(ops):  # a cycle cannot come out of a FuncGraph; be loud if it does
        raise ValueError("the imported graph is not acyclic")
    return order


class TFGraph:
    """Adapter of one imported TF graph slice for the analysis engine."""

    def __init__(
        self,
        ops: Sequence[tf.Operation],
        outputs: Sequence[tf.Tensor],
        locations: dict[str, str] | None = None,
        strip_prefix: str = "",
    ):
        self.ops: list[tf.Operation] = topological_order(list(ops))
        self.index = {op.name: i for i, op in enumerate(self.ops)}
        self._inputs = [[t.name for t in op.inputs] for op in self.ops]
        self._outputs = [[t.name for t in op.outputs] for op in self.ops]
        self._graph_outputs = [t.name for t in outputs]
        self._graph_inputs: list[Hashable | None] | None = None
        self.tensors: dict[str, tf.Tensor] = {}
        self._producer: dict[str, tuple[int, int]] = {}
        for n, op in enumerate(self.ops):
            for t in op.inputs:
                self.tensors.setdefault(t.name, t)
            for j, t in enumerate(op.outputs):
                self.tensors[t.name] = t
                self._producer[t.name] = (n, j)
        for t in outputs:
            self.tensors.setdefault(t.name, t)
        self._inexact = {name: carries_derivative(t.dtype) for name, t in self.tensors.items()}
        #: values that depend on no graph input (see :meth:`carries_derivative`)
        self._constants = _input_independent(self.ops, self.tensors)
        self.locations = locations or {}
        self.strip_prefix = strip_prefix

    # -- passes.graph.Graph --------------------------------------------------
    def node_count(self) -> int:
        return len(self.ops)

    def op_name(self, node: int) -> str:
        return self.ops[node].type

    def node_inputs(self, node: int) -> list[Hashable | None]:
        return self._inputs[node]

    def node_outputs(self, node: int) -> list[Hashable | None]:
        return self._outputs[node]

    def graph_outputs(self) -> list[Hashable | None]:
        return self._graph_outputs

    def graph_inputs(self) -> list[Hashable | None]:
        """The tensors the slice reads from outside (arguments, captured
        handles), in order of first read."""
        if self._graph_inputs is None:
            seen: dict[Hashable, None] = {}
            for names in self._inputs:
                for v in names:
                    if v not in self._producer:
                        seen.setdefault(v, None)
            self._graph_inputs = list(seen)
        return self._graph_inputs

    def carries_derivative(self, value) -> bool:
        """A floating tensor, other than a ``Const``: a constant's cotangent
        goes nowhere (as JAX's literals), so its uses are never guarded and
        never make a join.  The forward views count constants (a constant
        operand has a structurally zero *tangent*): :meth:`has_float_dtype`."""
        return self._inexact.get(value, False) and value not in self._constants

    def has_float_dtype(self, value) -> bool:
        return self._inexact.get(value, False)

    def origin(self, node: int) -> str:
        return self.ops[node].name

    # -- helpers ---------------------------------------------------------------
    def op(self, node: int) -> tf.Operation:
        return self.ops[node]

    def producer(self, name: str) -> tuple[int, int] | None:
        return self._producer.get(name)

    def user_name(self, op_name: str) -> str:
        """The operation's name in the user's traced function (import prefix removed)."""
        if self.strip_prefix and op_name.startswith(self.strip_prefix):
            return op_name[len(self.strip_prefix) :]
        return op_name

    def location(self, op_name: str) -> str:
        return self.locations.get(self.user_name(op_name), "")
