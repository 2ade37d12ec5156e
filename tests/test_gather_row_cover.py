"""A gather that reads a lane of every row keeps its rows' ``logsumexp`` live.

``-take_along_axis(log_softmax(logits), labels)`` (Equinox's CNN tutorial,
many hand-written losses) leaves every logit but the label's dead at the
gather; ``log_softmax``'s ``logsumexp`` makes the whole row live again, but
only where the row has a read lane -- a mask built at run time, so the region
used to stay partly dead up through the network: 15 guards on a two-layer
relu MLP, every one selecting nothing.  The gather now says, while tracing,
that every row holds a live lane (``Liveness.covered``), and the broadcast of
the row's ``logsumexp`` back over it is fully live: no guard.

Where a row may have *no* live lane the guards stay: the gather's output
partly dead (``where(valid, picked, 0)``), or an out-of-bounds label under
``mode="fill"`` with a finite fill value.  With the default NaN fill, an
out-of-bounds row makes the loss NaN, and its gradient row is plain JAX's.

Oracles: plain JAX where nothing is dead (its gradient is bitwise the
guarded one's), and the hand-written double where with a per-row validity
where rows are dead.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import hlo_guard

B, C = 4, 5
LOGITS = jnp.asarray(np.random.default_rng(0).normal(size=(B, C)), jnp.float32)
LABELS = jnp.asarray([0, 3, 2, 1])
W = jnp.asarray(np.random.default_rng(1).normal(size=(C, C)), jnp.float32)


def _picked(logp, labels, **kw):
    return jnp.take_along_axis(logp, labels[:, None], axis=1, **kw)[:, 0]


#: losses whose gather reads a lane of every row and whose output is fully
#: live, of the inputs and the weights (both differentiated, as in training)
DENSE = {
    "take_along_axis": lambda x, w: -jnp.mean(_picked(jax.nn.log_softmax(x @ w), LABELS)),
    "take_along_axis_clip": lambda x, w: (
        -jnp.mean(_picked(jax.nn.log_softmax(jnp.tanh(x) @ w), LABELS, mode="clip"))
    ),
    "relu_layer": lambda x, w: -jnp.sum(_picked(jax.nn.log_softmax(jax.nn.relu(x) @ w), LABELS)),
    "explicit_logsumexp": lambda x, w: -jnp.mean(_picked(_minus_logsumexp(x @ w), LABELS)),
    "stretched_broadcast": lambda x, w: (
        -jnp.mean(_picked(_minus_stretched_logsumexp(x @ w), LABELS))
    ),
    "new_axis_broadcast": lambda x, w: -jnp.mean(_picked(_minus_new_axis_logsumexp(x @ w), LABELS)),
}


def _minus_logsumexp(z):
    return z - jax.nn.logsumexp(z, axis=1, keepdims=True)


def _minus_stretched_logsumexp(z):
    """A size-1 axis stretched by ``broadcast_in_dim`` (not by ``sub``)."""
    return z - jnp.broadcast_to(jax.nn.logsumexp(z, axis=1, keepdims=True), z.shape)


def _minus_new_axis_logsumexp(z):
    """The row axis inserted by ``broadcast_in_dim``."""
    return z - jax.lax.broadcast_in_dim(jax.nn.logsumexp(z, axis=1), z.shape, (0,))


def _grad(f):
    return jax.jit(jax.grad(f, argnums=(0, 1)))


def _assert_no_guard_and_plain_jax(f):
    """No guard listed; gradients and values bitwise plain JAX's."""
    assert hlo_guard.explain(f, LOGITS, W).guards == []
    got = _grad(hlo_guard.guard(f))(LOGITS, W)
    for g, p in zip(got, _grad(f)(LOGITS, W)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(p))
    np.testing.assert_array_equal(
        np.asarray(hlo_guard.guard(f)(LOGITS, W)), np.asarray(f(LOGITS, W))
    )


def _gradient_instructions(fn) -> int:
    """Optimized HLO instructions of ``fn``'s gradient, labels an argument."""
    grad = jax.jit(jax.grad(fn, argnums=(0, 1)))
    text = grad.lower(LOGITS, W, LABELS).compile().as_text()
    return sum(1 for line in text.splitlines() if " = " in line)


@pytest.mark.parametrize("case", sorted(DENSE))
def test_a_cross_entropy_by_label_needs_no_guard(case):
    _assert_no_guard_and_plain_jax(DENSE[case])


