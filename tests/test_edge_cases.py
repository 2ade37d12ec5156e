"""Bad input and edge cases of the public API.

Every derivative is compared with a hand-written double-``where`` oracle (the
dead branch's input replaced by a safe value, so no NaN can arise), never with
hlo_guard's own output.  Forward values are compared bitwise with the
unguarded function.
"""

from __future__ import annotations

import collections
import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import hlo_guard
from hlo_guard import guard, guarded_jit

X = np.array([-1.0, 0.0, 1.0, 4.0], np.float32)


def leaky(x):
    """The seed: plain JAX gives NaN at x <= 0."""
    return jnp.where(x > 0, jnp.sqrt(x), 0.0)


def safe(x):
    """The hand-written double-where oracle of ``leaky``."""
    return jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0)


def total(fn):
    return lambda *a, **k: jnp.sum(fn(*a, **k))


def bitwise_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def assert_tree_bitwise(got, want):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert bitwise_equal(g, w), (g, w)


def test_seed_is_really_broken_without_guard():
    """The oracle tests below can fail: plain JAX leaks NaN here."""
    assert np.isnan(np.asarray(jax.grad(total(leaky))(X))).any()


# -- pytrees -----------------------------------------------------------------------

Pair = collections.namedtuple("Pair", "lo hi")


def tree_fn(params, batch):
    a = leaky(params["w"]) * batch[0]
    b = jnp.maximum(jnp.log(params["b"][1]), -5.0)
    return {"out": a + b, "aux": Pair(lo=jnp.min(a), hi=(b, batch[1]))}


def tree_oracle(params, batch):
    a = safe(params["w"]) * batch[0]
    b1 = params["b"][1]
    live = jnp.log(b1) > -5.0  # the inputs below never tie at -5
    b = jnp.where(live, jnp.log(jnp.where(live, b1, 1.0)), -5.0)
    return {"out": a + b, "aux": Pair(lo=jnp.min(a), hi=(b, batch[1]))}


def tree_loss(fn):
    def loss(params, batch):
        out = fn(params, batch)
        return jnp.sum(out["out"]) + out["aux"].lo + out["aux"].hi[0]

    return loss


@pytest.mark.parametrize("wrap", [guard, guarded_jit], ids=["guard", "guarded_jit"])
def test_pytrees_in_and_out(wrap):
    params = {"w": jnp.asarray(X), "b": (jnp.float32(2.0), jnp.float32(0.0))}
    batch = (jnp.arange(4.0), jnp.ones(3))
    assert_tree_bitwise(wrap(tree_fn)(params, batch), tree_fn(params, batch))
    got = jax.grad(tree_loss(wrap(tree_fn)), argnums=(0, 1))(params, batch)
    want = jax.grad(tree_loss(tree_oracle), argnums=(0, 1))(params, batch)
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    # the plain function is broken in exactly those leaves
    plain = jax.grad(tree_loss(tree_fn))(params, batch)
    assert np.isnan(np.asarray(plain["w"])).any()


# -- static and keyword arguments ----------------------------------------------------


def moded(x, mode, scale=1.0):
    if mode == "sqrt":
        return jnp.where(x > 0, jnp.sqrt(x), 0.0) * scale
    return jnp.where(x > 0, jnp.log(x), 0.0) * scale


def moded_oracle(x, mode, scale=1.0):
    xs = jnp.where(x > 0, x, 1.0)
    inner = jnp.sqrt(xs) if mode == "sqrt" else jnp.log(xs)
    return jnp.where(x > 0, inner, 0.0) * scale


