"""Area of the intersection of two disks, the classic formula with nested wheres.

    disjoint  (d >= r1 + r2)    -> 0
    contained (d <= |r1 - r2|)  -> pi * min(r1, r2)**2
    otherwise                   -> the lens: two arccos terms minus a sqrt term

The lens formula is evaluated in every lane.  Outside the lens its arccos
arguments leave [-1, 1] (NaN) or sit exactly at +-1 at tangency (infinite
slope), and plain JAX's gradient is NaN for every disjoint or contained pair.
"""

import jax.numpy as jnp
from _side_by_side import finish, side_by_side


def lens(r1, r2, d):
    a1 = r1**2 * jnp.arccos((d**2 + r1**2 - r2**2) / (2 * d * r1))
    a2 = r2**2 * jnp.arccos((d**2 + r2**2 - r1**2) / (2 * d * r2))
    k = jnp.sqrt((-d + r1 + r2) * (d + r1 - r2) * (d - r1 + r2) * (d + r1 + r2))
    return a1 + a2 - 0.5 * k


def area(r1, r2, d):
    return jnp.where(
        d >= r1 + r2,
        0.0,
        jnp.where(d <= jnp.abs(r1 - r2), jnp.pi * jnp.minimum(r1, r2) ** 2, lens(r1, r2, d)),
    )


def area_oracle(r1, r2, d):
    is_lens = (d < r1 + r2) & (d > jnp.abs(r1 - r2))
    s = lambda v: jnp.where(is_lens, v, 1.0)
    return jnp.where(
        d >= r1 + r2,
        0.0,
        jnp.where(
            d <= jnp.abs(r1 - r2), jnp.pi * jnp.minimum(r1, r2) ** 2, lens(s(r1), s(r2), s(d))
        ),
    )


r1 = jnp.array([1.0, 1.0, 2.0, 2.0, 1.0, 1.5])
r2 = jnp.array([1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
d = jnp.array([3.0, 2.0, 0.5, 1.0, 1.0, 1.2])
labels = ["disjoint", "tangent (arccos at 1)", "contained", "internally tangent", "lens", "lens"]
print("areas:", area(r1, r2, d))
side_by_side(
    "area(r1, r2, d)",
    area,
    area_oracle,
    r1,
    r2,
    d,
    argnums=(0, 1, 2),
    labels=labels,
    names=["r1", "r2", "d"],
)
finish()
