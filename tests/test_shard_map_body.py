"""``guard(f)`` used *inside* a ``shard_map`` body (``check_vma=True``, the default).

Inside the body every value's type says which manual mesh axes it varies
over.  ``f`` must be traced with those types (otherwise ``x > 0`` records no
``pvary`` of the literal and re-binding it on a varying ``x`` fails with
"Primitive gt requires varying manual axes to match"), and masks must have
the type of the value they guard.  Gradients are compared with the
hand-written double-where run in the same ``shard_map`` without any guard.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from hlo_guard import guard

pytestmark = pytest.mark.skipif(
    jax.device_count() < 8, reason="needs XLA_FLAGS=--xla_force_host_platform_device_count=8"
)


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((8,), ("i",), axis_types=(AxisType.Auto,))


def _smap(mesh, body, in_specs, out_specs=None):
    out_specs = P() if out_specs is None else out_specs
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


XS = jnp.array(
    [-2.0, 0.0, 1.0, 4.0, 0.0, 9.0, -1.0, 2.0, 3.0, 0.0, 0.0, -5.0, 16.0, 0.25, 0.0, 1.0]
)


def test_where_sqrt_on_sharded_values(mesh):
    def f(x):
        return jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))

    def oracle(x):
        return jnp.sum(jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0))

    def total(inner):
        return _smap(mesh, lambda x: jax.lax.psum(inner(x), "i"), (P("i"),))

    assert np.isnan(jax.grad(total(f))(XS)).any()  # the problem is real
    np.testing.assert_array_equal(total(guard(f))(XS), total(f)(XS))
    np.testing.assert_array_equal(jax.grad(total(guard(f)))(XS), jax.grad(total(oracle))(XS))
    np.testing.assert_array_equal(
        jax.jit(jax.grad(total(guard(f))))(XS), jax.grad(total(oracle))(XS)
    )


def test_static_mask_from_slicing_in_the_body(mesh):
    def f(x):
        return jnp.sum(jnp.sqrt(x)[1:])

    def oracle(x):
        return jnp.sum(jnp.sqrt(x[1:]))

    def total(inner):
        return _smap(mesh, lambda x: jax.lax.psum(inner(x), "i"), (P("i"),))

    xs = XS.at[::2].set(0.0)
    np.testing.assert_array_equal(jax.grad(total(guard(f)))(xs), jax.grad(total(oracle))(xs))


def test_replicated_parameter_used_with_sharded_data(mesh):
    """``w`` is invariant (replicated), ``x`` varies: ``log(w)`` is computed
    once per device and ``pvary``-ed; its lanes are live where ``x > 0`` on
    *any* device, and the cotangent of ``w`` is a ``psum`` over devices."""

    def f(w, x):
        return jnp.sum(jnp.where(x > 0, jnp.log(w) * x, 0.0))

    def oracle(w, x):
        return jnp.sum(jnp.where(x > 0, jnp.log(jnp.where(x > 0, w, 1.0)) * x, 0.0))

    def total(inner):
        return _smap(mesh, lambda w, x: jax.lax.psum(inner(w, x), "i"), (P(), P("i")))

    x = jnp.tile(jnp.array([1.0, -1.0]), 8)  # lane 1 dead on every device
    w = jnp.array([2.0, 0.0])
    assert np.isnan(jax.grad(total(f))(w, x)).any()
    for got, want in zip(
        jax.grad(total(guard(f)), argnums=(0, 1))(w, x),
        jax.grad(total(oracle), argnums=(0, 1))(w, x),
    ):
        np.testing.assert_array_equal(got, want)
    x2 = x.at[3].set(5.0)  # lane 1 live on one device only
    w2 = jnp.array([2.0, 3.0])
    np.testing.assert_allclose(
        jax.grad(total(guard(f)))(w2, x2), jax.grad(total(oracle))(w2, x2), rtol=1e-6
    )


def test_maximum_in_the_body(mesh):
    """The losing side of ``maximum``: a static-free, per-device mask."""

    def f(x):
        return jnp.sum(jnp.maximum(jnp.sqrt(x), 1.0))

    def oracle_grad(x):  # per lane: d/dx sqrt(x) where sqrt(x) wins, else 0
        return np.where(np.sqrt(x) > 1.0, 0.5 / np.sqrt(np.where(x > 0, x, 1.0)), 0.0)

    def total(inner):
        return _smap(mesh, lambda x: jax.lax.psum(inner(x), "i"), (P("i"),))

    xs = jnp.abs(XS).at[2].set(1.5).at[6].set(0.64).at[15].set(0.5)  # no ties at sqrt(x) == 1
    assert np.isnan(jax.grad(total(f))(xs)).any()
    np.testing.assert_allclose(
        jax.grad(total(guard(f)))(xs), oracle_grad(np.asarray(xs)), rtol=1e-6
    )
    np.testing.assert_array_equal(total(guard(f))(xs), total(f)(xs))


def test_sharded_input_under_set_mesh():
    """The user's own setup (issue 9, item 3): a ``NamedSharding``-placed input,
    the mesh set with ``jax.set_mesh`` and ``make_mesh``'s default axis types,
    ``guard`` applied to the body function before ``shard_map`` sees it."""
    default_mesh = jax.make_mesh((8,), ("i",))

    def local(v):
        return jnp.sum(jnp.where(v > 0, jnp.sqrt(v), 0.0))

    def local_double_where(v):
        safe = jnp.where(v > 0, v, 1.0)
        return jnp.sum(jnp.where(v > 0, jnp.sqrt(safe), 0.0))

    def sharded(body):
        return jax.shard_map(
            lambda v: jax.lax.psum(body(v), "i"), mesh=default_mesh, in_specs=P("i"), out_specs=P()
        )

    f, oracle, plain = sharded(guard(local)), sharded(local_double_where), sharded(local)
    x = jax.device_put(jnp.arange(-8.0, 8.0) / 4.0, jax.NamedSharding(default_mesh, P("i")))
    with jax.set_mesh(default_mesh):
        np.testing.assert_array_equal(f(x), plain(x))
        want = jax.grad(oracle)(x)
        assert np.all(np.isfinite(want))
        # the oracle's sqrt reads `safe`, not `x`: XLA may fuse it 1 ulp apart
        for got in (jax.grad(f)(x), jax.jit(jax.grad(f))(x)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
            np.testing.assert_array_equal(np.asarray(got)[:9], 0.0)  # dead lanes and x == 0


@pytest.mark.parametrize("mode", ["grad", "jacfwd"])
def test_relu_before_a_singular_op(mesh, mode):
    """``relu`` is a ``custom_jvp``: its rule is probed for its tangent masks
    with a probe tangent that must vary over the body's manual axes as the
    operand does (it did not: "select_n requires varying manual axes to
    match", a crash of ``guard`` in every such body)."""

    def f(x):
        return jnp.sum(jnp.sqrt(jax.nn.relu(x)) * x)

    def oracle(x):
        pos = x > 0
        return jnp.sum(jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0) * x)

    d = {"grad": jax.grad, "jacfwd": jax.jacfwd}[mode]
    xs = XS.at[1].set(-0.5).at[4].set(0.7).at[9].set(-3.0).at[10].set(2.5).at[14].set(-1.0)

    def run(fn):
        return jax.jit(_smap(mesh, lambda x: d(fn)(x), (P("i"),), P("i")))(xs)

    np.testing.assert_allclose(run(guard(f)), run(oracle), rtol=1e-6)