@pytest.mark.parametrize(
    "make",
    [
        lambda: guard(moded, static_argnums=1),
        lambda: guard(moded, static_argnames="mode"),
        lambda: guarded_jit(moded, static_argnums=1),
        lambda: guarded_jit(moded, static_argnames="mode"),
        lambda: guarded_jit(moded, static_argnums=(1,), static_argnames=("mode",)),
    ],
    ids=["guard-nums", "guard-names", "jit-nums", "jit-names", "jit-both"],
)
@pytest.mark.parametrize("mode", ["sqrt", "log"])
def test_static_arguments(make, mode):
    fn = make()
    for call in (lambda f, x: f(x, mode), lambda f, x: f(x, mode=mode)):
        assert bitwise_equal(call(fn, X), call(moded, X))
        got = jax.grad(lambda x: jnp.sum(call(fn, x)))(X)
        want = jax.grad(lambda x: jnp.sum(call(moded_oracle, x)))(X)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_static_value_change_retraces():
    fn = guard(moded, static_argnums=1)
    assert not bitwise_equal(fn(X, "sqrt"), fn(X, "log"))
    assert bitwise_equal(fn(X, "log"), moded(X, "log"))


def test_keyword_arguments_are_dynamic_and_differentiable():
    fn = guard(moded, static_argnames="mode")
    scale = jnp.float32(3.0)
    assert bitwise_equal(fn(X, mode="sqrt", scale=scale), moded(X, "sqrt", scale=scale))
    gx, gs = jax.grad(lambda x, s: jnp.sum(fn(x, mode="sqrt", scale=s)), argnums=(0, 1))(X, scale)
    wx, ws = jax.grad(lambda x, s: jnp.sum(moded_oracle(x, "sqrt", scale=s)), argnums=(0, 1))(
        X, scale
    )
    np.testing.assert_allclose(gx, wx, rtol=1e-6)
    np.testing.assert_allclose(gs, ws, rtol=1e-6)


def test_unhashable_static_argument_is_a_clear_type_error():
    with pytest.raises(TypeError, match="hashable"):
        guard(moded, static_argnums=1)(X, ["sqrt"])


def test_static_argnums_out_of_range_is_a_type_error():
    with pytest.raises(TypeError, match="static_argnums"):
        guard(moded, static_argnums=7)


# -- shapes: zero-size, scalars ---------------------------------------------------------


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5)])
@pytest.mark.parametrize("wrap", [guard, guarded_jit], ids=["guard", "guarded_jit"])
def test_zero_size_arrays(shape, wrap):
    x = jnp.zeros(shape, jnp.float32)
    fn = lambda x: jnp.clip(leaky(x), 0.0, 1.0) + jnp.maximum(x, 0.0)  # noqa: E731
    out = wrap(fn)(x)
    assert out.shape == shape and bitwise_equal(out, fn(x))
    g = jax.grad(total(wrap(fn)))(x)
    assert g.shape == shape


@pytest.mark.parametrize("wrap", [guard, guarded_jit], ids=["guard", "guarded_jit"])
@pytest.mark.parametrize(
    "x",
    [0.0, -2.0, 4.0, np.float32(0.0), jnp.float32(0.0)],
    ids=["py0", "py-2", "py4", "np0", "jnp0"],
)
def test_scalars(wrap, x):
    assert bitwise_equal(wrap(leaky)(x), leaky(x))
    got = jax.grad(wrap(leaky))(x)
    want = jax.grad(safe)(x)
    assert bitwise_equal(got, want), (got, want)


def test_genuine_scalar_singularity_stays_visible():
    # sqrt(x)**2 at 0 is a taken path: its NaN/inf must survive the guard
    fn = lambda x: jnp.where(x >= 0, jnp.sqrt(x), 0.0)  # noqa: E731
    assert not np.isfinite(jax.grad(guard(fn))(0.0))
    assert not np.isfinite(jax.grad(guarded_jit(fn))(0.0))


# -- dtypes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype", [np.float16, ml_dtypes.bfloat16, np.float32], ids=["f16", "bf16", "f32"]
)
@pytest.mark.parametrize("wrap", [guard, guarded_jit], ids=["guard", "guarded_jit"])
def test_float_dtypes(dtype, wrap):
    x = jnp.asarray(X, dtype)
    out = wrap(leaky)(x)
    assert out.dtype == x.dtype and bitwise_equal(out, leaky(x))
    got = jax.grad(total(wrap(leaky)))(x)
    want = jax.grad(total(safe))(x)
    assert got.dtype == x.dtype and bitwise_equal(got, want), (got, want)


