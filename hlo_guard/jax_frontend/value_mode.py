"""Value mode: dead lanes replaced by a safe point, the literal double where.

A gradient guard ``select(m, x, stop_gradient(x))`` changes no value, so a
``sqrt`` of a negative dead lane still computes NaN in the forward program and
its derivative still computes inf before the select zeroes it.  NaN checkers
(``jax_debug_nans``/``jax_debug_infs``) see those intermediates and raise where
the hand-written double where (``sqrt(where(m, x, 1))``) runs clean.  In value
mode a guarded operand becomes ``select(m, x, safe)`` with a point where the
primitive and its derivatives are finite (``sqrt``/``log``/``div`` -> 1,
``arccos``/``arcsin``/``atanh`` -> 0 ...).

That changes values, so it is allowed only where the dead lanes are *value*
dead: dropped by a ``select_n`` case or never read by a data-movement op.  A
lane that is only *gradient* dead -- the loser of ``max``/``min``/``clamp``,
anything read by a comparison, ``argmax``, ``sort`` -- still decides the
forward result (``max(log x, -5)`` must stay -5), so any use of that kind on
the way from the guarded operation to the outputs makes the site fall back to
the gradient guard.  The check is structural and conservative: only the
primitives in ``VALUE_TRANSPARENT`` (whose gradient masks are exactly their
value masks), ``jit`` bodies and lane-wise custom-derivative calls (their
masks map output lane i to input lane i, as their primal body computes) are
walked through; anything else stops it.  A lane-wise ``custom_jvp`` call's
own safe point comes from probing its rule (:func:`custom_call_safe_point`).
"""

from __future__ import annotations

import math
import weakref

import jax
import jax.numpy as jnp

from hlo_guard.jax_frontend.binding import bind_eqn
from hlo_guard.jax_frontend.graph import DropVar, is_inexact_aval
from hlo_guard.jax_frontend.plan import plan_of
from hlo_guard.jax_frontend.rules.calls import is_lanewise_call
from hlo_guard.jax_frontend.rules.elementwise import LINEAR_ELEMENTWISE, NONLINEAR_ELEMENTWISE

MODES = ("gradient", "value")

# Safe points where they differ from 1 (the default for every guarded
# nonlinear elementwise primitive): a value where the primitive and its
# first and second derivatives are finite.
_SAFE_POINTS = {
    "acos": 0.0,
    "asin": 0.0,
    "atanh": 0.0,
    "erf_inv": 0.0,
    "tan": 0.0,
    "acosh": 2.0,
    "exp": 0.0,
    "exp2": 0.0,
    "expm1": 0.0,
    "sinh": 0.0,
    "cosh": 0.0,
}

# Whose gradient mask is exactly "this lane's value reaches a live output".
VALUE_TRANSPARENT = (
    frozenset(LINEAR_ELEMENTWISE)
    | frozenset(NONLINEAR_ELEMENTWISE)
    | {
        "broadcast_in_dim",
        "reshape",
        "squeeze",
        "expand_dims",
        "transpose",
        "rev",
        "concatenate",
        "reduce_sum",
        "cumsum",
        "tile",
        "stack",
        "slice",
        "dynamic_slice",
        "gather",
        "pad",
    }
)
_CALLS = ("jit", "pjit", "closed_call", "eval_jaxpr", "core_call")
#: walked through when lane-wise (``logaddexp``, ``sinc``, ``xlogy``)
_CUSTOM_CALLS = ("custom_jvp_call", "custom_vjp_call")


def check_mode(mode) -> str:
    if mode not in MODES:
        raise ValueError(f"guard mode must be one of {list(MODES)}, got {mode!r}")
    return mode


def safe_point(primitive_name: str):
    """The substitute for dead lanes of an operand of this primitive, or None
    when the primitive has none (the site keeps its gradient guard)."""
    if primitive_name not in NONLINEAR_ELEMENTWISE:
        return None
    return _SAFE_POINTS.get(primitive_name, 1.0)


