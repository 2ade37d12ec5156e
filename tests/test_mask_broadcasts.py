"""Masks stay at the predicate's shape until a guard needs the full one.

Unit tests of the broadcast-aware mask operations (``mask_ops``) and of the
boolean layout rules (``rules/structural.py``): every result is compared with
numpy on the materialised masks (the oracle), and the traced program is checked
for the work the broadcast form saves -- a test that would pass with the naive
implementation checks nothing about it.
"""

from __future__ import annotations

import gc
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from hlo_guard import guard
from hlo_guard.jax_frontend import mask_ops
from hlo_guard.jax_frontend.mask_ops import lax_ops
from hlo_guard.jax_frontend.surgery import spliced_program

RNG = np.random.default_rng(7)


def traced(fn, *arrays):
    """``fn`` applied to ``arrays`` as tracers: (result as numpy, jaxpr)."""
    closed = jax.make_jaxpr(fn)(*arrays)
    out = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, *arrays)
    return np.asarray(out[0] if isinstance(out, (list, tuple)) else out), closed.jaxpr


def prims(jaxpr):
    return [e.primitive.name for e in jaxpr.eqns]


def used_prims(jaxpr):
    """Primitives of the equations the outputs depend on (broadcasts made
    only in case a rule wants them stay in the trace, dead)."""
    from jax.extend.core import Var

    needed = {v for v in jaxpr.outvars if isinstance(v, Var)}
    names = []
    for e in reversed(jaxpr.eqns):
        if any(o in needed for o in e.outvars):
            names.append(e.primitive.name)
            needed.update(v for v in e.invars if isinstance(v, Var))
    return names


def bcast(src, shape, dims):
    """The oracle: numpy broadcast of ``src`` into ``shape`` along ``dims``."""
    expanded = np.reshape(src, [shape[d] if d in dims else 1 for d in range(len(shape))])
    return np.broadcast_to(expanded, shape)


@pytest.mark.parametrize("axes", [(2,), (0, 1), (1, 2), (0, 1, 2), (3,), (1, 3)])
def test_any_over_a_broadcast_reduces_only_the_source(axes):
    src = RNG.random((2, 5)) > 0.6
    shape, dims = (2, 3, 5, 4), (0, 2)

    def f(s):
        return lax_ops.any(lax_ops.broadcast_in_dim(s, shape, dims), axis=axes)

    got, jaxpr = traced(f, src)
    np.testing.assert_array_equal(got, np.any(bcast(src, shape, dims), axis=axes))
    # the only reduction (if any) is over the small source, never the 4-d mask
    for e in jaxpr.eqns:
        if e.primitive.name == "reduce_or":
            assert e.invars[0].aval.shape == src.shape


def test_and_or_not_of_broadcasts_work_on_the_sources():
    a = RNG.random((4, 1)) > 0.5  # [B, 1] stretched over the last axis
    b = RNG.random((4,)) > 0.5
    shape = (4, 6)

    def f(x, y):
        bx = lax_ops.broadcast_to(x, shape)
        by = lax_ops.broadcast_in_dim(y, shape, (0,))
        both = lax_ops.logical_and(bx, by)
        return lax_ops.logical_or(lax_ops.logical_not(both), by)

    got, jaxpr = traced(f, a, b)
    ba, bb = np.broadcast_to(a, shape), bcast(b, shape, (0,))
    np.testing.assert_array_equal(got, ~(ba & bb) | bb)
    for e in jaxpr.eqns:
        if e.primitive.name in ("and", "or", "not"):
            assert e.outvars[0].aval.shape == (4,), "bitwise op at the full shape"


@pytest.mark.parametrize(
    "shape,dims,new",
    [
        ((2, 8, 16), (0, 1), (2, 8, 2, 8)),  # split a broadcast axis (heads)
        ((2, 8, 2, 8), (0, 1), (2, 8, 16)),  # merge broadcast axes back
        ((2, 8, 16), (0, 1), (16, 16)),  # merge a source axis: not a broadcast any more
        ((2, 8, 16), (2,), (2, 8, 4, 4)),  # split the source axis: materialised
        ((3, 1, 4), (0,), (3, 4)),  # drop a size-1 axis
    ],
)
def test_reshape_of_a_broadcast(shape, dims, new):
    src = RNG.random([shape[d] for d in dims]) > 0.5

    def f(s):
        return lax_ops.reshape(lax_ops.broadcast_in_dim(s, shape, dims), new)

    got, _ = traced(f, src)
    np.testing.assert_array_equal(got, np.reshape(bcast(src, shape, dims), new))


