"""Eager ``guard(f)(x)`` is bitwise eager ``f(x)``, values and gradients
(issue 9, item 6), on the real library code where differences were seen.

Eager JAX runs each ``jit(inline=True)`` call (``jnp.mean``, every ``jnp``
ufunc) as one compiled computation, whose simplifier rounds differently from
the same equations dispatched one by one.  The guard keeps those calls in its
trace and re-binds them, so it runs what eager ``f`` runs.  Gradients: the
broadcast-operand guard differentiates the operation with JAX's own rule at
the unbroadcast operands, so the same kernels run.  The oracle is plain eager
JAX itself, compared by bytes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard
from hlo_guard.jax_frontend.compat import jit_inlines

optax = pytest.importorskip("optax")
dist = pytest.importorskip("numpyro.distributions")


def same_bits(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape
        assert x.tobytes() == y.tobytes(), (x, y)


# shapes and scales at which the guarded value was 1 ulp off before
RMS_CASES = [((7,), 1e-3), ((100,), 1.0), ((2, 100), 1.0), ((100,), 1e3), ((2, 1000), 1e3)]


@pytest.mark.parametrize("shape,scale", RMS_CASES)
def test_optax_safe_root_mean_squares_value_and_grad(shape, scale):
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)
    f = lambda x: optax.safe_root_mean_squares(x, 1e-6)  # noqa: E731
    g = hlo_guard.guard(f)
    same_bits(g(x), f(x))
    same_bits(jax.grad(g)(x), jax.grad(f)(x))


def test_optax_safe_root_mean_squares_below_min_rms_is_still_finite():
    f = lambda x: optax.safe_root_mean_squares(x, 1e-6)  # noqa: E731
    x = jnp.zeros(5, jnp.float32)
    g = hlo_guard.guard(f)
    same_bits(g(x), f(x))
    same_bits(jax.grad(g)(x), jax.grad(f)(x))  # optax's own double-where: both 0


def left_truncated_normal(loc, scale, low, x):
    return dist.LeftTruncatedDistribution(dist.Normal(loc, scale), low=low).log_prob(x).sum()


def left_truncated_gamma(conc, rate, low, x):
    return dist.LeftTruncatedGamma(dist.Gamma(conc, rate), low=low).log_prob(x).sum()


@pytest.mark.parametrize("fn", [left_truncated_normal, left_truncated_gamma])
@pytest.mark.parametrize("a,b,low", [(0.3, 1.0, 0.5), (2.0, 1.3, 1.0), (7.3, 0.5, 3.0)])
def test_numpyro_left_truncated_log_prob_value_and_grads(fn, a, b, low, request):
    if (fn, a) == (left_truncated_normal, 2.0) and jax.__version_info__ >= (0, 12):
        # Known, not yet explained (bitwise on 0.10.2 and 0.11.2): on jax 0.12 the eager d/dscale of this case is
        # 2 ulp from plain eager (23.516403 vs 23.516401); the same happens for
        # plain Normal.log_prob, which has no dead lane, so it comes from
        # re-binding the trace, not from a guard.  Values stay bitwise.
        request.applymarker(
            pytest.mark.xfail(strict=True, reason="jax>=0.12: d/dscale 2 ulp from plain eager")
        )
    args = [
        jnp.float32(a),
        jnp.float32(b),
        jnp.float32(low),
        jnp.array([3.5, 4.0, 9.0], jnp.float32),
    ]
    g = hlo_guard.guard(fn)
    same_bits(g(*args), fn(*args))
    argnums = (0, 1, 2, 3)
    same_bits(jax.grad(g, argnums)(*args), jax.grad(fn, argnums)(*args))


SUBNORMAL = float(np.nextafter(np.float32(0), np.float32(1)))


@pytest.mark.parametrize(
    "f", [lambda x: jnp.mean(x, keepdims=True), lambda x: x / 1.0], ids=["mean", "div"]
)
def test_eager_forward_is_bitwise_on_subnormals_through_inline_jits(f):
    """Formerly a strict xfail: ``jnp.mean`` is an inline jit, one XLA
    computation in eager JAX (``x / 1`` simplified away, the subnormal kept);
    the guard re-bound its equations one by one and the lone ``div`` flushed
    it.  (Inputs are JAX arrays: with a numpy array, eager ``x / 1.0`` is
    numpy's division, not JAX's.)"""
    x = jnp.asarray([SUBNORMAL], jnp.float32)
    same_bits(hlo_guard.guarded_jit(f)(x), jax.jit(f)(x))
    same_bits(hlo_guard.guard(f)(x), f(x))


def test_inline_jits_stay_calls_at_the_top_level_only():
    """The trace keeps ``f``'s own inline jit calls (what eager ``f`` runs as one
    computation each); inside a jit of the user's, they are inlined as usual."""
    f = lambda x: jnp.mean(x) + jax.jit(lambda y: jnp.mean(y))(x)  # noqa: E731
    program, _ = hlo_guard.guard(f).traced(jnp.ones(3))
    top = [
        (e.primitive.name, e.params.get("name"), jit_inlines(e.params))
        for e in program.closed_jaxpr.jaxpr.eqns
    ]
    assert ("jit", "_mean", True) in top
    (inner,) = [e for e in program.closed_jaxpr.jaxpr.eqns if e.params.get("name") == "<lambda>"]
    assert all(e.primitive.name != "jit" for e in inner.params["jaxpr"].jaxpr.eqns)
    # the user's make_jaxpr is untouched (inlined as JAX does)
    plain = jax.make_jaxpr(f)(jnp.ones(3))
    assert not any(jit_inlines(e.params) for e in plain.jaxpr.eqns if e.primitive.name == "jit")
