"""One test per rule of ``hlo_guard/jax_frontend/rules``.

Each test builds a tiny function whose plain JAX gradient leaks NaN through
exactly one primitive (asserted, so the test is about something) and checks the
guarded gradient against a hand-written double-where oracle (or a per-lane
Python ``if``).  Where it says something the gradient cannot, the static
analysis is checked directly: the :class:`passes.Level` of a value, and the
guard sites :func:`passes.planning.plan_guards` finds.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src import core as jax_core
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

from hlo_guard import guard, guarded_jit
from hlo_guard.jax_frontend.compat import jit_inlines
from hlo_guard.jax_frontend.surgery import spliced_program
from passes.lattice import Level
from passes.planning import plan_guards

# -- helpers ---------------------------------------------------------------------


def _finite(tree):
    return all(np.all(np.isfinite(l)) for l in jax.tree_util.tree_leaves(tree))


def _sum(f):
    return lambda *a: jnp.sum(f(*a))


def check(f, oracle, *args, argnums=0, leaks=True, rtol=1e-6):
    """Guarded gradients (eager and jitted) equal the oracle's; plain JAX leaks."""
    plain = jax.grad(_sum(f), argnums=argnums)(*args)
    if leaks:
        assert not _finite(plain), f"plain JAX was expected to leak: {plain}"
    want = jax.grad(_sum(oracle), argnums=argnums)(*args)
    assert _finite(want), "oracle not finite: bad test design"
    for g in (guard(f), guarded_jit(f)):
        got = jax.grad(_sum(g), argnums=argnums)(*args)
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-7)
    # forward value unchanged
    np.testing.assert_array_equal(guard(f)(*args), f(*args))
    return want


def program(f, *args):
    return guard(f).traced(*args)[0]


def _top_level(analysis, jaxpr):
    """(analysis or None, node, eqn) of the top level, looking through jnp's
    inline jits (``jnp.sqrt`` is one), which the trace keeps as calls so that
    eager ``guard(f)`` runs them as eager ``f`` does."""
    for i, e in enumerate(jaxpr.eqns):
        if e.primitive.name == "jit" and jit_inlines(e.params):
            sub = analysis.subs.get((i, 0)) if analysis is not None else None
            yield from _top_level(sub, e.params["jaxpr"].jaxpr)
        else:
            yield analysis, i, e


def eqns_named(prog, name):
    """(analysis, node, eqn): the top level's equations ``name``; the analysis is
    None inside an inline jit no derivative reaches (never analysed)."""
    return [
        (a, i, e)
        for a, i, e in _top_level(prog.analysis, prog.closed_jaxpr.jaxpr)
        if e.primitive.name == name
    ]


def level_of_output(prog, name, k=0):
    """Static level of the output of the k-th top-level equation ``name``."""
    analysis, _, eqn = eqns_named(prog, name)[k]
    if analysis is None:
        return Level.DEAD
    return analysis.value_liveness(eqn.outvars[0]).level


def guarded_uses(analysis):
    """{(primitive, operand index)} of every guard site, nested graphs included."""
    sites, _ = plan_guards(analysis)
    found = {(analysis.graph.eqns[s.node].primitive.name, s.index) for s in sites}
    for sub in analysis.subs.values():
        found |= guarded_uses(sub)
    return found


def unguarded_reasons(analysis):
    _, ung = plan_guards(analysis)
    reasons = [u.reason for u in ung]
    for sub in analysis.subs.values():
        reasons += unguarded_reasons(sub)
    return reasons


def dw(p, x, safe=1.0):
    """The inner where of the double-where trick."""
    return jnp.where(p, x, safe)


# -- elementwise --------------------------------------------------------------------

NONLINEAR = {
    # name: (f applied to the dead operand, a dead point, a safe point, a live point)
    "sqrt": (jnp.sqrt, 0.0, 1.0, 4.0),
    "rsqrt": (lax.rsqrt, 0.0, 1.0, 4.0),
    "log": (jnp.log, 0.0, 1.0, 2.0),
    "log1p": (jnp.log1p, -1.0, 0.0, 1.0),
    "div": (lambda x: 1.0 / x, 0.0, 1.0, 2.0),
    "pow": (lambda x: x**0.5, 0.0, 1.0, 4.0),
    "integer_pow": (lambda x: x**-2, 0.0, 1.0, 2.0),
    "cbrt": (jnp.cbrt, 0.0, 1.0, 8.0),
    "acos": (jnp.arccos, 1.0, 0.0, 0.5),
    "asin": (jnp.arcsin, -1.0, 0.0, 0.5),
    "atanh": (jnp.arctanh, 1.0, 0.0, 0.5),
    "exp": (jnp.exp, 100.0, 0.0, 1.0),
    # mul's derivative is the other operand: inf in the dead lane
    "mul": (lambda x: x * jnp.array([jnp.inf, 1.0]), 0.0, 1.0, 2.0),
    "lgamma": (lax.lgamma, 0.0, 1.0, 2.0),
}


