"""Scale: sharded ``guarded_jit`` on an 8-device CPU mesh, ``shard_map`` bodies,
and programs of tens of thousands of equations.

The 8 devices come from ``--xla_force_host_platform_device_count=8`` (set by
the Makefile and by ``tests/conftest.py`` before JAX is imported).  Oracles: the
same computation on one device, written with the hand-made double ``where``.
"""

from __future__ import annotations

import resource
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import hlo_guard
from hlo_guard.jax_frontend.surgery import spliced_program

needs_8 = pytest.mark.skipif(
    len(jax.devices()) < 8,
    reason="needs 8 devices: run with XLA_FLAGS=--xla_force_host_platform_device_count=8 "
    "(tests/conftest.py sets it unless XLA_FLAGS was already set)",
)


def mesh_2d():
    return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


def layer(x, w):
    """Dead lanes everywhere: where-sqrt, a clipped log, a max-reduction."""
    h = x @ w
    a = jnp.where(h > 0, jnp.sqrt(h), 0.0)
    b = jnp.clip(jnp.log(jnp.abs(h)), -3.0, 3.0)
    return a + b, jnp.max(a, axis=1)


def layer_oracle(x, w):
    h = x @ w
    pos = h > 0
    a = jnp.where(pos, jnp.sqrt(jnp.where(pos, h, 1.0)), 0.0)
    logh = jnp.log(jnp.abs(h))
    inside = (logh > -3.0) & (logh < 3.0)
    b = jnp.where(
        inside, jnp.log(jnp.abs(jnp.where(inside, h, 1.0))), jnp.where(logh >= 3.0, 3.0, -3.0)
    )
    return a + b, jnp.max(a, axis=1)


def scalar_loss(fn):
    def loss(x, w):
        y, m = fn(x, w)
        return jnp.sum(y) + jnp.sum(m)

    return loss


def inputs():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4)).astype(np.float32)
    x[0, :] = 0.0  # rows of exact zeros: sqrt'(0) and log'(0) in dead lanes
    w = rng.normal(size=(4, 6)).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(w)


@needs_8
def test_sharded_guarded_jit_matches_one_device():
    mesh = mesh_2d()
    xs = NamedSharding(mesh, P("data", None))
    ws = NamedSharding(mesh, P(None, "model"))
    ys, ms = NamedSharding(mesh, P("data", "model")), NamedSharding(mesh, P("data"))
    x, w = inputs()
    sharded = hlo_guard.guarded_jit(layer, in_shardings=(xs, ws), out_shardings=(ys, ms))
    xd, wd = jax.device_put(x, xs), jax.device_put(w, ws)

    y, m = sharded(xd, wd)
    # bitwise the unguarded program with the same shardings ...
    yp, mp = jax.jit(layer, in_shardings=(xs, ws), out_shardings=(ys, ms))(xd, wd)
    np.testing.assert_array_equal(y, yp)
    np.testing.assert_array_equal(m, mp)
    # ... and one device up to the matmul's summation order
    y1, m1 = jax.jit(layer)(x, w)
    np.testing.assert_allclose(y, y1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(m, m1, rtol=1e-5, atol=1e-6)
    assert y.sharding.is_equivalent_to(ys, y.ndim)
    assert m.sharding.is_equivalent_to(ms, m.ndim)
    assert len(y.sharding.device_set) == 8

    gx, gw = jax.jit(jax.grad(scalar_loss(sharded), argnums=(0, 1)))(xd, wd)
    ox, ow = jax.grad(scalar_loss(layer_oracle), argnums=(0, 1))(x, w)
    np.testing.assert_allclose(gx, ox, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gw, ow, rtol=1e-5, atol=1e-6)
    assert np.isfinite(np.asarray(gx)).all() and np.isfinite(np.asarray(gw)).all()
    # and the unguarded program really leaks here
    px, _ = jax.grad(scalar_loss(layer), argnums=(0, 1))(x, w)
    assert not np.isfinite(np.asarray(px)).all()


@needs_8
def test_sharding_constraint_inside_guarded_function():
    mesh = mesh_2d()
    spec = NamedSharding(mesh, P("data", "model"))

    def f(x, w):
        h = jax.lax.with_sharding_constraint(x @ w, spec)
        return jnp.where(h > 0, jnp.sqrt(h), 0.0)

    def oracle(x, w):
        h = x @ w
        return jnp.where(h > 0, jnp.sqrt(jnp.where(h > 0, h, 1.0)), 0.0)

    x, w = inputs()
    out = hlo_guard.guarded_jit(f)(x, w)
    assert out.sharding.is_equivalent_to(spec, out.ndim)
    np.testing.assert_allclose(out, oracle(x, w), rtol=1e-6)
    g = jax.grad(lambda x, w: jnp.sum(hlo_guard.guarded_jit(f)(x, w)), argnums=(0, 1))(x, w)
    o = jax.grad(lambda x, w: jnp.sum(oracle(x, w)), argnums=(0, 1))(x, w)
    for a, b in zip(g, o):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# -- shard_map ---------------------------------------------------------------------


def _shard_map(body, mesh, in_specs, out_specs):
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


@needs_8
def test_shard_map_body_with_dead_lanes():
    """A ``where`` *inside* the body.  Forward must be exact; the derivative must be
    the oracle's where plain JAX's is finite and never have more non-finite lanes
    than plain JAX (conservative treatment of an opaque primitive is allowed)."""
    mesh = Mesh(np.array(jax.devices()[:8]), ("i",))
    body = lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0)  # noqa: E731
    f = _shard_map(body, mesh, P("i"), P("i"))
    oracle = lambda x: jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0)  # noqa
    x = jnp.asarray(np.linspace(-2.0, 2.0, 16).astype(np.float32)).at[3].set(0.0)

    for wrap in (hlo_guard.guard, hlo_guard.guarded_jit):
        out = wrap(f)(x)
        np.testing.assert_array_equal(out, jax.jit(f)(x))
        got = np.asarray(jax.grad(lambda x: jnp.sum(wrap(f)(x)))(x))
        plain = np.asarray(jax.grad(lambda x: jnp.sum(f(x)))(x))
        want = np.asarray(jax.grad(lambda x: jnp.sum(oracle(x)))(x))
        finite = np.isfinite(plain)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6)
        assert not (np.isfinite(plain) & ~np.isfinite(got)).any()
        # the body is guarded inside the shard_map: the leak is gone everywhere
        assert not finite.all(), "the test must exercise a leak in plain JAX"
        np.testing.assert_allclose(got, want, rtol=1e-6)


