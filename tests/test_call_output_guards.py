"""Forward-mode output guards on calls: the caller guards a call's outputs only
when the call's body does not already guard them itself.

A call whose body holds a risky operation (``sqrt``) used to get an output
guard on every partly zero output tangent, on top of the body's own guard on
that ``sqrt``: two selects (and two tangent masks) for one hazard, and for a
``custom_jvp`` inside nested ``jnp`` wrappers (``log_sigmoid`` -> ``softplus``
-> ``logaddexp``) one probe of the rule per nesting level.  The body's own
guards cover the call exactly when the body's forward analysis (inputs live)
*is* the caller's context: every operand's tangent is live there.  Operands
with a partly zero or no tangent keep the caller's guard -- the body, analysed
with live inputs, does not see the zeros that context makes -- unless the body
mixes lanes after such an operation (``sqrt(v) + mean(v)``): a guard on its
outputs could not clean mixed lanes, so the body is evaluated in the caller's
forward context instead, its operands' tangent masks passed in.

Oracle: the hand double where, in forward mode (``jvp``/``jacfwd``), reverse
mode and the second-order compositions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from double_where import assert_like_double_where, modes
from jax import lax

from hlo_guard import guard
from hlo_guard.jax_frontend.plan import plan_of
from hlo_guard.jax_frontend.surgery import spliced_program

X = jnp.array([-1.0, 0.0, 0.5, 2.0], jnp.float32)


@jax.jit
def _sqrt_of_positive_part(x):
    return jnp.sqrt(jnp.where(x > 0, x, 0.0))


def inner_zero(x):
    """The tangent's zero lanes are made inside the call, where its sqrt is."""
    return jnp.sum(_sqrt_of_positive_part(x) * x)


def inner_zero_oracle(x):
    pos = x > 0
    return jnp.sum(jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0) * x)


@jax.jit
def _sqrt(y):
    return jnp.sqrt(y)


def outer_zero(x):
    """The zero lanes come from outside: the body alone sees a live tangent."""
    return jnp.sum(_sqrt(jnp.where(x > 0, x, 0.0)) * x)


def outer_zero_oracle(x):
    pos = x > 0
    return jnp.sum(jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0) * x)


@jax.jit
def _sqrt_of_choice(a, b, p):
    return jnp.sqrt(jnp.where(p, a, b))


def stopped_operand(x):
    """One operand has no tangent here (stop_gradient): the select inside the
    body makes partly zero tangents only in this context."""
    return jnp.sum(_sqrt_of_choice(x, lax.stop_gradient(jnp.maximum(x, 0.0)), x > 0) * x)


def stopped_operand_oracle(x):
    pos = x > 0
    return jnp.sum(jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0) * x)


def nested_softplus(x):
    """``log_sigmoid`` is ``-softplus(-x)``, softplus a ``custom_jvp``
    (``logaddexp``) whose body selects, inside two ``jnp`` wrappers; its
    operand's tangent is live, so only the innermost call is guarded."""
    return jnp.sum(jax.nn.log_sigmoid(x) * x)


def nested_softplus_oracle(x):
    return jnp.sum(jax.nn.log_sigmoid(x) * x)


def softplus_after_where(x):
    """The same wrappers with a partly zero operand tangent: the outer call
    keeps its own guard."""
    return jnp.sum(jax.nn.log_sigmoid(jnp.where(x > 0, x, 0.0)))


def softplus_after_where_oracle(x):
    return jnp.sum(jnp.where(x > 0, jax.nn.log_sigmoid(x), jax.nn.log_sigmoid(0.0)))


CASES = {
    "inner_zero": (inner_zero, inner_zero_oracle),
    "outer_zero": (outer_zero, outer_zero_oracle),
    "stopped_operand": (stopped_operand, stopped_operand_oracle),
    "nested_softplus": (nested_softplus, nested_softplus_oracle),
    "softplus_after_where": (softplus_after_where, softplus_after_where_oracle),
}

MODES = modes("jacfwd", "grad", "hessian", "jacfwd_jacfwd", "jacrev_grad")


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("case", sorted(CASES))
def test_derivatives_match_the_double_where(case, mode):
    f, oracle = CASES[case]
    assert_like_double_where(MODES[mode], f, oracle, X)
    np.testing.assert_array_equal(np.asarray(guard(f)(X)), np.asarray(f(X)))