def test_float64_with_x64_enabled():
    with jax.enable_x64(True):
        x = jnp.asarray(X, jnp.float64)
        assert x.dtype == jnp.float64
        for wrap in (guard, guarded_jit):
            out = wrap(leaky)(x)
            assert out.dtype == jnp.float64 and bitwise_equal(out, leaky(x))
            got = jax.grad(total(wrap(leaky)))(x)
            assert got.dtype == jnp.float64
            assert bitwise_equal(got, jax.grad(total(safe))(x))
    assert jnp.ones(1).dtype == jnp.float32  # restored


def test_same_guard_across_x64_toggle_retraces():
    fn = guard(leaky)
    assert fn(jnp.asarray(X)).dtype == jnp.float32
    with jax.enable_x64(True):
        assert fn(np.asarray(X, np.float64)).dtype == jnp.float64
    assert fn(jnp.asarray(X)).dtype == jnp.float32


def test_complex64():
    z = jnp.asarray(X + 0.5j * X, jnp.complex64)

    def f(z):
        return jnp.where(jnp.real(z) > 0, jnp.sqrt(z), 0.0)

    def oracle(z):
        live = jnp.real(z) > 0
        return jnp.where(live, jnp.sqrt(jnp.where(live, z, 1.0)), 0.0)

    for wrap in (guard, guarded_jit):
        out = wrap(f)(z)
        assert out.dtype == jnp.complex64 and bitwise_equal(out, f(z))
        loss = lambda fn: lambda z: jnp.sum(jnp.abs(fn(z)) ** 2)  # noqa: E731
        got = jax.grad(loss(wrap(f)))(z)
        want = jax.grad(loss(oracle))(z)
        assert got.dtype == jnp.complex64
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert np.isnan(np.asarray(jax.grad(loss(f))(z))).any()  # plain leaks


# -- effects -------------------------------------------------------------------------


def with_effects(x, counter):
    a = jnp.sqrt(jnp.abs(x))
    jax.debug.print("a = {}", a)
    jax.debug.callback(lambda v: counter.append(np.asarray(v)), a)
    # the mask of this where depends on a value downstream of the effect
    return jnp.where(a == jnp.max(a), jnp.log(x), 0.0)


def test_debug_print_and_callback_run_once_per_call(capsys):
    calls = []
    f = lambda x: with_effects(x, calls)  # noqa: E731
    x = jnp.asarray(X)
    for wrap, name in ((guard, "guard"), (guarded_jit, "guarded_jit")):
        fn = wrap(f)
        capsys.readouterr()
        calls.clear()
        for k in range(1, 3):
            fn(x)
            jax.effects_barrier()
            assert len(calls) == k, (name, len(calls))
        printed = capsys.readouterr().out
        assert printed.count("a = ") == 2, (name, printed)


def test_effects_under_grad_match_plain_jax(capsys):
    x = jnp.asarray(X)
    counts = {}
    for label, wrap in (("plain", lambda f: f), ("guard", guard), ("jit", guarded_jit)):
        calls = []
        capsys.readouterr()
        jax.grad(total(wrap(lambda x: with_effects(x, calls))))(x)
        jax.effects_barrier()
        counts[label] = (len(calls), capsys.readouterr().out.count("a = "))
    assert counts["guard"] == counts["plain"] == counts["jit"], counts


def test_effects_do_not_change_the_derivative():
    x = jnp.asarray(X)
    calls = []
    got = jax.grad(total(guard(lambda x: with_effects(x, calls))))(x)
    a = np.sqrt(np.abs(X))
    live = a == a.max()
    want = np.where(live, 1.0 / np.where(live, X, 1.0), 0.0)  # d log x = 1/x on the max lane
    np.testing.assert_allclose(got, want, rtol=1e-6)


# -- closures ------------------------------------------------------------------------


def test_closing_over_concrete_arrays():
    w = jnp.asarray([1.0, -1.0, 2.0, 0.0])
    f = lambda x: jnp.where(w > 0, jnp.log(x * w), 0.0)  # noqa: E731
    oracle = lambda x: jnp.where(w > 0, jnp.log(jnp.where(w > 0, x * w, 1.0)), 0.0)  # noqa
    x = jnp.asarray(X)
    for wrap in (guard, guarded_jit):
        assert bitwise_equal(wrap(f)(x), f(x))
        np.testing.assert_allclose(jax.grad(total(wrap(f)))(x), jax.grad(total(oracle))(x))