@needs_8
def test_shard_map_output_selected_outside():
    """Lanes of a shard_map *output* killed by a ``where`` outside: the pass can
    guard at the boundary (the body's own ops are inside the opaque call)."""
    mesh = Mesh(np.array(jax.devices()[:8]), ("i",))
    body = lambda x: jnp.log(x)  # noqa: E731
    sm = _shard_map(body, mesh, P("i"), P("i"))
    f = lambda x: jnp.where(x > 0, sm(x), 0.0)  # noqa: E731
    oracle = lambda x: jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), 0.0)  # noqa
    x = jnp.asarray(np.linspace(-2.0, 2.0, 16).astype(np.float32)).at[3].set(0.0)
    out = hlo_guard.guarded_jit(f)(x)
    np.testing.assert_array_equal(out, jax.jit(f)(x))
    got = np.asarray(jax.grad(lambda x: jnp.sum(hlo_guard.guarded_jit(f)(x)))(x))
    plain = np.asarray(jax.grad(lambda x: jnp.sum(f(x)))(x))
    want = np.asarray(jax.grad(lambda x: jnp.sum(oracle(x)))(x))
    finite = np.isfinite(plain)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6)
    assert not (np.isfinite(plain) & ~np.isfinite(got)).any()


# -- many equations ------------------------------------------------------------------

EQNS_PER_STEP = 5


def chain(x, steps):
    """``steps`` dependent selections, 5 equations each; every step kills lanes
    whose sqrt input may be 0 or negative (abs then sqrt, select, mul, gt)."""
    for _ in range(steps):
        r = lax.sqrt(lax.abs(x))
        x = lax.select(x > 0.5, r, x * 0.9)
    return x


def chain_oracle(x, steps):
    for _ in range(steps):
        live = x > 0.5
        r = lax.sqrt(lax.abs(jnp.where(live, x, 1.0)))
        x = jnp.where(live, r, x * 0.9)
    return x


def test_long_chain_is_exact():
    """The same construction at a size that compiles quickly: values and grads."""
    x = jnp.asarray([-1.0, 0.0, 0.25, 0.5, 0.6, 1.0, 4.0, 1e30], jnp.float32)
    f = lambda x: chain(x, 200)  # noqa: E731
    g = hlo_guard.guarded_jit(f)
    np.testing.assert_array_equal(g(x), jax.jit(f)(x))
    got = jax.jit(jax.grad(lambda x: jnp.sum(g(x))))(x)
    want = jax.jit(jax.grad(lambda x: jnp.sum(chain_oracle(x, 200))))(x)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _trace_and_guard(n_eqns, limit_s):
    steps = n_eqns // EQNS_PER_STEP
    f = lambda x: chain(x, steps)  # noqa: E731
    x = jax.ShapeDtypeStruct((8,), jnp.float32)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    guarded = hlo_guard.guard(f)
    program, _ = guarded.traced(jnp.zeros((8,), jnp.float32))
    t_analyze = time.perf_counter() - t0
    assert len(program.closed_jaxpr.jaxpr.eqns) == steps * EQNS_PER_STEP
    out = jax.make_jaxpr(guarded)(x)  # the guarded re-evaluation, traced
    elapsed = time.perf_counter() - t0
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    n_guarded = len(spliced_program(out).jaxpr.eqns)
    sys.stderr.write(
        f"[scale] {steps * EQNS_PER_STEP} eqns: trace+analyse {t_analyze:.1f}s, "
        f"+guarded trace {elapsed:.1f}s total, {n_guarded} guarded eqns, "
        f"peak RSS +{grown_mb:.0f} MB\n"
    )
    assert n_guarded >= steps * EQNS_PER_STEP  # guards were actually inserted
    assert elapsed < limit_s, f"{elapsed:.0f}s for {n_eqns} equations"
    assert grown_mb < 3000, f"peak RSS grew by {grown_mb:.0f} MB"


def test_20k_equations_guarded_without_blowing_up():
    _trace_and_guard(20_000, limit_s=240)


@pytest.mark.slow
def test_100k_equations_guarded_without_blowing_up():
    _trace_and_guard(100_000, limit_s=1200)
