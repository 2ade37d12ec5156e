"""explain(): guard sites, origins with file:line, masks in words, unguarded sites.

Oracles are independent of hlo_guard: source lines are found by searching this
file's text for the expression, and which sites exist follows from the
semantics of each example (a ``where`` kills the untaken branch's lanes, a
``cond`` boundary is not followed, ``cholesky`` has no rule ...).
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import io_callback

import hlo_guard
from hlo_guard.inspect.explain import explain
from hlo_guard.inspect.report_model import ExplainReport
from hlo_guard.jax_frontend.surgery import spliced_program

THIS = os.path.basename(__file__)
X = jnp.array([-1.0, 0.0, 1.0, 4.0])


def line_of(snippet: str) -> int:
    """1-based line of the unique line of this file ending with ``snippet``."""
    with open(__file__) as fh:
        hits = [i for i, line in enumerate(fh, 1) if line.rstrip().endswith(snippet)]
    assert len(hits) == 1, (snippet, hits)
    return hits[0]


def loc_line(location: str) -> int:
    path, line = location.split(":")[:2]
    assert os.path.basename(path) == THIS, location
    return int(line)


# -- the examples (each marked line is searched for by its text) -------------------------


def f_where(x):
    return jnp.where(x > 0, jnp.sqrt(x), 0.0)  # L-where


def f_maximum(x):
    return jnp.maximum(jnp.log(x), -5.0)  # L-maximum


def f_clip(x):
    return jnp.clip(1.0 / x, -1.0, 1.0)  # L-clip


def f_slice(x):
    return jnp.sqrt(x)[:2]  # L-slice


def f_reduce_max(x):
    return jnp.max(jnp.exp(x))  # L-rmax


def f_two_args(x, params):
    return jnp.where(params["w"] > x, jnp.log(x), 0.0)  # L-two


def f_static_dead(x):
    return lax.select_n(True, jnp.log(x), x)  # L-dead


def f_cond(x):
    y = lax.cond(x.sum() > 0, lambda v: jnp.sqrt(v), lambda v: v, x)  # L-cond
    return jnp.where(x > 0, y, 0.0)


def f_while(x):
    _, y = lax.while_loop(
        lambda c: c[0] < 2, lambda c: (c[0] + 1, jnp.sqrt(c[1])), (0, x)
    )  # L-while
    return jnp.where(x > 0, y, 0.0)


def f_tridiagonal(d):
    dl, du = jnp.array([0.0, 1.0]), jnp.array([1.0, 0.0])
    x = jax.lax.linalg.tridiagonal_solve(dl, d, du, jnp.ones((2, 1)))  # L-tri
    return jnp.where(d[:, None] > 2.5, x, 0.0)


def f_effectful(x):
    a = jnp.sqrt(x)  # L-eff
    p = io_callback(
        lambda v: np.asarray(v > 0.5), jax.ShapeDtypeStruct(x.shape, jnp.bool_), a, ordered=True
    )
    return jnp.where(p, a, 0.0)


@jax.jit
def inner_where(v):
    return jnp.where(v > 0, jnp.log(v), 0.0)  # L-inner


def f_nested(x):
    return inner_where(x) * 2.0  # L-nested


@jax.jit
def inner_log(v):
    return jnp.log(v)


def f_zero_into_call(x):
    return inner_log(jnp.where(x > 0, x, 0.0)) * 2.0


def f_static_arg(x, n):
    return jnp.where(x > n, jnp.sqrt(x), 0.0)  # L-staticarg


# -- guard sites ---------------------------------------------------------------------------


def test_where_sqrt_site_origin_and_meaning():
    r = explain(f_where, X)
    assert isinstance(r, ExplainReport)
    assert r.counts()["guards"] == 1 and r.counts()["unguarded"] == 0
    (s,) = r.guards  # forward mode leaks nowhere here: where selects tangents
    assert (s.op, s.operand, s.operand_expr, s.level) == ("sqrt", 0, "x", "partial")
    assert loc_line(s.location) == line_of("# L-where")
    assert s.location.endswith("(f_where)")
    (o,) = s.origins
    assert (o.op, o.primitive) == ("where", "select_n")
    assert loc_line(o.location) == line_of("# L-where")
    assert o.inherited_location  # the select_n itself sits inside jnp.where's jit
    assert o.scope == "jit(_where)"
    # sqrt(x) is the *true* case: its dead lanes are where the predicate is false
    # in the user's words: `x > 0` as written (jnp.greater's inline jit looked through)
    assert o.meaning == "lanes where `x > 0` is false"
    assert s.mask == o.meaning
    # columns differ: the guarded op is sqrt, the origin is the where call
    assert s.location != o.location


def test_maximum_guards_log_and_names_the_losing_side():
    r = explain(f_maximum, X)
    ops = sorted((s.op, s.operand) for s in reverse(r))
    assert ops == [("log", 0), ("max", 0)]
    for s in reverse(r):
        (o,) = s.origins
        assert (o.op, o.primitive) == ("maximum", "max")
        assert loc_line(o.location) == line_of("# L-maximum")
        assert "log(x) < -5.0" in o.meaning


def test_clip_sites_are_in_the_clip_scope_and_named_clip():
    r = explain(f_clip, X)
    scopes = {s.scope for s in reverse(r)}
    assert scopes == {"", "jit(clip)"}
    # the boundary guard sits where x enters the chain: on jnp's true_divide
    # call, protecting the div inside it
    div = [s for s in r.guards if s.op == "true_divide"]
    assert len(div) == 1 and div[0].operand == 1
    assert [p.split(" at ")[0] for p in div[0].protects] == ["div"]
    assert {o.op for o in div[0].origins} == {"clip"}
    assert {o.primitive for o in div[0].origins} == {"max", "min"}
    assert all(loc_line(o.location) == line_of("# L-clip") for o in div[0].origins)
    rev = reverse(r)
    assert sum(1 for s in rev if s.scope == "jit(clip)") == len(rev) - 1


def test_slice_origin_meaning():
    r = explain(f_slice, X)
    (s,) = reverse(r)
    assert s.op == "sqrt"
    (o,) = s.origins
    assert o.primitive == "slice" and "[0:2]" in o.meaning
    assert loc_line(o.location) == line_of("# L-slice")


def test_reduce_max_guards_exp():
    r = explain(f_reduce_max, X)
    exp_sites = [s for s in r.guards if s.op == "exp"]
    assert len(exp_sites) == 1
    (o,) = exp_sites[0].origins
    assert o.primitive == "reduce_max" and "not the maximum" in o.meaning


def test_argument_names_from_signature_and_pytree_paths():
    r = explain(f_two_args, X, {"w": jnp.float32(0.5)})
    (s,) = reverse(r)
    assert s.origins[0].meaning == "lanes where `params['w'] > x` is false"
    assert r.signature == "x: f32[4], params['w']: f32[]"


def test_statically_dead_guard_is_reported_as_stop_gradient():
    r = explain(f_static_dead, X)
    (s,) = reverse(r)
    assert s.op == "log" and s.statically_dead and s.level == "dead"
    assert r.counts()["statically_dead"] == 1
    assert "every lane is dead" in r.to_text()


def test_nested_jit_scope_and_location():
    """The jitted helper is one lane-wise chain: its guard sits where ``x``
    enters it, and the report names the ``log`` inside, with its own line."""
    r = explain(f_nested, X)
    (s,) = reverse(r)
    assert s.op == "jit(inner_where)" and s.scope == "" and s.operand == 0
    assert loc_line(s.location) == line_of("# L-nested")
    (protected,) = s.protects
    assert protected.startswith("log at ") and f":{line_of('# L-inner')}:" in protected
    assert f"protects the chain: {protected}" in r.to_text()


def test_forward_mode_output_guard_on_a_call_whose_tangent_is_partly_zero():
    # the where before the call takes the constant 0.0 where x <= 0: the call's
    # operand tangent is zero there, and log' (inside the call) is inf at 0
    r = explain(f_zero_into_call, X)
    fwd = [s for s in r.guards if s.mode == "forward" and s.op == "jit(inner_log)"]
    assert len(fwd) == 1 and fwd[0].output == 0 and fwd[0].operand is None
    assert fwd[0].origins[0].op == "where"
    assert "`x > 0` is false" in fwd[0].origins[0].meaning
    assert r.counts()["forward_mode"] == len([s for s in r.guards if s.mode == "forward"])
    assert "[forward mode: its tangent]" in r.to_text()


def test_no_forward_mode_guard_on_a_call_whose_body_selects_after_its_risky_op():
    # inner_where's select comes after its log: its output tangent is an exact
    # zero in the constant's lanes, and the body would guard anything risky
    # after the select itself -- the call needs no guard of its own
    r = explain(f_nested, X)
    assert not [s for s in r.guards if s.mode == "forward" and s.op == "jit(inner_where)"]
    assert jnp.all(jnp.isfinite(jax.jacfwd(hlo_guard.guard(f_nested))(X)))


def test_guarded_and_guarded_jit_inputs_and_static_arguments():
    a = explain(hlo_guard.guard(f_where), X)
    b = explain(hlo_guard.guarded_jit(f_where), X)
    assert a.to_dict() == b.to_dict() == explain(f_where, X).to_dict()
    r = explain(hlo_guard.guard(f_static_arg, static_argnums=1), X, 1)
    (s,) = reverse(r)
    assert s.origins[0].meaning == "lanes where `x > 1` is false"
    assert "[static 1]=1" in r.signature


def test_no_dead_lanes_no_sites():
    r = explain(lambda x: jnp.sin(x) * 2.0, X)
    assert r.counts()["guards"] == 0 and not r.sites
    assert "nothing to guard" in r.to_text()


# -- unguarded sites ------------------------------------------------------------------------


def reverse(report):
    return [s for s in report.guards if s.mode == "reverse"]


def test_cond_branches_are_guarded_inside_with_the_outer_where_as_origin():
    r = explain(f_cond, X)
    (s,) = reverse(r)
    assert (s.op, s.scope) == ("sqrt", "cond[1]")  # branch 1: the predicate is true
    assert loc_line(s.location) == line_of("# L-cond")
    (o,) = s.origins
    assert o.op == "where" and o.meaning == "lanes where `x > 0` is false"


def test_while_boundary_is_reported_unguarded():
    r = explain(f_while, X)
    assert not reverse(r)
    (u,) = r.unguarded
    assert u.op == "while" and u.category == "control-flow"
    assert "while" in u.reason
    assert u.origins[0].op == "where"


def _sqrt_plus_mean(v):
    return jnp.sqrt(v) + jnp.mean(v)


def _positive_part(x):
    return jnp.where(x > 0, x, 0.0)


def _on_one_device(fn):
    """``fn`` as a ``shard_map`` over a one-device mesh (an opaque boundary
    to the forward analysis)."""
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:1]), ("i",))
    return jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=P("i"))


#: a partly zero tangent entering a body whose tangents forward mode does
#: not follow: (f of the body's operand, the reported op, its category)
FORWARD_UNFOLLOWED = {
    "shard_map": (_on_one_device(_sqrt_plus_mean), "shard_map", "control-flow"),
    "call holding a shard_map": (
        jax.jit(lambda v: _on_one_device(_sqrt_plus_mean)(v) * 2.0),
        "jit(<lambda>)",
        "other",
    ),
}

X4 = jnp.array([-1.0, 0.0, 1.0, 4.0], jnp.float32)


@pytest.mark.parametrize("case", sorted(FORWARD_UNFOLLOWED))
def test_a_zero_tangent_entering_an_unfollowed_body_is_reported(case):
    """Forward mode does not follow tangents into a ``shard_map``, or a call
    whose body holds one: a partly zero tangent entering such a body with a
    singular operation (``sqrt``) leaks in ``jacfwd`` -- and the report said
    nothing (0 unguarded sites; so it was for ``cond``, ``scan`` and
    ``while``, whose bodies are now guarded in that context instead:
    ``tests/test_call_output_guards.py``).  Now it names the op."""
    body, op, category = FORWARD_UNFOLLOWED[case]

    def f(x):
        return body(_positive_part(x)).sum()

    assert np.isnan(np.asarray(jax.jacfwd(hlo_guard.guard(f))(X4))).all()
    r = explain(f, X4)
    (u,) = r.unguarded
    assert (u.op, u.category) == (op, category)
    assert u.reason.startswith("forward mode: a partly structurally zero tangent enters")
    assert u.origins[0].op == "where"
    assert u.origins[0].meaning.startswith("lanes where `x > 0` is false")


@pytest.mark.parametrize("case", sorted(FORWARD_UNFOLLOWED))
def test_a_live_tangent_or_a_safe_body_is_not_reported(case):
    body, _, _ = FORWARD_UNFOLLOWED[case]
    # every tangent lane live: the body's own analysis is exact
    assert not explain(lambda x: body(x * x + 1.0).sum(), X4).unguarded
    # no singular operation in the body: a zero tangent stays zero
    assert not explain(
        lambda x: lax.cond(
            x[3] > 0, lambda v: v * 2.0 + jnp.sum(v), lambda v: v, _positive_part(x)
        ).sum(),
        X4,
    ).unguarded


def _rnn(w, x):
    def step(h, xt):
        h = jnp.tanh(w * xt + h)
        return h, h

    return jax.lax.scan(step, 0.0, x)[1]


def _scan_over_padded_steps(w, d):
    """An RNN over ``log(d)``: the padded step has ``d = 0``; its output is
    masked, and the final carry is dropped."""
    return jnp.sum(jnp.where(jnp.array([True, True, False]), _rnn(w, jnp.log(d)), 0.0))


def _loop_mixing_lanes_masked(w, d):
    """A fori_loop (a scan) whose final carry is masked per lane, and whose
    body moves lanes (``roll``): a lane dead at the end may be live earlier."""
    h = jax.lax.fori_loop(
        0, 2, lambda i, h: jnp.tanh(w * jnp.log(d) + jnp.roll(h, 1)), jnp.zeros_like(d)
    )
    return jnp.sum(jnp.where(jnp.array([True, True, False]), h, 0.0))


@pytest.mark.parametrize("fn", [_scan_over_padded_steps, _loop_mixing_lanes_masked])
def test_scan_dead_lanes_lost_in_its_live_carry_are_reported(fn):
    """The carry is kept fully live, so a padded iteration's dead lanes (or
    the lanes of a body that moves them) are not followed: the gradient is
    NaN there (as without the guard) -- which the report used to hide behind
    "nothing to guard".  (A lane-wise body's masked final carry is followed:
    tests/test_scan_carry_masks.py.)"""
    w, d = jnp.float32(0.5), jnp.array([1.0, 2.0, 0.0])
    assert np.isnan(np.asarray(jax.grad(hlo_guard.guard(fn), argnums=(0, 1))(w, d)[1])).any()
    r = explain(fn, w, d)
    (u,) = r.unguarded
    assert u.op == "scan" and u.category == "control-flow"
    assert "not followed through the loop" in u.reason
    assert u.origins[0].op == "where"


def test_scan_with_stacked_outputs_dead_only_in_the_body_is_not_reported():
    """Dead lanes of ``ys`` that stay dead inside the body (not joined with
    the carry) are followed and guarded there: no report."""

    def f(x):
        ys = jax.lax.scan(lambda c, xt: (c + xt, jnp.sqrt(xt)), 0.0, x)[1]
        return jnp.sum(jnp.where(x > 0, ys, 0.0))

    x = jnp.array([1.0, 0.0, 4.0])
    assert not explain(f, x).unguarded
    np.testing.assert_array_equal(jax.grad(hlo_guard.guard(f))(x), [0.5, 0.0, 0.25])


def test_primitive_without_rule_is_reported_with_its_name():
    r = explain(f_tridiagonal, jnp.array([2.0, 3.0]))
    (u,) = [s for s in r.unguarded if s.op == "tridiagonal_solve"]
    assert u.category == "no-rule"
    assert u.reason == "no rule for primitive 'tridiagonal_solve'"
    assert loc_line(u.location) == line_of("# L-tri")
    assert r.counts()["unguarded_by_category"] == {"no-rule": 1}


def test_guard_skipped_for_effectful_mask_is_reported():
    r = explain(f_effectful, X)
    assert not r.guards
    (u,) = r.unguarded
    assert (u.op, u.category, u.operand) == ("sqrt", "skipped", 0)
    assert "io_callback" in u.reason
    assert loc_line(u.location) == line_of("# L-eff")


# -- serialisation ---------------------------------------------------------------------------


def test_json_round_trip_and_text():
    r = explain(f_clip, X)
    d = json.loads(r.to_json())
    assert d["framework"] == "jax" and d["function"] == "f_clip"
    assert (
        d["counts"]["guards"]
        == len(r.guards)
        == len([s for s in d["sites"] if s["kind"] == "guard"])
    )
    site = next(s for s in d["sites"] if s["op"] == "true_divide")
    assert site["protects"] and site["protects"][0].startswith("div at ")
    assert {"op", "location", "meaning", "primitive", "scope", "operand"} <= set(site["origins"][0])
    text = r.to_text()
    assert text.startswith("hlo_guard explain: f_clip(x: f32[4]) [jax]")
    first = r.guards[0]
    assert loc_line(first.location) == line_of("# L-clip")
    n = next(i for i, s in enumerate(r.guards, 1) if s.op == "true_divide")
    assert f"GUARD #{n}: true_divide operand 1 (`x`) at {r.guards[n - 1].location}\n" in text


def test_base_report_records_render_too():
    """A front end that fills only passes.report's base records still renders."""
    from passes.report import OriginRecord, SiteRecord

    r = ExplainReport(
        "tf",
        "loss",
        sites=[
            SiteRecord(
                "guard",
                "Sqrt",
                "model.py:3",
                operand=0,
                origins=[OriginRecord("SelectV2", "model.py:4", "lanes where c is false")],
            ),
            SiteRecord("unguarded", "While", "model.py:9", reason="control flow"),
        ],
    )
    text = r.to_text()
    assert "GUARD #1: Sqrt operand 0 at model.py:3" in text
    assert "dead lanes: lanes where c is false" in text
    assert "UNGUARDED #1: While at model.py:9" in text and "reason: control flow" in text
    assert json.loads(r.to_json())["counts"]["unguarded"] == 1


