"""Quick start: a NaN gradient from a dead `where` branch, and the fix.

`jnp.where(x > 0, jnp.sqrt(x), 0)` is 0 for x <= 0, yet `jax.grad` gives NaN
there: the unselected sqrt branch is still differentiated, and its infinite
slope at 0 (or NaN for x < 0) times the zero cotangent is NaN.  Writing
`@guarded_jit` instead of `@jax.jit` inserts a gradient guard before the sqrt,
so the dead lanes contribute exactly 0 -- while forward values stay bitwise
identical and real singularities (a sqrt at 0 that *is* selected) stay visible.

Run:  python examples/quickstart.py   (or `make demo`)
"""

import jax
import jax.numpy as jnp

from hlo_guard import guarded_jit


def safe_sqrt(x):
    return jnp.where(x > 0, jnp.sqrt(x), 0.0)


plain = jax.jit(safe_sqrt)
guarded = guarded_jit(safe_sqrt)  # the only change: guarded_jit instead of jax.jit

x = jnp.array([-1.0, 0.0, 1.0, 4.0])
grad_plain = jax.grad(lambda x: jnp.sum(plain(x)))(x)
grad_guarded = jax.grad(lambda x: jnp.sum(guarded(x)))(x)

print("d/dx where(x > 0, sqrt(x), 0)")
print(f"  {'x':>5} | {'jax.jit':>8} | guarded_jit")
for xi, p, g in zip(x.tolist(), grad_plain.tolist(), grad_guarded.tolist()):
    print(f"  {xi:>5} | {p:>8} | {g}")
print("forward values identical:", bool((plain(x) == guarded(x)).all()))

# A genuine singularity is not hidden: sqrt is *selected* at 0 here.
genuine = guarded_jit(lambda x: jnp.where(x >= 0, jnp.sqrt(x), 0.0))
print(
    "where(x >= 0, sqrt(x), 0) at 0, guarded gradient (genuinely infinite):",
    float(jax.grad(genuine)(0.0)),
)
