"""Per-rule checks of the TF table: each op, placed between a dead-lane source
and a singular derivative, against a hand-written double-where (or per-lane)
oracle under XLA, with the plain program shown to leak first."""

import numpy as np
import pytest
import tensorflow as tf
from test_tf_support import (
    assert_guard_mends_leak,
    assert_same,
    jvp_of_ones,
    xla_grads,
)

import hlo_guard.tf as hg
from passes.masks import ALL, NONE


def check(fn, oracle, *xs):
    assert_guard_mends_leak(fn, oracle, *[tf.constant(x, tf.float32) for x in xs])


def safe(x, keep, fill=1.0):
    return tf.where(keep, x, fill)


def test_relu_of_log():
    fn = lambda x: tf.nn.relu(tf.math.log(x))  # noqa: E731
    oracle = lambda x: tf.nn.relu(tf.math.log(safe(x, x > 1.0, 2.0)))  # noqa: E731
    check(fn, oracle, [0.0, 0.5, 2.0])


def test_select_v1_rank1_condition_picks_rows():
    def fn(x):
        rows = tf.constant([True, False])
        return tf.raw_ops.Select(condition=rows, x=tf.sqrt(x), y=tf.zeros_like(x))

    def oracle(x):
        keep = tf.constant([[True, True], [False, False]])
        return tf.where(keep, tf.sqrt(safe(x, keep)), 0.0)

    check(fn, oracle, [[1.0, 4.0], [0.0, 0.0]])


def test_reduce_min_of_neg_sqrt():
    fn = lambda x: tf.reduce_min(-tf.sqrt(x), axis=1)  # noqa: E731

    def oracle(x):
        keep = tf.equal(x, tf.reduce_max(x, axis=1, keepdims=True))
        return tf.reduce_min(-tf.sqrt(safe(x, keep)) * tf.cast(keep, x.dtype), axis=1)

    check(fn, oracle, [[0.0, 4.0], [9.0, 0.0]])


def test_concat_then_slice():
    def fn(x, y):
        z = tf.concat([tf.sqrt(x), tf.math.log(y)], axis=0)
        return z[1:3]

    def oracle(x, y):
        keep_x = tf.constant([False, True])
        keep_y = tf.constant([True, False])
        z = tf.concat([tf.sqrt(safe(x, keep_x)), tf.math.log(safe(y, keep_y))], axis=0)
        return z[1:3]

    check(fn, oracle, [0.0, 4.0], [2.0, 0.0])


def test_stack_and_gather_nd():
    def fn(x):
        s = tf.stack([tf.sqrt(x), tf.sqrt(x) * 2.0])
        return tf.gather_nd(s, [[0, 1], [1, 2]])

    def oracle(x):
        k0 = tf.constant([False, True, False])
        k1 = tf.constant([False, False, True])
        s = tf.stack([tf.sqrt(safe(x, k0)), tf.sqrt(safe(x, k1)) * 2.0])
        return tf.gather_nd(s, [[0, 1], [1, 2]])

    check(fn, oracle, [0.0, 4.0, 9.0])


def test_reshape_transpose_tile_broadcast():
    def fn(x):
        a = tf.transpose(tf.reshape(tf.sqrt(x), [2, 2]))
        b = tf.tile(a[:, :1], [1, 3]) + tf.broadcast_to(a[:1, :1], [2, 3])
        return b

    def oracle(x):
        keep = tf.constant([True, True, False, False])  # a[:, 0] reads x[0], x[1]
        a = tf.transpose(tf.reshape(tf.sqrt(safe(x, keep)), [2, 2]))
        return tf.tile(a[:, :1], [1, 3]) + tf.broadcast_to(a[:1, :1], [2, 3])

    check(fn, oracle, [1.0, 4.0, 0.0, 0.0])


def test_prod_reduction_is_guarded():
    def fn(x):
        return tf.where(x[:, 0] > 0, tf.reduce_prod(tf.sqrt(x), axis=1), 0.0)

    def oracle(x):
        keep = tf.broadcast_to(x[:, :1] > 0, tf.shape(x))
        return tf.where(x[:, 0] > 0, tf.reduce_prod(tf.sqrt(safe(x, keep)), axis=1), 0.0)

    check(fn, oracle, [[0.0, 1.0], [4.0, 9.0]])


def test_matmul_operand_guard():
    """Rows of log(x) @ w that a where drops: the gradient w.r.t. x is exact.
    (The gradient w.r.t. w contracts the dead row's -inf with a zero
    cotangent inside the matmul itself: see the README's limits.)"""
    w = tf.constant([[1.0, 2.0], [3.0, 4.0]])

    def fn(x):
        out = tf.matmul(tf.math.log(x), w)
        return tf.where(tf.constant([[True], [False]]), out, 0.0)

    def oracle(x):
        keep = tf.constant([[True, True], [False, False]])
        out = tf.matmul(tf.math.log(safe(x, keep)), w)
        return tf.where(tf.constant([[True], [False]]), out, 0.0)

    check(fn, oracle, [[1.0, 2.0], [0.0, 1.0]])