@pytest.mark.parametrize(
    "axes,keepdims",
    [((2,), False), ((2,), True), ((0, 1), False), ((0, 1, 2), False), ((1,), True), ((0,), False)],
)
def test_any_over_whole_merged_axes_of_a_reshaped_broadcast_reduces_the_source(axes, keepdims):
    """A per-head mask ``[B, T, H]`` spread over the head's features and merged
    into ``[B, T, H * Dh]`` (a projection's output mask): ``any`` over whole
    merged axes reads the small source; the merged array is never reduced
    (XLA made a reduce-window kernel of each such reduction)."""
    src = RNG.random((2, 8, 3)) > 0.6
    shape, dims, merged = (2, 8, 3, 4), (0, 1, 2), (2, 8, 12)

    def f(s):
        m = lax_ops.reshape(lax_ops.broadcast_in_dim(s, shape, dims), merged)
        return lax_ops.any(m, axis=axes, keepdims=keepdims)

    got, jaxpr = traced(f, src)
    want = np.any(np.reshape(bcast(src, shape, dims), merged), axis=axes, keepdims=keepdims)
    np.testing.assert_array_equal(got, want)
    for e in jaxpr.eqns:
        if e.primitive.name == "reduce_or":
            assert e.invars[0].aval.shape == src.shape


def test_any_across_part_of_a_merged_axis_is_still_right():
    """Reducing a split axis of a reshaped broadcast only in part cannot be
    moved to the source; the result is still the numpy one."""
    src = RNG.random((2, 3)) > 0.5
    shape, dims = (2, 3, 4), (0, 1)

    def f(s):
        m = lax_ops.reshape(lax_ops.broadcast_in_dim(s, shape, dims), (2, 6, 2))
        return lax_ops.any(m, axis=(1,))

    got, _ = traced(f, src)
    np.testing.assert_array_equal(
        got, np.any(np.reshape(bcast(src, shape, dims), (2, 6, 2)), axis=1)
    )


@pytest.mark.parametrize("perm", list(itertools.permutations(range(3))))
def test_transpose_of_a_broadcast(perm):
    src = RNG.random((2, 4)) > 0.5
    shape, dims = (2, 3, 4), (0, 2)

    def f(s):
        return lax_ops.transpose(lax_ops.broadcast_in_dim(s, shape, dims), perm)

    got, jaxpr = traced(f, src)
    np.testing.assert_array_equal(got, np.transpose(bcast(src, shape, dims), perm))
    assert "transpose" not in used_prims(jaxpr) or perm_moves_source(dims, perm)


def perm_moves_source(dims, perm):
    """A transpose of the broadcast is needed only if it reorders source axes."""
    order = [perm.index(d) for d in dims]
    return order != sorted(order)


def test_broadcast_entries_do_not_outlive_their_mask():
    # earlier tests in this worker may leave masks only the cyclic collector
    # frees: collect first, or they vanish during this test and skew the count
    gc.collect()
    before = len(mask_ops._BROADCASTS._by_id)

    def f(s):
        return lax_ops.any(lax_ops.broadcast_in_dim(s, (3, 4), (0,)), axis=0)

    jax.make_jaxpr(f)(np.ones(3, bool))
    gc.collect()
    assert len(mask_ops._BROADCASTS._by_id) == before


# -- the boolean layout rules against JAX's own transpose on float masks ------


LAYOUT_CASES = [
    ("reshape", lambda x: jnp.reshape(x, (4, 3, 2)), (2, 3, 4)),
    ("squeeze", lambda x: lax.squeeze(x, (1,)), (3, 1, 4)),
    ("transpose", lambda x: jnp.transpose(x, (2, 0, 1)), (2, 3, 4)),
    ("broadcast_in_dim", lambda x: lax.broadcast_in_dim(x, (2, 5, 3, 4), (0, 2, 3)), (2, 1, 4)),
    ("reduce_sum", lambda x: jnp.sum(x, axis=(0, 2)), (2, 3, 4)),
    ("slice", lambda x: lax.slice(x, (0, 1, 1), (2, 3, 4), (1, 1, 2)), (2, 3, 4)),
    ("slice_empty", lambda x: lax.slice(x, (0, 1, 1), (2, 1, 4)), (2, 3, 4)),
    ("pad", lambda x: lax.pad(x, 0.0, ((1, 0, 0), (0, 2, 1), (0, 0, 0))), (2, 3, 4)),
    ("cumsum", lambda x: jnp.cumsum(x, axis=1), (2, 3, 4)),
    ("cumsum_reverse", lambda x: lax.cumsum(x, axis=2, reverse=True), (2, 3, 4)),
]