def test_plain_forward_mode_is_nan_where_the_guard_is_needed():
    """The cases are real: unguarded, each forward derivative is NaN (the
    softplus case is about how many guards and probes, not a leak)."""
    for name in ("inner_zero", "outer_zero", "stopped_operand"):
        f = CASES[name][0]
        assert np.isnan(np.asarray(jax.jacfwd(f)(X))).any(), name


def _call_output_sites(f, x):
    """(top-level output guard sites on call equations, output guard sites
    inside the call bodies) of ``guard(f)`` at ``x``."""
    g = guard(f)
    program, _ = g.traced(x)
    analysis = program.analysis
    eqns = analysis.graph.eqns
    top = [
        s
        for sites in plan_of(analysis).output_sites_by_node.values()
        for s in sites
        if eqns[s.node].primitive.name in ("jit", "closed_call", "eval_jaxpr")
    ]
    inner = [
        s
        for (node, _), sub in analysis.subs.items()
        if eqns[node].primitive.name == "jit"
        for sites in plan_of(sub).output_sites_by_node.values()
        for s in sites
    ]
    return top, inner


def test_call_with_live_operands_is_guarded_inside_only():
    top, inner = _call_output_sites(inner_zero, X)
    assert top == []
    assert len(inner) == 1


@pytest.mark.parametrize("case", ["outer_zero", "stopped_operand"])
def test_call_whose_context_makes_zero_tangents_keeps_its_guard(case):
    top, inner = _call_output_sites(CASES[case][0], X)
    assert len(top) == 1
    assert inner == []


@pytest.mark.parametrize(("case", "probes"), [("nested_softplus", 0), ("softplus_after_where", 1)])
def test_nested_wrappers_probe_the_rule_once_at_most(case, probes, monkeypatch):
    """No output guard on the two ``jnp`` wrappers around the ``custom_jvp``
    call: its rule is probed once, not once per level -- and not at all when
    the call's operand carries a live tangent (its zero tangent lanes are
    then the rule's own selections, exact zeros it needs no guard for)."""
    from hlo_guard.jax_frontend.rules import calls

    seen = []
    real = calls.probe_rule_tangents
    monkeypatch.setattr(calls, "probe_rule_tangents", lambda *a: seen.append(a[1]) or real(*a))
    jax.clear_caches()  # no guarded wrapper body shared from an earlier test
    jax.make_jaxpr(guard(CASES[case][0]))(X)
    assert len(seen) == probes


def test_body_with_control_flow_keeps_the_callers_guard():
    """A ``shard_map`` inside the body: the body's own output guards are
    not planned across it, so the caller keeps its guard on the call.
    (``cond``, ``scan`` and ``while`` bodies are guarded in the body's
    context.)"""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    from hlo_guard.jax_frontend.graph import JaxprGraph
    from hlo_guard.jax_frontend.rules import RULES
    from passes.analysis import analyze, analyze_forward
    from passes.lattice import LIVE

    mesh = Mesh(np.array(jax.devices()[:1]), ("i",))

    @jax.jit
    def looped(x):
        y = jnp.where(x > 0, x, 0.0)
        return jax.shard_map(jnp.sqrt, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(y)

    def f(x):
        return jnp.sum(looped(x))

    jaxpr = jax.make_jaxpr(f)(X).jaxpr
    graph = JaxprGraph(jaxpr)
    backward = analyze(graph, RULES)
    forward = analyze_forward(graph, RULES, [LIVE])
    node = next(i for i, e in enumerate(jaxpr.eqns) if e.primitive.name == "jit")
    rule = RULES.get("jit")
    assert forward.value_liveness(jaxpr.eqns[node].invars[0]).is_live
    assert not rule.body_guards_own_outputs(backward, forward, node)
    # and a straight-line body with the same live operand is covered
    jaxpr2 = jax.make_jaxpr(inner_zero)(X).jaxpr
    graph2 = JaxprGraph(jaxpr2)
    node2 = next(i for i, e in enumerate(jaxpr2.eqns) if e.primitive.name == "jit")
    assert rule.body_guards_own_outputs(
        analyze(graph2, RULES), analyze_forward(graph2, RULES, [LIVE]), node2
    )


# -- known constants: ``8.0 * s`` through jnp's wrapper is a finite scale ----------------


def scaled_after_call(x):
    """``jnp``'s ``*`` is an inline ``jit(multiply)`` whose body receives the
    Python scalar as an input: the scale is a known finite constant there."""
    return jnp.sum(_sqrt(jnp.where(x > 0, x, 0.0)) * 8.0)


def scaled_after_call_oracle(x):
    pos = x > 0
    return jnp.sum(jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0) * 8.0)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_scaled_output_matches_the_double_where(mode):
    assert_like_double_where(MODES[mode], scaled_after_call, scaled_after_call_oracle, X)


