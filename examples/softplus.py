"""Naive softplus `where(x > 20, x, log1p(exp(x)))`.

At x = 100 the unselected branch overflows: exp(100) = inf in float32, so its
slope is inf/inf = NaN, and the gradient of a function that is simply x there
comes out NaN.
"""

import jax.numpy as jnp
from _side_by_side import finish, side_by_side

x = jnp.array([100.0, 25.0, 0.0, -3.0])
side_by_side(
    "where(x > 20, x, log1p(exp(x)))",
    lambda x: jnp.where(x > 20, x, jnp.log1p(jnp.exp(x))),
    lambda x: jnp.where(x > 20, x, jnp.log1p(jnp.exp(jnp.where(x > 20, 0.0, x)))),
    x,
)
side_by_side(
    "where(isfinite(x), x**2, 0) (padding with inf)",
    lambda x: jnp.where(jnp.isfinite(x), x**2, 0.0),
    lambda x: jnp.where(jnp.isfinite(x), jnp.where(jnp.isfinite(x), x, 0.0) ** 2, 0.0),
    jnp.array([jnp.inf, 2.0, -jnp.inf, 3.0]),
)
finish()