@pytest.mark.parametrize("name,op,shape", LAYOUT_CASES, ids=[c[0] for c in LAYOUT_CASES])
def test_layout_rule_masks_equal_the_transposed_float_mask(name, op, shape):
    """Guarding ``sqrt`` under ``where(m, op(sqrt(x)), 0)``: the gradient is
    the per-lane oracle (JAX's own VJP of ``op`` on the float mask says which
    ``x`` lanes are live), and the mask arithmetic has no float ops."""
    x = jnp.asarray(RNG.random(shape) * (RNG.random(shape) > 0.3), jnp.float32)
    out_shape = jax.eval_shape(op, x).shape
    m = jnp.asarray(RNG.random(out_shape) > 0.4)

    def f(x, m):
        return jnp.sum(jnp.where(m, op(jnp.sqrt(x)), 0.0))

    live = np.asarray(jax.vjp(op, jnp.zeros(shape))[1](m.astype(jnp.float32))[0]) != 0
    got = np.asarray(jax.grad(guard(f))(x, m))
    np.testing.assert_array_equal(got, np.asarray(jax.grad(lambda x: f_oracle(op, x, m))(x)))
    assert np.all(got[~live] == 0)
    jaxpr = spliced_program(jax.make_jaxpr(guard(f))(x, m)).jaxpr
    via_floats = [
        e.primitive.name
        for e in jaxpr.eqns
        if e.primitive.name == "convert_element_type"
        and e.invars[0].aval.dtype == np.bool_
        and jnp.issubdtype(e.outvars[0].aval.dtype, jnp.inexact)
    ]
    assert not via_floats, "the mask went through a float array"


@pytest.mark.parametrize("name,op,shape", LAYOUT_CASES, ids=[c[0] for c in LAYOUT_CASES])
def test_layout_rule_tangent_masks_equal_the_pushed_float_mask(name, op, shape):
    """Forward mode: ``sqrt(op(where(x > 0.5, x, 0)))`` at lanes whose
    tangent is structurally zero must have tangent 0, not ``sqrt'(0) * 0``;
    the oracle's live lanes come from JAX's own JVP of ``op`` on the float
    mask."""
    x = jnp.asarray(RNG.random(shape) * (RNG.random(shape) > 0.3), jnp.float32)

    def f(x):
        return jnp.sqrt(op(jnp.where(x > 0.5, x, 0.0)))

    tangent_live = np.asarray(jax.jvp(op, (jnp.zeros(shape),), ((x > 0.5).astype(x.dtype),))[1])
    live = tangent_live != 0

    def oracle(x):
        y = op(jnp.where(x > 0.5, x, 0.0))
        return jnp.where(live, jnp.sqrt(jnp.where(live, y, 1.0)), jnp.sqrt(lax.stop_gradient(y)))

    ones = (jnp.ones(shape),)
    want = np.asarray(jax.jvp(oracle, (x,), ones)[1])
    got = np.asarray(jax.jvp(guard(f), (x,), ones)[1])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("reverse", [False, True])
def test_cumprod_masks_have_the_lane_structure_of_cumsum(reverse):
    """``cumprod`` reads the lanes ``cumsum`` reads (its masks are
    ``cumsum``'s); its derivative multiplies, so JAX's VJP of ``cumprod`` at
    a probe point is no oracle for liveness: ``cumsum``'s is."""
    shape = (3, 5)
    x = jnp.asarray(RNG.random(shape) * (RNG.random(shape) > 0.3) + 0.0, jnp.float32)
    m = jnp.asarray(RNG.random(shape) > 0.6)

    def f(x, m):
        return jnp.sum(jnp.where(m, lax.cumprod(jnp.sqrt(x), axis=1, reverse=reverse), 0.0))

    summing = lambda z: lax.cumsum(z, axis=1, reverse=reverse)  # noqa: E731
    live = np.asarray(jax.vjp(summing, jnp.zeros(shape))[1](m.astype(jnp.float32))[0]) != 0

    def oracle(x):
        safe = jnp.where(live, x, 1.0)
        inner = jnp.where(live, jnp.sqrt(safe), jnp.sqrt(jax.lax.stop_gradient(x)))
        return jnp.sum(jnp.where(m, lax.cumprod(inner, axis=1, reverse=reverse), 0.0))

    assert not np.isfinite(np.asarray(jax.grad(f)(x, m))).all()
    got = np.asarray(jax.grad(guard(f))(x, m))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(np.asarray(jax.grad(oracle)(x))))
    np.testing.assert_allclose(got, np.asarray(jax.grad(oracle)(x)), rtol=1e-6)


