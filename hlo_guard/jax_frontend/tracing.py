"""Tracing a user's function to a jaxpr, once per input signature.

The signature is the pytree structure of the dynamic arguments, the shape,
dtype and weak type of every leaf, the static arguments' values and the x64
flag.  Eager calls with the same signature reuse the jaxpr and its analysis:
``guard(f)(x)`` never re-traces ``f``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from hlo_guard.errors import GuardUsageError
from hlo_guard.jax_frontend.argument_state import replaced_leaves
from hlo_guard.jax_frontend.compat import (
    attach_debug_info,
    inline_jits_of_current_trace,
    keep_inline_jits_of_current_trace,
)
from hlo_guard.jax_frontend.graph import JaxprGraph
from hlo_guard.jax_frontend.leaf_layout import LeafLayout, split_leaves
from hlo_guard.jax_frontend.rules import RULES
from passes.analysis import Analysis, analyze

#: closed-over constants of at most this many elements are read while
#: tracing (:meth:`JaxprGraph.known_constant`)
KNOWN_CONSTANT_MAX_SIZE = 4096


@dataclass
class TracedProgram:
    closed_jaxpr: Any
    analysis: Analysis
    #: the dynamic arguments' leaves: all of them, the static ones put back by
    #: ``layout.unflatten``; ``in_tree`` is the structure of the traced ones
    layout: LeafLayout
    out_tree: Any
    #: traced leaves the function replaced in its arguments (NNX state): their
    #: new values are the jaxpr's last outputs (:mod:`argument_state`)
    updated_leaves: tuple[int, ...] = ()

    @property
    def in_tree(self) -> Any:
        return self.layout.traced_tree


def normalize_static(
    fn, static_argnums, static_argnames
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Resolve static positions and names against each other, as ``jax.jit`` does."""
    if static_argnums is None:
        static_argnums = ()
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if static_argnames is None:
        static_argnames = ()
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)
    try:
        nums = tuple(static_argnums)
        names = tuple(static_argnames)
    except TypeError:
        raise GuardUsageError(
            "static_argnums must be an int or a sequence of ints and static_argnames a str "
            f"or a sequence of str; got {static_argnums!r} and {static_argnames!r}"
        ) from None
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in nums):
        raise GuardUsageError(f"static_argnums must contain ints, got {static_argnums!r}")
    if not all(isinstance(n, str) for n in names):
        raise GuardUsageError(f"static_argnames must contain strings, got {static_argnames!r}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return nums, names
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    has_varkw = any(p.kind is p.VAR_KEYWORD for p in params)
    for i in nums:
        if not has_varargs and not (-len(positional) <= i < len(positional)):
            raise GuardUsageError(
                f"static_argnums contains {i}, but {getattr(fn, '__name__', fn)} takes "
                f"{len(positional)} positional argument(s)"
            )
    known = {p.name for p in params}
    for n in names:
        if n not in known and not has_varkw:
            raise GuardUsageError(
                f"static_argnames contains {n!r}, which is not a parameter of "
                f"{getattr(fn, '__name__', fn)}"
            )
    nums = tuple(
        sorted(
            {i % len(positional) if (i < 0 and positional) else i for i in nums}
            | {positional.index(n) for n in names if n in positional}
        )
    )
    names = tuple(sorted(set(names) | {positional[i] for i in nums if i < len(positional)}))
    return nums, names


def split_arguments(args, kwargs, static_argnums, static_argnames):
    dyn_args, static_pos = [], []
    for i, a in enumerate(args):
        if i in static_argnums:
            static_pos.append((i, a))
        else:
            dyn_args.append(a)
    dyn_kwargs, static_kw = {}, []
    for k, v in kwargs.items():
        if k in static_argnames:
            static_kw.append((k, v))
        else:
            dyn_kwargs[k] = v
    static = (tuple(static_pos), tuple(sorted(static_kw)))
    try:
        hash(static)
    except TypeError:
        raise GuardUsageError(
            "static arguments must be hashable (they key the trace cache); got "
            f"{[type(v).__name__ for _, v in static_pos + static_kw]}"
        ) from None
    return (tuple(dyn_args), dyn_kwargs), static


def merge_arguments(dyn, static, n_args):
    dyn_args, dyn_kwargs = dyn
    static_pos, static_kw = static
    args = list(dyn_args)
    for i, a in static_pos:
        args.insert(i, a)
    kwargs = dict(dyn_kwargs)
    kwargs.update(static_kw)
    return args, kwargs


def leaf_aval(x, path: str):
    """The abstract value of a traced leaf (see ``leaf_layout.is_traced_leaf``)."""
    if isinstance(x, (np.ndarray, np.generic)) and (
        x.dtype.kind not in "biufcV" or x.dtype == object
    ):
        raise GuardUsageError(
            f"{path} has dtype {x.dtype}, which JAX cannot trace; "
            "pass numeric arrays (or mark the argument static)"
        )
    return jax.typeof(x)


def function_label(fn) -> str:
    """``Model.energy``, ``f``: the user's name for ``fn`` in messages."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def positional_names(fn) -> tuple[str, ...]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def describe_path(path, fn=None, dyn_positions: Sequence[int] = ()) -> str:
    """ "argument 'params' of f at ['w']" / "keyword argument 'scale' of f" for a
    leaf of the (dynamic args, dynamic kwargs) pytree: the user's parameter
    names where the signature gives them, positions otherwise."""
    keystr = jax.tree_util.keystr
    of = f" of {function_label(fn)}" if fn is not None else ""
    if len(path) >= 2 and getattr(path[0], "idx", None) == 0:
        rest = keystr(tuple(path[2:]))
        k = path[1].idx
        pos = dyn_positions[k] if k < len(dyn_positions) else k
        names = positional_names(fn) if fn is not None else ()
        head = f"argument {names[pos]!r}" if pos < len(names) else f"positional argument {pos}"
        return head + of + (f" at {rest}" if rest else "")
    if len(path) >= 2:
        rest = keystr(tuple(path[2:]))
        return f"keyword argument {keystr((path[1],))[1:-1]}" + of + (f" at {rest}" if rest else "")
    return keystr(path)


def signature_of(fn, args, kwargs, static_argnums, static_argnames):
    dyn, static = split_arguments(args, kwargs, static_argnums, static_argnames)
    dyn_positions = [i for i in range(len(args)) if i not in static_argnums]
    leaves_with_paths, layout = split_leaves(
        *jax.tree_util.tree_flatten_with_path(dyn),
        describe=lambda path: describe_path(path, fn, dyn_positions),
    )
    leaves = [leaf for _, leaf in leaves_with_paths]
    avals = tuple(
        leaf_aval(leaf, describe_path(path, fn, dyn_positions)) for path, leaf in leaves_with_paths
    )
    key = (
        layout,
        tuple(
            (
                a.shape,
                a.dtype,
                getattr(a, "weak_type", False),
                str(getattr(a, "sharding", "")),
                str(getattr(a, "manual_axis_type", "")),
            )
            for a in avals
        ),
        static,
        bool(jax.config.jax_enable_x64),
    )
    return key, leaves, avals, layout, static


def leaf_descriptions(fn, args, kwargs, static_argnums, static_argnames) -> list[str]:
    """The user's names of the traced leaves (:func:`signature_of`'s order),
    for messages: "argument 'k' of f"."""
    dyn, _ = split_arguments(args, kwargs, static_argnums, static_argnames)
    dyn_positions = [i for i in range(len(args)) if i not in static_argnums]

    def describe(path):
        return describe_path(path, fn, dyn_positions)

    traced, _ = split_leaves(*jax.tree_util.tree_flatten_with_path(dyn), describe=describe)
    return [describe(path) for path, _ in traced]


def spec_of(aval):
    """A ShapeDtypeStruct keeping what tracing depends on: the weak type
    (Python scalars promote differently), under explicit-axis meshes the
    sharding that is part of the type, and inside a ``shard_map`` body the
    varying manual axes (without them the trace has no ``pvary`` on literals and
    re-binding fails with 'requires varying manual axes to match')."""
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None and not getattr(mat, "empty", True):
        return aval  # make_jaxpr takes the ShapedArray, varying axes included
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    if (
        mesh is None
        or getattr(mesh, "empty", True)
        or not getattr(sharding, "spec", None)
        or all(p is None for p in sharding.spec)
    ):
        sharding = None
    try:
        return jax.ShapeDtypeStruct(
            aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False), sharding=sharding
        )
    except (TypeError, ValueError):
        return jax.ShapeDtypeStruct(
            aval.shape, aval.dtype, weak_type=getattr(aval, "weak_type", False)
        )


def trace(
    fn,
    avals,
    layout: LeafLayout,
    static,
    n_args,
    static_argnums=(),
    static_argnames=(),
    keep_inline_jits: bool = True,
    constant_leaves: Sequence[int] = (),
) -> TracedProgram:
    """``fn``'s jaxpr at these argument types, and its analysis.

    ``keep_inline_jits``: ``jit(inline=True)`` calls made directly by ``fn``
    (``jnp.mean``, every ``jnp`` ufunc) stay calls in the jaxpr: eager JAX
    runs each as one compiled computation, and so must eager ``guard(fn)``
    to give the same bits.  A program staged into a jaxpr is compiled whole
    and needs no such boundary: its trace inlines them, as jax 0.10's own
    trace does (jax 0.11+ keeps them until lowering), and the small plain
    calls ``fn`` makes, as XLA does
    (:func:`compat.inline_jits_of_current_trace`).
    JAX's tracing errors name ``fn`` and its arguments, not this flat
    wrapper.  ``constant_leaves``: leaves no enclosing transformation
    differentiates, analysed as constants (no derivative)."""
    out_tree_box = []
    updated_box = []

    def flat_fn(*leaves):
        dyn = layout.unflatten(leaves)
        args, kwargs = merge_arguments(dyn, static, n_args)
        keep = (
            keep_inline_jits_of_current_trace()
            if keep_inline_jits
            else inline_jits_of_current_trace()
        )
        with keep:
            out = fn(*args, **kwargs)
        out_leaves, out_tree = jax.tree_util.tree_flatten(out)
        out_tree_box.append(out_tree)
        # state written into the arguments (NNX variables): extra outputs,
        # not differentiated
        updated = replaced_leaves(dyn, leaves, layout)
        updated_box.append(tuple(k for k, _ in updated))
        return out_leaves + [jax.lax.stop_gradient(v) for _, v in updated]

    specs = [spec_of(a) for a in avals]
    # JAX names the flat function's arguments from these: the traced leaves
    # only (static leaves stand as None, which is no leaf)
    example_args, example_kwargs = merge_arguments(
        jax.tree_util.tree_unflatten(layout.traced_tree, specs), static, n_args
    )
    attach_debug_info(
        flat_fn, fn, example_args, example_kwargs, tuple(static_argnums), tuple(static_argnames)
    )
    closed = jax.make_jaxpr(flat_fn)(*specs)
    # Closed-over arrays are constants (no derivative, never guarded) -- unless
    # they are tracers of an enclosing transformation, which do carry one.
    concrete = [
        (v, c)
        for v, c in zip(closed.jaxpr.constvars, closed.consts)
        if not isinstance(c, jax.core.Tracer)
    ]
    constant = [v for v, _ in concrete] + [closed.jaxpr.invars[i] for i in constant_leaves]
    # small ones are read while tracing (a finite factor is no hazard), as
    # host copies: a large table is neither copied nor read
    values = {v: np.asarray(c) for v, c in concrete if np.size(c) <= KNOWN_CONSTANT_MAX_SIZE}
    graph = JaxprGraph(closed.jaxpr, constant_inputs=constant, constant_values=values)
    analysis = analyze(graph, RULES)
    return TracedProgram(closed, analysis, layout, out_tree_box[-1], updated_box[-1])