def test_scaling_by_a_known_finite_constant_gets_no_output_guard():
    from hlo_guard.inspect.explain import explain

    fwd = [s for s in explain(scaled_after_call, X).guards if s.mode == "forward"]
    assert [s.op for s in fwd] == ["jit(_sqrt)"]


def _multiply_body_graph(f, x):
    program, _ = guard(f).traced(x)
    analysis = program.analysis
    (node,) = [
        n
        for n, e in enumerate(analysis.graph.eqns)
        if e.primitive.name == "jit" and e.params["name"] == "multiply"
    ]
    return analysis.subs[(node, 0)].graph


@pytest.mark.parametrize(
    "scale, expected",
    [(8.0, np.float32(8.0)), (3, np.float32(3.0)), (1e39, np.float32(np.inf))],
)
def test_known_constant_follows_the_callers_scalar_through_conversion(scale, expected):
    """A Python scalar reaches the wrapper's ``mul`` as an input converted to
    float32; 1e39 overflows to inf in that conversion, and then the scale is
    not finite and the output keeps its guard."""
    from hlo_guard.jax_frontend.rules import RULES
    from passes.analysis import analyze

    def f(x):
        return jnp.sum(jnp.where(x > 0, x, 0.0) * scale)

    graph = _multiply_body_graph(f, X)
    (mul,) = [n for n, e in enumerate(graph.eqns) if e.primitive.name == "mul"]
    eqn = graph.eqns[mul]
    values = [graph.known_constant(v) for v in eqn.invars]
    known = [v for v in values if v is not None]
    assert len(known) == 1 and known[0].dtype == np.float32
    np.testing.assert_array_equal(known[0], expected)
    assert [v is None for v in values].count(True) == 1  # the traced operand is unknown
    rule = RULES.get("mul")
    assert rule.guards_output(analyze(graph, RULES), mul, 0) == (not np.isfinite(expected))


@jax.jit
def _sqrt_of_nonnegative_part(x):
    return jnp.sqrt(jnp.where(x >= 0, x, 0.0))


@pytest.mark.parametrize("mode", ["jacfwd", "grad"])
def test_a_taken_zero_inside_the_call_stays_non_finite(mode):
    """``x = 0`` is *taken* here: ``sqrt'(0)`` on a live lane is a genuine
    singularity, and the body's own guard (now the only one) keeps it, as
    the hand double where does."""

    def f(x):
        return jnp.sum(_sqrt_of_nonnegative_part(x))

    def oracle(x):
        pos = x >= 0
        return jnp.sum(jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0))

    assert _call_output_sites(f, X)[0] == []
    got = np.asarray(MODES[mode](guard(f))(X))
    assert np.isinf(got[1])  # (jacfwd's other columns meet it as 0 * inf, as plain JAX's do)
    assert_like_double_where(MODES[mode], f, oracle, X)


def _softplus_of_log(x):
    """No selection anywhere: every lane is taken.  At ``x = 0`` the tangent
    of ``log`` is inf, and softplus's rule multiplies it by ``exp(-inf) = 0``:
    a genuine NaN, which the guard must leave visible."""
    return jax.nn.softplus(jnp.log(x))


def _sqrt_of_relu(x):
    """relu's rule *selects* 0 where ``x <= 0``: those tangent lanes are
    structurally zero, and ``sqrt'(0) = inf`` must not turn them NaN."""
    return jnp.sum(jnp.sqrt(jax.nn.relu(x)) * x)


