"""The user API: ``guard`` and ``guarded_jit``.

``guard(f)`` is a function transformation: it traces ``f`` to a jaxpr (once per
input signature), analyses which lanes carry a derivative, and evaluates the
jaxpr again with gradient guards.  Apply it *first*, then transform:
``jax.grad(guard(f))``, ``jax.hessian(guard(f))``, ``jax.vmap(guard(f))``.
``guarded_jit(f)`` is ``jax.jit(guard(f))`` and returns JAX's own jitted
function (``.lower()``, ``.trace()``, ``.eval_shape()`` as usual).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

import jax

from hlo_guard.collection import building_a_program, collection_paused
from hlo_guard.errors import GuardUsageError
from hlo_guard.jax_frontend.argument_state import write_back
from hlo_guard.jax_frontend.argument_tangents import (
    constant_arguments,
    untracked_arguments,
    warn_untracked_tangents,
)
from hlo_guard.jax_frontend.compat import public_nan_errors, staged_into_a_jaxpr
from hlo_guard.jax_frontend.interpreter import run_guarded
from hlo_guard.jax_frontend.surgery import CALL_PREFIX, evaluate_by_surgery
from hlo_guard.jax_frontend.trace_cache import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_CACHE_SIZE,
    TraceCache,
    arrays_held,
)
from hlo_guard.jax_frontend.tracing import (
    leaf_descriptions,
    normalize_static,
    signature_of,
    split_arguments,
    trace,
)
from hlo_guard.jax_frontend.value_mode import MODES

JIT_KEYWORDS = frozenset(p for p in inspect.signature(jax.jit).parameters if p != "fun")


def _check_mode(mode, who: str, keyword: str) -> str:
    if not isinstance(mode, str) or mode not in MODES:
        raise GuardUsageError(
            f"{who}: {keyword}={mode!r} is not a guard mode; use one of {list(MODES)} "
            "('gradient': dead lanes keep their values, only derivatives are cut; "
            "'value': value-dead lanes get a safe point, so NaN checkers run clean)"
        )
    return mode


def _check_callable(fn, who: str):
    if not callable(fn):
        raise GuardUsageError(f"{who} expects a callable, got {type(fn).__name__}: {fn!r}")


class GuardedFunction:
    """``f`` with gradient guards.  Composes with every JAX transformation.

    One trace (jaxpr and analysis) is kept per input signature, for the
    ``cache_size`` most recently used signatures, fewer when the constants they
    hold exceed ``cache_bytes`` together; ``jax.clear_caches()`` empties the
    cache.

    Methods: as with ``jax.jit``, ``self`` is an ordinary argument.  A class
    registered as a pytree (``jax.tree_util.register_dataclass``, flax,
    equinox) has its arrays traced -- and differentiated -- like any argument;
    any other ``self`` is refused with a message that says so, unless marked
    static (``@guard(static_argnums=0)``: hashable, and its attributes are then
    baked into the trace, as under ``jax.jit``).  Decorating a ``staticmethod``
    or ``classmethod`` works in either order; a ``classmethod``'s ``cls`` is
    bound as a constant (a class is not data).
    """

    def __init__(
        self,
        fn: Callable,
        static_argnums=(),
        static_argnames=(),
        cache_size: int = DEFAULT_CACHE_SIZE,
        cache_bytes: int | None = DEFAULT_CACHE_BYTES,
        mode: str = "gradient",
        has_aux: bool = False,
    ):
        self.mode = _check_mode(mode, "hlo_guard.guard", "mode")
        self.has_aux = _check_has_aux(has_aux, "hlo_guard.guard")
        self._binding = "method"
        if isinstance(fn, staticmethod):
            fn, self._binding = fn.__func__, "static"
        elif isinstance(fn, classmethod):
            fn, self._binding = fn.__func__, "class"
        _check_callable(fn, "hlo_guard.guard")
        self.fn = fn
        #: what is traced: ``fn``, its aux output gradient-stopped (``has_aux``)
        self._traced_fn = _stop_aux_gradient(fn) if self.has_aux else fn
        self.static_argnums, self.static_argnames = normalize_static(
            fn, static_argnums, static_argnames
        )
        self._static_spec = (static_argnums, static_argnames)
        self._cache = TraceCache(
            cache_size,
            f"hlo_guard.guard({getattr(fn, '__qualname__', fn)})",
            max_bytes=cache_bytes,
            weigh=lambda program: arrays_held(program.closed_jaxpr),
        )
        self._bound_to_class: dict[Any, GuardedFunction] = {}
        # name, docs and ``__wrapped__``; the wrapped function's own attributes
        # only where they name nothing of ours.  ``jax.grad``, ``jax.vmap`` and
        # ``functools.wraps`` copy a guarded function's attributes onto their
        # wrapper, and merging those back wholesale made ``guard(jax.grad(guard(f)))``
        # the guard of ``f`` itself (its ``fn``, trace cache and mode).
        functools.update_wrapper(self, fn, updated=())
        for name, value in getattr(fn, "__dict__", {}).items():
            self.__dict__.setdefault(name, value)

    @property
    def original(self) -> Callable:
        """The user's function as the guard traces it (``has_aux``: its aux
        gradient-stopped): the unguarded side of comparisons and dumps."""
        return self._traced_fn

    def traced(self, *args, **kwargs):
        """(program, flat dynamic leaves) for these arguments, tracing on a
        cache miss: the program a call made here evaluates."""
        inspecting = getattr(_INSPECTING, "active", False)
        staged = staged_into_a_jaxpr() and not inspecting
        # (value mode promises finite values in dead lanes, constants' too)
        see_constants = not inspecting and self.mode == "gradient"
        return self.traced_for(staged, args, kwargs, see_constants)

    def traced_for(self, staged: bool, args, kwargs, see_constants: bool = False):
        """:meth:`traced` for a call staged into a jaxpr (``staged``: under
        ``jax.jit``, where the program is compiled whole and jnp's inline
        jits are inlined in its trace as JAX's own trace inlines them -- fewer
        bodies to analyse) or evaluated eagerly (they stay calls, each run as
        one computation as eager JAX runs it: the same bits).

        ``see_constants``: arguments no enclosing transformation can
        differentiate, beside ones it can, are traced as constants (no
        tangent, no cotangent; :func:`constant_arguments`).  Without it the
        program is the one every call shape shares (reports describe it)."""
        key, leaves, avals, layout, static = signature_of(
            self.fn, args, kwargs, self.static_argnums, self.static_argnames
        )
        constant = constant_arguments(leaves) if see_constants else ()
        untracked = untracked_arguments(leaves, constant) if see_constants else ()
        key = (key, bool(staged), constant)
        program = self._cache.get(key)
        if program is None:
            program = trace(
                self._traced_fn,
                avals,
                layout,
                static,
                len(args),
                self.static_argnums,
                self.static_argnames,
                keep_inline_jits=not staged,
                constant_leaves=constant,
            )
            # A function that closes over a tracer of an enclosing transformation
            # (guard inside jax.grad of something else) bakes that tracer into the
            # jaxpr's constants: such a trace is valid for this call only.
            if not any(isinstance(c, jax.core.Tracer) for c in program.closed_jaxpr.consts):
                self._cache.put(key, program)
        if untracked:
            names = leaf_descriptions(
                self.fn, args, kwargs, self.static_argnums, self.static_argnames
            )
            warn_untracked_tangents(program, untracked, names.__getitem__)
        return program, leaves

    def __call__(self, *args, **kwargs):
        with collection_paused():
            program, leaves = self.traced(*args, **kwargs)
        with public_nan_errors(), collection_paused(building_a_program()):
            outs = None
            if not getattr(_INSPECTING, "active", False):
                outs = evaluate_by_surgery(
                    program.analysis,
                    program.closed_jaxpr.consts,
                    leaves,
                    self.mode,
                    _call_name(self.fn),
                )
            if outs is None:
                outs = run_guarded(
                    program.analysis, program.closed_jaxpr.consts, leaves, mode=self.mode
                )
        n_state = len(program.updated_leaves)
        if n_state:
            outs, state = outs[: len(outs) - n_state], outs[len(outs) - n_state :]
            dyn, _ = split_arguments(args, kwargs, self.static_argnums, self.static_argnames)
            write_back(dyn, leaves, program.updated_leaves, state)
        return jax.tree_util.tree_unflatten(program.out_tree, outs)

    def __get__(self, obj, objtype=None):
        """Method binding: ``self`` becomes the first argument (as for ``jax.jit``)."""
        if self._binding == "static":
            return self
        if self._binding == "class":
            return self._bound_to(objtype if objtype is not None else type(obj))
        if obj is None:
            return self
        if isinstance(obj, type):  # ``@classmethod`` outside ``@guard``
            return self._bound_to(obj)
        return functools.partial(self, obj)

    def _bound_to(self, cls) -> GuardedFunction:
        """This function with ``cls`` bound as a constant (a class is not data),
        one guarded function (and trace cache) per class."""
        bound = self._bound_to_class.get(cls)
        if bound is None:
            nums, names = self._static_spec
            nums = (nums,) if isinstance(nums, int) else tuple(nums or ())
            shifted = tuple(i - 1 for i in nums if i > 0)
            bound = GuardedFunction(
                functools.partial(self.fn, cls),
                shifted,
                names,
                self._cache.maxsize,
                self._cache.max_bytes,
                mode=self.mode,
                has_aux=self.has_aux,
            )
            self._bound_to_class[cls] = bound
        return bound

    def __repr__(self):
        mode = "" if self.mode == "gradient" else f", mode={self.mode!r}"
        aux = ", has_aux=True" if self.has_aux else ""
        return f"guard({getattr(self.fn, '__qualname__', self.fn)!r}{mode}{aux})"


_INSPECTING = threading.local()


@contextlib.contextmanager
def evaluating_the_inspected_program():
    """Calls of guarded functions inside the block evaluate the program a
    call outside any trace evaluates (jnp's inline jits kept as calls), even
    when the block is traced: ``explain``, the dumps and ``compare`` trace
    and compile that program, whose calls name the user's ``jnp`` functions
    (``maximum``, ``x > 0``) where the inlined one has only primitives."""
    prev = getattr(_INSPECTING, "active", False)
    _INSPECTING.active = True
    try:
        yield
    finally:
        _INSPECTING.active = prev


def _call_name(fn) -> str:
    """The name of the one call a guarded program is staged as under
    ``jax.jit`` (:mod:`hlo_guard.jax_frontend.surgery`): ``guarded_<fn>``."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return f"{CALL_PREFIX}{name}"


def _check_has_aux(has_aux, who: str) -> bool:
    if not isinstance(has_aux, bool):
        raise GuardUsageError(f"{who}: has_aux must be True or False, got {has_aux!r}")
    return has_aux


def _stop_aux_gradient(fn: Callable) -> Callable:
    """``fn`` returning ``(output, stop_gradient(aux))``.

    ``jax.grad(f, has_aux=True)`` never differentiates ``aux``, but the guard
    cannot know that from the trace: an aux that returns a value the output
    masks (the predictions beside a masked loss) is a live output in every
    lane, so nothing upstream of it would be guarded.  Stopping its gradient
    says what ``has_aux`` means; its values are unchanged."""

    @functools.wraps(fn)
    def with_aux_stopped(*args, **kwargs):
        result = fn(*args, **kwargs)
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise GuardUsageError(
                f"{getattr(fn, '__qualname__', fn)} was guarded with has_aux=True, so it must "
                f"return a pair (output, aux), as for jax.grad(..., has_aux=True); it "
                f"returned {type(result).__name__}"
                + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else "")
            )
        out, aux = result
        return out, jax.tree_util.tree_map(jax.lax.stop_gradient, aux)

    return with_aux_stopped