@pytest.mark.parametrize("op", ["Floor", "Sign", "StopGradient"])
def test_zero_derivative_ops_cut_liveness(op):
    """A value used only through a zero-derivative op gets no guard at all."""
    raw = getattr(tf.raw_ops, op)
    key = "input" if op == "StopGradient" else "x"
    g = hg.guard(lambda x: tf.where(raw(**{key: x}) > 0, tf.sqrt(x), 0.0))
    rep = hg.report(g, tf.constant([0.0, 1.0]))
    assert [s.op.split()[0] for s in rep.guards] == ["Sqrt"]


# -- MatMul / BatchMatMul masks: reduce-and-broadcast against TF's own gradient --


class _Values:
    """The ``mctx`` a rule reads values through: here the tensors themselves."""

    def value(self, t):
        return tf.stop_gradient(t)

    def shaped(self, t):
        return self.value(t)


def _both_matmul_masks(make, a, b, masks, dynamic):
    """(new, old) operand masks of ``make(a, b)`` for each output mask, the new
    ones by :func:`matmul_masks`, the old by TF's gradient."""
    from hlo_guard.tf.mask_ops import materialize
    from hlo_guard.tf.rules.structural import _probe_matmul_masks, matmul_masks

    sig = None
    if dynamic:
        sig = [tf.TensorSpec([None] * np.ndim(x), tf.float32) for x in (a, b)] + [
            tf.TensorSpec([None] * np.ndim(masks[0]), tf.bool)
        ]

    @tf.function(input_signature=sig, autograph=False)
    def run(a, b, m):
        out = make(a, b)
        assert out.shape.is_fully_defined() != dynamic
        op = out.op
        new = matmul_masks(_Values(), op, [m])
        old = _probe_matmul_masks(_Values(), op, [m])
        assert not any(x is NONE or x is ALL for x in new + old)  # masks of run-time values
        return (
            [materialize(x, t) for x, t in zip(new, op.inputs)],
            [materialize(x, t) for x, t in zip(old, op.inputs)],
        )

    for m in masks:
        new, old = run(tf.constant(a, tf.float32), tf.constant(b, tf.float32), tf.constant(m))
        for n, o, x in zip(new, old, (a, b)):
            assert n.shape == np.shape(x)
            np.testing.assert_array_equal(n.numpy(), o.numpy())


def _random_masks(shape, seed):
    rng = np.random.default_rng(seed)
    return [rng.random(shape) < p for p in (0.03, 0.1, 0.3, 0.7)]


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_masks_equal_gradient_masks(ta, tb, dynamic):
    m_, k_, n_ = 6, 4, 5
    a = np.ones((k_, m_) if ta else (m_, k_))
    b = np.ones((n_, k_) if tb else (k_, n_))
    make = lambda a, b: tf.raw_ops.MatMul(a=a, b=b, transpose_a=ta, transpose_b=tb)  # noqa: E731
    _both_matmul_masks(make, a, b, _random_masks((m_, n_), 0), dynamic)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("op", ["BatchMatMulV2", "BatchMatMulV3"])
@pytest.mark.parametrize(
    "adj_x,adj_y", [(False, False), (True, False), (False, True), (True, True)]
)
def test_batch_matmul_masks_equal_gradient_masks(adj_x, adj_y, op, dynamic):
    """Batch dims broadcast both ways ([2, 1] against [3]) and a missing one."""
    m_, k_, n_ = 3, 4, 5
    a = np.ones((2, 1) + ((k_, m_) if adj_x else (m_, k_)))
    b = np.ones((3,) + ((n_, k_) if adj_y else (k_, n_)))
    raw = getattr(tf.raw_ops, op)
    extra = {"Tout": tf.float32} if op == "BatchMatMulV3" else {}

    def make(a, b):
        return raw(x=a, y=b, adj_x=adj_x, adj_y=adj_y, **extra)

    _both_matmul_masks(make, a, b, _random_masks((2, 3, m_, n_), 1), dynamic)


@pytest.mark.parametrize("dynamic", [False, True])
def test_batch_matmul_v1_masks_equal_gradient_masks(dynamic):
    a, b = np.ones((2, 4, 3)), np.ones((2, 4, 5))
    make = lambda a, b: tf.raw_ops.BatchMatMul(x=a, y=b, adj_x=True)  # noqa: E731
    _both_matmul_masks(make, a, b, _random_masks((2, 3, 5), 2), dynamic)