def _sqrt_of_relu_oracle(x):
    pos = x > 0
    return jnp.sum(jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0) * x)


@pytest.mark.parametrize("transform", ["jvp", "jacfwd"])
def test_custom_rule_numeric_zero_keeps_a_genuine_nan_visible(transform):
    """A ``custom_jvp`` rule's coefficient that is numerically 0 is not a
    structural zero: the probe used to call it one, and the output guard then
    replaced the genuine forward-mode NaN by 0 (found with numpyro's
    StickBreakingTransform, whose log-det-J ends in ``log_sigmoid``)."""
    x = jnp.array([0.0, 1.0, 2.0], jnp.float32)
    if transform == "jvp":
        ones = jnp.ones_like(x)
        plain = jax.jvp(_softplus_of_log, (x,), (ones,))[1]
        guarded = jax.jvp(guard(_softplus_of_log), (x,), (ones,))[1]
    else:
        plain = jnp.diag(jax.jacfwd(_softplus_of_log)(x))
        guarded = jnp.diag(jax.jacfwd(guard(_softplus_of_log))(x))
    assert np.isnan(np.asarray(plain)[0])
    np.testing.assert_array_equal(np.asarray(guarded), np.asarray(plain))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_custom_rule_that_selects_still_makes_structural_zeros(mode):
    """The other side of the probe: relu's selected zeros stay structural."""
    assert_like_double_where(MODES[mode], _sqrt_of_relu, _sqrt_of_relu_oracle, X)
    assert np.isnan(np.asarray(jax.jacfwd(_sqrt_of_relu)(X))).any()


#: ``custom_jvp`` functions whose rule multiplies a zero tangent by an
#: infinite coefficient at ``x = 0``: ``entr`` through ``_xlogx``
#: (``t * (log(x) + 1)``); ``xlogy(x, x)``, whose rule is ``tx * log(y) +
#: ty * x / y`` -- probed one operand at a time, the *other* operand's zero
#: tangent meets ``0 / 0`` in every lane at 0, live or dead
INFINITE_COEFFICIENT_RULES = {
    "entr": jax.scipy.special.entr,
    "xlogy": lambda v: jax.scipy.special.xlogy(v, v),
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("name", sorted(INFINITE_COEFFICIENT_RULES))
def test_custom_rule_with_an_infinite_coefficient_in_dead_lanes_is_guarded(name, mode):
    """The probe of a rule's tangent dependence must not read ``0 * inf`` in a
    dead lane as dependence: it did, the lane counted as live, and the
    forward derivative was NaN with a clean report (found 2026-11-26 trying
    ``jax.scipy.special`` functions as a user would)."""
    fn = INFINITE_COEFFICIENT_RULES[name]

    def f(x):
        return jnp.sum(fn(jnp.where(x > 0, x, 0.0)) * x)

    def oracle(x):
        pos = x > 0
        return jnp.sum(jnp.where(pos, fn(jnp.where(pos, x, 1.0)), 0.0) * x)

    assert np.isnan(np.asarray(jax.jacfwd(f)(X))).any()
    assert_like_double_where(MODES[mode], f, oracle, X)


@jax.jit
def _sqrt_plus_mean(v):
    """Mixes lanes after a hazard: a NaN made in one lane reaches every lane."""
    return jnp.sqrt(v) + jnp.mean(v)


def _sqrt_plus_mean_oracle(pos, x):
    """``_sqrt_plus_mean(where(pos, x, 0))`` with a double where."""
    inner = jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)
    return inner + jnp.mean(jnp.where(pos, x, 0.0))


@jax.jit
def _mixes_twice(v):
    """A lane-mixing body whose lane-mixing call gets its operand's zero
    tangent lanes through this body: the context is passed on a level."""
    return _sqrt_plus_mean(v * 2.0) * jnp.max(v)


@jax.jit
def _around_a_mixing_call(v):
    """Passes its operand straight to a lane-mixing call: nothing here needs
    a guard, but the context must be passed on to the call inside."""
    return _sqrt_plus_mean(v)


@jax.jit
def _branching(v):
    return lax.cond(v[3] > 0, _sqrt_plus_mean, lambda u: u, v) * 2.0


