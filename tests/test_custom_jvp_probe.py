"""The forward-mode probe of a ``custom_jvp`` rule evaluates the rule's jaxpr.

Which tangent lanes a lane-wise ``custom_jvp`` call leaves structurally zero
only its rule can tell, so the guard probes it: a NaN tangent in the live
lanes, and an output lane is live iff the NaN arrives.  The probe used to be
JAX's JVP of the call; it now evaluates the rule's jaxpr, the thunk JAX's own
JVP of the equation calls (``custom_derivatives.lift_jvp``), directly.  That
skips the JVP machinery around the rule, which cost as much again as tracing
the rule: Equinox vmaps its activation, so every ``relu`` in an MLP is a fresh
call whose rule is traced in every trace (issue 17, item 5: trace cost grew
with depth).

Oracles: the hand-written double where in every derivative mode, JAX's JVP
of the call (the probe taking that way, forced), and per-lane derivatives.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from double_where import DERIVATIVES, assert_like_double_where

import hlo_guard
from hlo_guard.jax_frontend import binding, compat
from hlo_guard.jax_frontend.rules import calls

X = jnp.asarray([-1.0, 0.0, 0.25, 0.5, 2.0], dtype=jnp.float32)
MODES = sorted(DERIVATIVES)


@jax.custom_jvp
def _scaled_relu(x, s):
    """A two-operand lane-wise rule with ``symbolic_zeros``: JAX hands it a
    ``SymbolicZero`` for the operand not being differentiated, so the rule's
    jaxpr differs by which tangents are zero.  Both tangents are *selected*
    away where ``x <= 0`` (multiplying ``ts`` by the numerically zero
    ``max(x, 0)`` instead would be a numeric zero, which the guard keeps
    live by design: ``0 * inf`` there is NaN in JAX and under the guard)."""
    return jnp.where(x > 0, x * s, 0.0)


def _scaled_relu_jvp(primals, tangents):
    x, s = primals
    tx, ts = tangents
    out = _scaled_relu(x, s)
    t = jnp.zeros_like(out)
    if not isinstance(tx, jax.custom_derivatives.SymbolicZero):
        t = t + tx * s
    if not isinstance(ts, jax.custom_derivatives.SymbolicZero):
        t = t + x * ts
    return out, jnp.where(x > 0, t, 0.0)


_scaled_relu.defjvp(_scaled_relu_jvp, symbolic_zeros=True)


@jax.custom_jvp
def _power_relu(x, n):
    """A rule with an integer operand (its zero tangent is ``float0``): the
    probe takes JAX's JVP of the call there."""
    return jnp.maximum(x, 0.0) ** n


@_power_relu.defjvp
def _power_relu_jvp(primals, tangents):
    x, n = primals
    tx, _ = tangents
    return _power_relu(x, n), jnp.where(x > 0, n * jnp.maximum(x, 0.0) ** (n - 1) * tx, 0.0)


#: function, its double where: each a lane-wise ``custom_jvp`` whose rule
#: selects zeros (``relu``, the two above) or whose coefficient is infinite
#: in dead lanes (``entr``), feeding a ``sqrt`` whose derivative is infinite
#: at the zeros
CASES = {
    "relu": (
        lambda x: jnp.sum(jnp.sqrt(jax.nn.relu(x)) * x),
        lambda x: jnp.sum(jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0) * x),
    ),
    "symbolic_zeros": (
        lambda x: jnp.sum(jnp.sqrt(_scaled_relu(x, x + 3.0)) * x),
        lambda x: jnp.sum(
            jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0) * (x + 3.0)), 0.0) * x
        ),
    ),
    "integer_operand": (
        lambda x: jnp.sum(jnp.sqrt(_power_relu(x, 3)) * x),
        lambda x: jnp.sum(jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0) ** 3), 0.0) * x),
    ),
    "entr": (
        lambda x: jnp.sum(jax.scipy.special.entr(jnp.where(x > 0, x, 0.0)) * x),
        lambda x: jnp.sum(
            jnp.where(x > 0, jax.scipy.special.entr(jnp.where(x > 0, x, 1.0)), 0.0) * x
        ),
    ),
}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_probed_rules_give_the_double_where(case, mode):
    f, oracle = CASES[case]
    assert np.isnan(np.asarray(jax.jacfwd(f)(X))).any()  # the bug is there
    assert_like_double_where(DERIVATIVES[mode], f, oracle, X)


