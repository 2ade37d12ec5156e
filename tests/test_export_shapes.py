"""``jax.export`` of guarded functions and their derivatives, with a symbolic
batch size and with a fixed one (serialised and read back).

A shape variable ``n`` made the guard fail while tracing: the folding of
small constant computations compared the output's element count with a
number, and ``n > 64`` is not decidable for a symbolic ``n``
(``InconclusiveDimensionOperation``).  Oracle: the hand double where.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from hlo_guard import guard

X = jnp.array([-1.0, 0.5, 2.0, -3.0, 4.0], jnp.float32)


def f(x):
    return jnp.sum(jnp.sqrt(jnp.maximum(x, 0.0)) * x) / jnp.sqrt(2.0)


def oracle(x):
    pos = x > 0
    return jnp.sum(jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0) * x) / jnp.sqrt(2.0)


DERIVATIVES = {
    "value": lambda g: g,
    "grad": jax.grad,
    "jacfwd": jax.jacfwd,
    "jvp": lambda g: lambda x: jax.jvp(g, (x,), (jnp.ones_like(x),))[1],
}


@pytest.mark.parametrize("name", sorted(DERIVATIVES))
def test_symbolic_batch_size(name):
    d = DERIVATIVES[name]
    spec = jax.ShapeDtypeStruct(export.symbolic_shape("n"), jnp.float32)
    exported = export.export(jax.jit(d(guard(f))))(spec)
    np.testing.assert_allclose(exported.call(X), d(oracle)(X), rtol=1e-6)
    np.testing.assert_allclose(exported.call(X[:3]), d(oracle)(X[:3]), rtol=1e-6)


@pytest.mark.parametrize("name", sorted(DERIVATIVES))
def test_fixed_shape_round_trip(name):
    d = DERIVATIVES[name]
    exported = export.export(jax.jit(d(guard(f))))(X)
    restored = export.deserialize(exported.serialize())
    np.testing.assert_allclose(restored.call(X), d(oracle)(X), rtol=1e-6)
