"""Tracing a user's function to a jaxpr, once per input signature.

The signature is the pytree structure of the dynamic arguments, the shape,
dtype and weak type of every leaf, the static arguments' values and the x64
flag.  Eager calls with the same signature reuse the jaxpr and its analysis:
``guard(f)(x)`` never re-traces ``f``.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

import jax
import numpy as np

from passes.analysis import Analysis, analyze

from hlo_guard.errors import GuardUsageError
from hlo_guard.jax_frontend.graph import JaxprGraph
from hlo_guard.jax_frontend.rules import RULES


@dataclass
class TracedProgram:
    closed_jaxpr: Any
    analysis: Analysis
    in_tree: Any
    out_tree: Any


def normalize_static(fn, static_argnums, static_argnames) -> Tuple[Tuple[int, ...], Tuple[str, ...]]:
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
            f"or a sequence of str; got {static_argnums!r} and {static_argnames!r}") from None
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in nums):
        raise GuardUsageError(f"static_argnums must contain ints, got {static_argnums!r}")
    if not all(isinstance(n, str) for n in names):
        raise GuardUsageError(f"static_argnames must contain strings, got {static_argnames!r}")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return nums, names
    positional = [p.name for p in params
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    has_varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
    has_varkw = any(p.kind is p.VAR_KEYWORD for p in params)
    for i in nums:
        if not has_varargs and not (-len(positional) <= i < len(positional)):
            raise GuardUsageError(
                f"static_argnums contains {i}, but {getattr(fn, '__name__', fn)} takes "
                f"{len(positional)} positional argument(s)")
    known = {p.name for p in params}
    for n in names:
        if n not in known and not has_varkw:
            raise GuardUsageError(
                f"static_argnames contains {n!r}, which is not a parameter of "
                f"{getattr(fn, '__name__', fn)}")
    nums = tuple(sorted({i % len(positional) if (i < 0 and positional) else i for i in nums}
                        | {positional.index(n) for n in names if n in positional}))
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
            f"{[type(v).__name__ for _, v in static_pos + static_kw]}") from None
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
    if isinstance(x, (jax.Array, jax.core.Tracer)):
        return jax.typeof(x)
    if isinstance(x, (np.ndarray, np.generic)):
        if x.dtype.kind not in "biufcV" or x.dtype == object:
            raise GuardUsageError(
                f"{path} has dtype {x.dtype}, which JAX cannot trace; "
                "pass numeric arrays (or mark the argument static)")
        return jax.typeof(x)
    if isinstance(x, (bool, int, float, complex)):
        return jax.typeof(x)
    raise GuardUsageError(
        f"{path} is a {type(x).__name__}, not an array or a number; pass arrays, "
        "or mark it static with static_argnums/static_argnames")


def describe_path(path) -> str:
    """'positional argument 1 ['w']' / 'keyword argument 'scale'' for a leaf of
    the (dynamic args, dynamic kwargs) pytree."""
    keystr = jax.tree_util.keystr
    if len(path) >= 2 and getattr(path[0], "idx", None) == 0:
        rest = keystr(tuple(path[2:]))
        return f"positional argument {path[1].idx}" + (f" at {rest}" if rest else "")
    if len(path) >= 2:
        rest = keystr(tuple(path[2:]))
        return f"keyword argument {keystr((path[1],))[1:-1]}" + (f" at {rest}" if rest else "")
    return keystr(path)


def signature_of(fn, args, kwargs, static_argnums, static_argnames):
    dyn, static = split_arguments(args, kwargs, static_argnums, static_argnames)
    leaves_with_paths, treedef = jax.tree_util.tree_flatten_with_path(dyn)
    leaves = [leaf for _, leaf in leaves_with_paths]
    avals = tuple(leaf_aval(leaf, describe_path(path)) for path, leaf in leaves_with_paths)
    key = (treedef, tuple((a.shape, a.dtype, getattr(a, "weak_type", False),
                           str(getattr(a, "sharding", "")), str(manual_axes_of(a)))
                          for a in avals),
           static, bool(jax.config.jax_enable_x64))
    return key, leaves, avals, treedef, static


def manual_axes_of(aval):
    """The value's varying/unreduced/reduced manual axes inside ``shard_map``
    (None outside): part of its type when ``check_vma`` is on."""
    mat = getattr(aval, "manual_axis_type", None)
    return None if mat is None or getattr(mat, "empty", True) else mat


def spec_of(aval):
    """A ShapeDtypeStruct keeping what tracing depends on: the weak type
    (Python scalars promote differently), under explicit-axis meshes the
    sharding that is part of the type, and inside ``shard_map`` the manual
    axes the value varies over -- traced without them, ``x > 0`` records no
    ``pvary`` of the literal and re-binding it on a varying ``x`` fails."""
    sharding = getattr(aval, "sharding", None)
    mesh = getattr(sharding, "mesh", None)
    manual = manual_axes_of(aval)
    if manual is None and (mesh is None or getattr(mesh, "empty", True)
                           or not getattr(sharding, "spec", None)
                           or all(p is None for p in sharding.spec)):
        sharding = None
    try:
        if manual is not None:
            return jax.ShapeDtypeStruct(aval.shape, aval.dtype,
                                        weak_type=getattr(aval, "weak_type", False),
                                        sharding=sharding, manual_axis_type=manual)
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype,
                                    weak_type=getattr(aval, "weak_type", False),
                                    sharding=sharding)
    except (TypeError, ValueError):
        return jax.ShapeDtypeStruct(aval.shape, aval.dtype,
                                    weak_type=getattr(aval, "weak_type", False))


def trace(fn, avals, treedef, static, n_args) -> TracedProgram:
    out_tree_box = []

    def flat_fn(*leaves):
        dyn = jax.tree_util.tree_unflatten(treedef, leaves)
        args, kwargs = merge_arguments(dyn, static, n_args)
        out = fn(*args, **kwargs)
        out_leaves, out_tree = jax.tree_util.tree_flatten(out)
        out_tree_box.append(out_tree)
        return out_leaves

    specs = [spec_of(a) for a in avals]
    closed = jax.make_jaxpr(flat_fn)(*specs)
    analysis = analyze(JaxprGraph(closed.jaxpr), RULES)
    return TracedProgram(closed, analysis, treedef, out_tree_box[-1])
