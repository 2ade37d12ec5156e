"""The TF front end on the boundary placement (docs/PLACEMENT.md).

The guards sit where a dead region meets live computation, as a hand-written
double where does, and share one select per (tensor, mask).  Oracles: the
hand-written double where under the same XLA compilation, and per-lane math.
"""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import assert_same, xla_grads
from test_tf_support import jvp_of_ones as jvp
from test_tf_support import xla_second_derivative as second_derivative

import hlo_guard.tf as hg


def guard_selects(guarded, *args) -> int:
    """The guard selects in the guarded function's graph for these arguments."""
    graph = guarded.get_concrete_function(*args).graph
    return sum(
        1
        for op in graph.get_operations()
        if op.type == "SelectV2"
        and "hlo_guard_guard" in op.name
        and "hlo_guard_shadow" not in op.name  # the user's own where, copied for a mask
    )


def chain(x):
    return tf.where(x > 0, tf.math.log(tf.sqrt(x)) * x**1.5 + 1.0 / x, 0.0)


def chain_oracle(x):
    s = tf.where(x > 0, x, 1.0)
    return tf.where(x > 0, tf.math.log(tf.sqrt(s)) * s**1.5 + 1.0 / s, 0.0)


X = [-1.0, 0.0, 0.5, 2.0]


def test_lane_wise_chain_gets_one_select_where_x_enters():
    g = hg.guard(chain)
    x = tf.constant(X)
    assert_same(xla_grads(g, x)[0], xla_grads(chain_oracle, x)[0])
    assert guard_selects(g, x) == 1
    (site, *_) = hg.report(g, x).guards
    assert {p.split()[0] for p in site.protects} >= {"Sqrt", "Log"}


def test_chain_second_derivative_and_forward_mode_equal_the_double_where():
    x = tf.constant(X)
    g = hg.guard(chain)
    assert_same(second_derivative(g, x), second_derivative(chain_oracle, x))
    assert_same(jvp(g, x), jvp(chain_oracle, x))


def test_join_of_a_live_and_a_dead_read():
    def fn(x):
        return tf.reduce_sum(x**2) + tf.reduce_sum(tf.where(x > 0, tf.sqrt(x), 0.0))

    def oracle(x):
        s = tf.where(x > 0, x, 1.0)
        return tf.reduce_sum(x**2) + tf.reduce_sum(tf.where(x > 0, tf.sqrt(s), 0.0))

    x = tf.constant(X)
    (plain,) = xla_grads(fn, x)
    assert np.isnan(plain).any()
    assert_same(xla_grads(hg.guard(fn), x)[0], xla_grads(oracle, x)[0])


def pair_energy(where_r2):
    def fn(pos):
        d = pos[:, None, :] - pos[None, :, :]
        r2 = tf.reduce_sum(d * d, axis=-1)
        off = r2 > 0
        s = tf.where(off, r2, 1.0) if where_r2 else r2
        inv6 = 1.0 / (s * s * s)
        return tf.reduce_sum(tf.where(off, inv6 * inv6 - inv6, 0.0))

    return fn


def test_pair_energy_as_the_hand_double_where():
    """Lennard-Jones shape: the diagonal pairs are at distance 0."""
    pos = tf.constant(np.random.default_rng(0).normal(size=(5, 3)), tf.float32)
    fn = pair_energy(False)
    (plain,) = xla_grads(fn, pos)
    assert np.isnan(plain).all()
    g = hg.guard(fn)
    assert_same(xla_grads(g, pos)[0], xla_grads(pair_energy(True), pos)[0], rtol=1e-5)
    # the hazard placement guarded each of the chain's products and quotients
    assert guard_selects(g, pos) <= 2


def test_unknown_batch_dimension_is_guarded_conservatively():
    """With a ``None`` dimension no op can be proven lane-local: more guards,
    the same gradient."""
    g = hg.guard(chain, input_signature=[tf.TensorSpec([None], tf.float32)])
    x = tf.constant(X)
    assert_same(xla_grads(g, x)[0], xla_grads(chain_oracle, x)[0])
    assert guard_selects(g, x) >= 1


def test_reduce_max_is_a_forward_mode_exit():
    """TF's ``Max`` gradient multiplies by an indicator: forward mode carries
    ``log'(0) * 0`` into the result unless the unchosen lane is selected."""

    def fn(x):
        return tf.reduce_max(tf.stack([tf.math.log(x), tf.zeros_like(x)]), axis=0)

    x = tf.constant([0.0, 0.5, 2.0])
    assert np.isnan(jvp(fn, x)).any()
    for jit in (False, True):
        # per lane: max(log x, 0) follows log only where log x > 0
        np.testing.assert_allclose(jvp(hg.guard(fn), x, jit), [0.0, 0.0, 0.5])


