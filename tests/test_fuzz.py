"""Differential fuzzing: random jnp programs, guarded, against a per-lane oracle.

Each example is a random expression tree (see ``fuzzlib``) over two input
vectors drawn to hit 0, +-1, +-inf, NaN, huge and tiny values.  In about a
third of the programs nodes are wrapped in identity calls (``x.real``,
``jnp.real``, ``x.conj()``, ``jnp.squeeze``, ``jnp.ravel``: a ``jit`` whose body
returns its input), and about half read a 0-d differentiable input
``s`` -- weak-typed, a Python float, float32, bfloat16 or float16, so that a
``convert_element_type`` may stand between it and the binary ops that broadcast
it -- whose derivative is the sum of the lanes' (the oracle differentiates one
copy of ``s`` per lane).  The guarded
program must (1) compute bitwise the same forward values as the unguarded one,
(2) have the derivative of the lane-by-lane Python-``if`` oracle, in which an
unselected branch never runs (reverse mode eager and jitted, and forward mode),
and (3) keep every taken-path singularity non-finite.  A second-order check
(``check_second_order``) differentiates the guarded program twice -- hessian
(forward over reverse), ``jacrev`` of ``grad`` and ``jacfwd`` of ``jacfwd`` --
against the oracle's per-lane Hessian: structural zeros are zero in every order.

``HLO_GUARD_FUZZ_NO_BROADCAST=1`` stops drawing size-1 (broadcast) operands, to
explore past the known implicit-broadcast bug (see test_fuzz_regressions.py).

``make test`` runs a small deterministic sample (``HLO_GUARD_FUZZ_EXAMPLES``,
default 60, derandomized, no example database); ``make fuzz`` runs 2000.  Set
``HLO_GUARD_FUZZ_SEED`` to explore a different random stream.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fuzzlib.checks import (
    SECOND_ORDER_MODES,
    check_clean_implies_exact,
    check_forward_mode,
    check_program,
    check_second_order,
    check_second_order_clean_implies_exact,
    note,
)
from fuzzlib.program import (
    BODY_KINDS,
    IDENTITY,
    SCALAR_KINDS,
    Binary,
    Body,
    Clip,
    Const,
    Gather,
    Identity,
    Leaf,
    Reduce,
    Scalar,
    ScalarInput,
    SegmentMax,
    SetAt,
    Unary,
    Where,
)
from fuzzlib.strategies import input_vectors, programs, programs_in_bodies, scalar_inputs
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("HLO_GUARD_FUZZ_EXAMPLES", "60"))
SEED = os.environ.get("HLO_GUARD_FUZZ_SEED")

FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=SEED is None,
    database=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)


def _seeded(test):
    return seed(int(SEED))(test) if SEED is not None else test


@_seeded
@FUZZ_SETTINGS
@given(root=programs(extras=True), x=input_vectors(), y=input_vectors(), s=scalar_inputs())
def test_guarded_program_matches_lane_oracle(root, x, y, s):
    check_program(root, x, y, s, jit=False)


@_seeded
@settings(FUZZ_SETTINGS, max_examples=max(1, EXAMPLES // 6))
@given(
    root=programs(max_depth=3, extras=True), x=input_vectors(), y=input_vectors(), s=scalar_inputs()
)
def test_guarded_jit_program_matches_lane_oracle(root, x, y, s):
    check_program(root, x, y, s, jit=True)


@_seeded
@settings(FUZZ_SETTINGS, max_examples=max(1, EXAMPLES // 6))
@given(
    root=programs(max_depth=3, extras=True), x=input_vectors(), y=input_vectors(), s=scalar_inputs()
)
def test_guarded_program_forward_mode_matches_lane_oracle(root, x, y, s):
    check_forward_mode(root, x, y, s)


@_seeded
@settings(FUZZ_SETTINGS, max_examples=max(1, EXAMPLES // 4))
@given(root=programs_in_bodies(), x=input_vectors(), y=input_vectors(), s=scalar_inputs())
def test_programs_in_bodies_clean_report_implies_exact(root, x, y, s):
    """Nodes computed inside ``cond``/``scan``/``fori``/``while``/``jit``/
    ``checkpoint`` bodies: the values are the same, so the per-lane oracle
    holds; in each mode whose ``explain`` report is clean the derivative is
    the oracle's.  (Reverse mode through control-flow boundaries is partly
    reported rather than exact: a report, never a silent NaN.)"""
    check_clean_implies_exact(root, x, y, s)


@_seeded
@settings(FUZZ_SETTINGS, max_examples=max(1, EXAMPLES // 8))
@given(
    root=programs_in_bodies(),
    x=input_vectors(),
    y=input_vectors(),
    s=scalar_inputs(),
    mode=st.sampled_from(sorted(SECOND_ORDER_MODES)),
    jit=st.booleans(),
)
def test_programs_in_bodies_second_order_clean_report_implies_exact(root, x, y, s, mode, jit):
    """Second order through ``cond``/``scan``/``fori``/``while``/``jit``/
    ``checkpoint`` bodies: a clean report means the oracle's Hessian."""
    note(check_second_order_clean_implies_exact(root, x, y, s, mode=mode, jit=jit))


