"""Safe Euclidean distance: `where(d2 > 0, sqrt(d2), 0)` with d2 = sum((a-b)**2).

For identical points d2 = 0: the scalar condition is false, the distance is 0,
and the gradient should be 0 -- plain JAX gives NaN (sqrt'(0) = inf times the
zero cotangent, then summed into every coordinate).  Batched with vmap, only the
identical pairs are affected.
"""

import jax
import jax.numpy as jnp
from _side_by_side import finish, side_by_side


def distance(a, b):
    d2 = jnp.sum((a - b) ** 2, axis=-1)
    return jnp.where(d2 > 0, jnp.sqrt(d2), 0.0)


def distance_oracle(a, b):
    d2 = jnp.sum((a - b) ** 2, axis=-1)
    return jnp.where(d2 > 0, jnp.sqrt(jnp.where(d2 > 0, d2, 1.0)), 0.0)


a = jnp.array([[1.0, 2.0], [0.0, 0.0], [5.0, -1.0]])
b = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, -1.0]])  # pairs 0 and 2 identical
labels = [f"pair {i} coord {j}" for i in range(3) for j in range(2)]
side_by_side(
    "d/da of distance(a, b), pairs 0 and 2 identical",
    distance,
    distance_oracle,
    a,
    b,
    labels=labels,
)
side_by_side(
    "d/db under vmap over pairs (one scalar condition per pair)",
    lambda a, b: jax.vmap(distance)(a, b),
    lambda a, b: jax.vmap(distance_oracle)(a, b),
    a,
    b,
    argnums=1,
    labels=labels,
)
finish()