def test_the_guarded_gradient_program_is_the_unguarded_one():
    """Not a guard left in the compiled gradient: the same optimized HLO
    instruction count as ``jax.jit(jax.grad(f))``.  The labels are an
    argument, as in training (constant labels let XLA fold the masks the
    guards select with, and the guards with them)."""

    def f(x, w, labels):
        return -jnp.sum(_picked(jax.nn.log_softmax(jax.nn.relu(x) @ w), labels))

    assert _gradient_instructions(hlo_guard.guard(f)) == _gradient_instructions(f)


def _poisoned():
    """Row 2's logits hold an inf: its log_softmax is NaN, so its gradient is
    NaN in plain JAX wherever the row's zero cotangent meets it."""
    return LOGITS.at[2, 1].set(jnp.inf)


VALID = jnp.asarray([True, True, False, True])
OUT_OF_BOUNDS = jnp.asarray([0, 3, 7, 1])


def _double_where(x):
    """The hand-written fix: row 2 is neither valid nor read."""
    safe = jnp.where(VALID[:, None], x, 0.0)
    picked = _picked(jax.nn.log_softmax(safe), jnp.clip(OUT_OF_BOUNDS, 0, C - 1))
    return -jnp.sum(jnp.where(VALID, picked, 0.0))


#: losses where row 2 has no live lane: the guard must stay
ROW_DEAD = {
    "masked_after_the_gather": lambda x: (
        -jnp.sum(jnp.where(VALID, _picked(jax.nn.log_softmax(x), OUT_OF_BOUNDS, mode="clip"), 0.0))
    ),
    "out_of_bounds_with_a_finite_fill": lambda x: (
        -jnp.sum(_picked(jax.nn.log_softmax(x), OUT_OF_BOUNDS, fill_value=0.0))
    ),
}


@pytest.mark.parametrize("case", sorted(ROW_DEAD))
def test_a_row_without_a_live_lane_keeps_its_guard(case):
    f, x = ROW_DEAD[case], _poisoned()
    assert np.isnan(np.asarray(jax.grad(f)(x))[2]).all()  # the bug is there
    assert hlo_guard.explain(f, x).guards
    want = np.asarray(jax.grad(_double_where)(x))
    for g in (jax.grad(hlo_guard.guard(f)), jax.jit(jax.grad(hlo_guard.guard(f)))):
        np.testing.assert_array_equal(np.asarray(g(x)), want)


def test_an_out_of_bounds_label_under_the_nan_fill_is_plain_jax():
    """``take_along_axis``'s default: the out-of-bounds row's value is NaN, so
    the loss is NaN -- no clean gradient exists there, and the guarded one is
    plain JAX's (the other rows are exact)."""
    x = _poisoned()
    f = lambda x: -jnp.sum(_picked(jax.nn.log_softmax(x), OUT_OF_BOUNDS))
    assert np.isnan(np.asarray(f(x)))
    got = np.asarray(jax.jit(jax.grad(hlo_guard.guard(f)))(x))
    np.testing.assert_array_equal(got, np.asarray(jax.jit(jax.grad(f))(x)))


#: ``logp[arange(B), labels]`` and the ways users spell it: the row index
#: counts through every row, so each row has a read lane
ARANGE = {
    "arange_and_labels": lambda x, w: (
        -jnp.mean(jax.nn.log_softmax(jax.nn.relu(x) @ w)[jnp.arange(B), LABELS])
    ),
    "column_indices": lambda x, w: (
        -jnp.mean(jax.nn.log_softmax(x @ w)[jnp.arange(B)[:, None], LABELS[:, None]])
    ),
    "negative_labels": lambda x, w: (
        -jnp.sum(jax.nn.log_softmax(jnp.tanh(x) @ w)[jnp.arange(B), LABELS - C])
    ),
    "narrow_arange": lambda x, w: (
        -jnp.mean(jax.nn.log_softmax(x @ w)[jnp.arange(B, dtype=jnp.int16), LABELS])
    ),
    "arange_through_a_call": lambda x, w: (
        -jnp.mean(
            jax.jit(lambda lp, r, y: lp[r, y])(jax.nn.log_softmax(x @ w), jnp.arange(B), LABELS)
        )
    ),
    "diagonal": lambda x, w: (
        -jnp.mean(jax.nn.log_softmax(x @ w[:, :B])[jnp.arange(B), jnp.arange(B)])
    ),
}


