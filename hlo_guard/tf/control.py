"""Guarding the bodies of functional control flow (``If``, ``While``).

The outer analysis keeps these boundaries fully live (conservative, reported
when dead lanes arrive there).  Inside, each branch or loop body is a graph of
its own whose outputs are fully live: it gets the same treatment as the
top-level function -- imported into a fresh ``tf.function`` with the same
signature, analysed, guarded -- and the control-flow op is pointed at the
guarded function (``_set_func_attr``).  TF's own gradients for ``If``/``While``
rebuild the body graphs from the function library by name, so they
differentiate the guarded bodies.  Nested control flow is handled by the same
recursion.
"""

from __future__ import annotations

import tensorflow as tf

from hlo_guard.tf import compat
from passes.lattice import LIVE, dead_by

BODY_ATTRS = {
    "If": ("then_branch", "else_branch"),
    "StatelessIf": ("then_branch", "else_branch"),
    "While": ("body",),
    "StatelessWhile": ("body",),
    "Case": ("branches",),
    "StatelessCase": ("branches",),
}
_FIRST_BODY_INPUT = {
    "If": 1,
    "StatelessIf": 1,
    "While": 0,
    "StatelessWhile": 0,
    "Case": 1,
    "StatelessCase": 1,
}


#: branches run once and return their outputs: an output the caller never
#: uses is dead in the branch too (a loop body's outputs feed the next
#: iteration, so While bodies keep every output live)
BRANCHING = frozenset({"If", "StatelessIf", "Case", "StatelessCase"})


def _branch_out_liveness(graph, analysis, op):
    """Liveness of a branch's outputs: live where the op's output is used,
    dead (blamed on the op) where not, so that what a branch computes only for
    an unused output is cut from the derivative (TF feeds it zeros)."""
    if analysis is None or op.type not in BRANCHING:
        return None
    node = graph.index[op.name]
    out = []
    for v in graph.node_outputs(node):
        lv = analysis.value_liveness(v)
        out.append(LIVE if lv.reaches_output else dead_by(op.name))
    if all(lv is not LIVE for lv in out):
        return None  # never differentiated: nothing to cut
    return out


def _body_tangents(graph, forward, suspect_values, op):
    """(argument tangents, suspect flags, description) of ``op``'s bodies
    for their forward analysis, or None without a forward analysis."""
    if forward is None:
        return None
    from hlo_guard.tf.rules.control_flow import body_tangents

    node = graph.index[op.name]
    lvs, suspect = body_tangents(forward, node, op)
    first = _FIRST_BODY_INPUT[op.type]
    names = graph.node_inputs(node)[first:]
    suspect = [
        bool(s) or (suspect_values is not None and v in suspect_values)
        for s, v in zip(suspect, names)
    ]
    return list(lvs), suspect, f"'{op.type}' '{graph.user_name(op.name)}'"


