"""The public API: ``guard``, ``@guarded_jit``, their keywords, ``.lower()``,
wrong use, the trace cache and methods.

Gradients are checked against the known double-where values of the running
example ``where(x > 0, sqrt(x), 0)`` at ``[-1, 0, 1, 4]``: ``[0, 0, .5, .25]``.
"""

import dataclasses
import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard
from hlo_guard import guard, guarded_jit

X = jnp.array([-1.0, 0.0, 1.0, 4.0])
WANT = np.array([0.0, 0.0, 0.5, 0.25])


def where_sqrt(x):
    return jnp.where(x > 0, jnp.sqrt(x), 0.0)


def grad_of(fn, *args, argnums=0):
    return jax.grad(lambda *a: jnp.sum(fn(*a)), argnums=argnums)(*args)


def test_plain_jax_leaks():
    assert np.isnan(grad_of(where_sqrt, X)[:2]).all()


def test_guard_function_and_decorator():
    np.testing.assert_array_equal(grad_of(guard(where_sqrt), X), WANT)

    @guard
    def f(x):
        return jnp.where(x > 0, jnp.sqrt(x), 0.0)

    np.testing.assert_array_equal(grad_of(f, X), WANT)
    assert f.__name__ == "f"  # functools.wraps-like metadata

    @guard(static_argnums=1)
    def g(x, n):
        return jnp.where(x > 0, jnp.sqrt(x), 0.0) * n

    np.testing.assert_array_equal(grad_of(g, X, 3), 3 * WANT)


def test_guarded_jit_is_a_jax_jitted_function():
    @guarded_jit
    def f(x):
        return jnp.where(x > 0, jnp.sqrt(x), 0.0)

    np.testing.assert_array_equal(grad_of(f, X), WANT)
    np.testing.assert_array_equal(f(X), jax.jit(where_sqrt)(X))
    # JAX's own jitted-function surface
    for attr in ("lower", "trace", "eval_shape"):
        assert hasattr(f, attr)


def test_guarded_jit_static_argnums_and_argnames():
    calls = []

    @guarded_jit(static_argnums=(1,))
    def f(x, power):
        calls.append(power)
        return jnp.where(x > 0, jnp.sqrt(x), 0.0) ** power

    np.testing.assert_allclose(grad_of(f, X, 1), WANT)
    # d/dx sqrt(x)^2 = 1 on the live lanes, 0 on the dead ones
    np.testing.assert_allclose(grad_of(f, X, 2), [0.0, 0.0, 1.0, 1.0])

    @guarded_jit(static_argnames="mode")
    def g(x, *, mode):
        y = jnp.where(x > 0, jnp.sqrt(x), 0.0)
        return y if mode == "plain" else 2.0 * y

    np.testing.assert_array_equal(grad_of(lambda x: g(x, mode="double"), X), 2 * WANT)
    np.testing.assert_array_equal(grad_of(lambda x: g(x, mode="plain"), X), WANT)


JIT_KEYWORD_EXAMPLES = {
    "in_shardings": None,
    "out_shardings": None,
    "static_argnums": (1,),
    "static_argnames": ("scale",),
    "donate_argnums": (0,),
    "donate_argnames": ("x",),
    "keep_unused": True,
    "device": None,
    "backend": "cpu",
    "inline": True,
    "compiler_options": {},
}


def test_every_jit_keyword_is_covered_here():
    """If jax.jit grows a keyword, this list must grow with it."""
    names = set(inspect.signature(jax.jit).parameters) - {"fun"}
    assert names <= set(JIT_KEYWORD_EXAMPLES), names - set(JIT_KEYWORD_EXAMPLES)


@pytest.mark.parametrize("keyword", sorted(JIT_KEYWORD_EXAMPLES))
def test_every_jit_keyword_accepted(keyword):
    value = JIT_KEYWORD_EXAMPLES[keyword]
    if keyword not in inspect.signature(jax.jit).parameters:
        pytest.skip(f"this jax.jit has no {keyword}")

    def f(x, scale=1.0):
        return jnp.where(x > 0, jnp.sqrt(x), 0.0) * scale

    g = guarded_jit(f, **{keyword: value})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # donation is not implemented on CPU
        got = jax.grad(lambda x: jnp.sum(g(x, 2.0)))(jnp.array(X))
        np.testing.assert_array_equal(got, 2 * WANT)
        np.testing.assert_array_equal(g(jnp.array(X), 2.0), 2 * where_sqrt(X))