@pytest.mark.parametrize("name", sorted(NONLINEAR))
def test_nonlinear_elementwise(name):
    op, dead, safe, live = NONLINEAR[name]
    x = jnp.array([dead, live])
    mask = jnp.array([False, True])
    f = lambda x: jnp.where(mask, op(x), 0.0)
    oracle = lambda x: jnp.where(mask, op(dw(mask, x, safe)), 0.0)
    want = check(f, oracle, x)
    assert want[0] == 0.0
    assert name in {p for p, _ in guarded_uses(program(f, x).analysis)}


def test_linear_elementwise_passes_mask_without_guard():
    """add/sub/neg/convert pass an exact zero through: the mask flows over them
    to the sqrt, which is guarded; they themselves are not."""
    f = lambda x: jnp.where(x > 0, -(jnp.sqrt(x.astype(jnp.float32)) + 1.0) - 2.0, 0.0)
    oracle = lambda x: jnp.where(x > 0, -(jnp.sqrt(dw(x > 0, x)) + 1.0) - 2.0, 0.0)
    x = jnp.array([-1.0, 0.0, 4.0])
    check(f, oracle, x)
    prog = program(f, x)
    assert level_of_output(prog, "sqrt") is Level.PARTIAL
    assert level_of_output(prog, "neg") is Level.PARTIAL
    ops = {p for p, _ in guarded_uses(prog.analysis)}
    assert "sqrt" in ops
    assert not ops & {"add", "sub", "neg", "convert_element_type"}


def test_broadcast_operand_mask_is_reduced():
    """A rank-0 operand of a binary op feeds every lane: live if any lane is."""
    f = lambda x, s: jnp.where(x > 0, jnp.sqrt(x) * jnp.sqrt(s), 0.0)
    oracle = lambda x, s: jnp.where(x > 0, jnp.sqrt(dw(x > 0, x)) * jnp.sqrt(s), 0.0)
    # s is live (some lane of x is) -- and x lane 0 is dead
    check(f, oracle, jnp.array([0.0, 4.0]), jnp.float32(4.0), argnums=(0, 1))
    # every lane dead: s dead too
    oracle2 = lambda x, s: jnp.where(x > 0, jnp.sqrt(dw(x > 0, x)) * jnp.sqrt(dw(False, s)), 0.0)
    check(f, oracle2, jnp.array([0.0, -1.0]), jnp.float32(0.0), argnums=(0, 1))


def test_zero_derivative_ops_carry_nothing():
    """Comparisons, floor, sign, stop_gradient: no derivative flows back, so
    their inputs are never marked as reaching an output through them."""
    f = lambda x: jnp.floor(jnp.sqrt(x)) + jnp.sign(x) + lax.stop_gradient(jnp.log(x))
    x = jnp.array([0.0, 4.0])
    np.testing.assert_array_equal(jax.grad(_sum(guard(f)))(x), [0.0, 0.0])
    prog = program(f, x)
    for name in ("sqrt", "log"):
        analysis, _, eqn = eqns_named(prog, name)[0]
        if analysis is not None:  # else: not even analysed, nothing reaches it
            lv = analysis.value_liveness(eqn.outvars[0])
            assert lv.level is Level.DEAD and not lv.reaches_output
    assert guarded_uses(prog.analysis) == set()


# -- selection ------------------------------------------------------------------------


def test_select_n_integer_predicate():
    """Three cases; case k is live exactly where the predicate is k (per-lane if)."""
    idx = jnp.array([0, 1, 2, 2], dtype=jnp.int32)
    f = lambda x: lax.select_n(idx, jnp.sqrt(x), jnp.log(x), 1.0 / x)
    x = jnp.array([4.0, 2.0, 0.5, 0.0])
    plain = jax.grad(_sum(f))(x)
    assert not _finite(plain)
    # per-lane python if: only the chosen case is differentiated
    cases = [lambda v: jnp.sqrt(v), lambda v: jnp.log(v), lambda v: 1.0 / v]
    want = [float(jax.grad(cases[int(k)])(float(v))) for k, v in zip(idx, x)]
    # the last lane takes 1/x at 0: a genuine singularity, -inf
    assert np.isneginf(want[3])
    for g in (guard(f), guarded_jit(f)):
        got = np.asarray(jax.grad(_sum(g))(x))
        np.testing.assert_allclose(got[:3], want[:3], rtol=1e-6)
        assert np.isneginf(got[3])