def test_tensorflow_function_fills_the_same_report_model():
    tf = pytest.importorskip("tensorflow")
    hg = pytest.importorskip("hlo_guard.tf")

    @hg.guarded_function
    def tf_where(x):
        return tf.where(x > 0, tf.sqrt(x), 0.0)  # L-tf

    r = explain(tf_where, tf.constant([-1.0, 0.0, 1.0, 4.0]))
    assert isinstance(r, ExplainReport) and r.framework == "tensorflow"
    (s,) = r.guards
    assert "Sqrt" in s.op and s.operand == 0
    assert any("SelectV2" in o.op for o in s.origins)
    assert "GUARD #1:" in r.to_text() and json.loads(r.to_json())["counts"]["guards"] == 1
    assert r.dumps("hlo", "forward").startswith("(no difference")
    diff = r.dumps("stablehlo", "grad")
    assert any(l.startswith("+") and "stablehlo.select" in l for l in diff.splitlines())


# the public names are the functions (the modules live in hlo_guard.inspect)
# once the lead exports the function it is callable
EXPORTED = callable(getattr(hlo_guard, "explain", None))


@pytest.mark.skipif(
    not EXPORTED,
    reason="lead: enable by adding the exports to hlo_guard/__init__.py (see the issue-3 report)",
)
def test_public_exports():
    import importlib

    mod = importlib.import_module
    assert hlo_guard.explain is mod("hlo_guard.inspect.explain").explain
    assert hlo_guard.compare is mod("hlo_guard.inspect.compare").compare
    assert hlo_guard.dump is mod("hlo_guard.inspect.dumps").dump
    assert hlo_guard.dump_lowered is mod("hlo_guard.inspect.dumps").dump_lowered
    assert "explain" in hlo_guard.__all__ and "compare" in hlo_guard.__all__


