"""Indexing, slicing and `.at[].set`: lanes that are dropped still leak.

`jnp.array([0., 1./x])[0]` does not depend on x, yet at x = 0 plain JAX's
gradient is NaN: the dropped element's slope (-1/x**2 = -inf) meets a zero.
The same happens with slices, gathers and regions overwritten by `.at[].set`.
"""

import jax.numpy as jnp
from _side_by_side import finish, side_by_side

side_by_side(
    "jnp.array([0., 1./x])[0]",
    lambda x: jnp.array([0.0, 1.0 / x])[0],
    lambda x: 0.0 * x,
    jnp.zeros(()),
)

x = jnp.array([0.0, 1.0, 4.0])
keep = jnp.arange(3) > 0
safe = lambda v: jnp.where(keep, v, 1.0)
side_by_side("sqrt(x)[1:]", lambda x: jnp.sqrt(x)[1:], lambda x: jnp.sqrt(safe(x))[1:], x)
idx = jnp.array([2, 2, 1])
side_by_side("sqrt(x)[[2, 2, 1]]", lambda x: jnp.sqrt(x)[idx], lambda x: jnp.sqrt(safe(x))[idx], x)
side_by_side(
    "sqrt(x).at[0].set(7)",
    lambda x: jnp.sqrt(x).at[0].set(7.0),
    lambda x: jnp.sqrt(safe(x)).at[0].set(7.0),
    x,
)
finish()
