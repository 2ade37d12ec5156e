"""Regression tests: every failure the fuzzer and the sweeps found, minimised.

Each test names the finding, the minimal program and inputs, and the
independent oracle it is checked against.  A test that fails because of a bug
in the pass itself is left failing on purpose (the pass is not ours to edit
here); its docstring says so.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from fuzzlib.checks import check_program
from fuzzlib.program import Binary, Clip, Const, Gather, Leaf, Reduce, SetAt, Slice, Unary, Where

import hlo_guard


def f32(*values):
    return np.array(values, np.float32)


def test_oracle_reduce_max_under_grad_uses_only_comparisons():
    """Fuzzer harness bug (not the pass): the oracle called ``float()`` on a lane,
    which is not concrete under ``jax.grad`` in JAX 0.10.  Kept as a regression of
    the harness: a tied max reduction broadcast by a gather."""
    root = Gather(Unary("abs", Reduce("max", Slice(Leaf("x"), 0, 1, 1))), (0, 0, 0, 0))
    check_program(root, f32(0, 0, 0, 0), f32(0, 0, 0, 0))


# The former strict xfail "eager forward is bitwise on subnormals through an
# inlined jit" passes now and lives in tests/test_eager_bitwise.py.


# -- custom derivative rules: the guard must not override them ----------------------------
#
# Core bug (found by the transparency sweep; left failing on purpose).  For
# ``custom_jvp_call``/``custom_vjp_call`` the pass guards the call's inputs with
# the liveness of the *primal* body.  But a custom rule defines the derivative:
# it may be non-zero in lanes the primal body selects away (xlogy at x == 0 is
# log y; a straight-through estimator passes the cotangent through a select) or
# flow through ops the primal computes with bit tricks (frexp in ldexp).  The
# guard then replaces a finite, correct derivative by 0.  Oracle: plain JAX,
# whose derivative here is finite and is the library's (or user's) definition.


def _ste_relu_jvp():
    @jax.custom_jvp
    def ste_relu(x):
        return jnp.where(x > 0, x, 0.0)

    @ste_relu.defjvp
    def _jvp(primals, tangents):
        return ste_relu(primals[0]), tangents[0]  # straight-through: derivative 1

    return ste_relu


def _ste_relu_vjp():
    @jax.custom_vjp
    def ste_relu(x):
        return jnp.where(x > 0, x, 0.0)

    ste_relu.defvjp(lambda x: (ste_relu(x), None), lambda _, g: (g,))
    return ste_relu


CUSTOM_RULE_CASES = {
    # name: (scalar function, point)           plain JAX derivative there
    "ldexp": (lambda x: jnp.ldexp(x, 3), 1.5),  # 8
    "xlogy-x0": (lambda x: jax.scipy.special.xlogy(x, 0.5), 0.0),  # log 0.5
    "xlog1py-x0": (lambda x: jax.scipy.special.xlog1py(x, 0.5), 0.0),  # log 1.5
    "poch-a0": (lambda a: jax.scipy.special.poch(1.0, a), 0.0),  # -euler gamma
    "owens_t-h-tiny": (lambda a: jax.scipy.special.owens_t(1e-20, a), 1.0),  # 1/(4 pi)
    "fresnel-C-huge": (lambda x: jax.scipy.special.fresnel(x)[1], 3.4e38),  # 1
    "ste-relu-custom_jvp": (_ste_relu_jvp(), -1.0),  # 1
    "ste-relu-custom_vjp": (_ste_relu_vjp(), -1.0),  # 1
}


@pytest.mark.parametrize("name", sorted(CUSTOM_RULE_CASES))
def test_custom_derivative_rule_is_not_overridden(name):
    fn, at = CUSTOM_RULE_CASES[name]
    x = jnp.float32(at)
    want = jax.grad(fn)(x)
    assert np.isfinite(want) and want != 0.0
    for wrap in (hlo_guard.guard, hlo_guard.guarded_jit):
        got = jax.grad(wrap(fn))(x)
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{name} via {wrap.__name__}")


# -- implicitly broadcast operands of a partly dead elementwise op ------------------------
#
# Core bug (found by the fuzzer, seed 12345; left failing on purpose).  lax binary
# ops broadcast rank-0 and size-1 operands implicitly (``log(x) * w`` with a scalar
# ``w`` is ``mul d:f32[n] w:f32[]``).  When the output is partly dead, the mask of
# the broadcast operand is reduced with ``any`` -- fully live -- so no guard is
# placed, and in the transpose the dead lane's ``0 * (local derivative)`` --
# ``0 * log(-1)`` = NaN -- is summed into the scalar's gradient.  An *explicit*
# ``broadcast_in_dim`` works (the guard then sits on the broadcast value, before
# the sum).  Fix idea: when an operand is implicitly broadcast and the output mask
# is partial, bind the op with ``broadcast_in_dim(operand)`` guarded by the full
# output mask.

X2 = jnp.array([-1.0, 0.25])


def _double_where_log_times(w):
    live = X2 > 0
    return jnp.where(live, jnp.log(jnp.where(live, X2, 1.0)) * w, 0.5)


BROADCAST_CASES = {
    "where-log-times-scalar": (
        lambda w: jnp.where(X2 > 0, jnp.log(X2) * w, 0.5),
        _double_where_log_times,
        jnp.float32(2.0),
    ),
    "minimum-pow-scalar-exponent": (
        lambda y: jnp.minimum(jnp.power(X2, y), 0.5),
        lambda y: jnp.stack([jnp.float32(0.5), jnp.power(0.25, y)]),
        jnp.float32(2.0),
    ),
    "minimum-pow-size1-exponent": (
        lambda y: jnp.minimum(jnp.power(X2, y), 0.5),
        lambda y: jnp.concatenate([jnp.full((1,), 0.5), jnp.power(0.25, y)]),
        jnp.array([2.0], jnp.float32),
    ),
}


@pytest.mark.parametrize("name", sorted(BROADCAST_CASES))
def test_implicitly_broadcast_operand_of_partly_dead_op(name):
    fn, oracle, at = BROADCAST_CASES[name]
    want = jax.grad(lambda p: jnp.sum(oracle(p)))(at)
    assert np.isfinite(np.asarray(want)).all()
    assert np.isnan(np.asarray(jax.grad(lambda p: jnp.sum(fn(p)))(at))).any()  # plain leaks
    for wrap in (hlo_guard.guard, hlo_guard.guarded_jit):
        got = jax.grad(lambda p: jnp.sum(wrap(fn)(p)))(at)
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{name} via {wrap.__name__}")


def test_fuzz_clip_upper_bound_pow_broadcast_exponent():
    """The fuzzer's shrunk example: ``clip(0, 0, pow(x, y[0:1]))``; lane 3 of the
    upper bound (``(-1) ** huge`` = 1 > 0) is dead, and ``d/dy`` there is
    ``log(-1)`` = NaN, which leaked through the implicit broadcast of ``y[0:1]``."""
    root = Clip(Const(0.0, 4), Const(0.0, 1), Binary("pow", Leaf("x"), Slice(Leaf("y"), 0, 1, 1)))
    check_program(root, f32(0, 0, 0, -1), f32(3.4028234663852886e38, 0, 0, 0))


# -- harness findings (the oracle, not the pass) --------------------------------------------


def test_signed_zero_through_set_at_and_sqrt():
    """``zeros.at[:2].set(x[:2])`` with ``x[1] == -0.0``: JAX's JVP of the scatter
    adds the update onto zeros, so ``sqrt'`` sees +0 (+inf) where the per-lane
    oracle sees -0 (-inf).  Plain JAX agrees with the guard; the checks compare
    infinities without their sign."""
    root = Unary("abs", Unary("sqrt", SetAt(Const(0.0, 4), (0, 1), Slice(Leaf("x"), 0, 2, 1))))
    check_program(root, f32(0.0, -0.0, 0.0, 0.0), f32(0, 0, 0, 0))


def test_forward_mode_with_a_live_singular_lane_is_not_compared():
    """``jacfwd(sum(arccos(x)))`` at ``x = [0, 0, 0, 1]``: every column is NaN in
    plain JAX (0 * inf from lane 3's basis-tangent zero); the scalarised oracle
    has no such product.  Not a dead-lane leak, so the check skips it -- but the
    reverse-mode result is still compared."""
    from fuzzlib.checks import check_forward_mode

    root = Unary("arccos", Leaf("x"))
    check_forward_mode(root, f32(0, 0, 0, 1), f32(0, 0, 0, 0))
    check_program(root, f32(0, 0, 0, 1), f32(0, 0, 0, 0))


def test_fuzz_arccos_of_maximum_with_broadcast_operand():
    """``make fuzz`` (derandomized, example ~846): ``arccos(maximum(x[0:1], x))`` at
    ``x = [0, 0, 0, 1]``.  In lane 3 ``x[0]`` loses (0 < 1) and ``arccos'(1)`` is
    -inf; JAX's max rule multiplies that -inf by 0 for the loser, and because
    ``x[0:1]`` is broadcast *implicitly* by ``max`` no guard can select lane 3
    alone -- the implicit-broadcast bug again, through a selection op.  Oracle:
    d/dx0 = -2 (lane 0 is ``max(x0, x0)``: all of ``arccos'(0) = -1``; lanes 1
    and 2 tie: half of it each; lane 3: nothing), the guard gives NaN."""
    root = Unary("arccos", Binary("maximum", Slice(Leaf("x"), 0, 1, 1), Leaf("x")))
    check_program(root, f32(0, 0, 0, 1), f32(0, 0, 0, 0))


def test_generator_binary_node_has_the_requested_length():
    """Fuzzer harness bug (not the pass), found by ``make fuzz``: a binary node
    whose two operands were both drawn broadcast (length 1) had length 1, not the
    requested n, so a ``where`` built around it had incompatible shapes and plain
    JAX itself raised.  Every generated program must be well-shaped."""
    from fuzzlib.strategies import nodes
    from hypothesis import given, settings

    @settings(max_examples=200, deadline=None, derandomize=True)
    @given(nodes(3, 3))
    def check(node):
        assert node.length == 3

    check()


def test_fuzz_forward_mode_arccos_of_maximum_with_nan_lane():
    """Core finding by ``make fuzz`` (fixed): ``arccos(maximum(x[0:1], x[0:2]))`` with
    ``x[1]`` NaN.  No operand equals the NaN result, so JAX's forward rule gives that
    lane the tangent ``t * 0``, and ``arccos'(NaN) * 0`` made every column of
    ``jacfwd`` NaN where the per-lane oracle then had no derivative in that lane.
    Since 2026-11-28 the NaN operand is the taken side (XLA propagates it; contract
    3), in the guard's masks and in the oracle alike: the lane's derivative is JAX's
    own, NaN, in both.  The check stays: both sides must agree on it."""
    root = Unary("arccos", Binary("maximum", Slice(Leaf("x"), 0, 1, 1), Slice(Leaf("x"), 0, 2, 1)))
    from fuzzlib.checks import check_forward_mode

    check_forward_mode(root, f32(0, np.nan, 0, 0), f32(0, 0, 0, 0))
    check_program(root, f32(0, np.nan, 0, 0), f32(0, 0, 0, 0))


def test_fuzz_forward_mode_broadcast_literal_times_inf():
    """Core finding by ``make fuzz`` (fixed): ``where(p, x[[0, 3, 0]] * full(1, 0.), 0)``
    with ``x[3] = inf``.  The implicitly broadcast constant went through the guard's
    custom JVP, which instantiated its symbolic-zero tangent: ``inf * 0`` = NaN in
    every jacfwd column.  Operands with symbolic-zero tangents now stay out of it."""
    lo = Where("eq", Const(0.0, 1), Const(0.0, 1), Slice(Leaf("x"), 0, 3, 1), Const(0.0, 1))
    hi = Binary("add", Const(0.0, 1), Const(1.0, 1))
    root = Where(
        "eq",
        Clip(Const(0.0, 3), lo, hi),
        Const(0.0, 1),
        Binary("mul", Gather(Leaf("x"), (0, 3, 0)), Const(0.0, 1)),
        Const(0.0, 1),
    )
    from fuzzlib.checks import check_forward_mode

    check_forward_mode(root, f32(0, 0, 1, np.inf), f32(0, 0, 0, 0))
    check_program(root, f32(0, 0, 1, np.inf), f32(0, 0, 0, 0))


def test_oracle_takes_branch_decisions_from_the_programs_own_values():
    """Fuzzer harness bug (not the pass), from ``make fuzz``: the oracle decided
    ``eq(maximum(arctan(-1.0), arctanh(-1.0)), arctan(x[0]))`` on its own 0-d
    lanes, while XLA computes the two arctans 1 ulp apart under ``jit`` (the
    constant side is folded at compile time, the other runs): the jitted
    program takes the other branch.  With ``x == y`` both branches give the
    same forward value, so only the derivative showed it (plain JAX, the guard
    and every mode agreed; the oracle did not).  The oracle now decides every
    branch on the program's own values, eager or jitted."""
    arctan_const = Unary("arctan", Const(-1.0, 4))
    left = Binary("maximum", arctan_const, Unary("arctanh", Const(-1.0, 4)))
    right = Unary("arctan", Gather(Leaf("x"), (0, 0, 0, 0)))
    root = Where("eq", left, right, Leaf("x"), Leaf("y"))
    x = y = f32(-1.0, -1.0, -1.0, -1.0)
    check_program(root, x, y)
