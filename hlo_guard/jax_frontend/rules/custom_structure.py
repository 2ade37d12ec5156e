"""Which input lanes of a ``custom_jvp``/``custom_vjp`` call feed which output
lanes, read from the call's *primal* body.

The derivative of such a call is the user's (or library's) rule, not the
body's, and a rule may be non-zero where the body selects a lane away
(``xlogy`` at 0, a straight-through estimator).  So the body's selections
(``select_n``, ``max``, ``min``, ``clamp``, ``reduce_max``) are read as
lane-wise *joins* -- every operand of a selection is live where its output is
-- and only the body's *structure* is followed: elementwise maps, broadcasts,
reshapes, transposes and reductions.  For a norm ``sqrt(sum(v * v, -1))``
under ``where(n > 0, x / n, 0)`` that gives: a row of ``v`` is live iff its
norm is, and guarding ``v`` with that mask absorbs whatever the custom rule
computes in dead rows.

A body holding anything else (slices, gathers, scatters, control flow,
unknown operations) is not followed: the call's inputs stay fully live, as
before (conservative, reported by the caller's rule).
"""

from __future__ import annotations

import weakref

from hlo_guard.jax_frontend.bodies import CALL_BODY_PARAM, body_of, holds_throughout
from hlo_guard.jax_frontend.graph import JaxprGraph
from hlo_guard.jax_frontend.rule_table import RULES
from hlo_guard.jax_frontend.rules.elementwise import Elementwise
from hlo_guard.jax_frontend.rules.structural import Structural, _as_reduce_sum
from passes.analysis import analyze
from passes.rules import RuleTable

#: primitives whose lane structure a custom call's body may use (beyond
#: elementwise and zero-derivative operations, identities and nested calls)
STRUCTURE_PRIMS = {
    "select_n",
    "max",
    "min",
    "clamp",
    "broadcast_in_dim",
    "reshape",
    "squeeze",
    "transpose",
    "reduce_sum",
    "reduce_max",
    "reduce_min",
    "reduce_prod",
    "dot_general",
}
_FOLLOWED_KINDS = ("elementwise", "zero-derivative", "identity", "pass-through")
_TABLE: list[RuleTable] = []
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # jaxpr -> bool


def structure_rules() -> RuleTable:
    """The JAX rule table with selections read as lane-wise joins."""
    if not _TABLE:
        table = RuleTable("jax-custom-structure")
        for name in RULES.names():
            rule = RULES.get(name)
            if rule is not None:
                table.register(name, rule)
        table.register(["select_n", "max", "min", "clamp"], Elementwise(guards=False))
        table.register(["reduce_max", "reduce_min"], Structural(seed=_as_reduce_sum))
        _TABLE.append(table)
    return _TABLE[0]


def body_structure_known(jaxpr) -> bool:
    """Whether every operation of ``jaxpr`` (recursively) is one whose lane
    structure :func:`structure_rules` follows exactly."""
    return holds_throughout(jaxpr, _CACHE, _structure_followed)


def _structure_followed(eqn):
    name = eqn.primitive.name
    if name in CALL_BODY_PARAM:
        return [body_of(eqn)[0]]
    if name in STRUCTURE_PRIMS:
        return True
    rule = RULES.get(name)
    return rule is not None and rule.kind in _FOLLOWED_KINDS


def analyze_body(body, scope: str, outs):
    """The structure-only liveness analysis of a custom call's primal body."""
    return analyze(JaxprGraph(body, scope), structure_rules(), list(outs))
