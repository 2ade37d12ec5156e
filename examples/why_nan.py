"""Why is my gradient NaN?  ``diagnose`` answers without rewriting anything.

    python examples/why_nan.py
    hlo-guard diagnose examples/why_nan.py:loss "[-1,0,0.5,1,4]"

A loss with two NaNs in its plain gradient: one leaks from the dead branch of a
``where`` (a bug hlo_guard's ``guard`` removes), one is a genuine singularity on
a taken path (``arccos`` at exactly 1: real math, which no guard should hide).
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from hlo_guard import diagnose


def loss(x):
    radius = jnp.where(x > 0, jnp.sqrt(x), 0.0)  # the "safe" sqrt: NaN grad at x <= 0
    angle = jnp.arccos(jnp.minimum(x, 1.0))  # infinite slope at x = 1
    return jnp.sum(radius + angle)


def main():
    x = jnp.array([-1.0, 0.0, 0.5, 1.0, 4.0])
    print("plain grad:", jax.grad(loss)(x))
    report = diagnose(loss, x)
    print(report)

    # the oracle: the hand-written double where on both branches
    def oracle(x):
        root = jnp.where(x > 0, jnp.sqrt(jnp.where(x > 0, x, 1.0)), 0.0)
        inside = x <= 1.0
        angle = jnp.where(inside, jnp.arccos(jnp.where(inside, x, 0.0)), 0.0)
        return jnp.sum(root + angle)

    plain = np.asarray(jax.grad(loss)(x))
    hand = np.asarray(jax.grad(oracle)(x))
    for kind, want in (
        ("leak", ~np.isfinite(plain) & np.isfinite(hand)),
        ("genuine", ~np.isfinite(hand)),
    ):
        got = {i[0] for g in report.groups if g.kind == kind for i in g.indices}
        if got != set(np.flatnonzero(want).tolist()):
            print(
                f"MISMATCH: diagnose's {kind} lanes {got}, the double where's {np.flatnonzero(want)}"
            )
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
