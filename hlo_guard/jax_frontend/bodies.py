"""Where a call or control-flow equation keeps its bodies.

A leaf module (beside the rule table it reads): the interpreter, the call
rules, the plan, the custom-call structure analysis and the scope reports
all read bodies, and none of them should have to import another to do it."""

from __future__ import annotations

import weakref

from hlo_guard.jax_frontend.compat import jit_inlines, scan_layout
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


#: operations whose bodies are branches or loops (not calls)
CONTROL_FLOW = frozenset({"cond", "scan", "while", "shard_map"})


def first_body_operand(eqn) -> int:
    """The index of the control-flow equation's first operand bound to its
    (differentiable) body's inputs: a ``cond``'s index and a ``while``'s
    predicate constants come first; the operands after it are bound to the
    body's inputs in order."""
    name = eqn.primitive.name
    if name == "cond":
        return 1
    if name == "while":
        return eqn.params["cond_nconsts"]
    return 0  # scan, shard_map


def loop_carries(eqn) -> list[tuple[int, int]]:
    """A ``scan``'s or ``while``'s carries as (body input, body output)
    index pairs; none for other equations."""
    name = eqn.primitive.name
    if name == "scan":
        nconsts, ncarry = scan_layout(eqn.params, len(eqn.invars))
        return [(nconsts + j, j) for j in range(ncarry)]
    if name == "while":
        nc, nb = eqn.params["cond_nconsts"], eqn.params["body_nconsts"]
        return [(nb + j, j) for j in range(len(eqn.invars) - nc - nb)]
    return []


def holds_throughout(jaxpr, cache: weakref.WeakKeyDictionary, judge) -> bool:
    """Whether ``judge`` accepts every equation of ``jaxpr``, answered once per
    jaxpr in ``cache``.  ``judge(eqn)`` returns True or False, or the bodies to
    judge in the equation's place (a call it looks through), which are then
    judged the same way and kept in the same cache.

    The caches are weakly keyed so that a cached answer never keeps a jaxpr
    (and the constants its sub-jaxprs hold) alive, and no id() is ever reused.
    Every per-body question the rules ask -- risky, covered by output guards,
    selection-free, structure known -- is one of these walks."""
    hit = cache.get(jaxpr)
    if hit is not None:
        return hit
    ok = True
    for eqn in jaxpr.eqns:
        verdict = judge(eqn)
        if not isinstance(verdict, bool):
            verdict = all(holds_throughout(b, cache, judge) for b in verdict)
        if not verdict:
            ok = False
            break
    cache[jaxpr] = ok
    return ok


#: jaxpr -> no operation in it (or its bodies) may have a non-finite derivative
_CALM_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _calm(eqn):
    name = eqn.primitive.name
    rule = RULES.get(name)
    if rule is None or getattr(rule, "guards", False):
        return False
    if name in CALL_BODY_PARAM:
        return [body_of(eqn)[0]]
    if name in ("cond", "while", "scan", "shard_map"):
        return [b for b, _ in control_bodies(eqn)]
    return True


def body_is_risky(jaxpr) -> bool:
    """Whether a body holds an operation whose derivative may be non-finite
    (or one we know nothing about): only then are a call's outputs guarded."""
    return not holds_throughout(jaxpr, _CALM_CACHE, _calm)