def _checkpointed(v):
    return jax.checkpoint(lambda u: jnp.sqrt(u) * jnp.sum(u))(v)


#: (f, double-where oracle) of calls and branches that mix lanes after a
#: singular operation (or hold one), entered by an operand whose tangent is
#: zero in some lanes
LANE_MIXING_BODIES = {
    "jit": (
        lambda x: _sqrt_plus_mean(jnp.where(x > 0, x, 0.0)).sum(),
        lambda x: _sqrt_plus_mean_oracle(x > 0, x).sum(),
    ),
    "jit in jit": (
        lambda x: _mixes_twice(jnp.where(x > 0, x, 0.0)).sum(),
        lambda x: (
            _sqrt_plus_mean_oracle(x > 0, 2.0 * x) * jnp.max(jnp.where(x > 0, x, 0.0))
        ).sum(),
    ),
    "checkpoint": (
        lambda x: _checkpointed(jnp.where(x > 0, x, 0.0)).sum(),
        lambda x: (
            jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0)
            * jnp.sum(jnp.where(x > 0, x, 0.0))
        ).sum(),
    ),
    "jit around a mixing jit": (
        lambda x: _around_a_mixing_call(jnp.where(x > 0, x, 0.0)).sum(),
        lambda x: _sqrt_plus_mean_oracle(x > 0, x).sum(),
    ),
    "cond": (
        lambda x: lax.cond(x[3] > 0, _sqrt_plus_mean, lambda u: u, jnp.where(x > 0, x, 0.0)).sum(),
        lambda x: _sqrt_plus_mean_oracle(x > 0, x).sum(),
    ),
    "lane-local cond": (
        lambda x: lax.cond(x[3] > 0, jnp.sqrt, lambda u: u, jnp.where(x > 0, x, 0.0)).sum(),
        lambda x: jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0).sum(),
    ),
    "jit holding a cond": (
        lambda x: _branching(jnp.where(x > 0, x, 0.0)).sum(),
        lambda x: (2.0 * _sqrt_plus_mean_oracle(x > 0, x)).sum(),
    ),
    "scan": (
        lambda x: lax.scan(
            lambda c, _: (_sqrt_plus_mean(c), None), jnp.where(x > 0, x, 0.0), None, length=1
        )[0].sum(),
        lambda x: _sqrt_plus_mean_oracle(x > 0, x).sum(),
    ),
    "scan over zeroed xs": (
        lambda x: lax.scan(
            lambda c, v: (c + _sqrt_plus_mean(v), None),
            jnp.zeros(4),
            jnp.stack([jnp.where(x > 0, x, 0.0), x * x + 1.0]),
        )[0].sum(),
        lambda x: (_sqrt_plus_mean_oracle(x > 0, x) + _sqrt_plus_mean(x * x + 1.0)).sum(),
    ),
    "fori_loop": (
        lambda x: lax.fori_loop(
            0, 1, lambda i, c: _sqrt_plus_mean(c), jnp.where(x > 0, x, 0.0)
        ).sum(),
        lambda x: _sqrt_plus_mean_oracle(x > 0, x).sum(),
    ),
    "while_loop": (
        lambda x: lax.while_loop(
            lambda c: c[0] < 1,
            lambda c: (c[0] + 1, _sqrt_plus_mean(c[1])),
            (0, jnp.where(x > 0, x, 0.0)),
        )[1].sum(),
        lambda x: _sqrt_plus_mean_oracle(x > 0, x).sum(),
    ),
    "live and zero tangents, one body": (
        lambda x: (_sqrt_plus_mean(x * x + 1.0) + _sqrt_plus_mean(jnp.where(x > 0, x, 0.0))).sum(),
        lambda x: (
            (jnp.sqrt(x * x + 1.0) + jnp.mean(x * x + 1.0)).sum()
            + _sqrt_plus_mean_oracle(x > 0, x).sum()
        ),
    ),
}


