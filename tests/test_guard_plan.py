"""The typed per-jaxpr plan and rewrite record (``jax_frontend.plan``).

What must hold: the plan is made once per analysis and re-used (a trace
cache hit does not plan again); the rewrite record collects skipped guards in
the scope they belong to; and ``explain`` of a guarded function that has
already been evaluated reads that record instead of evaluating the guarded
program again -- while a fresh function still gets its skipped guards
reported (one evaluation).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback

from hlo_guard import explain, guard, guarded_jit
from hlo_guard.jax_frontend import interpreter
from hlo_guard.jax_frontend.plan import plan_of

X = jnp.array([-1.0, 0.0, 0.25, 4.0])


def f_where(x):
    return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))


def f_effectful(x):
    a = jnp.sqrt(x)
    p = io_callback(
        lambda v: np.asarray(v > 0.5), jax.ShapeDtypeStruct(x.shape, jnp.bool_), a, ordered=True
    )
    return jnp.sum(jnp.where(p, a, 0.0))


@pytest.fixture
def runs(monkeypatch):
    """How many guarded evaluations of a top-level jaxpr start."""
    count = {"n": 0}
    original = interpreter.run_guarded

    def counting(analysis, *args, **kwargs):
        if not kwargs.get("nested", False) and len(args) < 3:
            count["n"] += 1
        return original(analysis, *args, **kwargs)

    monkeypatch.setattr(interpreter, "run_guarded", counting)
    import hlo_guard.api as api

    monkeypatch.setattr(api, "run_guarded", counting)
    return count


def _analyses(analysis):
    yield analysis
    for sub in analysis.subs.values():
        yield from _analyses(sub)


def test_plan_is_made_once_per_analysis():
    g = guard(f_where)
    program, _ = g.traced(X)
    plan = plan_of(program.analysis)
    assert plan_of(program.analysis) is plan
    assert plan.needs_rewrite("gradient")
    sites = [
        (a.graph.eqns[node].primitive.name, s.index)
        for a in _analyses(program.analysis)
        for node, node_sites in plan_of(a).sites_by_node.items()
        for s in node_sites
    ]
    assert sites == [("jit", 0)]  # on jnp.sqrt's call, where x enters the chain
    again, _ = g.traced(X)  # trace cache hit: same analysis, same plan
    assert plan_of(again.analysis) is plan


def test_skipped_guard_is_recorded_in_its_scope():
    g = guard(f_effectful)
    program, _ = g.traced(X)
    record = plan_of(program.analysis).record
    assert not record.skipped and not record.finished
    g(X)  # (io_callback has no derivative rule: forward only)
    assert record.finished == {"gradient"}
    # the where's predicate comes from the callback: the mask of the guard
    # where x enters the chain (jnp.sqrt's call, input 0) could not be built
    ((node, index, reason),) = record.skipped
    assert index == 0 and "io_callback" in reason
    eqn = program.analysis.graph.eqns[node]
    assert eqn.primitive.name == "jit" and eqn.params["name"] == "sqrt"


def test_explain_after_a_call_does_not_evaluate_again(runs):
    g = guard(f_effectful)
    g(X)  # outside any trace: the program explain inspects
    before = runs["n"]
    assert before >= 1
    r = explain(g, X)
    assert runs["n"] == before
    (u,) = r.unguarded  # the record of the user's own call
    assert (u.op, u.category) == ("sqrt", "skipped")


def test_explain_after_a_jitted_call_evaluates_the_inspected_program_once(runs):
    """A call under ``jax.jit`` evaluates the program traced with jnp's
    inline jits inlined; explain inspects the one with them kept as calls
    (whose sites name the user's jnp functions), evaluated once."""
    g = guarded_jit(f_effectful)
    g(X)
    before = runs["n"]
    r = explain(g, X)
    assert runs["n"] == before + 1
    explain(g, X)
    assert runs["n"] == before + 1
    (u,) = r.unguarded
    assert (u.op, u.category) == ("sqrt", "skipped")


def test_explain_of_a_fresh_function_evaluates_once(runs):
    r = explain(f_effectful, X)
    assert runs["n"] == 1
    (u,) = r.unguarded
    assert (u.op, u.category) == ("sqrt", "skipped")


def test_value_mode_record_is_its_own():
    """A gradient-mode evaluation does not stand in for a value-mode one."""
    g = guard(f_where, mode="value")
    program, _ = g.traced(X)
    record = plan_of(program.analysis).record
    g(X)
    assert record.finished == {"value"}


# -- graphs with nothing to guard are planned without sweeps ---------------------------


def _analysis(f, *args):
    program, _ = guard(f).traced(*args)
    return program.analysis


def test_selects_anywhere_sees_selections_in_nested_bodies():
    """The placement's shortcut: a graph with no dead lanes here or below."""
    assert not _analysis(lambda x: jnp.sum(jnp.sin(x) * 2.0), X).selects_anywhere()
    assert _analysis(f_where, X).selects_anywhere()
    inner = jax.jit(lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0) + x)
    top = _analysis(lambda x: jnp.sum(jnp.sin(inner(x))), X)
    assert top.selects_anywhere()
    # the call's operand is live at the top level (``+ x``): only the body selects
    assert not any(not lv.is_live and lv.reaches_output for lv in top.use_liveness.values())


def test_a_body_without_selections_is_placed_empty_and_its_caller_still_guarded():
    inner = jax.jit(lambda x: jnp.sin(x) * x)

    def f(x):
        return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0) + inner(x))

    top = _analysis(f, X)
    assert plan_of(top).sites_by_node  # the caller keeps its guard on the sqrt entry
    (body,) = [
        sub
        for (node, _), sub in top.subs.items()
        if top.graph.eqns[node].params.get("name") == "<lambda>"
    ]
    assert not body.selects_anywhere()
    assert body.placement is not None and not body.placement.guarded
    np.testing.assert_array_equal(np.isfinite(jax.grad(guard(f))(X)), [True, True, True, True])


def test_no_forward_analysis_for_a_graph_without_risky_operations():
    """Output guards are planned only where some operation's derivative may
    be non-finite; elsewhere the tangent analysis is not even made."""
    calm = plan_of(_analysis(lambda x: jnp.sum(jnp.where(x > 0, x + 1.0, -x)), X))
    assert calm.output_sites_by_node == {}
    assert "forward" not in calm.__dict__
    risky = plan_of(_analysis(lambda x: jnp.sum(jnp.sqrt(jnp.where(x > 0, x, 0.0))), X))
    assert risky.output_sites_by_node
    assert "forward" in risky.__dict__
