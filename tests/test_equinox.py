"""Equinox models through the guard, as Equinox users write them.

An ``eqx.Module`` is a pytree whose non-array leaves (activation functions,
static fields) the ``eqx.filter_*`` transformations treat as static; the guard
does the same (``hlo_guard/jax_frontend/leaf_layout.py``).  Oracle: the same
loss written with the hand double-where, through the same Equinox
transformations.  Each loss has a genuine dead-branch singularity: plain JAX
gives NaN, so every test also shows that the guard is what makes it finite.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard as hg

eqx = pytest.importorskip("equinox", reason="equinox is a dev extra")
optax = pytest.importorskip("optax", reason="optax is a dev extra")


def _model(seed=0):
    return eqx.nn.MLP(
        3, 2, width_size=8, depth=2, activation=jax.nn.softplus, key=jax.random.PRNGKey(seed)
    )


def _data():
    x = jnp.array(
        [[1.0, 0.5, -0.3], [0.0, 0.0, 0.0], [-1.0, 2.0, 0.1], [0.2, -0.4, 3.0]], jnp.float32
    )
    y = jnp.array([[0.5, 1.0], [0.0, 0.0], [1.0, -1.0], [2.0, 0.0]], jnp.float32)
    return x, y


def loss(model, x, y):
    """A radial error: ``sqrt`` of a squared distance, masked where it is 0
    (the second row's prediction error is exactly 0 after zeroing the net's
    output on the zero input, so plain JAX's gradient is NaN)."""
    pred = jax.vmap(model)(x) * (jnp.sum(x * x, axis=1, keepdims=True) > 0)
    d2 = jnp.sum((pred - y) ** 2, axis=1)
    return jnp.mean(jnp.where(d2 > 0, jnp.sqrt(d2), 0.0))


def loss_double_where(model, x, y):
    pred = jax.vmap(model)(x) * (jnp.sum(x * x, axis=1, keepdims=True) > 0)
    d2 = jnp.sum((pred - y) ** 2, axis=1)
    safe = jnp.where(d2 > 0, d2, 1.0)
    return jnp.mean(jnp.where(d2 > 0, jnp.sqrt(safe), 0.0))


def _arrays(tree):
    return jax.tree_util.tree_leaves(eqx.filter(tree, eqx.is_array))


def assert_trees_equal(a, b):
    la, lb = _arrays(a), _arrays(b)
    assert len(la) == len(lb) and la
    for u, v in zip(la, lb):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=2e-6, atol=1e-7)


def test_plain_equinox_gradient_leaks():
    grads = eqx.filter_grad(loss)(_model(), *_data())
    assert any(not np.isfinite(np.asarray(g)).all() for g in _arrays(grads))


def test_filter_grad_of_guarded_loss_matches_double_where():
    model, (x, y) = _model(), _data()
    got = eqx.filter_grad(hg.guard(loss))(model, x, y)
    assert_trees_equal(got, eqx.filter_grad(loss_double_where)(model, x, y))
    np.testing.assert_array_equal(hg.guard(loss)(model, x, y), loss(model, x, y))


def test_filter_jit_filter_value_and_grad():
    model, (x, y) = _model(), _data()
    step = eqx.filter_jit(eqx.filter_value_and_grad(hg.guard(loss)))
    want = eqx.filter_jit(eqx.filter_value_and_grad(loss_double_where))(model, x, y)
    value, grads = step(model, x, y)
    np.testing.assert_allclose(value, want[0], rtol=1e-6)
    assert_trees_equal(grads, want[1])


def test_filter_vmap_over_models():
    models = eqx.filter_vmap(_model)(jnp.arange(3))
    x, y = _data()

    def per_model(m):
        return eqx.filter_grad(hg.guard(loss))(m, x, y)

    def per_model_dw(m):
        return eqx.filter_grad(loss_double_where)(m, x, y)

    assert_trees_equal(eqx.filter_vmap(per_model)(models), eqx.filter_vmap(per_model_dw)(models))


def test_twenty_optax_steps_match_the_double_where():
    """A guarded Equinox train step (``eqx.filter_jit`` + ``eqx.apply_updates``)
    follows the double-where training run: loss and weights over 20 steps."""
    opt = optax.adam(1e-2)
    x, y = _data()

    def make_step(loss_fn):
        @eqx.filter_jit
        def step(model, state):
            value, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
            updates, state = opt.update(grads, state, eqx.filter(model, eqx.is_array))
            return eqx.apply_updates(model, updates), state, value

        return step

    guarded_step, oracle_step = make_step(hg.guard(loss)), make_step(loss_double_where)
    m1 = m2 = _model()
    s1 = s2 = opt.init(eqx.filter(m1, eqx.is_array))
    for _ in range(20):
        m1, s1, v1 = guarded_step(m1, s1)
        m2, s2, v2 = oracle_step(m2, s2)
        assert np.isfinite(v1)
        np.testing.assert_allclose(v1, v2, rtol=1e-5)
    assert_trees_equal(m1, m2)


def test_static_module_fields_key_the_trace():
    """Two models that differ only in a static leaf (the activation) get two
    traces: each must compute with its own activation."""
    a = eqx.nn.MLP(3, 2, 8, 2, activation=jax.nn.softplus, key=jax.random.PRNGKey(0))
    b = eqx.tree_at(lambda m: m.activation, a, jax.nn.tanh)
    x, y = _data()
    g = hg.guard(loss)
    np.testing.assert_array_equal(g(a, x, y), loss(a, x, y))
    np.testing.assert_array_equal(g(b, x, y), loss(b, x, y))
    assert float(g(a, x, y)) != float(g(b, x, y))


def test_a_python_float_field_stays_a_python_float_as_under_filter_jit():
    """``eqx.nn.Dropout(p=0.0)`` (inside every default ``MultiheadAttention``)
    skips itself only while ``p`` is a Python float.  The guard traced it and
    Dropout then asked for a key; a number that is a module's field is
    configuration, static as ``eqx.filter_jit`` keeps it."""
    drop = eqx.nn.Dropout(p=0.0)
    x = jnp.array([1.0, 4.0, 0.0])

    def loss(m, x):
        return jnp.sum(jnp.where(x > 0, jnp.sqrt(m(x)), 0.0))

    for wrap in (lambda f: f, eqx.filter_jit):
        got = wrap(eqx.filter_grad(hg.guard(loss)))(drop, x)
        assert got.p is None  # no derivative for configuration
    mha = eqx.nn.MultiheadAttention(2, 4, key=jax.random.PRNGKey(0))
    q = jnp.linspace(0.5, 2.0, 12).reshape(3, 4)

    def attn_loss(m, q):
        return jnp.sum(jnp.where(q > 1.0, jnp.log(jnp.abs(m(q, q, q))), 0.0))

    got = eqx.filter_grad(hg.guard(attn_loss))(mha, q)
    want = eqx.filter_grad(attn_loss)(mha, q)
    np.testing.assert_allclose(got.query_proj.weight, want.query_proj.weight, rtol=1e-5)
