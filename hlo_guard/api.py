"""The user API: ``guard`` and ``guarded_jit``.

``guard(f)`` is a function transformation: it traces ``f`` to a jaxpr (once per
input signature), analyses which lanes carry a derivative, and evaluates the
jaxpr again with gradient guards.  Apply it *first*, then transform:
``jax.grad(guard(f))``, ``jax.hessian(guard(f))``, ``jax.vmap(guard(f))``.
``guarded_jit(f)`` is ``jax.jit(guard(f))`` and returns JAX's own jitted
function (``.lower()``, ``.trace()``, ``.eval_shape()`` as usual).
"""
from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Optional

import jax

from hlo_guard.errors import GuardUsageError
from hlo_guard.jax_frontend.interpreter import run_guarded
from hlo_guard.jax_frontend.value_mode import MODES
from hlo_guard.jax_frontend.tracing import TracedProgram, normalize_static, signature_of, trace

JIT_KEYWORDS = frozenset(p for p in inspect.signature(jax.jit).parameters if p != "fun")


def _check_mode(mode, who: str, keyword: str) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise GuardUsageError(
            f"{who}: {keyword}={mode!r} is not a guard mode; use one of {list(MODES)} "
            "('gradient': dead lanes keep their values, only derivatives are cut; "
            "'value': value-dead lanes get a safe point, so NaN checkers run clean)")
    return mode


def _check_callable(fn, who: str):
    if not callable(fn):
        raise GuardUsageError(f"{who} expects a callable, got {type(fn).__name__}: {fn!r}")


class GuardedFunction:
    """``f`` with gradient guards.  Composes with every JAX transformation."""

    def __init__(self, fn: Callable, static_argnums=(), static_argnames=(),
                 mode: str = "gradient"):
        _check_callable(fn, "hlo_guard.guard")
        self.mode = _check_mode(mode, "hlo_guard.guard", "mode")
        self.fn = fn
        self.static_argnums, self.static_argnames = normalize_static(
            fn, static_argnums, static_argnames)
        self._cache: Dict[Any, TracedProgram] = {}
        functools.update_wrapper(self, fn)

    def traced(self, *args, **kwargs):
        """(program, flat dynamic leaves) for these arguments, tracing on a cache miss."""
        key, leaves, avals, treedef, static = signature_of(
            self.fn, args, kwargs, self.static_argnums, self.static_argnames)
        program = self._cache.get(key)
        if program is None:
            program = trace(self.fn, avals, treedef, static, len(args))
            # A function that closes over a tracer of an enclosing transformation
            # (guard inside jax.grad of something else) bakes that tracer into the
            # jaxpr's constants: such a trace is valid for this call only.
            if not any(isinstance(c, jax.core.Tracer) for c in program.closed_jaxpr.consts):
                self._cache[key] = program
        return program, leaves

    def __call__(self, *args, **kwargs):
        program, leaves = self.traced(*args, **kwargs)
        outs = run_guarded(program.analysis, program.closed_jaxpr.consts, leaves,
                           mode=self.mode)
        return jax.tree_util.tree_unflatten(program.out_tree, outs)

    def __get__(self, obj, objtype=None):  # allow use as a method decorator
        if obj is None:
            return self
        return functools.partial(self, obj)

    def __repr__(self):
        mode = "" if self.mode == "gradient" else f", mode={self.mode!r}"
        return f"guard({getattr(self.fn, '__qualname__', self.fn)!r}{mode})"


def guard(fn: Optional[Callable] = None, *, static_argnums=(), static_argnames=(),
          mode: str = "gradient"):
    """Return ``fn`` with gradient guards inserted before every operation whose
    dead lanes could turn a structural zero into NaN.

    ``mode="gradient"`` (default) changes no value: ``select(m, x, stop_gradient(x))``.
    ``mode="value"`` is the literal double where: lanes dead by a select or never
    read get a safe point of the operation (``sqrt``/``log``/``div`` -> 1,
    ``arccos`` -> 0), so intermediates are finite and ``jax_debug_nans`` runs
    clean; outputs are unchanged, and lanes that still decide the result (the
    loser of ``max``/``min``) keep the gradient guard.

    Usable as ``guard(f)``, ``@guard`` or ``@guard(static_argnums=..., mode=...)``.
    """
    _check_mode(mode, "hlo_guard.guard", "mode")
    if fn is None:
        return lambda f: GuardedFunction(f, static_argnums, static_argnames, mode)
    return GuardedFunction(fn, static_argnums, static_argnames, mode)


def guarded_jit(fn: Optional[Callable] = None, *, guard_mode: str = "gradient", **jit_kwargs):
    """``jax.jit(guard(fn, mode=guard_mode), **jit_kwargs)``; usable as
    ``@guarded_jit`` and ``@guarded_jit(static_argnums=...)``.  Accepts every
    ``jax.jit`` keyword."""
    _check_mode(guard_mode, "hlo_guard.guarded_jit", "guard_mode")
    unknown = sorted(set(jit_kwargs) - JIT_KEYWORDS)
    if unknown:
        raise GuardUsageError(
            f"guarded_jit got unexpected keyword argument(s) {unknown}; "
            f"jax.jit accepts {sorted(JIT_KEYWORDS)}")
    if fn is None:
        return lambda f: guarded_jit(f, guard_mode=guard_mode, **jit_kwargs)
    _check_callable(fn, "hlo_guard.guarded_jit")
    guarded = GuardedFunction(fn, jit_kwargs.get("static_argnums", ()),
                              jit_kwargs.get("static_argnames", ()), guard_mode)
    return jax.jit(guarded, **jit_kwargs)
