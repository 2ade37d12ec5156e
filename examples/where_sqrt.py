"""`jnp.where` with a branch that is singular where it is *not* selected.

sqrt, 1/x and arctan2(x, x) are evaluated in every lane; their infinite or NaN
slopes in the unselected lanes turn the zero cotangent into NaN.  The guarded
gradient equals the hand-written double-where in every lane.  A singularity on
the *selected* path (where(x >= 0, sqrt(x), 0) at 0, sqrt(x)**2 at 0) is real
and stays visible.
"""

import jax
import jax.numpy as jnp
from _side_by_side import finish, side_by_side

from hlo_guard import guarded_jit

x = jnp.array([-1.0, 0.0, 1.0, 4.0])
safe = lambda p, v: jnp.where(p, v, 1.0)  # the inner where of the double-where trick

side_by_side(
    "where(x > 0, sqrt(x), 0)",
    lambda x: jnp.where(x > 0, jnp.sqrt(x), 0.0),
    lambda x: jnp.where(x > 0, jnp.sqrt(safe(x > 0, x)), 0.0),
    x,
)
side_by_side(
    "where(x > 0, 1/x, 1)",
    lambda x: jnp.where(x > 0, 1.0 / x, 1.0),
    lambda x: jnp.where(x > 0, 1.0 / safe(x > 0, x), 1.0),
    x,
)
side_by_side(
    "where(x > 0, arctan2(x, x), 0)",
    lambda x: jnp.where(x > 0, jnp.arctan2(x, x), 0.0),
    lambda x: jnp.where(x > 0, jnp.arctan2(safe(x > 0, x), safe(x > 0, x)), 0.0),
    x,
)

print("\nGenuine singularities stay visible (on the selected path):")
print(
    "  grad where(x >= 0, sqrt(x), 0) at 0:",
    float(jax.grad(guarded_jit(lambda x: jnp.where(x >= 0, jnp.sqrt(x), 0.0)))(0.0)),
)
print(
    "  grad sqrt(x)**2 at 0:               ",
    float(jax.grad(guarded_jit(lambda x: jnp.sqrt(x) ** 2))(0.0)),
)
finish()