def guard(
    fn: Callable | None = None,
    *,
    static_argnums=(),
    static_argnames=(),
    cache_size: int = DEFAULT_CACHE_SIZE,
    cache_bytes: int | None = DEFAULT_CACHE_BYTES,
    mode: str = "gradient",
    has_aux: bool = False,
):
    """Return ``fn`` with gradient guards inserted before every operation whose
    dead lanes could turn a structural zero into NaN.

    ``mode="gradient"`` (default) changes no value: ``select(m, x, stop_gradient(x))``.
    ``mode="value"`` is the literal double where: lanes dead by a select or never
    read get a safe point of the operation (``sqrt``/``log``/``div`` -> 1,
    ``arccos`` -> 0), so intermediates are finite and ``jax_debug_nans`` runs
    clean; lanes that still decide the result (the loser of ``max``/``min``)
    keep the gradient guard.

    Usable as ``guard(f)``, ``@guard`` or ``@guard(static_argnums=..., mode=...)``.
    ``cache_size`` bounds the traces kept (one per input signature, least
    recently used dropped first; 0 re-traces on every call); ``cache_bytes``
    bounds the constants they hold together (each array counted once; the
    latest trace is always kept; None: no byte bound).

    ``has_aux=True``: ``fn`` returns ``(output, aux)`` and ``aux`` is not
    differentiated (as for ``jax.grad(..., has_aux=True)``): it is returned
    gradient-stopped, so that lanes ``output`` masks are not kept live by
    ``aux`` (the predictions returned beside a masked loss).
    """
    _check_mode(mode, "hlo_guard.guard", "mode")
    _check_has_aux(has_aux, "hlo_guard.guard")
    if fn is None:
        return lambda f: GuardedFunction(
            f, static_argnums, static_argnames, cache_size, cache_bytes, mode=mode, has_aux=has_aux
        )
    return GuardedFunction(
        fn, static_argnums, static_argnames, cache_size, cache_bytes, mode=mode, has_aux=has_aux
    )