def _mlp_loss(w1, w2, x, mask):
    h = tf.tanh(tf.matmul(x, w1))
    n = tf.sqrt(tf.reduce_sum(h * h, axis=-1, keepdims=True))
    z = tf.where(n > 0, h / n, 0.0)
    logits = tf.matmul(z, w2)
    per_row = tf.where(mask, tf.reduce_logsumexp(logits, axis=-1), 0.0)
    return tf.reduce_sum(per_row)


def test_guarded_mlp_gradient_has_no_extra_dots():
    """The operand masks of a matmul cost no matmul of their own: the guarded
    training step has as many ``dot`` instructions as the unguarded one."""
    import re

    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 8)).astype(np.float32)
    x[-4:] = 0.0
    mask = np.arange(16) < 12
    args = [
        tf.constant(rng.normal(size=(8, 16)), tf.float32),
        tf.constant(rng.normal(size=(16, 4)), tf.float32),
        tf.constant(x),
        tf.constant(mask),
    ]

    def step(loss):
        def run(w1, w2, x, mask):
            with tf.GradientTape() as tape:
                tape.watch([w1, w2])
                y = loss(w1, w2, x, mask)
            return tape.gradient(y, [w1, w2])

        return tf.function(run, jit_compile=True)

    def dots(fn):
        hlo = fn.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
        return len(re.findall(r"\bdot\(", hlo))

    guarded = step(hg.guard(_mlp_loss))
    plain = step(_mlp_loss)
    got = [g.numpy() for g in guarded(*args)]
    assert all(np.isfinite(g).all() for g in got)
    assert dots(plain) > 0
    assert dots(guarded) <= dots(plain)


# -- gathers along the first axis after the batch dims: a segment max, against TF's own gradient --

PICK_CASES = {
    # params shape, indices, axis, batch_dims
    "table": ((5, 2), [[3, 0, 3], [4, 1, 1]], 0, 0),
    "rows": ((4, 5), [3, 0, 4, 1], 1, 1),
    "rows_many": ((4, 5), [[3, 0], [4, 4], [1, 2], [0, 0]], 1, 1),
    "rows_trailing": ((4, 5, 2), [3, 0, 4, 1], 1, 1),
    "negative_axis": ((4, 5), [3, 0, 4, 1], -1, 1),
    "two_batch_dims": ((2, 3, 4), [[0, 3, 1], [2, 2, 0]], 2, 2),
    "two_batch_dims_negative_axis": ((2, 3, 4, 2), [[0, 3, 1], [2, 2, 0]], -2, 2),
}


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("int64", [False, True])
@pytest.mark.parametrize("case", sorted(PICK_CASES))
def test_gathered_lane_masks_equal_gradient_masks(case, int64, dynamic):
    """:func:`gathered_lane_masks` (a segment max, no gradient built) gives
    the lanes TF's own gradient sends a cotangent to, for random output masks."""
    from hlo_guard.tf.mask_ops import materialize
    from hlo_guard.tf.rules.structural import gathered_lane_masks, probe_masks

    shape, idx, axis, batch_dims = PICK_CASES[case]
    idx = np.array(idx, np.int64 if int64 else np.int32)
    out_shape = tf.gather(tf.zeros(shape), idx, axis=axis, batch_dims=batch_dims).shape
    sig = None
    if dynamic:
        sig = [
            tf.TensorSpec([None] * len(shape), tf.float32),
            tf.TensorSpec([None] * idx.ndim, idx.dtype),
            tf.TensorSpec([None] * len(out_shape), tf.bool),
        ]

    @tf.function(input_signature=sig, autograph=False)
    def run(params, indices, m):
        out = tf.gather(params, indices, axis=axis, batch_dims=batch_dims)
        op = out.op
        new = gathered_lane_masks(_Values(), op, [m])
        old = probe_masks(_Values(), op, [m])
        assert new is not None
        assert new[1:] == [NONE] * (len(op.inputs) - 1)
        return materialize(new[0], params), materialize(old[0], params)

    for m in _random_masks(out_shape, 3) + [np.ones(out_shape, bool)]:
        new, old = run(tf.zeros(shape), tf.constant(idx), tf.constant(m))
        assert new.shape == shape
        np.testing.assert_array_equal(new.numpy(), old.numpy())