#: candidate safe points for a custom-derivative call, tried in order
_CUSTOM_CANDIDATES = (1.0, 0.5, 2.0)
#: larger operands are not probed (the probe evaluates at full size)
_PROBE_MAX_LANES = 1 << 16
#: body jaxpr -> operand avals -> the point found (or None)
_CUSTOM_SAFE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def custom_call_safe_point(eqn):
    """The safe point of a lane-wise ``custom_jvp_call`` (``xlogy``, ``entr``,
    ``logaddexp``), or None.

    Its derivative is the library's rule, which no table here describes, so
    the point is found by trying: a candidate is taken when the call's value
    and its first and second derivatives along every floating operand are
    finite with every floating operand at that point.  The probe runs at
    trace time on constants.  A wrong guess cannot change a result: the
    substituted lanes are value-dead and the select still zeroes their
    derivative; at worst a NaN checker sees what it saw before."""
    if eqn.primitive.name != "custom_jvp_call" or eqn.effects or not is_lanewise_call(eqn):
        return None  # (an effect -- a debug print -- must not run at trace time)
    per_body = _CUSTOM_SAFE.setdefault(eqn.params["call_jaxpr"].jaxpr, {})
    key = tuple(str(v.aval) for v in eqn.invars)
    if key in per_body:
        return per_body[key]
    found = None
    avals = [v.aval for v in eqn.invars]
    floating = [is_inexact_aval(a) for a in avals]
    if all(floating) and _small(avals):
        for c in _CUSTOM_CANDIDATES:
            if _finite_at(eqn, c):
                found = c
                break
    per_body[key] = found
    return found


def _small(avals) -> bool:
    return all(math.prod(a.shape) <= _PROBE_MAX_LANES for a in avals)


def _finite_at(eqn, c: float) -> bool:
    def call(*args):
        return bind_eqn(eqn, list(args))

    try:
        with jax.ensure_compile_time_eval():
            args = tuple(jnp.full(v.aval.shape, c, v.aval.dtype) for v in eqn.invars)
            ones = tuple(jnp.ones_like(a) for a in args)

            def first(*xs):
                return jax.jvp(call, xs, ones)[1]

            values = [call(*args), *jax.jvp(first, args, ones)]
            return all(bool(jnp.isfinite(jnp.asarray(x)).all()) for v in values for x in v)
    except Exception:  # noqa: BLE001 - a probe that cannot run finds no point
        return False


def value_substitutable(analysis, node: int, nested: bool) -> bool:
    """Whether every lane that node ``node``'s outputs carry to a dead output
    lane is dead by value (select case, unread by data movement).

    ``nested``: the graph is a call body whose outputs' masks come from a
    caller we cannot see; reaching such an output is not allowed."""
    memo = plan_of(analysis).value_dead
    key = (node, int(nested))
    if key not in memo:
        memo[key] = all(
            _value_flows_ok(analysis, v, nested)
            for v in analysis.graph.node_outputs(node)
            if v is not None
        )
    return memo[key]


def _value_flows_ok(analysis, var, nested: bool) -> bool:
    graph = analysis.graph
    outs = graph.graph_outputs()
    if nested and any(o is var for o in outs):
        return False
    seen = set()
    stack = [var]
    while stack:
        v = stack.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if nested and any(o is v for o in outs):
            return False
        plan = plan_of(analysis)
        for node, index in plan.all_uses.get(v, ()):
            if node in plan.value_unobserved:
                continue  # computed and dropped: its value decides nothing
            eqn = graph.eqns[node]
            name = eqn.primitive.name
            if name == "select_n":
                if index == 0:  # the predicate: its value decides the result
                    return False
            elif name in _CALLS:
                sub = analysis.subs.get((node, 0))
                if sub is None or not _through_call(sub, index):
                    return False
            elif name in _CUSTOM_CALLS:
                if not is_lanewise_call(eqn):
                    return False
                # its primal body keeps lanes apart: output lane i's value
                # reads input lane i alone (and scalars), whatever its rule
                # computes for the derivative -- as an elementwise op
            elif name not in VALUE_TRANSPARENT:
                return False
            stack.extend(o for o in eqn.outvars if not isinstance(o, DropVar))
    return True


def _through_call(sub, index: int) -> bool:
    """Inside a call body the walk continues from its ``index``-th input; the
    body's outputs lead back to the call's outputs (walked by the caller)."""
    invars = sub.graph.jaxpr.invars
    if index >= len(invars):
        return False
    return _value_flows_ok(sub, invars[index], nested=False)


__all__ = ["MODES", "check_mode", "safe_point", "value_substitutable"]
