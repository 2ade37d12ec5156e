"""What the guard can tell about its arguments' derivatives at a call.

``guard(f)`` is traced once per signature, before it is known which
arguments the enclosing transformation differentiates.  Forward mode needs
to know: ``where(x > 1, x, k)`` takes ``k``'s lanes with a zero tangent when
``jax.jacfwd`` differentiates ``x`` only, and a ``sqrt`` after it then needs
a guard on those lanes.  Taking ``k`` as live (every argument alike) is the
unsafe direction there.

* An argument no enclosing transformation can differentiate -- a concrete
  array, or a batching tracer of one -- is traced as a constant
  (:func:`constant_arguments`).
* An argument a ``jax.jit`` around the transformation traces
  (``jax.jit(jax.jacfwd(guard(f)))(x, k)``) may still be differentiated
  after staging, by a transformation around the ``jit``; a guard that took
  it as constant would cut that derivative.  It stays live, and when the
  forward guards it would need are missing a warning names them
  (:func:`warn_untracked_tangents`): the derivative may be NaN there.
  (A tracer closed over from around the ``jit`` is the same: live.)
"""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

from hlo_guard.jax_frontend.compat import never_differentiated, under_forward_mode
from hlo_guard.jax_frontend.graph import is_inexact_aval
from hlo_guard.jax_frontend.plan import plan_of
from hlo_guard.jax_frontend.rule_table import RULES
from hlo_guard.source import eqn_location
from passes.analysis import analyze_forward
from passes.lattice import LIVE, NO_DERIVATIVE
from passes.planning import plan_output_guards


class UnguardedTangentWarning(UserWarning):
    """Forward-mode derivatives of a guarded function may be NaN at this
    call: an argument the transformation does not differentiate could not
    be told apart from one it does."""


def constant_arguments(leaves) -> tuple[int, ...]:
    """The leaves no transformation enclosing this call can differentiate
    (:func:`~hlo_guard.jax_frontend.compat.never_differentiated`), when
    others can: ``jax.jacfwd(guard(f))(x, k)`` differentiates ``x`` only.
    Traced as constants, ``where(x > 1, x, k)`` is known to take ``k``'s
    lanes with a zero tangent, and a ``sqrt`` after it gets its forward
    guard.  Empty when every leaf is alike (a plain eager call, or every
    leaf a tracer): the one program a signature shares."""
    flags = [never_differentiated(leaf) for leaf in leaves]
    if all(flags) or not any(flags):
        return ()
    return tuple(i for i, flag in enumerate(flags) if flag)


def untracked_arguments(leaves, constant: tuple[int, ...]) -> tuple[int, ...]:
    """Leaves without a forward-mode tangent at a call where others have
    one, that are not known constants: a ``jax.jit``'s tracers beside the
    ``jacfwd`` inside it.  Their tangent is zero for this JVP, yet they may
    be differentiated after staging."""
    kinds = [under_forward_mode(leaf) for leaf in leaves]
    if not any(kind is True for kind in kinds):
        return ()
    skip = set(constant)
    return tuple(
        i
        for i, (leaf, kind) in enumerate(zip(leaves, kinds))
        if kind is False and i not in skip and is_inexact_aval(getattr(leaf, "aval", None))
    )


def warn_untracked_tangents(program, untracked: tuple[int, ...], describe) -> None:
    """Warn, once per program and pattern, when forward guards are missing
    because the ``untracked`` leaves count as live: the guards the program
    would get with those leaves' tangents zero (output guards, calls
    evaluated in that forward context) that its own plan does not make.
    ``describe(i)`` names leaf ``i`` for the message."""
    analysis = program.analysis
    own = plan_of(analysis)
    if untracked in own.untracked_checked:
        return
    own.untracked_checked.add(untracked)
    graph = analysis.graph
    n_in = len(graph.jaxpr.invars) + len(graph.jaxpr.constvars)
    tangents = [LIVE] * n_in
    for i in untracked:
        tangents[i] = NO_DERIVATIVE
    fa = analyze_forward(graph, RULES, tangents)
    have = set(own.output_sites_by_node)
    missing = {site.node for site in plan_output_guards(analysis, fa)} - have
    for node, k in analysis.subs:
        rule = analysis.rules.get(graph.op_name(node))
        if k == 0 and rule is not None and node not in own.forward_context_calls:
            if rule.guards_in_forward_context(analysis, fa, node):
                missing.add(node)
    if not missing:
        return
    ops = []
    for n in sorted(missing)[:3]:
        loc = eqn_location(graph.eqns[n])
        ops.append(graph.eqns[n].primitive.name + (f" at {loc}" if loc else ""))
    names = ", ".join(describe(i) for i in untracked)
    warnings.warn(
        f"hlo_guard: {names} has no tangent in the forward-mode transformation "
        "(jacfwd/jvp) at this call, but is traced by an enclosing jax.jit, so the guard "
        "cannot tell that it is not differentiated: its lanes count as live, and forward "
        f"guards are missing on {', '.join(ops)}. The forward derivative may be NaN there. "
        "Call the jacfwd outside jax.jit, where the argument is a concrete array "
        "(traced as a constant), or make it static.",
        UnguardedTangentWarning,
        stacklevel=_first_user_frame(),
    )


def _first_user_frame() -> int:
    """The stack level of the first frame outside hlo_guard and JAX: the
    user's call of the transformation, which a warning should point at."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    level = 2
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        inside = path.startswith(here + os.sep) or (os.sep + "jax" + os.sep) in path
        if not inside:
            return level
        frame, level = frame.f_back, level + 1
    return 2