def test_select_n_literal_predicate_is_statically_dead():
    """A constant predicate makes the other case dead in every lane: the guard
    is a plain stop_gradient (GuardSite.statically_dead)."""
    f = lambda x: lax.select_n(np.bool_(True), jnp.sqrt(x), x)
    x = jnp.array([0.0, 4.0])
    oracle = lambda x: x
    check(f, oracle, x)
    prog = program(f, x)
    assert level_of_output(prog, "sqrt") is Level.DEAD
    analysis, _, _ = eqns_named(prog, "sqrt")[0]  # inside jnp.sqrt's inline jit
    sites, _ = plan_guards(analysis)
    sqrt_sites = [s for s in sites if analysis.graph.eqns[s.node].primitive.name == "sqrt"]
    assert sqrt_sites and all(s.statically_dead for s in sqrt_sites)


@pytest.mark.parametrize("op", [jnp.maximum, jnp.minimum], ids=["max", "min"])
def test_max_min_loser_is_dead(op):
    sign = 1.0 if op is jnp.maximum else -1.0
    f = lambda x: op(sign * jnp.sqrt(x), sign * 1.0)
    oracle = lambda x: op(sign * jnp.sqrt(dw(jnp.sqrt(x) > 1.0, x, 4.0)), sign * 1.0)
    x = jnp.array([0.0, 4.0, 0.25])
    want = check(f, oracle, x)
    np.testing.assert_allclose(want, sign * np.array([0.0, 0.25, 0.0]))
    prog = program(f, x)
    assert level_of_output(prog, "sqrt") is Level.PARTIAL
    assert ("sqrt", 0) in guarded_uses(prog.analysis)


@pytest.mark.parametrize("op", [jnp.maximum, jnp.minimum], ids=["max", "min"])
def test_max_min_build_no_mask_for_a_bound(op):
    """``minimum(|x|, 1.0)`` (a Huber loss): the literal bound carries no
    derivative, so no mask is built for it in either direction -- an unused
    mask is a comparison (and a reduction) left dead in the guarded program
    and in every dump of it."""

    def f(x):  # optax.huber_loss's body, with ``op`` for its minimum
        a = jnp.abs(x)
        q = op(a, 1.0)
        return jnp.sum(0.5 * q**2 + (a - q))

    x = jnp.array([0.0, 0.5, 3.0])
    jaxpr = spliced_program(jax.make_jaxpr(guard(f))(x)).jaxpr
    read = {id(v) for e in jaxpr.eqns for v in e.invars} | {id(v) for v in jaxpr.outvars}
    dead = [e for e in jaxpr.eqns if not any(id(v) in read for v in e.outvars)]
    assert dead == [], dead
    np.testing.assert_array_equal(jax.grad(guard(f))(x), jax.grad(f)(x))


def test_max_tie_stays_live():
    """JAX gives half the derivative to each side of a tie: a tied lane is
    live and must keep JAX's value (here the genuine inf of sqrt'(0))."""
    f = lambda x: jnp.maximum(jnp.sqrt(x), 0.0)
    g = jax.grad(_sum(guard(f)))(jnp.array([0.0, 4.0]))
    assert np.isposinf(g[0]) and g[1] == 0.25
    # a finite tie: both operands x*x and y = 4 at x = 2 get 1/2
    h = lambda x, y: jnp.maximum(x * x, y)
    for fn in (guard(h), guarded_jit(h)):
        gx, gy = jax.grad(fn, argnums=(0, 1))(2.0, 4.0)
        assert float(gx) == 2.0 and float(gy) == 0.5  # the JAX convention, unchanged
    assert jax.grad(h, argnums=(0, 1))(2.0, 4.0) == (2.0, 0.5)


def test_clamp_strict_inequalities():
    """lax.clamp's JVP selects x where lo < x < hi, lo where lo > x, hi where hi < x."""
    f = lambda x: lax.clamp(-5.0, jnp.log(x), 5.0)
    x = jnp.array([0.0, 1.0, math.exp(10.0)])
    oracle = lambda x: jnp.clip(jnp.log(dw((jnp.log(x) > -5) & (jnp.log(x) < 5), x)), -5.0, 5.0)
    want = check(f, oracle, x)
    np.testing.assert_allclose(want, [0.0, 1.0, 0.0])
    # the bounds themselves: lo = sqrt(y) loses at y = 0
    f2 = lambda y, x: lax.clamp(jnp.sqrt(y), x, 10.0)
    oracle2 = lambda y, x: lax.clamp(jnp.sqrt(dw(jnp.sqrt(y) > x, y, 0.25)), x, 10.0)
    check(f2, oracle2, jnp.array([0.0, 4.0]), jnp.array([1.0, 1.0]), argnums=(0, 1))