def test_closing_over_an_outer_tracer():
    """``guard`` applied inside a jitted function whose closure is traced."""

    @jax.jit
    def outer(x, w):
        return jnp.sum(guard(lambda x: jnp.where(w > 0, jnp.sqrt(x * w), 0.0))(x))

    @jax.jit
    def oracle(x, w):
        live = w > 0
        return jnp.sum(jnp.where(live, jnp.sqrt(jnp.where(live, x * w, 1.0)), 0.0))

    x, w = jnp.asarray([0.0, 1.0, 4.0, 9.0]), jnp.asarray([0.0, 1.0, -1.0, 2.0])
    assert bitwise_equal(outer(x, w), oracle(x, w))
    got = jax.grad(outer, argnums=(0, 1))(x, w)
    want = jax.grad(oracle, argnums=(0, 1))(x, w)
    for g, o in zip(got, want):
        np.testing.assert_allclose(g, o, rtol=1e-6)


# -- wrong use -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad, words",
    [
        (np.array(["a", "b"]), ["<U1", "cannot trace"]),
        (np.array([1.0, None], dtype=object), ["object", "cannot trace"]),
        ([1.0, np.array(["x"])], ["<U1"]),
    ],
    ids=["str-array", "object-array", "list-with-str-array"],
)
def test_untraceable_array_argument_is_a_clear_type_error(bad, words):
    """An array JAX cannot trace was meant as an array: an error naming it,
    never a silently static leaf."""
    with pytest.raises(TypeError) as info:
        guard(moded)(X, bad)
    message = str(info.value)
    for w in words:
        assert w in message, message
    assert "argument" in message


@pytest.mark.parametrize("static_leaf", ["sqrt", ("sqrt",), {"how": "sqrt"}])
def test_non_array_leaves_are_static(static_leaf):
    """Strings, callables and other non-array leaves are static (as
    ``eqx.filter_jit`` treats them): traced once per value, arrays beside them
    traced and differentiated; same as the unguarded function with the
    double where as oracle."""
    calls = []

    def f(x, how):
        calls.append(1)
        how = jax.tree_util.tree_leaves(how)[0]
        assert how == "sqrt"
        return jnp.where(x > 0, jnp.sqrt(x), 0.0)

    g = guard(f)
    x = jnp.asarray(X)
    np.testing.assert_array_equal(g(x, static_leaf), f(x, static_leaf))
    g(x, static_leaf)
    assert len(calls) == 2  # one plain call, one trace: the second guarded call hit the cache
    oracle = jax.grad(lambda v: jnp.sum(jnp.where(v > 0, jnp.sqrt(jnp.where(v > 0, v, 1.0)), 0.0)))
    np.testing.assert_array_equal(jax.grad(lambda v: jnp.sum(g(v, static_leaf)))(x), oracle(x))


def test_stateful_object_leaf_is_refused_value_leaf_is_static():
    """An object with attributes and identity semantics would be baked into the
    trace and a later change to it unseen by the cached trace: refused.  A
    value (a frozen dataclass) keys the cache by value: same value, same trace;
    another value, another trace, each right."""

    class Settings:
        def __init__(self, power):
            self.power = power

    @dataclasses.dataclass(frozen=True)
    class Power:
        power: float

    calls = []

    def f(x, how):
        calls.append(1)
        return jnp.where(x > 0, x**how.power, 0.0)

    g = guard(f)
    x = jnp.asarray(X)
    with pytest.raises(TypeError, match="is a Settings.*static_argnums"):
        g(x, Settings(2.0))
    for power in (2.0, 3.0, 2.0):
        np.testing.assert_array_equal(g(x, Power(power)), f(x, Power(power)))
    assert len(calls) == 3 + 2  # three plain calls, two traces (2.0 hit the cache)


def test_non_jax_argument_to_guarded_jit_is_a_type_error():
    with pytest.raises(TypeError, match="str"):
        guarded_jit(moded)(X, "sqrt")


