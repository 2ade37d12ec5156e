"""Differential fuzzing of the TF front end: random programs, guarded, under
XLA, against a per-lane oracle.

The trees are the JAX fuzzer's (:mod:`fuzzlib.program`, drawn by
:mod:`fuzzlib.strategies` from the ops TF has), interpreted with TF ops
(:mod:`fuzzlib.tf_programs`).  For each: (1) the guarded forward values under
XLA are bitwise the plain ones, (2) the guarded XLA gradient equals the
lane-by-lane eager oracle in which an unselected branch never runs, and
(3) a lane where the oracle's derivative is non-finite (a taken-path
singularity) stays non-finite.  This is what holds the boundary placement to
its proof on the TF side (docs/PLACEMENT.md).

``make test`` runs a small deterministic sample (``HLO_GUARD_TF_FUZZ_EXAMPLES``,
default 25); ``make fuzz`` runs more.
"""

import os

import numpy as np
import pytest
import tensorflow as tf
from fuzzlib.checks import assert_bitwise_equal, assert_grads_match, describe
from fuzzlib.program import Binary, Const, Gather, Leaf, SetAt, Unary, Where
from fuzzlib.strategies import input_vectors, programs
from fuzzlib.tf_programs import (
    TF_UNARY,
    NotComparable,
    as_function,
    forward_comparable,
    oracle_grads,
)
from hypothesis import HealthCheck, Phase, event, given, seed, settings
from test_tf_support import xla_forward

import hlo_guard.tf as hg

EXAMPLES = int(os.environ.get("HLO_GUARD_TF_FUZZ_EXAMPLES", "25"))
#: shrinking a failure retraces TF functions for minutes: on request only
SEED = os.environ.get("HLO_GUARD_TF_FUZZ_SEED")  # explore another random stream
SHRINK = os.environ.get("HLO_GUARD_TF_FUZZ_SHRINK", "") not in ("", "0")


def xla_grads(fn, x, y):
    """d(sum of fn)/d(x, y) under XLA; an input the program never reads has
    a zero gradient (as in the oracle)."""

    @tf.function(jit_compile=True)
    def run(x, y):
        with tf.GradientTape() as tape:
            tape.watch([x, y])
            total = tf.reduce_sum(fn(x, y))
        grads = tape.gradient(total, [x, y], unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [tf.convert_to_tensor(g) for g in grads]  # a gather's IndexedSlices

    return [g.numpy() for g in run(tf.constant(x), tf.constant(y))]


def assert_same_forward(got, want):
    """Bitwise equal, except that a NaN may come out with another sign or
    payload: XLA folds constant subtrees (``arccosh(arccosh(-2))``) in one
    compilation and not in the other, and TF's graphs of the two programs
    differ, so the two NaNs can differ in their bits.  A NaN where the plain
    program has a number, or the reverse, still fails."""
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all(), f"XLA forward: NaN lanes differ\n  {got!r}\n  {want!r}"
    assert_bitwise_equal(got[~nan], want[~nan], "XLA forward")


def check_tf_program(root, x, y, guard=hg.guard):
    """Every check on one program; AssertionError naming the failure.
    ``guard=lambda f: f`` checks plain TF (which must fail on leaking programs)."""
    try:
        plain = as_function(root)
        guarded = guard(plain)
        if not forward_comparable(root, x, y):
            return "not comparable"  # XLA's fast min/max meets a NaN (see forward_comparable)
        assert_same_forward(xla_forward(guarded, x, y).numpy(), xla_forward(plain, x, y).numpy())
        try:
            ox, oy = oracle_grads(root, x, y)
        except NotComparable:
            return "not comparable"
        gx, gy = xla_grads(guarded, x, y)
        assert_grads_match(gx, ox, "XLA grad wrt x")
        assert_grads_match(gy, oy, "XLA grad wrt y")
        for got, want, name in ((gx, ox, "x"), (gy, oy, "y")):
            hidden = ~np.isfinite(want) & np.isfinite(got)
            assert not hidden.any(), (
                f"guard hid a taken-path singularity in d/d{name} lanes {np.flatnonzero(hidden)}"
            )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(root, x, y)}") from None
    return "checked"


