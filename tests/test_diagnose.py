"""``diagnose``: every non-finite lane of a plain derivative classified as
leak, genuine or input, with the operations named -- against oracles that
do not use hlo_guard (the hand-written double where, per-lane math)."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlo_guard import diagnose
from hlo_guard.cli.main import main as cli_main
from hlo_guard.errors import GuardUsageError

THIS = os.path.basename(__file__)


def line_of(snippet: str) -> int:
    with open(__file__) as fh:
        hits = [i for i, line in enumerate(fh, 1) if line.rstrip().endswith(snippet)]
    assert len(hits) == 1, (snippet, hits)
    return hits[0]


def at_line(location: str, snippet: str) -> bool:
    path, line = location.split(":")[:2]
    return os.path.basename(path) == THIS and int(line) == line_of(snippet)


def lanes_of(report, kind):
    return sorted(int(i[0]) for g in report.groups if g.kind == kind for i in g.indices)


def causes_of(report, kind):
    return [c for g in report.groups if g.kind == kind for c in g.causes]


# -- a function with a leak and a genuine singularity -------------------------------------


def model(x):
    root = jnp.where(x > 0, jnp.sqrt(x), 0.0)  # L-where
    edge = jnp.sqrt(x + 2.0)  # L-edge
    return jnp.sum(root + edge)


def model_double_where(x):
    root = jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0)
    return jnp.sum(root + jnp.sqrt(x + 2.0))


X = jnp.array([-2.0, -1.0, 0.0, 0.5, 4.0])


def test_leak_and_genuine_lanes_match_the_double_where_oracle():
    plain = np.asarray(jax.grad(model)(X))
    hand = np.asarray(jax.grad(model_double_where)(X))
    want_leak = np.flatnonzero(~np.isfinite(plain) & np.isfinite(hand)).tolist()
    want_genuine = np.flatnonzero(~np.isfinite(plain) & ~np.isfinite(hand)).tolist()
    assert want_leak == [1, 2] and want_genuine == [0]  # the oracle itself: x=-1, 0 leak; x=-2 real

    r = diagnose(model, X)
    assert lanes_of(r, "leak") == want_leak
    assert lanes_of(r, "genuine") == want_genuine
    assert r.count("input") == 0
    (leak,) = causes_of(r, "leak")
    assert leak["primitive"] == "sqrt" and at_line(leak["location"], "# L-where")
    ((sel_name, sel_loc),) = leak["selections"]
    assert sel_name == "where" and at_line(sel_loc, "# L-where")
    assert "sqrt(0.0)" in leak["examples"]
    (genuine,) = causes_of(r, "genuine")
    assert genuine["primitive"] == "sqrt" and at_line(genuine["location"], "# L-edge")
    assert genuine["examples"] == ["sqrt(0.0)"]  # x + 2 = 0 at x = -2


def test_summary_line_comes_first_and_json_round_trips():
    r = diagnose(model, X)
    text = str(r).splitlines()
    assert text[0].startswith("hlo_guard diagnose: model [jax, reverse mode]")
    assert text[1].strip().startswith("3 non-finite lane(s) in d/dx: 2 leak through where at ")
    assert "→ sqrt at" in text[1] and "1 genuine: sqrt(0.0) at" in text[1]
    d = json.loads(r.to_json())
    assert d["summary"] == r.summary() and d["finite"] is False
    assert [g["kind"] for g in d["groups"]] == ["leak", "genuine"]


def test_finite_gradient_is_one_line():
    r = diagnose(lambda x: jnp.sum(jnp.sin(x)), X)
    assert r.finite and not r.groups
    assert r.to_text().count("\n") == 1
    assert "finite in all 5 lane(s)" in r.summary()


def test_nan_already_in_the_input_is_named_by_argument():
    x = jnp.array([1.0, jnp.nan, 4.0])
    r = diagnose(lambda x: jnp.sum(jnp.sqrt(x)), x)
    assert lanes_of(r, "input") == [1] and r.count("leak") == r.count("genuine") == 0
    assert r.nonfinite_inputs == ["x"]


# -- nested calls, pytrees, jit ------------------------------------------------------------


@jax.jit
def inner(v):
    return jnp.where(v > 0, jnp.log(v), 0.0)  # L-inner


def outer(x):
    return jnp.sum(inner(x) * 2.0)


def test_jitted_and_nested_functions_name_the_innermost_user_line():
    x = jnp.array([0.0, 1.0, -3.0])  # log(-3) is NaN but its derivative -1/3 is finite
    want = np.flatnonzero(~np.isfinite(np.asarray(jax.grad(outer)(x)))).tolist()
    assert want == [0]
    for f in (outer, jax.jit(outer)):
        r = diagnose(f, x)
        assert lanes_of(r, "leak") == want
        (c,) = causes_of(r, "leak")
        assert c["primitive"] == "log" and at_line(c["location"], "# L-inner")


def test_pytree_arguments_and_argnums():
    def loss(params, x):
        h = x @ params["w"]
        return jnp.sum(jnp.where(h > 0, jnp.sqrt(h), 0.0)) + jnp.sum(params["b"])

    params = {"w": jnp.array([[1.0, -1.0], [0.0, 0.0]]), "b": jnp.ones(2)}
    x = jnp.array([1.0, 2.0])
    r = diagnose(loss, params, x, argnums=0)
    assert {g.derivative for g in r.groups} == {"d/dparams['w']"}
    assert all(g.kind == "leak" for g in r.groups)
    r2 = diagnose(loss, params, x, argnums=(0, 1))
    assert {g.derivative for g in r2.groups} >= {"d/dparams['w']", "d/dx"}


def test_forward_mode_leak_through_maximum():
    def floor_log(x):
        return jnp.maximum(jnp.log(x), -5.0)  # L-max

    x = jnp.array([0.0, 1.0, 2.0])
    _, plain = jax.jvp(floor_log, (x,), (jnp.ones(3),))
    assert np.isnan(plain[0])  # the oracle: JAX's own jvp
    r = diagnose(floor_log, x, mode="forward")
    assert lanes_of(r, "leak") == [0] and r.count("genuine") == 0
    (c,) = causes_of(r, "leak")
    assert c["primitive"] == "log" and c["selections"][0][0] == "maximum"
    assert c["examples"] == ["log(0.0)"]


# -- the seed situations -------------------------------------------------------------------


def test_arctan2_at_the_origin_leak_and_genuine():
    def angle(x, y):
        r2 = x * x + y * y
        return jnp.sum(jnp.where(r2 > 0, jnp.arctan2(y, x), 0.0))

    x = jnp.array([0.0, 1.0])
    y = jnp.array([0.0, 1.0])
    r = diagnose(angle, x, y, argnums=(0, 1))
    assert lanes_of(r, "leak") == [0, 0]  # lane 0 of d/dx and of d/dy
    assert {c["primitive"] for c in causes_of(r, "leak")} == {"atan2"}
    bare = diagnose(lambda x, y: jnp.sum(jnp.arctan2(y, x)), x, y, argnums=(0, 1))
    assert bare.count("genuine") == 2 and bare.count("leak") == 0  # taken: real math


@pytest.mark.parametrize("edge", [1.0, -1.0])
def test_arccos_at_plus_minus_one_is_genuine_and_clip_beyond_is_a_leak(edge):
    x = jnp.array([edge, 0.5 * edge, 3.0 * edge])
    r = diagnose(lambda x: jnp.sum(jnp.arccos(jnp.clip(x, -1.0, 1.0))), x)
    assert lanes_of(r, "genuine") == [0]
    assert lanes_of(r, "leak") == [2]  # clipped: the lane the clip discards
    assert causes_of(r, "genuine")[0]["examples"] == [f"acos({edge})"]
    (leak,) = causes_of(r, "leak")  # acos at the clipped value, discarded by the clip
    assert leak["primitive"] == "acos" and leak["examples"] == [f"acos({edge})"]


def test_indexing_leak():
    def first_two(x):
        return jnp.sum(jnp.sqrt(x)[:2])

    x = jnp.array([1.0, 4.0, 0.0])
    r = diagnose(first_two, x)
    assert lanes_of(r, "leak") == [2]
    (c,) = causes_of(r, "leak")
    assert c["selections"][0][0] == "slicing"


def test_two_disk_area_example():
    import importlib.util
    import sys

    path = os.path.join(os.path.dirname(__file__), "..", "examples", "disk_intersection.py")
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec = importlib.util.spec_from_file_location("disk_intersection", path)
        mod = importlib.util.module_from_spec(spec)
        import contextlib
        import io

        with contextlib.redirect_stdout(io.StringIO()):
            spec.loader.exec_module(mod)
    finally:
        sys.path.pop(0)
    r1, r2, d = mod.r1, mod.r2, mod.d
    plain = np.asarray(jax.grad(lambda d: jnp.sum(mod.area(r1, r2, d)))(d))
    hand = np.asarray(jax.grad(lambda d: jnp.sum(mod.area_oracle(r1, r2, d)))(d))
    r = diagnose(lambda d: jnp.sum(mod.area(r1, r2, d)), d)
    assert lanes_of(r, "leak") == np.flatnonzero(~np.isfinite(plain) & np.isfinite(hand)).tolist()
    assert lanes_of(r, "genuine") == np.flatnonzero(~np.isfinite(hand)).tolist()
    assert {c["primitive"] for c in causes_of(r, "leak")} <= {"acos", "sqrt", "div", "mul"}


def test_numpyro_gamma_outside_the_support_is_a_leak_in_numpyro():
    dist = pytest.importorskip("numpyro.distributions")

    def logp(c):
        return dist.Gamma(c, 1.0).log_prob(jnp.float32(0.0))

    assert np.isnan(jax.grad(logp)(jnp.float32(1.5)))
    r = diagnose(logp, jnp.float32(1.5))
    assert r.count("leak") == 1 and r.count("genuine") == 0
    (c,) = causes_of(r, "leak")
    assert "numpyro" in c["location"] and c["selections"][0][0] == "where"


def test_an_operation_without_a_rule_is_named():
    from jax.extend.core import Primitive
    from jax.interpreters import ad, mlir

    inv = Primitive("test_reciprocal_without_rule")
    inv.def_impl(lambda x: 1.0 / x)
    inv.def_abstract_eval(lambda x: x)
    mlir.register_lowering(inv, mlir.lower_fun(lambda x: 1.0 / x, multiple_results=False))
    ad.defjvp(inv, lambda g, x: -g / (x * x))

    def f(x):
        return jnp.sum(jnp.where(x != 0, inv.bind(x), 0.0))

    r = diagnose(f, jnp.array([0.0, 2.0]))
    assert r.unknown_primitives == ["test_reciprocal_without_rule"]
    assert "no hlo_guard rule for: test_reciprocal_without_rule" in str(r)


# -- bad input and the CLI -----------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: diagnose(3, X), "callable"),
        (lambda: diagnose(model, X, mode="sideways"), "mode"),
        (lambda: diagnose(model, X, argnums=2), "out of range"),
        (lambda: diagnose(model, X, argnums="0"), "argnums"),
        (lambda: diagnose(lambda n: jnp.sqrt(n), jnp.arange(3)), "dtype"),
    ],
)
def test_bad_input_is_a_clear_error(call, message):
    with pytest.raises(GuardUsageError, match=message):
        call()


def test_cli_diagnose(capsys):
    target = os.path.join(os.path.dirname(__file__), "..", "examples", "explain_demo.py") + ":loss"
    assert cli_main(["diagnose", target, "[-1,0,1,4]", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["function"] == "loss" and {g["kind"] for g in d["groups"]} == {"leak"}
    assert cli_main(["diagnose", target, "[-1,0,1,4]", "--strict"]) == 3
    out = capsys.readouterr().out
    assert out.splitlines()[1].strip().startswith("2 non-finite lane(s) in d/dx: 2 leak")
    assert cli_main(["diagnose", target, "[1,2]", "--strict"]) == 0


# -- control flow: the innermost user line, each body run on its own values ---------------


def test_scan_body_is_followed_to_its_line():
    from jax import lax

    def f(x):
        def body(c, xi):
            return c + xi, jnp.where(xi > 0, jnp.sqrt(xi), 0.0)  # L-scan-body

        return jnp.sum(lax.scan(body, 0.0, x)[1])

    x = jnp.array([0.0, 1.0, 4.0])
    assert np.isnan(jax.grad(f)(x)[0])  # the oracle: plain JAX leaks at x = 0
    r = diagnose(f, x)
    assert lanes_of(r, "leak") == [0]
    (c,) = causes_of(r, "leak")
    assert c["primitive"] == "sqrt" and at_line(c["location"], "# L-scan-body")
    assert c["examples"] == ["sqrt(0.0)"]


def test_cond_taken_branch_is_followed_to_its_line():
    from jax import lax

    def f(x):
        return lax.cond(
            jnp.sum(x) > 0,
            lambda v: jnp.sum(jnp.where(v > 0, jnp.log(v), 0.0)),  # L-cond-branch
            lambda v: 0.0,
            x,
        )

    x = jnp.array([0.0, 1.0, 4.0])
    r = diagnose(f, x)
    assert lanes_of(r, "leak") == [0]
    (c,) = causes_of(r, "leak")
    assert c["primitive"] == "log" and at_line(c["location"], "# L-cond-branch")


def test_one_body_called_twice_is_read_with_each_call_s_values():
    """Two calls of ``jnp.sqrt`` at one shape: primal values are kept per call
    path, so each call names its own singular inputs (x and x + 1)."""

    def f(x):
        return jnp.sum(jnp.sqrt(x) + jnp.sqrt(x + 1.0))  # L-twice

    r = diagnose(f, jnp.array([-1.0, 0.0, 1.0]))
    examples = sorted(e for c in causes_of(r, "genuine") for e in c["examples"])
    assert examples == ["sqrt(-1.0)", "sqrt(0.0)", "sqrt(0.0)"]