def test_clamp_tie_matches_jax():
    """At x == hi JAX's clamp gives *no* operand a derivative (strict); the
    guard must agree with plain JAX at finite points."""
    h = lambda lo, x, hi: lax.clamp(lo, x, hi)
    for args in [(0.0, 1.0, 1.0), (1.0, 1.0, 2.0), (0.0, 0.5, 1.0), (0.0, 3.0, 1.0)]:
        want = jax.grad(h, argnums=(0, 1, 2))(*args)
        got = jax.grad(guard(h), argnums=(0, 1, 2))(*args)
        assert tuple(map(float, got)) == tuple(map(float, want))


@pytest.mark.parametrize("red", [jnp.max, jnp.min], ids=["reduce_max", "reduce_min"])
def test_reduce_max_min_ties_share(red):
    sign = 1.0 if red is jnp.max else -1.0
    f = lambda x: red(sign * jnp.sqrt(x))
    x = jnp.array([0.0, 4.0, 4.0])

    def oracle(x):
        win = x == jnp.max(x)
        return red(jnp.where(win, sign * jnp.sqrt(dw(win, x)), -sign * jnp.inf))

    want = check(f, oracle, x)
    np.testing.assert_allclose(want, sign * np.array([0.0, 0.125, 0.125]))


# -- structural -------------------------------------------------------------------------

X3 = jnp.array([0.0, 1.0, 4.0])


def test_slice():
    f = lambda x: jnp.sqrt(x)[1:]
    oracle = lambda x: jnp.sqrt(dw(jnp.arange(3) > 0, x))[1:]
    check(f, oracle, X3)
    f2 = lambda x: lax.slice(jnp.sqrt(x), (1,), (3,), (2,))  # strided: keeps lane 1 only
    oracle2 = lambda x: lax.slice(jnp.sqrt(dw(jnp.arange(3) == 1, x)), (1,), (3,), (2,))
    check(f2, oracle2, X3)
    assert level_of_output(program(f, X3), "sqrt") is Level.PARTIAL


def test_dynamic_slice_traced_start():
    f = lambda x, i: lax.dynamic_slice(jnp.sqrt(x), (i,), (2,))
    oracle = lambda x, i: lax.dynamic_slice(
        jnp.sqrt(dw((jnp.arange(3) >= i) & (jnp.arange(3) < i + 2), x)), (i,), (2,)
    )
    check(f, oracle, X3, jnp.int32(1))


def test_dynamic_update_slice_overwritten_region_dead():
    f = lambda x: lax.dynamic_update_slice(jnp.sqrt(x), jnp.zeros(1), (0,))
    oracle = lambda x: lax.dynamic_update_slice(
        jnp.sqrt(dw(jnp.arange(3) > 0, x)), jnp.zeros(1), (0,)
    )
    check(f, oracle, X3)
    f2 = lambda x: jnp.sqrt(x).at[:1].set(7.0)
    check(f2, oracle, X3)
    # the update itself can be the dead one when the result is sliced away
    f3 = lambda x, u: lax.dynamic_update_slice(x, jnp.sqrt(u), (1,))[:1]
    oracle3 = lambda x, u: lax.dynamic_update_slice(x, jnp.sqrt(dw(False, u)), (1,))[:1]
    check(f3, oracle3, X3, jnp.array([0.0]), argnums=(0, 1))


def test_gather():
    idx = jnp.array([2, 2, 1])
    f = lambda x: jnp.sqrt(x)[idx]
    oracle = lambda x: jnp.sqrt(dw(jnp.arange(3) > 0, x))[idx]
    want = check(f, oracle, X3)
    np.testing.assert_allclose(want, [0.0, 0.5, 0.5])


def test_scatter_overwrites():
    idx = jnp.array([0])
    f = lambda x: jnp.sqrt(x).at[idx].set(3.0)
    oracle = lambda x: jnp.sqrt(dw(jnp.arange(3) > 0, x)).at[idx].set(3.0)
    check(f, oracle, X3)


def test_scatter_add_dropped_updates():
    """An update scattered out of bounds (mode='drop') or into a dead lane is dead."""
    f = lambda u: jnp.zeros(2).at[jnp.array([0, 5, 1])].add(jnp.sqrt(u), mode="drop")
    oracle = lambda u: (
        jnp.zeros(2)
        .at[jnp.array([0, 5, 1])]
        .add(jnp.sqrt(dw(jnp.array([True, False, True]), u)), mode="drop")
    )
    check(f, oracle, jnp.array([4.0, 0.0, 1.0]))
    g = lambda u: jnp.zeros(3).at[jnp.array([0, 1, 1])].add(jnp.sqrt(u))[0]
    oracle_g = lambda u: (
        jnp.zeros(3)
        .at[jnp.array([0, 1, 1])]
        .add(jnp.sqrt(dw(jnp.array([True, False, False]), u)))[0]
    )
    check(g, oracle_g, jnp.array([4.0, 0.0, 0.0]))