def test_lower_and_compile():
    f = guarded_jit(where_sqrt)
    lowered = f.lower(X)
    text = lowered.as_text()
    assert "sqrt" in text
    compiled = lowered.compile()
    np.testing.assert_array_equal(compiled(X), where_sqrt(X))
    # the gradient program lowers too, and keeps the guard's select
    grad_text = jax.jit(jax.grad(lambda x: jnp.sum(f(x)))).lower(X).as_text()
    assert "select" in grad_text


@pytest.mark.parametrize("bad", [3, "where_sqrt", jnp.ones(2)], ids=["int", "str", "array"])
def test_non_callable_is_a_type_error(bad):
    with pytest.raises(TypeError, match="callable"):
        guard(bad)
    with pytest.raises(TypeError, match="callable"):
        guarded_jit(bad)


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="static_argnumz"):
        guarded_jit(where_sqrt, static_argnumz=1)
    with pytest.raises(TypeError, match="bogus"):
        guarded_jit(bogus=True)  # decorator form fails early too
    with pytest.raises(TypeError):
        guard(where_sqrt, donate_argnums=0)  # guard is not jit


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(static_argnums=5),
        dict(static_argnums="x"),
        dict(static_argnums=(0.5,)),
        dict(static_argnames="nope"),
        dict(static_argnames=(1,)),
    ],
    ids=["out_of_range", "str_nums", "float_nums", "unknown_name", "int_name"],
)
def test_bad_static_arguments_are_type_errors(kwargs):
    def f(x, n=1):
        return x * n

    with pytest.raises(TypeError):
        guard(f, **kwargs)
    with pytest.raises(TypeError):
        guarded_jit(f, **kwargs)


def test_errors_are_hlo_guard_errors():
    with pytest.raises(hlo_guard.GuardUsageError):
        guard(42)
    assert issubclass(hlo_guard.GuardUsageError, TypeError)


def test_unhashable_static_argument_is_a_clear_error():
    g = guard(lambda x, opts: x * len(opts), static_argnums=1)
    with pytest.raises(TypeError, match="hashable"):
        g(1.0, [1, 2])


def test_object_holding_arrays_is_a_clear_error():
    """A non-pytree object with arrays inside: its arrays would get no derivative."""

    class Params:
        def __init__(self):
            self.w = jnp.ones(2)

    g = guard(lambda x, p: x * p.w)
    with pytest.raises(TypeError, match="is a Params.*register its class as a pytree"):
        g(1.0, Params())


def test_eager_calls_do_not_retrace():
    count = []

    def f(x):
        count.append(1)
        return jnp.where(x > 0, jnp.sqrt(x), 0.0)

    g = guard(f)
    for _ in range(3):
        g(X)
    assert len(count) == 1
    g(X + 1.0)  # same shape and dtype: cache hit
    assert len(count) == 1
    g(jnp.ones(7))  # new shape: one new trace
    assert len(count) == 2
    g(jnp.ones(7))
    assert len(count) == 2
    # gradients of the eager guarded function reuse the cached jaxpr too
    for _ in range(2):
        grad_of(g, X)
    assert len(count) == 2


def test_guarded_jit_traces_once():
    count = []

    @guarded_jit
    def f(x):
        count.append(1)
        return jnp.where(x > 0, jnp.sqrt(x), 0.0)

    for _ in range(3):
        f(X)
    assert len(count) == 1