def f_oracle(op, x, m):
    """Double where: the dead lanes of ``x`` never reach ``sqrt``'s derivative."""
    live = jax.vjp(op, jnp.zeros_like(x))[1](m.astype(x.dtype))[0] != 0
    safe = jnp.where(live, x, 1.0)
    return jnp.sum(jnp.where(m, op(jnp.where(live, jnp.sqrt(safe), 0.0)), 0.0))


def test_guarded_jaxpr_captures_no_activation_sized_constants():
    """Probing a structural op for its mask used to capture numpy zeros of the
    operand's shape as jaxpr constants, lowered into the HLO of every jit."""
    x = jnp.ones((4, 6, 8))

    def f(x):
        y = jnp.sqrt(x)[:, 1:5, ::2]  # slice: the generic (VJP) rule
        return jnp.sum(jnp.where(y > 1.0, y, 0.0))

    closed = spliced_program(jax.make_jaxpr(guard(f))(x))
    big = [c.shape for c in closed.consts if np.size(c) > 1]
    assert not big, big


@pytest.mark.parametrize("pad_lane_live", [False, True])
def test_pad_value_is_live_iff_a_padding_lane_is(pad_lane_live):
    """``pad``'s padding value is read by every padding lane: its mask is
    "any padding lane live" (the direct rule), checked against the per-lane
    answer: ``sqrt'(0)`` of a padding value no live lane reads gives 0, of
    one a live lane reads gives inf."""
    config = ((1, 1, 1),)
    x = jnp.array([4.0, 0.0, 9.0])  # padded: [v, 4, v, 0, v, 9, v]
    m = np.array([False, True, False, False, False, True, False])
    m[2] = pad_lane_live

    def f(x, v):
        return jnp.sum(jnp.where(m, jnp.sqrt(lax.pad(x, v, config)), 0.0))

    gx, gv = jax.grad(guard(f), argnums=(0, 1))(x, jnp.float32(0.0))
    np.testing.assert_allclose(gx, [0.25, 0.0, 1.0 / 6.0])
    assert np.isposinf(gv) if pad_lane_live else gv == 0.0
    _, pv = jax.grad(f, argnums=(0, 1))(x, jnp.float32(0.0))
    assert not np.isfinite(pv)  # the plain program: inf (live) or 0 * inf (dead)


# -- masks known to lie within a broadcast (a gather by row) -------------------


def test_a_size_one_reshape_is_a_broadcast_of_its_operand():
    """``[B] -> [B, 1]`` inserts only a size-1 axis: ``any`` over it, or a
    broadcast of it, works on the operand itself (no reduce, no reshape)."""
    row = RNG.random(4) > 0.5

    def f(r):
        col = lax_ops.reshape(r, (4, 1))
        assert mask_ops.broadcast_source(col)[0] is r
        assert lax_ops.any(col, axis=1) is r
        return lax_ops.broadcast_to(col, (4, 3))

    got, jaxpr = traced(f, row)
    np.testing.assert_array_equal(got, np.broadcast_to(row[:, None], (4, 3)))
    assert "reduce_or" not in used_prims(jaxpr)


def test_or_with_a_broadcast_a_mask_lies_within_is_that_broadcast():
    row = RNG.random(4) > 0.5
    inside = RNG.random((4, 3)) > 0.5
    inside &= row[:, None]  # the fact being recorded must hold

    col = RNG.random(3) > 0.5

    def f(r, s, c):
        wide = lax_ops.broadcast_in_dim(r, (4, 3), (0,))
        mask_ops.record_within(s, r, (0,))
        assert lax_ops.logical_or(s, wide) is wide
        assert lax_ops.logical_or(wide, s) is wide
        # a broadcast along the other axis, of a mask ``s`` is not known in, is not it
        other = lax_ops.broadcast_in_dim(c, (4, 3), (1,))
        return lax_ops.logical_or(s, other)

    got, jaxpr = traced(f, row, inside, col)
    np.testing.assert_array_equal(got, inside | col[None, :])
    assert "or" in used_prims(jaxpr)


