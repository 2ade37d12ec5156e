"""Dead lanes through user-defined derivatives: custom_vjp, custom_jvp, xlogy.

A `custom_vjp` sqrt whose Python backward computes g / (2 sqrt(x)) gives 0/0 in
the dead lane; `jax.scipy.special.xlogy` (a custom_jvp) gives 0 * log(0).
hlo_guard guards the *inputs* of the custom call with the mask its primal body
implies, so whatever the custom rule returns in a dead lane is absorbed.
"""

import jax
import jax.numpy as jnp
from _side_by_side import finish, side_by_side


@jax.custom_vjp
def my_sqrt(x):
    return jnp.sqrt(x)


def my_sqrt_fwd(x):
    y = jnp.sqrt(x)
    return y, y


def my_sqrt_bwd(y, g):
    return (g / (2.0 * y),)


my_sqrt.defvjp(my_sqrt_fwd, my_sqrt_bwd)


@jax.custom_jvp
def jvp_sqrt(x):
    return jnp.sqrt(x)


@jvp_sqrt.defjvp
def jvp_sqrt_rule(primals, tangents):
    y = jnp.sqrt(primals[0])
    return y, tangents[0] / (2.0 * y)


x = jnp.array([0.0, 1.0, 4.0])
safe = lambda x: jnp.where(x > 0, x, 1.0)
oracle = lambda x: jnp.where(x > 0, jnp.sqrt(safe(x)), 0.0)
side_by_side(
    "where(x > 0, custom_vjp sqrt(x), 0)", lambda x: jnp.where(x > 0, my_sqrt(x), 0.0), oracle, x
)
side_by_side(
    "where(x > 0, custom_jvp sqrt(x), 0)", lambda x: jnp.where(x > 0, jvp_sqrt(x), 0.0), oracle, x
)
xlogy = jax.scipy.special.xlogy
side_by_side(
    "where(x > 0, xlogy(x, x), 0)",
    lambda x: jnp.where(x > 0, xlogy(x, x), 0.0),
    lambda x: jnp.where(x > 0, xlogy(safe(x), safe(x)), 0.0),
    x,
)
finish()