def test_pad_negative_and_padding_value():
    f = lambda x: lax.pad(jnp.sqrt(x), 0.0, [(-1, 1, 0)])
    oracle = lambda x: lax.pad(jnp.sqrt(dw(jnp.arange(3) > 0, x)), 0.0, [(-1, 1, 0)])
    check(f, oracle, X3)
    # the padding value only reaches the padding lanes, which are sliced away
    g = lambda x, v: lax.pad(x, jnp.sqrt(v), [(1, 1, 0)])[1:-1]
    oracle_g = lambda x, v: lax.pad(x, jnp.sqrt(dw(False, v)), [(1, 1, 0)])[1:-1]
    check(g, oracle_g, X3, jnp.float32(0.0), argnums=(0, 1))


def test_concatenate():
    f = lambda x, y: jnp.concatenate([jnp.sqrt(x), jnp.sqrt(y)])[:3]
    oracle = lambda x, y: jnp.concatenate([jnp.sqrt(x), jnp.sqrt(dw(jnp.arange(2) == 0, y))])[:3]
    gy = check(f, oracle, jnp.array([1.0, 4.0]), jnp.array([1.0, 0.0]), argnums=(0, 1))[1]
    np.testing.assert_array_equal(gy, [0.5, 0.0])


SHAPE_OPS = {
    "reshape": (lambda a: a.reshape(2, 2), np.array([[True, False], [True, True]])),
    "broadcast_in_dim": (
        lambda a: jnp.broadcast_to(a, (3, 4)),
        np.array([[True, False, False, True]] * 3),
    ),
    "transpose": (lambda a: a.reshape(2, 2).T, np.array([[True, True], [False, True]])),
    "squeeze": (lambda a: a.reshape(1, 4).squeeze(0), np.array([True, False, True, True])),
    "rev": (lambda a: a[::-1], np.array([True, True, False, True])),
    "expand_dims": (lambda a: jnp.expand_dims(a, 0), np.array([[True, False, True, True]])),
}


@pytest.mark.parametrize("name", sorted(SHAPE_OPS))
def test_shape_ops_move_the_mask(name):
    """The mask of the where after the op, moved back to the input lanes."""
    op, keep = SHAPE_OPS[name]
    x = jnp.array([4.0, 0.0, 1.0, 9.0])
    # lane 1 of x is 0; the mask `keep` kills exactly the lanes lane 1 lands on
    f = lambda x: jnp.where(keep, op(jnp.sqrt(x)), 0.0)
    oracle = lambda x: jnp.where(keep, op(jnp.sqrt(dw(jnp.arange(4) != 1, x))), 0.0)
    check(f, oracle, x)
    prog = program(f, x)
    assert ("sqrt", 0) in guarded_uses(prog.analysis)


def test_reduce_sum_scalar_condition():
    f = lambda x: jnp.where(jnp.sum(jnp.sqrt(x)) > 100, jnp.sum(jnp.sqrt(x)), 0.0)
    oracle = lambda x: jnp.where(
        jnp.sum(jnp.sqrt(x)) > 100, jnp.sum(jnp.sqrt(dw(jnp.sum(jnp.sqrt(x)) > 100, x))), 0.0
    )
    check(f, oracle, X3)


def test_reduce_prod():
    """Both reduce_prod (derivative = product of the others, may be inf) and
    the sqrt below it need guarding when the product is dead."""
    p = jnp.array([False, True])
    f = lambda x: jnp.where(p, jnp.prod(jnp.sqrt(x), axis=1), 0.0)
    oracle = lambda x: jnp.where(p, jnp.prod(jnp.sqrt(dw(p[:, None], x)), axis=1), 0.0)
    x = jnp.array([[0.0, 4.0], [1.0, 4.0]])
    check(f, oracle, x)
    assert ("reduce_prod", 0) in guarded_uses(program(f, x).analysis)


def test_cumsum_and_cumprod():
    x = jnp.array([4.0, 0.0])
    first = jnp.arange(2) == 0
    for cum in (jnp.cumsum, jnp.cumprod):
        f = lambda x: cum(jnp.sqrt(x))[0]
        oracle = lambda x: cum(jnp.sqrt(dw(first, x)))[0]
        check(f, oracle, x)


