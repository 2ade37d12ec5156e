"""`maximum(log(x), -5)`: a floor on a log-likelihood.

Where the floor wins, the log loses, and JAX multiplies the log's slope (1/x,
infinite at 0) by 0: NaN.  A *value* substitution would be wrong here -- the
loser's value decides who wins -- so hlo_guard guards only the gradient: the
forward result stays exactly -5 and the gradient is 0.  `max(sqrt(x))` is the
reduction form of the same problem.
"""

import jax
import jax.numpy as jnp
from _side_by_side import finish, side_by_side

from hlo_guard import guarded_jit

floor_log = lambda x: jnp.maximum(jnp.log(x), -5.0)
x = jnp.array([0.0, 1e-3, 1.0, 2.0])
side_by_side(
    "maximum(log(x), -5)",
    floor_log,
    lambda x: jnp.where(jnp.log(x) > -5.0, jnp.log(jnp.where(jnp.log(x) > -5.0, x, 1.0)), -5.0),
    x,
)
print(
    "forward at 1e-3:",
    float(guarded_jit(floor_log)(1e-3)),
    "(plain:",
    float(jax.jit(floor_log)(1e-3)),
    ")",
)


def max_sqrt_oracle(x):
    win = x == jnp.max(x)
    return jnp.max(jnp.where(win, jnp.sqrt(jnp.where(win, x, 1.0)), -jnp.inf))


side_by_side(
    "max(sqrt(x))", lambda x: jnp.max(jnp.sqrt(x)), max_sqrt_oracle, jnp.array([0.0, 1.0, 4.0])
)
finish()