@pytest.mark.parametrize("case", sorted(ARANGE))
def test_an_arange_row_index_covers_every_row(case):
    """Before, an arange was a value, not a promise: six guards here, each
    selecting nothing.  Its ``iota`` is read while tracing now."""
    _assert_no_guard_and_plain_jax(ARANGE[case])


def test_the_arange_loss_compiles_to_the_unguarded_program():
    def f(x, w, labels):
        return -jnp.mean(jax.nn.log_softmax(jax.nn.relu(x) @ w)[jnp.arange(B), labels])

    assert _gradient_instructions(hlo_guard.guard(f)) == _gradient_instructions(f)


#: row indices that skip a row (row 3, or rows 2 and 3): those rows have no
#: read lane, and the guard must stay
ROWS_SKIPPED = {
    "short_arange": (lambda: jnp.arange(B - 1), LABELS[: B - 1], [True, True, True, False]),
    "halved_arange": (lambda: jnp.arange(B) // 2, LABELS, [True, True, False, False]),
}


@pytest.mark.parametrize("case", sorted(ROWS_SKIPPED))
def test_a_row_index_that_skips_rows_keeps_the_guard(case):
    rows, labels, read = ROWS_SKIPPED[case]
    read = jnp.asarray(read)
    x = LOGITS.at[3, 1].set(jnp.inf)  # a skipped row, poisoned
    f = lambda x: -jnp.sum(jax.nn.log_softmax(x)[rows(), labels])

    def double_where(x):
        safe = jnp.where(read[:, None], x, 0.0)
        return -jnp.sum(jax.nn.log_softmax(safe)[rows(), labels])

    assert np.isnan(np.asarray(jax.grad(f)(x))[3]).all()  # the bug is there
    assert hlo_guard.explain(f, x).guards
    want = np.asarray(jax.grad(double_where)(x))
    assert np.isfinite(want).all()
    for g in (jax.grad(hlo_guard.guard(f)), jax.jit(jax.grad(hlo_guard.guard(f)))):
        got = np.asarray(g(x))
        # rows read twice sum their cotangents in an order XLA picks: an ulp
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
        np.testing.assert_array_equal(got[~np.asarray(read)], 0.0)


def test_a_reversed_arange_is_not_read_as_one():
    """``arange(B)[::-1]`` visits every row too, but only an ``iota`` the
    jaxpr spells is taken as a promise: the guards stay, and select nothing
    (the gradient is plain JAX's)."""
    f = lambda x: -jnp.sum(jax.nn.log_softmax(x)[jnp.arange(B)[::-1], LABELS])
    assert hlo_guard.explain(f, LOGITS).guards
    got = np.asarray(jax.jit(jax.grad(hlo_guard.guard(f)))(LOGITS))
    np.testing.assert_allclose(got, np.asarray(jax.grad(f)(LOGITS)), rtol=1e-6)


def test_a_genuine_singularity_in_a_read_lane_stays():
    """``log`` of a zero the label reads: the loss is +inf and its
    derivative there is genuinely infinite; no guard is there to hide it,
    and the guarded gradient is plain JAX's, non-finite lane included."""
    x = jnp.abs(LOGITS).at[1, 3].set(0.0)  # row 1's label is 3
    f = lambda x: -jnp.sum(_picked(jax.nn.log_softmax(jnp.log(x)), LABELS))
    plain = np.asarray(jax.grad(f)(x))
    assert not np.isfinite(plain[1, 3])
    got = np.asarray(jax.jit(jax.grad(hlo_guard.guard(f)))(x))
    assert not np.isfinite(got[1, 3])
    np.testing.assert_array_equal(got, plain)


def test_a_gather_of_every_row_leaves_nothing_dead():
    """``log(x)[arange(B)]`` reads every lane: no lane is dead, so no guard
    (before, the gather counted as a selection and ``log`` was guarded with
    a mask true everywhere).  ``log'(0)`` on a read lane is genuine: the
    gradient is plain JAX's, infinite lane included."""
    x = jnp.abs(LOGITS).at[2, 4].set(0.0)
    f = lambda x: jnp.sum(jnp.log(x)[jnp.arange(B)] * jnp.arange(1.0, C + 1))
    assert hlo_guard.explain(f, x).guards == []
    got = np.asarray(jax.jit(jax.grad(hlo_guard.guard(f)))(x))
    assert np.isinf(got[2, 4])
    np.testing.assert_array_equal(got, np.asarray(jax.jit(jax.grad(f))(x)))