def _cross_entropy(hazard, z, labels, rows):
    """Masked cross-entropy over rows, through a hazard on the logits."""
    logits = hazard(z)
    nll = (
        jax.nn.logsumexp(logits, axis=-1)
        - jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    )
    return jnp.sum(jnp.where(rows, nll, 0.0))


def test_cross_entropy_row_mask_needs_no_scatter():
    """The logits are read by ``logsumexp`` (every lane of a live row) and by
    the label gather (one lane of it): their mask is the row mask, and the
    guarded gradient has the hand double where's scatters (the gather's own
    transpose), not one more for the gather's mask.  The row mask is an
    argument: a mask known while tracing is folded away either way."""
    labels = jnp.array([0, 2, 1, 2])
    rows = jnp.array([True, False, True, False])
    z = jnp.array([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0], [3.0, 1.0, 2.0], [0.0, 4.0, 0.0]])

    def loss(z, rows):
        return _cross_entropy(jnp.sqrt, z, labels, rows)

    def loss_dw(z, rows):
        safe = jnp.where(rows[:, None], z, 1.0)
        return _cross_entropy(jnp.sqrt, safe, labels, rows)

    def scatters(fn):
        text = jax.jit(jax.grad(fn)).lower(z, rows).compile().as_text()
        return text.count(" scatter(")

    assert scatters(guard(loss)) == scatters(loss_dw)
    got = jax.grad(guard(loss))(z, rows)
    np.testing.assert_allclose(got, jax.grad(loss_dw)(z, rows), rtol=1e-6)
    assert np.all(got[~np.asarray(rows)] == 0)


def test_cross_entropy_singularity_on_a_live_row_stays():
    """The row mask the gather's mask is folded into guards dead rows only:
    ``sqrt'(0)`` in a live row (every lane of it feeds ``logsumexp``) is the
    program's own and stays infinite, as in the hand double where."""
    labels = jnp.array([0, 2, 1])
    rows = jnp.array([True, False, True])
    z = jnp.array([[1.0, 0.0, 0.5], [0.0, 0.0, 0.0], [3.0, 1.0, 2.0]])

    def loss(z, rows):
        return _cross_entropy(jnp.sqrt, z, labels, rows)

    def loss_dw(z, rows):
        return _cross_entropy(jnp.sqrt, jnp.where(rows[:, None], z, 1.0), labels, rows)

    got = np.asarray(jax.grad(guard(loss))(z, rows))
    want = np.asarray(jax.grad(loss_dw)(z, rows))
    assert not np.isfinite(got[0, 1])
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_array_equal(got[1], np.zeros(3))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6)


def test_a_gather_read_alone_keeps_its_lane_mask():
    """Only the gathered lane of a live row is live when nothing else reads
    the row: the unread lanes (sqrt'(0) = inf there) must stay guarded."""
    labels = jnp.array([0, 2, 1])
    rows = jnp.array([True, False, True])
    z = jnp.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 2.0, 0.0]])

    def loss(z):
        picked = jnp.take_along_axis(jnp.sqrt(z), labels[:, None], axis=-1)[:, 0]
        return jnp.sum(jnp.where(rows, picked, 0.0))

    def per_lane(z):  # the per-lane if: only the picked lanes of live rows
        read = jax.nn.one_hot(labels, 3, dtype=bool) & rows[:, None]
        return jnp.sum(jnp.where(read, jnp.sqrt(jnp.where(read, z, 1.0)), 0.0))

    np.testing.assert_array_equal(jax.grad(guard(loss))(z), jax.grad(per_lane)(z))
    np.testing.assert_array_equal(jax.jacfwd(guard(loss))(z), jax.jacfwd(per_lane)(z))


def _all_eqns(jaxpr):
    """Every equation, nested bodies included."""
    from jax.extend.core import ClosedJaxpr, Jaxpr

    for e in jaxpr.eqns:
        yield e
        for p in e.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                if isinstance(sub, ClosedJaxpr):
                    yield from _all_eqns(sub.jaxpr)
                elif isinstance(sub, Jaxpr):
                    yield from _all_eqns(sub)