@pytest.mark.parametrize(
    "case, mode",
    [
        (case, mode)
        for case in sorted(LANE_MIXING_BODIES)
        for mode in sorted(MODES)
        # (JAX has no reverse mode through a while loop)
        if case != "while_loop" or mode in ("jacfwd", "jacfwd_jacfwd")
    ],
)
def test_a_lane_mixing_body_entered_by_zero_tangent_lanes_is_guarded_inside(case, mode):
    """Found by a helper's hunt (2026-11-26): in forward mode ``sqrt'(0)``
    times the zero tangent is NaN inside the body and ``mean`` spread it to
    every lane, where the caller's guard on the call's outputs selects
    nothing.  The body is now evaluated in the caller's forward context, its
    guard on the ``sqrt`` inside."""
    f, oracle = LANE_MIXING_BODIES[case]
    assert np.isnan(np.asarray(jax.jacfwd(f)(X))).any()  # a real leak unguarded
    assert_like_double_where(MODES[mode], f, oracle, X)


def _zero_then_sqrt(c):
    return jnp.where((c > 0.25) & (c < 1.0), 0.0, jnp.sqrt(c))


def _zero_then_sqrt_twice_oracle(x):
    """``_zero_then_sqrt`` applied twice, lane by lane in Python: a lane
    the first step zeroes is a constant from then on (derivative 0)."""
    out = []
    for c in np.asarray(x, np.float64):
        if 0.25 < c < 1.0:
            out.append(0.0)
            continue
        r = np.sqrt(c)
        d = 0.5 / r
        if 0.25 < r < 1.0:
            out.append(0.0)
        else:
            out.append(d * 0.5 / np.sqrt(r))
    return np.asarray(out)


#: the same two iterations as a scan and as a while loop
TWO_ITERATIONS = {
    "scan": lambda x: lax.scan(lambda c, _: (_zero_then_sqrt(c), None), x, None, length=2)[0],
    "while": lambda x: lax.while_loop(
        lambda c: c[0] < 2, lambda c: (c[0] + 1, _zero_then_sqrt(c[1])), (0, x)
    )[1],
}


@pytest.mark.parametrize(
    "loop, transform",
    [
        ("scan", "jacfwd"),
        ("scan", "jit(jacfwd)"),
        ("scan", "grad"),
        ("while", "jacfwd"),  # (no reverse mode through a while loop)
        ("while", "jit(jacfwd)"),
    ],
)
def test_a_carry_an_iteration_zeroes_carries_its_tangent_mask(loop, transform):
    """No zero enters from outside: the first iteration's ``where`` zeroes
    the lane ``c = 0.5`` of the carry, and the second iteration's ``sqrt``
    meets it (``c = 0``): forward mode NaN.  The carry's tangent mask is
    carried along with it, each iteration's computed from the last."""

    def f(x):
        return TWO_ITERATIONS[loop](x).sum()

    x = jnp.array([0.5, 4.0, 16.0], jnp.float32)
    assert np.isnan(np.asarray(jax.jacfwd(f)(x))).any()
    d = {"jacfwd": jax.jacfwd, "jit(jacfwd)": lambda g: jax.jit(jax.jacfwd(g)), "grad": jax.grad}
    got = np.asarray(d[transform](guard(f))(x))
    np.testing.assert_allclose(got, _zero_then_sqrt_twice_oracle(x), rtol=1e-6)


@pytest.mark.usefixtures("small_calls_kept")
def test_a_lane_mixing_body_under_jit_gets_its_operands_tangent_masks():
    f, oracle = LANE_MIXING_BODIES["jit"]
    got = jax.jit(jax.jacfwd(guard(f)))(X)
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jacfwd(oracle)(X)), rtol=1e-6)
    top, inner = _call_output_sites(f, X)
    assert top == []  # the caller no longer guards the mixed outputs
    assert len(inner) == 1  # the body's sqrt, in the caller's context
    program = spliced_program(jax.make_jaxpr(guard(f))(X))
    calls = [e for e in program.jaxpr.eqns if e.primitive.name == "jit"]
    (call,) = [e for e in calls if e.params["name"] == "_sqrt_plus_mean"]
    assert [(v.aval.dtype.name, v.aval.shape) for v in call.invars] == [
        ("float32", (4,)),
        ("bool", (4,)),
    ]


