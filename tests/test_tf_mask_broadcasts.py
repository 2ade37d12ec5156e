"""TF masks kept as broadcasts of their source (hlo_guard.tf.mask_broadcasts).

Every operation is checked lane by lane against the same operation on dense
NumPy booleans; the structural facts (one bit, lies within, same broadcast)
against what the source makes true.  Then the user-visible effect: the
guarded TF MLP gradient (the ``make bench`` workload) carries no full-size
mask ORs, no second scatter for its cross-entropy and no zeroing of its
weights, and still equals the hand double where.
"""

import re

import numpy as np
import pytest
import tensorflow as tf

import hlo_guard.tf as hg
from hlo_guard.tf import mask_broadcasts as mb
from hlo_guard.tf import mask_ops
from passes.masks import ALL, NONE

ROWS = np.array([True, False, True, True, False])
COLS = np.array([False, True, True])


def _run(build):
    """Evaluate ``build()`` (masks built in a graph) to NumPy."""
    out = tf.function(build, autograph=False)()
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else t, out)


def _row_mask(shape=(5, 3)):
    return mb.emit(tf.constant(ROWS), shape, [0])


def _col_mask(shape=(5, 3)):
    return mb.emit(tf.constant(COLS), shape, [1])


def test_emit_is_the_broadcast_and_one_tensor_per_broadcast():
    def build():
        src = tf.constant(ROWS)
        a, b = mb.emit(src, (5, 3), [0]), mb.emit(src, (5, 3), [0])
        assert a is b and mb.is_recorded(a) and mb.same_broadcast(a, b)
        assert not mb.is_one_bit(a)
        return a

    np.testing.assert_array_equal(_run(build), np.broadcast_to(ROWS[:, None], (5, 3)))


@pytest.mark.parametrize("op", ["or", "and"])
def test_or_and_of_broadcasts_work_on_sources(op):
    fn = mask_ops.ALGEBRA.or_ if op == "or" else lambda a, b: mask_ops.and_(a, b)
    dense = np.logical_or if op == "or" else np.logical_and

    def build():
        rows, cols = _row_mask(), _col_mask()
        other_rows = mb.emit(tf.constant(~ROWS), (5, 3), [0])
        same = fn(rows, other_rows)
        # rows with rows stays a [5] source: a broadcast along axis 1
        assert mb.source_of(same)[1] == (0,)
        return fn(rows, cols), same

    mixed, same = _run(build)
    r, c = np.broadcast_to(ROWS[:, None], (5, 3)), np.broadcast_to(COLS, (5, 3))
    np.testing.assert_array_equal(mixed, dense(r, c))
    np.testing.assert_array_equal(same, dense(r, ~r))


def test_not_of_a_broadcast():
    def build():
        m = mask_ops.not_(_row_mask())
        assert mb.source_of(m)[1] == (0,)
        return m

    np.testing.assert_array_equal(_run(build), ~np.broadcast_to(ROWS[:, None], (5, 3)))


def test_reduce_to_a_broadcast_operand_and_an_empty_axis():
    def build():
        out = tf.TensorSpec([5, 3], tf.bool)
        to_col = mask_ops.reduce_to(_row_mask(), out, tf.TensorSpec([5, 1], tf.float32))
        to_row = mask_ops.reduce_to(_row_mask(), out, tf.TensorSpec([3], tf.float32))
        to_one = mask_ops.reduce_to(_col_mask(), out, tf.TensorSpec([1, 1], tf.float32))
        assert mb.is_one_bit(to_row) and mb.is_one_bit(to_one)
        # an operand broadcast along an empty axis is read by no lane
        empty = mb.reduce_to(mb.emit(tf.constant(ROWS), (5, 0), [0]), (5, 0), (5, 1))
        assert empty is NONE
        return to_col, to_row, to_one

    to_col, to_row, to_one = _run(build)
    np.testing.assert_array_equal(to_col, ROWS[:, None])
    np.testing.assert_array_equal(to_row, np.full(3, ROWS.any()))
    np.testing.assert_array_equal(to_one, [[COLS.any()]])