def test_numpy_object_array_is_a_type_error():
    with pytest.raises(TypeError, match="object"):
        guard(leaky)(np.array([1, "a"], dtype=object))


@pytest.mark.parametrize("bad", [3, "f", jnp.ones(2)], ids=["int", "str", "array"])
def test_guard_of_non_callable_is_a_type_error(bad):
    with pytest.raises(TypeError, match="callable"):
        guard(bad)
    with pytest.raises(TypeError, match="callable"):
        guarded_jit(bad)


def test_guarded_jit_rejects_unknown_keywords_by_name():
    with pytest.raises(TypeError, match="bogus"):
        guarded_jit(leaky, bogus=1)
    with pytest.raises(TypeError, match="bogus"):
        guarded_jit(bogus=1)


def test_errors_are_hlo_guard_errors_too():
    with pytest.raises(hlo_guard.HloGuardError):
        guard(3)


def test_decorator_forms():
    @guard
    def a(x):
        return leaky(x)

    @guard(static_argnums=1)
    def b(x, mode):
        return moded(x, mode)

    @guarded_jit(static_argnames="mode")
    def c(x, mode):
        return moded(x, mode)

    x = jnp.asarray(X)
    want = jax.grad(total(safe))(x)
    for fn in (a, lambda x: b(x, "sqrt"), lambda x: c(x, mode="sqrt")):
        np.testing.assert_allclose(jax.grad(total(fn))(x), want, rtol=1e-6)


def test_method_decoration():
    """``@guard`` on a method: ``self`` is an argument like any other, so (as with
    ``jax.jit``) it must be a pytree; here a registered dataclass."""

    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Model:
        scale: jax.Array

        @guard
        def __call__(self, x):
            return leaky(x) * self.scale

    m = Model(jnp.float32(2.0))
    np.testing.assert_allclose(
        jax.grad(total(m))(jnp.asarray(X)), 2.0 * jax.grad(total(safe))(jnp.asarray(X)), rtol=1e-6
    )


def test_method_with_non_pytree_self_holding_arrays_names_the_problem():
    """Its arrays would become constants of the trace (no derivative): refused."""

    class Plain:
        def __init__(self):
            self.scale = jnp.float32(2.0)

        @guard
        def __call__(self, x):
            return leaky(x) * self.scale

    with pytest.raises(TypeError, match="is a Plain.*register its class"):
        Plain()(X)


def test_method_with_non_pytree_self_without_arrays_is_static():
    """A ``self`` with no arrays is a static leaf (as ``eqx.filter_jit`` treats
    it): same values and gradient as the unguarded method's double where."""

    class Plain:
        @guard
        def __call__(self, x):
            return leaky(x)

    x = jnp.asarray(X)
    np.testing.assert_array_equal(Plain()(x), leaky(x))
    np.testing.assert_allclose(
        jax.grad(lambda v: jnp.sum(Plain()(v)))(x), jax.grad(total(safe))(x), rtol=1e-6
    )


def test_python_bool_argument_is_a_static_flag():
    """A Python bool is a flag the function branches on in Python: static, so
    ``if flag`` works (traced, it raised TracerBoolConversionError); each value
    gets its own trace.  Oracle: the plain function with the double where."""

    def f(x, use_sqrt):
        if use_sqrt:
            return jnp.where(x > 0, jnp.sqrt(x), 0.0)
        return jnp.where(x > 0, jnp.log(x), 0.0)

    def oracle(x, use_sqrt):
        safe = jnp.where(x > 0, x, 1.0)
        return jnp.where(x > 0, jnp.sqrt(safe) if use_sqrt else jnp.log(safe), 0.0)

    x = jnp.asarray(X)
    for flag in (True, False):
        np.testing.assert_array_equal(guard(f)(x, flag), f(x, flag))
        got = jax.grad(lambda v, flag=flag: jnp.sum(guard(f)(v, flag)))(x)
        want = jax.grad(lambda v, flag=flag: jnp.sum(oracle(v, flag)))(x)
        np.testing.assert_array_equal(got, want)
