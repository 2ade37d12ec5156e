"""Workload 2: pairwise distances and a Lennard-Jones energy, diagonal masked.

``r = sqrt(|x_i - x_j|^2)`` is 0 on the diagonal, where sqrt'(0) = inf and
``(sigma/r)^12`` is inf; the energy masks the diagonal with ``where``.  The
force (gradient of the energy) is NaN for every particle without a guard.  The
N x N arrays make this the workload where a guard that is not fused would cost
a full extra pass over 4M lanes.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from benchmarks.workloads.base import Workload

SIGMA = 1.0
EPS = 1.0


def _pair_r2(pos):
    d = pos[:, None, :] - pos[None, :, :]
    return jnp.sum(d * d, axis=-1)


def _lj(r):
    s6 = (SIGMA / r) ** 6
    return 4.0 * EPS * (s6 * s6 - s6)


def loss(pos):
    n = pos.shape[0]
    off = ~jnp.eye(n, dtype=bool)
    r = jnp.sqrt(_pair_r2(pos))  # pairwise distances, 0 on the diagonal
    e = jnp.where(off, _lj(r), 0.0)
    return 0.5 * jnp.sum(e)


def loss_dw(pos):
    n = pos.shape[0]
    off = ~jnp.eye(n, dtype=bool)
    r2 = jnp.where(off, _pair_r2(pos), 1.0)
    r = jnp.sqrt(r2)
    e = jnp.where(off, _lj(r), 0.0)
    return 0.5 * jnp.sum(e)


def make_inputs(n, seed=0):
    """Particles on a jittered cubic lattice, spacing 1.2 sigma: no two coincide."""
    rng = np.random.default_rng(seed)
    side = int(np.ceil(n ** (1 / 3)))
    grid = np.stack(np.meshgrid(*[np.arange(side)] * 3, indexing="ij"), -1).reshape(-1, 3)[:n]
    pos = 1.2 * SIGMA * grid + rng.uniform(-0.05, 0.05, size=(n, 3))
    return (jnp.asarray(pos, dtype=jnp.float32),)


WORKLOAD = Workload(
    name="lennard_jones",
    description="pairwise r, LJ energy, diagonal masked, grad (forces)",
    loss=loss,
    loss_dw=loss_dw,
    make_inputs=make_inputs,
    sizes={"tiny": [27], "quick": [512], "full": [2048]},
    rtol=2e-4,
    atol=1e-3,
    size_label=lambda n: f"N={n}",
)