def guarded_jit(
    fn: Callable | None = None,
    *,
    guard_mode: str = "gradient",
    has_aux: bool = False,
    **jit_kwargs,
):
    """``jax.jit(guard(fn, mode=guard_mode, has_aux=has_aux), **jit_kwargs)``;
    usable as ``@guarded_jit`` and ``@guarded_jit(static_argnums=...)``.
    Accepts every ``jax.jit`` keyword."""
    _check_mode(guard_mode, "hlo_guard.guarded_jit", "guard_mode")
    _check_has_aux(has_aux, "hlo_guard.guarded_jit")
    unknown = sorted(set(jit_kwargs) - JIT_KEYWORDS)
    if unknown:
        raise GuardUsageError(
            f"guarded_jit got unexpected keyword argument(s) {unknown}; "
            f"jax.jit accepts {sorted(JIT_KEYWORDS)}"
        )
    if fn is None:
        return lambda f: guarded_jit(f, guard_mode=guard_mode, has_aux=has_aux, **jit_kwargs)
    _check_callable(fn, "hlo_guard.guarded_jit")
    guarded = GuardedFunction(
        fn,
        jit_kwargs.get("static_argnums", ()),
        jit_kwargs.get("static_argnames", ()),
        mode=guard_mode,
        has_aux=has_aux,
    )
    return jax.jit(guarded, **jit_kwargs)
