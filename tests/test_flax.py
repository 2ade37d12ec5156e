"""Flax models through the guard: NNX (``nnx.grad``/``nnx.jit`` of a guarded
loss, a train step with ``nnx.Optimizer``) and Linen (``model.apply`` inside
a guarded loss).  Oracle: the same loss with the hand double-where; plain JAX
must give NaN for the case to count."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard as hg

flax = pytest.importorskip("flax", reason="flax comes with the dev extras (jax-md needs it)")
from flax import linen, nnx  # noqa: E402

optax = pytest.importorskip("optax", reason="optax is a dev extra")

X = jnp.array([[1.0, 0.5, -0.3], [0.0, 0.0, 0.0], [-1.0, 2.0, 0.1]], jnp.float32)
Y = jnp.array([[0.5, 1.0], [0.0, 0.0], [1.0, -1.0]], jnp.float32)


def _radial(pred, double_where):
    """sqrt of a squared error that is exactly 0 on the zero row (masked)."""
    pred = pred * (jnp.sum(X * X, axis=1, keepdims=True) > 0)
    d2 = jnp.sum((pred - Y) ** 2, axis=1)
    inner = jnp.where(d2 > 0, d2, 1.0) if double_where else d2
    return jnp.mean(jnp.where(d2 > 0, jnp.sqrt(inner), 0.0))


def _nnx_model():
    return nnx.Linear(3, 2, rngs=nnx.Rngs(0))


def nnx_loss(model, double_where=False):
    """The flag has a default on purpose: ``nnx.grad`` passes it explicitly,
    and as a Python bool it must reach the function static (a traced bool
    raised TracerBoolConversionError on ``if double_where``)."""
    return _radial(model(X), double_where)


def nnx_loss_double_where(model):
    return _radial(model(X), double_where=True)


def _state_leaves(grads):
    return [np.asarray(g) for g in jax.tree_util.tree_leaves(nnx.state(grads))]


def test_nnx_grad_of_guarded_loss_matches_double_where():
    model = _nnx_model()
    leak = _state_leaves(nnx.grad(nnx_loss)(model))
    assert any(not np.isfinite(g).all() for g in leak)
    got = _state_leaves(nnx.grad(hg.guard(nnx_loss))(model))
    want = _state_leaves(nnx.grad(nnx_loss_double_where)(model))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-6, atol=1e-7)


def test_nnx_jit_train_step_with_optimizer_matches_double_where():
    def run(loss_fn):
        model = _nnx_model()
        opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

        @nnx.jit
        def step(model, opt):
            value, grads = nnx.value_and_grad(loss_fn)(model)
            opt.update(model, grads)
            return value

        values = [float(step(model, opt)) for _ in range(10)]
        return values, [np.asarray(p) for p in jax.tree_util.tree_leaves(nnx.state(model))]

    got_v, got_p = run(hg.guard(nnx_loss))
    want_v, want_p = run(nnx_loss_double_where)
    assert all(np.isfinite(got_v))
    np.testing.assert_allclose(got_v, want_v, rtol=1e-5)
    for g, w in zip(got_p, want_p, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_linen_apply_inside_a_guarded_loss_matches_double_where():
    dense = linen.Dense(2)
    params = dense.init(jax.random.PRNGKey(0), X)

    def loss(params, double_where=False):
        return _radial(dense.apply(params, X), double_where)

    leak = jax.tree_util.tree_leaves(jax.grad(loss)(params))
    assert any(not np.isfinite(np.asarray(g)).all() for g in leak)
    got = jax.tree_util.tree_leaves(jax.jit(jax.grad(hg.guard(loss)))(params))
    want = jax.tree_util.tree_leaves(jax.grad(lambda p: loss(p, True))(params))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=2e-6, atol=1e-7)


class _PaddedCNN(linen.Module):
    """Each sample normalised by its sum: a padded (all-zero) sample is 0 / 0."""

    safe: bool = False

    @linen.compact
    def __call__(self, x):
        s = jnp.sum(x, axis=(1, 2, 3), keepdims=True)
        x = x / (jnp.where(s > 0, s, 1.0) if self.safe else s)
        x = linen.Conv(2, (2, 2))(x)
        return linen.Dense(1)(x.reshape(x.shape[0], -1))


def test_linen_conv_over_a_closed_over_padded_batch_matches_double_where():
    """The batch is closed over, so ``x / s`` is computed while tracing: a
    constant NaN row the convolution's kernel gradient sums against the
    padded sample's zero cotangent (a silent NaN before the contraction guard
    covered convolutions and operands that carry no derivative)."""
    x = np.random.default_rng(0).uniform(0.5, 1.5, (4, 4, 4, 1)).astype("float32")
    x[1::2] = 0.0
    live = jnp.array([True, False, True, False])
    params = _PaddedCNN().init(jax.random.PRNGKey(0), x)

    def loss(p, safe=False):
        y = _PaddedCNN(safe).apply(p, x)[:, 0]
        return jnp.sum(jnp.where(live, (y - 1.0) ** 2, 0.0))

    plain = jax.grad(loss)(params)
    assert np.isnan(np.asarray(plain["params"]["Conv_0"]["kernel"])).all()
    got = jax.jit(jax.grad(hg.guard(loss)))(params)
    want = jax.grad(lambda p: loss(p, True))(params)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


class _StatefulNet(nnx.Module):
    """Dropout (an RngCount it advances) and BatchNorm (running statistics
    it writes) in train mode: state a call writes into the module."""

    def __init__(self, rngs):
        self.lin = nnx.Linear(3, 4, rngs=rngs)
        self.bn = nnx.BatchNorm(4, rngs=rngs)
        self.do = nnx.Dropout(0.5, rngs=rngs)

    def __call__(self, x):
        return self.do(self.bn(self.lin(x)))


def _stateful_loss(model, x, double_where=False):
    y = model(x)
    keep = x[:, :1] > 0
    inner = jnp.where(keep, jnp.abs(y), 1.0) if double_where else jnp.abs(y)
    return jnp.sum(jnp.where(keep, jnp.sqrt(inner), 0.0))


def _state(model):
    def raw(v):
        return jax.random.key_data(v) if jnp.issubdtype(v.dtype, jax.dtypes.prng_key) else v

    return [np.asarray(raw(v)) for v in jax.tree_util.tree_leaves(nnx.state(model))]


@pytest.mark.parametrize(
    "step",
    [
        lambda loss, m: nnx.value_and_grad(loss)(m, X),
        lambda loss, m: (loss(m, X), None),
        lambda loss, m: nnx.jit(lambda m: nnx.value_and_grad(loss)(m, X))(m),
    ],
    ids=["nnx.value_and_grad", "eager call", "nnx.jit of nnx.value_and_grad"],
)
def test_state_a_call_writes_into_an_nnx_module_is_kept(step):
    """Found by a user-style hunt: the guard traced the loss on a copy of
    the module, so the dropout RngCount and BatchNorm statistics it wrote
    were lost -- every step repeated the first dropout mask and the running
    mean stayed 0, with no error.  The replaced variables are now returned
    from the traced program and written back into the caller's variables:
    three steps give the plain loss's values and state exactly."""
    plain, guarded = _StatefulNet(nnx.Rngs(0, dropout=1)), _StatefulNet(nnx.Rngs(0, dropout=1))
    for _ in range(3):
        want, _ = step(_stateful_loss, plain)
        got, _ = step(hg.guard(_stateful_loss), guarded)
        assert np.asarray(got).tobytes() == np.asarray(want).tobytes()
    for a, b in zip(_state(guarded), _state(plain)):
        np.testing.assert_array_equal(a, b)


def test_gradients_of_a_stateful_module_match_the_double_where():
    plain, guarded = _StatefulNet(nnx.Rngs(0, dropout=1)), _StatefulNet(nnx.Rngs(0, dropout=1))
    oracle = lambda m, x: _stateful_loss(m, x, double_where=True)  # noqa: E731
    for _ in range(2):
        _, want = nnx.value_and_grad(oracle)(plain, X)
        _, got = nnx.value_and_grad(hg.guard(_stateful_loss))(guarded, X)
        for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_an_assignment_into_a_plain_container_argument_is_refused():
    """Only NNX variables have an object to write back to; an assignment
    into a dict the function was passed would be lost: a clear error."""

    def f(params, x):
        params["seen"] = x * 2.0
        return jnp.sum(jnp.sqrt(jnp.where(x > 0, x, 0.0)) * params["w"])

    with pytest.raises(hg.GuardUsageError, match="not a Flax NNX Variable"):
        hg.guard(f)({"w": jnp.ones(3), "seen": jnp.zeros(3)}, jnp.ones(3))