def test_gathered_lane_masks_send_an_out_of_range_index_where_the_gradient_does():
    """Under XLA an index outside ``[0, N)`` raises nothing, and TF's gradient
    sends its cotangent to segment ``row * N + index`` of the flattened rows:
    a lane of a neighbouring row.  The mask marks that lane, as the gradient
    does (marking it dead would zero a cotangent the plain program has)."""
    from hlo_guard.tf.mask_ops import materialize
    from hlo_guard.tf.rules.structural import gathered_lane_masks, probe_masks

    @tf.function(jit_compile=True, autograph=False)
    def run(params, indices, m):
        op = tf.gather(params, indices, axis=1, batch_dims=1).op
        new = gathered_lane_masks(_Values(), op, [m])
        old = probe_masks(_Values(), op, [m])
        return materialize(new[0], params), materialize(old[0], params)

    new, old = run(tf.zeros((3, 4)), tf.constant([1, 7, -2]), tf.constant([True, True, True]))
    np.testing.assert_array_equal(new.numpy(), old.numpy())
    want = np.zeros((3, 4), bool)
    want[0, 1] = True  # row 0, index 1
    want[2, 3] = True  # row 1, index 7: segment 1 * 4 + 7 = 11
    want[1, 2] = True  # row 2, index -2: segment 2 * 4 - 2 = 6
    np.testing.assert_array_equal(new.numpy(), want)


def test_other_gathers_are_left_to_the_probe():
    from hlo_guard.tf.rules.structural import gathered_lane_masks

    @tf.function(autograph=False)
    def run(params, indices):
        ops = [
            tf.gather(params, indices, axis=1).op,  # past the (no) batch dims
            tf.gather(tf.zeros((4, 2, 5)), indices, axis=2, batch_dims=1).op,
            tf.gather(tf.zeros((4, 2), tf.int32), indices, axis=1, batch_dims=1).op,
        ]
        assert [gathered_lane_masks(_Values(), op, [ALL]) for op in ops] == [None] * 3
        return params

    run(tf.zeros((4, 5)), tf.constant([0, 1, 2, 3]))


def test_a_cross_entropy_gather_builds_no_gradient_probe():
    """The guarded cross-entropy's ``tf.gather(logits, labels, axis=1,
    batch_dims=1)`` gets its mask from a segment max: no probe copy and no
    gradient of it in the guarded program (they cost the first call about a
    tenth of a second), and the gradient still equals the double where."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 3)).astype(np.float32)
    x[-2:] = 0.0
    labels = tf.constant([0, 2, 1, 1, 0, 2])
    mask = tf.constant([True] * 4 + [False] * 2)

    def loss(x):
        n = tf.sqrt(tf.reduce_sum(x * x, axis=-1, keepdims=True))
        z = tf.where(n > 0, x / n, 0.0)
        nll = tf.reduce_logsumexp(z, -1) - tf.gather(z, labels, axis=1, batch_dims=1)
        return tf.reduce_sum(tf.where(mask, nll, 0.0))

    def oracle(x):
        ss = tf.reduce_sum(x * x, axis=-1, keepdims=True)
        n = tf.sqrt(tf.where(ss > 0, ss, 1.0))
        z = tf.where(ss > 0, x / n, 0.0)
        nll = tf.reduce_logsumexp(z, -1) - tf.gather(z, labels, axis=1, batch_dims=1)
        return tf.reduce_sum(tf.where(mask, nll, 0.0))

    guarded = hg.guard(loss)
    names = [op.name for op in guarded.get_concrete_function(tf.constant(x)).graph.get_operations()]
    assert any("hlo_guard_gather_mask" in n for n in names)
    assert not any("hlo_guard_probe" in n for n in names)
    (got,) = xla_grads(guarded, tf.constant(x))
    (want,) = xla_grads(oracle, tf.constant(x))
    assert_same(got, want)


# -- Einsum masks: reduce-transpose-broadcast against TF's own gradient --

EINSUM_CASES = {
    "projection": ("btd,dhk->bthk", [(2, 3, 4), (4, 2, 5)]),
    "scores": ("bthk,bshk->bhts", [(2, 3, 2, 4), (2, 5, 2, 4)]),
    "values": ("bhts,bshk->bthk", [(2, 2, 3, 5), (2, 5, 2, 4)]),
    "outer": ("i,j->ij", [(3,), (4,)]),
    "sum_out": ("ij,jk->i", [(3, 4), (4, 2)]),
    "transposed_out": ("ij,jk->ki", [(3, 4), (4, 2)]),
    "unary": ("ijk->kj", [(2, 3, 4)]),
}


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("case", sorted(EINSUM_CASES))
def test_einsum_masks_equal_gradient_masks(case, dynamic):
    """:func:`einsum_masks` gives each operand the lanes TF's gradient (the
    probe, every other operand replaced by ones) sends a cotangent to."""
    from hlo_guard.tf.mask_ops import materialize
    from hlo_guard.tf.rules.products import einsum_masks
    from hlo_guard.tf.rules.structural import probe_masks

    equation, shapes = EINSUM_CASES[case]
    xs = [tf.ones(s) for s in shapes]
    out_shape = tf.einsum(equation, *xs).shape
    sig = None
    if dynamic:
        sig = [tf.TensorSpec([None] * len(s), tf.float32) for s in shapes]
        sig.append(tf.TensorSpec([None] * len(out_shape), tf.bool))

    @tf.function(input_signature=sig, autograph=False)
    def run(*args):
        *xs, m = args
        op = tf.einsum(equation, *xs).op
        assert op.type == "Einsum"
        new = einsum_masks(_Values(), op, [m])
        old = probe_masks(_Values(), op, [m], bilinear=True)
        return (
            [materialize(a, x) for a, x in zip(new, xs)],
            [materialize(b, x) for b, x in zip(old, xs)],
        )

    for m in _random_masks(out_shape, 4):
        new, old = run(*xs, tf.constant(m))
        for n, o, x in zip(new, old, xs):
            assert n.shape == x.shape
            np.testing.assert_array_equal(n.numpy(), o.numpy())


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("case", sorted(EINSUM_CASES))
def test_einsum_forward_masks_equal_jvp_masks(case, dynamic):
    """Forward mode: :func:`einsum_forward_masks` marks the output lanes TF's
    own JVP (the probe, other operands ones) makes non-zero, for random
    operand tangent masks, one operand's mask at a time and all together."""
    from hlo_guard.tf.mask_ops import materialize
    from hlo_guard.tf.rules.products import einsum_forward_masks
    from hlo_guard.tf.rules.structural import probe_forward_masks

    equation, shapes = EINSUM_CASES[case]
    xs = [tf.ones(s) for s in shapes]
    sig = None
    if dynamic:
        sig = [tf.TensorSpec([None] * len(s), tf.float32) for s in shapes]
        sig += [tf.TensorSpec([None] * len(s), tf.bool) for s in shapes]

    @tf.function(input_signature=sig, autograph=False)
    def run(*args):
        xs, ms = args[: len(shapes)], args[len(shapes) :]
        op = tf.einsum(equation, *xs).op
        results = []
        choices = [list(ms)] + [
            [m if j == i else NONE for j, m in enumerate(ms)] for i in range(len(ms))
        ]
        for masks in choices:
            (new,) = einsum_forward_masks(_Values(), op, masks)
            (old,) = probe_forward_masks(_Values(), op, masks, bilinear=True)
            results.append((materialize(new, op.outputs[0]), materialize(old, op.outputs[0])))
        return results

    rng = np.random.default_rng(5)
    for p in (0.05, 0.3):
        ms = [tf.constant(rng.random(s) < p) for s in shapes]
        for new, old in run(*xs, *ms):
            np.testing.assert_array_equal(new.numpy(), old.numpy())


