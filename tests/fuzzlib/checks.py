"""The differential checks run on every fuzzed program.

1. forward bitwise identical to the unguarded program, eager and under jit;
2. ``jax.grad`` of the guarded program equals the lane-by-lane oracle
   (NaN == NaN, inf == inf -- sign not compared, see ``mismatches`` --, allclose
   otherwise), eager and jit; forward mode (``jax.jacfwd``) as well;
3. every lane where the oracle's derivative is non-finite (a singularity on a
   taken path) is non-finite in the guarded derivative too -- implied by 2,
   checked on its own so a failure names the contract clause it breaks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import event

import hlo_guard
from fuzzlib import oracle, vectorized
from fuzzlib.program import to_source

RTOL = 2e-5
ATOL = 1e-6


def bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


def assert_bitwise_equal(actual, expected, what):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (
        f"{what}: {actual.shape}/{actual.dtype} != {expected.shape}/{expected.dtype}"
    )
    if not np.array_equal(bits(actual), bits(expected)):
        raise AssertionError(
            f"{what}: not bitwise identical\n  got      {actual!r}\n  expected {expected!r}"
        )


def mismatches(actual, expected, rtol=RTOL, atol=ATOL) -> np.ndarray:
    """Boolean array: lanes where two derivatives disagree (NaN==NaN, inf==inf)."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    a_nan, e_nan = np.isnan(actual), np.isnan(expected)
    a_inf, e_inf = np.isinf(actual), np.isinf(expected)
    # The sign of an infinite derivative is not compared: JAX's own JVP of
    # ``.at[].set`` re-adds the update onto zeros, turning a -0.0 lane into +0.0
    # (so sqrt'(-0) = -inf in the per-lane oracle is +inf in plain JAX too).
    bad = (a_nan != e_nan) | (a_inf != e_inf)
    fin = np.isfinite(actual) & np.isfinite(expected)
    close = np.isclose(actual, expected, rtol=rtol, atol=atol)
    bad |= fin & ~close
    return bad


def assert_grads_match(actual, expected, what, rtol=RTOL, atol=ATOL):
    bad = mismatches(actual, expected, rtol, atol)
    if bad.any():
        raise AssertionError(
            f"{what}: derivative differs from the oracle in lanes "
            f"{np.flatnonzero(bad).tolist()}\n  got    {np.asarray(actual)!r}"
            f"\n  oracle {np.asarray(expected)!r}"
        )


def describe(root, x, y) -> str:
    return (
        f"program: {to_source(root)}\n  x = np.array({x.tolist()!r}, np.float32)"
        f"\n  y = np.array({y.tolist()!r}, np.float32)"
    )


def _note(message):
    """A hypothesis statistics event when inside a @given test, else nothing."""
    try:
        event(message)
    except Exception:  # called outside a hypothesis test (regression tests)
        pass


def loss_of(fn):
    return lambda x, y: jnp.sum(fn(x, y))


def check_program(root, x, y, *, jit=True, guard=None, guarded_jit=None):
    """Run every check on one program; raise AssertionError naming the failure.

    ``guard``/``guarded_jit`` default to hlo_guard's; passing ``lambda f: f`` and
    ``jax.jit`` checks plain JAX instead (which must fail on leaking programs --
    how the tests show the checks can fail)."""
    try:
        _check(
            root,
            x,
            y,
            jit=jit,
            guard=guard or hlo_guard.guard,
            guarded_jit=guarded_jit or hlo_guard.guarded_jit,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(root, x, y)}") from None


def _check(root, x, y, *, jit, guard, guarded_jit):
    plain = vectorized.as_function(root)
    guarded = guard(plain)
    xj, yj = jnp.asarray(x), jnp.asarray(y)

    assert_bitwise_equal(guarded(xj, yj), plain(xj, yj), "eager forward")

    _, ox, oy = oracle.value_and_grad(root, x, y)
    gx, gy = jax.grad(loss_of(guarded), argnums=(0, 1))(xj, yj)
    assert_grads_match(gx, ox, "eager grad wrt x")
    assert_grads_match(gy, oy, "eager grad wrt y")
    for got, want, name in ((gx, ox, "x"), (gy, oy, "y")):
        hidden = ~np.isfinite(want) & np.isfinite(np.asarray(got))
        assert not hidden.any(), (
            f"guard hid a taken-path singularity in d/d{name} lanes {np.flatnonzero(hidden)}"
        )

    if jit:
        gj = guarded_jit(plain)
        plain_jit = jax.jit(plain)(xj, yj)
        assert_bitwise_equal(gj(xj, yj), plain_jit, "jit forward")
        # XLA's compiled kernels (and constant folding) may round a compared value
        # differently from the eager ones, so the jitted program may take other
        # branches: its oracle decides on the jitted program's own values
        _, jox, joy = oracle.value_and_grad(root, x, y, jit=True)
        jx, jy = jax.jit(jax.grad(loss_of(gj), argnums=(0, 1)))(xj, yj)
        assert_grads_match(jx, jox, "jit grad wrt x")
        assert_grads_match(jy, joy, "jit grad wrt y")


def check_forward_mode(root, x, y, *, guard=None):
    """Forward mode: ``jax.jacfwd`` of the guarded program's summed output equals
    the oracle's gradient (the same numbers, pushed forward one basis tangent at a
    time).  Forward mode through ``maximum``/``clip``/``max`` multiplies a tangent
    by 0 in the losing lanes, so it leaks where ``where`` does not."""
    guard = guard or hlo_guard.guard
    try:
        plain = vectorized.as_function(root)
        xj, yj = jnp.asarray(x), jnp.asarray(y)
        _, ox, oy = oracle.value_and_grad(root, x, y)
        if not (np.isfinite(ox).all() and np.isfinite(oy).all()):
            # jacfwd pushes a basis tangent that is 0 (not a symbolic zero) in the
            # other lanes; with a genuine singularity in a *live* lane that is
            # 0 * inf = NaN, summed into every column -- in plain JAX and in the
            # contract's vectorised per-select-``if`` program alike.  Only the
            # scalarised oracle avoids it, so such examples are not comparable.
            _note("oracle derivative non-finite: forward mode not compared")
            return
        if np.isnan(np.asarray(plain(xj, yj))).any():
            # A NaN forward value (a genuine NaN reaching a max): JAX's own
            # reduce_max JVP divides by the number of lanes equal to the max, 0
            # when the max is NaN -- NaN in plain JAX, guarded_jit and eager
            # guard(f) alike, whatever the scalarised oracle's max says.
            _note("NaN forward value: forward mode not compared")
            return
        fx, fy = jax.jacfwd(loss_of(guard(plain)), argnums=(0, 1))(xj, yj)
        assert_grads_match(fx, ox, "jacfwd wrt x")
        assert_grads_match(fy, oy, "jacfwd wrt y")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(root, x, y)}") from None
