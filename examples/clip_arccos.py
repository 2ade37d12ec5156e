"""`arccos(clip(c, -1, 1))`: clipping a cosine that rounding pushed past 1.

At c = 1.5 the clip selects the bound 1, whose arccos slope is -inf; the clip
hands c a zero (it lost), and 0 * -inf = NaN.  At exactly c = 1 the clip ties,
JAX gives c half of -inf, and the -inf is genuine: it is kept.
"""

import jax
import jax.numpy as jnp
from _side_by_side import finish, side_by_side

from hlo_guard import guarded_jit

f = lambda c: jnp.arccos(jnp.clip(c, -1.0, 1.0))


def oracle(c):
    inside = (c > -1.0) & (c < 1.0)
    return jnp.where(
        inside, jnp.arccos(jnp.where(inside, c, 0.0)), jnp.where(c >= 1.0, 0.0, jnp.pi)
    )


side_by_side("arccos(clip(c, -1, 1))", f, oracle, jnp.array([1.5, -1.5, 0.3, 0.0]))
print("\nat c = 1 exactly (a tie, genuinely -inf):", float(jax.grad(guarded_jit(f))(1.0)))
finish()