def test_pytrees_in_and_out():
    @guard
    def f(params, x):
        y = jnp.where(x > params["t"], jnp.sqrt(x - params["t"]), 0.0)
        return {"y": y, "total": jnp.sum(y) * params["w"]}

    params = {"t": jnp.float32(0.0), "w": jnp.float32(2.0)}
    out = f(params, X)
    assert set(out) == {"y", "total"}
    gp, gx = jax.grad(lambda p, x: f(p, x)["total"], argnums=(0, 1))(params, X)
    np.testing.assert_allclose(gx, 2 * WANT)
    assert np.isfinite(gp["t"]) and np.isfinite(gp["w"])
    np.testing.assert_allclose(gp["t"], -2 * WANT.sum())


class Scaled:
    def __init__(self, s):
        self.s = s

    @guard(static_argnums=0)
    def __call__(self, x):
        return jnp.where(x > 0, jnp.sqrt(self.s * x), 0.0)

    def __hash__(self):
        return hash(self.s)

    def __eq__(self, other):
        return isinstance(other, Scaled) and other.s == self.s


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class PytreeModel:
    s: jax.Array

    @guard
    def apply(self, x):
        return jnp.where(x > 0, jnp.sqrt(self.s * x), 0.0)


def test_guard_as_method_decorator():
    m = Scaled(4.0)
    np.testing.assert_allclose(grad_of(m, X), 2 * WANT)  # d sqrt(4x) = 2 d sqrt(x)
    pm = PytreeModel(jnp.float32(4.0))
    np.testing.assert_allclose(grad_of(pm.apply, X), 2 * WANT)
    # the model's own parameter gets its gradient too, exactly 0 from dead lanes
    gs = jax.grad(lambda m: jnp.sum(m.apply(X))).__call__(pm).s
    assert np.isfinite(gs)
    np.testing.assert_allclose(gs, sum(0.5 * x / np.sqrt(4.0 * x) for x in (1.0, 4.0)), rtol=1e-6)


def test_repr_and_traced():
    g = guard(where_sqrt)
    assert "where_sqrt" in repr(g)
    prog, leaves = g.traced(X)
    assert len(leaves) == 1
    assert "sqrt" in str(prog.closed_jaxpr)


def sum_where_sqrt(x):
    return jnp.sum(where_sqrt(x))


@pytest.mark.parametrize(
    "wrap, inner",
    [
        (jax.grad, sum_where_sqrt),
        (jax.vmap, where_sqrt),
        (lambda g: jax.jit(jax.grad(g)), sum_where_sqrt),
    ],
    ids=["grad", "vmap", "jit-of-grad"],
)
def test_guard_of_a_transformed_guarded_function_is_that_function(wrap, inner):
    # jax.grad and jax.vmap copy the guarded function's attributes onto their
    # wrapper; the outer guard once merged them back and became guard(f)
    transformed = wrap(guard(inner))
    want = wrap(inner)(jnp.array([1.0, 4.0, 9.0, 16.0]))  # no dead lane: the plain values
    got = guard(transformed)(jnp.array([1.0, 4.0, 9.0, 16.0]))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert guard(transformed).fn is transformed


def test_guard_of_grad_of_guard_is_the_double_where_gradient():
    def double_where(x):
        return jnp.sum(jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0))

    got = guard(jax.grad(guard(sum_where_sqrt)))(X)
    np.testing.assert_array_equal(got, jax.grad(double_where)(X))


def test_guard_keeps_the_wrapped_functions_own_attributes():
    def f(x):
        return where_sqrt(x)

    f.unit = "metres"
    f.fn = "the user's, shadowed by the guard's own"
    g = guard(f)
    assert g.unit == "metres"
    assert g.fn is f
    assert g.__wrapped__ is f


def test_explain_of_a_transformed_guarded_function_explains_the_transformation():
    from hlo_guard.inspect.programs import as_guarded

    g = guard(sum_where_sqrt)
    assert as_guarded(guarded_jit(sum_where_sqrt)).fn is sum_where_sqrt
    assert as_guarded(jax.jit(g)) is g
    grad_fn = jax.grad(g)
    assert as_guarded(grad_fn).fn is grad_fn
    # the gradient's program, not the loss's: its output has the input's shape
    report = hlo_guard.explain(grad_fn, X)
    assert "f32[4]" in str(report).splitlines()[0] or "f32[4]" in str(report)