def test_dot_general():
    """Batched dot: a dead batch row; and the other operand's inf as the local
    derivative (dot's derivative is the other operand)."""
    p = jnp.array([True, False])
    f = lambda a, b: jnp.where(p, jnp.einsum("bi,bi->b", jnp.sqrt(a), b), 0.0)
    oracle = lambda a, b: jnp.where(p, jnp.einsum("bi,bi->b", jnp.sqrt(dw(p[:, None], a)), b), 0.0)
    a = jnp.array([[1.0, 4.0], [0.0, 1.0]])
    b = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    check(f, oracle, a, b, argnums=(0, 1))
    g = lambda a, b: jnp.where(p, jnp.einsum("bi,bi->b", a, b), 0.0)
    binf = jnp.array([[1.0, 2.0], [jnp.inf, 4.0]])
    oracle_g = lambda a, b: jnp.where(p, jnp.einsum("bi,bi->b", a, dw(p[:, None], b)), 0.0)
    want = check(g, oracle_g, a, binf)
    np.testing.assert_array_equal(want, [[1.0, 2.0], [0.0, 0.0]])
    assert ("dot_general", 0) in guarded_uses(program(g, a, binf).analysis)


def test_reduce_window_max_pooling():
    f = lambda x: lax.reduce_window(jnp.sqrt(x), -jnp.inf, lax.max, (2,), (2,), "VALID")
    x = jnp.array([0.0, 1.0, 4.0, 0.0])
    win = jnp.array([False, True, True, False])
    oracle = lambda x: lax.reduce_window(
        jnp.where(win, jnp.sqrt(dw(win, x)), -jnp.inf), -jnp.inf, lax.max, (2,), (2,), "VALID"
    )
    want = check(f, oracle, x)
    np.testing.assert_allclose(want, [0.0, 0.5, 0.25, 0.0])


def test_sort_follows_dead_lanes_through_its_permutation():
    """Sort permutes lanes by value, the same for every operand: a dead
    output lane's cotangent goes back to the input lane it came from (the
    sort's VJP at the actual operands, as for ``top_k``).  Here the lane
    holding ``sqrt(0)`` is dropped after the sort: its zero cotangent met
    ``sqrt'(0)`` (NaN, reported as 'sort permutes lanes' before); now it is
    guarded where it enters, as the double where guards it."""
    keep = jnp.arange(2) > 0
    f = lambda x: jnp.where(keep, jnp.sort(jnp.sqrt(x)), 0.0)  # noqa: E731
    x = jnp.array([4.0, 0.0])
    # the hand double where: sqrt(0) lands in dropped lane 0, so x[1] is dead
    oracle = lambda x: jnp.where(  # noqa: E731
        keep, jnp.sort(jnp.sqrt(jnp.where(jnp.array([True, False]), x, 1.0))), 0.0
    )
    assert not _finite(jax.grad(_sum(f))(x))
    np.testing.assert_allclose(jax.grad(_sum(guard(f)))(x), jax.grad(_sum(oracle))(x))
    np.testing.assert_allclose(jax.grad(_sum(guard(f)))(x), [0.25, 0.0])
    assert not unguarded_reasons(program(f, x).analysis)


# -- calls and control flow --------------------------------------------------------------


def _closed_call(fn, *example):
    closed = jax.make_jaxpr(fn)(*example)

    def call(*args):
        params = jax_core.closed_call_p.get_bind_params({"call_jaxpr": closed})
        return jax_core.closed_call_p.bind(*args, **params)[0]

    return call


@pytest.mark.parametrize("kind", ["jit", "closed_call", "remat"])
def test_calls_carry_masks_into_their_body(kind):
    x = jnp.array([-1.0, 0.0, 4.0])
    body = {
        "jit": jax.jit(jnp.sqrt),
        "closed_call": _closed_call(jnp.sqrt, x),
        "remat": jax.checkpoint(jnp.sqrt),
    }[kind]
    f = lambda x: jnp.where(x > 0, body(x), 0.0)
    oracle = lambda x: jnp.where(x > 0, jnp.sqrt(dw(x > 0, x)), 0.0)
    check(f, oracle, x)
    prog = program(f, x)
    # closed_call_p is named "eval_jaxpr" from jax 0.11 on
    call_name = {"jit": "jit", "closed_call": jax_core.closed_call_p.name, "remat": "remat2"}[kind]
    analysis, node, _ = [t for t in eqns_named(prog, call_name) if not jit_inlines(t[2].params)][0]
    assert analysis is prog.analysis
    sub = prog.analysis.subs[(node, 0)]
    assert ("sqrt", 0) in guarded_uses(sub)


@jax.custom_vjp
def _cvjp_log(x):
    return jnp.log(x)


_cvjp_log.defvjp(lambda x: (jnp.log(x), x), lambda x, g: (g / x,))


@jax.custom_jvp
def _cjvp_log(x):
    return jnp.log(x)


_cjvp_log.defjvp(lambda p, t: (jnp.log(p[0]), t[0] / p[0]))