# -- the checks themselves can fail -----------------------------------------------------

X = np.array([0.0, -1.0, 4.0, 0.25], np.float32)
Y = np.array([1.0, 0.0, -2.0, 9.0], np.float32)

#: programs whose plain JAX derivative has a dead-lane NaN at (X, Y)
LEAKING = {
    "where-sqrt": Where("gt", Leaf("x"), Const(0.0, 4), Unary("sqrt", Leaf("x")), Const(0.0, 4)),
    "maximum-log": Binary("maximum", Unary("log", Leaf("x")), Const(-5.0, 1)),
    "clip-rsqrt": Clip(Unary("rsqrt", Leaf("y")), Const(-1.0, 1), Const(1.0, 1)),
    "gather-drops-log": Gather(Unary("log", Leaf("x")), (2, 3)),
    "max-reduce-arccos": Reduce("max", Unary("arccos", Binary("sub", Leaf("x"), Const(1.0, 1)))),
    "set-overwrites-div": SetAt(Binary("div", Leaf("y"), Leaf("x")), (0, 1), Const(0.0, 1)),
    # the dead region passes through an identity call (jit(lambda a: a))
    "where-sqrt-of-real": Where(
        "gt", Leaf("x"), Const(0.0, 4), Unary("sqrt", Identity("real", Leaf("x"))), Const(0.0, 4)
    ),
    # segment 0 = sqrt(|x|) at lanes 0, 1: sqrt(0) loses to sqrt(1)
    "segment-max-drops-sqrt": SegmentMax(
        "max", Unary("sqrt", Unary("abs", Leaf("x"))), (0, 0, 1, 1), 2
    ),
    # segment 1 = 1/y at lanes 1, 3: 1/0 = inf never the minimum
    "segment-min-drops-reciprocal": SegmentMax(
        "min", Unary("reciprocal", Leaf("y")), (0, 1, 2, 1), 3
    ),
    # d/ds sums s' lanes: the dead lane's 0 * -inf (log(0)) goes into it
    "where-scalar-times-log": Where(
        "gt",
        Leaf("x"),
        Const(0.0, 1),
        Binary("mul", Scalar(4), Unary("log", Leaf("x"))),
        Const(0.0, 1),
    ),
}

#: the scalar input of the LEAKING programs that read one
S = ScalarInput("weak", 0.5)


def _strong_zero(f):
    """An Enzyme-style 'strong zero' guard: every non-finite derivative becomes 0.
    It fixes dead lanes but hides genuine singularities -- clause 3 must catch it."""

    @jax.custom_vjp
    def g(x, y):
        return f(x, y)

    def fwd(x, y):
        return jax.vjp(f, x, y)

    def bwd(vjp, ct):
        return tuple(jnp.nan_to_num(c, nan=0.0, posinf=0.0, neginf=0.0) for c in vjp(ct))

    g.defvjp(fwd, bwd)
    return g


