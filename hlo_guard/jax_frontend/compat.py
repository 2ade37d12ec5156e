"""The places where hlo_guard reaches into JAX internals, kept together.

JAX 0.10 has no public way to

* register a cache so that ``jax.clear_caches()`` clears it (JAX's own caches
  are registered with ``jax._src.util.register_cache``, a weak registry of
  objects with ``cache_clear``/``cache_info``/``cache_keys``), nor
* trace a function *without* inlining the ``jit(inline=True)`` calls it makes
  (every ``jnp`` ufunc, ``jnp.mean``, ``jnp.linalg.norm`` ...).  Eager JAX runs
  such a call as one compiled computation, whose simplifier may round
  differently from the same equations dispatched one by one (``x / 1`` folded
  away, a division by ``n`` turned into a multiplication): to be bitwise equal
  to eager ``f``, eager ``guard(f)`` must see those boundaries too.

* stage an equation it re-evaluates unchanged into the jaxpr being traced by
  *copying* it (:func:`restage`), as JAX's own ``inline_jaxpr_into_trace``
  does, instead of binding it again: binding re-runs the primitive's dispatch
  and shape rule, which made the rewrite cost more than tracing the user's
  function in the first place (issue 17, item 3).

The hooks degrade gracefully: if the internal name is gone, the cache is
simply not cleared by ``jax.clear_caches()`` (it stays bounded), inline
jits are inlined as JAX does by default (values may then differ by an ulp),
and equations are bound again instead of copied (slower, same jaxpr).
``tests/test_api_memory.py`` and ``tests/test_eager_bitwise.py`` check that
the hooks are active on the installed JAX.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import numpy as np

_local = threading.local()
_STAGING: dict[str, bool | None] = {"installed": None}


def register_with_clear_caches(cache: Any, what: str) -> bool:
    """Have ``jax.clear_caches()`` call ``cache.cache_clear()``.  The registry
    holds ``cache`` weakly.  Returns whether the hook is available."""
    try:
        from jax._src.util import register_cache
    except ImportError:  # pragma: no cover - a future JAX
        return False
    register_cache(cache, what)
    return True


def _jit_staging():
    try:
        from jax._src import core as jcore
        from jax._src.interpreters import partial_eval as pe
        from jax._src.pjit import jit_p
    except ImportError:  # pragma: no cover - a future JAX
        return None
    return jcore, pe, jit_p


def current_trace():
    """The trace JAX binds to right now (the jaxpr trace inside make_jaxpr)."""
    from jax._src import core as jcore

    return jcore.trace_ctx.trace


def _install_staging_rule() -> bool:
    """Wrap JAX's staging rule for ``jit`` once: while a top-level trace of
    ours is marked to keep them, its inline jits are staged as calls (params
    unchanged, so re-binding them later inlines them exactly where JAX would
    have); while one is marked to inline them, its late-inline and small
    plain jits are inlined (:func:`inline_jits_of_current_trace`)."""
    installed = _STAGING["installed"]
    if installed is not None:
        return installed
    _STAGING["installed"] = False
    found = _jit_staging()
    if found is None:  # pragma: no cover
        return False
    jcore, pe, jit_p = found
    original = pe.custom_staging_rules.get(jit_p)
    if original is None:  # pragma: no cover
        return False

    def plain_body(params) -> bool:
        return not any(isinstance(c, jcore.Ref) for c in params["jaxpr"].consts) and not any(
            getattr(v, "initial_qdd", None) for v in params["jaxpr"].jaxpr.invars
        )

    def staging_rule(trace, source_info, *args, **params):
        if jit_inlines(params) and _marked(trace, "keep") and plain_body(params):
            return trace.default_process_primitive(jit_p, args, params, source_info=source_info)
        early = _inlined_early(params)
        if early is not None and _marked(trace, "inline") and plain_body(params):
            return original(trace, source_info, *args, **early)
        return original(trace, source_info, *args, **params)

    staging_rule.__wrapped__ = original  # type: ignore[attr-defined]
    pe.custom_staging_rules[jit_p] = staging_rule
    _STAGING["installed"] = True
    return True


@contextlib.contextmanager
def _marking_current_trace(mode: str):
    """Mark the trace JAX binds to now for one staging ``mode`` of the
    wrapped ``jit`` rule (``"keep"``: stage inline jits as calls;
    ``"inline"``: inline small and late-inline jits) for the block.  Only
    that trace is marked: the nested traces of calls made in the block,
    whose jaxprs JAX caches for every caller, are untouched.  Yields whether
    the rule is in place."""
    if not _install_staging_rule():
        yield False
        return
    trace = current_trace()
    attr = f"marked_{mode}"
    prev = getattr(_local, attr, ())
    setattr(_local, attr, prev + (trace,))
    try:
        yield True
    finally:
        setattr(_local, attr, prev)


def _marked(trace, mode: str) -> bool:
    """Whether ``trace`` is marked for ``mode`` (:func:`_marking_current_trace`)."""
    return any(trace is t for t in getattr(_local, f"marked_{mode}", ()))


def keep_inline_jits_of_current_trace():
    """Inside a function being traced by ``jax.make_jaxpr``: stage the
    ``jit(inline=True)`` calls made directly at this level as calls instead
    of inlining them (nested levels are untouched)."""
    return _marking_current_trace("keep")


def inline_jits_of_current_trace():
    """Inside a function being traced by ``jax.make_jaxpr`` for a program
    compiled whole: inline, while tracing, the ``jit(inline=True)`` calls made
    directly at this level (as jax 0.10 does) and the small plain ones
    (:data:`SMALL_CALL_EQUATIONS`: ``jnp.where``'s ``_where``, ``jnp.clip``,
    ``jnp.cumprod``).  Nested levels are untouched.

    jax 0.11+ keeps an inline call (``Inline.JAX_LATE``: every ``jnp`` ufunc)
    in the jaxpr and inlines it only when lowering, and XLA inlines every
    call before optimising, so the compiled program is the same either way.
    The guard's analysis and rewrite pay per call (a nested analysis, a
    forward context, a guarded body re-bound as a call with masks passed in
    and a shared-body fingerprint) what they do not pay per equation:
    numpyro's StickBreakingTransform traced as a user writes it has five
    such calls around eight operations."""
    return _marking_current_trace("inline")


#: a plain ``jit`` call (``Inline.AUTO``) whose body has at most this many
#: equations is inlined too (``jnp.clip``, ``jnp.cumprod``, ``jnp.pad``'s
#: helper): XLA inlines every call before optimising, and lowering a body of
#: a few operations inline costs what lowering the call does
SMALL_CALL_EQUATIONS = 8


def _inlined_early(params: dict) -> dict | None:
    """``params`` of a late-inline ``jit`` (jax 0.11+ ``Inline.JAX_LATE``) or
    of a small plain one, with the early inlining JAX's staging rule applies
    while tracing, or None for any other ``jit``.

    jax 0.10.x: ``inline`` is a bool, and ``True`` is inlined early already;
    a small plain call gets ``True``.  jax 0.11/0.12: ``JAX_LATE`` and a small
    ``AUTO`` call get ``JAX_EARLY``."""
    value = params.get("inline", False)
    early: Any
    if isinstance(value, bool):
        plain, early = not value, True
    else:
        name = getattr(value, "name", None)
        if name not in ("AUTO", "JAX_LATE"):
            return None
        plain, early = name == "AUTO", getattr(type(value), "JAX_EARLY", None)
        if early is None:  # pragma: no cover - a future JAX
            return None
    if plain and not _small_plain_call(params):
        return None
    return dict(params, inline=early)


def _small_plain_call(params: dict) -> bool:
    body = params["jaxpr"]
    return (
        len(body.jaxpr.eqns) <= SMALL_CALL_EQUATIONS
        and not body.jaxpr.effects
        and not any(params.get("donated_invars", ()))
        and not params.get("compiler_options_kvs")
    )


def staged_into_a_jaxpr() -> bool:
    """Whether what is bound now ends up in a jaxpr being traced: the
    current trace is a jaxpr trace or transforms into one (a JVP or batching
    trace whose parent chain reaches one: ``jax.jit(jax.grad(f))``).  Not
    for eager evaluation, and not for an eager ``jax.grad``, whose primal
    values are computed as they go (its partial-evaluation trace is not a
    jaxpr trace of this kind); False when the chain cannot be read."""
    from jax._src import core as jcore
    from jax._src.interpreters import partial_eval as pe

    staging = getattr(pe, "DynamicJaxprTrace", None)
    trace = getattr(jcore.trace_ctx, "trace", None)
    for _ in range(256):  # a transformation stack deeper than this: say no
        if trace is None or staging is None:
            return False
        if isinstance(trace, staging):
            return True
        trace = getattr(trace, "parent_trace", None)
    return False  # pragma: no cover


def evaluating_eagerly() -> bool:
    """Whether operations bound now run at once (JAX's eval trace) rather
    than being staged or transformed."""
    from jax._src import core as jcore

    eval_trace = getattr(jcore, "EvalTrace", None)
    return eval_trace is not None and type(jcore.trace_ctx.trace) is eval_trace


def never_differentiated(x) -> bool:
    """Whether no transformation enclosing this call can differentiate
    ``x``: a concrete array (an argument ``jax.jacfwd``'s ``argnums`` left
    out, a constant passed in), or only a batching trace's tracer of one.
    A jaxpr trace's tracer may be differentiated after staging
    (``jax.grad(jax.jit(f))``), and a JVP's carries a tangent, so both
    count as differentiable."""
    import jax

    inner = _unwrapped(x, linearize=False)
    return inner is not None and not isinstance(inner, jax.core.Tracer)


def under_forward_mode(x) -> bool | None:
    """Whether ``x`` carries a forward-mode tangent at this call: a JVP's
    tracer, perhaps inside a batching or linearize tracer (``jacfwd`` of a
    ``vmap``, ``hessian``).  False for a concrete value or a jaxpr trace's
    tracer reached without one; None for a tracer of another kind."""
    import jax
    from jax._src.interpreters import ad, partial_eval

    inner = _unwrapped(x, linearize=True)
    if inner is None:
        return None
    if not isinstance(inner, jax.core.Tracer):
        return False
    kind = type(inner)
    if kind is getattr(ad, "JVPTracer", None):
        return True
    if kind is getattr(partial_eval, "DynamicJaxprTracer", None):
        return False
    return None


def _unwrapped(x, linearize: bool):
    """``x`` with the tracers that only wrap a value taken off -- a batching
    tracer's ``val``, and (``linearize``) a linearize tracer's ``primal`` --
    or None past a nesting deeper than any real one."""
    from jax._src.interpreters import ad, batching

    wrappers = {getattr(batching, "BatchTracer", None): "val"}
    if linearize:
        wrappers[getattr(ad, "LinearizeTracer", None)] = "primal"
    wrappers.pop(None, None)
    for _ in range(256):
        attr = wrappers.get(type(x))
        if attr is None:
            return x
        x = getattr(x, attr)
    return None  # pragma: no cover


def inline_jits_inline_here() -> bool:
    """Whether a ``jit(inline=True)`` bound now would be inlined into the
    jaxpr being traced (a plain jaxpr trace that is not one of ours keeping
    its inline jits as calls): then calling the function is the same as
    binding the jit, without tracing it to a jaxpr of its own first."""
    trace = _plain_jaxpr_trace()
    return trace is not None and not _marked(trace, "keep")


def attach_debug_info(flat_fn, fn, args, kwargs, static_argnums, static_argnames) -> bool:
    """Make JAX's tracing errors name the user's function and arguments.

    ``make_jaxpr`` sees only the flat function of array leaves that tracing
    builds; without this, a ``TracerBoolConversionError`` says "while tracing
    the function flat_fn ... the argument leaves[0]".  JAX reads a prepared
    ``DebugInfo`` from the ``__fun_debug_info__`` attribute (what its own
    wrappers use); we build it from the user's function and arguments."""
    try:
        from jax._src import api_util
    except ImportError:  # pragma: no cover
        return False
    try:
        dbg = api_util.debug_info(
            "hlo_guard.guard",
            fn,
            args,
            kwargs,
            static_argnums=static_argnums,
            static_argnames=static_argnames,
        )
        api_util.save_wrapped_fun_debug_info(flat_fn, dbg)
    except Exception:  # pragma: no cover - names are a courtesy, never a failure
        return False
    return True


def primitive_jvp(prim):
    """JAX's own JVP rule of ``prim``, a maker of symbolic-zero tangents and
    the symbolic-zero type; or None.  Used to differentiate an implicitly
    broadcasting operation at its *unbroadcast* primals with a broadcast
    (guarded) tangent, so that its derivative is computed as plain JAX
    computes it (same operand shapes, so the same kernels and rounding)."""
    try:
        from jax._src import ad_util
        from jax._src.interpreters import ad
    except ImportError:  # pragma: no cover
        return None
    rule = ad.primitive_jvps.get(prim)
    if rule is None:
        return None

    def zero(x):
        import jax

        return ad_util.Zero(jax.typeof(x).to_tangent_aval())

    return rule, zero, ad_util.Zero


def define_masking_primitive(name: str, impl, jvp, transpose):
    """A new primitive ``name(mask, x)`` whose output has ``x``'s type, with
    ``impl`` as its evaluation and lowering, the given JVP and transpose
    rules, and a batching rule that moves both operands' batch axes to the
    front.  Defining a primitive is JAX's documented extension point ("How
    JAX primitives work"); the rule tables it fills are internal, so it is
    done here.  ``jvp(prim, primals, tangents, zero_type)`` and
    ``transpose(ct, mask, x, zero_type)`` receive JAX's symbolic-zero type
    to test tangents and cotangents against (and the JVP the primitive)."""
    from jax._src.interpreters import ad, batching, mlir
    from jax.extend.core import Primitive

    prim = Primitive(name)
    prim.def_impl(impl)
    prim.def_abstract_eval(lambda mask, x: x)
    mlir.register_lowering(prim, mlir.lower_fun(impl, multiple_results=False))
    ad.primitive_jvps[prim] = lambda primals, tangents: jvp(prim, primals, tangents, ad.Zero)
    ad.primitive_transposes[prim] = lambda ct, mask, x: transpose(ct, mask, x, ad.Zero)

    def batch(args, dims):
        size = next(np.shape(a)[d] for a, d in zip(args, dims) if d is not None)
        mask, x = (batching.bdim_at_front(a, d, size) for a, d in zip(args, dims))
        return prim.bind(mask, x), 0

    batching.primitive_batchers[prim] = batch
    return prim


def custom_jvp_rule_jaxpr(eqn, tangent_is_zero: list[bool]):
    """A staged ``custom_jvp_call``'s rule as a jaxpr: ``(jaxpr, consts,
    out_zeros)``, the jaxpr taking the non-constant primals then the tangents
    not flagged zero, ``out_zeros`` flagging the output tangents the rule
    leaves symbolically zero; or None.

    This is the very thunk JAX's own JVP of the equation calls
    (``custom_derivatives.lift_jvp``), memoized per equation by JAX; calling
    it directly skips the JVP machinery wrapped around it (a JVP trace, the
    primitive's processing, the primal body bound again), which cost as much
    again as tracing the rule itself (Equinox's vmapped ``relu``, whose rule
    is traced afresh in every trace)."""
    rule = eqn.params.get("jvp_jaxpr_fun")
    call_wrapped = getattr(rule, "call_wrapped", None)
    if call_wrapped is None:  # pragma: no cover - a future JAX
        return None
    found = call_wrapped(*tangent_is_zero)
    if not (isinstance(found, tuple) and len(found) == 3):  # pragma: no cover
        return None
    return found


# -- staging a re-evaluated equation by copying it ------------------------------


def _restage_internals():
    try:
        from jax._src import core as jcore
        from jax._src import source_info_util
        from jax._src.interpreters import partial_eval as pe
    except ImportError:  # pragma: no cover - a future JAX
        return None
    trace_type = getattr(pe, "DynamicJaxprTrace", None)
    tracer_type = getattr(pe, "DynamicJaxprTracer", None)
    rules = getattr(pe, "custom_staging_rules", None)
    if (
        trace_type is None
        or tracer_type is None
        or rules is None
        or not hasattr(trace_type, "emit_eqn")
        or not hasattr(jcore, "trace_ctx")
    ):  # pragma: no cover - a future JAX
        return None
    return jcore.trace_ctx, trace_type, tracer_type, rules, source_info_util.current, jcore.Literal


_RESTAGE = _restage_internals()


def _plain_jit_staging():
    """``(jit_p, Ref)`` when JAX's staging rule for ``jit`` (under our wrapper
    of it, :func:`_install_staging_rule`) and its forwarding rule are the
    ones :func:`_jit_staged_plainly` was checked against (jax 0.10-0.12:
    ``pjit_staging_rule``, ``pjit_forwarding_rule``), else None: a rule we
    have not read is never assumed to do nothing."""
    found = _jit_staging()
    if found is None or _RESTAGE is None:  # pragma: no cover - a future JAX
        return None
    jcore, pe, jit_p = found
    rule = pe.custom_staging_rules.get(jit_p)
    rule = getattr(rule, "__wrapped__", rule)
    forwarding = getattr(pe, "forwarding_rules", {}).get(jit_p)
    if (
        getattr(rule, "__name__", None) != "pjit_staging_rule"
        or getattr(forwarding, "__name__", None) not in (None, "pjit_forwarding_rule")
        or not hasattr(jcore, "Ref")
    ):  # pragma: no cover - a future JAX
        return None
    inline = getattr(pe, "inline_jaxpr_into_trace", None)
    if inline is None:  # pragma: no cover - a future JAX
        return None
    return jit_p, jcore.Ref, inline


_PLAIN_JIT = _plain_jit_staging()


def _jit_staged_plainly(eqn) -> bool:
    """Whether binding this ``jit`` equation in a jaxpr trace would stage it
    as the same equation, which is then what copying it gives.

    JAX's staging rule for ``jit`` (``pjit_staging_rule``, jax 0.10-0.12)
    raises for nested ``compiler_options``, inlines a ``jit`` it inlines
    while tracing (:func:`jit_inlined_while_tracing`; on jax 0.10 every
    ``jnp`` function), moves mutable ``Ref`` constants into operands and
    updates the state of ``Ref`` operands; otherwise it is
    ``default_process_primitive``, whose output types are the body's and
    whose forwarding rule for ``jit`` forwards nothing.  On jax 0.12 every
    ``jnp`` function is a ``jit`` that stays a call in the jaxpr, so most
    equations of a library's code are these."""
    if _PLAIN_JIT is None or eqn.primitive is not _PLAIN_JIT[0]:
        return False
    params = eqn.params
    if params.get("compiler_options_kvs") or jit_inlined_while_tracing(params):
        return False
    body = params.get("jaxpr")
    consts = getattr(body, "consts", None)
    inner = getattr(body, "jaxpr", body)
    if consts is None or not hasattr(inner, "invars"):  # pragma: no cover - a future JAX
        return False
    if any(isinstance(c, _PLAIN_JIT[1]) for c in consts):
        return False
    return not any(getattr(v, "initial_qdd", None) for v in [*inner.constvars, *inner.invars])


def _plain_jaxpr_trace():
    """The trace bound to now if it is a plain jaxpr trace (not a JVP,
    batching or eager evaluation, whose ``bind`` does more than stage an
    equation), else None."""
    if _RESTAGE is None:
        return None
    trace = _RESTAGE[0].trace
    return trace if type(trace) is _RESTAGE[1] else None


def _staged_in(x, trace) -> bool:
    """Whether ``x`` is a tracer of the jaxpr trace ``trace``."""
    return type(x) is _RESTAGE[2] and x._trace is trace


def restage_available() -> bool:
    """Whether :func:`restage` can copy equations on the installed JAX."""
    return _RESTAGE is not None


def restage(eqn, invals, source=None, ctx=None):
    """``eqn`` staged again into the jaxpr being traced, reading ``invals``,
    by copying it: its primitive, parameters and output types as they are,
    without re-running the primitive's dispatch and shape rule.  Returns the
    output tracers, or None where copying is not the same as binding -- then
    the caller binds.

    Copying is what ``bind`` would do exactly when the current trace is a
    plain jaxpr trace (not a JVP, batching or eager evaluation), every operand
    is a tracer of that trace with the type the equation was traced with (a
    guard's select keeps its operand's type, so guarded operands qualify), and
    the primitive has no staging rule of its own (calls, whose rule may inline
    or forward; a ``jit`` its rule stages as it is, :func:`_jit_staged_plainly`,
    is copied) and no effects (whose operands JAX re-resolves).  The source
    location is the one ``bind`` would record (the caller's ``eqn_context``),
    or ``source`` and ``ctx`` when the caller passes what that context would
    hold (then it need not enter it)."""
    trace = _plain_jaxpr_trace()
    if trace is None:
        return None
    rules, current_source = _RESTAGE[3], _RESTAGE[4]
    if eqn.effects or (eqn.primitive in rules and not _jit_staged_plainly(eqn)):
        return None
    found = _operand_tracers(trace, eqn, invals, source)
    if found is None:
        return None
    tracers, source = found
    out_avals = [v.aval for v in eqn.outvars]
    if any(getattr(a, "has_qdd", False) for a in out_avals):
        return None  # mutable state: its type evolves, leave it to bind
    is_high = getattr(eqn.primitive, "is_high", None)
    if is_high is not None and is_high(*(t.aval for t in tracers), **eqn.params):
        return None  # a high-level primitive marks the jaxpr it is staged into
    if source is None:
        source = current_source()
    return trace.emit_eqn(tracers, out_avals, eqn.primitive, eqn.params, eqn.effects, source, ctx)


def _operand_tracers(trace, eqn, invals, source):
    """``(tracers, source)``: ``eqn``'s operands as tracers of ``trace``, as
    binding would see them -- a literal as a tracer holding it, at ``source``
    (taken now when None and a literal needs it), every other operand a
    tracer of ``trace`` with the type the equation was traced with -- or None
    when one is not (then binding is not the same as copying)."""
    _, _, tracer_type, _, current_source, literal = _RESTAGE
    tracers = []
    for v, x in zip(eqn.invars, invals):
        if type(v) is literal:
            if source is None:
                source = current_source()
            tracers.append(tracer_type(trace, v.aval, v, source))
        elif _staged_in(x, trace) and x.aval == v.aval:
            tracers.append(x)
        else:
            return None
    return tracers, source


def inline_in_place(eqn, invals, source):
    """A ``jit`` equation that JAX inlines while tracing
    (:func:`jit_inlined_while_tracing`: every ``jnp`` function on jax 0.12,
    each an ``Inline.JAX_EARLY`` call; ``inline=True`` on 0.10), staged as
    binding it would stage it: its body's equations copied into the jaxpr
    being traced by JAX's own ``pe.inline_jaxpr_into_trace``, at ``source``
    (the location ``bind`` would pass its staging rule) -- or None where that
    is not what ``bind`` would do (then the caller binds).

    What binding adds is the dispatch to the staging rule, which for such a
    ``jit`` (no ``compiler_options``, our trace not keeping its inline jits
    as calls, :func:`keep_inline_jits_of_current_trace`) is this call; most
    equations a library's code stages on jax 0.12 go this way.  A literal
    operand enters as :func:`restage` passes one."""
    trace = _plain_jaxpr_trace()
    if trace is None or _PLAIN_JIT is None or eqn.primitive is not _PLAIN_JIT[0]:
        return None
    params = eqn.params
    if (
        eqn.effects
        or params.get("compiler_options_kvs")
        or not jit_inlined_while_tracing(params)
        or _marked(trace, "keep")
    ):
        return None
    found = _operand_tracers(trace, eqn, invals, source)
    if found is None:
        return None
    tracers = found[0]
    body = params["jaxpr"]
    consts = getattr(body, "consts", None)
    inner = body if hasattr(body, "eqns") else getattr(body, "jaxpr", None)
    if consts is None or inner is None:  # pragma: no cover - a future JAX
        return None
    out = _PLAIN_JIT[2](trace, source, inner, consts, *tracers)
    return [trace.to_jaxpr_tracer(x, source) for x in out]


def staged_call_equation(outs, args):
    """``(primitive, params)`` of the one ``jit`` equation that binding a
    call just staged into the jaxpr being traced, reading exactly ``args``
    (no closed-over tracer became an operand; a constant argument, a mask
    known while tracing, became a constant operand) and giving exactly ``outs``;
    None when that is not what happened or when the equation could not be
    staged again as it is (effects, ``Ref`` constants, a tracer among its
    body's constants).  Read from the output tracers' producing equation
    (``DynamicJaxprTracer.parent``, jax 0.10-0.12).  For
    :mod:`staged_bodies`, which stages the equation again elsewhere."""
    trace = _plain_jaxpr_trace()
    if trace is None or _PLAIN_JIT is None or not outs:
        return None
    parent = getattr(outs[0], "parent", None)
    if parent is None or getattr(parent, "primitive", None) is not _PLAIN_JIT[0]:
        return None
    outvars = list(getattr(parent, "outvars", ()))
    ins = list(getattr(parent, "in_tracers", ()))
    if (
        parent.effects
        or len(outvars) != len(outs)
        or len(ins) != len(args)
        or any(not _staged_in(o, trace) or o.val is not v for o, v in zip(outs, outvars))
        or any(not _staged_in(t, trace) for t in ins)
        or any(t is not a for t, a in zip(ins, args) if _staged_in(a, trace))
    ):
        return None
    if not _jit_staged_plainly(parent):
        return None
    from jax.core import Tracer

    if any(isinstance(c, Tracer) for c in parent.params["jaxpr"].consts):
        return None
    return parent.primitive, parent.params


def no_mesh_in_context() -> bool:
    """Whether no mesh is in context (concrete, abstract or the resource
    environment's): a ``jit`` staged now then records the empty mesh, as one
    staged in any other such context does (``pjit.get_ctx_mesh``).
    :mod:`staged_bodies` shares staged calls only there; False when it
    cannot tell."""
    try:
        from jax._src import mesh as mesh_lib
    except ImportError:  # pragma: no cover - a future JAX
        return False
    try:
        meshes = (
            mesh_lib.get_concrete_mesh(),
            mesh_lib.get_abstract_mesh(),
            mesh_lib.thread_resources.env.physical_mesh,
        )
    except AttributeError:  # pragma: no cover - a future JAX
        return False
    return all(getattr(m, "empty", False) for m in meshes)


def _canonical_value():
    """JAX's canonicalisation of a constant argument (what ``jax.jit`` does
    to one before it becomes an operand), or None."""
    try:
        from jax._src import dtypes
    except ImportError:  # pragma: no cover - a future JAX
        return None
    return getattr(dtypes, "canonicalize_value", None)


_CANONICAL_VALUE = _canonical_value()


def bind_staged_call(staged, args):
    """Stage the call :func:`staged_call_equation` returned again, reading
    ``args`` -- or None where binding it would not give the same equation
    (not a plain jaxpr trace, a tracer of another trace, an operand of
    another type than the body's input).  A constant argument enters as a
    constant operand, as binding it does."""
    trace = _plain_jaxpr_trace()
    if trace is None:
        return None
    primitive, params = staged
    body = params["jaxpr"]
    inner = body if hasattr(body, "eqns") else body.jaxpr
    if len(inner.invars) != len(args):
        return None
    from jax.core import Tracer

    operands = []
    for v, x in zip(inner.invars, args):
        if isinstance(x, Tracer) and not _staged_in(x, trace):
            return None
        if not isinstance(x, Tracer):
            if _CANONICAL_VALUE is None:  # pragma: no cover - a future JAX
                return None
            x = trace.to_jaxpr_tracer(_CANONICAL_VALUE(x), _RESTAGE[4]())
        if x.aval != v.aval:
            return None
        operands.append(x)
    return list(primitive.bind(*operands, **params))


def emit(primitive, params: dict, invals, out_avals):
    """``primitive(*invals, **params)`` staged into the jaxpr being traced as
    one new equation with the given output types, without running the
    primitive's dispatch and shape rule -- or None where that is not what
    ``bind`` would do (then the caller binds).

    The guard's own equations (``stop_gradient``, ``select_n`` of a value
    with itself) are the bulk of what the rewrite adds, and their output type
    is their operand's; :func:`restage`'s conditions apply: a plain jaxpr
    trace, every operand a tracer of it, a primitive without a staging rule
    of its own, no effects."""
    trace = _plain_jaxpr_trace()
    if trace is None:
        return None
    _, _, _, rules, current_source, _ = _RESTAGE
    if primitive in rules or not all(_staged_in(x, trace) for x in invals):
        return None
    return trace.emit_eqn(
        list(invals), list(out_avals), primitive, params, frozenset(), current_source()
    )


def stop_gradient_primitive():
    """The primitive ``lax.stop_gradient`` binds (not exported publicly)."""
    try:
        from jax._src import ad_util
    except ImportError:  # pragma: no cover - a future JAX
        return None
    return getattr(ad_util, "stop_gradient_p", None)


# -- primitive parameters that moved between JAX versions ----------------------


def scan_layout(params: dict, n_invars: int) -> tuple[int, int]:
    """``(num_consts, num_carry)`` of a ``scan`` equation.

    jax 0.10.x: the params ``num_consts`` and ``num_carry``.  jax 0.11/0.12:
    they are gone; ``ft_in`` is a flat tree ``(consts, carry, xs)`` over the
    operands (``jax._src.flattree.FTTuple``), so the counts are the lengths of
    its first two parts once filled with the operand positions.  Every rule
    reads the layout here, never by key: a missing key must not silently read
    as zero carries."""
    if "num_carry" in params:  # jax 0.10
        return params["num_consts"], params["num_carry"]
    ft_in = params["ft_in"]  # jax 0.11, 0.12
    consts, carry, _ = ft_in.update(list(range(n_invars))).unpack()
    return len(list(consts)), len(list(carry))


def jit_inlines(params: dict) -> bool:
    """Whether a ``jit`` equation is one JAX inlines (``jit(inline=True)``).

    jax 0.10.x: the param ``inline`` is a bool.  jax 0.11/0.12: it is a
    ``jax.Inline`` member; ``AUTO`` is what ``inline=False`` became (so it is
    truthy but *not* inlined), ``True`` became ``JAX_LATE``, and ``JAX_EARLY``
    is inlined while tracing (never seen in a jaxpr, listed for completeness)."""
    value = params.get("inline", False)
    if isinstance(value, bool):
        return value
    return getattr(value, "name", None) in ("JAX_EARLY", "JAX_LATE")


def jit_inlined_while_tracing(params: dict) -> bool:
    """Whether JAX inlines a ``jit`` equation with these parameters into the
    jaxpr being traced when it is bound there (its staging rule), rather
    than keeping it as a call.

    jax 0.10.x: ``inline=True`` with no shardings or layouts given.  jax
    0.11/0.12: only ``JAX_EARLY``; ``JAX_LATE`` (what ``inline=True``
    became) stays a call in the jaxpr and is inlined when lowering."""
    value = params.get("inline", False)
    if isinstance(value, bool):
        if not value:
            return False
    elif getattr(value, "name", None) != "JAX_EARLY":
        return False
    unspecified = [*params.get("in_shardings", ()), *params.get("out_shardings", ())]
    if any(type(s).__name__ != "UnspecifiedValue" for s in unspecified):
        return False
    layouts = [*params.get("in_layouts", ()), *params.get("out_layouts", ())]
    return all(lay is None for lay in layouts)


class _NeverRaised(Exception):
    """Stands in when JAX no longer has the internal exception."""


def _internal_nan_error() -> type[Exception]:
    try:
        from jax._src.api_util import InternalFloatingPointError
    except ImportError:  # gone: then nothing raises it
        return _NeverRaised
    return InternalFloatingPointError


#: what an eagerly bound ``jit`` equation raises under ``jax_debug_nans``; JAX
#: converts it to ``FloatingPointError`` in its own ``jit`` wrapper, which an
#: equation re-bound by the interpreter never passes through
InternalNanError = _internal_nan_error()


@contextlib.contextmanager
def public_nan_errors():
    """Raise ``jax_debug_nans``/``jax_debug_infs`` findings as the
    ``FloatingPointError`` JAX's own ``jit`` raises, with JAX's wording."""
    try:
        yield
    except InternalNanError as e:
        name, ty = getattr(e, "name", "?"), getattr(e, "ty", "nan")
        raise FloatingPointError(f"invalid value ({ty}) encountered in {name}") from None


# -- building a guarded jaxpr by surgery (:mod:`surgery`) -----------------------


def plain_jaxpr_trace():
    """The trace bound now if it is a plain jaxpr trace (``jax.jit``,
    ``make_jaxpr``; not a JVP, batching or eager evaluation), else None."""
    return _plain_jaxpr_trace()


def staged_in(x, trace) -> bool:
    """Whether ``x`` is a tracer of the jaxpr trace ``trace``."""
    return _RESTAGE is not None and _staged_in(x, trace)


@contextlib.contextmanager
def side_trace():
    """A fresh jaxpr trace, bound for the block (yielded; None when this JAX
    has none we know).  :mod:`surgery` computes masks and guards in it, reading
    the program's own variables (:func:`tracer_of`), and takes the equations
    it staged (:func:`staged_equations`) to splice them into the program --
    what ``pe.trace_to_jaxpr_dynamic`` does, with inputs that are not new
    arguments but the variables of the jaxpr being rewritten."""
    if _RESTAGE is None:
        yield None
        return
    from jax._src import core as jcore

    parent = jcore.trace_ctx.trace
    trace = _RESTAGE[1](None, parent_trace=parent)
    with jcore.set_current_trace(trace):
        yield trace


def tracer_of(trace, var):
    """A tracer of ``trace`` (:func:`side_trace`) standing for the existing
    variable ``var``: equations staged from it read ``var`` itself."""
    return trace.var_to_tracer(var, _RESTAGE[4]())


def staged_equations(trace):
    """``(eqns, constvars, constvals)`` staged into a :func:`side_trace` so far,
    in staging order."""
    frame = trace.frame
    constvars = list(frame.constvar_to_val)
    return frame.get_eqns(), constvars, [frame.constvar_to_val[v] for v in constvars]


def _late_inline(template):
    """The ``inline`` value of a call kept in the jaxpr and inlined when
    lowering: jax 0.11/0.12 ``Inline.JAX_LATE``.  jax 0.10 has no such value:
    its ``inline=False`` call is lowered as a function of its own, which XLA
    inlines -- after fusion decisions that can round a derivative a few ulp
    differently from the flat program (``digamma``'s), and the StableHLO the
    user dumps holds a call -- so there the call would be ``inline=True``,
    inlined while tracing by JAX's own ``pe.inline_jaxpr_into_trace``
    (:mod:`surgery` does not stage calls on jax 0.10 at all: measured, the
    interpreter's copying was faster than that)."""
    if isinstance(template, bool):
        return True
    return getattr(type(template), "JAX_LATE", template)


def calls_kept_until_lowering() -> bool:
    """Whether :func:`bind_as_call` leaves its call in the jaxpr (jax 0.11+)
    rather than inlining it while tracing (jax 0.10)."""
    template = _call_template()
    return template is not None and not isinstance(template["inline"], bool)


_CALL_PARAMS: dict[str, Any] = {}


def _call_template():
    """The parameters ``jax.jit`` gives a one-argument call staged with no mesh
    in context, read once from a traced ``jit`` (the parameter set is the same
    on jax 0.10-0.12; per-argument tuples are widened by :func:`bind_as_call`)."""
    if "params" not in _CALL_PARAMS:
        import jax
        import numpy as np

        found = None
        if _PLAIN_JIT is not None:
            eqns = jax.make_jaxpr(jax.jit(lambda a: a))(np.float32(0)).jaxpr.eqns
            if len(eqns) == 1 and eqns[0].primitive is _PLAIN_JIT[0]:
                found = dict(eqns[0].params)
        _CALL_PARAMS["params"] = found
    return _CALL_PARAMS["params"]


_PER_INPUT = ("in_shardings", "in_layouts", "donated_invars")
_PER_OUTPUT = ("out_shardings", "out_layouts")


def jaxpr_with_inputs(like, invars, outvars, eqns):
    """A jaxpr of ``eqns`` with no constants, reading ``invars`` (the caller
    passes the constants ``like`` closed over as leading operands), with
    ``like``'s effects and debug info (nameless leading arguments).  Built
    from its parts: jax 0.12's ``Jaxpr`` carries its constants' values and
    its ``replace`` keeps them."""
    from jax.extend.core import Jaxpr

    debug = like.debug_info
    names = getattr(debug, "arg_names", None)
    if debug is not None and names is not None:
        extra = len(invars) - len(like.invars)
        debug = debug._replace(arg_names=("",) * extra + tuple(names))
    return Jaxpr((), list(invars), list(outvars), list(eqns), like.effects, debug)


def bind_as_call(jaxpr, args, name: str):
    """Stage ``jaxpr`` (no constants: :func:`jaxpr_with_inputs`) as ONE ``jit`` call reading
    ``args`` into the jaxpr being traced, its equations taken as they are (no
    re-tracing) -- or None where that cannot be done here (not a plain jaxpr
    trace, a mesh in context, a JAX whose ``jit`` parameters we have not read).
    The call is kept in the jaxpr and inlined when lowering (jax 0.11/0.12),
    or inlined while tracing (jax 0.10: :func:`_late_inline`)."""
    if _plain_jaxpr_trace() is None or not no_mesh_in_context():
        return None
    template = _call_template()
    if template is None:  # pragma: no cover - a future JAX
        return None
    from jax.extend.core import ClosedJaxpr

    params = dict(template)
    for key in _PER_INPUT:
        params[key] = (template[key][0],) * len(jaxpr.invars)
    for key in _PER_OUTPUT:
        params[key] = (template[key][0],) * len(jaxpr.outvars)
    params.update(jaxpr=ClosedJaxpr(jaxpr, []), name=name)
    params["inline"] = _late_inline(template["inline"])
    return list(_PLAIN_JIT[0].bind(*args, **params))


def close_leading_inputs(jaxpr, values):
    """``jaxpr`` with its first ``len(values)`` inputs closed over ``values``
    (the inverse of :func:`jaxpr_with_inputs`): a ``ClosedJaxpr``."""
    from jax.extend.core import ClosedJaxpr, Jaxpr

    if hasattr(jaxpr, "num_consts"):  # jax 0.12: the leading inputs carry the constants
        return ClosedJaxpr(jaxpr, list(values))
    n = len(values)
    debug = jaxpr.debug_info
    names = getattr(debug, "arg_names", None)
    if debug is not None and names is not None:
        debug = debug._replace(arg_names=tuple(names)[n:])
    inner = Jaxpr(
        jaxpr.invars[:n], jaxpr.invars[n:], jaxpr.outvars, jaxpr.eqns, jaxpr.effects, debug
    )
    return ClosedJaxpr(inner, list(values))
