"""Where a call or control-flow equation keeps its bodies.

A leaf module (beside the rule table it reads): the interpreter, the call
rules, the plan, the custom-call structure analysis and the scope reports
all read bodies, and none of them should have to import another to do it."""

from __future__ import annotations

import weakref

from hlo_guard.jax_frontend.compat import jit_inlines
from hlo_guard.jax_frontend.rule_table import RULES


def open_jaxpr(obj):
    """(open jaxpr, consts) of a ClosedJaxpr or a Jaxpr param."""
    if hasattr(obj, "jaxpr") and hasattr(obj, "consts"):
        return obj.jaxpr, list(obj.consts)
    return obj, []


CALL_BODY_PARAM = {
    "jit": "jaxpr",
    "closed_call": "call_jaxpr",
    # jax 0.11+: `closed_call_p` is `eval_jaxpr_p` (in 0.10 that primitive is
    # staged out as a closed_call and never appears in a jaxpr)
    "eval_jaxpr": "call_jaxpr",
    "remat2": "jaxpr",
    "custom_jvp_call": "call_jaxpr",
    "custom_vjp_call": "call_jaxpr",
}

#: calls whose body the interpreter rewrites (custom-derivative calls are not)
REWRITTEN_CALLS = {"jit", "closed_call", "eval_jaxpr", "remat2"}


def body_of(eqn):
    """(open jaxpr, consts) of a call equation's body."""
    return open_jaxpr(eqn.params[CALL_BODY_PARAM[eqn.primitive.name]])


def scope_name(parent_scope: str, eqn) -> str:
    """The scope path reports give a call's body (``jit(norm)/...``)."""
    if eqn.primitive.name in ("jit", "pjit") and jit_inlines(eqn.params):
        return parent_scope  # jnp's inline wrappers (jit(sqrt)): not a scope to users
    name = eqn.params.get("name")
    label = f"{eqn.primitive.name}({name})" if name else eqn.primitive.name
    return f"{parent_scope}/{label}" if parent_scope else label


def control_bodies(eqn):
    """The differentiable bodies of a control-flow equation, as (jaxpr, consts)."""
    name = eqn.primitive.name
    if name == "cond":
        return [open_jaxpr(b) for b in eqn.params["branches"]]
    if name == "while":
        return [open_jaxpr(eqn.params["body_jaxpr"])]
    if name in ("scan", "shard_map"):
        return [open_jaxpr(eqn.params["jaxpr"])]
    return []


#: per-jaxpr answers; weakly keyed so that a cached answer never keeps a jaxpr
#: (and the constants its sub-jaxprs hold) alive, and no id() is ever reused
_RISKY_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def body_is_risky(jaxpr) -> bool:
    """Whether a body holds an operation whose derivative may be non-finite
    (or one we know nothing about): only then are a call's outputs guarded."""
    hit = _RISKY_CACHE.get(jaxpr)
    if hit is not None:
        return hit
    risky = False
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        rule = RULES.get(name)
        if rule is None or getattr(rule, "guards", False):
            risky = True
        elif name in CALL_BODY_PARAM:
            risky = body_is_risky(body_of(eqn)[0])
        elif name in ("cond", "while", "scan", "shard_map"):
            risky = any(body_is_risky(b) for b, _ in control_bodies(eqn))
        if risky:
            break
    _RISKY_CACHE[jaxpr] = risky
    return risky
