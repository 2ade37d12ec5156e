"""The seed table of the issue: programs whose plain JAX gradient is NaN because
a dead lane's infinite local derivative meets a structurally zero cotangent.

Every guarded gradient is checked against an *independent* oracle -- the
hand-written double-where a careful user would write, or a per-lane Python
``if`` that only differentiates the branch actually taken -- never against
hlo_guard's own output.  Each case also asserts that plain JAX really gives a
non-finite gradient there, so the test shows the bug is real, and that the
forward value is bitwise the unguarded one.

A second group checks the other half of the contract: genuine singularities on
the *taken* path stay NaN/inf.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlo_guard import guard, guarded_jit

WRAPPERS = {
    "guard": guard,
    "guarded_jit": guarded_jit,
    "jit(guard)": lambda f: jax.jit(guard(f)),
}


@pytest.fixture(params=sorted(WRAPPERS))
def wrap(request):
    return WRAPPERS[request.param]


def summed(f):
    return lambda *a: jnp.sum(f(*a))


def assert_bitwise_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape and a.dtype == b.dtype
    assert a.tobytes() == b.tobytes(), (a, b)


def check_seed(wrap, f, oracle, args, argnums=0, expected=None, rtol=1e-6):
    """Guarded gradient == oracle gradient (finite); plain gradient not finite;
    forward values bitwise equal to the unguarded function."""
    plain_grad = jax.grad(summed(f), argnums=argnums)(*args)
    oracle_grad = jax.grad(summed(oracle), argnums=argnums)(*args)
    guarded_grad = jax.grad(summed(wrap(f)), argnums=argnums)(*args)
    plain_leaves = jax.tree_util.tree_leaves(plain_grad)
    assert not all(np.all(np.isfinite(g)) for g in plain_leaves), (
        "plain JAX should leak a NaN/inf here (otherwise the case tests nothing)"
    )
    for o, g in zip(
        jax.tree_util.tree_leaves(oracle_grad), jax.tree_util.tree_leaves(guarded_grad)
    ):
        assert np.all(np.isfinite(o)), "oracle itself is not finite: bad test design"
        np.testing.assert_allclose(g, o, rtol=rtol, atol=1e-7)
    if expected is not None:
        np.testing.assert_allclose(jax.tree_util.tree_leaves(guarded_grad)[0], expected, rtol=1e-6)
    assert_bitwise_equal(wrap(f)(*args), jax.jit(f)(*args) if wrap is not guard else f(*args))
    return guarded_grad


# -- the cases -----------------------------------------------------------------


def test_where_sqrt(wrap):
    f = lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0)
    oracle = lambda x: jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0)
    x = jnp.array([-1.0, 0.0, 1.0, 4.0])
    check_seed(wrap, f, oracle, (x,), expected=[0.0, 0.0, 0.5, 0.25])


def test_where_reciprocal(wrap):
    f = lambda x: jnp.where(x > 0, 1.0 / x, 1.0)
    oracle = lambda x: jnp.where(x > 0, 1.0 / jnp.where(x > 0, x, 1.0), 1.0)
    x = jnp.array([-1.0, 0.0, 2.0])
    check_seed(wrap, f, oracle, (x,), expected=[0.0, 0.0, -0.25])


def safe_distance(a, b):
    d2 = jnp.sum((a - b) ** 2)
    return jnp.where(d2 > 0, jnp.sqrt(d2), 0.0)


def safe_distance_oracle(a, b):
    d2 = jnp.sum((a - b) ** 2)
    return jnp.where(d2 > 0, jnp.sqrt(jnp.where(d2 > 0, d2, 1.0)), 0.0)


def test_safe_distance_identical_points(wrap):
    a = jnp.array([1.0, -2.0, 3.0])
    grads = check_seed(wrap, safe_distance, safe_distance_oracle, (a, a), argnums=(0, 1))
    for g in grads:
        np.testing.assert_array_equal(g, np.zeros(3))


def test_safe_distance_distinct_points_is_live(wrap):
    """The scalar condition is true: every lane is live and the gradient is the usual one."""
    a, b = jnp.array([3.0, 0.0]), jnp.array([0.0, 4.0])
    ga, gb = jax.grad(wrap(safe_distance), argnums=(0, 1))(a, b)
    np.testing.assert_allclose(ga, [0.6, -0.8], rtol=1e-6)
    np.testing.assert_allclose(gb, [-0.6, 0.8], rtol=1e-6)


def test_arctan2_under_where(wrap):
    f = lambda x: jnp.where(x > 0, jnp.arctan2(x, x), 0.0)
    oracle = lambda x: jnp.where(
        x > 0, jnp.arctan2(jnp.where(x > 0, x, 1.0), jnp.where(x > 0, x, 1.0)), 0.0
    )
    check_seed(wrap, f, oracle, (jnp.array([-1.0, 0.0, 2.0]),))


def test_indexing_a_literal_array(wrap):
    f = lambda x: jnp.array([0.0, 1.0 / x])[0]
    oracle = lambda x: 0.0 * x  # element 0 does not depend on x at all
    check_seed(wrap, f, oracle, (jnp.float32(0.0),), expected=0.0)


# -- two-disk intersection area ---------------------------------------------------


def lens_area(r1, r2, d):
    a1 = r1**2 * jnp.arccos((d**2 + r1**2 - r2**2) / (2 * d * r1))
    a2 = r2**2 * jnp.arccos((d**2 + r2**2 - r1**2) / (2 * d * r2))
    k = jnp.sqrt((-d + r1 + r2) * (d + r1 - r2) * (d - r1 + r2) * (d + r1 + r2))
    return a1 + a2 - 0.5 * k


def disk_intersection(r1, r2, d):
    """The classic formula with nested ``jnp.where`` (the way people write it)."""
    disjoint = d >= r1 + r2
    contained = d <= jnp.abs(r1 - r2)
    return jnp.where(
        disjoint, 0.0, jnp.where(contained, jnp.pi * jnp.minimum(r1, r2) ** 2, lens_area(r1, r2, d))
    )


def disk_intersection_oracle(r1, r2, d):
    """Hand-written double-where: the lens formula only ever sees a safe lens."""
    disjoint = d >= r1 + r2
    contained = d <= jnp.abs(r1 - r2)
    lens = ~disjoint & ~contained
    s1, s2, sd = (jnp.where(lens, r1, 1.0), jnp.where(lens, r2, 1.0), jnp.where(lens, d, 1.0))
    return jnp.where(
        disjoint,
        0.0,
        jnp.where(contained, jnp.pi * jnp.minimum(r1, r2) ** 2, lens_area(s1, s2, sd)),
    )


# disjoint, external tangency (arccos at +1), contained, internal tangency
# (arccos at -1 / +1), two lenses
DISKS = dict(
    r1=jnp.array([1.0, 1.0, 2.0, 2.0, 1.0, 1.5]),
    r2=jnp.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
    d=jnp.array([3.0, 2.0, 0.5, 1.0, 1.0, 1.2]),
)


def disk_per_lane_grad(r1, r2, d):
    """Per-lane Python ``if``: differentiate only the branch that is taken."""
    lambda a, b, c: math.pi * min(a, b) ** 2
    rows = []
    for a, b, c in zip(np.asarray(r1), np.asarray(r2), np.asarray(d)):
        a, b, c = float(a), float(b), float(c)
        if c >= a + b:
            rows.append((0.0, 0.0, 0.0))
        elif c <= abs(a - b):
            g = jax.grad(lambda a, b: jnp.pi * jnp.minimum(a, b) ** 2, (0, 1))(a, b)
            rows.append((float(g[0]), float(g[1]), 0.0))
        else:
            g = jax.grad(lens_area, (0, 1, 2))(a, b, c)
            rows.append(tuple(float(v) for v in g))
    return np.array(rows).T


def test_disk_intersection(wrap):
    args = (DISKS["r1"], DISKS["r2"], DISKS["d"])
    grads = check_seed(
        wrap, disk_intersection, disk_intersection_oracle, args, argnums=(0, 1, 2), rtol=1e-5
    )
    per_lane = disk_per_lane_grad(*args)
    for g, want in zip(grads, per_lane):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)


def test_disk_intersection_values_unchanged(wrap):
    args = (DISKS["r1"], DISKS["r2"], DISKS["d"])
    area = np.asarray(wrap(disk_intersection)(*args))
    np.testing.assert_allclose(area[:4], [0.0, 0.0, np.pi, np.pi], rtol=1e-6)
    assert np.all(area[4:] > 0) and np.all(np.isfinite(area))


# -- overflow, infinities, selections --------------------------------------------


def test_naive_softplus_at_100(wrap):
    f = lambda x: jnp.where(x > 20, x, jnp.log1p(jnp.exp(x)))
    oracle = lambda x: jnp.where(x > 20, x, jnp.log1p(jnp.exp(jnp.where(x > 20, 0.0, x))))
    x = jnp.array([100.0, 0.0, -3.0])
    check_seed(wrap, f, oracle, (x,), expected=[1.0, 0.5, 1 / (1 + math.exp(3.0))])


def test_where_isfinite_at_inf(wrap):
    f = lambda x: jnp.where(jnp.isfinite(x), x**2, 0.0)
    oracle = lambda x: jnp.where(jnp.isfinite(x), jnp.where(jnp.isfinite(x), x, 0.0) ** 2, 0.0)
    x = jnp.array([jnp.inf, 2.0, -jnp.inf, jnp.nan])
    check_seed(wrap, f, oracle, (x,), expected=[0.0, 4.0, 0.0, 0.0])


def test_max_of_sqrt(wrap):
    f = lambda x: jnp.max(jnp.sqrt(x))

    def oracle(x):
        is_max = x == jnp.max(x)  # sqrt is monotone: same lanes win
        return jnp.max(jnp.where(is_max, jnp.sqrt(jnp.where(is_max, x, 1.0)), -jnp.inf))

    check_seed(wrap, f, oracle, (jnp.array([0.0, 1.0, 4.0]),), expected=[0.0, 0.0, 0.25])


def test_arccos_of_clip_outside(wrap):
    f = lambda c: jnp.arccos(jnp.clip(c, -1.0, 1.0))

    def oracle(c):
        inside = (c > -1.0) & (c < 1.0)
        return jnp.where(
            inside, jnp.arccos(jnp.where(inside, c, 0.0)), jnp.where(c >= 1.0, 0.0, jnp.pi)
        )

    c = jnp.array([1.5, -1.5, 0.3])
    check_seed(wrap, f, oracle, (c,), expected=[0.0, 0.0, -1 / math.sqrt(1 - 0.09)])


def test_maximum_log_forward_stays_minus_five(wrap):
    f = lambda x: jnp.maximum(jnp.log(x), -5.0)
    g = wrap(f)
    assert_bitwise_equal(g(1e-3), f(1e-3))
    assert float(g(1e-3)) == -5.0
    assert float(jax.grad(g)(1e-3)) == 0.0
    # at 0 the loser's derivative is infinite: plain JAX leaks NaN
    oracle = lambda x: jnp.maximum(jnp.log(jnp.where(jnp.log(x) > -5.0, x, 1.0)), -5.0)
    x = jnp.array([0.0, 1e-3, 1.0])
    check_seed(wrap, f, oracle, (x,), expected=[0.0, 0.0, 1.0])


def test_dead_xlogy(wrap):
    f = lambda x: jnp.where(x > 0, jax.scipy.special.xlogy(x, x), 0.0)
    oracle = lambda x: jnp.where(
        x > 0, jax.scipy.special.xlogy(jnp.where(x > 0, x, 1.0), jnp.where(x > 0, x, 1.0)), 0.0
    )
    x = jnp.array([0.0, 1.0, 2.0])
    check_seed(wrap, f, oracle, (x,), expected=[0.0, 1.0, 1.0 + math.log(2.0)])


@jax.custom_vjp
def vjp_sqrt(x):
    return jnp.sqrt(x)


def _vjp_sqrt_fwd(x):
    y = jnp.sqrt(x)
    return y, y


def _vjp_sqrt_bwd(y, g):  # a plain Python backward: 0 / 0 at x = 0
    return (g / (2.0 * y),)


vjp_sqrt.defvjp(_vjp_sqrt_fwd, _vjp_sqrt_bwd)


@jax.custom_jvp
def jvp_sqrt(x):
    return jnp.sqrt(x)


@jvp_sqrt.defjvp
def _jvp_sqrt_rule(primals, tangents):
    y = jnp.sqrt(primals[0])
    return y, tangents[0] / (2.0 * y)


@pytest.mark.parametrize("custom", [vjp_sqrt, jvp_sqrt], ids=["custom_vjp", "custom_jvp"])
def test_dead_custom_derivative_sqrt(wrap, custom):
    f = lambda x: jnp.where(x > 0, custom(x), 0.0)
    oracle = lambda x: jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0)
    check_seed(wrap, f, oracle, (jnp.array([0.0, 1.0, 4.0]),), expected=[0.0, 0.5, 0.25])


# -- genuine singularities stay visible --------------------------------------------


def test_genuine_sqrt_squared_stays_nan(wrap):
    g = jax.grad(wrap(lambda x: jnp.sqrt(x) ** 2))(0.0)
    assert np.isnan(g)


def test_genuine_where_ge_stays_inf(wrap):
    f = lambda x: jnp.where(x >= 0, jnp.sqrt(x), 0.0)
    g = jax.grad(wrap(f))(0.0)
    assert np.isposinf(g)
    gv = jax.grad(summed(wrap(f)))(jnp.array([-1.0, 0.0, 4.0]))
    assert gv[0] == 0.0 and np.isposinf(gv[1]) and gv[2] == 0.25


def test_genuine_clip_boundary_stays_inf(wrap):
    """At c == 1 jnp.clip ties (JAX gives the tie half the tangent), so the
    taken path really carries arccos'(1) = -inf."""
    f = lambda c: jnp.arccos(jnp.clip(c, -1.0, 1.0))
    assert np.isneginf(jax.grad(wrap(f))(1.0))
    assert np.isneginf(jax.grad(f)(1.0))