def test_einsum_masks_leave_diagonals_and_ellipses_to_the_probe():
    from hlo_guard.tf.rules.products import einsum_masks

    @tf.function(autograph=False)
    def run(a, b):
        ops = [
            tf.einsum("ii->i", a).op,
            tf.einsum("...j,jk->...k", a, b).op,
        ]
        assert [einsum_masks(_Values(), op, [ALL]) for op in ops] == [None, None]
        return a

    run(tf.ones((3, 3)), tf.ones((3, 2)))


# -- convolution masks on one channel, against TF's own gradient of the full probe --

CONV_CASES = {
    # input shape, filter shape, conv kwargs
    "same": ((2, 6, 5, 3), (3, 3, 3, 4), dict(strides=1, padding="SAME")),
    "valid_stride": ((2, 7, 6, 2), (2, 3, 2, 3), dict(strides=2, padding="VALID")),
    "dilated": ((1, 8, 7, 2), (3, 2, 2, 2), dict(strides=1, padding="SAME", dilations=2)),
    "dilated_unevenly_valid": (
        (2, 9, 8, 3),
        (2, 3, 3, 2),
        dict(strides=1, padding="VALID", dilations=[3, 2]),
    ),
    "dilated_conv3d": (
        (1, 7, 5, 6, 2),
        (2, 2, 3, 2, 2),
        dict(strides=[1, 1, 1, 1, 1], padding="SAME", dilations=[1, 2, 1, 2, 1]),
    ),
    "explicit": (
        (1, 5, 5, 2),
        (3, 3, 2, 2),
        dict(strides=2, padding=[[0, 0], [2, 1], [0, 2], [0, 0]]),
    ),
    "conv1d_as_tf_runs_it": ((2, 1, 9, 3), (1, 3, 3, 4), dict(strides=2, padding="SAME")),
    "conv3d": ((1, 4, 5, 3, 2), (2, 2, 2, 2, 3), dict(strides=[1, 1, 2, 1, 1], padding="SAME")),
}