# -- grouping by selection, constants, wording (issue 9, item 7) ---------------------------

CONST = np.array([1.0, 2.0, 0.0, 4.0], np.float32)


def f_two_branches(x):
    return jnp.where(x > 1, jnp.sqrt(x - 1) + jnp.log(x), jnp.exp(x))  # L-two-br


def f_constant_branches(x):
    y = jnp.where(x > 1, jnp.log(CONST), jnp.sqrt(x))  # L-const
    return y + jnp.clip(jnp.sqrt(x), 0.1, 2.0)


def f_negated(x):
    return jnp.where(~(x > 0), 0.0, jnp.sqrt(x))  # L-neg


def f_deep_predicate(x):
    p = jnp.logical_not(jnp.sin(jnp.cos(jnp.exp(x * 2 + 1) - 3) * 4) > 0.5)
    return jnp.where(p, jnp.log(x), 0.0)  # L-deep


def f_scan_body(x):
    def body(c, xi):
        return c + xi, jnp.where(xi > c, jnp.sqrt(xi - c), 0.0)  # L-scan

    return lax.scan(body, 0.0, x)[1]


def test_sites_are_grouped_by_the_selection_that_causes_them():
    r = explain(f_two_branches, X)
    groups = r.groups()
    assert len(groups) == 1
    ((origins, sites),) = groups
    assert [o.op for o in origins] == ["where"]
    assert loc_line(origins[0].location) == line_of("# L-two-br")
    # sqrt(x - 1): the guard sits where x enters that chain, on the subtraction
    reverse_sites = sorted((s for s in sites if s.mode == "reverse"), key=lambda s: s.op)
    assert [s.op for s in reverse_sites] == ["exp", "log", "subtract"]
    assert [[p.split(" at ")[0] for p in s.protects] for s in reverse_sites] == [
        ["exp"],
        ["log"],
        ["sqrt"],
    ]
    text = r.to_text()
    header = f"SELECTED BY where [select_n] at {origins[0].location}"
    assert text.count("SELECTED BY") == 1 and header in text
    # the sites follow their header, numbered as report.guards
    assert text.index(header) < text.index("GUARD #1:") < text.index("GUARD #2:")
    for n, s in enumerate(r.guards, 1):
        assert f"GUARD #{n}: {s.op}" in text
    d = json.loads(r.to_json())
    assert len(d["groups"]) == 1
    assert sorted(d["groups"][0]["sites"]) == [
        i for i, s in enumerate(d["sites"]) if s["kind"] == "guard"
    ]
    assert d["groups"][0]["origins"][0]["op"] == "where"