@pytest.mark.usefixtures("small_calls_kept")
def test_a_tangent_mask_that_is_a_broadcast_is_passed_as_its_source():
    """A column mask's tangent mask is passed as its ``[4]`` source and
    broadcast again inside the body (as output masks are)."""

    def f(x, c):
        return _sqrt_plus_mean(jnp.where(c[None, :] > 0, x, 0.0)).sum()

    def oracle(x, c):
        pos = jnp.broadcast_to(c[None, :] > 0, x.shape)
        return _sqrt_plus_mean_oracle(pos, x).sum()

    x = jnp.stack([X, X[::-1], X * 2.0])
    c = jnp.array([1.0, -1.0, 1.0, -1.0], jnp.float32)
    assert np.isnan(np.asarray(jax.jacfwd(f)(x, c))).any()
    for d in (jax.jacfwd, jax.jacrev):
        got, want = d(guard(f))(x, c), d(oracle)(x, c)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
    (call,) = [
        e
        for e in spliced_program(jax.make_jaxpr(guard(f))(x, c)).jaxpr.eqns
        if e.primitive.name == "jit" and e.params["name"] == "_sqrt_plus_mean"
    ]
    assert [(v.aval.dtype.name, v.aval.shape) for v in call.invars] == [
        ("float32", (3, 4)),
        ("bool", (4,)),
    ]


def test_a_lane_local_body_keeps_the_one_guard_on_its_call():
    """``outer_zero``'s body is lane-wise: the caller's guard on its output
    covers the same lanes with one select, and no mask is passed in."""
    top, inner = _call_output_sites(outer_zero, X)
    assert len(top) == 1 and inner == []


_PADDED = jnp.array([[True, True, False], [False, True, True]])


def _accumulate(c, xt):
    return c + xt, jnp.sqrt(c) + xt


def _accumulate_oracle(c, xt):
    pos = c > 0
    return c + xt, jnp.where(pos, jnp.sqrt(jnp.where(pos, c, 1.0)), 0.0) + xt


@pytest.mark.parametrize("transform", ["jacfwd", "jit(jacfwd)", "grad", "hessian"])
def test_an_accumulator_starting_from_a_constant_is_partly_zero_not_underivative(transform):
    """The carry starts as constant zeros -- no tangent in the first
    iteration, ``sqrt'(0)`` times that zero is NaN -- and carries the padded
    xs' tangents after.  The carry's tangent is partly zero across the loop
    (not derivative-free, nor live), so the ``sqrt`` is guarded with the
    carried mask: none live in the first iteration, the xs' after."""
    x = jnp.array([[1.0, 2.0, 0.5], [3.0, 1.5, 2.0]], jnp.float32)

    def run(step):
        def f(x):
            return lax.scan(step, jnp.zeros(3), jnp.where(_PADDED, x, 0.0))[1].sum()

        return f

    f, oracle = run(_accumulate), run(_accumulate_oracle)
    assert np.isnan(np.asarray(jax.jacfwd(f)(x))).any()
    d = {
        "jacfwd": jax.jacfwd,
        "jit(jacfwd)": lambda g: jax.jit(jax.jacfwd(g)),
        "grad": jax.grad,
        "hessian": jax.hessian,
    }[transform]
    np.testing.assert_allclose(
        np.asarray(d(guard(f))(x)), np.asarray(d(oracle)(x)), rtol=1e-6, atol=1e-7
    )


def _positive(x):
    return jnp.where(x > 0, x, 0.0)


def _sqrt_where_positive(v, pos):
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, v, 1.0)), 0.0)