def _jvp_taken(monkeypatch) -> list:
    """Record each time the probe falls back to JAX's JVP of the call."""
    taken: list = []
    real = binding.jvp_in

    def spy(*args, **kwargs):
        taken.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(binding, "jvp_in", spy)
    return taken


@pytest.mark.parametrize("case", ["relu", "symbolic_zeros", "entr"])
def test_the_rule_jaxpr_is_evaluated_not_jvp_of_the_call(case, monkeypatch):
    """The probe reads the rule's jaxpr from the equation and evaluates it,
    and JAX's JVP of the call is not taken -- under ``jax.jit`` (surgery or
    the interpreter, whichever the installed JAX uses) and eagerly."""
    f, _ = CASES[case]
    asked: list = []
    real = compat.custom_jvp_rule_jaxpr
    monkeypatch.setattr(compat, "custom_jvp_rule_jaxpr", lambda *a: asked.append(1) or real(*a))
    taken = _jvp_taken(monkeypatch)
    jax.clear_caches()
    jax.jit(jax.jacfwd(hlo_guard.guard(lambda x: f(x))))(X)
    jax.jacfwd(hlo_guard.guard(lambda x: f(x)))(X)
    assert asked
    assert not taken


def test_an_integer_operand_takes_the_jvp_of_the_call(monkeypatch):
    taken = _jvp_taken(monkeypatch)
    f, _ = CASES["integer_operand"]
    jax.clear_caches()
    jax.jit(jax.jacfwd(hlo_guard.guard(lambda x: f(x))))(X)
    assert taken


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["relu", "symbolic_zeros", "entr"])
def test_the_rule_jaxpr_gives_what_the_jvp_of_the_call_gives(case, mode, monkeypatch):
    """Same derivatives, bit for bit, as the probe that takes JAX's JVP of
    the call (forced by refusing the rule's jaxpr)."""
    f, _ = CASES[case]
    d = DERIVATIVES[mode]
    jax.clear_caches()  # no guarded body shared from an earlier test
    direct = np.asarray(jax.jit(d(hlo_guard.guard(lambda x: f(x))))(X))
    monkeypatch.setattr(calls, "_rule_tangents", lambda *a: None)
    jax.clear_caches()
    via_jvp = np.asarray(jax.jit(d(hlo_guard.guard(lambda x: f(x))))(X))
    np.testing.assert_array_equal(direct, via_jvp)


def test_a_genuine_forward_nan_through_a_probed_rule_stays():
    """``softplus(log(x))`` at 0: ``log``'s infinite tangent times the rule's
    ``exp(-inf) = 0`` is a genuine NaN (no selection anywhere); the probe
    must see dependence there, so no output guard hides it."""
    f = lambda x: jax.nn.softplus(jnp.log(x))
    x = jnp.asarray([0.0, 1.0, 2.0], jnp.float32)
    ones = jnp.ones_like(x)
    plain = np.asarray(jax.jvp(f, (x,), (ones,))[1])
    for g in (hlo_guard.guard(f), jax.jit(hlo_guard.guard(f))):
        got = np.asarray(jax.jvp(g, (x,), (ones,))[1])
        assert np.isnan(got[0])
        np.testing.assert_array_equal(got, plain)


def test_a_vmapped_relu_per_lane():
    """Equinox's way: ``relu`` under ``vmap`` (the rule batched), then a
    singular op; the forward derivative against a per-lane ``if``."""
    f = lambda x: jnp.sqrt(jax.vmap(jax.nn.relu)(x))
    got = np.asarray(jax.jit(jax.jacfwd(hlo_guard.guard(f)))(X))
    want = np.diag([0.5 / np.sqrt(v) if v > 0 else 0.0 for v in np.asarray(X, np.float64)])
    assert np.isnan(np.asarray(jax.jacfwd(f)(X))).any()
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6)


def _relu_output_guards(f, *args) -> list:
    """The forward-mode output guards ``explain`` lists on ``relu`` calls."""
    report = hlo_guard.explain(f, *args)
    return [s for s in report.guards if s.op == "custom_jvp_call" and s.mode == "forward"]


_W = jnp.asarray([[1.0, -2.0], [0.5, 1.5], [-1.0, 0.25]], jnp.float32)