def _conv(x, w, kwargs):
    if x.shape.rank == 5:
        return tf.nn.conv3d(x, w, **kwargs)
    return tf.nn.conv2d(x, w, **kwargs)


def _tf_differentiates_dilated_convolutions() -> bool:
    """Whether TF's CPU kernels here have a gradient for a dilated
    convolution: the Eigen kernels TF uses where oneDNN is off (an x86 CPU
    without AVX-512, seen 2026-11-28) raise "Current CPU implementations do
    not yet support dilation rates larger than 1" for plain TF too."""
    x, w = tf.ones((1, 7, 7, 1)), tf.ones((3, 3, 1, 1))
    with tf.GradientTape() as tape:
        tape.watch(w)
        y = tf.nn.conv2d(x, w, strides=1, padding="VALID", dilations=2)
    try:
        tape.gradient(y, w)
    except tf.errors.InvalidArgumentError:
        return False
    return True


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_masks_equal_gradient_masks(case):
    """:func:`conv_masks` (one channel) gives each operand the lanes TF's
    gradient of the full probe sends a cotangent to, and the forward masks
    the lanes the full probe's JVP makes non-zero."""
    from hlo_guard.tf.mask_ops import materialize
    from hlo_guard.tf.rules.products import conv_forward_masks, conv_masks
    from hlo_guard.tf.rules.structural import probe_forward_masks, probe_masks

    x_shape, w_shape, kwargs = CONV_CASES[case]
    # The oracle is TF's gradient of the dilated convolution, which TF's CPU
    # kernels lack without oneDNN (and for Conv3D lack altogether, forward
    # included); XLA's have it.  (conv_masks itself runs without XLA there:
    # test_guarded_dilated_convolution_runs_without_xla.)
    dilated = np.any(np.asarray(kwargs.get("dilations", 1)) != 1)
    oracle_needs_xla = dilated and (
        len(x_shape) == 5 or not _tf_differentiates_dilated_convolutions()
    )
    out_shape = (
        tf.function(lambda x, w: _conv(x, w, kwargs))
        .get_concrete_function(tf.TensorSpec(x_shape), tf.TensorSpec(w_shape))
        .structured_outputs.shape
    )

    @tf.function(autograph=False, jit_compile=oracle_needs_xla)
    def run(x, w, m, mx, mw):
        op = _conv(x, w, kwargs).op
        assert op.type in ("Conv2D", "Conv3D")
        pairs = list(
            zip(conv_masks(_Values(), op, [m]), probe_masks(_Values(), op, [m], bilinear=True))
        )
        mine = [materialize(a, t) for (a, _), t in zip(pairs, (x, w))]
        theirs = [materialize(b, t) for (_, b), t in zip(pairs, (x, w))]
        for masks in ([mx, mw], [mx, NONE], [NONE, mw]):
            (a,) = conv_forward_masks(_Values(), op, masks)
            (b,) = probe_forward_masks(_Values(), op, masks, bilinear=True)
            mine.append(materialize(a, op.outputs[0]))
            theirs.append(materialize(b, op.outputs[0]))
        return mine, theirs

    rng = np.random.default_rng(6)
    for p in (0.05, 0.3):
        masks = [rng.random(s) < p for s in (out_shape, x_shape, w_shape)]
        mine, theirs = run(tf.ones(x_shape), tf.ones(w_shape), *map(tf.constant, masks))
        for a, b in zip(mine, theirs):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_grouped_conv_is_left_to_the_probe():
    from hlo_guard.tf.rules.products import conv_forward_masks, conv_masks

    @tf.function(autograph=False)
    def run(x, w):
        op = tf.nn.conv2d(x, w, 1, "SAME").op  # 4 input channels, filter of 2: two groups
        assert conv_masks(_Values(), op, [ALL]) is None
        assert conv_forward_masks(_Values(), op, [ALL, ALL]) is None
        return x

    run(tf.ones((1, 4, 4, 4)), tf.ones((3, 3, 2, 4)))