@pytest.mark.parametrize("fn", [_cvjp_log, _cjvp_log], ids=["custom_vjp", "custom_jvp"])
def test_custom_derivative_calls_guarded_at_inputs(fn):
    x = jnp.array([0.0, 1.0, 2.0])
    f = lambda x: jnp.where(x > 0, fn(x), 0.0)
    oracle = lambda x: jnp.where(x > 0, jnp.log(dw(x > 0, x)), 0.0)
    want = check(f, oracle, x)
    np.testing.assert_allclose(want, [0.0, 1.0, 0.5])
    ops = {p for p, _ in guarded_uses(program(f, x).analysis)}
    assert ops & {"custom_vjp_call", "custom_jvp_call"}


def test_cond_body_guarded_inside():
    f = lambda x: lax.cond(x[0] < 0, lambda v: jnp.where(v > 0, jnp.sqrt(v), 0.0), jnp.sin, x)
    oracle = lambda x: jnp.where(x > 0, jnp.sqrt(dw(x > 0, x)), 0.0)
    check(f, oracle, jnp.array([-1.0, 0.0, 4.0]))


def test_scan_body_guarded_inside():
    def f(xs):
        return lax.scan(lambda c, x: (c + jnp.where(x > 0, jnp.log(x), 0.0), None), 0.0, xs)[0]

    oracle = lambda xs: jnp.sum(jnp.where(xs > 0, jnp.log(dw(xs > 0, xs)), 0.0))
    check(f, oracle, jnp.array([0.0, 1.0, 2.0]))


def test_while_body_guarded_inside_forward_mode():
    def f(x):
        return lax.while_loop(
            lambda s: s[0] < 2,
            lambda s: (s[0] + 1, s[1] + jnp.maximum(jnp.log(x), -5.0)),
            (0, jnp.zeros_like(x)),
        )[1]

    x = jnp.array([0.0, 2.0])
    t = jnp.ones(2)
    assert not _finite(jax.jvp(f, (x,), (t,))[1])
    for g in (guard(f), guarded_jit(f)):
        np.testing.assert_allclose(jax.jvp(g, (x,), (t,))[1], [0.0, 1.0], rtol=1e-6)


def test_control_flow_boundary_is_conservative():
    """Dead lanes arriving at a cond from outside: either followed exactly (a
    precise rule) or not at all -- then JAX's behaviour is kept and reported."""
    f = lambda x: jnp.where(x > 0, lax.cond(x[0] > -5, jnp.sqrt, jnp.sin, x), 0.0)
    oracle = lambda x: jnp.where(x > 0, jnp.sqrt(dw(x > 0, x)), 0.0)
    x = jnp.array([-1.0, 0.0, 4.0])
    got = jax.grad(_sum(guard(f)))(x)
    if _finite(got):
        np.testing.assert_allclose(got, jax.grad(_sum(oracle))(x))
    else:
        np.testing.assert_array_equal(got, jax.grad(_sum(f))(x))
        assert any("cond" in r for r in unguarded_reasons(program(f, x).analysis))


# -- an operation with no rule -------------------------------------------------------------

unknown_sqrt_p = Primitive("hlo_guard_test_unknown_sqrt")
unknown_sqrt_p.def_impl(lambda x: jnp.sqrt(x))
unknown_sqrt_p.def_abstract_eval(lambda x: x)
ad.defjvp(unknown_sqrt_p, lambda g, x: g * (0.5 / lax.sqrt(x)))
mlir.register_lowering(unknown_sqrt_p, mlir.lower_fun(jnp.sqrt, multiple_results=False))


def test_unknown_primitive_is_conservative_and_reported():
    f = lambda x: jnp.where(x > 0, unknown_sqrt_p.bind(x), 0.0)
    x = jnp.array([0.0, 4.0])
    plain = jax.grad(_sum(f))(x)
    assert np.isnan(plain[0]) and plain[1] == 0.25
    for g in (guard(f), guarded_jit(f)):
        got = jax.grad(_sum(g))(x)
        np.testing.assert_array_equal(got, plain)  # the framework's own behaviour
    reasons = unguarded_reasons(program(f, x).analysis)
    assert any("hlo_guard_test_unknown_sqrt" in r for r in reasons), reasons


# -- conventions JAX's own derivatives fix ------------------------------------------------


def test_scatter_duplicate_indices_winner_stays_live():
    """``.at[[0, 0]].set(u)``: only the update JAX lets win is differentiated;
    which one wins is read from the forward value, not assumed."""
    u = jnp.array([0.0, 4.0])
    for order in (slice(None), slice(None, None, -1)):
        f = lambda u: jnp.zeros(2).at[jnp.array([0, 0])].set(jnp.sqrt(u[order]))
        winner = np.asarray(jnp.sqrt(u[order]) == f(u)[0])
        assert winner.sum() == 1
        win_u = np.zeros(2, bool)
        win_u[np.arange(2)[order][winner]] = True
        oracle = lambda u: (
            jnp.zeros(2).at[jnp.array([0, 0])].set(jnp.sqrt(dw(jnp.asarray(win_u), u))[order])
        )
        want = jax.grad(_sum(oracle))(u)
        for g in (guard(f), guarded_jit(f)):
            got = np.asarray(jax.grad(_sum(g))(u))
            if win_u[0]:  # the sqrt at 0 won: a genuine inf, kept
                assert np.isposinf(got[0]) and got[1] == 0.0
            else:
                np.testing.assert_array_equal(got, want)


