"""A value a mask needs early is computed once, not once more on the side.

Two stacked RMS norms written the natural way: the second norm's predicate
``mean(y * y) > 0`` depends on the first projection, so the masks that guard
the first norm need it before the guarded evaluation gets there.  The
interpreter computes it on the side; the guarded evaluation must then take the
side values as its primal (``shared_primal``), or the gradient program does
every matmul of the block twice (XLA does not merge the copies).  Checked: the
number of dots in the compiled gradient, and the derivatives in every mode
against the hand-written double where.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard
from hlo_guard import guard, guarded_jit


def _norm(h):
    ms = jnp.mean(h * h, axis=-1, keepdims=True)
    return jnp.where(ms > 0, h * jax.lax.rsqrt(ms), 0.0)


def _norm_dw(h):
    ms = jnp.mean(h * h, axis=-1, keepdims=True)
    pos = ms > 0
    return jnp.where(pos, h * jax.lax.rsqrt(jnp.where(pos, ms, 1.0)), 0.0)


def block(x, w1, w2, norm=_norm):
    y = norm(x @ w1) @ w2
    return jnp.sum(norm(y))


def block_dw(x, w1, w2):
    return block(x, w1, w2, norm=_norm_dw)


def inputs():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 8)).astype(np.float32)
    x[:3] = 0.0  # padding rows: ms == 0, rsqrt'(0) = inf in the dead branch
    w1 = (rng.normal(size=(8, 8)) / 3).astype(np.float32)
    w2 = (rng.normal(size=(8, 8)) / 3).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(w1), jnp.asarray(w2)


def dots(fn, *args):
    text = jax.jit(fn).lower(*args).compile().as_text()
    return len(re.findall(r" dot\(", text))


def test_gradient_program_has_the_unguarded_number_of_dots():
    args = inputs()
    argnums = (0, 1, 2)
    plain = dots(jax.grad(block, argnums), *args)
    assert dots(jax.grad(guard(block), argnums), *args) == plain
    assert dots(jax.grad(guarded_jit(block), argnums), *args) == plain


@pytest.mark.parametrize("wrap", ["guard", "guarded_jit"])
def test_derivatives_equal_the_double_where(wrap):
    args = inputs()
    g, plain = (guard(block), block) if wrap == "guard" else (guarded_jit(block), jax.jit(block))
    np.testing.assert_array_equal(g(*args), plain(*args))
    for mode in (jax.grad, jax.jacfwd):
        got = mode(g, argnums=(0, 1))(*args)
        want = mode(block_dw, argnums=(0, 1))(*args)
        for a, b in zip(got, want):
            assert np.all(np.isfinite(a))
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)
    # the plain gradient is NaN: the guard is needed here
    assert not np.all(np.isfinite(jax.grad(block)(*args)))


def test_second_order_through_shared_values():
    """Side values carry derivatives, so an outer transformation sees them."""
    x, w1, w2 = inputs()
    x, w1 = x[:5, :4], w1[:4, :4]
    w2 = w2[:4, :4]
    h = jax.hessian(guard(block))(x, w1, w2)
    h_dw = jax.hessian(block_dw)(x, w1, w2)
    assert np.all(np.isfinite(h))
    np.testing.assert_allclose(h, h_dw, rtol=1e-4, atol=1e-5)
    hj = jax.jit(jax.hessian(guarded_jit(block), argnums=1))(x, w1, w2)
    np.testing.assert_allclose(
        hj, jax.hessian(block_dw, argnums=1)(x, w1, w2), rtol=1e-4, atol=1e-5
    )


def test_value_mode_does_not_share():
    """Value mode changes dead lanes' values: side values are not its values."""
    args = inputs()
    g = jax.grad(guard(block, mode="value"), argnums=(0, 1))(*args)
    want = jax.grad(block_dw, argnums=(0, 1))(*args)
    for a, b in zip(g, want):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def _norm_all_rows(h):
    """Every row selected (``ms >= 0``): a zero row's ``rsqrt(0)`` is live, a
    genuine singularity that no guard may hide."""
    ms = jnp.mean(h * h, axis=-1, keepdims=True)
    return jnp.where(ms >= 0, h * jax.lax.rsqrt(ms), 0.0)


def test_genuine_singularity_downstream_stays_nan():
    """The second norm's predicate still needs the side evaluation, and its
    zero rows are live: the guarded gradient keeps their NaN exactly where the
    double where of the first (dead) norm alone has it."""
    args = inputs()

    def f(x, w1, w2, first=_norm):
        return jnp.sum(_norm_all_rows(first(x @ w1) @ w2))

    def oracle(x, w1, w2):
        return f(x, w1, w2, first=_norm_dw)

    want = jax.grad(oracle, argnums=(0, 1, 2))(*args)
    assert any(np.isnan(w).any() for w in want)  # the singularity is real
    np.testing.assert_array_equal(guard(f)(*args), f(*args))
    for wrap in (guard, guarded_jit):
        for got, w in zip(jax.grad(wrap(f), argnums=(0, 1, 2))(*args), want):
            np.testing.assert_array_equal(np.isnan(got), np.isnan(w))
            np.testing.assert_allclose(got, w, rtol=2e-5, atol=1e-6)


