"""Workload 1: elementwise ``where``-guarded sqrt, log and 1/x (1e6, 1e7 lanes).

The three textbook leaks: ``where(x > 0, sqrt(x), 0)`` (sqrt'(0) = inf at the
zeros), ``where(x > 0, log(x), 0)`` (log of negatives is NaN) and
``where(x != 0, 1/x, 0)``.  The input contains exact zeros and negatives, so
the plain gradient is NaN there.  Memory-bound: any extra pass over the array
that a guard might add would show directly in the ratio.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from benchmarks.workloads.base import Workload


def loss(x):
    pos = x > 0
    nz = x != 0
    y = (
        jnp.where(pos, jnp.sqrt(x), 0.0)
        + jnp.where(pos, jnp.log(x), 0.0)
        + jnp.where(nz, 1.0 / x, 0.0)
    )
    return jnp.sum(y)


def loss_dw(x):
    pos = x > 0
    nz = x != 0
    xp = jnp.where(pos, x, 1.0)
    xn = jnp.where(nz, x, 1.0)
    y = (
        jnp.where(pos, jnp.sqrt(xp), 0.0)
        + jnp.where(pos, jnp.log(xp), 0.0)
        + jnp.where(nz, 1.0 / xn, 0.0)
    )
    return jnp.sum(y)


def make_inputs(n, seed=0):
    rng = np.random.default_rng(seed)
    # values on a grid in [-2, 2] so that about 1 lane in 40 is exactly zero;
    # magnitudes >= 0.1 elsewhere keep 1/x well scaled for float32 sums
    x = rng.integers(-20, 21, size=int(n)).astype(np.float32) / 10.0
    return (jnp.asarray(x),)


WORKLOAD = Workload(
    name="elementwise",
    description="where-guarded sqrt/log/1/x, sum, grad",
    loss=loss,
    loss_dw=loss_dw,
    make_inputs=make_inputs,
    sizes={"tiny": [64], "quick": [10**6], "full": [10**6, 10**7]},
    size_label=lambda n: f"n=1e{len(str(n)) - 1}" if str(n).strip("0") == "1" else f"n={n}",
)
