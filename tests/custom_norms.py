"""A Euclidean norm over the last axis with a custom derivative, both kinds.

Shared by the tests of non-lane-wise custom calls: the rule divides by the
norm, so it is NaN on a zero row -- exactly what a ``where(n > 0, ...)`` around
it must keep out of the gradient.
"""

import jax
import jax.numpy as jnp


@jax.custom_jvp
def norm_jvp(v):
    return jnp.sqrt(jnp.sum(v * v, -1))


@norm_jvp.defjvp
def _norm_jvp_rule(primals, tangents):
    (v,), (dv,) = primals, tangents
    n = norm_jvp(v)
    return n, jnp.sum(v * dv, -1) / n


@jax.custom_vjp
def norm_vjp(v):
    return jnp.sqrt(jnp.sum(v * v, -1))


def _norm_fwd(v):
    n = norm_vjp(v)
    return n, (v, n)


def _norm_bwd(res, g):
    v, n = res
    return (v * (g / n)[..., None],)


norm_vjp.defvjp(_norm_fwd, _norm_bwd)