def test_two_wheres_make_two_groups():
    f = lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0) + jnp.where(x < 3, jnp.log(x), 1.0)
    r = explain(f, X)
    assert [len(sites) for _, sites in r.groups()] == [1, 1]
    assert r.to_text().count("SELECTED BY") == 2


def test_a_wrapper_body_traced_elsewhere_first_names_this_call_site():
    """JAX reuses the body it traced first for every later ``jnp.where`` of
    that shape, and its equations carry the first call site's frame: a report
    made after another function used ``jnp.where`` put both selections of
    this one at that other line, and merged their groups (found when a test
    file ran before this one)."""

    @jax.custom_jvp
    def elsewhere(x):
        return jnp.sqrt(jnp.maximum(x, 0.0))

    @elsewhere.defjvp
    def _rule(primals, tangents):
        (x,), (t,) = primals, tangents
        return elsewhere(x), jnp.where(x > 0, 0.5 / jnp.sqrt(x), 0.0) * t

    # the first trace of this shape's ``_where``: JAX's JVP of the call traces the rule
    jax.grad(hlo_guard.guard(lambda x: jnp.sum(elsewhere(x))))(X)

    def f(x):
        a = jnp.where(x > 0, jnp.sqrt(x), 0.0)
        b = jnp.where(x < 3, jnp.log(x), 1.0)
        return a + b

    groups = explain(f, X).groups()
    assert [len(sites) for _, sites in groups] == [1, 1]
    lines = [int(origins[0].location.split(":")[1]) for origins, _ in groups]
    first = f.__code__.co_firstlineno
    assert lines == [first + 1, first + 2]


def _guard_operands(analysis, out):
    """(graph, operand atom) of every planned guard, nested graphs included."""
    from passes.planning import plan_guards

    sites, _ = plan_guards(analysis)
    out.extend((analysis.graph, analysis.graph.eqns[s.node].invars[s.index]) for s in sites)
    for sub in analysis.subs.values():
        _guard_operands(sub, out)
    return out