def test_a_broadcast_mask_passed_into_a_call_body_stays_a_broadcast():
    """A call's output mask enters its rewritten body as an argument, a fresh
    tracer there: passed whole, a row mask broadcast over ``[B, H]`` was
    reduced again inside (``any`` over its broadcast axis, for the
    ``dot_general`` operands).  It is passed as its source and rebuilt as a
    known broadcast, so no full-size mask is reduced anywhere; the gradient is
    the hand double where's."""
    matmul = jax.jit(lambda a, b: a @ b)
    x = jnp.array(RNG.normal(size=(6, 4)), jnp.float32)
    w = jnp.array(RNG.normal(size=(4, 5)), jnp.float32)
    rows = jnp.array([True, False, True, True, False, True])

    def loss(x, w, rows):
        h = matmul(x, w)
        return jnp.sum(jnp.where(rows[:, None], jnp.log(jnp.abs(h)), 0.0))

    def loss_dw(x, w, rows):
        h = matmul(x, w)
        return jnp.sum(
            jnp.where(rows[:, None], jnp.log(jnp.abs(jnp.where(rows[:, None], h, 1.0))), 0.0)
        )

    x = x.at[1].set(0.0)  # a dead row at log's pole
    grad = jax.grad(guard(loss), argnums=(0, 1))
    jaxpr = jax.make_jaxpr(grad)(x, w, rows).jaxpr
    reduced = [
        e.invars[0].aval.shape
        for e in _all_eqns(jaxpr)
        if e.primitive.name == "reduce_or" and len(e.invars[0].aval.shape) == 2
    ]
    assert reduced == []
    for got, want in zip(grad(x, w, rows), jax.grad(loss_dw, argnums=(0, 1))(x, w, rows)):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_mask_lies_within_its_own_any_spread_back():
    """``any(s, axis)`` spread back over ``axis`` contains ``s``: the OR of
    the two (a softmax's input mask: its output lanes, or every lane of a
    row with one) is that broadcast, with no ``or`` in the program; with
    ``keepdims`` the result is a broadcast of the reduction itself."""
    inside = RNG.random((4, 3)) > 0.6

    def f(s):
        row = lax_ops.any(s, axis=1)
        wide = lax_ops.broadcast_in_dim(row, (4, 3), (0,))
        assert lax_ops.logical_or(s, wide) is wide
        assert lax_ops.logical_or(wide, s) is wide
        kept = lax_ops.any(s, axis=1, keepdims=True)
        assert lax_ops.reshape(kept, (4,)) is mask_ops.broadcast_source(kept)[0]
        # the other axis is not the one reduced: no such fact
        col = lax_ops.broadcast_in_dim(lax_ops.any(s, axis=0), (4, 3), (1,))
        return lax_ops.logical_or(lax_ops.logical_or(s, wide), col)

    got, jaxpr = traced(f, inside)
    want = inside.any(axis=1)[:, None] | inside.any(axis=0)[None, :]
    np.testing.assert_array_equal(got, np.broadcast_to(want, (4, 3)))
    assert used_prims(jaxpr).count("or") == 1


def test_a_gather_mask_keeps_its_row_fact_beside_its_own_any():
    """Both facts about one mask are kept: the gather rule's (within the
    row mask) and the one its ``any`` adds."""
    row = np.array([True, False, True, True])
    inside = (RNG.random((4, 3)) > 0.5) & row[:, None]

    def f(r, s):
        mask_ops.record_within(s, r, (0,))
        lax_ops.any(s, axis=0)  # records s within its column any
        wide = lax_ops.broadcast_in_dim(r, (4, 3), (0,))
        assert lax_ops.logical_or(s, wide) is wide
        return wide

    traced(f, row, inside)


def _log_softmax_cross_entropy(w, h, labels, rows):
    """Next-token cross entropy the usual way: ``log_softmax`` of a
    projection, the label's lane taken, averaged over real rows; the rows'
    norm is made safe with ``where`` (``sqrt'(0)`` in a padding row)."""
    n2 = jnp.sum(h * h, axis=-1, keepdims=True)
    z = jnp.where(n2 > 0, h / jnp.sqrt(n2), 0.0)
    logp = jax.nn.log_softmax(z @ w, axis=-1)
    nll = -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
    return jnp.sum(jnp.where(rows, nll, 0.0)) / jnp.maximum(jnp.sum(rows), 1)