def test_top_k_and_argmax_indexing():
    x = jnp.array([0.0, 1.0, 4.0])
    top = jnp.arange(3) == 2
    oracle = lambda x: jnp.sqrt(dw(top, x))[2:]
    check(lambda x: lax.top_k(jnp.sqrt(x), 1)[0], oracle, x)
    check(lambda x: jnp.sqrt(x)[jnp.argmax(x)], lambda x: jnp.sqrt(dw(top, x))[2], x)


def test_numeric_zero_weights_are_not_structural():
    """A multiplication by a zero *value* (a zero convolution weight) is not a
    selection: ``0 * sqrt'(0)`` is a genuine NaN and stays."""
    f = lambda x: jnp.convolve(jnp.sqrt(x), jnp.array([1.0, 0.0]), mode="valid")
    x = jnp.array([0.0, 1.0, 4.0])
    plain = jax.grad(_sum(f))(x)
    assert np.isnan(plain[0])
    for g in (guard(f), guarded_jit(f)):
        np.testing.assert_array_equal(jax.grad(_sum(g))(x), plain)


# -- a value used directly in one case and through an op in the other ---------


def test_value_in_every_case_of_a_where_is_statically_live():
    """``where(x > 1, x, sqrt(x))``: ``x`` reaches both cases, so it is as live as
    the where's output -- no mask (and no side computation of later predicates)
    is needed, while sqrt's own input is still guarded."""
    import jax.numpy as jnp

    import hlo_guard
    from passes.lattice import Level

    def f(x):
        for _ in range(3):
            x = jnp.where(x > 1.0, x, jnp.sqrt(x)) + 0.5
        return x.sum()

    x = jnp.array([0.0, 0.5, 2.0, 4.0])
    program, _ = hlo_guard.guard(f).traced(x)
    invar = program.closed_jaxpr.jaxpr.invars[0]
    assert program.analysis.value_liveness(invar).level is Level.LIVE

    def oracle(x):
        for _ in range(3):
            x = jnp.where(x > 1.0, x, jnp.sqrt(jnp.where(x > 1.0, 1.0, x))) + 0.5
        return x.sum()

    got = jax.grad(hlo_guard.guard(f))(x)
    want = jax.grad(oracle)(x)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    np.testing.assert_allclose(got[1:], want[1:], rtol=1e-6)
    # the guarded program carries no side copy of the chain: no stop_gradient
    # feeding a comparison
    jaxpr = spliced_program(jax.make_jaxpr(hlo_guard.guard(f))(x))
    names = [e.primitive.name for e in jaxpr.jaxpr.eqns]
    assert names.count("sqrt") == 3


def test_dot_general_masks_need_no_contraction():
    """The dot rule's masks come from reductions of the output mask, never from
    a matmul: the guarded gradient of a masked matmul has as many dots as the
    double-where one."""
    import jax.numpy as jnp

    import hlo_guard

    def f(x, w):
        rows = jnp.arange(x.shape[0]) % 2 == 0
        y = jnp.log(x) @ w
        return jnp.where(rows[:, None], y, 0.0).sum()

    x = jnp.abs(jnp.arange(12.0).reshape(4, 3)) + 1.0
    w = jnp.ones((3, 5))
    jaxpr = jax.make_jaxpr(jax.grad(hlo_guard.guard(f)))(x, w)
    plain = jax.make_jaxpr(jax.grad(f))(x, w)
    count = lambda j: sum(e.primitive.name == "dot_general" for e in j.jaxpr.eqns)
    assert count(jaxpr) == count(plain)


def test_a_live_singular_lane_through_a_sort_stays_infinite():
    """The contract's other half: a lane a ``where`` keeps, at ``sqrt(0)``,
    sorted and then read, keeps its infinite derivative in both modes -- as
    the double where (here plain JAX: no lane is dropped) has it."""
    f = lambda x: jnp.sort(jnp.sqrt(jnp.where(x > -1.0, x, 1.0)))  # noqa: E731
    x = jnp.array([4.0, 0.0, 1.0])
    for d in (jax.grad, jax.jacfwd):
        got = np.asarray(d(_sum(guard(f)))(x))
        want = np.asarray(d(_sum(f))(x))
        assert np.isinf(want[1])
        np.testing.assert_array_equal(got, want)
