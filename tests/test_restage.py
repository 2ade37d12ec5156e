"""What keeps the rewrite's trace cost down, checked for sameness: copying
re-evaluated equations into the jaxpr being traced (``compat.restage``), and
the per-dtype answer of ``is_inexact_aval`` (asked several times per equation).

The interpreter re-evaluates every equation of the user's jaxpr; inside a
jaxpr trace it copies an equation instead of binding it again (issue 17,
item 3: binding re-runs dispatch and the shape rule, which made the rewrite
cost more than tracing the user's function).  Oracle: the same guarded
program traced with copying switched off, i.e. every equation bound -- the
jaxpr, the source locations and the gradients must be the same.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from double_where import assert_like_double_where, modes
from jax import lax
from jax.extend import source_info_util

import hlo_guard
from hlo_guard.jax_frontend import compat
from hlo_guard.jax_frontend.binding import bind_eqn


def model(x, w):
    h = x @ w
    safe = jnp.where(h > 0, jnp.sqrt(h), 0.0)
    ratio = jnp.where(jnp.abs(x) > 0.5, 1.0 / x, 0.0).sum(axis=1, keepdims=True)
    y = jnp.maximum(safe, 0.1) * ratio + jnp.tanh(h) * 2
    return jnp.log1p(jnp.abs(y)).mean() + lax.cumsum(y, axis=1)[:, -1].sum()


ARGS = (
    jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(4, 3),
    jnp.linspace(-0.5, 0.7, 6, dtype=jnp.float32).reshape(3, 2),
)


def _without_restage(monkeypatch, fn):
    with monkeypatch.context() as m:
        m.setattr(compat, "_RESTAGE", None)
        return fn()


def _locations(jaxpr):
    return [source_info_util.summarize(e.source_info) for e in jaxpr.eqns]


def test_copying_is_active_on_the_installed_jax():
    # if JAX moved the internals, equations are silently bound again: slower
    assert compat.restage_available()


def test_copied_program_equals_the_bound_one(monkeypatch):
    # the interpreter's copying (surgery, which stages no equation one by
    # one, has tests of its own: test_surgery.py)
    monkeypatch.setattr(hlo_guard.api, "evaluate_by_surgery", lambda *a, **k: None)
    copied = jax.make_jaxpr(hlo_guard.guard(model))(*ARGS)
    bound = _without_restage(monkeypatch, lambda: jax.make_jaxpr(hlo_guard.guard(model))(*ARGS))
    assert str(copied) == str(bound)
    assert _locations(copied.jaxpr) == _locations(bound.jaxpr)
    # the user's own lines survive copying (not the interpreter's)
    assert any("test_restage.py" in loc for loc in _locations(copied.jaxpr))


def test_copied_gradients_equal_the_bound_ones_and_the_double_where(monkeypatch):
    def double_where(x, w):
        h = x @ w
        pos = h > 0
        safe = jnp.where(pos, jnp.sqrt(jnp.where(pos, h, 1.0)), 0.0)
        big = jnp.abs(x) > 0.5
        ratio = jnp.where(big, 1.0 / jnp.where(big, x, 1.0), 0.0).sum(axis=1, keepdims=True)
        y = jnp.maximum(safe, 0.1) * ratio + jnp.tanh(h) * 2
        return jnp.log1p(jnp.abs(y)).mean() + lax.cumsum(y, axis=1)[:, -1].sum()

    x, w = ARGS
    x = x.at[0, 0].set(0.0)  # a dead lane at 1/x's pole
    g = jax.grad(hlo_guard.guarded_jit(model), argnums=(0, 1))(x, w)
    g_bound = _without_restage(
        monkeypatch, lambda: jax.grad(hlo_guard.guarded_jit(model), argnums=(0, 1))(x, w)
    )
    g_dw = jax.grad(double_where, argnums=(0, 1))(x, w)
    for a, b, c in zip(g, g_bound, g_dw):
        assert np.all(np.isfinite(a))
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=1e-6, atol=1e-6)


def _one_eqn(fn, *args):
    (eqn,) = jax.make_jaxpr(fn)(*args).jaxpr.eqns
    return eqn


def test_copies_only_where_binding_would_give_the_same_equation():
    add = _one_eqn(lambda a, b: a + b, jnp.ones(3), jnp.ones(3))
    seen = {}

    def traced(a, b):
        seen["same types"] = compat.restage(add, [a, b])
        # an operand of another type (weak, other dtype): binding re-derives
        # the output type, so copying would be wrong
        seen["other dtype"] = compat.restage(add, [a.astype(jnp.float16), b.astype(jnp.float16)])
        with jax.ensure_compile_time_eval():
            seen["eager"] = compat.restage(add, [np.ones(3, np.float32)] * 2)
        return a

    jax.make_jaxpr(traced)(jnp.ones(3), jnp.ones(3))
    assert seen["same types"] is not None and len(seen["same types"]) == 1
    assert seen["other dtype"] is None
    assert seen["eager"] is None
    # outside any jaxpr trace (eager evaluation, or under a JVP) it binds
    assert compat.restage(add, [jnp.ones(3), jnp.ones(3)]) is None
    out = jax.jvp(lambda a: bind_eqn(add, [a, a])[0], (jnp.ones(3),), (jnp.ones(3),))
    np.testing.assert_array_equal(out[1], 2 * np.ones(3))


def test_effects_and_calls_with_a_staging_rule_of_their_own_are_bound_not_copied():
    iota = _one_eqn(lambda: lax.iota(jnp.float32, 3))  # has a staging rule of its own
    printing = _one_eqn(lambda a: (jax.debug.print("{}", a), a)[1], jnp.ones(3))
    assert printing.effects
    seen = {}

    def traced(a):
        seen["own rule"] = compat.restage(iota, [])
        seen["effect"] = compat.restage(printing, [a])
        return a

    jax.make_jaxpr(traced)(jnp.ones(3))
    assert seen == {"own rule": None, "effect": None}


def _kept_call(fn, *args):
    """The one call equation ``fn`` stages with its inline jits kept as calls,
    as the guard's own trace of a user's function keeps them."""

    def kept(*a):
        with compat.keep_inline_jits_of_current_trace():
            return fn(*a)

    return _one_eqn(kept, *args)


def test_a_jit_kept_as_a_call_is_copied_as_binding_stages_it(monkeypatch):
    """A ``jit`` JAX's staging rule keeps as a call (no inlining while
    tracing, no ``Ref`` constants) is staged by copying, and the program is
    the one binding gives (oracle: binding with copying switched off)."""
    call = _one_eqn(jax.jit(lambda a: a * 2), jnp.ones(3))
    assert call.primitive.name in ("jit", "pjit")
    seen = {}

    def traced(a):
        seen["copied"] = compat.restage(call, [a])
        return bind_eqn(call, [a])[0] + 1.0

    copied = jax.make_jaxpr(traced)(jnp.ones(3))
    assert seen["copied"] is not None
    bound = _without_restage(monkeypatch, lambda: jax.make_jaxpr(traced)(jnp.ones(3)))
    assert str(copied) == str(bound)
    assert _locations(copied.jaxpr) == _locations(bound.jaxpr)


def test_a_jit_jax_inlines_is_inlined_in_place_as_binding_inlines_it(monkeypatch):
    """``jnp.multiply`` is a ``jit`` JAX inlines while tracing (kept as a call
    in the guard's own trace).  Staged again outside that trace, it is not
    copied as a call; its body is inlined in place -- the program binding
    gives, with the call's location -- and inside a trace that keeps its
    inline jits it is left to ``bind``."""
    call = _kept_call(lambda a: jnp.multiply(a, 3.0), jnp.ones(3))
    assert compat.jit_inlined_while_tracing(call.params)
    seen = {}

    def traced(a):
        seen["copied"] = compat.restage(call, [a, 3.0])
        seen["inlined"] = compat.inline_in_place(call, [a, 3.0], call.source_info)
        with compat.keep_inline_jits_of_current_trace():
            seen["kept"] = compat.inline_in_place(call, [a, 3.0], call.source_info)
        return a

    jax.make_jaxpr(traced)(jnp.ones(3))
    assert seen["copied"] is None and seen["kept"] is None
    assert seen["inlined"] is not None

    from hlo_guard.jax_frontend.binding import copy_unchanged

    in_place = jax.make_jaxpr(lambda a: copy_unchanged(call, [a, 3.0])[0] - a)(jnp.ones(3))
    assert [e.primitive.name for e in in_place.jaxpr.eqns] == ["mul", "sub"]
    bound = _without_restage(
        monkeypatch, lambda: jax.make_jaxpr(lambda a: bind_eqn(call, [a, 3.0])[0] - a)(jnp.ones(3))
    )
    assert str(in_place) == str(bound)
    assert _locations(in_place.jaxpr)[0] == source_info_util.summarize(call.source_info)


@pytest.mark.parametrize("weak", [True, False])
def test_literal_operands_are_copied_as_literals(weak):
    x = 2.0 if weak else jnp.float32(2.0)
    scale = _one_eqn(lambda a: a * 3.0, x)
    got = jax.make_jaxpr(lambda a: compat.restage(scale, [a, 3.0])[0])(x)
    (eqn,) = got.jaxpr.eqns
    assert eqn.primitive.name == "mul"
    assert str(eqn.invars[1]) == str(scale.invars[1])


def test_inexact_dtype_answers_are_stable_when_cached():
    """The pass asks ``is_inexact_aval`` several times per equation and keeps the
    answer per dtype; a cached answer must be the first one, for every kind of
    dtype the front end meets (bfloat16 and float8 are JAX's, float0 is a
    tangent's, a PRNG key's dtype is an extended one)."""
    from hlo_guard.jax_frontend.graph import is_inexact_aval

    key = jax.random.key(0)
    cases = {
        jnp.float32: True,
        jnp.bfloat16: True,
        jnp.float8_e4m3fn: True,
        jnp.complex64: True,
        jnp.int32: False,
        jnp.bool_: False,
    }
    for _ in range(2):  # the second round answers from the cache
        for dtype, want in cases.items():
            assert is_inexact_aval(jax.core.ShapedArray((2,), jnp.dtype(dtype))) is want
        assert is_inexact_aval(jax.typeof(key)) is False
        assert is_inexact_aval(jax.core.ShapedArray((), jax.dtypes.float0)) is False
        assert is_inexact_aval(object()) is False


def test_a_high_level_primitive_is_bound_not_copied():
    """A primitive that says it is high-level marks the jaxpr it is staged into
    (``bind`` sets the trace's flag); copying would skip that, so it binds."""
    from jax.extend.core import Primitive

    high = Primitive("hlo_guard_test_high")
    high.def_abstract_eval(lambda a: a)
    high.is_high = lambda *avals, **params: True
    try:
        eqn = _one_eqn(high.bind, jnp.ones(3))
    except Exception as exc:  # a JAX that cannot stage it at all: nothing to copy
        pytest.skip(f"this JAX does not stage a high-level test primitive: {exc}")
    seen = {}

    def traced(a):
        seen["high"] = compat.restage(eqn, [a])
        return a

    jax.make_jaxpr(traced)(jnp.ones(3))
    assert seen == {"high": None}


# -- the guard's own equations, and inline calls evaluated in place -----------


@functools.partial(jax.jit, inline=True)
def inline_root(h):
    # a forward-mode exit (max) after a masked log: the body itself is rewritten
    return jnp.maximum(jnp.log(jnp.where(h > 0, h, 0.0)), -1.0)


def with_inline_call(x, w):
    return inline_root(x @ w).sum() + jnp.tanh(x).sum()


def test_guard_equations_are_emitted_as_equations_not_bound():
    """The guard's ``stop_gradient``/``select_n`` are emitted directly inside a
    jaxpr trace; outside one (a JVP over it, eager) ``emit`` declines."""
    from hlo_guard.jax_frontend.guard_ops import guarded

    seen = {}

    def traced(a):
        seen["emit"] = compat.emit(lax.select_n_p, {}, [a > 0, a, a], [a.aval])
        return guarded(a > 0, a)

    got = jax.make_jaxpr(traced)(jnp.ones(3))
    assert seen["emit"] is not None
    assert [e.primitive.name for e in got.jaxpr.eqns][-2:] == ["stop_gradient", "select_n"]
    assert compat.emit(lax.select_n_p, {}, [jnp.ones(3) > 0] * 3, [None]) is None
    # under a JVP the guard is bound: its tangent is zero in the unmasked lanes
    mask = jnp.array([True, False, True])
    _, t = jax.jvp(lambda a: guarded(mask, a), (jnp.ones(3),), (jnp.ones(3),))
    np.testing.assert_array_equal(t, [1.0, 0.0, 1.0])


def test_an_inline_calls_rewritten_body_is_evaluated_in_place(monkeypatch):
    """Where JAX inlines a ``jit(inline=True)`` while tracing (jax 0.10; on
    0.11+ ``inline=True`` is inlined only when lowering and stays a call in
    the jaxpr), the rewrite calls the guarded body in place rather than
    tracing it to a jaxpr of its own first; the program, and every
    equation's location (the call's, as JAX's inlining gives), are those of
    binding it.  A program staged under ``jax.jit`` is traced with such
    calls inlined already; the eager program keeps them, and is what the
    inspection tools evaluate inside ``make_jaxpr``."""
    from hlo_guard.api import evaluating_the_inspected_program
    from hlo_guard.jax_frontend import interpreter, staged_bodies

    made = []
    real = interpreter._guarded_callable

    def spy(scope, node, eqn, n, context):
        fn = real(scope, node, eqn, n, context)
        made.append((eqn.params.get("name"), fn))
        return fn

    monkeypatch.setattr(interpreter, "_guarded_callable", spy)
    # every call makes its guarded body here (none is staged from an earlier test)
    monkeypatch.setattr(staged_bodies, "enabled", False)
    args = (ARGS[0], ARGS[1][:, :1])

    def eager_program_traced():
        with evaluating_the_inspected_program():
            return jax.make_jaxpr(hlo_guard.guard(with_inline_call))(*args)

    in_place = eager_program_traced()
    root = [fn for name, fn in made if name == "inline_root"]
    assert len(root) == 1  # the body is rewritten
    bound = _without_restage(monkeypatch, eager_program_traced)
    assert str(in_place) == str(bound)
    assert _locations(in_place.jaxpr) == _locations(bound.jaxpr)
    # in place exactly where JAX itself inlines the call (oracle: plain tracing)
    jax_inlines = "name=inline_root" not in str(jax.make_jaxpr(with_inline_call)(*args))
    assert ("name=inline_root" not in str(in_place)) == jax_inlines
    assert (not hasattr(root[0], "lower")) == jax_inlines  # a plain function, not a jax.jit
    seen = {}

    def probe(a):
        seen["here"] = compat.inline_jits_inline_here()
        with compat.keep_inline_jits_of_current_trace():  # our own user trace
            seen["kept"] = compat.inline_jits_inline_here()
        return a

    jax.make_jaxpr(probe)(1.0)
    assert seen == {"here": True, "kept": False}
    assert not compat.inline_jits_inline_here()  # eager: each jit runs compiled


def test_an_inline_call_evaluated_in_place_keeps_the_double_where_gradient():
    x, w = ARGS[0], ARGS[1][:, :1]

    def double_where(x, w):
        h = x @ w
        pos = h > 0
        inner = jnp.where(pos, jnp.log(jnp.where(pos, h, 1.0)), -jnp.inf)
        return jnp.maximum(inner, -1.0).sum() + jnp.tanh(x).sum()

    x = x.at[0].set(0.0)  # h = 0 in row 0: log's pole on a dead lane
    got = jax.grad(hlo_guard.guarded_jit(with_inline_call), argnums=(0, 1))(x, w)
    want = jax.grad(double_where, argnums=(0, 1))(x, w)
    for a, b in zip(got, want):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    # forward mode: the max in the body is the exit its guard is for
    for d in modes("jacfwd", "hessian").values():
        assert_like_double_where(
            d, lambda x: with_inline_call(x, w), lambda x: double_where(x, w), x
        )


def _kept_calls(g):
    """The ``jit`` calls in the programs ``g`` traced, per trace."""
    return [
        sorted(
            str(e.params.get("name"))
            for e in program.closed_jaxpr.jaxpr.eqns
            if e.primitive.name in ("jit", "pjit")
        )
        for program in g._cache.values()
    ]


def test_a_program_staged_into_a_jaxpr_inlines_jnp_wrappers_an_eager_one_keeps_them():
    """Under ``jax.jit`` (and ``jax.jit(jax.grad(...))``) the guarded program
    is compiled whole: its trace inlines ``jnp``'s inline jits as JAX's own
    does, and its small plain ones (``jnp.where``'s ``_where``) as XLA does.
    Evaluated eagerly (and under an eager ``jax.grad``) they stay calls,
    each run as one computation, as eager JAX runs it: the same bits."""

    def f(x):
        return jnp.where(x > 0, jnp.sqrt(x), 0.0).sum() + jnp.mean(x)

    x = jnp.array([-1.0, 0.0, 0.5, 2.0])
    staged = hlo_guard.guard(f)
    jax.jit(staged)(x)
    jax.jit(jax.grad(staged))(x)
    # one program, with the calls JAX's own trace keeps but for the small ones
    # (oracle: plain tracing)
    plain = [e for e in jax.make_jaxpr(f)(x).jaxpr.eqns if e.primitive.name in ("jit", "pjit")]
    assert "_where" in [str(e.params.get("name")) for e in plain]
    large = [e for e in plain if len(e.params["jaxpr"].jaxpr.eqns) > compat.SMALL_CALL_EQUATIONS]
    assert _kept_calls(staged) == [sorted(str(e.params.get("name")) for e in large)]

    eager = hlo_guard.guard(f)
    value = eager(x)
    grad = jax.grad(eager)(x)
    (calls,) = _kept_calls(eager)
    assert "sqrt" in calls and "_where" in calls
    # eager results bitwise those of plain eager JAX
    np.testing.assert_array_equal(np.asarray(value), np.asarray(f(x)))
    plain_grad = jax.grad(
        lambda x: jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0).sum() + jnp.mean(x)
    )(x)
    np.testing.assert_array_equal(np.asarray(grad), np.asarray(plain_grad))
    # and the staged gradient is the same numbers
    np.testing.assert_allclose(
        np.asarray(jax.jit(jax.grad(staged))(x)), np.asarray(plain_grad), rtol=1e-6
    )