def test_log_softmax_cross_entropy_weights_are_not_zeroed_lane_by_lane():
    """The projection's weights are live in every lane as soon as one row is
    (``log_softmax`` reads every logit of a live row): their mask is one bit,
    so the contraction does not zero them lane by lane -- no select of the
    weights' shape in the compiled gradient -- and the gradient equals the
    hand double where's, with a padding row's ``h`` exactly zero."""
    rng = np.random.default_rng(3)
    w = jnp.asarray(rng.normal(size=(5, 7)), jnp.float32)
    h = jnp.asarray(rng.normal(size=(6, 5)), jnp.float32).at[4].set(0.0)
    labels = jnp.array([0, 6, 3, 2, 1, 5])
    rows = jnp.array([True, True, False, True, False, True])

    def loss_dw(w, h, labels, rows):
        n2 = jnp.sum(h * h, axis=-1, keepdims=True)
        safe = jnp.where(n2 > 0, n2, 1.0)
        z = jnp.where(n2 > 0, h / jnp.sqrt(safe), 0.0)
        logp = jax.nn.log_softmax(z @ w, axis=-1)
        nll = -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
        return jnp.sum(jnp.where(rows, nll, 0.0)) / jnp.maximum(jnp.sum(rows), 1)

    guarded = guard(_log_softmax_cross_entropy)
    text = jax.jit(jax.grad(guarded)).lower(w, h, labels, rows).compile().as_text()
    assert " f32[5,7]{1,0} select(" not in text
    got = jax.grad(guarded, argnums=(0, 1))(w, h, labels, rows)
    want = jax.grad(loss_dw, argnums=(0, 1))(w, h, labels, rows)
    for g, d in zip(got, want):
        np.testing.assert_allclose(g, d, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(got[1])[4] == 0)


def test_absorption_needs_no_second_or_and():
    """``a | (a & b)`` is ``a``, ``(a | b) | b`` is ``a | b`` and ``(a & b) & a``
    is ``a & b``, for masks and for broadcasts of them along the same axes
    (a value read by several uses ORs their masks; one is often another's
    ``and`` with more): one ``and`` and one ``or`` in the program."""
    a = RNG.random((4,)) > 0.4
    b = RNG.random((4,)) > 0.4

    def f(a, b):
        both = lax_ops.logical_and(a, b)
        assert lax_ops.logical_or(a, both) is a
        assert lax_ops.logical_and(both, a) is both
        union = lax_ops.logical_or(a, b)
        assert lax_ops.logical_or(union, b) is union
        # the same facts through broadcasts of the masks along one axis
        wide = lambda m: lax_ops.broadcast_in_dim(m, (4, 3), (0,))  # noqa: E731
        assert mask_ops.broadcast_source(lax_ops.logical_or(wide(a), wide(both)))[0] is a
        return lax_ops.logical_or(wide(b), wide(union))

    got, jaxpr = traced(f, a, b)
    np.testing.assert_array_equal(got, np.broadcast_to((a | b)[:, None], (4, 3)))
    used = used_prims(jaxpr)
    assert used.count("or") == 1 and used.count("and") == 0


def test_a_broadcast_of_a_broadcast_with_its_axes_reordered_keeps_the_source():
    """A per-row mask spread over heads (``[B, H, T]``) and placed into a
    projection's layout with its axes in another order (``[B, T, H, D]``) is
    one broadcast of the row mask: reordering moves the small source, so an
    ``any`` over the rows afterwards (a weight's column mask) is one bit,
    with no transpose of the spread mask in the program."""
    rows = RNG.random((2, 8)) > 0.5

    def f(r):
        wide = lax_ops.broadcast_in_dim(r, (2, 3, 8), (0, 2))
        moved = lax_ops.broadcast_in_dim(wide, (2, 8, 3, 5), (0, 2, 1))
        assert mask_ops.broadcast_source(moved)[0] is r
        columns = lax_ops.any(moved, axis=(0, 1))
        assert mask_ops.is_one_bit(columns)
        return moved

    got, jaxpr = traced(f, rows)
    np.testing.assert_array_equal(got, np.broadcast_to(rows[:, :, None, None], (2, 8, 3, 5)))
    assert "transpose" not in used_prims(jaxpr)


def test_transformer_weights_are_not_zeroed_lane_by_lane():
    """In a two-layer pre-norm transformer (the ``make bench`` workload at a tiny
    size) a projection weight is dead only when every token is: the masks
    that reach it go through per-head layouts, and kept as broadcasts of the
    row mask they are one bit, so no weight is zeroed lane by lane (no
    select of a weight's shape in the compiled gradient).  The gradient
    equals the hand double where's."""
    from benchmarks.workloads.transformer_2layer import WORKLOAD

    params, x, targets, tok_mask = WORKLOAD.make_inputs((2, 8, 16, 2, 11), 0)
    args = (params, x, targets, tok_mask)
    guarded = guard(WORKLOAD.loss)
    text = jax.jit(jax.grad(guarded)).lower(*args).compile().as_text()
    assert " f32[16,16]{1,0} select(" not in text
    assert " f32[16,11]{1,0} select(" not in text
    got = jax.grad(guarded)(*args)
    want = jax.grad(WORKLOAD.loss_dw)(*args)
    for g, d in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g, d, rtol=1e-4, atol=1e-5)


