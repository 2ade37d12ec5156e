"""Which lanes a convolution or a window sum reads, decided from its geometry.

Both used to count as dropping lanes always, so with a fully live output
their operands were still partly dead: a Flax CNN (SAME 3x3 convolutions,
2x2 average pooling, no selection anywhere) listed 9 guard sites, whose masks
XLA folded to constants.  Now an operand is partly dead only where the
geometry leaves a lane under no window (a stride past the kernel, VALID
edges) or a kernel tap over no input lane.

Oracles: JAX's own VJP of the operation on ones (a lane is read iff its
cotangent is non-zero -- the very rule the masks are computed by), and the
hand double where where lanes are dropped.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from double_where import DERIVATIVES, assert_like_double_where
from jax import lax

import hlo_guard
from hlo_guard.jax_frontend.rules.structural import _conv_drops, _window_sum_drops

#: (size, kernel, stride, padding, lhs dilation, rhs dilation) per case
CONV_GEOMETRIES = [
    (size, kernel, stride, pad, base, dil)
    for size, kernel, stride, pad, base, dil in itertools.product(
        [1, 4, 7], [1, 2, 3], [1, 2, 3], [(0, 0), (1, 1), (0, 2), (2, 0)], [1, 2], [1, 2]
    )
    if (size - 1) * base + 1 + pad[0] + pad[1] >= (kernel - 1) * dil + 1
]


def _conv_eqn(fn, *args):
    (eqn,) = [e for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns if "conv" in e.primitive.name]
    return eqn


def _read(vjp_of, args, index):
    """Lanes of argument ``index`` whose cotangent is non-zero when every
    argument and the output cotangent are ones."""
    out, vjp = jax.vjp(vjp_of, *args)
    return np.asarray(vjp(jnp.ones_like(out))[index]) != 0


@pytest.mark.parametrize("geometry", CONV_GEOMETRIES)
def test_conv_drops_exactly_the_lanes_its_vjp_leaves_zero(geometry):
    size, kernel, stride, pad, base, dil = geometry
    x = jnp.ones((1, 1, size))
    w = jnp.ones((1, 1, kernel))

    def conv(x, w):
        return lax.conv_general_dilated(x, w, (stride,), [pad], (base,), (dil,))

    eqn = _conv_eqn(conv, x, w)
    for index in (0, 1):
        read = _read(conv, (x, w), index)
        assert _conv_drops(eqn, index) == (not read.all()), (geometry, index, read)


@pytest.mark.parametrize(
    "geometry",
    [
        (size, window, stride, pad)
        for size, window, stride, pad in itertools.product(
            [3, 6], [1, 2, 3], [1, 2, 3], [(0, 0), (1, 0), (1, 1)]
        )
        if size + pad[0] + pad[1] >= window
    ],
)
def test_window_sum_drops_exactly_the_lanes_its_vjp_leaves_zero(geometry):
    size, window, stride, pad = geometry
    x = jnp.ones((size,))

    def pool(x):
        return lax.reduce_window(x, 0.0, lax.add, (window,), (stride,), [pad])

    (eqn,) = [e for e in jax.make_jaxpr(pool)(x).jaxpr.eqns if "window" in e.primitive.name]
    read = _read(pool, (x,), 0)
    assert _window_sum_drops(eqn, 0) == (not read.all()), (geometry, read)


def _cnn(x, w1, w2):
    """SAME 3x3 convolutions and a 2x2 average pooling (Flax's ``avg_pool``
    is a window sum divided by 4): every lane is read."""
    h = jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME"))
    h = lax.reduce_window(h, 0.0, lax.add, (1, 1, 2, 2), (1, 1, 2, 2), "VALID") / 4.0
    h = jax.nn.relu(lax.conv_general_dilated(h, w2, (1, 1), "SAME"))
    return jnp.mean(h)


RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.normal(size=(2, 1, 8, 8)), jnp.float32)
W1 = jnp.asarray(RNG.normal(size=(4, 1, 3, 3)), jnp.float32)
W2 = jnp.asarray(RNG.normal(size=(4, 4, 3, 3)), jnp.float32)


def test_a_cnn_that_reads_every_lane_needs_no_guard():
    assert hlo_guard.explain(_cnn, X, W1, W2).guards == []
    grads = jax.jit(jax.grad(hlo_guard.guard(_cnn), argnums=(0, 1, 2)))(X, W1, W2)
    for g, p in zip(grads, jax.grad(_cnn, argnums=(0, 1, 2))(X, W1, W2)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(p))


def _strided(x):
    """A stride-2 convolution with a 1-wide kernel reads the even lanes only;
    the odd lanes of ``sqrt(x)`` are dead, and ``sqrt'(0)`` there is inf."""
    w = jnp.ones((1, 1, 1))
    return jnp.sum(lax.conv_general_dilated(jnp.sqrt(x)[None, None], w, (2,), "VALID"))


def _strided_double_where(x):
    even = (jnp.arange(x.shape[0]) % 2) == 0
    safe = jnp.sqrt(jnp.where(even, x, 1.0))
    w = jnp.ones((1, 1, 1))
    return jnp.sum(lax.conv_general_dilated(safe[None, None], w, (2,), "VALID"))


def test_a_strided_convolution_still_guards_the_lanes_it_skips():
    x = jnp.asarray([1.0, 0.0, 4.0, 0.0, 9.0, 0.0], jnp.float32)
    assert np.isnan(np.asarray(jax.grad(_strided)(x))).any()  # the bug is there
    assert hlo_guard.explain(_strided, x).guards
    want = np.asarray(jax.grad(_strided_double_where)(x))
    for g in (jax.grad(hlo_guard.guard(_strided)), jax.jit(jax.grad(hlo_guard.guard(_strided)))):
        np.testing.assert_array_equal(np.asarray(g(x)), want)


def _full_convolve(x):
    """``jnp.convolve`` in full mode reads every lane: the lanes the ``where``
    kills are the only dead ones, and ``sqrt'(0)`` meets them."""
    k = jnp.asarray([1.0, 2.0, 3.0])
    return jnp.convolve(jnp.sqrt(jnp.where(x > 0, x, 0.0)), k).sum()


def _full_convolve_double_where(x):
    k = jnp.asarray([1.0, 2.0, 3.0])
    pos = x > 0
    return jnp.convolve(jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0), k).sum()


@pytest.mark.parametrize("mode", sorted(DERIVATIVES))
def test_a_full_convolution_after_a_where_is_the_double_where(mode):
    x = jnp.asarray([-1.0, -2.0, 1.0, 4.0], jnp.float32)
    assert_like_double_where(DERIVATIVES[mode], _full_convolve, _full_convolve_double_where, x)


def test_a_genuine_singularity_under_a_full_convolution_stays():
    """``sqrt'(0)`` in a lane the convolution reads, with no selection
    anywhere: genuinely infinite, and the guarded gradient keeps it."""
    k = jnp.asarray([1.0, 2.0, 3.0])
    f = lambda x: jnp.convolve(jnp.sqrt(x), k).sum()
    x = jnp.asarray([0.0, 1.0, 4.0, 9.0], jnp.float32)
    plain = np.asarray(jax.grad(f)(x))
    assert np.isinf(plain[0])
    for g in (jax.grad(hlo_guard.guard(f)), jax.jit(jax.grad(hlo_guard.guard(f)))):
        np.testing.assert_array_equal(np.asarray(g(x)), plain)