def test_constants_and_literals_are_neither_listed_nor_guarded():
    """``log(CONST)`` (a closed-over array) and clip's literal bounds have no
    derivative: no guard site, and no select on them in the guarded program."""
    r = explain(f_constant_branches, X)
    exprs = {s.operand_expr for s in r.guards}
    assert "const" not in exprs and "0.1" not in exprs and "2.0" not in exprs
    assert {(s.op, s.operand_expr) for s in r.guards if s.mode == "reverse"} >= {("sqrt", "x")}
    assert not any(s.op == "log" for s in r.guards)
    program, _ = hlo_guard.guard(f_constant_branches).traced(X)
    for graph, atom in _guard_operands(program.analysis, []):
        assert not graph.is_constant(atom), atom
    # the guarded program uses the constant only in its log: no select on it
    closed = spliced_program(jax.make_jaxpr(hlo_guard.guard(f_constant_branches))(X))
    (cvar,) = [
        v
        for v, c in zip(closed.jaxpr.constvars, closed.consts)
        if np.shape(c) == CONST.shape and np.array_equal(c, CONST)
    ]
    users = [e.primitive.name for e in closed.jaxpr.eqns if cvar in e.invars]
    assert users == ["log"], users
    # and the gradient is the per-lane oracle's (only the taken branch differentiated)
    x = np.array([0.001, 2.0, 3.0, 5.0], np.float32)
    want = [
        (0.0 if v > 1 else 0.5 / np.sqrt(v)) + (0.5 / np.sqrt(v) if 0.01 < v < 4 else 0.0)
        for v in x.astype(np.float64)
    ]
    got = jax.grad(lambda x: jnp.sum(hlo_guard.guard(f_constant_branches)(x)))(x)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_dead_lane_text_has_no_jaxpr_names_and_no_double_negatives():
    texts = []
    for f in (f_negated, f_deep_predicate, f_scan_body, f_cond, f_while):
        r = explain(f, X)
        texts.append(r.to_text())
        for s in r.sites:
            for field in [s.mask, s.operand_expr] + [o.meaning for o in s.origins]:
                assert "%" not in field and "main" not in field, (f.__name__, field)
                if "` is " in field:
                    assert "`~" not in field, (f.__name__, field)  # "~p is false": say "p is true"
    (s,) = reverse(explain(f_negated, X))
    assert s.op == "sqrt" and s.mask == "lanes where `x > 0` is false"
    (s,) = reverse(explain(f_deep_predicate, X))
    assert s.mask == "lanes where `sin(…) > 0.5` is true"
    # inside the scan body, the boundary is where x[i] and the carry enter
    # the chain sqrt(x[i] - carry)
    sites = reverse(explain(f_scan_body, X))
    assert {s.operand_expr for s in sites} == {"x[i]", "carry 0"}
    for s in sites:
        assert s.mask == "lanes where `x[i] > carry 0` is false"
        assert [p.split(" at ")[0] for p in s.protects] == ["sqrt"]


# -- dead lanes inside a custom_vjp body: reported, never silent ------------------------


@jax.custom_vjp
def _recomputing_sqrt(x):
    return jnp.where(x > 0, jnp.sqrt(x), 0.0)


def _recomputing_fwd(x):
    return _recomputing_sqrt(x), x


def _recomputing_bwd(x, g):
    # what a checkpointed loop does: differentiate the original body again
    return jax.vjp(lambda v: jnp.where(v > 0, jnp.sqrt(v), 0.0), x)[1](g)


_recomputing_sqrt.defvjp(_recomputing_fwd, _recomputing_bwd)


def test_dead_branch_inside_a_recomputing_custom_vjp_is_reported():
    """The guard cannot reach a custom_vjp's backward pass; when that pass
    re-differentiates the body, the body's dead ``sqrt`` leaks NaN even through
    the guard.  ``explain`` must say so, naming the ``sqrt``; a ``custom_jvp``
    with a formula rule that selects inside (``relu``) is not reported."""
    x = jnp.array([-1.0, 4.0])

    def f(v):
        return jnp.sum(_recomputing_sqrt(v)) + jnp.sum(jax.nn.relu(v))

    assert not np.isfinite(np.asarray(jax.grad(hlo_guard.guard(f))(x))).all()
    report = explain(f, x)
    hits = [s for s in report.unguarded if s.primitive == "custom_vjp_call"]
    assert len(hits) == 1 and "sqrt at" in hits[0].reason and "test_explain.py" in hits[0].reason
    assert not [s for s in report.unguarded if s.primitive == "custom_jvp_call"]


def test_contraction_guards_are_listed_with_the_operand_they_zero():
    """The selects a guarded contraction adds to the derivative show up in the
    HLO; explain names them: each operand whose dead lanes the other
    operand's derivative term reads as zero."""
    d = jnp.array([0.0, 1.0, 2.0])
    w = jnp.arange(6.0).reshape(3, 2) / 4.0

    def padded_rows(w, d):
        h = (1.0 / d)[:, None] * jnp.ones((1, 3))
        return jnp.sum(jnp.where((d > 0)[:, None], h @ w, 0.0) ** 2)

    report = explain(padded_rows, w, d)
    zeroed = [s for s in report.guards if s.mode == "contraction"]
    # ``w`` lives or dies with the rows all together (a one-bit mask): the
    # rewrite leaves its zeroing out, and its boundary guard, and explain
    # says so in a note instead of listing them (docs/PLACEMENT.md)
    assert [(s.primitive, s.operand) for s in zeroed] == [("dot_general", 0)]
    assert report.counts()["contraction"] == 1
    assert "2 planned guard(s) left out: operands of a contraction" in str(report)
    assert "[contraction: the other operand's derivative reads its dead lanes as zero]" in str(
        report
    )
    assert "d > 0" in zeroed[0].mask

    # an operand with no derivative of its own (closed over) is listed too,
    # its dead lanes taken from the contraction's output
    with np.errstate(divide="ignore"):
        h = (1.0 / np.asarray(d))[:, None] * np.ones((1, 3), np.float32)
    rows = np.asarray(d) > 0

    def closed_over(w):
        return jnp.sum(jnp.where(rows[:, None], jnp.asarray(h) @ w, 0.0) ** 2)

    zeroed = [s for s in explain(closed_over, w).guards if s.mode == "contraction"]
    assert 0 in [s.operand for s in zeroed]


def test_a_contraction_with_a_constant_kernel_is_explained():
    """A closed-over kernel's zeroed lanes have no selecting origin: its
    group sorted against the others' locations crashed ``explain`` (found
    by a user-style hunt, ``jnp.convolve`` with a constant kernel).  The
    convolution here skips every other input lane (stride 2): a full
    ``jnp.convolve`` reads every lane, and since its geometry is read it
    leaves nothing dead to explain."""
    k = jnp.array([[[2.0]]])
    x = jnp.array([-1.0, -2.0, 1.0, 4.0, 2.0, 3.0])

    def f(x):
        s = jnp.sqrt(jnp.where(x > 0, x, 0.0))
        return lax.conv_general_dilated(s[None, None], k, (2,), "VALID").sum()

    r = explain(f, x)
    groups = r.groups()
    assert groups and all(origins for origins, _ in groups[:-1])
    assert not groups[-1][0]  # the origin-less group comes last
    assert "GUARD" in str(r)


#: a partly zero tangent coming *out of* an operation whose output tangents
#: forward mode takes as live, into a ``sqrt``: (f, the reported op)
TANGENT_TAKEN_AS_LIVE = {
    "fori_loop output": (
        lambda x: jnp.sqrt(lax.fori_loop(0, 3, lambda i, v: v * 0.5, _positive_part(x))).sum(),
        "sqrt",
    ),
    "scan ys": (
        lambda x: jnp.sqrt(lax.scan(lambda c, e: (c, 2.0 * e), 0.0, _positive_part(x))[1]).sum(),
        "sqrt",
    ),
    "a loop inside a jit helper": (
        lambda x: jax.jit(lambda v: jnp.sqrt(_through_a_loop(v)))(_positive_part(x)).sum(),
        "jit(<lambda>)",
    ),
}