def test_one_broadcast_per_source_shape_and_axes_in_a_trace():
    """A mask spread to one shape along the same axes twice is one equation
    (rules spread a row mask to the shape of every value they guard); a
    trace nested inside makes its own (reusing the outer trace's tracer there
    would leak it)."""
    row = RNG.random(4) > 0.5

    def f(r):
        a = lax_ops.broadcast_in_dim(r, (4, 3), (0,))
        assert lax_ops.broadcast_in_dim(r, (4, 3), (0,)) is a
        assert lax_ops.broadcast_in_dim(r, (4, 5), (0,)) is not a
        inner = jax.make_jaxpr(lambda y: lax_ops.broadcast_in_dim(r, (4, 3), (0,)) & y)(
            np.ones((4, 3), bool)
        )
        assert "broadcast_in_dim" in prims(inner.jaxpr)
        return lax_ops.logical_and(a, lax_ops.broadcast_in_dim(r, (4, 3), (0,)))

    got, jaxpr = traced(f, row)
    np.testing.assert_array_equal(got, np.broadcast_to(row[:, None], (4, 3)))
    assert used_prims(jaxpr) == ["broadcast_in_dim"]


def test_any_over_a_broadcast_still_knows_the_mask_lies_within_it():
    """The fact ``s <= spread(any(s))`` holds however ``any`` is computed:
    over a remembered broadcast it reduces the source, and the OR of ``s``
    with its spread ``any`` is still that spread, with no ``or``."""
    inside = RNG.random((4, 3)) > 0.6

    def f(m):
        s = lax_ops.broadcast_in_dim(m, (4, 3, 2), (0, 1))
        rows = lax_ops.any(s, axis=1)  # [4, 2]: a broadcast of any(m, 1)
        spread = lax_ops.broadcast_in_dim(rows, (4, 3, 2), (0, 2))
        assert lax_ops.logical_or(s, spread) is spread
        kept = lax_ops.any(s, axis=(1,), keepdims=True)
        assert lax_ops.logical_or(s, lax_ops.broadcast_to(kept, (4, 3, 2))) is not s
        return lax_ops.logical_or(s, lax_ops.broadcast_to(kept, (4, 3, 2)))

    got, jaxpr = traced(f, inside)
    want = np.broadcast_to(inside.any(axis=1)[:, None, None], (4, 3, 2))
    np.testing.assert_array_equal(got, want)
    assert "or" not in used_prims(jaxpr)


def test_a_stretched_size_one_axis_is_squeezed_once():
    """Spreading a ``[B, 1]`` mask over its size-1 axis squeezes it first;
    doing so twice in a trace makes one squeeze and one broadcast."""
    col = RNG.random((4, 1)) > 0.5

    def f(c):
        a = lax_ops.broadcast_in_dim(c, (4, 3), (0, 1))
        assert lax_ops.broadcast_in_dim(c, (4, 3), (0, 1)) is a
        return a

    got, jaxpr = traced(f, col)
    np.testing.assert_array_equal(got, np.broadcast_to(col, (4, 3)))
    assert prims(jaxpr).count("reshape") == 1
    assert prims(jaxpr).count("broadcast_in_dim") == 1


def test_log_softmax_cross_entropy_singularity_on_a_live_row_stays():
    """The vocabulary weights' one-bit mask and the rows' mask from the
    ``log_softmax`` guard dead rows only: ``sqrt'(0)`` in a live row is the
    program's own and stays infinite, as in the hand double where, while the
    padding row's derivative is exactly zero."""
    w = jnp.asarray(np.random.default_rng(4).normal(size=(3, 4)), jnp.float32)
    z = jnp.array([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0], [0.5, 1.0, 3.0]])
    labels = jnp.array([1, 0, 3])
    rows = jnp.array([True, False, True])

    def loss(z):
        logp = jax.nn.log_softmax(jnp.sqrt(z) @ w, axis=-1)
        nll = -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
        return jnp.sum(jnp.where(rows, nll, 0.0))

    def loss_dw(z):
        return loss(jnp.where(rows[:, None], z, 1.0))

    got = np.asarray(jax.grad(guard(loss))(z))
    want = np.asarray(jax.grad(loss_dw)(z))
    assert not np.isfinite(got[0, 1])
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want))
    np.testing.assert_array_equal(got[1], np.zeros(3))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-6)