def test_any_over_and_reshape():
    def build():
        m = _row_mask((5, 3))
        # a [3, 5] operand whose axis 1 is the mask's rows; any over columns
        moved = mb.any_over(m, [1], (3, 5), lambda ax: 1)
        total = mb.any_over(m, [0], (4, 3), lambda ax: 1)
        assert mb.is_one_bit(total)
        reshaped = mb.reshape(m, (5, 1, 3))
        assert mb.reshape(m, (15,)) is None  # merges axes: not a broadcast any more
        return moved, total, reshaped

    moved, total, reshaped = _run(build)
    np.testing.assert_array_equal(moved, np.broadcast_to(ROWS, (3, 5)))
    np.testing.assert_array_equal(total, np.full((4, 3), ROWS.any()))
    np.testing.assert_array_equal(reshaped, np.broadcast_to(ROWS[:, None, None], (5, 1, 3)))


def test_a_mask_within_a_broadcast_ors_to_the_broadcast():
    def build():
        rows = _row_mask()
        inside = tf.logical_and(rows, tf.constant(np.eye(5, 3, dtype=bool)))
        mb.record_within(inside, *mb.source_of(rows))
        assert mask_ops.ALGEBRA.or_(inside, rows) is rows
        assert mask_ops.and_(rows, inside) is inside
        stranger = tf.constant(np.eye(5, 3, dtype=bool))
        assert mask_ops.ALGEBRA.or_(stranger, rows) is not rows
        return tf.constant(True)

    _run(build)


def test_sentinels_and_unknown_shapes_keep_the_plain_path():
    assert mb.source_of(ALL) is None and mb.is_one_bit(NONE)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.bool)], autograph=False)
    def build(m):
        assert mb.source_of(m) is None
        return mask_ops.ALGEBRA.or_(m, m)

    np.testing.assert_array_equal(build(tf.constant([[True, False, True]])), [[True, False, True]])


# -- the MLP of make bench ---------------------------------------------------------------


def _mlp_args(seed=0):
    from benchmarks.tf_workloads import mlp_inputs

    return mlp_inputs((16, 8, 12, 4), seed=seed)


def _grad_step(loss):
    @tf.function(jit_compile=True)
    def step(w1, w2, b2, x, labels, mask):
        with tf.GradientTape() as tape:
            tape.watch([w1, w2, b2])
            y = loss(w1, w2, b2, x, labels, mask)
        return [y] + tape.gradient(y, [w1, w2, b2])

    return step


def _opcodes(step, args) -> dict:
    text = step.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
    counts: dict = {}
    for line in text.splitlines():
        m = re.match(r"\s*(ROOT )?%?[\w.\-]+ = (\S+) (\w[\w-]*)\(", line)
        if m:
            counts[(m.group(3), m.group(2).startswith("pred[16,12]"))] = (
                counts.get((m.group(3), m.group(2).startswith("pred[16,12]")), 0) + 1
            )
    return counts


def test_mlp_gradient_masks_stay_small_and_weights_are_not_zeroed():
    from benchmarks.tf_workloads import mlp_loss, mlp_loss_dw

    args = _mlp_args()
    guarded = _grad_step(hg.guard(mlp_loss))
    plain = _grad_step(mlp_loss)
    g, u = _opcodes(guarded, args), _opcodes(plain, args)

    def total(counts, op):
        return sum(v for (name, _), v in counts.items() if name == op)

    # no OR of full-size [B, H] masks; the cross-entropy's gather adds no scatter
    assert g.get(("or", True), 0) == 0
    assert total(g, "scatter") == total(u, "scatter")
    record = hg.guard(mlp_loss)
    record_of = record.record_for(*args)
    zeroed = dict(record_of.contractions)
    # the weights (operand 1 of each MatMul) live or die together: not zeroed
    assert all(1 not in operands for operands in zeroed.values()), zeroed
    matmul_operands = [
        a.site.index for a in record_of.applied if record_of.graph.op(a.site.node).type == "MatMul"
    ]
    # the activations keep their boundary guards; the weights need none
    assert matmul_operands and 1 not in matmul_operands, matmul_operands
    for seed in (0, 1):
        args = _mlp_args(seed)
        got = [t.numpy() for t in guarded(*args)]
        want = [t.numpy() for t in _grad_step(mlp_loss_dw)(*args)]
        for a, b in zip(got, want):
            assert np.all(np.isfinite(a))
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_mlp_with_every_row_dead_has_exactly_zero_gradients():
    from benchmarks.tf_workloads import mlp_loss

    w1, w2, b2, x, labels, mask = _mlp_args()
    mask = tf.zeros_like(mask)
    out = _grad_step(hg.guard(mlp_loss))(w1, w2, b2, x, labels, mask)
    for g in out[1:]:
        np.testing.assert_array_equal(g.numpy(), np.zeros_like(g.numpy()))