def test_guarded_masked_conv1d_gradient_costs_no_extra_convolution():
    """A padded sequence through a Conv1D (a text or audio model): the
    operand masks cost no full-size convolution of their own (the probe's
    backward convolution was one more per partly dead operand: 1.57x the
    plain step at B=8, T=256, 64 -> 128 channels; now 1.15x), and the
    gradient equals the double where, under XLA."""
    import re

    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 10, 8)).astype(np.float32)
    valid = np.ones((3, 10), bool)
    valid[:, 7:] = False
    x[~valid] = 0.0
    args = [
        tf.constant(rng.normal(size=(3, 8, 16)) / 4, tf.float32),
        tf.constant(x),
        tf.constant(valid),
    ]

    def loss(w, x, valid, safe_norm=False):
        n2 = tf.reduce_sum(x * x, -1, keepdims=True)
        inner = tf.where(n2 > 0, n2, 1.0) if safe_norm else n2
        xn = tf.where(n2 > 0, x * tf.math.rsqrt(inner), 0.0)
        h = tf.nn.conv1d(xn, w, 1, "SAME")
        return tf.reduce_sum(tf.where(valid[..., None], h * h, 0.0))

    def step(loss):
        def run(w, x, valid):
            with tf.GradientTape() as tape:
                tape.watch([w, x])
                y = loss(w, x, valid)
            return tape.gradient(y, [w, x])

        return tf.function(run, jit_compile=True)

    def convolved_lanes(fn):
        """Output lanes of all the program's convolutions."""
        hlo = fn.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
        shapes = re.findall(r"= \w+\[([\d,]*)\]\S* convolution\(", hlo)
        return sum(int(np.prod([int(d) for d in s.split(",")])) for s in shapes)

    guarded, plain = step(hg.guard(loss)), step(loss)
    oracle = step(lambda *a: loss(*a, safe_norm=True))
    assert not np.isfinite(plain(*args)[1].numpy()).all()
    for g, w in zip(guarded(*args), oracle(*args)):
        assert_same(g.numpy(), w.numpy(), rtol=1e-5)  # XLA fuses the two differently
    # the probe's two backward convolutions added 40 % to the plain program's
    # (x: [3, 10, 8], w: [3, 8, 16]); the one-channel masks add 2 %
    assert convolved_lanes(plain) > 0
    assert convolved_lanes(guarded) <= 1.1 * convolved_lanes(plain)


def _attention_loss(wq, wk, x, valid, safe_norm=False):
    n2 = tf.reduce_sum(x * x, -1, keepdims=True)
    inner = tf.where(n2 > 0, n2, 1.0) if safe_norm else n2
    xn = tf.where(n2 > 0, x * tf.math.rsqrt(inner), 0.0)
    q = tf.einsum("btd,dhk->bthk", xn, wq)
    k = tf.einsum("btd,dhk->bthk", xn, wk)
    s = tf.einsum("bthk,bshk->bhts", q, k)
    s = tf.where(valid[:, None, None, :], s, -1e9)
    o = tf.einsum("bhts,bshk->bthk", tf.nn.softmax(s, -1), k)
    return tf.reduce_sum(tf.where(valid, tf.reduce_sum(o * o, [-1, -2]), 0.0))


def test_guarded_einsum_attention_gradient_has_no_extra_dots():
    """The operand masks of an einsum cost no einsum of their own: the guarded
    attention's gradient has as many ``dot`` instructions as the unguarded
    one (with the probe it had 8 more of these 12), and equals the double
    where."""
    import re

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 6, 8)).astype(np.float32)
    valid = np.ones((2, 6), bool)
    valid[:, -2:] = False
    x[~valid] = 0.0
    args = [
        tf.constant(rng.normal(size=(8, 2, 4)) / 3, tf.float32),
        tf.constant(rng.normal(size=(8, 2, 4)) / 3, tf.float32),
        tf.constant(x),
        tf.constant(valid),
    ]

    def step(loss):
        def run(wq, wk, x, valid):
            with tf.GradientTape() as tape:
                tape.watch([wq, wk, x])
                y = loss(wq, wk, x, valid)
            return tape.gradient(y, [wq, wk, x])

        return tf.function(run, jit_compile=True)

    def dots(fn):
        hlo = fn.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
        return len(re.findall(r"\bdot\(", hlo))

    guarded = step(hg.guard(_attention_loss))
    plain = step(_attention_loss)
    oracle = step(lambda *a: _attention_loss(*a, safe_norm=True))
    assert not np.isfinite(plain(*args)[2].numpy()).all()
    for g, w in zip(guarded(*args), oracle(*args)):
        assert_same(g.numpy(), w.numpy())
    assert dots(plain) > 0
    assert dots(guarded) <= dots(plain)
    # forward mode through the same einsums, tangent in x: the double where's
    wq, wk, _, valid = args
    tangent = lambda loss: jvp_of_ones(lambda x: loss(wq, wk, x, valid), args[2])  # noqa: E731
    oracle_jvp = tangent(lambda *a: _attention_loss(*a, safe_norm=True))
    assert_same(tangent(hg.guard(_attention_loss)), oracle_jvp)


SUM_CASES = [(-1, True), (0, False), ((0, 1), False), (None, True), (1, False)]


