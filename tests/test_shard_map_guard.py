"""guard(f) inside a jax.shard_map body with the default check_vma=True
(issue 9, item 3): the trace must carry the operands' varying manual axes, or
re-binding a comparison against a literal fails with 'Primitive gt requires
varying manual axes to match'."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from hlo_guard import guard

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 CPU devices")


def _local(v):
    return jnp.sum(jnp.where(v > 0, jnp.sqrt(v), 0.0))


def _local_double_where(v):
    safe = jnp.where(v > 0, v, 1.0)
    return jnp.sum(jnp.where(v > 0, jnp.sqrt(safe), 0.0))


def _sharded(local):
    mesh = jax.make_mesh((8,), ("i",))

    def f(x):
        return jax.shard_map(
            lambda v: jax.lax.psum(local(v), "i"), mesh=mesh, in_specs=P("i"), out_specs=P()
        )(x)

    return mesh, f


def test_guard_inside_shard_map_body_matches_double_where():
    mesh, f = _sharded(guard(_local))
    _, oracle = _sharded(_local_double_where)
    _, plain = _sharded(_local)
    x = jax.device_put(jnp.arange(-8.0, 8.0) / 4.0, jax.NamedSharding(mesh, P("i")))
    with jax.set_mesh(mesh):
        np.testing.assert_array_equal(f(x), plain(x))
        want = jax.grad(oracle)(x)
        assert np.all(np.isfinite(want))
        # the oracle's sqrt reads `safe`, not `x`: XLA may fuse it 1 ulp apart
        for got in (jax.grad(f)(x), jax.jit(jax.grad(f))(x)):
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
            np.testing.assert_array_equal(np.asarray(got)[:9], 0.0)  # dead lanes and x == 0