def guard_bodies(
    graph,
    library,
    build_body,
    body_locations=None,
    depth: int = 0,
    analysis=None,
    forward=None,
    suspect_values=None,
) -> list[tuple[str, str, object]]:
    """Rewrite the bodies of every control-flow op of ``graph`` (a TFGraph).

    Returns ``[(op name, attr, BuildRecord of the guarded body)]`` for bodies
    that got at least one guard (for the report).  ``build_body`` guards one
    body graph (:func:`hlo_guard.tf.rewrite.build_body`); it is passed in
    because the rewrite calls this module for every graph it guards, bodies
    included.  ``forward`` (the graph's
    forward analysis) and ``suspect_values`` give the bodies their
    arguments' tangents (:mod:`hlo_guard.tf.rules.control_flow`).
    """
    fdefs = {f.signature.name: f for f in library.function}
    results = []
    for op in graph.ops:
        attrs = BODY_ATTRS.get(op.type)
        if not attrs or depth > 8:
            continue
        inputs = op.inputs[_FIRST_BODY_INPUT[op.type] :]
        tangents = _body_tangents(graph, forward, suspect_values, op)
        for attr in attrs:
            value = op.get_attr(attr)
            funcs = list(value) if isinstance(value, (list, tuple)) else [value]
            names = [f.name for f in funcs]
            changed = False
            for k, name in enumerate(names):
                fdef = fdefs.get(name)
                if fdef is None:
                    continue
                new_name, record, new_graph = guard_function(
                    build_body,
                    fdef,
                    inputs,
                    library,
                    body_locations or {},
                    depth,
                    _branch_out_liveness(graph, analysis, op),
                    tangents,
                )
                label = (
                    attr
                    if len(funcs) == 1 and not isinstance(value, (list, tuple))
                    else f"{attr}[{k}]"
                )
                if new_name is None:
                    # unchanged, but its unguarded sites still belong in the report
                    if _has_unguarded(record):
                        results.append((op.name, label, record))
                    continue
                names[k] = new_name
                changed = True
                results.append((op.name, label, record))
                cached = _CACHED_GRAPH.get((op.type, attr))
                if cached is not None:
                    # TF differentiates the op through this Python graph,
                    # where the guards' custom gradients close over their
                    # masks; rebuilt from the FunctionDef, it would hold
                    # other tensors, and the closures' masks would be "out of
                    # scope" there (a Keras RNN with masking crashed)
                    setattr(op, cached, new_graph)
            if not changed:
                continue
            if isinstance(value, (list, tuple)):
                op._set_func_list_attr(attr, names)  # pylint: disable=protected-access
            else:
                op._set_func_attr(attr, names[0])  # pylint: disable=protected-access
    return results


#: (op type, function attribute) -> the attribute on which ``while_v2`` keeps
#: the Python graph of that function.  Not ``cond_v2``'s branches: its
#: gradient makes both branches return the same intermediates, which fails
#: when one is this graph and the other is rebuilt from its FunctionDef (the
#: branches are rebuilt, as before; a contraction guard inside a branch, whose
#: custom gradient closes over its masks, is a known gap there)
_CACHED_GRAPH = {
    ("While", "body"): "_body_graph",
    ("StatelessWhile", "body"): "_body_graph",
}


def _has_unguarded(record) -> bool:
    return bool(record.unguarded or record.skipped) or any(
        _has_unguarded(sub) for _, _, sub in record.nested
    )


def _changed(record) -> bool:
    """Whether a body got a guard, itself or in a body nested in it."""
    return bool(record.applied or record.output_guards) or any(
        _changed(sub) for _, _, sub in record.nested
    )


def guard_function(
    build_body, fdef, inputs, library, body_locations, depth, out_liveness=None, tangents=None
):
    """(name of a guarded copy of ``fdef`` added to the current graph, record,
    its Python graph), or (None, record, None) when the body needs no guard."""
    shapes = [t.shape for t in inputs]
    body_graph = compat.function_def_to_graph(fdef, input_shapes=shapes)
    body_def = body_graph.as_graph_def()
    body_def.library.CopyFrom(library)
    in_names = [t.name for t in body_graph.inputs]
    out_names = [t.name for t in body_graph.outputs]
    specs = [tf.TensorSpec(t.shape, t.dtype) for t in body_graph.inputs]
    holder = {}

    def body(*args):
        for outer, arg in zip(inputs, args):
            # a variable's shape and dtype ride on its handle (a TensorList's
            # element shape on its variant): without them a read inside the
            # body has an unknown shape, and the gradient of a broadcasting
            # op then computes its axes at run time, which XLA refuses ("must
            # be a compile-time constant")
            if arg.dtype in (tf.resource, tf.variant):
                compat.copy_handle_data(outer, arg)
        outputs, record = build_body(
            body_def,
            in_names,
            out_names,
            args,
            library,
            body_locations,
            fdef.signature.name,
            depth + 1,
            out_liveness,
            tangents,
        )
        holder["record"] = record
        return outputs

    body.__name__ = fdef.signature.name + "_hlo_guard"
    concrete = tf.function(body, input_signature=specs, autograph=False).get_concrete_function()
    record = holder["record"]
    if not _changed(record):
        return None, record, None
    graph = tf.compat.v1.get_default_graph()
    concrete.add_to_graph(graph)
    return concrete.function_def.signature.name, record, concrete.graph