@pytest.mark.parametrize("reduce", [tf.reduce_sum, tf.reduce_mean], ids=["sum", "mean"])
@pytest.mark.parametrize("axis,keepdims", SUM_CASES)
def test_sum_and_mean_send_a_result_lanes_mask_to_the_lanes_it_summed(reduce, axis, keepdims):
    """Reverse: a summed lane is dead iff its result lane is (the direct
    ``Summing`` masks, no gradient probe), against the double where built
    from the plain program's own values."""
    x = np.array([[0.0, -1.0, 0.0], [1.0, 4.0, 9.0], [0.0, 0.0, 0.0]], np.float32)

    def fn(x):
        s = reduce(tf.sqrt(x), axis=axis, keepdims=keepdims)
        return tf.where(s > 1.0, s, 0.0)

    s = reduce(tf.sqrt(x), axis=axis, keepdims=True).numpy()
    keep = np.broadcast_to(s > 1.0, x.shape)

    def oracle(x):
        s = reduce(tf.sqrt(tf.where(keep, x, 1.0)), axis=axis, keepdims=keepdims)
        return tf.where(s > 1.0, s, 0.0)

    (plain,) = xla_grads(fn, tf.constant(x))
    assert not np.isfinite(plain).all()
    (want,) = xla_grads(oracle, tf.constant(x))
    (got,) = xla_grads(hg.guard(fn), tf.constant(x))
    assert_same(got, want)


@pytest.mark.parametrize("reduce", [tf.reduce_sum, tf.reduce_mean], ids=["sum", "mean"])
@pytest.mark.parametrize("axis,keepdims", SUM_CASES)
def test_sum_and_mean_tangent_is_live_where_a_summed_lane_is(reduce, axis, keepdims):
    """Forward: a result lane whose summed lanes all took the constant branch
    has a structurally zero tangent; ``sqrt'(0)`` must not turn it into NaN."""
    x = tf.constant([[0.0, -1.0, 0.0], [1.0, 4.0, 0.0], [-2.0, 0.0, 0.0]])

    def fn(x):
        return tf.sqrt(reduce(tf.where(x > 0, x, 0.0), axis=axis, keepdims=keepdims))

    def oracle(x):
        s = reduce(tf.where(x > 0, x, 0.0), axis=axis, keepdims=keepdims)
        live = tf.reduce_any(x > 0, axis=axis, keepdims=keepdims)
        return tf.where(live, tf.sqrt(tf.where(live, s, 1.0)), tf.sqrt(tf.stop_gradient(s)))

    def jvp(f):
        return jvp_of_ones(f, x)

    if axis not in (None, (0, 1)):  # a total sum has a live lane: nothing leaks
        assert not np.isfinite(jvp(fn)).all()
    assert_same(jvp(hg.guard(fn)), jvp(oracle))


def test_guarded_dilated_convolution_runs_without_xla():
    """A guarded TF function with a dilated ``Conv2D`` behind a ``where``
    computes the convolution's masks with a one-channel gradient of the
    convolution (:func:`conv_masks`).  TF's CPU kernels without oneDNN (an
    x86 CPU without AVX-512) have no gradient for a dilated convolution, and
    the probe used to raise there in the *forward* pass, where plain TF runs
    (found 2026-11-28); it now differentiates an undilated copy with a
    zero-stuffed filter.  The gradient is compared with the hand double
    where under XLA, which differentiates dilated convolutions anywhere."""
    import hlo_guard.tf as hg

    x = tf.constant(np.random.default_rng(0).random((1, 8, 8, 2)), tf.float32)
    w = tf.constant(np.random.default_rng(1).random((3, 3, 2, 2)), tf.float32)

    def conv(x, w):
        return tf.nn.conv2d(x, w, strides=1, padding="SAME", dilations=2)

    def f(x, w):
        y = conv(x, w)
        return tf.reduce_sum(tf.where(y > 1.5, tf.sqrt(y - 1.5), 0.0))

    def double_where(x, w):
        y = conv(x, w)
        safe = tf.where(y > 1.5, y, 2.5)
        return tf.reduce_sum(tf.where(y > 1.5, tf.sqrt(safe - 1.5), 0.0))

    np.testing.assert_array_equal(hg.guard(f)(x, w).numpy(), f(x, w).numpy())
    assert np.any(conv(x, w).numpy() <= 1.5) and np.any(conv(x, w).numpy() > 1.5)

    def gradient(fn):
        @tf.function(jit_compile=True)
        def run(x, w):
            with tf.GradientTape() as tape:
                tape.watch([x, w])
                out = fn(x, w)
            return tape.gradient(out, [x, w])

        return run(x, w)

    for a, b in zip(gradient(hg.guard(f)), gradient(double_where)):
        assert np.all(np.isfinite(a.numpy()))
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