def _fuzzed(max_examples: int, seed_offset: int):
    """The hypothesis settings and strategies both fuzz tests share."""

    def decorate(test):
        if SEED is not None:
            test = seed(int(SEED) + seed_offset)(test)
        test = given(
            root=programs(max_depth=3, unary=sorted(TF_UNARY)),
            x=input_vectors(),
            y=input_vectors(),
        )(test)
        return settings(
            max_examples=max_examples,
            deadline=None,
            derandomize=SEED is None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            phases=list(Phase) if SHRINK else [Phase.explicit, Phase.reuse, Phase.generate],
        )(test)

    return decorate


@_fuzzed(EXAMPLES, 0)
def test_guarded_tf_program_matches_lane_oracle(root, x, y):
    event(check_tf_program(root, x, y))  # `pytest --hypothesis-show-statistics`: how many compared


#: touched by the stateful variant below, so that its program cannot run twice
_CALLS = tf.Variable(0.0)


def _stateful_guard(fn):
    """``hg.guard`` of ``fn`` after a variable update: a program that cannot run
    twice keeps TF's own gradient under XLA, with the ops whose gradients read
    an integer constant building it locally (hlo_guard.tf.local_constants)."""

    def updated(x, y):
        with tf.control_dependencies([_CALLS.assign_add(1.0)]):
            x = tf.identity(x)
        return fn(x, y)

    return hg.guard(updated)


@_fuzzed(max(1, EXAMPLES // 2), 1)
def test_guarded_stateful_tf_program_matches_lane_oracle(root, x, y):
    event(check_tf_program(root, x, y, guard=_stateful_guard))


# -- the checks themselves can fail -----------------------------------------------------

X = np.array([0.0, -1.0, 4.0, 0.25], np.float32)
Y = np.array([1.0, 0.0, -2.0, 9.0], np.float32)

#: programs whose plain TF gradient under XLA has a dead-lane NaN at (X, Y)
LEAKING = {
    "where-sqrt": Where("gt", Leaf("x"), Const(0.0, 4), Unary("sqrt", Leaf("x")), Const(0.0, 4)),
    "where-log-chain": Where(
        "gt",
        Leaf("x"),
        Const(0.0, 4),
        Binary("mul", Unary("log", Unary("sqrt", Leaf("x"))), Leaf("x")),
        Const(0.0, 4),
    ),
    "setat-log": SetAt(Unary("log", Leaf("x")), (0, 1), Const(0.0, 1)),
    "gather-rsqrt": Gather(Unary("rsqrt", Leaf("y")), (0, 2, 3)),
}
# (TF's own Maximum/Minimum gradients select, so clip and maximum do not leak
# in reverse mode: they are left to the random programs)


@pytest.mark.parametrize("name", sorted(LEAKING))
def test_leaking_program_is_caught_unguarded_and_fixed_guarded(name):
    root = LEAKING[name]
    with pytest.raises(AssertionError):
        check_tf_program(root, X, Y, guard=lambda f: f)
    assert check_tf_program(root, X, Y) == "checked"


def test_values_built_from_constants_are_not_guarded():
    """Found by ``make fuzz`` (2026-11-28): ``atan2`` of two constant zeros
    behind a ``where``.  Plain XLA folds ``atan2(0, 0)`` to 0 while compiling;
    a guard on those operands made it ``atan2(select(p, 0, 0), ...)``, which
    TF's XLA CPU kernel computes as NaN, so the guarded forward differed.
    A value that depends on no input carries no derivative anywhere, so it
    is not guarded at all (``graph._input_independent``)."""
    from fuzzlib.program import Clip

    zero = Const(value=0.0, n=1)
    root = Binary(
        op="maximum",
        a=Where(
            cmp="gt",
            left=Clip(
                a=Gather(a=Leaf(name="y"), idx=(0, 0, 1, 0, 1)),
                lo=Gather(a=Leaf(name="y"), idx=(2, 0, 0, 3, 2)),
                hi=Gather(a=Leaf(name="x"), idx=(3, 1, 3, 0, 3)),
            ),
            right=Binary(op="maximum", a=Const(value=0.5, n=1), b=Const(value=0.5, n=1)),
            then=Binary(op="arctan2", a=zero, b=zero),
            other=Const(value=0.0, n=5),
        ),
        b=Unary(op="arcsin", a=zero),
    )
    x = np.array([-0.0, -0.0, 1.0, 0.0], np.float32)
    y = np.array([0.0, 3.4028235e38, 3.4028235e38, 0.0], np.float32)
    assert check_tf_program(root, x, y) == "checked"