@pytest.mark.parametrize("shape", [[4], [2, 4]])
def test_scalar_constant_operands_do_not_make_an_op_mix_lanes(shape):
    """``x ** 1.5`` and ``1 / x`` read a scalar ``Const``: still lane-local,
    so the chain keeps its single select."""
    x = tf.reshape(tf.constant(X * (int(np.prod(shape)) // 4)), shape)
    assert guard_selects(hg.guard(chain), x) == 1


def test_a_mask_that_needs_only_a_shape_copies_nothing_on_the_side():
    """A select's mask needs its output's *shape*, not its value.  Reading the
    value downstream of a guard made the builder recompute the whole chain up
    to it "on the side" (two matmuls of the MLP benchmark among 26 copies);
    with the shape known at trace time nothing is copied."""
    keep = tf.constant([True, False])
    x = tf.constant([4.0, 0.0, 1.0])
    w = tf.constant(np.ones((3, 2)), tf.float32)

    def f(x, w):
        z = tf.where(x > 0, tf.sqrt(x), 0.0)
        return tf.where(keep, tf.matmul(z[None, :], w), 0.0)

    g = hg.guard(f)
    ops = g.get_concrete_function(x, w).graph.get_operations()
    assert not [op.name for op in ops if "hlo_guard_shadow" in op.name]
    assert_same(
        xla_grads(g, x, w)[0], xla_grads(lambda x, w: f(tf.where(x > 0, x, 1.0), w), x, w)[0]
    )


PADDED = [[1.0, 2.0, 4.0], [0.0, 0.0, 0.0]]  # row 1 is padding


def _padded_log(w, x, operand):
    valid = tf.constant([[True], [False]])
    return tf.where(valid, operand(w) * tf.math.log(x), 0.0)


_OPERANDS = {
    # a lane-local step between the weight and the broadcasting Mul
    "reshape to [1, D]": (lambda w: tf.reshape(w, [1, 3]), [1.0, 0.5, 2.0], tf.float32),
    "cast of a half scalar": (lambda w: tf.cast(w, tf.float32), 0.5, tf.float16),
}


@pytest.mark.parametrize("operand", sorted(_OPERANDS))
def test_an_operand_broadcast_after_a_lane_local_step_is_guarded_at_the_op(operand):
    """As on the JAX side: ``Mul`` sums ``ct * log(x)`` over the padded row
    into the weight's cotangent, so the guard belongs at the ``Mul``, at the
    output's shape; placed on the weight before the reshape or cast its mask
    was all true and the XLA gradient stayed NaN."""
    step, w, dtype = _OPERANDS[operand]
    x = tf.constant(PADDED)
    xs = tf.where(tf.constant([[True], [False]]), x, 1.0)
    fn = lambda w: _padded_log(w, x, step)  # noqa: E731
    oracle = lambda w: _padded_log(w, xs, step)  # noqa: E731
    w = tf.constant(w, dtype)
    assert not np.isfinite(np.asarray(xla_grads(fn, w)[0], np.float32)).all()
    assert_same(xla_grads(hg.guard(fn), w)[0], xla_grads(oracle, w)[0])
    assert_same(xla_grads(hg.guard(fn), w, jit=False)[0], xla_grads(oracle, w, jit=False)[0])


# ``*_no_nan`` and ``x*`` ops: a ``where`` that picks 0 where an operand is 0.
# A singular op upstream of them (``sqrt(p)`` at ``p = 0``) left TF's ``0 * inf``
# in the XLA gradient with a clean report: the ops counted as plain nonlinear.

_P = [0.0, 0.5, 0.25, 0.0]
_T = [0.0, 1.0, 1.0, 0.0]


def _zero_where_zero_cases():
    sq = tf.sqrt
    safe = lambda p, t: tf.where(tf.not_equal(t, 0.0), p, 1.0)  # noqa: E731
    return {
        "DivNoNan": (
            lambda p, t: tf.math.divide_no_nan(t, sq(p)),
            lambda p, t: tf.where(tf.not_equal(t, 0.0), t / sq(safe(p, t)), 0.0),
        ),
        "MulNoNan": (
            lambda p, t: tf.math.multiply_no_nan(tf.math.log(p), t),
            lambda p, t: tf.where(tf.not_equal(t, 0.0), tf.math.log(safe(p, t)) * t, 0.0),
        ),
        "Xdivy": (
            lambda p, t: tf.math.xdivy(t, sq(p)),
            lambda p, t: tf.where(tf.not_equal(t, 0.0), t / sq(safe(p, t)), 0.0),
        ),
        "Xlogy": (
            lambda p, t: tf.math.xlogy(t, sq(p)),
            lambda p, t: tf.where(tf.not_equal(t, 0.0), t * tf.math.log(sq(safe(p, t))), 0.0),
        ),
        "Xlog1py": (
            lambda p, t: tf.math.xlog1py(t, sq(p) - 1.0),
            lambda p, t: tf.where(tf.not_equal(t, 0.0), t * tf.math.log(sq(safe(p, t))), 0.0),
        ),
    }


@pytest.mark.parametrize("op", sorted(_zero_where_zero_cases()))
def test_ops_that_are_zero_where_an_operand_is_zero_select_like_a_where(op):
    fn, oracle = _zero_where_zero_cases()[op]
    p, t = tf.constant(_P), tf.constant(_T)
    plain = xla_grads(fn, p, t)[0]
    assert np.isnan(plain).any()
    for jit in (True, False):
        assert_same(xla_grads(hg.guard(fn), p, t, jit=jit)[0], xla_grads(oracle, p, t, jit=jit)[0])
    np.testing.assert_array_equal(hg.guard(fn)(p, t).numpy(), fn(p, t).numpy())
    # forward mode (TF's double backward), in ``p``
    assert_same(jvp(hg.guard(lambda q: fn(q, t)), p), jvp(lambda q: oracle(q, t), p))


def test_mul_no_nan_keeps_the_lane_tf_differentiates():
    """``MulNoNan``'s ``y`` gets ``x * ct`` from TF even where ``y == 0``:
    that lane is live, and its gradient is TF's own."""
    x, y = tf.constant([2.0, 3.0]), tf.constant([0.0, 1.0])
    fn = tf.math.multiply_no_nan
    assert_same(xla_grads(hg.guard(fn), x, y), xla_grads(fn, x, y))
    assert xla_grads(hg.guard(fn), x, y)[1][0] == 2.0
