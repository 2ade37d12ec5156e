"""``index_values.iota_axis``: an index array is an arange only when the
jaxpr spells one -- each step ``jnp``'s indexing adds is followed, and
anything else answers None.

The oracle is the concrete value: wherever ``iota_axis`` names an axis, the
array (evaluated) must count ``0 .. n-1`` along it and be constant along the
others; the cases that answer None are ones where that is false or is not
visible in the jaxpr.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hlo_guard.jax_frontend.graph import JaxprGraph
from hlo_guard.jax_frontend.index_values import index_components, iota_axis

N = 5


def _axis_of(fn, *args):
    closed = jax.make_jaxpr(fn)(*args)
    graph = JaxprGraph(closed.jaxpr)
    return iota_axis(graph, closed.jaxpr.outvars[0]), np.asarray(fn(*args))


def _counts_along(value, axis) -> bool:
    moved = np.moveaxis(value, axis, 0)
    expect = np.arange(value.shape[axis]).reshape((-1,) + (1,) * (value.ndim - 1))
    return bool(np.all(moved == expect))


def _wrapped(r, below):
    """jnp's negative-index wrap, ``r < below`` tested."""
    return jnp.where(r < below, r + N, r)


FOUND = {
    "iota": (lambda y: jnp.arange(N), 0),
    "column": (lambda y: jnp.arange(N)[:, None], 0),
    "row": (lambda y: jnp.arange(N)[None, :], 1),
    "broadcast": (lambda y: jnp.broadcast_to(jnp.arange(N)[:, None], (N, 3)), 0),
    "second_axis_iota": (lambda y: jax.lax.broadcasted_iota(jnp.int32, (3, N), 1), 1),
    "widened": (lambda y: jnp.arange(N, dtype=jnp.int8).astype(jnp.int32), 0),
    "squeezed": (lambda y: jnp.squeeze(jnp.arange(N)[None, :, None], (0, 2)), 0),
    "wrapped_negative": (lambda y: _wrapped(jnp.arange(N), 0), 0),
    "through_a_call": (lambda y: jax.jit(lambda r: r[:, None])(jnp.arange(N)), 0),
}


@pytest.mark.parametrize("case", sorted(FOUND))
def test_an_arange_is_found(case):
    fn, axis = FOUND[case]
    found, value = _axis_of(fn, jnp.zeros(N, jnp.int32))
    assert found == axis
    assert _counts_along(value, axis)


NOT_FOUND = {
    "shifted": lambda y: jnp.arange(N) + 1,
    "reversed": lambda y: jnp.arange(N)[::-1],
    "halved": lambda y: jnp.arange(N) // 2,
    "a_run_time_value": lambda y: y,
    "stretched_from_one": lambda y: jnp.broadcast_to(jnp.arange(1)[:, None], (N, 1)),
    "narrowed_past_its_range": lambda y: jnp.arange(300).astype(jnp.int8)[:N],
    "float": lambda y: jnp.arange(N, dtype=jnp.float32),
    "wrapped_by_another_test": lambda y: _wrapped(jnp.arange(N), 1),
    "wrapped_by_another_value": lambda y: jnp.where(y < 0, jnp.arange(N) + N, jnp.arange(N)),
    "another_arange_tested": lambda y: jnp.where(
        jnp.arange(N) < 0, jnp.arange(N) + N, jnp.arange(N)
    ),
}


@pytest.mark.parametrize("case", sorted(NOT_FOUND))
def test_anything_else_is_not(case):
    found, _ = _axis_of(NOT_FOUND[case], jnp.asarray([3, -1, 0, 2, 1], jnp.int32))
    assert found is None


def test_the_components_of_an_index_array_are_its_concatenated_columns():
    def fn(y):
        return jnp.concatenate(
            [jnp.arange(N)[:, None], y[:, None], jnp.zeros((N, 2), jnp.int32)], 1
        )

    closed = jax.make_jaxpr(fn)(jnp.zeros(N, jnp.int32))
    graph = JaxprGraph(closed.jaxpr)
    pieces = index_components(graph, closed.jaxpr.outvars[0])
    assert [start for _, start, _ in pieces] == [0, 1, 2]
    assert [iota_axis(g, column) for g, _, column in pieces] == [0, None, None]