def test_genuine_nan_input_on_taken_lane(wrap):
    f = lambda x: jnp.where(x > 0, x**2, 0.0)
    g = jax.grad(summed(wrap(f)))(jnp.array([1.0, jnp.inf]))
    assert g[0] == 2.0 and np.isposinf(g[1])


# -- masked reductions (attention-style masking) --------------------------------------

MASK = jnp.array([False, True, True, True])
XM = jnp.array([0.0, 1.0, 2.0, 3.0])


def test_masked_logsumexp(wrap):
    f = lambda x: jax.nn.logsumexp(jnp.where(MASK, jnp.log(x), -jnp.inf))
    oracle = lambda x: jax.nn.logsumexp(jnp.where(MASK, jnp.log(jnp.where(MASK, x, 1.0)), -jnp.inf))
    check_seed(wrap, f, oracle, (XM,), expected=[0.0, 1 / 6, 1 / 6, 1 / 6])


def test_masked_softmax(wrap):
    w = jnp.array([1.0, 2.0, -1.0, 0.5])
    f = lambda x: jax.nn.softmax(jnp.where(MASK, jnp.log(x), -jnp.inf)) * w
    oracle = lambda x: (
        jax.nn.softmax(jnp.where(MASK, jnp.log(jnp.where(MASK, x, 1.0)), -jnp.inf)) * w
    )
    check_seed(wrap, f, oracle, (XM,), rtol=1e-5)
