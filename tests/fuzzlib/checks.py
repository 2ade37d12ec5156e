"""The differential checks run on every fuzzed program.

1. forward bitwise identical to the unguarded program, eager and under jit;
2. ``jax.grad`` of the guarded program equals the lane-by-lane oracle
   (NaN == NaN, inf == inf -- sign not compared, see ``mismatches`` --, allclose
   otherwise), eager and jit; forward mode (``jax.jacfwd``) as well; the
   derivative wrt the scalar input ``s``, when the program reads one, equals
   the sum of the oracle's per-lane contributions (:func:`scalar_mismatch`);
3. every lane where the oracle's derivative is non-finite (a singularity on a
   taken path) is non-finite in the guarded derivative too -- implied by 2,
   checked on its own so a failure names the contract clause it breaks.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import event

import hlo_guard
from fuzzlib import oracle, vectorized
from fuzzlib.program import Body, nodes_of, to_source, uses_scalar

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


def describe(root, x, y, s=None) -> str:
    text = (
        f"program: {to_source(root)}\n  x = np.array({x.tolist()!r}, np.float32)"
        f"\n  y = np.array({y.tolist()!r}, np.float32)"
    )
    if s is not None and uses_scalar(root):
        text += f"\n  s = {s.source()}"
    return text


def scalar_mismatch(actual, contributions, rtol=RTOL, atol=ATOL) -> bool:
    """Whether the derivative wrt the scalar input disagrees with every
    candidate sum of the oracle's per-lane contributions
    (:func:`fuzzlib.oracle.scalar_gradient`; NaN==NaN, inf==inf as in
    :func:`mismatches`).  Finite values are compared within ``rtol`` (plus
    twice the dtype's epsilon) of the contributions' summed magnitudes: the
    program sums them in float32, in an order of its own, and may round them
    to a bfloat16 or float16 ``s``."""
    actual = np.asarray(actual)
    candidates, scale = oracle.scalar_gradient(contributions, actual.dtype)
    rtol = rtol + 2 * float(jnp.finfo(actual.dtype).eps)
    if np.isfinite(scale):
        atol = atol + rtol * scale
    return all(bool(mismatches(actual, want, rtol=rtol, atol=atol)) for want in candidates)


def assert_scalar_grad_matches(actual, contributions, what):
    if scalar_mismatch(actual, contributions):
        candidates, _ = oracle.scalar_gradient(contributions, np.asarray(actual).dtype)
        raise AssertionError(
            f"{what}: derivative differs from the oracle's sum over lanes\n"
            f"  got    {np.asarray(actual)!r}\n  oracle {candidates[0]!r}"
            f" = sum of the lanes' {[c.tolist() for c in contributions]!r}"
        )


def note(message):
    """A hypothesis statistics event when inside a @given test, else nothing."""
    try:
        event(message)
    except Exception:  # called outside a hypothesis test (regression tests)
        pass


def loss_of(fn):
    return lambda *args: jnp.sum(fn(*args))


def check_program(root, x, y, s=None, *, jit=True, guard=None, guarded_jit=None):
    """Run every check on one program; raise AssertionError naming the failure.

    ``guard``/``guarded_jit`` default to hlo_guard's; passing ``lambda f: f`` and
    ``jax.jit`` checks plain JAX instead (which must fail on leaking programs --
    how the tests show the checks can fail).  ``s``: the scalar input (a
    :class:`fuzzlib.program.ScalarInput`), when the program reads one."""
    try:
        _check(
            root,
            x,
            y,
            s,
            jit=jit,
            guard=guard or hlo_guard.guard,
            guarded_jit=guarded_jit or hlo_guard.guarded_jit,
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(root, x, y, s)}") from None


def _check(root, x, y, s, *, jit, guard, guarded_jit):
    plain = vectorized.as_function(root)
    guarded = guard(plain)
    args = vectorized.arguments(root, x, y, s)
    argnums = tuple(range(len(args)))

    assert_bitwise_equal(guarded(*args), plain(*args), "eager forward")

    _, ox, oy, os_ = oracle.value_and_grad(root, x, y, s)
    gx, gy, *gs = jax.grad(loss_of(guarded), argnums=argnums)(*args)
    assert_grads_match(gx, ox, "eager grad wrt x")
    assert_grads_match(gy, oy, "eager grad wrt y")
    if gs:
        assert_scalar_grad_matches(gs[0], os_, "eager grad wrt s")
    for got, want, name in ((gx, ox, "x"), (gy, oy, "y")):
        hidden = ~np.isfinite(want) & np.isfinite(np.asarray(got))
        assert not hidden.any(), (
            f"guard hid a taken-path singularity in d/d{name} lanes {np.flatnonzero(hidden)}"
        )

    if jit:
        gj = guarded_jit(plain)
        plain_jit = jax.jit(plain)(*args)
        assert_bitwise_equal(gj(*args), plain_jit, "jit forward")
        # XLA's compiled kernels (and constant folding) may round a compared value
        # differently from the eager ones, so the jitted program may take other
        # branches: its oracle decides on the jitted program's own values
        _, jox, joy, jos = oracle.value_and_grad(root, x, y, s, jit=True)
        jx, jy, *js = jax.jit(jax.grad(loss_of(gj), argnums=argnums))(*args)
        assert_grads_match(jx, jox, "jit grad wrt x")
        assert_grads_match(jy, joy, "jit grad wrt y")
        if js:
            assert_scalar_grad_matches(js[0], jos, "jit grad wrt s")


def check_forward_mode(root, x, y, s=None, *, guard=None):
    """Forward mode: ``jax.jacfwd`` of the guarded program's summed output equals
    the oracle's gradient (the same numbers, pushed forward one basis tangent at a
    time).  Forward mode through ``maximum``/``clip``/``max`` multiplies a tangent
    by 0 in the losing lanes, so it leaks where ``where`` does not."""
    guard = guard or hlo_guard.guard
    try:
        plain = vectorized.as_function(root)
        args = vectorized.arguments(root, x, y, s)
        _, ox, oy, os_ = oracle.value_and_grad(root, x, y, s)
        finite = np.isfinite(ox).all() and np.isfinite(oy).all()
        if os_ is not None:
            finite = finite and np.isfinite(oracle.scalar_gradient(os_, np.float32)[0][0])
        if not finite:
            # jacfwd pushes a basis tangent that is 0 (not a symbolic zero) in the
            # other lanes; with a genuine singularity in a *live* lane that is
            # 0 * inf = NaN, summed into every column -- in plain JAX and in the
            # contract's vectorised per-select-``if`` program alike.  Only the
            # scalarised oracle avoids it, so such examples are not comparable.
            note("oracle derivative non-finite: forward mode not compared")
            return
        if np.isnan(np.asarray(plain(*args))).any():
            # A NaN forward value (a genuine NaN reaching a max): JAX's own
            # reduce_max JVP divides by the number of lanes equal to the max, 0
            # when the max is NaN -- NaN in plain JAX, guarded_jit and eager
            # guard(f) alike, whatever the scalarised oracle's max says.
            note("NaN forward value: forward mode not compared")
            return
        argnums = tuple(range(len(args)))
        fx, fy, *fs = jax.jacfwd(loss_of(guard(plain)), argnums=argnums)(*args)
        assert_grads_match(fx, ox, "jacfwd wrt x")
        assert_grads_match(fy, oy, "jacfwd wrt y")
        if fs:
            assert_scalar_grad_matches(fs[0], os_, "jacfwd wrt s")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(root, x, y, s)}") from None


def unguarded_reports(plain, args) -> tuple[bool, bool]:
    """(reverse mode reported, forward mode reported): whether ``explain``
    names an unguarded site for each mode (its forward-mode sites say
    "forward mode"; any other site may concern either mode)."""
    report = hlo_guard.explain(plain, *args)
    forward = [u for u in report.unguarded if u.reason.startswith("forward mode")]
    reverse = [u for u in report.unguarded if not u.reason.startswith("forward mode")]
    return bool(reverse), bool(reverse or forward)


def _has_while_body(root) -> bool:
    """Whether a node is computed in a ``while`` body (no reverse mode)."""
    return any(isinstance(n, Body) and n.kind == "while" for n in nodes_of(root))


def check_clean_implies_exact(root, x, y, s=None) -> str:
    """A program with bodies (:class:`fuzzlib.program.Body`): forward values
    bitwise the plain program's; and in each mode whose report is clean --
    ``explain`` names no unguarded site -- the derivative is the oracle's,
    eager ``jax.grad`` and ``jax.jacfwd`` (a report may say what it cannot
    guard, never stay silent about a NaN).  Returns which modes were
    compared, for the statistics."""
    try:
        plain = vectorized.as_function(root)
        args = vectorized.arguments(root, x, y, s)
        guarded = hlo_guard.guard(plain)
        assert_bitwise_equal(guarded(*args), plain(*args), "eager forward")
        reverse_reported, forward_reported = unguarded_reports(plain, args)
        compared = []
        # (JAX cannot reverse-differentiate a while loop)
        reversible = not _has_while_body(root)
        if reversible and not reverse_reported:
            _, ox, oy, os_ = oracle.value_and_grad(root, x, y, s)
            argnums = tuple(range(len(args)))
            gx, gy, *gs = jax.grad(loss_of(guarded), argnums=argnums)(*args)
            assert_grads_match(gx, ox, "grad wrt x (the report is clean)")
            assert_grads_match(gy, oy, "grad wrt y (the report is clean)")
            if gs:
                assert_scalar_grad_matches(gs[0], os_, "grad wrt s (the report is clean)")
            compared.append("reverse")
        if not forward_reported:
            check_forward_mode(root, x, y, s)
            compared.append("forward")
        note("compared: " + (" and ".join(compared) or "neither (reported)"))
        return " and ".join(compared)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(root, x, y, s)}") from None


#: second-order modes a user differentiates a program in twice
SECOND_ORDER_MODES = {
    "fwd-over-rev": jax.hessian,
    "rev-over-rev": lambda f, argnums: jax.jacrev(jax.grad(f, argnums=argnums), argnums=argnums),
    "fwd-over-fwd": lambda f, argnums: jax.jacfwd(jax.jacfwd(f, argnums=argnums), argnums=argnums),
}


def _assembled(blocks, sizes) -> np.ndarray:
    """A nested tuple of Hessian blocks (``blocks[i][j]`` of shape
    ``sizes[i] + sizes[j]``) as one square float64 matrix."""
    flat = [
        np.concatenate(
            [np.asarray(b, np.float64).reshape(n, m) for b, m in zip(row, sizes)], axis=1
        )
        for row, n in zip(blocks, sizes)
    ]
    return np.concatenate(flat, axis=0)


def _with_last(fn, last, *args):
    return fn(*args, last)


def check_second_order(root, x, y, s=None, *, mode="fwd-over-rev", jit=False, guard=None) -> str:
    """Second order: the guarded program's Hessian of its summed output (in
    ``mode``, one of :data:`SECOND_ORDER_MODES`) equals the oracle's, every
    entry (NaN == NaN, inf == inf, allclose otherwise).  The contract asks
    structural zeros to be zero in every AD order: a guard that only fixes
    the first derivative leaves the second one NaN.

    Compared only where the vectorised program can be: the oracle's first
    and second derivatives finite (a dense basis tangent or cotangent is
    ``0 * inf`` at a genuine singularity in another lane, in plain JAX and
    in the per-select-``if`` program alike), the forward value NaN-free.
    The derivative in ``s`` is compared for a float32 ``s`` (a bfloat16 or
    float16 one rounds its cotangent at a place of JAX's choosing).
    With ``jit`` the second derivative is compiled as one program (the
    first derivative staged, then differentiated again: JAX inlines the
    guards' ``custom_jvp`` rules there, so their derivatives are taken as
    plain equations).  Returns what was compared, for the statistics."""
    guard = guard or hlo_guard.guard
    try:
        plain = vectorized.as_function(root)
        args = vectorized.arguments(root, x, y, s)
        with_s = len(args) == 3 and s.kind in ("weak", "python", "f32")
        argnums = (0, 1, 2) if with_s else (0, 1)
        _, ox, oy, os_ = oracle.value_and_grad(root, x, y, s)
        if not (np.isfinite(ox).all() and np.isfinite(oy).all()):
            return "oracle gradient non-finite: not compared"
        if np.isnan(np.asarray(plain(*args))).any():
            return "NaN forward value: not compared"
        want = oracle.hessian(root, x, y, s, with_s=with_s)
        if not np.isfinite(want).all():
            return "oracle Hessian non-finite: not compared"
        sizes = [len(x), len(y)] + ([1] if with_s else [])
        loss = loss_of(guard(plain))
        if len(args) == 3 and not with_s:  # s held at its value
            loss = functools.partial(_with_last, loss, args[2])
            args = args[:2]
        second = SECOND_ORDER_MODES[mode](loss, argnums=argnums)
        got = _assembled((jax.jit(second) if jit else second)(*args), sizes)
        scale = float(np.abs(want).sum())
        bad = mismatches(got, want, rtol=1e-4, atol=ATOL + 1e-5 * scale)
        if bad.any():
            rows, cols = np.nonzero(bad)
            raise AssertionError(
                f"{mode}{' (jit)' if jit else ''} Hessian differs from the oracle's at "
                f"{list(zip(rows.tolist(), cols.tolist()))}\n  got    {got!r}\n  oracle {want!r}"
            )
        return f"{mode}{' jit' if jit else ''} compared"
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{describe(root, x, y, s)}") from None


def check_second_order_clean_implies_exact(root, x, y, s=None, *, mode, jit) -> str:
    """A program with bodies, second order: where ``explain`` names no
    unguarded site (either mode), the second derivative is the oracle's
    (:func:`check_second_order`).  Reverse mode cannot go through a
    ``while`` body: such programs are compared in ``fwd-over-fwd`` only."""
    if _has_while_body(root) and mode != "fwd-over-fwd":
        return "while body: reverse mode not compared"
    plain = vectorized.as_function(root)
    reverse_reported, forward_reported = unguarded_reports(
        plain, vectorized.arguments(root, x, y, s)
    )
    if reverse_reported or forward_reported:
        return "reported: not compared"
    return check_second_order(root, x, y, s, mode=mode, jit=jit)
