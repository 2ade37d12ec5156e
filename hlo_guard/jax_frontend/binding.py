"""Binding one jaxpr equation again, as the interpreter and the rules that
probe a call's own derivative rule both do.

A leaf module: rules import it without importing the interpreter that looks
them up (which would make a cycle)."""

from __future__ import annotations

import contextlib

import jax
from jax import lax
from jax.custom_derivatives import SymbolicZero
from jax.extend import source_info_util

from hlo_guard.jax_frontend.compat import inline_in_place, restage
from hlo_guard.jax_frontend.graph import is_inexact_aval


@contextlib.contextmanager
def eqn_context(eqn, at_call_site: bool = False):
    """The equation's source location and name stack, so that re-bound
    equations keep the user's names in dumps and error messages.

    ``at_call_site``: the equation belongs to the body of an inline call
    being evaluated in place (what JAX's own inlining does): it keeps the
    call's location, as JAX gives every inlined equation, and only extends
    the name stack."""
    name_stack = source_info_util.current_name_stack() + eqn.source_info.name_stack
    location = (
        source_info_util.set_name_stack(name_stack)
        if at_call_site
        else source_info_util.user_context(eqn.source_info.traceback, name_stack=name_stack)
    )
    with location, eqn.ctx.manager:
        yield


def copy_unchanged(eqn, invals, call_site=None):
    """An equation the rewrite leaves as it is, copied (:func:`compat.restage`)
    with the location and context ``eqn_context`` would give it, without
    entering that context (most equations of a program are these); None where
    copying does not apply -- then the caller goes the general way.

    ``call_site``: the source info current where an inline call's body is
    being evaluated in place (:func:`call_site_source`); every equation of the
    body gets its location and its own name stack appended, as JAX's own
    inlining (``pe.inline_jaxpr_into_trace``) gives them.  On jax 0.12 every
    ``jnp`` function is such a call, so most equations of a library's code are
    these."""
    info = eqn.source_info
    if call_site is not None:
        source = call_site.replace(name_stack=call_site.name_stack + info.name_stack)
    elif info.traceback is None:  # bind would record a fresh one
        return None
    else:
        name_stack = source_info_util.current_name_stack() + info.name_stack
        source = info.replace(name_stack=name_stack)
    out = restage(eqn, invals, source, eqn.ctx)
    if out is None:  # a jit JAX inlines: its body copied in place, as bind would
        out = inline_in_place(eqn, invals, source)
    return out


def call_site_source():
    """The source info an inline call's body is staged with, taken once for
    the whole body (``pe.inline_jaxpr_into_trace`` does the same): the
    location the enclosing ``eqn_context`` set, or a traceback taken now."""
    return source_info_util.current()


def bind_eqn(eqn, invals):
    """Bind ``eqn``'s primitive with its own parameters to ``invals``; always
    a list of outputs.  Inside a jaxpr trace an unchanged equation is copied
    rather than bound (:func:`compat.restage`): the same equation, staged at
    a fraction of the cost."""
    out = restage(eqn, invals)
    if out is not None:
        return out
    params = eqn.primitive.get_bind_params(eqn.params)
    subfuns, bind_params = params if isinstance(params, tuple) else ([], params)
    out = eqn.primitive.bind(*subfuns, *invals, **bind_params)
    return list(out) if eqn.primitive.multiple_results else [out]


def live_tangent_indices(tangents) -> list[int]:
    """The arguments whose tangent is not a symbolic zero.  Only those enter
    a JVP: instantiating a symbolic zero (a literal's, a constant's) would
    bring back ``0 * inf`` where the local derivative is infinite."""
    return [i for i, t in enumerate(tangents) if not isinstance(t, SymbolicZero)]


def jvp_in(fn, args, live, live_tangents):
    """``jax.jvp`` of ``fn(*args)`` in the arguments ``live`` only, the
    others held at their values."""

    def of_live(*xs):
        full = list(args)
        for i, x in zip(live, xs):
            full[i] = x
        return fn(*full)

    return jax.jvp(of_live, [args[i] for i in live], list(live_tangents))


def stop_if_inexact(x):
    """Side computations feed masks only: cut them from every derivative.
    Constants (non-tracers) carry no derivative and are left alone."""
    if isinstance(x, jax.core.Tracer) and is_inexact_aval(x):
        return lax.stop_gradient(x)
    return x