def _through_a_loop(v):
    """``v`` handed through a loop, whose output tangents forward mode takes
    as live (a taint, :mod:`passes.tangent_gaps`)."""
    return lax.fori_loop(0, 2, lambda i, c: c * 1.0, v)


@pytest.mark.parametrize("case", sorted(TANGENT_TAKEN_AS_LIVE))
def test_a_zero_tangent_through_an_unfollowed_output_is_reported(case):
    """Found by a user-style hunt: forward mode takes the outputs of
    loops (and a helper holding them) as live, so the ``sqrt``
    after them got no guard -- and the report was empty while ``jacfwd``
    was NaN.  The zero lanes are followed as a taint (``passes.tangent_gaps``,
    as the TF front end does) to the singular operation they reach, which is
    reported.  (A ``cond``'s outputs are now followed and guarded:
    ``tests/test_call_output_guards.py``.)"""
    f, op = TANGENT_TAKEN_AS_LIVE[case]
    x = jnp.array([-1.0, -2.0, 1.0, 4.0], jnp.float32)
    assert np.isnan(np.asarray(jax.jacfwd(hlo_guard.guard(f))(x))).all()
    gaps = [u for u in explain(f, x).unguarded if u.reason.startswith("forward mode")]
    assert [u.op for u in gaps] == [op]
    assert "taken as live" in gaps[0].reason


def test_a_live_tangent_through_a_sort_is_not_reported():
    x = jnp.array([-1.0, -2.0, 1.0, 4.0], jnp.float32)
    assert not explain(lambda x: jnp.sqrt(jnp.sort(x * x + 1.0)).sum(), x).unguarded


SORTED_ZEROS = {
    "sort": lambda x: jnp.sqrt(jnp.sort(_positive_part(x))),
    "sort along an axis": lambda x: jnp.sqrt(jnp.sort(_positive_part(x).reshape(2, 2), axis=0)),
    "sort_key_val": lambda x: jnp.sqrt(lax.sort_key_val(-x, _positive_part(x))[1]),
    "argsort and take": lambda x: jnp.sqrt(_positive_part(x)[jnp.argsort(x)]),
    "in a jit helper": lambda x: jax.jit(lambda v: jnp.sqrt(jnp.sort(v)))(_positive_part(x)),
}


@pytest.mark.parametrize("case", sorted(SORTED_ZEROS))
def test_zeros_through_a_sort_are_guarded_in_forward_mode(case):
    """A partly zero tangent through ``sort`` into ``sqrt`` (taken as live
    and reported before): its mask is permuted as the tangent is, so the
    ``sqrt`` gets its forward guard.  Oracle: per lane, ``sqrt`` of a lane
    holding a structural zero contributes nothing (the double where)."""
    f = SORTED_ZEROS[case]
    x = jnp.array([-1.0, 0.0, 1.0, 4.0], jnp.float32)
    # the same program on the positive part written as the double where would
    # be: zero lanes carry no tangent into the sqrt
    pos = x > 0
    oracle = jnp.diag(jnp.where(pos, 0.5 / jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0))
    got = jax.jacfwd(lambda x: f(x).reshape(-1).sum())(x)
    assert np.isnan(np.asarray(got)).any()  # plain JAX
    g = hlo_guard.guard(lambda x: f(x).reshape(-1).sum())
    np.testing.assert_allclose(jax.jacfwd(g)(x), oracle.sum(axis=0))
    np.testing.assert_allclose(jax.grad(g)(x), oracle.sum(axis=0))
    np.testing.assert_allclose(jax.jit(jax.jacfwd(g))(x), oracle.sum(axis=0))
    assert not [u for u in explain(g, x).unguarded if u.reason.startswith("forward mode")]


def test_zeros_coming_back_around_a_loop_through_a_sort_are_guarded():
    """The carry's tangent comes back through a ``sort``: its mask travels
    with the carry, permuted, so the next iteration's ``sqrt`` is guarded
    (it was NaN and reported).  Oracle: the double where written in the
    same scan, carrying the mask through the same sort."""

    def f(x):
        def step(c, _):
            return jnp.sort(jnp.where(c > 1.0, c, 0.0)), jnp.sqrt(c)

        return lax.scan(step, x, None, length=2)[1].sum()

    def oracle(x):
        def step(carry, _):
            c, m = carry
            keep = m & (c > 1.0)
            c2, m2 = lax.sort_key_val(jnp.where(c > 1.0, c, lax.stop_gradient(c) * 0.0), keep)
            y = jnp.where(m, jnp.sqrt(jnp.where(m, c, 1.0)), jnp.sqrt(lax.stop_gradient(c)))
            return (c2, m2), y

        return lax.scan(step, (x, jnp.ones(x.shape, bool)), None, length=2)[1].sum()

    x = jnp.array([0.5, 2.0, 3.0], jnp.float32)
    want = jax.jacfwd(oracle)(x)
    assert np.isfinite(np.asarray(want)).all()
    np.testing.assert_allclose(jax.jacfwd(hlo_guard.guard(f))(x), want, rtol=1e-6)
    assert not [u for u in explain(f, x).unguarded if u.reason.startswith("forward mode")]


def test_a_zero_coming_back_around_a_loop_through_an_inner_loop_is_reported():
    """The carry's tangent comes back through an inner loop (its output
    taken as live), so the next iteration's ``sqrt`` of the carry meets
    zero lanes no guard knows of: reported on the ``sqrt`` (the carry is
    seeded with the taint of the value the body hands back)."""

    def f(x):
        def step(c, _):
            return _through_a_loop(jnp.where(c > 1.0, c, 0.0)), jnp.sqrt(c)

        return lax.scan(step, x, None, length=2)[1].sum()

    x = jnp.array([0.5, 2.0], jnp.float32)
    assert np.isnan(np.asarray(jax.jacfwd(hlo_guard.guard(f))(x))).all()
    gaps = [u for u in explain(f, x).unguarded if u.reason.startswith("forward mode")]
    assert [u.op for u in gaps] == ["sqrt"]
    assert "around the loop" in gaps[0].reason


