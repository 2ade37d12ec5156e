"""Where a call or control-flow equation keeps its bodies.

A leaf module: the interpreter, the call rules, the custom-call structure
analysis and the scope reports all read bodies, and none of them should have
to import another to do it."""

from __future__ import annotations

from hlo_guard.jax_frontend.compat import jit_inlines


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