def _mlp(x):
    h = jax.nn.relu(x @ _W)
    return jnp.sum(jnp.sqrt(jax.nn.relu(h @ _W.T)))


def _mlp_double_where(x):
    h = jax.nn.relu(x @ _W)
    z = h @ _W.T
    pos = z > 0
    return jnp.sum(jnp.where(pos, jnp.sqrt(jnp.where(pos, z, 1.0)), 0.0))


def test_relu_gets_no_output_guard():
    """``relu``'s rule only selects its tangent against zero
    (``calls.rule_preserves_zero``): a zero tangent entering it stays an
    exact zero, so no relu gets an output guard -- neither the first layer's
    (its operand's tangent live) nor a later one's (zero where every relu
    before it is off).  The ``sqrt`` after it keeps its guard."""
    x = jnp.asarray([0.5, -1.0, 2.0], jnp.float32)
    assert _relu_output_guards(_mlp, x) == []
    assert _relu_output_guards(CASES["relu"][0], X) == []
    assert any(s.op == "sqrt" for s in hlo_guard.explain(CASES["relu"][0], X).guards)
    for mode in ("jacfwd", "grad", "hessian", "jacfwd_jacfwd"):
        assert_like_double_where(DERIVATIVES[mode], _mlp, _mlp_double_where, x)


def test_a_rule_that_multiplies_keeps_its_output_guard():
    """Where the operand's tangent is partly structurally zero, a rule that
    multiplies it by a primal (``entr``'s ``t * (log(x) + 1)``, inf at 0)
    keeps its guard; relu there does not need one."""
    f = lambda x: jnp.sum(jnp.sqrt(jax.nn.relu(jnp.where(x > 0.3, x, 0.0))) * x)
    assert _relu_output_guards(f, X) == []
    g = lambda x: jnp.sum(jax.scipy.special.entr(jnp.where(x > 0, x, 0.0)) * x)
    report = hlo_guard.explain(g, X)
    assert [s for s in report.guards if s.mode == "forward"]


def _call_eqn(fn, *args):
    """The outermost ``custom_jvp_call`` of ``fn``'s jaxpr (through the
    ``jit`` wrappers around it)."""
    queue = [jax.make_jaxpr(fn)(*args).jaxpr]
    while queue:
        for e in queue.pop(0).eqns:
            if e.primitive.name == "custom_jvp_call":
                return e
            for p in e.params.values():
                inner = getattr(p, "jaxpr", p)
                if hasattr(inner, "eqns"):
                    queue.append(inner)
    raise AssertionError("no custom_jvp_call")


def _user_rule(tangent_of):
    @jax.custom_jvp
    def f(x):
        return jnp.maximum(x, 0.0)

    @f.defjvp
    def _(primals, tangents):
        (x,), (t,) = primals, tangents
        return f(x), tangent_of(x, t)

    return f


RULES = {
    "relu": (jax.nn.relu, True),
    "entr": (jax.scipy.special.entr, False),
    "softplus": (jax.nn.softplus, False),
    "scaled_by_a_literal": (_user_rule(lambda x, t: jnp.where(x > 0, 2.0 * t, 0.0)), True),
    "summed_and_moved": (_user_rule(lambda x, t: -(t + jnp.where(x > 0, t, 0.0))), True),
    "multiplied_by_the_primal": (_user_rule(lambda x, t: t * x), False),
    "a_primal_in_a_case": (_user_rule(lambda x, t: jnp.where(x > 0, t, x)), False),
    "divided_by_zero": (_user_rule(lambda x, t: t / 0.0), False),
}


@pytest.mark.parametrize("case", sorted(RULES))
def test_which_rules_preserve_zero(case):
    fn, expected = RULES[case]
    assert calls.rule_preserves_zero(_call_eqn(fn, X)) is expected


def test_relu_after_a_where_needs_no_reverse_guard():
    """``where(keep, relu(x), 0)`` (Dropout before a residual, Flax's way):
    relu's transpose selects the zero cotangent, so nothing is guarded and
    the gradient is plain JAX's, bitwise."""
    keep = X > 0.3
    f = lambda x: jnp.sum(jnp.where(keep, jax.nn.relu(x), 0.0) * x)
    assert hlo_guard.explain(f, X).guards == []
    np.testing.assert_array_equal(
        np.asarray(jax.grad(hlo_guard.guard(f))(X)), np.asarray(jax.grad(f)(X))
    )