@pytest.mark.parametrize("name", sorted(LEAKING))
def test_checks_fail_on_plain_jax_and_pass_guarded(name):
    root = LEAKING[name]
    with pytest.raises(AssertionError, match="oracle"):
        check_program(root, X, Y, S, jit=False, guard=lambda f: f, guarded_jit=jax.jit)
    check_program(root, X, Y, S, jit=True)
    check_forward_mode(root, X, Y, S)


#: inputs without ties or genuine singularities, where a program that leaks
#: only in forward mode is comparable (``check_forward_mode`` skips programs
#: whose oracle derivative or forward value is not finite anywhere)
XF = np.array([-1.0, 0.5, 2.0, -3.0], np.float32)
YF = np.array([0.5, -2.0, 0.25, 3.0], np.float32)

#: programs whose plain JAX *forward-mode* derivative has a dead-lane NaN at
#: (XF, YF) while reverse mode is exact: ``maximum``/``clip`` multiply the
#: losing lane's tangent by 0, and the singular op after them makes that NaN
#: (what the forward-mode output guards are for)
LEAKING_FORWARD = {
    "sqrt-of-maximum": Unary("sqrt", Binary("maximum", Leaf("x"), Const(0.0, 1))),
    "log-of-clip": Unary("log", Clip(Leaf("y"), Const(0.0, 1), Const(1.0, 1))),
    "arccos-of-clip-times-x": Binary(
        "mul", Unary("arccos", Clip(Leaf("y"), Const(-1.0, 1), Const(1.0, 1))), Leaf("x")
    ),
}


@pytest.mark.parametrize("name", sorted(LEAKING_FORWARD))
def test_forward_check_fails_on_plain_jax_and_passes_guarded(name):
    root = LEAKING_FORWARD[name]
    with pytest.raises(AssertionError, match="oracle"):
        check_forward_mode(root, XF, YF, guard=lambda f: f)
    check_forward_mode(root, XF, YF)
    check_program(root, XF, YF, jit=True)


@pytest.mark.parametrize("kind", SCALAR_KINDS)
def test_every_kind_of_scalar_input_leaks_in_plain_jax_and_is_exact_guarded(kind):
    """``s * log(v)`` where ``x > 0``, ``v`` a constant vector with a 0 in a
    dead lane: plain JAX's d/ds sums that lane's ``0 * -inf``, whatever way
    ``s`` is passed, while every other derivative is exact (the check must
    fail on d/ds itself)."""
    v = SetAt(Const(1.0, 4), (0,), Const(0.0, 1))
    root = Where(
        "gt", Leaf("x"), Const(0.0, 1), Binary("mul", Scalar(4), Unary("log", v)), Const(0.0, 1)
    )
    s = ScalarInput(kind, 0.5)
    with pytest.raises(AssertionError, match="grad wrt s"):
        check_program(root, X, Y, s, jit=False, guard=lambda f: f)
    check_program(root, X, Y, s, jit=True)
    check_forward_mode(root, X, Y, s)


@pytest.mark.parametrize("op", sorted(IDENTITY))
def test_every_identity_call_is_a_pass_through_for_the_checks(op):
    root = Where("gt", Leaf("x"), Const(0.0, 4), Unary("log", Identity(op, Leaf("x"))), Leaf("y"))
    with pytest.raises(AssertionError, match="oracle"):
        check_program(root, X, Y, jit=False, guard=lambda f: f)
    check_program(root, X, Y, jit=False)


def test_checks_catch_a_guard_that_hides_genuine_singularities():
    # sqrt on the *taken* side at x == 0: the derivative is +inf and must stay so
    root = Where("ge", Leaf("x"), Const(0.0, 4), Unary("sqrt", Leaf("x")), Const(0.0, 4))
    check_program(root, X, Y, jit=True)
    with pytest.raises(AssertionError):
        check_program(root, X, Y, jit=False, guard=_strong_zero)


@pytest.mark.parametrize("kind", BODY_KINDS)
def test_a_selection_inside_a_body_is_clean_and_exact(kind):
    """The clean-implies-exact check cannot pass vacuously: a ``where`` over
    the arguments inside any body is guarded there with nothing to report
    (its operands are the function's arguments: no operation before the body
    to follow dead lanes back to), and it leaks without the guard."""
    root = Body(kind, LEAKING["where-sqrt"])
    assert check_clean_implies_exact(root, X, Y) == (
        "forward" if kind == "while" else "reverse and forward"
    )
    if kind != "while":
        with pytest.raises(AssertionError, match="oracle"):
            check_program(root, X, Y, jit=False, guard=lambda f: f)