#: a ``cond`` whose output tangent is partly zero, into a ``sqrt`` after it:
#: (f, double-where oracle); X[3] > 0 and X[0] < 0 pick the branches
COND_OUTPUTS = {
    "zero passed through": (
        lambda x: jnp.sqrt(lax.cond(x[3] > 0, lambda v: 2.0 * v, lambda v: v, _positive(x))).sum(),
        lambda x: _sqrt_where_positive(2.0 * x, x > 0).sum(),
    ),
    "zero made in the taken branch": (
        lambda x: jnp.sqrt(lax.cond(x[3] > 0, _positive, lambda v: v * v, x)).sum(),
        lambda x: _sqrt_where_positive(x, x > 0).sum(),
    ),
    "zero made in the false branch": (
        lambda x: jnp.sqrt(lax.cond(x[0] > 0, lambda v: v * v, _positive, x)).sum(),
        lambda x: _sqrt_where_positive(x, x > 0).sum(),
    ),
    "live branch taken": (
        lambda x: jnp.sqrt(lax.cond(x[0] > 0, _positive, lambda v: v * v + 1.0, x)).sum(),
        lambda x: jnp.sqrt(x * x + 1.0).sum(),
    ),
}


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("case", sorted(COND_OUTPUTS))
def test_a_cond_output_with_zero_tangent_lanes_is_guarded_after_it(case, mode):
    """Found by a user-style hunt: forward mode took a ``cond``'s outputs as
    live, so ``sqrt(cond(...))`` was NaN in ``jacfwd`` and the report empty.
    An output's tangent is now live only where it is in every branch, and
    its mask is the taken branch's, chosen by the index at run time (the
    live branch taken keeps every lane)."""
    f, oracle = COND_OUTPUTS[case]
    assert_like_double_where(MODES[mode], f, oracle, X)


_CONSTANT_FILL = jnp.array([0.0, 0.5, 0.0, 1.0], jnp.float32)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_closed_over_constant_taken_by_a_where_has_a_zero_tangent(mode):
    """Found by a user-style hunt: the lanes ``where(x > 1, x, K)`` takes from
    a closed-over array ``K`` have a zero tangent, but their tangent mask
    was ALL (every graph input was given one), so the output guard on the
    ``sqrt`` after it selected nothing: ``jacfwd`` all NaN, report empty."""

    def f(x):
        return jnp.sqrt(jnp.where(x > 1, x, _CONSTANT_FILL)).sum()

    def oracle(x):
        big = x > 1
        return jnp.where(big, jnp.sqrt(jnp.where(big, x, 1.0)), jnp.sqrt(_CONSTANT_FILL)).sum()

    assert np.isnan(np.asarray(jax.jacfwd(f)(X))).any()
    assert_like_double_where(MODES[mode], f, oracle, X)


#: the same bodies entered by ``where(x >= 0, x, 0)``: the lane at 0 is
#: *selected*, so ``sqrt'(0) = inf`` there is a genuine singularity.
#: (f, oracle): the oracle writes the double where in the same control flow
#: (a scan's second-order JVP turns the inf into NaN in that row, with or
#: without the guard)
GENUINE_AT_ZERO = {
    "jit": (
        lambda x: _sqrt_plus_mean(jnp.where(x >= 0, x, 0.0)).sum(),
        lambda x: _sqrt_plus_mean_oracle(x >= 0, x).sum(),
    ),
    "cond": (
        lambda x: lax.cond(x[3] > 0, _sqrt_plus_mean, lambda u: u, jnp.where(x >= 0, x, 0.0)).sum(),
        lambda x: lax.cond(
            x[3] > 0,
            lambda u: _sqrt_plus_mean_oracle(x >= 0, u),
            lambda u: u,
            jnp.where(x >= 0, x, 0.0),
        ).sum(),
    ),
    "scan": (
        lambda x: lax.scan(
            lambda c, _: (_sqrt_plus_mean(c), None), jnp.where(x >= 0, x, 0.0), None, length=1
        )[0].sum(),
        lambda x: lax.scan(
            lambda c, _: (_sqrt_plus_mean_oracle(x >= 0, c), None),
            jnp.where(x >= 0, x, 0.0),
            None,
            length=1,
        )[0].sum(),
    ),
}


@pytest.mark.parametrize("mode", ["jacfwd", "jacfwd_jacfwd"])
@pytest.mark.parametrize("case", sorted(GENUINE_AT_ZERO))
def test_a_genuine_singularity_in_a_body_guarded_in_context_stays(case, mode):
    """The masks passed into a body evaluated in its caller's forward
    context clean only the unselected lanes: the selected lane at 0 keeps
    JAX's non-finite derivative, exactly where the double where has it."""
    f, oracle = GENUINE_AT_ZERO[case]
    assert not np.isfinite(np.asarray(MODES[mode](guard(f))(X))).all()
    assert_like_double_where(MODES[mode], f, oracle, X)