W_ROW = jnp.array([[0.5, -1.0]])
PADDED = jnp.array([4.0, 0.0])  # lane 1: a padded atom, dead in both wheres


def _encoder_loss(x, double_where=False):
    """A layer on ``where(x > 0, sqrt(x), 0)`` and a masked log-norm loss:
    the second where's mask needs the dot's output, computed on the side and
    shared as the guarded dot's primal (a Flax encoder on padded atoms)."""
    ok = x > 0
    inner = jnp.where(ok, x, 1.0) if double_where else x
    h = jnp.where(ok, jnp.sqrt(inner), 0.0)[:, None] @ W_ROW
    m2 = jnp.sum(h**2, -1)
    ok2 = m2 > 0
    return jnp.sum(jnp.where(ok2, jnp.log(jnp.where(ok2, m2, 1.0) if double_where else m2), 0.0))


SECOND = {
    "jacrev_grad": lambda F: jax.jacrev(jax.grad(F)),
    "jit_jacrev_grad": lambda F: jax.jit(jax.jacrev(jax.grad(F))),
    "gradient_penalty": lambda F: jax.grad(lambda q: jnp.sum(jax.grad(F)(q) ** 2)),
    "hessian": jax.hessian,
}


@pytest.mark.parametrize("wrap", ["guard", "guarded_jit"])
@pytest.mark.parametrize("mode", sorted(SECOND))
def test_a_shared_primal_is_differentiated_through_the_guarded_jvp_again(mode, wrap):
    """Reverse over reverse differentiated the shared dot's primal through
    the *side* evaluation, whose ``sqrt'(0)`` in the padded lane is not
    guarded: NaN with a clean report (a user-style hunt, 2026-11-27).  The
    JVP's primal is now the shared call itself."""
    d = SECOND[mode]
    want = np.asarray(d(lambda x: _encoder_loss(x, double_where=True))(PADDED))
    assert np.isfinite(want).all()
    got = np.asarray(d(getattr(hlo_guard, wrap)(_encoder_loss))(PADDED))
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.skipif(
    not __import__(
        "hlo_guard.jax_frontend.compat", fromlist=["calls_kept_until_lowering"]
    ).calls_kept_until_lowering(),
    reason="jax 0.10: the interpreter builds every staged program",
)
def test_surgery_shares_the_side_values_too():
    """Under ``jax.jit`` the program is built by surgery (one ``guarded_``
    call of the user's equations) although a mask needs the second norm's
    predicate early: the dots computed on the side are bound again in the
    side trace with the side values as their primal, as the interpreter
    binds them, and the compiled gradient has the unguarded number of dots."""
    from hlo_guard.jax_frontend.surgery import spliced_program

    args = inputs()
    closed = jax.make_jaxpr(guard(block))(*args)
    (call,) = closed.jaxpr.eqns
    assert str(call.params["name"]) == "guarded_block"
    body = spliced_program(closed).jaxpr
    shared = [e for e in body.eqns if e.primitive.name == "custom_jvp_call"]
    assert shared  # the shared primals (and the guarded contractions)
    plain = dots(jax.grad(block, (0, 1, 2)), *args)
    assert dots(jax.grad(guarded_jit(block), (0, 1, 2)), *args) == plain


def test_the_side_evaluation_carries_no_tangent(monkeypatch):
    """Under a JVP the side values are computed from gradient-stopped inputs,
    shared ones too (their tangents come from the guarded binding): no side
    equation is differentiated and then dropped.  It was, and made
    ``jax.jit(jax.grad(guard(f)))`` of a 2-layer transformer trace 20 %
    longer.  Derivatives are held to the double where by the tests above."""
    from hlo_guard.jax_frontend import side_values
    from hlo_guard.jax_frontend.compat import under_forward_mode

    differentiated = []
    real = side_values.bind_eqn

    def recording(eqn, invals, *a, **k):
        differentiated.extend(bool(under_forward_mode(v)) for v in invals)
        return real(eqn, invals, *a, **k)

    monkeypatch.setattr(side_values, "bind_eqn", recording)
    args = inputs()
    jax.jvp(guard(block), args, args)
    assert differentiated  # the second norm's predicate is computed on the side
    assert not any(differentiated)
    np.testing.assert_allclose(
        jax.jvp(guard(block), args, args)[1], jax.jvp(block_dw, args, args)[1], rtol=2e-5, atol=1e-6
    )