#: a tangent taken as live (out of a loop) entering a branch or
#: loop body whose ``sqrt`` reads it: (f, the reported op)
TAINT_ENTERING_A_BODY = {
    "cond branch": lambda x: lax.cond(
        x[0] < 0, jnp.sqrt, lambda v: v * 2.0, _through_a_loop(_positive_part(x))
    ).sum(),
    "cond branch mixing lanes": lambda x: lax.cond(
        x[0] < 0,
        lambda v: jnp.sqrt(v) + v.mean(),
        lambda v: v * 2.0,
        _through_a_loop(_positive_part(x)),
    ).sum(),
    "scan xs": lambda x: lax.scan(
        lambda c, e: (c + jnp.sqrt(e), None), 0.0, _through_a_loop(_positive_part(x))
    )[0],
    "scan carry": lambda x: lax.scan(
        lambda c, _: (jnp.sqrt(c) + 1.0, None), _through_a_loop(_positive_part(x)), None, length=2
    )[0].sum(),
    "fori_loop carry": lambda x: lax.fori_loop(
        0, 2, lambda i, c: jnp.sqrt(c) + 1.0, _through_a_loop(_positive_part(x))
    ).sum(),
    "a loop's output into a cond": lambda x: lax.cond(
        x[0] < 0,
        jnp.sqrt,
        lambda v: v,
        lax.fori_loop(0, 3, lambda i, c: c * 0.5, _positive_part(x)),
    ).sum(),
    "jit holding a cond": lambda x: jax.jit(
        lambda v: lax.cond(v[0] >= 0, jnp.sqrt, lambda u: u, v)
    )(_through_a_loop(_positive_part(x))).sum(),
}


@pytest.mark.parametrize("case", sorted(TAINT_ENTERING_A_BODY))
def test_a_taint_entering_a_body_is_reported_inside(case):
    """Found by this session's hunt: a tangent taken as live entered a
    ``cond`` branch or loop body, whose own analysis takes its inputs as
    live, so the ``sqrt`` inside got no guard and no report while ``jacfwd``
    was NaN.  The body's inputs are now seeded with the caller's taint (as
    the TF front end's ``body_seeds`` do), and a call holding such a body is
    reported at the call."""
    f = TAINT_ENTERING_A_BODY[case]
    x = jnp.array([-1.0, -2.0, 1.0, 4.0], jnp.float32)
    assert np.isnan(np.asarray(jax.jacfwd(hlo_guard.guard(f))(x))).any()
    gaps = [u for u in explain(f, x).unguarded if u.reason.startswith("forward mode")]
    assert gaps, "a NaN tangent with an empty report"
    assert "taken as live" in gaps[0].reason


def test_nested_scans_feeding_an_inner_output_back_are_reported():
    """hunt11 F2b: an outer loop's accumulator made from an inner scan's
    output (whose tangent forward mode takes as live) comes back around the
    outer loop into the inner body's ``sqrt``.  Its lanes are not known
    there: reported (it was neither guarded nor reported)."""

    def f(x):
        def outer(acc, _):
            ys = lax.scan(lambda c, e: (c, jnp.sqrt(c + e)), acc, jnp.zeros(2))[1]
            return jnp.where(ys[0] > 1.0, ys[0], 0.0), None

        return lax.scan(outer, x, None, length=3)[0].sum()

    x = jnp.array([-1.0, -2.0, 1.0, 4.0], jnp.float32)
    gaps = [u for u in explain(f, x).unguarded if u.reason.startswith("forward mode")]
    assert [u.op for u in gaps] == ["sqrt"]
    assert "around the loop" in gaps[0].reason


@pytest.mark.parametrize(
    "body",
    [
        lambda v, w: v * 2.0 + w,
        lambda v, w: v * 2.0 + jnp.sqrt(w),
    ],
    ids=["scale", "sqrt of a live value"],
)
def test_a_taint_entering_a_safe_body_is_not_reported(body):
    """A branch that only scales the tainted value, or whose ``sqrt`` reads
    a value the taint does not reach, has nothing to report."""

    def f(x):
        v, w = _through_a_loop(_positive_part(x)), x * x + 1.0
        return lax.cond(x[0] < 0, body, lambda v, w: v + w, v, w).sum()

    x = jnp.array([-1.0, -2.0, 1.0, 4.0], jnp.float32)
    assert not [u for u in explain(f, x).unguarded if u.reason.startswith("forward mode")]


@pytest.mark.parametrize("after", ["scale", "divide", "mean"])
def test_a_finite_scale_after_an_unfollowed_output_is_not_reported(after):
    """A tangent taken as live out of a scan then scaled by a known finite
    constant cannot turn non-finite: ``c * 2.0`` is ``jit(multiply)``, whose
    body's ``mul`` sees the constant (no report; found as noise by a hunt)."""
    follow = {
        "scale": lambda c: c * 2.0,
        "divide": lambda c: c / 4.0,
        "mean": jnp.mean,
    }[after]

    def f(x):
        c = lax.scan(lambda c, _: (jnp.where(c > 1.0, c, 0.0), None), x, None, length=2)[0]
        return jnp.sum(follow(c))

    x = jnp.array([0.5, 1.5, 2.0, 3.0], jnp.float32)
    assert not [u for u in explain(f, x).unguarded if u.reason.startswith("forward mode")]


@pytest.mark.parametrize("wrap", ["cond", "scan", "fori_loop"])
def test_dead_lanes_inside_a_body_over_arguments_are_not_reported(wrap):
    """A selection inside a body guards the body's uses of its operands;
    its dead lanes are not followed back out of the body -- which matters
    only where an operation before the body could turn their zero cotangent
    non-finite.  Over the function's own arguments there is none: no report
    (every cond or loop with a ``where`` inside was reported, found by the
    clean-implies-exact fuzz), and the gradient is the double where's."""
    inner = lambda v: jnp.where(v > 0, jnp.sqrt(v), 0.0)  # noqa: E731
    oracle = lambda v: jnp.where(v > 0, jnp.sqrt(jnp.where(v > 0, v, 1.0)), 0.0)  # noqa: E731
    run = {
        "cond": lambda g, x: lax.cond(x[0] < 5.0, g, lambda v: v, x),
        "scan": lambda g, x: lax.scan(lambda c, _: (c, g(c)), x, None, length=1)[1][0],
        "fori_loop": lambda g, x: lax.fori_loop(0, 1, lambda i, c: g(x), jnp.zeros_like(x)),
    }[wrap]
    f = lambda x: run(inner, x).sum()  # noqa: E731
    x = jnp.array([-1.0, 0.0, 1.0, 4.0], jnp.float32)
    assert not explain(f, x).unguarded
    np.testing.assert_allclose(
        jax.grad(hlo_guard.guard(f))(x), jax.grad(lambda x: run(oracle, x).sum())(x)
    )