@_seeded
@settings(FUZZ_SETTINGS, max_examples=max(1, EXAMPLES // 4))
@given(
    root=programs(max_depth=3, extras=True),
    x=input_vectors(),
    y=input_vectors(),
    s=scalar_inputs(),
    mode=st.sampled_from(sorted(SECOND_ORDER_MODES)),
    jit=st.booleans(),
)
def test_guarded_program_second_order_matches_lane_oracle(root, x, y, s, mode, jit):
    note(check_second_order(root, x, y, s, mode=mode, jit=jit))


#: programs whose plain JAX *second* derivative has a dead-lane NaN at (X, Y, S)
#: (their first derivative may be exact: ``where``'s JVP selects tangents)
LEAKING_SECOND_ORDER = {
    **{name: LEAKING[name] for name in ("where-sqrt", "gather-drops-log", "set-overwrites-div")},
    **{name: LEAKING[name] for name in ("segment-max-drops-sqrt", "where-scalar-times-log")},
    # d2/(ds dx) of s / x: the divisor's term -dx * s / x**2 at a dead x = 0
    "where-scalar-over-x": Where(
        "gt", Leaf("x"), Const(0.0, 1), Binary("div", Scalar(4), Leaf("x")), Const(0.0, 1)
    ),
    # (1/x)**2 / s, jitted: reverse over the *staged* reverse pass, whose dead
    # lane's seed is NaN (0 * inf of the square at x = 0), summed into s
    # through the numerator's term dx / s
    "where-reciprocal-squared-over-scalar": Where(
        "gt",
        Leaf("x"),
        Const(0.0, 1),
        Binary(
            "div",
            Binary("mul", Unary("reciprocal", Leaf("x")), Unary("reciprocal", Leaf("x"))),
            Scalar(4),
        ),
        Const(0.0, 1),
    ),
    # d2/ds2 of log(x) / s: the divisor's own term -ds * log(0) / s**2 in a dead lane
    "where-log-over-scalar": Where(
        "gt",
        Leaf("x"),
        Const(0.0, 1),
        Binary("div", Unary("log", Leaf("x")), Scalar(4)),
        Const(0.0, 1),
    ),
}


@pytest.mark.parametrize("name", sorted(LEAKING_SECOND_ORDER))
def test_second_order_check_fails_on_plain_jax_and_passes_guarded(name):
    root = LEAKING_SECOND_ORDER[name]
    failed = []
    for mode in sorted(SECOND_ORDER_MODES):
        try:
            check_second_order(root, X, Y, S, mode=mode, guard=lambda f: f)
        except AssertionError:
            failed.append(mode)
        assert check_second_order(root, X, Y, S, mode=mode) == f"{mode} compared"
        assert check_second_order(root, X, Y, S, mode=mode, jit=True) == f"{mode} jit compared"
    assert "rev-over-rev" in failed and "fwd-over-rev" in failed


@pytest.mark.parametrize("name", sorted(LEAKING_FORWARD))
def test_forward_leaks_are_caught_at_second_order(name):
    """The forward-only leaks leak in every second-order mode of plain JAX, and
    the guard is exact in each.  ``arccos(clip(y, -1, 1)) * x`` under
    ``rev-over-rev`` holds the derivative of the output guard's cotangent
    (``tangent_guard.cotangent_guard``): with a plain identity there, ``x``'s
    cotangent ``arccos(...)`` meets ``arccos'(1) = inf`` in the clipped lanes."""
    root = LEAKING_FORWARD[name]
    for mode in sorted(SECOND_ORDER_MODES):
        with pytest.raises(AssertionError, match="oracle"):
            check_second_order(root, XF, YF, mode=mode, guard=lambda f: f)
        assert check_second_order(root, XF, YF, mode=mode) == f"{mode} compared"
        assert check_second_order(root, XF, YF, mode=mode, jit=True) == f"{mode} jit compared"
