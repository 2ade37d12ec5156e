"""A boolean converted to a number (``m.astype(f32)``) as a factor: every
lane 0 or 1 and no derivative of its own, so it scales a cotangent or a
tangent finitely -- as a finite constant does -- and the ``mul`` needs no
guard of its own (:func:`rules.elementwise._mask`).  Its zeros are zeros by
*value*, which the reports name where a singular factor meets them
(``tests/test_where_made_zero_reports.py``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlo_guard import explain, guard

X = jnp.array([-2.0, 0.0, 0.5, 1.0, 3.0])


def masked_square(x):
    return jnp.sum((x > 1).astype(jnp.float32) * jnp.where(x > 0, x * x, 0.0))


def masked_square_per_lane(x):
    """The per-lane ``if``: the oracle."""
    return jnp.sum(jnp.array([xi * xi if (xi > 1 and xi > 0) else 0.0 for xi in x]))


def test_no_forward_mode_guard_on_the_mask_product():
    """Before, the ``mul`` got a forward-mode output guard (its factor might
    be infinite); a 0/1 mask cannot be."""
    sites = explain(masked_square, X).sites
    assert not [s for s in sites if s.mode == "forward"]


@pytest.mark.parametrize("transform", [jax.grad, jax.jacfwd, jax.hessian])
def test_derivatives_equal_the_per_lane_if(transform):
    got = transform(guard(masked_square))(X)
    want = transform(masked_square_per_lane)(X)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def _masked_sqrt(x):
    return (x >= 0).astype(jnp.float32) * jnp.where(x >= 0, jnp.sqrt(x), 0.0)


def test_a_genuine_singularity_behind_the_mask_stays():
    """``sqrt`` taken at 0 in a lane the mask keeps: ``sqrt'(0)`` is inf (in
    forward mode that output lane is NaN in every column, as plain JAX's);
    the dead lane ``x = -2`` is exactly zero (plain reverse mode: NaN)."""
    g = np.asarray(jax.grad(guard(lambda x: jnp.sum(_masked_sqrt(x))))(X))
    assert g[0] == 0.0 and np.isinf(g[1]) and np.isfinite(g[2:]).all()
    t = np.asarray(jax.jacfwd(guard(_masked_sqrt))(X))
    plain = np.asarray(jax.jacfwd(_masked_sqrt)(X))
    assert not np.isfinite(t[1, 1]) and np.isfinite(np.delete(t, 1, axis=0)).all()
    np.testing.assert_array_equal(t, plain)  # forward mode selects tangents: as plain JAX