def test_dead_lanes_inside_a_body_with_a_singular_op_before_it_are_reported():
    """``sqrt`` before the cond: the zero cotangent of the lanes the body's
    ``where`` drops meets ``sqrt'(0)`` outside the body, where it is not
    followed -- NaN, and reported on the cond."""

    def f(x):
        v = jnp.sqrt(x)
        return lax.cond(x[0] < 5.0, lambda v: jnp.where(v > 0, v, 0.0), lambda v: v, v).sum()

    x = jnp.array([1.0, 0.0, 1.0, 4.0], jnp.float32)
    assert np.isnan(np.asarray(jax.grad(hlo_guard.guard(f))(x))).any()
    gaps = [u for u in explain(f, x).unguarded if u.op == "cond"]
    assert gaps and "not followed back" in gaps[0].reason


def test_dead_lanes_inside_a_body_in_a_helper_follow_the_helper_to_its_caller():
    """A cond inside a ``checkpoint`` helper: its operand is the helper's
    input, which the caller binds to the function's argument -- nothing to
    protect (followed through the helper's link to its caller); a ``sqrt``
    of the argument passed in instead keeps the report."""

    def body(v):
        return lax.cond(v[0] < 5.0, lambda u: jnp.where(u > 0, u, 0.0), lambda u: u, v)

    x = jnp.array([1.0, 0.0, 1.0, 4.0], jnp.float32)
    assert not explain(lambda x: jax.checkpoint(body)(x).sum(), x).unguarded
    reported = explain(lambda x: jax.checkpoint(body)(jnp.sqrt(x)).sum(), x).unguarded
    assert [u.op for u in reported] == ["cond"]


_W = jnp.array([1.0, 2.0, -3.0, 0.0], jnp.float32)

#: a factor a ``where`` zeroes by value times one with an infinite
#: derivative there: (f, its double where)
WHERE_MADE_ZERO_FACTORS = {
    "mask times sqrt": (
        lambda x: jnp.sum(jnp.where(x > 0, 1.0, 0.0) * jnp.sqrt(x)),
        lambda x: jnp.sum(jnp.where(x > 0, 1.0, 0.0) * jnp.sqrt(jnp.where(x > 0, x, 1.0))),
    ),
    "jax.grad inside the loss (force matching)": (
        lambda x: jnp.sum(jax.grad(lambda x: jnp.sum(jnp.where(x > 0, x**1.5, 0.0)))(x) ** 2),
        lambda x: jnp.sum(
            jax.grad(lambda x: jnp.sum(jnp.where(x > 0, jnp.where(x > 0, x, 1.0) ** 1.5, 0.0)))(x)
            ** 2
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(WHERE_MADE_ZERO_FACTORS))
def test_a_where_made_zero_times_a_singular_factor_is_reported(case):
    """Found by a user-style hunt: ``where(c, 1, 0) * sqrt(x)`` -- or JAX's
    own backward pass ``select_n(c, 0, ct) * 1.5 * x ** 0.5`` in a loss that
    calls ``jax.grad`` -- is ``0 * inf`` in the zeroed lanes.  Those lanes
    are zero by value, not dead, so nothing is guarded there; the gradient
    is NaN where the double where is finite, and the report was empty.  It
    is now reported on the ``mul``."""
    f, oracle = WHERE_MADE_ZERO_FACTORS[case]
    x = jnp.array([0.0, 0.0, 0.5, 2.0], jnp.float32)
    assert np.isfinite(np.asarray(jax.grad(oracle)(x))).all()
    assert np.isnan(np.asarray(jax.grad(hlo_guard.guard(f))(x))).any()
    reported = [u for u in explain(f, x).unguarded if "where-made zero" in u.reason]
    assert [u.op for u in reported] == ["mul"]


@pytest.mark.parametrize(
    "f",
    [
        lambda x: jnp.sum(jnp.where(x > 0, x, 0.0) * jax.nn.sigmoid(_W * x)),
        lambda x: jnp.sum(jax.nn.relu(x) * jnp.tanh(x)),
        lambda x: jnp.sum(jnp.where(x > 0, 1.0, 0.0) * jax.nn.softplus(x)),
        lambda x: jnp.sum(jnp.where(x > 0, 1.0, 0.0) * (x - 1.0) ** 2),
        lambda x: jnp.sum(jax.nn.silu(x) * jnp.where(x > 0, 1.0, 0.0)),
        lambda x: jnp.sum(_squared(jnp.where(x > 0, jnp.sqrt(jnp.abs(x)), 0.0))),
    ],
    ids=[
        "gated relu",
        "relu times tanh",
        "mask times softplus",
        "mask times square",
        "swish",
        "a where-made value times itself",
    ],
)
def test_a_where_made_zero_times_a_bounded_factor_is_not_reported(f):
    """A factor whose derivative is bounded on finite inputs (a gate, a
    square, a custom_jvp activation) cannot make ``0 * inf``: no report.
    Nor can the where-made value itself (``h * h``: in the zeroed lanes its
    own derivative is the where's structural zero; a false report found by
    a user-style hunt in e3nn's norms).  The guarded gradient is finite."""
    x = jnp.array([0.0, -1.0, 0.5, 2.0], jnp.float32)
    assert not [u for u in explain(f, x).unguarded if "where-made zero" in u.reason]
    assert np.isfinite(np.asarray(jax.grad(hlo_guard.guard(f))(x))).all()


def _squared(h):
    return h * h


def test_dead_lanes_inside_a_loop_in_a_branch_follow_the_branch_to_its_operands():
    """A scan inside a ``cond`` branch: its operand is the branch's input,
    which the cond binds to the function's argument -- nothing to protect
    (followed through the branch's link to the cond's operands); a ``sqrt``
    before the cond keeps the report (and the NaN)."""

    def inner(v):
        return lax.scan(lambda c, _: (c, jnp.where(c > 0, jnp.sqrt(c), 0.0)), v, None, length=1)[1][
            0
        ]

    x = jnp.array([-1.0, 0.0, 1.0, 4.0], jnp.float32)
    f = lambda x: lax.cond(x[0] < 5.0, inner, lambda v: v, x).sum()  # noqa: E731
    assert not explain(f, x).unguarded
    np.testing.assert_allclose(jax.grad(hlo_guard.guard(f))(x), [0.0, 0.0, 0.5, 0.25])
    g = lambda x: lax.cond(x[0] < 5.0, inner, lambda v: v, jnp.sqrt(jnp.abs(x))).sum()  # noqa: E731
    assert np.isnan(np.asarray(jax.grad(hlo_guard.guard(g))(x))).any()
    assert [u.op for u in explain(g, x).unguarded] == ["scan"]
