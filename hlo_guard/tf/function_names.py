"""Fresh function names for each build of a guarded program.

A guard builds its program once per kind of calling context
(``GuardedTFFunction.wrapper``: XLA or not), each time from the one traced
GraphDef.  TF's gradient of an ``If``/``Case``/``While`` op edits the
differentiated op and re-registers its bodies under their name plus
``_rewritten``, with extra outputs that depend on the context (``Optional``
intermediates outside XLA, plain tensors inside).  Two builds that imported
the same function names would register two different ``<name>_rewritten``
functions, which TF refuses ("Attempting to add a duplicate function ...
where the previous and current definitions differ").  TF's own tracing never
meets this: every trace names its bodies afresh.  So every build renames the
library it imports, with a suffix of its own, consistently in the graph's
nodes, the functions' bodies, their gradients, and the tables keyed by
function name that the rewrite reads (body locations, shaped bodies), and
registers the renamed functions where the originals were (the eager
context, :func:`compat.register_function_defs`).
"""

from __future__ import annotations

import dataclasses
import itertools

from hlo_guard.tf import compat
from hlo_guard.tf.tracing import TracedFunction

_BUILDS = itertools.count(1)


def with_fresh_function_names(traced: TracedFunction) -> TracedFunction:
    """``traced`` with every library function renamed for this build (the
    same object when it has no library: nothing to rename)."""
    library = traced.graph_def.library
    if not library.function:
        return traced
    suffix = f"_hg{next(_BUILDS)}"
    names = {f.signature.name: f.signature.name + suffix for f in library.function}
    graph_def = type(traced.graph_def)()
    graph_def.CopyFrom(traced.graph_def)
    _rename_graph(graph_def, names)
    compat.register_function_defs(graph_def.library.function)
    shaped = {}
    for name, fdef in traced.shaped_functions.items():
        copy = type(fdef)()
        copy.CopyFrom(fdef)
        _rename_function(copy, names)
        shaped[names.get(name, name)] = copy
    return dataclasses.replace(
        traced,
        graph_def=graph_def,
        body_locations={names.get(k, k): v for k, v in traced.body_locations.items()},
        shaped_functions=shaped,
    )


def _rename_graph(graph_def, names: dict[str, str]) -> None:
    for node in graph_def.node:
        _rename_attrs(node.attr, names)
    for fdef in graph_def.library.function:
        _rename_function(fdef, names)
    for gradient in graph_def.library.gradient:
        gradient.function_name = names.get(gradient.function_name, gradient.function_name)
        gradient.gradient_func = names.get(gradient.gradient_func, gradient.gradient_func)


def _rename_function(fdef, names: dict[str, str]) -> None:
    fdef.signature.name = names.get(fdef.signature.name, fdef.signature.name)
    _rename_attrs(fdef.attr, names)
    for node in fdef.node_def:
        _rename_attrs(node.attr, names)


def _rename_attrs(attrs, names: dict[str, str]) -> None:
    """Every function a node's (or function's) attributes name, renamed:
    ``func`` values and lists of them, and functions named inside their own
    attributes."""
    for value in attrs.values():
        kind = value.WhichOneof("value")
        if kind == "func":
            _rename_name_list(value.func, names)
        elif kind == "list":
            for func in value.list.func:
                _rename_name_list(func, names)


def _rename_name_list(func, names: dict[str, str]) -> None:
    func.name = names.get(func.name, func.name)
    _rename_attrs(func.attr, names)
