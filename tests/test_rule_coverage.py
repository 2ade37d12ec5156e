"""Identity-like primitives keep the guards on both sides of them.

(The rule table against the installed JAX's primitives -- stale names, and
every user-facing primitive ruled or conservative on purpose -- is checked in
``test_rule_coverage_tables.py``, against ``rules/coverage.py``.)

* identity-like primitives (``device_put``, ``sharding_constraint``,
  ``optimization_barrier``, ``checkpoint_name`` ...) pass masks through: one of
  them between a ``sqrt`` and its ``where`` must not switch the guard off.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import checkpoint_name

from hlo_guard import explain, guard


def _double_where(x):
    safe = jnp.where(x > 0, x, 1.0)
    return jnp.sum(jnp.where(x > 0, jnp.sqrt(safe), 0.0))


_SINGLE = jax.sharding.SingleDeviceSharding(jax.devices()[0])

IDENTITIES = {
    "device_put": lambda v: jax.device_put(v),
    "device_put_to_device": lambda v: jax.device_put(v, jax.devices()[0]),
    "sharding_constraint": lambda v: jax.lax.with_sharding_constraint(v, _SINGLE),
    "optimization_barrier": lambda v: jax.lax.optimization_barrier(v),
    "checkpoint_name": lambda v: checkpoint_name(v, "s"),
    "copy": lambda v: jax.lax.copy_p.bind(v),
}


@pytest.mark.parametrize("ident", sorted(IDENTITIES))
def test_identity_between_sqrt_and_where_keeps_the_guard(ident):
    wrap = IDENTITIES[ident]

    def f(x):
        s = wrap(jnp.sqrt(x))
        return jnp.sum(jnp.where(x > 0, s, 0.0))

    x = jnp.array([-1.0, 0.0, 4.0, 2.25])
    np.testing.assert_array_equal(guard(f)(x), f(x))
    np.testing.assert_array_equal(jax.grad(guard(f))(x), jax.grad(_double_where)(x))
    np.testing.assert_array_equal(jax.jit(jax.grad(guard(f)))(x), jax.grad(_double_where)(x))
    assert not explain(f, x).unguarded


def test_optimization_barrier_of_several_values_maps_each_to_its_own():
    def f(x, y):
        a, b = jax.lax.optimization_barrier((jnp.sqrt(x), jnp.log(y)))
        return jnp.sum(jnp.where(x > 0, a, 0.0)) + jnp.sum(jnp.where(y > 0, b, 0.0)[:2])

    def oracle(x, y):
        sx = jnp.where(x > 0, x, 1.0)
        sy = jnp.where(y > 0, y, 1.0)
        return jnp.sum(jnp.where(x > 0, jnp.sqrt(sx), 0.0)) + jnp.sum(
            jnp.where(y > 0, jnp.log(sy), 0.0)[:2]
        )

    x = jnp.array([0.0, 4.0, -1.0])
    y = jnp.array([0.0, 2.0])
    for got, want in zip(jax.grad(guard(f), (0, 1))(x, y), jax.grad(oracle, (0, 1))(x, y)):
        np.testing.assert_array_equal(got, want)


def test_forward_mode_through_device_put_and_maximum():
    def f(x):
        return jnp.sqrt(jax.device_put(jnp.maximum(x, 0.0)))

    def oracle(x):
        return jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0)

    x = jnp.array([-1.0, 0.5, 4.0])
    np.testing.assert_array_equal(jax.jacfwd(guard(f))(x), jax.jacfwd(oracle)(x))
